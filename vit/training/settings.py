"""Every training setting, declared once: `TrainConfig`, its defaults, types and help texts.

train.py makes one command-line flag per field (`lr` -> `--lr`, `model_ema` -> `--model-ema`
and `--no-model-ema`), with the field's type, default and help; YAML config files use the same
names. A new setting is one line here:

    lr: float = setting(1e-3, "optimisation", "peak AdamW learning rate")

Settings whose natural value depends on others (the warmup and EMA horizon follow --epochs,
the optimizer follows --pretrained, the image size follows the epoch under progressive resizing) are stored as given, None meaning
"derived", and resolved by the functions at the end of this module.
"""

# ruff: noqa: E501  (one line per setting, however long its help text)
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..data.workers import default_workers
from ..factory.timm_weights import TIMM_WEIGHTS, pretrained_weights
from ..utils.ranges import (
    AT_LEAST_0,
    AT_LEAST_1,
    DROP_RATE,
    NON_NEGATIVE,
    POSITIVE,
    PROBABILITY,
    Range,
    out_of_range,
)

if TYPE_CHECKING:
    from ..data.transforms import AugmentConfig

DEFAULT_MODEL = "vit_cifar_patch4_32"
# --opt's choices, timm's names: sgd is SGD with Nesterov momentum, momentum with plain momentum
OPTIMIZERS = ("adamw", "muon", "sgd", "momentum", "lamb", "lion")
SGD_OPTIMIZERS = ("sgd", "momentum")
GRAPHED_OPTIMIZERS = ("adamw", "muon")  # the updates --graph-update and --graph-step capture
# --weight-decay's default by optimizer (0.05, DeiT's, for the rest): SGD's decay is added to
# the gradient, so 0.05 would pull every weight to zero (the ViT paper fine-tunes without);
# Lion's takes lr x decay off each weight as AdamW's does, at rates 3-10x below AdamW's, so
# 10x AdamW's keeps the decay's strength (Chen et al. 2023, "Symbolic discovery of
# optimization algorithms")
WEIGHT_DECAY = {"sgd": 0.0, "momentum": 0.0, "lion": 0.5}


def setting(default: Any, group: str, help: str, factory=None, **flag) -> Any:
    """A TrainConfig field: its default, the --help group and text, and any extra argparse
    keywords for its flag (choices, metavar, nargs, const)."""
    metadata = {"group": group, "help": help, "flag": flag}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass
class TrainConfig:
    """Every training setting; train.py exposes each field as a flag of the same name.

    Defaults are light, as timm's train.py's: no RandAugment, MixUp, CutMix, erasing or
    stochastic depth, so a short run on a small data set learns. The heavy 200-epoch recipe
    lives in configs/cifar10.yaml and configs/cifar100.yaml.
    """

    # fmt: off
    data: str = setting("cifar10", "data", "cifar10, cifar100, or a folder with train/ and test/ (or val/) subfolders of class folders")
    data_root: str = setting("data", "data", "where CIFAR is downloaded")
    download: bool = setting(True, "data", "download CIFAR if missing")
    train_subset: int | None = setting(None, "data", "train on N images, stratified by class (quick runs)", metavar="N")
    test_subset: int | None = setting(None, "data", "evaluate on N test images, stratified by class", metavar="N")
    cache: bool | None = setting(None, "data", "decode images once into memory (default: images <= 64 px only)")
    workers: int = setting(default_workers(), "data", "data loader processes (default: one per spare core, at most 4)")
    batch_augment: bool = setting(False, "data", "augment whole uint8 batches held in memory, on the training device (pad-crop, flips, RandAugment, erasing)")
    augment_batches: int = setting(1, "data", "with --batch-augment: augment the images of N batches in one call, then train on them a batch at a time, so that the host's share of the augmentation (its draws and kernel launches) is paid once every N steps; the same distributions, other draws (1: those of earlier releases)", metavar="N")
    cache_dir: str | None = setting("~/.cache/vit", "data", "keep decoded images here between runs, none for off")
    val_split: float | None = setting(None, "data", "hold out this fraction of the training images (per class, chosen by --seed) and evaluate on them each epoch instead of the test split, so that best.safetensors is chosen without the test images", metavar="FRACTION")

    model: str = setting(DEFAULT_MODEL, "model", "a name from vit.list_models()")
    pretrained: str | None = setting(None, "model", "fine-tune from weights: a file, or no value (or 'timm') for timm's default weights", metavar="PATH", nargs="?", const=TIMM_WEIGHTS)
    img_size: int | None = setting(None, "model", "model input size (pos_embed resampled; default: the model's)")
    model_kwargs: dict = setting(None, "model", "other ViTConfig fields, e.g. depth=6 embed_dim=128 num_heads=4 (given as a flag, they replace a --config file's model_kwargs whole, as any flag replaces the file's value: repeat the file's items to keep them)", factory=dict, metavar="KEY=VALUE", nargs="*")
    drop_path: float = setting(0.0, "model", "stochastic depth rate (the 200-epoch recipes use 0.1)")
    drop: float = setting(0.0, "model", "dropout before the head")
    patch_drop: float = setting(0.0, "model", "fraction of patch tokens dropped at random in training")
    patch_drop_anneal: float = setting(0.0, "model", "over this many final epochs, --patch-drop falls linearly to 0 (the last epoch sees every token)")
    mimetic_init: bool = setting(False, "model", "mimetic initialisation of attention (Trockman & Kolter 2023): heads start local, convolution-like")
    patch_embed_init: str = setting("default", "model", "the patch embedding's start: timm's (default), or whiten: the training images' patches whitened (500 images spread over the split, as the evaluation prepares them; the tokens' expected size kept)", choices=("default", "whiten"))
    pos_embed: str = setting("learn", "model", "learned position embeddings, or fixed 2-D sin-cos ones (saved as pos_embed all the same)", choices=("learn", "sincos"))
    trainable_blocks: int | None = setting(None, "fine-tuning", "with --pretrained: train only the last N blocks and what follows them (the final norm, the pool, the head; 0: the head alone); the rest stays frozen (default: every parameter trains)", metavar="N")
    layer_decay: float | None = setting(None, "fine-tuning", "layer-wise learning-rate decay, as BEiT's and MAE's (timm's but for the final norm, which timm puts with the last block): the head and final norm at the full rate, block i at RATE^(depth - i), the embeddings and prefix tokens at RATE^(depth + 1) (fine-tuning BEiT, MAE, DINOv2: 0.65-0.75)", metavar="RATE")
    head_init: str = setting("default", "fine-tuning", "with --pretrained: probe fits the new head on the frozen features with vit.evaluate --linear-probe's protocol before the first step (probe, then fine-tune)", choices=("default", "probe"))

    epochs: int = setting(200, "optimisation", "training epochs")
    time_budget: float | None = setting(None, "optimisation", "seconds of wall time the whole command may take, from its start: at the end of the fifth epoch (the epochs timed, and an evaluation and a checkpoint) --epochs becomes as many as fit, its given value the first guess (the five epochs must be warmup: --warmup-epochs 5 or more, or a first guess of 100 or more; a warmup given or ended by then and the final epochs without MixUp/CutMix keep their length); config.yaml records the count, which --resume keeps (none: train --epochs)", metavar="SECONDS")
    batch_size: int = setting(64, "optimisation", "images per step, per process (the 200-epoch recipes use 128)")
    opt: str | None = setting(None, "optimisation", "adamw; muon: Muon for the blocks' weight matrices, AdamW for the rest; sgd: SGD with Nesterov momentum, or momentum: with plain momentum (the ViT paper fine-tunes with SGD, momentum 0.9, no weight decay, a peak rate of 0.003-0.03 for batches of 512); lamb: timm's LAMB (each weight matrix's update scaled to its norm, the gradients' global norm clipped at 1; DeiT III's); lion: timm's Lion (the sign of a momentum; from scratch at a rate 3-10x below AdamW's, fine-tuning measured best at AdamW's, docs/training.md); timm's names (default: muon from scratch, adamw when fine-tuning --pretrained weights)", choices=OPTIMIZERS)
    momentum: float = setting(0.9, "optimisation", "SGD's momentum with --opt sgd or momentum (timm's flag)")
    lr: float = setting(1e-3, "optimisation", "peak learning rate of --opt's optimizer (Muon's too, but for --muon-lr)")
    muon_lr: float | None = setting(None, "optimisation", "peak Muon learning rate with --opt muon (default: --lr)")
    muon_ns_dtype: str = setting("float32", "optimisation", "dtype of Muon's Newton-Schulz iteration: bfloat16 takes ~half the time where the CPU has AVX512-BF16 or AMX (benchmarks/muon_step.py), and longer without", choices=("float32", "bfloat16"))
    min_lr: float = setting(1e-5, "optimisation", "cosine floor")
    weight_decay: float | None = setting(None, "optimisation", "weight decay of the weight matrices (not of biases, norms, embeddings): AdamW's, Muon's and Lion's decoupled, SGD's added to the gradient, as torch's, LAMB's added to its update (default: 0.05; 0 with --opt sgd or momentum; 0.5 with --opt lion)")
    warmup_epochs: float | None = setting(None, "optimisation", "linear warmup (default: 5% of --epochs)")
    progressive_size: int | None = setting(None, "optimisation", "train the first epochs at this image size, growing linearly to --img-size (needs --batch-augment; default off)")
    progressive_epochs: float | None = setting(None, "optimisation", "epochs over which the image size grows (default: half of --epochs)")
    clip_grad: float | None = setting(1.0, "optimisation", "max gradient norm, 0 or none for no clipping")
    grad_accum_steps: int = setting(1, "optimisation", "batches whose mean gradient makes one optimizer step, as timm's flag: a step over N x --batch-size images per process in the memory of one batch (the schedule, warmup and EMA count steps, so a run takes N times fewer); an epoch's last step takes what is left. Not with --graph-update or --graph-step", metavar="N")
    grad_checkpointing: bool = setting(False, "optimisation", "recompute each block's activations in the backward pass instead of keeping them (timm's flag): less memory for more time (ViT-B/16 on a CPU: 37% less peak memory, 21% more time a step), the same gradients")
    label_smoothing: float = setting(0.1, "optimisation", "label smoothing")
    model_ema: bool = setting(True, "optimisation", "keep an EMA of the weights")
    model_ema_decay: float | None = setting(None, "optimisation", "EMA decay per optimizer step, reached after a warm-up of min(decay, (1 + n) / (10 + n)) at step n, unlike timm's (default: averages over the last ~2% of the steps)")
    amp: bool = setting(False, "optimisation", "mixed precision")
    amp_dtype: str = setting("bfloat16", "optimisation", "autocast dtype", choices=("bfloat16", "float16"))
    compile: bool = setting(False, "optimisation", "torch.compile the model and the loss into one graph (and, off the CPU, --batch-augment's RandAugment)")
    compile_mode: str = setting("default", "optimisation", "torch.compile's mode with --compile: reduce-overhead replays each step's kernels as CUDA graphs on a GPU (the launches of a small model cost more than its arithmetic); max-autotune also searches the fastest kernels", choices=("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"))
    graph_update: bool = setting(False, "optimisation", "gradient clipping, the optimizer's step and the EMA as one graph: on a GPU captured once as a CUDA graph and replayed every step (one launch where eager they are hundreds; no compilation); on a CPU the same arithmetic runs as it is. The eager update's arithmetic (to float rounding) and checkpoints; not with --amp-dtype float16")
    graph_step: bool = setting(False, "optimisation", "the whole training step as one graph: the forward pass and the loss (compiled with --compile), the backward pass and --graph-update's update, on a GPU captured as one CUDA graph per input shape and replayed (one launch a step: the host no longer sets a small model's pace); on a CPU the same arithmetic runs as it is, --graph-update's to the bit. One process; not with --compile-mode reduce-overhead (whose CUDA graphs cannot run inside it) or --amp-dtype float16")

    crop: str = setting("auto", "augmentation", "pad+random crop, random resized crop, or auto (pad for <= 64 px)", choices=("auto", "pad", "rrc"))
    rrc_scale: float = setting(0.08, "augmentation", "smallest random-resized-crop area")
    crop_pad: int | None = setting(None, "augmentation", "pixels added on every side before --crop pad's random crop (default: 1/8 of the input size, 4 on 32)", metavar="PX")
    crop_pad_mode: str = setting("constant", "augmentation", "what --crop pad pads with: constant (black) or reflect (the image mirrored at its edge, as torchvision's RandomCrop padding_mode)", choices=("constant", "reflect"))
    hflip: float = setting(0.5, "augmentation", "horizontal flip probability")
    hflip_alternate: bool = setting(False, "augmentation", "with --batch-augment: flip each image on alternate epochs from a random start, instead of at random (Jordan 2024)")
    aa: str = setting("none", "augmentation", "RandAugment policy (the 200-epoch recipes use randaug)", choices=("none", "randaug"))
    aa_n: int = setting(2, "augmentation", "RandAugment ops per image")
    reprob: float = setting(0.0, "augmentation", "random erasing probability (the 200-epoch recipes use 0.25)")
    aug_repeats: int = setting(0, "augmentation", "repeated augmentation, as timm's flag: each image of an epoch's shuffle taken N times in a row (dealt to the processes in turn), each copy augmented on its own, an epoch still as many samples (DeiT uses 3; 0 or 1: off)", metavar="N")
    mixup: float = setting(0.0, "augmentation", "MixUp alpha, 0 for off (the 200-epoch recipes use 0.8)")
    cutmix: float = setting(0.0, "augmentation", "CutMix alpha, 0 for off (the 200-epoch recipes use 1.0)")
    mixup_prob: float = setting(1.0, "augmentation", "probability of mixing a batch")
    mixup_switch_prob: float = setting(0.5, "augmentation", "probability of CutMix rather than MixUp when both are on")
    mixup_off_epoch: int = setting(0, "augmentation", "train the epochs from this one on (counted from 0, as timm's flag) without MixUp/CutMix; 0: mix to the end")

    distillation_type: str = setting("none", "distillation", "learn from a teacher's predictions of each augmented image as well as from the labels (DeiT): hard takes the teacher's class as a second label, soft its probabilities at --distillation-tau; the teacher, a small CNN, is trained first in the same command (or read from --teacher-path); the ViT trained is the plain model all the same", choices=("none", "soft", "hard"))
    distillation_alpha: float = setting(0.5, "distillation", "the teacher's share of the loss: (1 - ALPHA) x the labels' + ALPHA x the teacher's (DeiT's 0.5)", metavar="ALPHA")
    distillation_tau: float = setting(1.0, "distillation", "soft distillation's temperature")
    teacher_path: str | None = setting(None, "distillation", "the teacher's weights: a teacher.safetensors an earlier run wrote, or that run's folder (default: train one for --teacher-epochs)", metavar="PATH")
    teacher_epochs: int = setting(20, "distillation", "epochs the teacher trains over the training images (pad-crop and flips; SGD, one cycle) before the ViT's first step", metavar="N")
    teacher_width: int = setting(64, "distillation", "the teacher's unit of width: its three stages have W x --teacher-channel-mult channels (64: 64, 128, 256, 1.19M parameters)", metavar="W")
    teacher_channel_mult: list[int] = setting(None, "distillation", "the teacher's three stages' widths in units of --teacher-width (as a U-Net's channel_mult; 1 4 4: airbench's 64, 256, 256 at W 64)", factory=lambda: [1, 2, 4], metavar="M", nargs=3)
    teacher_stem: str = setting("conv", "distillation", "the teacher's first layer: conv (3x3, batch norm, GELU) or whiten (2x2 filters measured from the training images' patches to whiten them, never trained: hlb-cifar10's and airbench's)", choices=("conv", "whiten"))
    teacher_recipe: str = setting("dawnbench", "distillation", "how the teacher trains (vit/training/teacher_recipe.py): dawnbench (SGD 0.4 a batch of 512, momentum 0.9, one cycle) or airbench (airbench94's for its network: frozen norm scales, shifts learning 64x faster, logits x1/9, identity-started convs, lookahead)", choices=("dawnbench", "airbench"))
    teacher_aa: str = setting("none", "distillation", "RandAugment on the teacher's training batches: none, or randaug (the run's --aa-n ops, as the student's batches have them: the student asks the teacher about RandAugmented images, which a teacher that never saw them gets wrong far more often than the test images)", choices=("none", "randaug"))
    teacher_tta: str = setting("none", "distillation", "the teacher's answer about each image: none (its logits), or flip (its mean probability over the image and its mirror image, one pass of twice the images: right more often, as test-time flips make a classifier)", choices=("none", "flip"))

    seed: int = setting(0, "run", "random seed")
    threads: int | None = setting(None, "run", "PyTorch threads per process (default: torch's own choice)")
    eval_interval: int = setting(1, "run", "evaluate every N epochs and after the last")
    checkpoint_interval: int = setting(1, "run", "write the run's weights and training state every N epochs, at each new best and after the last (--resume continues from the last written; a GPU epoch of a second would otherwise wait ~0.2 s for each)")
    device: str = setting("auto", "run", "auto, cpu, cuda, cuda:1, ...")
    output_dir: str | None = setting(None, "run", "run folder (default runs/MODEL-DATA-TIMESTAMP)")
    resume: str | None = setting(None, "run", "continue the run in RUN_DIR from its last complete checkpoint, with its own settings and number of processes (--epochs may change, to extend it, and what does not change what is learnt: --workers, --threads, --device, --checkpoint-interval, --grad-checkpointing, the data's location and cache)", metavar="RUN_DIR")
    processes: int | None = setting(None, "run", "training processes, as started by torchrun (--nproc_per_node): recorded by the run, so that --resume continues with as many (default: as started)", metavar="N")
    # fmt: on

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    def augment(self) -> AugmentConfig:
        from ..data.transforms import AugmentConfig  # albumentations and torch: not for --help

        return AugmentConfig(
            crop=self.crop,
            rrc_scale=self.rrc_scale,
            crop_pad=self.crop_pad,
            crop_pad_mode=self.crop_pad_mode,
            hflip=self.hflip,
            aa=self.aa,
            aa_n=self.aa_n,
            reprob=self.reprob,
        )

    @property
    def pretrained_weights(self) -> bool | str | Path:
        """--pretrained decoded for `vit.create_model`: False, True (timm's) or a file."""
        return pretrained_weights(self.pretrained)

    @property
    def cache_path(self) -> Path | None:
        return Path(self.cache_dir).expanduser() if self.cache_dir else None


