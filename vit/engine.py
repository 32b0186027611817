"""Training and evaluation loops: AdamW + warmup/cosine, AMP, EMA, DDP, atomic checkpoints.

`train(cfg)` runs a whole training into a run folder:

    config.yaml            the effective configuration (flags over YAML over defaults)
    metrics.csv            one row per epoch (train loss/acc, test loss/top-1/top-5, lr, ...)
    curves.png             loss and accuracy curves, redrawn after every epoch
    tensorboard/           the same metrics as TensorBoard events
    training_state.pt      everything `--resume` needs (model, optimizer, scheduler, scaler,
                           EMA, epoch, RNG states, best top-1, metrics history)
    model.safetensors      the latest weights (the final ones once done), loadable alone
    best.safetensors       the weights with the best test top-1 so far

Every file is written to a temporary name and renamed over the target, so a run killed at
any moment, even mid-save, resumes from its last complete `training_state.pt`. On CPU with
the same seed, a resumed run ends with exactly the weights of an uninterrupted one.
"""

from __future__ import annotations

import copy
import csv
import io
import logging
import math
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
import yaml
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, Subset
from tqdm import tqdm

from . import distributed
from .batch_loader import InMemoryBatches
from .data import (
    AugmentConfig,
    EvalTransform,
    ImageDataset,
    MixupCutmix,
    load_split,
    soft_target_cross_entropy,
    train_transform,
)
from .distributed import DistInfo
from .factory import create_model
from .model import VisionTransformer
from .plots import plot_curves, save_figure
from .weights import atomic_write, save_weights

logger = logging.getLogger("vit")

DEFAULT_MODEL = "vit_cifar_patch4_32"
STATE_FILE = "training_state.pt"
CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.csv"
CURVES_FILE = "curves.png"
METRIC_KEYS = (
    "epoch",
    "train_loss",
    "train_acc",
    "test_loss",
    "test_top1",
    "test_top5",
    "ema_top1",
    "ema_top5",
    "lr",
    "epoch_seconds",
    "train_images_per_s",
    "image_size",
)


class NonFiniteLossError(RuntimeError):
    """The training loss became NaN or infinite; the last good checkpoint is kept."""


@dataclass
class TrainConfig:
    """Every training setting; train.py exposes each field as a flag of the same name.

    Defaults are the CIFAR recipe: `python train.py --data cifar10` trains it.
    """

    data: str = "cifar10"
    data_root: str = "data"  # where torchvision downloads CIFAR
    model: str = DEFAULT_MODEL
    model_kwargs: dict = field(default_factory=dict)  # other ViTConfig fields, e.g. depth
    pretrained: str | None = None  # "timm" (timm's default weights) or a weights file
    img_size: int | None = None  # model input size; pretrained pos_embed is resampled
    epochs: int = 200
    batch_size: int = 128  # per process
    lr: float = 1e-3
    min_lr: float = 1e-5
    weight_decay: float = 0.05
    warmup_epochs: float | None = None  # None: 5% of the epochs (10 of 200)
    clip_grad: float | None = 1.0
    label_smoothing: float = 0.1
    mixup: float = 0.8  # MixUp alpha (0: off)
    cutmix: float = 1.0  # CutMix alpha (0: off)
    mixup_prob: float = 1.0
    mixup_switch_prob: float = 0.5
    drop_path: float = 0.1
    drop: float = 0.0  # dropout before the head
    patch_drop: float = 0.0  # in training, drop this fraction of patch tokens at random
    progressive_size: int | None = None  # first epochs at this image size, growing to img_size
    progressive_epochs: float | None = None  # epochs to grow over (None: half of the run)
    crop: str = "auto"
    rrc_scale: float = 0.08
    hflip: float = 0.5
    aa: str = "randaug"
    aa_n: int = 2
    reprob: float = 0.25
    model_ema: bool = True
    model_ema_decay: float | None = None  # None: averages over ~2% of the run's steps
    amp: bool = False
    amp_dtype: str = "bfloat16"
    compile: bool = False
    seed: int = 0
    workers: int = 4
    threads: int | None = None  # torch intra-op threads per process (None: torch's default)
    batch_augment: bool = False  # augment whole uint8 batches in memory (crop, flip, erasing)
    eval_interval: int = 1  # evaluate every this many epochs (and always after the last)
    cache_dir: str | None = "~/.cache/vit"  # decoded images kept between runs (None: off)
    device: str = "auto"
    output_dir: str | None = None
    resume: str | None = None
    train_subset: int | None = None  # train on this many images (stratified), for quick runs
    test_subset: int | None = None
    cache: bool | None = None  # decode images once into memory (None: small images only)
    download: bool = True

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    def augment(self) -> AugmentConfig:
        return AugmentConfig(
            crop=self.crop,
            rrc_scale=self.rrc_scale,
            hflip=self.hflip,
            aa=self.aa,
            aa_n=self.aa_n,
            reprob=self.reprob,
        )


