"""Training and evaluation loops: AdamW + warmup/cosine, AMP, EMA, DDP, atomic checkpoints.

`train(cfg)` runs a whole training into a run folder:

    config.yaml            the effective configuration (flags over YAML over defaults), the
                           number of processes included
    metrics.csv            one row per epoch (train loss/acc, test loss/top-1/top-5, lr, ...)
    curves.png             loss and accuracy curves, redrawn after every epoch
    tensorboard/           the same metrics as TensorBoard events
    training_state.pt      everything `--resume` needs (`vit.checkpoint.TrainingState`)
    model.safetensors      the latest weights (the final ones once done), loadable alone
    best.safetensors       the weights with the best test top-1 so far

The pieces, in the order `train` runs them: `start`, on every process together (a failure on
one stops all: `distributed.failing_together`): `load_data` (both splits, raw),
`build_training_model`, `make_loaders` (each dataset made with its transform),
`build_training_state` (optimizer, schedule, scaler, EMA), `resume`, `wrap_model` (DDP,
compile); then `start_run_dir` (the first write) and `run_epochs`, whose loop trains
(`train_one_epoch`), evaluates (`evaluate`), logs (`RunLog`) and saves
(`vit.checkpoint.CheckpointSaver`). On CPU with the same seed, a resumed run ends with exactly
the weights of an uninterrupted one.
"""

from __future__ import annotations

import copy
import logging
import math
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader
from tqdm import tqdm

from . import distributed
from .batch_loader import InMemoryBatches
from .checkpoint import (
    CONFIG_FILE,
    CURVES_FILE,
    METRICS_FILE,
    STATE_FILE,
    TENSORBOARD_DIR,
    CheckpointSaver,
    TrainingState,
    remove_run,
    save_yaml,
    seed_everything,
    write_metrics_csv,
)
from .cli import TTA_CHOICES
from .data import ImageDataset, MixupCutmix, load_split, soft_target_cross_entropy
from .distributed import DistInfo
from .factory import ModelArgumentError, PretrainedUnavailableError, create_model
from .init import mimetic_init_, sincos_pos_embed_
from .loaders import EpochDataLoader, build_train_loader, eval_loader
from .model import VisionTransformer
from .optim import build_optimizer
from .plots import plot_curves, save_figure
from .train_config import (
    DEFAULT_MODEL,
    TrainConfig,
    image_size_for_epoch,
    mixup_on_for_epoch,
    patch_drop_for_epoch,
    resolve_ema_decay,
    resolve_optimizer,
    resolve_warmup_epochs,
)
from .transforms import EvalTransform, train_transform
from .tta import black_pixel, tta_logits

__all__ = [
    "CONFIG_FILE",
    "DEFAULT_MODEL",
    "NonFiniteLossError",
    "TrainConfig",
    "TrainingError",
    "TrainingInterrupted",
    "evaluate",
    "image_size_for_epoch",
    "resolve_ema_decay",
    "resolve_warmup_epochs",
    "train",
    "train_one_epoch",
]

logger = logging.getLogger("vit")


class NonFiniteLossError(RuntimeError):
    """The training loss became NaN or infinite; the last good checkpoint is kept."""


class TrainingInterrupted(Exception):
    """Ctrl-C stopped the run (every process raises it).

    run_dir: the run folder, None if this start wrote nothing (a fresh run, before its folder
    was made); epoch: the epoch of the folder's last complete checkpoint (known to rank 0),
    None if it holds none; epochs: the run's length."""

    def __init__(self, run_dir: str | None, epoch: int | None, epochs: int) -> None:
        super().__init__(f"interrupted; last checkpoint: epoch {epoch} of {epochs} in {run_dir}")
        self.run_dir, self.epoch, self.epochs = run_dir, epoch, epochs


# What a start can find wrong in the settings, the data, the model or a resumed state: one
# line for the user (train.py exits with status 2), raised by every process together.
START_ERRORS = (ValueError, FileNotFoundError)


class TrainingError(ValueError):
    """One of START_ERRORS met while training (an image that cannot be read) by this process
    alone, which says it itself (a start's is said by rank 0 for every process)."""