# -- accepted values, checked when the flags are read ------------------------------------------
# A value outside its range is refused before anything runs or is written, naming the flag
# (a --drop-path of 1.5 would otherwise fail with a traceback in the middle of epoch 1).
LIMITS: dict[str, Range] = {
    "train_subset": AT_LEAST_1,
    "test_subset": AT_LEAST_1,
    "workers": AT_LEAST_0,
    "crop_pad": AT_LEAST_0,
    "img_size": AT_LEAST_1,
    "drop_path": DROP_RATE,
    "drop": DROP_RATE,
    "patch_drop": DROP_RATE,
    "patch_drop_anneal": NON_NEGATIVE,
    "epochs": AT_LEAST_1,
    "time_budget": POSITIVE,
    "batch_size": AT_LEAST_1,
    "lr": POSITIVE,
    "muon_lr": POSITIVE,
    "min_lr": NON_NEGATIVE,
    "weight_decay": NON_NEGATIVE,
    "momentum": Range(0, 1, high_open=True),  # 1 would never forget a gradient
    "warmup_epochs": NON_NEGATIVE,
    "progressive_size": AT_LEAST_1,
    "progressive_epochs": POSITIVE,
    "clip_grad": NON_NEGATIVE,
    "grad_accum_steps": AT_LEAST_1,
    "trainable_blocks": AT_LEAST_0,
    "layer_decay": Range(0, 1, low_open=True),
    "val_split": Range(0, 1, low_open=True, high_open=True),
    "label_smoothing": DROP_RATE,  # 1 would make every target uniform: nothing to learn
    "model_ema_decay": PROBABILITY,
    "rrc_scale": Range(0, 1, low_open=True),
    "hflip": PROBABILITY,
    "aa_n": AT_LEAST_0,  # RandAugment ops per image: 0 is no op, like --aa none
    "reprob": PROBABILITY,
    "aug_repeats": AT_LEAST_0,
    "augment_batches": AT_LEAST_1,
    "mixup": NON_NEGATIVE,
    "cutmix": NON_NEGATIVE,
    "mixup_prob": PROBABILITY,
    "mixup_switch_prob": PROBABILITY,
    "mixup_off_epoch": AT_LEAST_0,
    "distillation_alpha": PROBABILITY,
    "distillation_tau": POSITIVE,
    "teacher_epochs": AT_LEAST_1,
    "teacher_width": AT_LEAST_1,
    "threads": AT_LEAST_1,
    "eval_interval": AT_LEAST_1,
    "checkpoint_interval": AT_LEAST_1,
    "processes": AT_LEAST_1,
}

