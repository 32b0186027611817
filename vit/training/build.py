"""The pieces of a run, built from its settings before anything is written: the data, the model,
the loaders, the optimizer with its schedule and EMA, and (for --resume) the saved state.

`start` builds them all into a `Run`, on every process together; `start_run_dir` then writes the
run folder, the first write of a run.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from ..data.batch_pipeline import InMemoryBatches, InMemoryEvalBatches
from ..data.datasets import TORCHVISION_DATASETS, ImageDataset, load_split
from ..data.loaders import EpochDataLoader
from ..data.mixup import MixupCutmix, soft_target_cross_entropy
from ..data.transforms import EvalTransform, train_transform
from ..factory.create import create_model
from ..factory.timm_weights import PretrainedUnavailableError
from ..inference.embed import pools_nothing
from ..inference.evaluation import evaluate
from ..inference.precision import autocast
from ..inference.probe import stratified_holdout
from ..interop.weights import (
    HEAD_KEYS,
    ArchitectureMismatchError,
    WeightsMismatchError,
    names_in_source,
    read_metadata,
)
from ..models.cnn_teacher import CnnTeacher
from ..models.families import fine_tuning_pool
from ..models.initializers import mimetic_init_, sincos_pos_embed_, whiten_patch_embed_
from ..models.registry import Preprocess
from ..models.vision_transformer import VisionTransformer
from ..utils import process_group
from ..utils.files import temporary_folder_beside
from ..utils.messages import one_line
from ..utils.process_group import DistInfo
from .checkpoint import (
    CONFIG_FILE,
    LAST_WEIGHTS,
    CheckpointSaver,
    TrainingState,
    remove_run,
    save_yaml,
    seed_everything,
)
from .distillation import (
    build_teacher,
    distillation_loss,
    teacher_loader_settings,
    teacher_logits,
)
from .ema import ModelEma
from .errors import START_ERRORS
from .finetune import describe_layer_decay, freeze_below, layer_lr_scales, probe_head
from .optimizers import build_optimizer
from .schedule import warmup_cosine
from .settings import (
    DEFAULT_MODEL,
    TrainConfig,
    evaluation_split,
    resolve_ema_decay,
    resolve_optimizer,
    resolve_warmup_epochs,
    resolve_weight_decay,
)
from .step_graph import StepGraph
from .teacher_recipe import RECIPES, TeacherRecipe
from .train_loader import build_test_loader, build_train_loader
from .update_graph import UpdateGraph

logger = logging.getLogger("vit")


def load_data(cfg: TrainConfig, info: DistInfo) -> tuple[ImageDataset, ImageDataset]:
    """The raw training and evaluation images (no transform yet: that needs the model's
    preprocessing): the train and test splits, or under --val-split the train split and the part
    of it held out (the test split is then neither read nor decoded: it may not even exist).

    Rank 0 loads first, so that a CIFAR download happens once, not once per process; if it
    fails there, every process stops (`process_group.rank0_first`); `load_split` removes the
    folders a failed download made for --data-root: a failed start leaves nothing behind."""
    splits = [("train", cfg.train_subset)]
    if cfg.val_split is None:
        splits.append(("test", cfg.test_subset))

    def load() -> tuple[ImageDataset, ...]:
        try:
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
                for split, subset in splits
            )
        except FileNotFoundError as e:  # the message names the data; say which flag gave it
            if cfg.data.lower() in TORCHVISION_DATASETS and not cfg.download:
                raise FileNotFoundError(
                    f"--data {e} (--no-download): drop --no-download to download it there, or "
                    f"point --data-root at a copy"
                ) from None
            if cfg.resume and cfg.data.lower() not in TORCHVISION_DATASETS:
                raise FileNotFoundError(
                    f"--data {e}; if the run's images have moved, give --data DIR where they "
                    f"are now"
                ) from None
            raise FileNotFoundError(f"--data {e}") from None

    loaded = process_group.rank0_first(info, load, errors=START_ERRORS)
    if cfg.val_split is not None:
        return validation_split(loaded[0], cfg.val_split, cfg.seed)
    train_set, test_set = loaded
    if test_set.class_names != train_set.class_names:
        raise ValueError(class_mismatch(cfg.data, train_set.class_names, test_set.class_names))
    return train_set, test_set


def check_resumed_classes(cfg: TrainConfig, class_names: list[str]) -> None:
    """ValueError if --resume reads images of other classes than the run trained on (its
    --data given anew: an image folder moved, or another one)."""
    weights = Path(cfg.resume) / LAST_WEIGHTS
    if not weights.is_file():  # a state carried alone (gpu_check.sh's fresh machine): no names
        return
    run = read_metadata(weights).get("vit.class_names")
    if run is not None and list(run) != list(class_names):
        differ = classes_differ({"the run": list(run), "--data": list(class_names)})
        raise ValueError(
            f"--resume {cfg.resume} with --data {cfg.data}: its classes are not the run's "
            f"({differ}); give --data the run's own images"
        )


def class_mismatch(data: str, train: list[str], test: list[str]) -> str:
    """Why the two splits cannot be trained and scored together: the classes only one of them
    has, named (not 2 x 1,000 names), or else their different order."""
    what = classes_differ({"train/": train, "test/": test})
    return (
        f"--data {data}: the train and test splits have different classes ({what}); give both "
        f"splits the same class folders"
    )


def classes_differ(lists: dict[str, list[str]]) -> str:
    """How two lists of class names differ: the names only one of them has, five at most each
    (not 2 x 1,000 names), or else that the order differs."""
    (a, names_a), (b, names_b) = lists.items()
    only = [
        f"only in {where}: {', '.join(names[:5])}{', ...' if len(names) > 5 else ''}"
        for where, names in (
            (a, [n for n in names_a if n not in names_b]),
            (b, [n for n in names_b if n not in names_a]),
        )
        if names
    ]
    return "; ".join(only) or "the same names in another order"


def validation_split(
    train_set: ImageDataset, fraction: float, seed: int
) -> tuple[ImageDataset, ImageDataset]:
    """--val-split: (the training images kept for training, those held out to evaluate on):
    `fraction` of each class, chosen by `seed` (as the linear probe holds out its part), so a
    resumed run holds out the same images."""
    fit, held = stratified_holdout(np.asarray(train_set.labels), fraction, seed)
    if len(held) == 0:
        raise ValueError(
            f"--val-split {fraction}: no class of the {len(train_set)} training images has the "
            f"two images it takes to hold one out; give a larger fraction or more images"
        )
    # said, since the count is rounded per class, at least one each: 0.01 of 64 images held 10
    logger.info(
        "--val-split %g: %d of the %d training images held out to evaluate on (%.1f%%; of each "
        "class its share, rounded, and at least one)",
        fraction,
        len(held),
        len(train_set),
        100 * len(held) / len(train_set),
    )
    return train_set.subset(fit.tolist()), train_set.subset(held.tolist())


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
    weights, saved = cfg.pretrained_weights, resumed_fine_tuning(cfg)
    if saved is not None:  # the architecture the run was built with, its weights in the state
        weights = Path(cfg.resume) / LAST_WEIGHTS
        kept = {
            k: v for k, v in saved["vit.config"].items() if k not in ("num_classes", "img_size")
        }
        overrides.update(kept)  # (num_classes and img_size: the run's own, --img-size's)
    elif cfg.pretrained is not None:
        names = names_in_source(cfg.pretrained_weights)  # e.g. a transformers folder's "vit_mae"
        pool = fine_tuning_pool(cfg.model, cfg.pretrained, *names)
        if pool is not None and "global_pool" not in cfg.model_kwargs:  # as the family's paper
            overrides["global_pool"] = pool
    try:
        model = create_model(
            cfg.model,
            pretrained=weights,
            num_classes=len(class_names),
            img_size=cfg.img_size,
            **overrides,
        )
    except TypeError as e:  # create_model's word for a --model-kwargs key it does not know
        raise ValueError(f"--model-kwargs: {e}") from e
    except PretrainedUnavailableError as e:  # offline: one line, advising the flag to use
        raise ValueError(f"--pretrained: {e.advising('--pretrained PATH')}") from None
    except WeightsMismatchError as e:  # weights of other switches (registers, a pool)
        raise ValueError(f"--pretrained: {one_line(e.problem)}") from None
    except ValueError as e:  # settings the architecture cannot take (e.g. --img-size 30)
        # a ConfigValueError names its fields: one given in --model-kwargs is that flag's mistake
        if set(getattr(e, "fields", ())) & set(cfg.model_kwargs):
            raise ValueError(f"--model-kwargs: {e}") from e
        if "img_size" in getattr(e, "fields", ()) and cfg.img_size is not None:
            raise ValueError(f"--img-size {cfg.img_size}: {e}") from e
        hint = ""
        if isinstance(weights, (str, Path)) and isinstance(e, ArchitectureMismatchError):
            hint = (
                f"; --pretrained {cfg.pretrained} needs its architecture as --model NAME "
                f"(vit.list_models(); --model defaults to {DEFAULT_MODEL})"
            )
        raise ValueError(f"--model {cfg.model}: {one_line(e)}{hint}") from e
    if pools_nothing(model):  # every token out, one prediction per image is what trains
        raise ValueError(
            f"--model {cfg.model} with global_pool='': the model outputs every token, not one "
            f"prediction per image; train with global_pool token, avg or map"
        )
    said = fit_kept_head(model, class_names)
    if said:
        logger.info(said)
    model.class_names = list(class_names)
    if saved is not None and saved.get("vit.preprocess"):  # e.g. torchvision weights' own
        model.preprocess = Preprocess.from_dict(saved["vit.preprocess"])
    if cfg.trainable_blocks is not None:
        if saved is not None:  # what the pretrained weights did not give, as the start found
            new = set(saved.get("vit.fresh_parameters") or ())
        else:
            report = model.load_report
            new = {n for n, _ in model.named_parameters()} - set(report.loaded) if report else set()
        model.fresh_parameters = sorted(new)  # saved with the weights, for --resume
        freeze_below(model, cfg.trainable_blocks, new=new)
    if cfg.pretrained_weights is False:  # initialisations for training from scratch only
        if cfg.mimetic_init:
            mimetic_init_(model)
        if cfg.pos_embed == "sincos":
            sincos_pos_embed_(model)
    return model


def fit_kept_head(model: VisionTransformer, class_names: list[str]) -> str | None:
    """A pretrained head kept for its size answers for the classes its weights record
    (`model.class_names`, where they do), which may not be --data's: the same classes in
    another order get its rows in --data's order, other classes a new head (each row would
    answer for another class). What was done, for the log; None where nothing was."""
    recorded = list(getattr(model, "class_names", None) or ())
    if not recorded or recorded == list(class_names):
        return None
    if sorted(recorded) == sorted(class_names):
        order = torch.tensor([recorded.index(name) for name in class_names])
        with torch.no_grad():
            for head in (model.head, getattr(model, "head_dist", None)):
                if isinstance(head, nn.Linear):
                    head.weight.copy_(head.weight[order])
                    head.bias.copy_(head.bias[order])
        return "--pretrained's head: its rows put in --data's order of the same classes"
    model.reset_classifier(len(class_names))
    report = model.load_report  # the head is new: --trainable-blocks trains it, --resume knows
    report.fresh_head = True
    report.loaded = [key for key in report.loaded if key not in HEAD_KEYS]
    return (
        f"--pretrained's {len(recorded)}-class head answered for other classes "
        f"({', '.join(recorded[:3])}{', ...' if len(recorded) > 3 else ''}) than --data's: "
        f"a new head for --data's"
    )


def resumed_fine_tuning(cfg: TrainConfig) -> dict | None:
    """The metadata of a resumed fine-tuning's last weights (architecture, preprocessing, the
    parameters its start initialised afresh), None for any other run. A resumed run is built
    from its own folder, not from --pretrained again: the state holds every weight, and the
    source may be gone, moved or (timm's) not downloadable offline."""
    if not cfg.resume or cfg.pretrained is None:
        return None
    return read_metadata(Path(cfg.resume) / LAST_WEIGHTS)


# The images --patch-embed-init whiten measures the patches of: 32,000 patches of CIFAR's 4x4
# (48 values each) at 32 px, 98,000 of 16x16 (768 values) at 224; a fraction of a second
WHITEN_IMAGES = 500


def whitening_batches(
    train_set: ImageDataset, preprocess: Preprocess, count: int = WHITEN_IMAGES, batch: int = 100
) -> Iterator[torch.Tensor]:
    """Up to `count` training images spread evenly over the split (every class of a split sorted
    by class; no random draw), prepared as the evaluation prepares them, in batches (B, C, H, W)."""
    transform = EvalTransform(preprocess)
    picks = np.linspace(0, len(train_set) - 1, min(count, len(train_set))).round().astype(int)
    for first in range(0, len(picks), batch):
        yield torch.stack([transform(train_set.image(i)) for i in picks[first : first + batch]])


def make_loaders(
    cfg: TrainConfig,
    train_set: ImageDataset,
    test_set: ImageDataset,
    model: VisionTransformer,
    info: DistInfo,
    device: torch.device,
) -> tuple[EpochDataLoader | InMemoryBatches, DataLoader | InMemoryEvalBatches]:
    """Training and test loaders over datasets made with the model's transforms (or, in
    memory, over the images themselves)."""
    test_set = test_set.with_transform(EvalTransform(model.preprocess))
    test_loader = build_test_loader(
        cfg, test_set=test_set, preprocess=model.preprocess, info=info, device=device
    )
    return make_train_loader(cfg, train_set, model, info, device), test_loader


def make_train_loader(
    cfg: TrainConfig,
    train_set: ImageDataset,
    model: VisionTransformer,
    info: DistInfo,
    device: torch.device,
) -> EpochDataLoader | InMemoryBatches:
    """The training loader `cfg` asks for, over `train_set` with the model's transforms."""
    patch = model.patch_embed.patch_size[0]
    if cfg.progressive_size is not None and cfg.progressive_size % patch:
        smaller = max(patch, cfg.progressive_size // patch * patch)
        raise ValueError(
            f"--progressive-size {cfg.progressive_size}: the images grow in whole {patch}-pixel "
            f"patches of the model's; give a multiple of {patch} ({smaller} or {smaller + patch})"
        )
    if not cfg.batch_augment:  # in-memory batches augment the raw images themselves
        train_set = train_set.with_transform(train_transform(model.preprocess, cfg.augment()))
    return build_train_loader(
        cfg, train_set=train_set, preprocess=model.preprocess, info=info, device=device
    )


def make_teacher(
    cfg: TrainConfig,
    train_set: ImageDataset,
    test_loader: DataLoader | InMemoryEvalBatches,
    model: VisionTransformer,
    info: DistInfo,
    device: torch.device,
    recipe: TeacherRecipe | None = None,
) -> tuple[CnnTeacher | None, dict | None]:
    """--distillation-type's teacher and its facts (`distillation.build_teacher`): trained
    here over batches of its own (by `recipe`, default --teacher-recipe's) unless --resume or
    --teacher-path gives it; (None, None) without distillation."""
    if cfg.distillation_type == "none":
        return None, None
    trains = not cfg.resume and cfg.teacher_path is None
    recipe = recipe or RECIPES[cfg.teacher_recipe]
    settings = teacher_loader_settings(cfg, recipe)
    loader = make_train_loader(settings, train_set, model, info, device) if trains else None
    return build_teacher(
        cfg,
        num_classes=train_set.num_classes,
        train_loader=loader,
        test_loader=test_loader,
        whitening=whitening_batches(train_set, model.preprocess),  # lazy: read if whitening
        info=info,
        device=device,
        recipe=recipe,
    )


def build_training_state(
    cfg: TrainConfig, model: nn.Module, steps_per_epoch: int, device: torch.device, info: DistInfo
) -> TrainingState:
    """AdamW, Muon + AdamW or SGD (no decay on biases, norms, embeddings), warmup + cosine per
    step, a gradient scaler for float16 autocast, and the EMA, around `model`; nothing trained
    yet."""
    optimizer = build_optimizer(
        model,
        resolve_optimizer(cfg),
        lr=cfg.lr,
        weight_decay=resolve_weight_decay(cfg),
        momentum=cfg.momentum,
        muon_lr=cfg.muon_lr,
        muon_ns_dtype=cfg.muon_ns_dtype,
        # On a GPU one kernel updates every tensor, where the foreach update launches a few per
        # group of tensors: a small model's step is bound by launches. The CPU keeps foreach,
        # whose steps every run on a CPU so far took. --graph-update replays its own update.
        fused=device.type == "cuda" and not (cfg.graph_update or cfg.graph_step),
        lr_scales=None if cfg.layer_decay is None else layer_lr_scales(model, cfg.layer_decay),
    )
    if cfg.layer_decay is not None and info.is_main:  # the rates its groups hold
        logger.info(describe_layer_decay(model, cfg.layer_decay, optimizer))
    total_steps = cfg.epochs * steps_per_epoch
    schedule = build_schedule(cfg, steps_per_epoch)
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


def optimizer_steps(cfg: TrainConfig, batches: int) -> int:
    """The optimizer steps of an epoch of `batches` batches: one every --grad-accum-steps
    batches, and one more for those left at the end."""
    return -(-batches // cfg.grad_accum_steps)


def build_schedule(cfg: TrainConfig, steps_per_epoch: int) -> Callable[[int], float]:
    """The learning rate's factor per optimizer step: warmup, then cosine to --min-lr."""
    return warmup_cosine(
        total_steps=cfg.epochs * steps_per_epoch,
        warmup_steps=round(resolve_warmup_epochs(cfg) * steps_per_epoch),
        min_ratio=cfg.min_lr / cfg.lr,
    )


def wrap_model(model: nn.Module, cfg: TrainConfig, info: DistInfo, device: torch.device):
    """What runs forward in training: `model`, DDP-wrapped under torchrun."""
    if cfg.amp and device.type == "cpu":
        # PyTorch's CPU flash-attention backward ran 11x slower in bfloat16 than in float32
        # (14 against 1.3 ms a call, the CPU recipe's model, on a Xeon with AMX), so under CPU
        # autocast the explicit softmax path, whose bf16 matrix products are fast, trains: there
        # a step took 0.72x float32's time, against 1.30x with the fused path
        # (docs/cpu-experiments.md).
        model.set_fused_attn(False)
    model.set_grad_checkpointing(cfg.grad_checkpointing)
    return process_group.distributed(model, info, device)


# Graphs one run may compile: one per image size of progressive resizing (5 in the recipes)
# and per patch-drop rate of its anneal (3), where torch's default stops recompiling at 8.
RECOMPILE_LIMIT = 32


def build_forward_loss(
    train_model: nn.Module,
    cfg: TrainConfig,
    device: torch.device,
    soft_targets: bool,
    teacher: CnnTeacher | None = None,
) -> Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """(images (B, 3, H, W), targets) -> (logits (B, K), loss): the forward pass under --amp's
    autocast and the loss, on soft targets (B, K) where MixUp/CutMix mixes, else on labels (B,)
    with label smoothing; with a `teacher`, that loss and the teacher's on the same images
    (`distillation.distillation_loss`). With --compile, model, teacher and loss are one
    compiled graph (and its backward), in --compile-mode: reduce-overhead replays them as CUDA
    graphs on a GPU."""

    # --graph-step captures this function: without autocast's cache, the weights' casts are
    # kernels of the graph, made again at each replay from the weights as they are then, never
    # a cached tensor from another pass (torch's make_graphed_callables asks the same). Each
    # weight is cast once a forward pass, so the cache saves nothing here.
    cache = not cfg.graph_step

    def forward_loss(images: torch.Tensor, targets: torch.Tensor):
        with autocast(device, cfg.amp, cfg.amp_dtype, cache=cache):
            logits = train_model(images)  # (B, K)
            if soft_targets:
                loss = soft_target_cross_entropy(logits.float(), targets)
            else:
                loss = F.cross_entropy(logits.float(), targets, label_smoothing=cfg.label_smoothing)
            if teacher is not None:
                with torch.no_grad():
                    answers = teacher_logits(teacher, images, cfg.teacher_tta)  # (B, K)
                loss = distillation_loss(
                    logits.float(),
                    answers,
                    loss,
                    kind=cfg.distillation_type,
                    alpha=cfg.distillation_alpha,
                    tau=cfg.distillation_tau,
                )
        return logits, loss

    if not cfg.compile:
        return forward_loss
    torch._dynamo.config.recompile_limit = max(
        torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT
    )
    # dynamic=False: one static graph per token count. When --patch-drop-anneal changed the
    # count, the default (a dynamic-shape graph from the second shape on) failed to compile
    # (torch 2.14, bfloat16 autocast, 2 DDP processes on a CPU).
    return torch.compile(forward_loss, mode=cfg.compile_mode, dynamic=False)


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


@dataclass
class Run:
    """What the epoch loop works with, once set up."""

    cfg: TrainConfig
    info: DistInfo
    device: torch.device
    model: VisionTransformer  # the bare module: what EMA follows and checkpoints hold
    train_model: nn.Module  # what runs forward in training (maybe DDP-wrapped)
    forward_loss: Callable  # (images, targets) -> (logits, loss), maybe compiled
    train_loader: EpochDataLoader | InMemoryBatches
    test_loader: DataLoader | InMemoryEvalBatches
    state: TrainingState
    mixup: MixupCutmix | None
    num_images: int  # in the training split
    # --graph-update: clipping, the optimizer's step and the EMA as one graph
    update: UpdateGraph | None = None
    # --graph-step: forward, backward and `update` as one graph
    step: StepGraph | None = None
    # --distillation-type: the frozen teacher, and what is known of it (epochs, test top-1)
    teacher: CnnTeacher | None = None
    teacher_facts: dict | None = None
    # --head-init probe: the probed head's top-1 and top-5, best.safetensors at epoch 0
    probed: dict | None = None


def start(cfg: TrainConfig, info: DistInfo, device: torch.device, saver: CheckpointSaver) -> Run:
    """Everything the epoch loop needs, and (for --resume) the saved state loaded: the data,
    the model, the loaders, the optimizer, schedule and EMA. Writes nothing."""
    if cfg.graph_step and info.enabled:
        raise ValueError(
            f"--graph-step with {info.world_size} processes: the step's graph trains one "
            f"process (DistributedDataParallel's exchange of gradients is not captured); "
            f"leave out --graph-step, or start one process"
        )
    # Different RNG streams per process (MixUp, stochastic depth); rank 0 matches a
    # single-process run. DDP copies rank 0's initial weights to every process.
    seed_everything(cfg.seed + info.rank)
    train_set, test_set = load_data(cfg, info)
    if cfg.resume:
        check_resumed_classes(cfg, train_set.class_names)
    model = build_training_model(cfg, train_set.class_names)
    if cfg.patch_embed_init == "whiten" and not cfg.resume:  # a resumed run's is in its state
        whiten_patch_embed_(
            model,
            whitening_batches(train_set, model.preprocess),
            generator=torch.Generator().manual_seed(cfg.seed),  # the run's own draws untouched
        )
    model = model.to(device)
    train_loader, test_loader = make_loaders(
        cfg, train_set=train_set, test_set=test_set, model=model, info=info, device=device
    )
    probed = None
    if cfg.head_init == "probe" and not cfg.resume:  # a resumed run's head is in its state
        probed = init_head_by_probe(cfg, model, train_set, test_loader, info=info, device=device)
    teacher, teacher_facts = make_teacher(cfg, train_set, test_loader, model, info, device)
    steps_per_epoch = optimizer_steps(cfg, len(train_loader))
    state = build_training_state(
        cfg, model, steps_per_epoch=steps_per_epoch, device=device, info=info
    )
    if probed is not None:  # epoch 0 competes for best.safetensors: fine-tuning may only lose
        state.best_top1 = probed["top1"]
    if cfg.resume:
        resume(saver, state, cfg, info)
    train_model = wrap_model(model, cfg, info, device)
    mixup = build_mixup(cfg, train_set.num_classes)
    forward_loss = build_forward_loss(
        train_model, cfg, device, soft_targets=mixup is not None, teacher=teacher
    )
    update = build_update(cfg, state)  # after resume: it holds the loaded state's tensors
    return Run(
        cfg=cfg,
        info=info,
        device=device,
        model=model,
        train_model=train_model,
        forward_loss=forward_loss,
        train_loader=train_loader,
        test_loader=test_loader,
        state=state,
        mixup=mixup,
        num_images=len(train_set),
        update=update,
        step=build_step(cfg, forward_loss, model, update),
        teacher=teacher,
        teacher_facts=teacher_facts,
        probed=probed,
    )


def build_update(cfg: TrainConfig, state: TrainingState) -> UpdateGraph | None:
    """--graph-update's clipping, optimizer step and EMA in one graph (also the update inside
    --graph-step's graph, and its ordinary steps' where CUDA refuses the step's capture); None
    without either."""
    if not (cfg.graph_update or cfg.graph_step):
        return None
    return UpdateGraph(state.optimizer, state.model, state.ema, clip_grad=cfg.clip_grad)


def build_step(
    cfg: TrainConfig, forward_loss: Callable, model: nn.Module, update: UpdateGraph | None
) -> StepGraph | None:
    """--graph-step's whole step in one graph, around `forward_loss` and `update`; None
    without it."""
    return StepGraph(forward_loss, model, update) if cfg.graph_step else None


def init_head_by_probe(
    cfg: TrainConfig,
    model: VisionTransformer,
    train_set: ImageDataset,
    test_loader: DataLoader | InMemoryEvalBatches,
    *,
    info: DistInfo,
    device: torch.device,
) -> dict:
    """--head-init probe: the new head fitted on the frozen features of the training images
    (evaluation transform, no augmentation) before the first step, and its accuracy on the
    evaluation split logged as epoch 0 and returned (top1, top5). Every process fits the same
    head (the fit is deterministic), as DDP would copy rank 0's anyway."""
    prepared = train_set.with_transform(EvalTransform(model.preprocess))
    # The processes share the extraction, rank 0 assembling one file that every process reads:
    # in a folder they all see, beside the run folder (whose lock's next holder removes a killed
    # start's). In a temporary folder of each process's own, a process read a file never written
    # there and the others waited for it for ever.
    made = temporary_folder_beside(Path(cfg.output_dir)) if info.is_main else None
    work = Path(process_group.broadcast_from_rank0(info, made))
    try:
        fit = probe_head(
            model,
            prepared,
            seed=cfg.seed,
            batch_size=cfg.batch_size,
            workers=cfg.workers,
            device=device,
            amp=cfg.amp,
            work_dir=work,
        )
        process_group.barrier()  # every process has read the features
    finally:
        if info.is_main:
            shutil.rmtree(work, ignore_errors=True)
    scores = evaluate(
        model,
        test_loader,
        num_classes=model.num_classes,
        device=device,
        amp=cfg.amp,
        amp_dtype=cfg.amp_dtype,
    )
    if info.is_main:
        logger.info(
            "epoch 0/%d (--head-init probe: the head fitted on the frozen features, l2 %.3g): "
            "%s top-1 %.2f%%, top-5 %.2f%%",
            cfg.epochs,
            fit.l2,
            evaluation_split(cfg),
            100 * scores["top1"],
            100 * scores["top5"],
        )
    return {"top1": scores["top1"], "top5": scores["top5"]}


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
    # without `resume`: the file starts the same run again as `--config` (train.py refuses a
    # run to resume in a config file, as it would skip --resume's checks)
    settings = {key: value for key, value in cfg.to_dict().items() if key != "resume"}
    save_yaml(settings, run_dir / CONFIG_FILE)