# -- data and model ------------------------------------------------------------------------------
def load_data(cfg: TrainConfig, info: DistInfo) -> tuple[ImageDataset, ImageDataset]:
    """The raw train and test splits (no transform yet: that needs the model's preprocessing).

    Rank 0 loads first, so that a CIFAR download happens once, not once per process; if it
    fails there, every process stops (`distributed.rank0_first`). The folders a failed download
    made for --data-root are removed: a failed start leaves nothing behind."""
    data_root = Path(cfg.data_root)  # its first folder that does not exist yet, if any:
    made = next((p for p in [*reversed(data_root.parents), data_root] if not p.exists()), None)

    def load() -> tuple[ImageDataset, ImageDataset]:
        return tuple(
            load_split(
                cfg.data,
                split,
                data_root=cfg.data_root,
                download=cfg.download,
                cache=cfg.cache,
                subset=subset,
                seed=cfg.seed,
                cache_dir=cfg.cache_path,
            )
            for split, subset in (("train", cfg.train_subset), ("test", cfg.test_subset))
        )

    try:
        train_set, test_set = distributed.rank0_first(info, load, errors=START_ERRORS)
    except START_ERRORS:
        if info.is_main and made is not None and made.is_dir():
            shutil.rmtree(made)  # what the failed download made: nothing of the user's
        raise
    if test_set.class_names != train_set.class_names:
        raise ValueError(
            f"train and test splits of {cfg.data} have different classes: "
            f"{train_set.class_names} vs {test_set.class_names}"
        )
    return train_set, test_set


def build_training_model(cfg: TrainConfig, class_names: list[str]) -> VisionTransformer:
    """The model to train: --model with the run's classes, input size, stochastic depth and
    dropout, from --pretrained weights or freshly initialised (then --mimetic-init and
    --pos-embed apply)."""
    overrides = {
        "drop_path_rate": cfg.drop_path,
        "drop_rate": cfg.drop,
        "patch_drop_rate": cfg.patch_drop,
        # Progressive resizing feeds smaller images early on: resample pos_embed on the fly.
        "dynamic_img_size": cfg.progressive_size is not None,
        **cfg.model_kwargs,
    }
    try:
        model = create_model(
            cfg.model,
            pretrained=cfg.pretrained_weights,
            num_classes=len(class_names),
            img_size=cfg.img_size,
            **overrides,
        )
    except TypeError as e:  # create_model's word for a --model-kwargs key it does not know
        raise ValueError(f"--model-kwargs: {e}") from e
    except PretrainedUnavailableError as e:  # offline: one line, advising the flag to use
        raise ModelArgumentError(f"--pretrained: {e.advising('--pretrained PATH')}") from None
    except ValueError as e:  # settings the architecture cannot take (e.g. --img-size 30)
        raise ValueError(f"--model {cfg.model}: {e}") from e
    model.class_names = list(class_names)
    if cfg.pretrained_weights is False:  # initialisations for training from scratch only
        if cfg.mimetic_init:
            mimetic_init_(model)
        if cfg.pos_embed == "sincos":
            sincos_pos_embed_(model)
    return model


def make_loaders(
    cfg: TrainConfig,
    train_set: ImageDataset,
    test_set: ImageDataset,
    model: VisionTransformer,
    info: DistInfo,
    device: torch.device,
) -> tuple[EpochDataLoader | InMemoryBatches, DataLoader]:
    """Training and test loaders over datasets made with the model's transforms."""
    pin = device.type == "cuda"
    if not cfg.batch_augment:  # in-memory batches augment the raw images themselves
        train_set = train_set.with_transform(train_transform(model.preprocess, cfg.augment()))
    test_set = test_set.with_transform(EvalTransform(model.preprocess))
    train_loader = build_train_loader(
        cfg, train_set=train_set, preprocess=model.preprocess, info=info, pin=pin
    )
    test_loader = eval_loader(
        test_set, batch_size=cfg.batch_size, workers=cfg.workers, info=info, pin=pin
    )
    return train_loader, test_loader