# --resume continues a run with its own settings: one given again must be the run's, except
# these, which change how long it trains (--epochs, to extend it) or how it is carried out,
# not what it learns: loader processes and threads, how often checkpoints are written,
# whether activations are recomputed in the backward pass, the device, where the data and the
# cache of decoded images are found, whether they are held in memory.
CHANGEABLE_ON_RESUME = (
    "epochs",
    "workers",
    "threads",
    "checkpoint_interval",
    "grad_checkpointing",
    "device",
    "data_root",
    "download",
    "cache",
    "cache_dir",
)


# create_model's own arguments, which train.py sets from the data and other flags
MODEL_KWARGS_OF_THEIR_OWN = {
    "num_classes": "the number of classes is the data's (the class folders of --data)",
    "img_size": "the input size is --img-size's",
    "pretrained": "the weights are --pretrained's",
    # the rates train.py's own flags set: given twice, the model's silently won
    "drop_path_rate": "stochastic depth is --drop-path's",
    "drop_rate": "dropout is --drop's",
    "patch_drop_rate": "patch dropout is --patch-drop's",
}


def check_settings(cfg: TrainConfig) -> None:
    """Raise ValueError, in one line naming the flag and what it accepts, for the first setting
    outside its range (see LIMITS) or at odds with another; None values mean "unset"."""
    helps = {f.name: f.metadata["help"] for f in fields(TrainConfig)}
    for name, accepted in LIMITS.items():
        value = getattr(cfg, name)
        if value is not None and value not in accepted:
            raise ValueError(out_of_range(flag_name(name), value, accepted, helps[name]))
    if cfg.min_lr > cfg.lr:
        raise ValueError(
            f"--min-lr {cfg.min_lr} is above --lr {cfg.lr}: the cosine schedule decays from "
            f"--lr down to --min-lr; give a --min-lr <= --lr"
        )
    if resolve_optimizer(cfg) == "sgd" and cfg.momentum == 0:  # torch refuses it, in a traceback
        raise ValueError(
            "--opt sgd is SGD with Nesterov momentum, which needs a --momentum above 0; for "
            "SGD without momentum give --opt momentum --momentum 0"
        )
    check_time_budget(cfg, warmup=resolve_warmup_epochs(cfg))  # warmup ends before the run
    check_graphs(cfg)
    from_scratch = (
        ("--patch-embed-init whiten", cfg.patch_embed_init == "whiten", "the patch embedding "
         "from the training images' patches"),
        ("--mimetic-init", cfg.mimetic_init, "the attention's weights local, convolution-like"),
        ("--pos-embed sincos", cfg.pos_embed == "sincos", "the position embeddings as fixed "
         "sin-cos ones"),
    )  # fmt: skip
    for flag, given, what in from_scratch:
        if given and cfg.pretrained is not None:  # they were ignored, without a word
            raise ValueError(
                f"{flag} starts a model from scratch ({what}), and with --pretrained those "
                f"weights come from the pretrained ones; leave out one of the two"
            )
    if len(cfg.teacher_channel_mult) != 3 or min(cfg.teacher_channel_mult) < 1:
        raise ValueError(
            f"--teacher-channel-mult {' '.join(map(str, cfg.teacher_channel_mult))}: the "
            f"teacher has three stages; give three multipliers of 1 or more, e.g. 1 4 4"
        )
    for key, instead in MODEL_KWARGS_OF_THEIR_OWN.items():
        if key in cfg.model_kwargs:
            raise ValueError(
                f"--model-kwargs {key}={cfg.model_kwargs[key]}: {instead}; leave it out of "
                f"--model-kwargs"
            )
    fine_tuning = {"--trainable-blocks": cfg.trainable_blocks is not None}
    fine_tuning["--head-init probe"] = cfg.head_init == "probe"
    for flag, given in fine_tuning.items():
        if given and cfg.pretrained is None:
            raise ValueError(
                f"{flag} fine-tunes pretrained weights, and no --pretrained was given: a "
                f"random backbone's frozen features teach a head nothing; add --pretrained "
                f"[PATH], or leave out {flag}"
            )
    check_trainable_blocks_of_model(cfg)