# -- model, optimizer, schedule, EMA -------------------------------------------------------------
def build_model(cfg: TrainConfig, num_classes: int) -> VisionTransformer:
    """The named model with the run's classes, input size, stochastic depth and dropout."""
    pretrained: bool | str = False
    if cfg.pretrained:
        pretrained = True if cfg.pretrained in ("timm", "true", "True") else cfg.pretrained
    overrides = {
        "drop_path_rate": cfg.drop_path,
        "drop_rate": cfg.drop,
        "patch_drop_rate": cfg.patch_drop,
        # Progressive resizing feeds smaller images early on: resample pos_embed on the fly.
        "dynamic_img_size": cfg.progressive_size is not None,
        **cfg.model_kwargs,
    }
    return create_model(
        cfg.model,
        pretrained=pretrained,
        num_classes=num_classes,
        img_size=cfg.img_size,
        **overrides,
    )


# -- settings that follow the length of the run ------------------------------------------------
WARMUP_FRACTION = 0.05  # warmup when none is given: 10 of 200 epochs, 0.2 of 4
EMA_HORIZON = 0.02  # the default EMA averages over about this fraction of the optimizer steps


def resolve_warmup_epochs(cfg: TrainConfig) -> float:
    """The warmup length: as given, or a fixed fraction of the run; never the whole run."""
    if cfg.warmup_epochs is None:
        return WARMUP_FRACTION * cfg.epochs
    if cfg.warmup_epochs >= cfg.epochs:
        raise ValueError(
            f"--warmup-epochs {cfg.warmup_epochs} is not shorter than --epochs {cfg.epochs}: "
            f"the learning rate would never leave warmup; give fewer warmup epochs, or leave "
            f"--warmup-epochs unset for {100 * WARMUP_FRACTION:.0f}% of the run"
        )
    return cfg.warmup_epochs


def resolve_ema_decay(cfg: TrainConfig, total_steps: int) -> float:
    """The EMA decay: as given, or 1 - 1/horizon for a horizon of EMA_HORIZON of the steps.

    A fixed 0.999 averages over ~1,000 steps: right for 200 epochs, but a short run of a few
    hundred steps would keep mostly its random initial weights.
    """
    if cfg.model_ema_decay is not None:
        return cfg.model_ema_decay
    return 1.0 - 1.0 / max(1.0, EMA_HORIZON * total_steps)