# -- model, optimizer, schedule, EMA -------------------------------------------------------------
def _tensors(module: nn.Module) -> list[torch.Tensor]:
    """A module's parameters and buffers, in an order that is the same for its deep copy."""
    return [*module.parameters(), *module.buffers()]


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
        averaged, current = [], []
        for ema, now in zip(_tensors(self.module), _tensors(model), strict=True):
            if ema.dtype.is_floating_point:
                averaged.append(ema)
                current.append(now)
            else:
                ema.copy_(now)
        # all tensors in one call: a few kernels on a GPU instead of one launch per tensor
        # (the same per-tensor lerp on the CPU)
        torch._foreach_lerp_(averaged, current, 1.0 - decay)

    def state_dict(self) -> dict:
        return {"module": self.module.state_dict(), "updates": self.updates}

    def load_state_dict(self, state: dict) -> None:
        self.module.load_state_dict(state["module"])
        self.updates = int(state["updates"])


def build_training_state(
    cfg: TrainConfig, model: nn.Module, steps_per_epoch: int, device: torch.device, info: DistInfo
) -> TrainingState:
    """AdamW, or Muon + AdamW (no decay on biases, norms, embeddings), warmup + cosine per
    step, a gradient scaler for float16 autocast, and the EMA, around `model`; nothing trained
    yet."""
    optimizer = build_optimizer(
        model,
        resolve_optimizer(cfg),
        lr=cfg.lr,
        weight_decay=cfg.weight_decay,
        muon_lr=cfg.muon_lr,
        muon_ns_dtype=cfg.muon_ns_dtype,
    )
    total_steps = cfg.epochs * steps_per_epoch
    schedule = warmup_cosine(
        total_steps=total_steps,
        warmup_steps=round(resolve_warmup_epochs(cfg) * steps_per_epoch),
        min_ratio=cfg.min_lr / cfg.lr,
    )
    # A gradient scaler only for float16: bfloat16 has float32's range and needs none.
    scaler = torch.amp.GradScaler(device.type, enabled=cfg.amp and cfg.amp_dtype == "float16")
    ema = ModelEma(model, resolve_ema_decay(cfg, total_steps)) if cfg.model_ema else None
    return TrainingState(
        model=model,
        optimizer=optimizer,
        scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, schedule),
        scaler=scaler,
        ema=ema,
        info=info,
        config=cfg.to_dict(),
    )


def wrap_model(model: nn.Module, cfg: TrainConfig, info: DistInfo, device: torch.device):
    """What runs forward in training: `model`, maybe DDP-wrapped and/or compiled."""
    if cfg.amp and device.type == "cpu":
        # PyTorch's CPU flash-attention backward ran 11x slower in bfloat16 than in float32
        # (14 against 1.3 ms a call, the CPU recipe's model, on a Xeon with AMX), so under CPU
        # autocast the explicit softmax path, whose bf16 matrix products are fast, trains: there
        # a step took 0.72x float32's time, against 1.30x with the fused path (docs/cpu-recipe.md).
        model.set_fused_attn(False)
    wrapped = model
    if info.enabled:
        device_ids = [device.index] if device.type == "cuda" else None
        wrapped = DistributedDataParallel(model, device_ids=device_ids)
    if cfg.compile:
        # dynamic=False: one static graph per token count. When --patch-drop-anneal changed
        # the count, the default (a dynamic-shape graph from the second shape on) failed to
        # compile (torch 2.14, bfloat16 autocast, 2 DDP processes on a CPU).
        wrapped = torch.compile(wrapped, dynamic=False)
    return wrapped


def build_mixup(cfg: TrainConfig, num_classes: int) -> MixupCutmix | None:
    if cfg.mixup <= 0 and cfg.cutmix <= 0:
        return None
    return MixupCutmix(
        num_classes,
        mixup_alpha=cfg.mixup,
        cutmix_alpha=cfg.cutmix,
        prob=cfg.mixup_prob,
        switch_prob=cfg.mixup_switch_prob,
        label_smoothing=cfg.label_smoothing,
    )


# -- evaluation ----------------------------------------------------------------------------------
def autocast(device: torch.device, cfg_amp: bool, amp_dtype: str):
    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(amp_dtype)
    if dtype is None:
        raise ValueError(f"--amp-dtype must be 'bfloat16' or 'float16', got {amp_dtype!r}")
    return torch.autocast(device.type, dtype=dtype, enabled=cfg_amp)