def check_trainable_blocks_of_model(cfg: TrainConfig) -> None:
    """check_settings' part for --trainable-blocks: no more than --model's blocks (with its
    --model-kwargs), refused before any weights are read (a large model's take long). The
    depth is the architecture's: weights do not change it."""
    if cfg.trainable_blocks is None:
        return
    from ..models.registry import get_spec  # here: the model's modules import torch
    from ..models.vision_transformer import ViTConfig
    from .finetune import check_trainable_blocks

    try:
        arch = get_spec(cfg.model).arch
    except ValueError:  # an unknown --model: building the model refuses it, in its own words
        return
    depth = {**arch, **cfg.model_kwargs}.get("depth", ViTConfig.depth)
    if isinstance(depth, int):  # else a --model-kwargs mistake, which building the model names
        check_trainable_blocks(cfg.trainable_blocks, depth=depth)


def check_time_budget(cfg: TrainConfig, warmup: float) -> None:
    """check_settings' part for --time-budget: its plan comes at the end of PLAN_AFTER_EPOCHS,
    within the run and within the `warmup` (epochs), whose rate does not depend on the length
    the plan sets."""
    if cfg.time_budget is None:
        return
    if cfg.epochs < PLAN_AFTER_EPOCHS:
        raise ValueError(
            f"--time-budget times the first {PLAN_AFTER_EPOCHS} epochs before it sets "
            f"--epochs, and --epochs {cfg.epochs} would end the run first: give --epochs "
            f"{PLAN_AFTER_EPOCHS} or more as the first guess"
        )
    if warmup < PLAN_AFTER_EPOCHS:
        # After the warmup the cosine's rate depends on the run's length, which the plan has
        # not set yet: the rate jumped back up at the plan (a first guess of 6 epochs decayed
        # to 1.2e-4, then 4.1e-4 of a decided 10), and config.yaml could not start it again.
        given = (
            f"--warmup-epochs {cfg.warmup_epochs:g}"
            if cfg.warmup_epochs is not None
            else f"the default warmup, {100 * WARMUP_FRACTION:.0f}% of --epochs {cfg.epochs}"
        )
        guess = math.ceil(PLAN_AFTER_EPOCHS / WARMUP_FRACTION)
        raise ValueError(
            f"--time-budget sets --epochs at the end of epoch {PLAN_AFTER_EPOCHS}, and the "
            f"learning rate of the epochs before must not depend on it, as a warmup's does not: "
            f"{given} ends after {warmup:g}; give --warmup-epochs {PLAN_AFTER_EPOCHS} or more, "
            f"or leave it unset with a first guess of --epochs {guess} or more"
        )