def image_size_for_epoch(cfg: TrainConfig, epoch: int, final: int, patch: int) -> int:
    """Progressive resizing: `progressive_size` at epoch 0, growing linearly to `final` at
    `progressive_epochs` (default half the run), in whole patches."""
    if cfg.progressive_size is None:
        return final
    ramp = cfg.progressive_epochs if cfg.progressive_epochs is not None else cfg.epochs / 2
    if epoch >= ramp:
        return final
    size = cfg.progressive_size + (final - cfg.progressive_size) * epoch / ramp
    return max(patch, int(size) // patch * patch)


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Weight decay on weight matrices only: not on biases, norms, pos_embed or cls_token."""
    skip = set(getattr(model, "no_weight_decay", set)())
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        if param.ndim <= 1 or name in skip:
            no_decay.append(param)
        else:
            decay.append(param)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def warmup_cosine(total_steps: int, warmup_steps: int, min_ratio: float) -> Callable[[int], float]:
    """LR multiplier per optimizer step: linear warmup to 1, then cosine down to min_ratio."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))

    return factor


class ModelEma:
    """Exponential moving average of a model's weights (and a copy of its buffers).

    The decay warms up as (1 + step) / (10 + step), capped at `decay`, so that short runs
    are not dominated by the random initial weights (as timm's ModelEmaV3 with warmup).
    """

    def __init__(self, model: nn.Module, decay: float) -> None:
        self.module = copy.deepcopy(model).eval().requires_grad_(False)
        self.decay = decay
        self.updates = 0

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        self.updates += 1
        decay = min(self.decay, (1 + self.updates) / (10 + self.updates))
        for ema, current in zip(
            self.module.state_dict().values(), model.state_dict().values(), strict=True
        ):
            if ema.dtype.is_floating_point:
                ema.lerp_(current.detach(), 1.0 - decay)
            else:
                ema.copy_(current)

    def state_dict(self) -> dict:
        return {"module": self.module.state_dict(), "updates": self.updates}

    def load_state_dict(self, state: dict) -> None:
        self.module.load_state_dict(state["module"])
        self.updates = int(state["updates"])


# -- RNG state, saved as plain tensors/lists so torch.load(weights_only=True) reads it -------------
def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def get_rng_state() -> dict:
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# -- evaluation ----------------------------------------------------------------------------------
def autocast(device: torch.device, cfg_amp: bool, amp_dtype: str):
    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(amp_dtype)
    if dtype is None:
        raise ValueError(f"--amp-dtype must be 'bfloat16' or 'float16', got {amp_dtype!r}")
    return torch.autocast(device.type, dtype=dtype, enabled=cfg_amp)


@torch.no_grad()
def evaluate(
    model: nn.Module,
    loader: DataLoader,
    num_classes: int,
    device: torch.device,
    amp: bool = False,
    amp_dtype: str = "bfloat16",
    progress: bool = False,
) -> dict:
    """Top-1, top-5, per-class accuracy, confusion matrix and mean loss over a loader.

    Under DDP each process evaluates its shard and the counts are summed over processes.
    Returns floats in [0, 1] and `confusion` as a (K, K) int64 numpy array (rows: true class).
    """
    model.eval()
    k = min(5, num_classes)
    confusion = torch.zeros(num_classes, num_classes, dtype=torch.int64, device=device)
    sums = torch.zeros(2, dtype=torch.float64, device=device)  # loss sum, top-k correct
    for images, labels in tqdm(loader, desc="eval", leave=False, disable=not progress):
        images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        with autocast(device, amp, amp_dtype):
            logits = model(images)
        logits = logits.float()  # (B, K)
        sums[0] += F.cross_entropy(logits, labels, reduction="sum")
        topk = logits.topk(k, dim=1).indices  # (B, k)
        sums[1] += (topk == labels[:, None]).any(dim=1).sum()
        confusion += torch.bincount(
            labels * num_classes + topk[:, 0], minlength=num_classes**2
        ).view(num_classes, num_classes)
    distributed.all_reduce_sum(confusion)
    distributed.all_reduce_sum(sums)
    confusion = confusion.cpu().numpy()
    total = int(confusion.sum())
    if total == 0:
        raise ValueError("evaluation saw no images")
    per_class_total = confusion.sum(axis=1)
    per_class = [
        float(confusion[i, i] / n) if n else float("nan") for i, n in enumerate(per_class_total)
    ]
    return {
        "top1": float(np.trace(confusion) / total),
        "top5": float(sums[1].item() / total),
        "loss": float(sums[0].item() / total),
        "per_class": per_class,
        "num_images": total,
        "confusion": confusion,
    }


def eval_loader(
    dataset: ImageDataset, batch_size: int, workers: int, info: DistInfo, pin: bool
) -> DataLoader:
    """Each process takes every world_size-th image (no padding, so no image counts twice)."""
    if info.enabled:
        dataset = Subset(dataset, range(info.rank, len(dataset), info.world_size))
    return DataLoader(
        dataset, batch_size=batch_size, shuffle=False, num_workers=workers, pin_memory=pin
    )


def build_train_loader(
    cfg: TrainConfig, train_set: ImageDataset, preprocess, info: DistInfo, pin: bool
) -> DataLoader | InMemoryBatches:
    """Training batches: whole uint8 batches augmented in memory (--batch-augment), or a
    DataLoader running the albumentations pipeline per image in worker processes."""
    per_process = len(train_set) // info.world_size
    if per_process < cfg.batch_size:
        raise ValueError(
            f"--batch-size {cfg.batch_size} is larger than the {per_process} training images "
            f"each of the {info.world_size} process(es) gets; use a batch size <= {per_process}"
        )
    if cfg.batch_augment:
        return in_memory_batches(cfg, train_set, preprocess, info)
    if cfg.progressive_size is not None:
        raise ValueError("--progressive-size needs --batch-augment (it resizes whole batches)")
    sampler = DistributedSampler(
        train_set, num_replicas=info.world_size, rank=info.rank, shuffle=True, seed=cfg.seed
    )
    return DataLoader(
        train_set,
        batch_size=cfg.batch_size,
        sampler=sampler,
        num_workers=cfg.workers,
        pin_memory=pin,
        drop_last=True,  # equal-sized batches: DDP averages gradients over equal shares
    )


def in_memory_batches(
    cfg: TrainConfig, train_set: ImageDataset, preprocess, info: DistInfo
) -> InMemoryBatches:
    """--batch-augment: the decoded training images as one uint8 array, augmented per batch."""
    if cfg.aa != "none" or cfg.crop not in ("auto", "pad"):
        raise ValueError(
            f"--batch-augment does pad-and-crop, flips and random erasing only; got --aa "
            f"{cfg.aa} --crop {cfg.crop}: use --aa none --crop pad, or leave out --batch-augment"
        )
    if train_set.images is None:
        raise ValueError("--batch-augment keeps the images in memory: leave --cache on")
    shapes = {image.shape for image in train_set.images}
    if len(shapes) != 1 or next(iter(shapes))[:2] != tuple(preprocess.input_size):
        raise ValueError(
            f"--batch-augment needs every training image at the model's input size "
            f"{tuple(preprocess.input_size)}; {cfg.data} has sizes {sorted(shapes)[:5]}"
        )
    return InMemoryBatches(
        np.stack(train_set.images) if isinstance(train_set.images, list) else train_set.images,
        train_set.labels,
        batch_size=cfg.batch_size,
        mean=preprocess.mean,
        std=preprocess.std,
        pad=preprocess.input_size[0] // 8,  # the CIFAR standard: 4 pixels on 32
        hflip=cfg.hflip,
        reprob=cfg.reprob,
        seed=cfg.seed,
        rank=info.rank,
        world_size=info.world_size,
    )


# -- run-folder files ----------------------------------------------------------------------------
def save_yaml(data: dict, path: Path) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(yaml.safe_dump(data, sort_keys=False)))