class _Tally:
    """Running confusion matrix, loss sum and top-5 hits of one stream of logits."""

    def __init__(self, num_classes: int, device: torch.device) -> None:
        self.num_classes, self.k = num_classes, min(5, num_classes)
        self.confusion = torch.zeros(num_classes, num_classes, dtype=torch.int64, device=device)
        self.sums = torch.zeros(2, dtype=torch.float64, device=device)  # loss sum, top-k hits

    def add(self, logits: torch.Tensor, labels: torch.Tensor) -> None:
        """logits (B, K) float32, labels (B,)."""
        self.sums[0] += F.cross_entropy(logits, labels, reduction="sum")
        topk = logits.topk(self.k, dim=1).indices  # (B, k)
        self.sums[1] += (topk == labels[:, None]).any(dim=1).sum()
        K = self.num_classes
        self.confusion += torch.bincount(labels * K + topk[:, 0], minlength=K**2).view(K, K)

    def result(self) -> dict:
        """Summed over processes: floats in [0, 1], `confusion` a (K, K) int64 numpy array."""
        distributed.all_reduce_sum(self.confusion)
        distributed.all_reduce_sum(self.sums)
        confusion = self.confusion.cpu().numpy()
        total = int(confusion.sum())
        if total == 0:
            raise ValueError("evaluation saw no images")
        per_class_total = confusion.sum(axis=1)
        return {
            "top1": float(np.trace(confusion) / total),
            "top5": float(self.sums[1].item() / total),
            "loss": float(self.sums[0].item() / total),
            "per_class": [
                float(confusion[i, i] / n) if n else float("nan")
                for i, n in enumerate(per_class_total)
            ],
            "num_images": total,
            "confusion": confusion,
        }


@torch.no_grad()
def evaluate(
    model: nn.Module,
    loader: DataLoader,
    num_classes: int,
    device: torch.device,
    amp: bool = False,
    amp_dtype: str = "bfloat16",
    progress: bool = False,
    tta: str = "none",
) -> dict:
    """Top-1, top-5, per-class accuracy, confusion matrix and mean loss over a loader.

    tta (a vit.cli.TTA_CHOICES other than "none") adds `result["tta"]`: the same figures for
    the mean softmax probability of each image's views (vit.tta), measured in the same pass as
    the plain ones, which are the first view's.
    Under DDP each process evaluates its shard and the counts are summed over processes.
    Returns floats in [0, 1] and `confusion` as a (K, K) int64 numpy array (rows: true class).
    """
    if tta not in TTA_CHOICES:
        raise ValueError(f"unknown test-time augmentation {tta!r}; accepted: {TTA_CHOICES}")
    model.eval()
    # The shifted views' border is black; the model's preprocess says what black is normalised.
    fill = black_pixel(getattr(model, "preprocess", None)).to(device)
    plain, augmented = _Tally(num_classes, device), _Tally(num_classes, device)
    bar = tqdm(loader, desc="eval", leave=False, disable=None if progress else True)
    for images, labels in bar:  # disable=None: a bar on a terminal only
        images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        with autocast(device, amp, amp_dtype):
            logits, tta_log_probs = tta_logits(model, images, tta, fill)  # each (B, K)
        plain.add(logits, labels)
        if tta != "none":
            augmented.add(tta_log_probs, labels)
    result = plain.result()
    if tta != "none":
        result["tta"] = augmented.result()
    return result


# -- training ------------------------------------------------------------------------------------
def train(cfg: TrainConfig, info: DistInfo | None = None, overwrite: bool = False) -> dict:
    """Train per `cfg` into its run folder; returns the last epoch's metrics row.

    Nothing is written until the data, model, loaders and (for --resume) the saved state are
    ready, so a failed start leaves no run folder behind. `overwrite`: the folder holds a
    previous run (train.py refuses it otherwise), whose files are removed at that point.
    Raises NonFiniteLossError (leaving the last checkpoint untouched) if the loss diverges,
    TrainingInterrupted on Ctrl-C, and, under DDP, a start that fails on any process on every
    process (`distributed.failing_together`).
    """
    info = info or DistInfo()
    if cfg.processes is None:  # recorded in config.yaml: --resume continues with as many
        cfg.processes = info.world_size
    elif cfg.processes != info.world_size:
        raise ValueError(
            f"--processes {cfg.processes}: this start has {info.world_size} process(es); "
            f"start {cfg.processes} (torchrun --nproc_per_node {cfg.processes}), or leave the "
            f"setting out (processes: null in a YAML file)"
        )
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    device = distributed.resolve_device(cfg.device, info)
    if cfg.amp and cfg.amp_dtype == "float16" and device.type == "cpu" and info.is_main:
        logger.warning(
            "--amp --amp-dtype float16 on a CPU: float16 matrix products are emulated there "
            "(about 20x slower than float32); use --amp-dtype bfloat16, or no --amp"
        )
    distributed.setup(info, device)
    leave_group = True
    try:
        return _train(cfg, info, device, overwrite)
    except TrainingInterrupted:
        # Rank 0 left first (see distributed.stop_on_interrupt): the others' process group is
        # broken, and taking it down can abort the process.
        leave_group = info.is_main
        raise
    finally:
        if leave_group:
            distributed.cleanup()