def check_graphs(cfg: TrainConfig) -> None:
    """check_settings' part for --graph-update and --graph-step: what their captured graphs
    cannot hold."""
    graphed = "--graph-step" if cfg.graph_step else "--graph-update" if cfg.graph_update else None
    if graphed and cfg.amp and cfg.amp_dtype == "float16":
        raise ValueError(
            f"{graphed} with --amp-dtype float16: float16's gradient scaler skips steps "
            f"on the host, which the graph cannot; use --amp-dtype bfloat16, or "
            f"leave out {graphed}"
        )
    optimizer = resolve_optimizer(cfg)
    if graphed and optimizer not in GRAPHED_OPTIMIZERS:
        raise ValueError(
            f"{graphed} with --opt {optimizer}: the graph captures AdamW's and "
            f"Muon's updates only; use --opt adamw or muon, or leave out {graphed}"
        )
    if graphed and cfg.grad_accum_steps > 1:
        raise ValueError(
            f"{graphed} with --grad-accum-steps {cfg.grad_accum_steps}: the graph runs a "
            f"whole optimizer step on each batch, and accumulation steps once every "
            f"{cfg.grad_accum_steps} batches; leave out one of the two"
        )
    if cfg.graph_step and cfg.compile and cfg.compile_mode == "reduce-overhead":
        raise ValueError(
            "--graph-step with --compile-mode reduce-overhead: the step is captured as one "
            "CUDA graph, and reduce-overhead's own CUDA graphs cannot be captured inside it; "
            "use --compile-mode default (or max-autotune-no-cudagraphs) with --graph-step"
        )