def write_metrics_csv(history: list[dict], path: Path) -> None:
    """The whole history, rewritten each epoch: after a resume it matches the state exactly."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=METRIC_KEYS, extrasaction="ignore")
    writer.writeheader()
    for row in history:
        writer.writerow({k: ("" if row.get(k) is None else row[k]) for k in METRIC_KEYS})
    atomic_write(path, lambda tmp: tmp.write_text(buffer.getvalue()))


def save_training_state(state: dict, path: Path) -> None:
    """torch.save to a temporary file, then an atomic rename over `path`."""
    atomic_write(path, lambda tmp: torch.save(state, tmp))


def load_training_state(path: Path) -> dict:
    # weights_only: the state holds tensors and plain containers only, and a file that would
    # run code while unpickling is refused.
    return torch.load(path, map_location="cpu", weights_only=True)


# -- training ------------------------------------------------------------------------------------
def train(cfg: TrainConfig, info: DistInfo | None = None) -> dict:
    """Train per `cfg` into its run folder; returns the last epoch's metrics row.

    Raises NonFiniteLossError (leaving the last checkpoint untouched) if the loss diverges.
    """
    info = info or DistInfo()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    device = distributed.resolve_device(cfg.device, info)
    distributed.setup(info, device)
    try:
        return _train(cfg, info, device)
    finally:
        distributed.cleanup()


def default_run_dir(cfg: TrainConfig, info: DistInfo) -> str:
    """runs/MODEL-DATA-TIMESTAMP, chosen by rank 0 and shared so every process agrees."""
    data_name = Path(cfg.data.rstrip("/")).name or cfg.data
    name = [f"runs/{cfg.model}-{data_name}-{time.strftime('%Y%m%d-%H%M%S')}"]
    if info.enabled:
        torch.distributed.broadcast_object_list(name, src=0)
    return name[0]


def _train(cfg: TrainConfig, info: DistInfo, device: torch.device) -> dict:
    if cfg.output_dir is None:
        cfg.output_dir = default_run_dir(cfg, info)
    run_dir = Path(cfg.output_dir)
    state_path = run_dir / STATE_FILE
    main = info.is_main
    if main:
        run_dir.mkdir(parents=True, exist_ok=True)
        save_yaml(cfg.to_dict(), run_dir / CONFIG_FILE)
    # Different RNG streams per process (MixUp, stochastic depth); rank 0 matches a
    # single-process run. DDP copies rank 0's initial weights to every process.
    seed_everything(cfg.seed + info.rank)

    # data: rank 0 first, so that a CIFAR download happens once, not once per process
    if not main:
        distributed.barrier()
    cache_dir = Path(cfg.cache_dir).expanduser() if cfg.cache_dir else None
    train_set, test_set = (
        load_split(
            cfg.data,
            split,
            data_root=cfg.data_root,
            download=cfg.download,
            cache=cfg.cache,
            subset=subset,
            seed=cfg.seed,
            cache_dir=cache_dir,
        )
        for split, subset in (("train", cfg.train_subset), ("test", cfg.test_subset))
    )
    if main:
        distributed.barrier()
    if test_set.class_names != train_set.class_names:
        raise ValueError(
            f"train and test splits of {cfg.data} have different classes: "
            f"{train_set.class_names} vs {test_set.class_names}"
        )
    class_names, num_classes = train_set.class_names, train_set.num_classes

    model = build_model(cfg, num_classes).to(device)
    preprocess = model.preprocess
    train_set.transform = train_transform(preprocess, cfg.augment())
    train_set.seed = cfg.seed
    test_set.transform = EvalTransform(preprocess)

    pin = device.type == "cuda"
    train_loader = build_train_loader(cfg, train_set, preprocess, info, pin)
    test_loader = eval_loader(test_set, cfg.batch_size, cfg.workers, info, pin)

    optimizer = torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=cfg.lr)
    steps_per_epoch = len(train_loader)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        warmup_cosine(
            cfg.epochs * steps_per_epoch,
            round(resolve_warmup_epochs(cfg) * steps_per_epoch),
            cfg.min_lr / cfg.lr,
        ),
    )
    # A gradient scaler only for float16: bfloat16 has float32's range and needs none.
    scaler = torch.amp.GradScaler(device.type, enabled=cfg.amp and cfg.amp_dtype == "float16")
    ema_decay = resolve_ema_decay(cfg, cfg.epochs * steps_per_epoch)
    ema = ModelEma(model, ema_decay) if cfg.model_ema else None

    start_epoch, best_top1, history = 0, -1.0, []
    if cfg.resume and main:
        # Temporary files of a save that was killed before its rename: never complete.
        for leftover in run_dir.glob(".*.tmp"):
            logger.warning("removing %s, left by an interrupted save", leftover)
            leftover.unlink(missing_ok=True)
    if cfg.resume and state_path.is_file():
        state = load_training_state(state_path)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        scaler.load_state_dict(state["scaler"])
        if ema is not None:
            if state.get("ema") is None:
                raise ValueError(f"{state_path} has no EMA state; resume without --model-ema")
            ema.load_state_dict(state["ema"])
        start_epoch, best_top1, history = state["epoch"], state["best_top1"], state["history"]
        set_rng_state(state["rng"][info.rank] if info.rank < len(state["rng"]) else state["rng"][0])
        if main:
            logger.info(
                "resumed %s after epoch %d (best top-1 %.4f)", run_dir, start_epoch, best_top1
            )
    elif cfg.resume and main:
        logger.warning("no complete checkpoint in %s yet: starting from epoch 1", run_dir)

    train_model: nn.Module = model
    if info.enabled:
        train_model = DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )
    if cfg.compile:
        train_model = torch.compile(train_model)

    mixup = None
    if cfg.mixup > 0 or cfg.cutmix > 0:
        mixup = MixupCutmix(
            num_classes,
            cfg.mixup,
            cfg.cutmix,
            cfg.mixup_prob,
            cfg.mixup_switch_prob,
            cfg.label_smoothing,
        )

    writer = None
    if main:
        from torch.utils.tensorboard import SummaryWriter  # slow import: rank 0 only

        writer = SummaryWriter(str(run_dir / "tensorboard"), purge_step=start_epoch + 1)
        write_metrics_csv(history, run_dir / METRICS_FILE)  # drop rows past the checkpoint
        logger.info(
            "training %s (%.2fM parameters) on %d images, %d classes, %d step(s) per epoch, "
            "%d process(es), device %s",
            cfg.model,
            sum(p.numel() for p in model.parameters()) / 1e6,
            len(train_set),
            num_classes,
            steps_per_epoch,
            info.world_size,
            device,
        )

    row: dict = history[-1] if history else {}
    final_size = preprocess.input_size[0]
    for epoch in range(start_epoch, cfg.epochs):
        size = image_size_for_epoch(cfg, epoch, final_size, model.patch_embed.patch_size[0])
        if isinstance(train_loader, InMemoryBatches):
            train_loader.set_epoch(epoch, size)
        else:
            train_loader.sampler.set_epoch(epoch)
            train_set.epoch = epoch
        started = time.perf_counter()
        train_stats = train_one_epoch(
            train_model,
            train_loader,
            optimizer,
            scheduler,
            scaler,
            ema,
            mixup,
            cfg,
            epoch,
            device,
            info,
            model,
        )
        seconds = time.perf_counter() - started
        test = ema_test = None
        if (epoch + 1) % cfg.eval_interval == 0 or epoch + 1 == cfg.epochs:
            test = evaluate(model, test_loader, num_classes, device, cfg.amp, cfg.amp_dtype, main)
            if ema is not None:
                ema_test = evaluate(
                    ema.module, test_loader, num_classes, device, cfg.amp, cfg.amp_dtype, main
                )
        row = {
            "epoch": epoch + 1,
            "train_loss": train_stats["loss"],
            "train_acc": train_stats["acc"],
            "test_loss": test["loss"] if test else None,
            "test_top1": test["top1"] if test else None,
            "test_top5": test["top5"] if test else None,
            "ema_top1": ema_test["top1"] if ema_test else None,
            "ema_top5": ema_test["top5"] if ema_test else None,
            "lr": train_stats["lr"],
            "epoch_seconds": seconds,
            "train_images_per_s": train_stats["images"] * info.world_size / seconds,
            "image_size": size,
        }
        history.append(row)
        # With EMA on, the EMA weights are the ones kept, judged and saved as the model.
        kept, kept_name, kept_metrics = (
            (ema.module, "ema", ema_test) if ema else (model, "model", test)
        )
        improved = kept_metrics is not None and kept_metrics["top1"] > best_top1
        if improved:
            best_top1 = kept_metrics["top1"]
        if main:
            log_epoch(writer, row, cfg.epochs)
            write_metrics_csv(history, run_dir / METRICS_FILE)
            save_figure(plot_curves(history), run_dir / CURVES_FILE)
            extra = {
                "weights": kept_name,
                "epoch": epoch + 1,
                "top1": kept_metrics["top1"] if kept_metrics else None,
                "top5": kept_metrics["top5"] if kept_metrics else None,
                "data": cfg.data,
                "train_config": cfg.to_dict(),
            }
            if improved:
                save_weights(
                    kept, run_dir / "best.safetensors", class_names, cfg.model, extra=extra
                )
            save_weights(kept, run_dir / "model.safetensors", class_names, cfg.model, extra=extra)
        # Every process's RNG state, so a resumed DDP run continues every stream.
        rng = gather_rng_states(info)
        if main:
            state = {
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "scaler": scaler.state_dict(),
                "ema": ema.state_dict() if ema else None,
                "epoch": epoch + 1,
                "best_top1": best_top1,
                "history": history,
                "rng": rng,
                "config": cfg.to_dict(),
            }
            save_training_state(state, state_path)
        distributed.barrier()
    if writer is not None:
        writer.close()
    return row


def gather_rng_states(info: DistInfo) -> list[dict]:
    """The RNG states of all processes, in rank order (on every process)."""
    state = get_rng_state()
    if not info.enabled:
        return [state]
    states: list = [None] * info.world_size
    torch.distributed.all_gather_object(states, state)
    return states


def log_epoch(writer, row: dict, epochs: int) -> None:
    for key, value in row.items():
        if key != "epoch" and value is not None:
            writer.add_scalar(key, value, row["epoch"])
    writer.flush()
    test = ""
    if row["test_top1"] is not None:
        test = (
            f", test loss {row['test_loss']:.4f}, top-1 {100 * row['test_top1']:.2f}%, "
            f"top-5 {100 * row['test_top5']:.2f}%"
        )
    if row["ema_top1"] is not None:
        test += f", EMA top-1 {100 * row['ema_top1']:.2f}%"
    logger.info(
        "epoch %d/%d: train loss %.4f%s, %.0f img/s at %dx%d",
        row["epoch"],
        epochs,
        row["train_loss"],
        test,
        row["train_images_per_s"],
        row["image_size"],
        row["image_size"],
    )


def train_one_epoch(
    train_model: nn.Module,
    loader: DataLoader,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    scaler: torch.amp.GradScaler,
    ema: ModelEma | None,
    mixup: MixupCutmix | None,
    cfg: TrainConfig,
    epoch: int,
    device: torch.device,
    info: DistInfo,
    model: nn.Module,
) -> dict:
    """One pass over the training data; returns mean loss, accuracy, last lr, image count.

    `train_model` is what runs forward (maybe DDP-wrapped and/or compiled); `model` is the
    bare module the EMA follows.
    """
    train_model.train()
    totals = torch.zeros(3, dtype=torch.float64, device=device)  # loss sum, correct, images
    started = time.perf_counter()
    bar = tqdm(loader, desc=f"epoch {epoch + 1}/{cfg.epochs}", disable=not info.is_main)
    for step, (images, labels) in enumerate(bar):
        images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        if mixup is not None:
            images, targets = mixup(images, labels)  # soft targets (B, K), smoothing included
        with autocast(device, cfg.amp, cfg.amp_dtype):
            logits = train_model(images)  # (B, K)
            if mixup is not None:
                loss = soft_target_cross_entropy(logits.float(), targets)
            else:
                loss = F.cross_entropy(logits.float(), labels, label_smoothing=cfg.label_smoothing)
        # Every process must agree to stop, or the others would wait forever in all-reduce.
        bad = torch.tensor(float(not torch.isfinite(loss)), device=device)
        if distributed.all_reduce_sum(bad).item() > 0:
            raise NonFiniteLossError(
                f"training loss became {loss.item()} at epoch {epoch + 1}, step {step + 1}/"
                f"{len(loader)}; stopped. The last complete checkpoint (end of epoch {epoch}) is "
                f"kept in {cfg.output_dir}. Try a lower --lr, --clip-grad, or --amp-dtype bfloat16."
            )
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        if cfg.clip_grad:
            scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
            nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_grad)
        scaler.step(optimizer)
        scaler.update()
        lr = optimizer.param_groups[0]["lr"]
        scheduler.step()
        if ema is not None:
            ema.update(model)

        batch = labels.shape[0]
        correct = (logits.argmax(dim=1) == labels).sum()
        totals += torch.stack(
            [
                loss.detach().double() * batch,
                correct.double(),
                torch.tensor(float(batch), dtype=torch.float64, device=device),
            ]
        )
        if info.is_main:
            elapsed = time.perf_counter() - started
            bar.set_postfix(
                loss=f"{totals[0].item() / totals[2].item():.4f}",
                acc=f"{100 * totals[1].item() / totals[2].item():.1f}%",
                lr=f"{lr:.2e}",
                img_s=f"{totals[2].item() * info.world_size / elapsed:.0f}",
            )
    images = totals[2].item()
    distributed.all_reduce_sum(totals)
    return {
        "loss": totals[0].item() / totals[2].item(),
        "acc": totals[1].item() / totals[2].item(),
        "lr": lr,
        "images": images,
    }