def default_run_dir(cfg: TrainConfig, info: DistInfo) -> str:
    """runs/MODEL-DATA-TIMESTAMP (-2, -3, ... when a run started in the same second), chosen
    by rank 0 and shared so every process agrees."""
    data_name = Path(cfg.data.rstrip("/")).name or cfg.data
    base = f"runs/{cfg.model}-{data_name}-{time.strftime('%Y%m%d-%H%M%S')}"
    name, count = [base], 1
    while Path(name[0]).exists():  # never into another run's folder
        count += 1
        name = [f"{base}-{count}"]
    if info.enabled:
        torch.distributed.broadcast_object_list(name, src=0)
    return name[0]


@dataclass
class Run:
    """What the epoch loop works with, once set up."""

    cfg: TrainConfig
    info: DistInfo
    device: torch.device
    model: VisionTransformer  # the bare module: what EMA follows and checkpoints hold
    train_model: nn.Module  # what runs forward in training (maybe DDP-wrapped, compiled)
    train_loader: EpochDataLoader | InMemoryBatches
    test_loader: DataLoader
    state: TrainingState
    mixup: MixupCutmix | None
    num_images: int  # in the training split


def _train(cfg: TrainConfig, info: DistInfo, device: torch.device, overwrite: bool) -> dict:
    if cfg.output_dir is None:
        cfg.output_dir = default_run_dir(cfg, info)
    run_dir = Path(cfg.output_dir)
    saver = CheckpointSaver(run_dir, info, data=cfg.data, config=cfg.to_dict())
    started = False  # whether this start wrote the run folder
    try:
        with distributed.failing_together(info, START_ERRORS):
            run = start(cfg, info, device, saver)
        if info.is_main:  # everything is ready, on every process: the run folder can be written
            start_run_dir(run_dir, cfg, overwrite)
            started = True
        log = RunLog(run_dir, info, cfg.epochs, start_epoch=run.state.epoch)
        try:
            log.start(run, num_images=run.num_images)
            return run_epochs(run, saver, log)
        except START_ERRORS as e:
            raise TrainingError(str(e)) from e
        finally:
            log.close()
    except BaseException as e:
        if not interrupted(e, info):
            raise
        if not (started or cfg.resume):  # nothing written: a run --overwrite would replace
            raise TrainingInterrupted(None, None, cfg.epochs) from None  # is left as it was
        epoch = saver.saved_epoch() if info.is_main else None
        raise TrainingInterrupted(str(run_dir), epoch, cfg.epochs) from None


def interrupted(error: BaseException, info: DistInfo) -> bool:
    """Whether `error` ended the run because of Ctrl-C: a KeyboardInterrupt, or, on a process
    other than rank 0, a collective broken by rank 0 leaving for it (see
    `distributed.stop_on_interrupt`)."""
    if isinstance(error, KeyboardInterrupt):
        return True
    return isinstance(error, Exception) and not info.is_main and distributed.interrupted()


def start(cfg: TrainConfig, info: DistInfo, device: torch.device, saver: CheckpointSaver) -> Run:
    """Everything the epoch loop needs, and (for --resume) the saved state loaded: the data,
    the model, the loaders, the optimizer, schedule and EMA. Writes nothing."""
    # Different RNG streams per process (MixUp, stochastic depth); rank 0 matches a
    # single-process run. DDP copies rank 0's initial weights to every process.
    seed_everything(cfg.seed + info.rank)
    train_set, test_set = load_data(cfg, info)
    model = build_training_model(cfg, train_set.class_names).to(device)
    train_loader, test_loader = make_loaders(
        cfg, train_set=train_set, test_set=test_set, model=model, info=info, device=device
    )
    state = build_training_state(
        cfg, model, steps_per_epoch=len(train_loader), device=device, info=info
    )
    if cfg.resume:
        resume(saver, state, cfg, info)
    return Run(
        cfg=cfg,
        info=info,
        device=device,
        model=model,
        train_model=wrap_model(model, cfg, info, device),
        train_loader=train_loader,
        test_loader=test_loader,
        state=state,
        mixup=build_mixup(cfg, train_set.num_classes),
        num_images=len(train_set),
    )