def idle_settings(cfg: TrainConfig, given: set[str]) -> list[str]:
    """Of the settings `given`, those that change nothing with the others, each with what it
    needs ("--muon-lr acts with --opt muon (the optimizer here: adamw)"): said, not refused,
    since a recipe may carry them for a flag that turns them on."""
    optimizer, mixing = resolve_optimizer(cfg), cfg.mixup > 0 or cfg.cutmix > 0
    muon = (optimizer == "muon", f"--opt muon (the optimizer here: {optimizer})")
    teacher = (cfg.distillation_type != "none", "--distillation-type soft or hard")
    pad = (cfg.crop != "rrc", "--crop pad (or auto, at 64 px or less)")
    needs = {
        "muon_lr": muon,
        "muon_ns_dtype": muon,
        "momentum": (
            optimizer in SGD_OPTIMIZERS,
            f"--opt sgd or momentum (the optimizer here: {optimizer})",
        ),
        "distillation_alpha": teacher,
        "distillation_tau": (cfg.distillation_type == "soft", "--distillation-type soft"),
        "mixup_prob": (mixing, "--mixup or --cutmix above 0"),
        "mixup_switch_prob": (cfg.mixup > 0 and cfg.cutmix > 0, "both --mixup and --cutmix"),
        "mixup_off_epoch": (mixing, "--mixup or --cutmix above 0"),
        "patch_drop_anneal": (cfg.patch_drop > 0, "--patch-drop above 0"),
        "model_ema_decay": (cfg.model_ema, "--model-ema"),
        "progressive_epochs": (cfg.progressive_size is not None, "--progressive-size"),
        "compile_mode": (cfg.compile, "--compile"),
        "rrc_scale": (cfg.crop != "pad", "--crop rrc (or auto, above 64 px)"),
        "crop_pad": pad,
        "crop_pad_mode": pad,
        "aa_n": (cfg.aa != "none", "--aa randaug"),
    }
    # with --teacher-path, the file says how its teacher was built and trained
    trained_here = (cfg.teacher_path is None, "a teacher trained here (not --teacher-path)")
    for name in ("path", "tta"):
        needs[f"teacher_{name}"] = teacher
    for name in ("epochs", "width", "channel_mult", "stem", "recipe", "aa"):
        needs[f"teacher_{name}"] = trained_here if teacher[0] else teacher
    return [
        f"{flag_name(key)} acts with {needed}"
        for key, (acts, needed) in needs.items()
        if key in given and not acts
    ]