def start_run_dir(run_dir: Path, cfg: TrainConfig, overwrite: bool) -> None:
    """Create the run folder (after --overwrite, without the previous run's files) and write
    the effective configuration into it."""
    if overwrite and not cfg.resume:
        removed = remove_run(run_dir)
        if removed:
            logger.info(
                "--overwrite: removed the previous run's %s from %s",
                ", ".join(p.name for p in removed),
                run_dir,
            )
    run_dir.mkdir(parents=True, exist_ok=True)
    save_yaml(cfg.to_dict(), run_dir / CONFIG_FILE)


def resume(saver: CheckpointSaver, state: TrainingState, cfg: TrainConfig, info: DistInfo) -> None:
    """Continue from the run folder's last complete checkpoint (train.py checked it exists);
    ValueError if the run has already done its --epochs."""
    saver.resume(state)
    if state.epoch >= cfg.epochs:
        raise ValueError(
            f"--resume {cfg.resume}: the run has done {state.epoch} epochs, all of the "
            f"{cfg.epochs} asked for; give --epochs N (more than {state.epoch}) to extend it"
        )
    if info.is_main:
        logger.info(
            "resumed %s after epoch %d (best top-1 %.4f)",
            cfg.resume,
            state.epoch,
            state.best_top1,
        )


def run_epochs(run: Run, saver: CheckpointSaver, log: RunLog) -> dict:
    """The epoch loop, from the state's epoch to cfg.epochs; returns the last metrics row."""
    cfg, state = run.cfg, run.state
    row: dict = state.history[-1] if state.history else {}
    for epoch in range(state.epoch, cfg.epochs):
        size = image_size_for_epoch(
            cfg,
            epoch,
            final=run.model.preprocess.input_size[0],
            patch=run.model.patch_embed.patch_size[0],
        )
        run.train_loader.set_epoch(epoch, size)
        run.model.patch_drop.prob = patch_drop_for_epoch(cfg, epoch)
        if run.mixup is not None:
            run.mixup.enabled = mixup_on_for_epoch(cfg, epoch)
        started = time.perf_counter()
        stats = train_one_epoch(run, epoch=epoch)
        seconds = time.perf_counter() - started
        due = (epoch + 1) % cfg.eval_interval == 0 or epoch + 1 == cfg.epochs
        test, ema_test = evaluate_epoch(run) if due else (None, None)
        row = metrics_row(
            epoch=epoch,
            stats=stats,
            test=test,
            ema_test=ema_test,
            seconds=seconds,
            size=size,
            world_size=run.info.world_size,
        )
        kept_metrics = ema_test if state.ema is not None else test  # see TrainingState.kept
        improved = state.end_epoch(row, kept_metrics)
        log.epoch(row, state.history)
        saver.save(state, kept_metrics, improved)
        distributed.barrier()
    return row


def evaluate_epoch(run: Run) -> tuple[dict, dict | None]:
    """Test metrics of the model and of its EMA (None without one)."""
    settings = {
        "loader": run.test_loader,
        "num_classes": run.model.num_classes,
        "device": run.device,
        "amp": run.cfg.amp,
        "amp_dtype": run.cfg.amp_dtype,
        "progress": run.info.is_main,
    }
    test = evaluate(run.model, **settings)
    ema_test = evaluate(run.state.ema.module, **settings) if run.state.ema is not None else None
    return test, ema_test


def metrics_row(
    *,
    epoch: int,
    stats: dict,
    test: dict | None,
    ema_test: dict | None,
    seconds: float,
    size: int,
    world_size: int,
) -> dict:
    """One metrics.csv row (see `vit.checkpoint.METRIC_KEYS`); test columns None when the
    epoch was not evaluated."""
    return {
        "epoch": epoch + 1,
        "train_loss": stats["loss"],
        "train_acc": stats["acc"],
        "test_loss": test["loss"] if test else None,
        "test_top1": test["top1"] if test else None,
        "test_top5": test["top5"] if test else None,
        "ema_top1": ema_test["top1"] if ema_test else None,
        "ema_top5": ema_test["top5"] if ema_test else None,
        "lr": stats["lr"],
        "epoch_seconds": seconds,
        "train_images_per_s": stats["images"] * world_size / seconds,
        "data_seconds": stats["data_seconds"],
        "image_size": size,
    }


class RunLog:
    """Rank 0's record of the run as it goes: TensorBoard, metrics.csv, curves.png, the log.
    Other ranks hold a RunLog that does nothing."""

    def __init__(self, run_dir: Path, info: DistInfo, epochs: int, start_epoch: int) -> None:
        self.run_dir, self.epochs, self.writer = run_dir, epochs, None
        if info.is_main:
            from torch.utils.tensorboard import SummaryWriter  # slow import: rank 0 only

            self.writer = SummaryWriter(str(run_dir / TENSORBOARD_DIR), purge_step=start_epoch + 1)

    def start(self, run: Run, num_images: int) -> None:
        if self.writer is None:
            return
        write_metrics_csv(run.state.history, self.run_dir / METRICS_FILE)  # drop later rows
        logger.info(
            "training %s (%.2fM parameters) on %d images, %d classes, %d step(s) per epoch, "
            "%d process(es), device %s",
            run.cfg.model,
            sum(p.numel() for p in run.model.parameters()) / 1e6,
            num_images,
            run.model.num_classes,
            len(run.train_loader),
            run.info.world_size,
            run.device,
        )

    def epoch(self, row: dict, history: list[dict]) -> None:
        if self.writer is None:
            return
        for key, value in row.items():
            if key != "epoch" and value is not None:
                self.writer.add_scalar(key, value, row["epoch"])
        self.writer.flush()
        logger.info(epoch_summary(row, self.epochs))
        write_metrics_csv(history, self.run_dir / METRICS_FILE)
        save_figure(plot_curves(history), self.run_dir / CURVES_FILE)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def epoch_summary(row: dict, epochs: int) -> str:
    """'epoch 3/10: train loss 1.2345, test loss ..., 812 img/s at 32x32'."""
    test = ""
    if row["test_top1"] is not None:
        test = (
            f", test loss {row['test_loss']:.4f}, top-1 {100 * row['test_top1']:.2f}%, "
            f"top-5 {100 * row['test_top5']:.2f}%"
        )
    if row["ema_top1"] is not None:
        test += f", EMA top-1 {100 * row['ema_top1']:.2f}%"
    return (
        f"epoch {row['epoch']}/{epochs}: train loss {row['train_loss']:.4f}{test}, "
        f"{row['train_images_per_s']:.0f} img/s at {row['image_size']}x{row['image_size']}"
        f"{data_wait(row)}"
    )


def data_wait(row: dict) -> str:
    """', 12% of it waiting for batches': where the loader, not the step, set the pace."""
    if row.get("data_seconds") is None or not row.get("epoch_seconds"):
        return ""  # a row of a run saved before the column existed
    return f", {100 * row['data_seconds'] / row['epoch_seconds']:.0f}% of it waiting for batches"


# Steps between the checks that read device values on the host (the non-finite loss check,
# the progress bar's figures): each read waits for the GPU to finish all queued work, and a
# wait every step keeps the host from queueing the next step's kernels while the GPU runs.
HOST_SYNC_EVERY = 25