def evaluation_split(cfg: TrainConfig) -> str:
    """What the epochs are evaluated on, as the log names it: "validation" under --val-split
    (metrics.csv's test_* columns hold it either way), else "test"."""
    return "test" if cfg.val_split is None else "validation"


def flag_name(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


# --time-budget (vit.training.time_budget) sets --epochs at the end of this epoch: the first
# compiles the step (tens of seconds on a bare GPU machine), so the epochs after it give the
# pace, and four of them average out an epoch's ups and downs (a run on a shared CPU host saw
# its epochs take 13.0-14.2 s, then 20-24 s). The plan still comes inside the default warmup
# of a first guess of 100 epochs or more (5%: 5 of 100; the speedrun's), where the rates the
# timed epochs took are the same whatever the plan decides.
PLAN_AFTER_EPOCHS = 5


# -- settings that follow the length of the run ------------------------------------------------
WARMUP_FRACTION = 0.05  # warmup when none is given: 10 of 200 epochs, 0.2 of 4
EMA_HORIZON = 0.02  # the default EMA averages over about this fraction of the optimizer steps


def resolve_optimizer(cfg: TrainConfig) -> str:
    """The optimizer: as given, or Muon (+ AdamW) from scratch and AdamW for fine-tuning.

    Muon learns much more per step from scratch (a 4-epoch run on 5,000 CIFAR-10 images: see
    the README); pretrained weights were shaped by AdamW, and fine-tuning keeps to it.
    """
    if cfg.opt is not None:
        return cfg.opt
    return "adamw" if cfg.pretrained_weights is not False else "muon"


def resolve_weight_decay(cfg: TrainConfig) -> float:
    """The weight decay: as given, or the optimizer's default (`WEIGHT_DECAY`; 0.05, DeiT's, for
    AdamW, Muon and LAMB)."""
    if cfg.weight_decay is not None:
        return cfg.weight_decay
    return WEIGHT_DECAY.get(resolve_optimizer(cfg), 0.05)


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


def mixup_on_for_epoch(cfg: TrainConfig, epoch: int) -> bool:
    """Whether MixUp/CutMix mixes the batches of `epoch` (counted from 0): every epoch before
    --mixup-off-epoch, or all of them when it is 0. With 60 epochs and 52, the last 8 train
    on whole images and their own labels."""
    return cfg.mixup_off_epoch <= 0 or epoch < cfg.mixup_off_epoch


def patch_drop_for_epoch(cfg: TrainConfig, epoch: int) -> float:
    """--patch-drop, falling linearly to 0 over the last --patch-drop-anneal epochs.

    With 20 epochs and an anneal of 4: epochs 1-16 drop `patch_drop`, then 3/4, 1/2, 1/4 of
    it, and the last epoch sees every token, as evaluation does.
    """
    remaining = cfg.epochs - 1 - epoch  # epochs after this one
    if cfg.patch_drop_anneal <= 0 or remaining >= cfg.patch_drop_anneal:
        return cfg.patch_drop
    return cfg.patch_drop * remaining / cfg.patch_drop_anneal