def train_one_epoch(run: Run, epoch: int) -> dict:
    """One pass over the training data; returns mean loss, accuracy, last lr, image count, and
    the seconds the loop waited for batches."""
    cfg, info, device, state = run.cfg, run.info, run.device, run.state
    run.train_model.train()
    sums = torch.zeros(2, dtype=torch.float64, device=device)  # loss sum, correct
    first_bad = torch.full((2,), -1.0, dtype=torch.float64, device=device)  # (step, loss)
    images, data_seconds = 0, 0.0
    started = time.perf_counter()
    loader = run.train_loader
    # disable=None: a bar on a terminal only, not in a log redirected to a file
    bar = tqdm(
        loader, desc=f"epoch {epoch + 1}/{cfg.epochs}", disable=None if info.is_main else True
    )
    fetch_started = time.perf_counter()
    for step, (batch_images, labels) in enumerate(bar):
        data_seconds += time.perf_counter() - fetch_started
        batch_images = batch_images.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)
        logits, loss = forward_loss(run, batch_images, labels)
        loss_now = loss.detach().double()
        first_bad = torch.where(
            (first_bad[0] < 0) & ~torch.isfinite(loss_now),
            torch.stack([torch.full_like(loss_now, step), loss_now]),
            first_bad,
        )
        last = step + 1 == len(loader)
        if (step + 1) % HOST_SYNC_EVERY == 0 or last:
            stop_if_diverged(run, first_bad, epoch=epoch, step=step)
        lr = optimizer_step(state, loss, cfg.clip_grad)
        images += labels.shape[0]
        correct = (logits.argmax(dim=1) == labels).sum()
        sums += torch.stack([loss_now * labels.shape[0], correct.double()])
        if not bar.disable and ((step + 1) % HOST_SYNC_EVERY == 0 or last):
            bar.set_postfix(
                loss=f"{sums[0].item() / images:.4f}",
                acc=f"{100 * sums[1].item() / images:.1f}%",
                lr=f"{lr:.2e}",
                img_s=f"{images * info.world_size / (time.perf_counter() - started):.0f}",
            )
        distributed.stop_if_interrupted(info)
        fetch_started = time.perf_counter()
    totals = torch.cat([sums, torch.tensor([float(images)], dtype=torch.float64, device=device)])
    distributed.all_reduce_sum(totals)
    return {
        "loss": totals[0].item() / totals[2].item(),
        "acc": totals[1].item() / totals[2].item(),
        "lr": lr,
        "images": images,
        "data_seconds": data_seconds,
    }


def stop_if_diverged(run: Run, first_bad: torch.Tensor, epoch: int, step: int) -> None:
    """NonFiniteLossError if any process's loss was NaN or inf by `step`: every process must
    agree to stop, or the others would wait forever in all-reduce."""
    bad = (first_bad[0] >= 0).double()
    if distributed.all_reduce_sum(bad).item() > 0:
        bad_step, loss = first_bad.tolist()
        if bad_step < 0:  # another process's loss: this one's is still finite
            bad_step, loss = step, float("nan")
        message = diverged_message(run.cfg, loss, epoch, int(bad_step), len(run.train_loader))
        raise NonFiniteLossError(message)


def diverged_message(cfg: TrainConfig, loss: float, epoch: int, step: int, steps: int) -> str:
    """What a NaN/inf loss stopped, and what is left to resume from (if anything)."""
    if (Path(cfg.output_dir) / STATE_FILE).is_file():
        kept = f"The last complete checkpoint (end of epoch {epoch}) is kept in {cfg.output_dir}"
    else:
        kept = f"No checkpoint was written: the loss diverged before epoch {epoch + 1} ended"
    return (
        f"training loss became {loss} at epoch {epoch + 1}, step {step + 1}/{steps}; stopped. "
        f"{kept}. Try a lower --lr, --clip-grad, or --amp-dtype bfloat16."
    )


def forward_loss(
    run: Run, images: torch.Tensor, labels: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits (B, K), loss): MixUp/CutMix soft targets when on, else label-smoothed labels."""
    cfg = run.cfg
    if run.mixup is not None:
        images, targets = run.mixup(images, labels)  # soft targets (B, K), smoothing included
    with autocast(run.device, cfg.amp, cfg.amp_dtype):
        logits = run.train_model(images)  # (B, K)
        if run.mixup is not None:
            loss = soft_target_cross_entropy(logits.float(), targets)
        else:
            loss = F.cross_entropy(logits.float(), labels, label_smoothing=cfg.label_smoothing)
    return logits, loss


def optimizer_step(state: TrainingState, loss: torch.Tensor, clip_grad: float | None) -> float:
    """Backward, clip, step, schedule, EMA; returns the learning rate the step used."""
    optimizer, scaler = state.optimizer, state.scaler
    optimizer.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()
    if clip_grad:  # 0 or None: no clipping
        scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
        nn.utils.clip_grad_norm_(state.model.parameters(), clip_grad)
    scaler.step(optimizer)
    scaler.update()
    lr = optimizer.param_groups[0]["lr"]
    state.scheduler.step()
    if state.ema is not None:
        state.ema.update(state.model)
    return lr
