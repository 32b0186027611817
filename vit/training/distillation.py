"""Distillation from a CNN teacher: `--distillation-type hard|soft` (DeiT, Touvron et al. 2021).

The teacher (`vit.models.cnn_teacher.CnnTeacher`) is trained first, from scratch, on the run's
training images (pad-crop and flips, nothing else: a CNN needs no more for a few epochs) by
--teacher-recipe (`vit.training.teacher_recipe`), in the same command and within its
--time-budget; or read from --teacher-path. It is saved in the
run folder (`teacher.safetensors`), so that --resume learns from the very teacher the run began
with. Then every training step asks it, frozen, for its logits on the step's own images
(augmented and mixed as the student sees them: DeiT's, and Beyer et al. 2022's "consistent
teaching") and the student's loss becomes

    (1 - alpha) * loss(student, labels) + alpha * distill(student, teacher)

    hard:  cross-entropy with the teacher's class as the label (DeiT's hard distillation, its
           best; here through the one head, without DeiT's distillation token: the student
           stays the plain ViT)
    soft:  tau^2 * KL(softmax(teacher / tau) || softmax(student / tau)), per image (Hinton et
           al. 2015)

Nothing of the teacher is in the student's weights: model.safetensors and best.safetensors are
the plain ViT, and evaluate.py, predict and export read them as any other.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file

from ..inference.evaluation import evaluate
from ..inference.tta import log_mean_probability
from ..models.cnn_teacher import CHANNEL_MULT, CnnTeacher, whiten_stem_
from ..utils.files import atomic_write
from ..utils.process_group import DistInfo
from .checkpoint import TEACHER_FILE
from .settings import TrainConfig
from .teacher_recipe import RECIPES, TeacherRecipe, freeze, train_teacher

logger = logging.getLogger("vit")

METADATA_KEY = "vit.teacher"


def distillation_loss(
    logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    base_loss: torch.Tensor,
    *,
    kind: str,
    alpha: float,
    tau: float = 1.0,
) -> torch.Tensor:
    """(1 - alpha) * base_loss + alpha * the loss of `logits` (B, K) against `teacher_logits`
    (B, K), per `kind` ("hard" or "soft"; see the module's notes). float32 in, float32 out."""
    if kind == "hard":
        distill = F.cross_entropy(logits, teacher_logits.argmax(dim=1))
    elif kind == "soft":
        distill = F.kl_div(
            F.log_softmax(logits / tau, dim=1),
            F.log_softmax(teacher_logits / tau, dim=1),
            reduction="batchmean",
            log_target=True,
        ) * (tau * tau)  # the gradients' size kept as tau changes (Hinton et al.)
    else:
        raise ValueError(f"distillation kind must be 'hard' or 'soft', got {kind!r}")
    return (1.0 - alpha) * base_loss + alpha * distill


def teacher_logits(teacher: torch.nn.Module, images: torch.Tensor, tta: str) -> torch.Tensor:
    """What the frozen `teacher` says about images (B, 3, H, W): its logits (B, K) in float32,
    or under --teacher-tta flip the log of its mean probability over each image and its mirror
    image (`vit.inference.tta.log_mean_probability`: usable as logits, its softmax that mean). The
    two views go through in one pass of 2B images: one set of launches, and batch norm in eval
    mode makes an image's answer independent of its batch."""
    if tta == "none":
        return teacher(images).float()
    if tta != "flip":
        raise ValueError(f"--teacher-tta must be none or flip, got {tta!r}")
    both = teacher(torch.cat([images, images.flip(-1)])).float()  # (2B, K)
    return log_mean_probability(*both.chunk(2))  # (B, K)


def teacher_loader_settings(cfg: TrainConfig, recipe: TeacherRecipe) -> TrainConfig:
    """The run's settings for the teacher's training batches: its crop (with the recipe's
    padding where it has one) and flips, RandAugment only under --teacher-aa randaug, none of
    erasing, repeats or resizing (MixUp/CutMix are the loop's, not the loader's)."""
    return replace(
        cfg,
        aa=cfg.teacher_aa,
        reprob=0.0,
        aug_repeats=0,
        augment_batches=1,
        progressive_size=None,
        crop_pad=cfg.crop_pad if recipe.crop_pad is None else recipe.crop_pad,
        crop_pad_mode=recipe.crop_pad_mode or cfg.crop_pad_mode,
    )


def on_device(teacher: CnnTeacher, device: torch.device) -> CnnTeacher:
    """`teacher` on `device` in channels-last layout (the one convolutions run fastest in), the
    same however the run got it: trained here, read for --resume or from --teacher-path."""
    return teacher.to(device, memory_format=torch.channels_last)


def save_teacher(teacher: CnnTeacher, path: Path, facts: dict) -> None:
    """The teacher's weights, with its architecture and `facts` (epochs, test top-1) in the
    file's metadata; atomic."""
    metadata = {
        "num_classes": teacher.num_classes,
        "width": teacher.width,
        "channel_mult": list(teacher.channel_mult),
        "stem": teacher.stem_kind,
        "logit_scale": teacher.logit_scale,
        "pool_before_norm": teacher.pool_before_norm,
        **facts,
    }
    tensors = {k: v.detach().cpu().contiguous() for k, v in teacher.state_dict().items()}
    atomic_write(
        path, lambda tmp: save_file(tensors, str(tmp), {METADATA_KEY: json.dumps(metadata)})
    )


def load_teacher(
    path: str | Path, num_classes: int, flag: str = "--teacher-path"
) -> tuple[CnnTeacher, dict]:
    """(the teacher in `path`, frozen, on the CPU; its metadata). ValueError, naming `flag` (what
    gave the file) and the file, for one that is not a teacher this run can use."""
    path = Path(path)
    if path.is_dir():  # a run folder, as every model argument takes one: the teacher it wrote
        if not (path / TEACHER_FILE).is_file():
            raise ValueError(
                f"{flag} {path}: a folder without a {TEACHER_FILE}; give the folder of a run "
                f"that distilled (--distillation-type) or its {TEACHER_FILE}"
            )
        path = path / TEACHER_FILE
    if not path.is_file():
        raise ValueError(f"{flag} {path}: no such file; give a {TEACHER_FILE} a run wrote")
    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = json.loads((f.metadata() or {}).get(METADATA_KEY, "null"))
            tensors = {key: f.get_tensor(key) for key in f.keys()}
    except Exception as e:  # safetensors' own errors name no file
        raise ValueError(f"{flag} {path}: not a safetensors file ({e})") from None
    if not isinstance(metadata, dict):
        raise ValueError(
            f"{flag} {path}: no teacher's metadata ({METADATA_KEY}) in the file; give "
            f"a {TEACHER_FILE} that a run with --distillation-type wrote"
        )
    if metadata["num_classes"] != num_classes:
        raise ValueError(
            f"{flag} {path}: a teacher of {metadata['num_classes']} classes, and the "
            f"data has {num_classes}; give a teacher trained on these classes"
        )
    # a file of the first teachers says their width only: stages (w, 2w, 4w), a conv stem, x1
    teacher = CnnTeacher(
        num_classes,
        width=metadata["width"],
        channel_mult=metadata.get("channel_mult", CHANNEL_MULT),
        stem=metadata.get("stem", "conv"),
        logit_scale=metadata.get("logit_scale", 1.0),
        pool_before_norm=metadata.get("pool_before_norm", False),
    )
    teacher.load_state_dict(tensors)
    return freeze(teacher), metadata


def build_teacher(
    cfg: TrainConfig,
    *,
    num_classes: int,
    train_loader,
    test_loader,
    whitening: Iterable[torch.Tensor],
    info: DistInfo,
    device: torch.device,
    recipe: TeacherRecipe | None = None,
) -> tuple[CnnTeacher, dict]:
    """The run's teacher on `device`, frozen, with its facts: the run folder's own on --resume,
    else --teacher-path's, else a CnnTeacher of --teacher-width, --teacher-channel-mult and
    --teacher-stem trained for --teacher-epochs over `train_loader` (the teacher's batches:
    `teacher_loader_settings`), a whitening stem first measured on `whitening` (training
    images (B, C, H, W), normalised; read only for that stem); the last two evaluated on
    `test_loader` (its top-1 logged and kept in the facts)."""
    if cfg.resume:
        saved = Path(cfg.resume) / TEACHER_FILE
        if not saved.is_file():
            raise ValueError(
                f"--resume {cfg.resume}: the run distils from a teacher and its {TEACHER_FILE} "
                f"is missing; the run cannot continue against the same teacher"
            )
        teacher, facts = load_teacher(saved, num_classes, flag="--resume")
        log_teacher(teacher, facts, f"from {saved}", info)
        return on_device(teacher, device), facts
    if cfg.teacher_path is not None:
        teacher, facts = load_teacher(cfg.teacher_path, num_classes)
        teacher, where = on_device(teacher, device), f"from {cfg.teacher_path}"
    else:
        teacher, facts, where = train_here(
            cfg,
            num_classes=num_classes,
            train_loader=train_loader,
            whitening=whitening,
            info=info,
            device=device,
            recipe=recipe or RECIPES[cfg.teacher_recipe],
        )
    scores = evaluate(
        teacher,
        test_loader,
        num_classes=num_classes,
        device=device,
        amp=cfg.amp,
        amp_dtype=cfg.amp_dtype,
        tta=cfg.teacher_tta,
    )
    facts["test_top1"] = scores["top1"]
    if cfg.teacher_tta == "flip":  # the top-1 of the answers the student is given
        facts["test_top1_flip"] = scores["tta"]["top1"]
    log_teacher(teacher, facts, where, info)
    return teacher, facts


def train_here(
    cfg: TrainConfig,
    *,
    num_classes: int,
    train_loader,
    whitening: Iterable[torch.Tensor],
    info: DistInfo,
    device: torch.device,
    recipe: TeacherRecipe,
) -> tuple[CnnTeacher, dict, str]:
    """A new CnnTeacher of --teacher-width, --teacher-channel-mult and --teacher-stem on
    `device`, trained by `recipe` for --teacher-epochs over `train_loader` (its stem first
    measured on `whitening` where it whitens): (the teacher, its facts, where it comes from)."""
    # The teacher's initial weights from a generator of its own: the student's stream of
    # draws (stochastic depth, MixUp) stays what it is in the same run without a teacher.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed + 1)
        teacher = CnnTeacher(
            num_classes,
            width=cfg.teacher_width,
            channel_mult=cfg.teacher_channel_mult,
            stem=cfg.teacher_stem,
            **recipe.network,
        )
    if cfg.teacher_stem == "whiten":  # measured on every process alike: no draws
        whiten_stem_(teacher, whitening)
    teacher = on_device(teacher, device)
    began = time.perf_counter()
    train_loss = train_teacher(
        teacher,
        train_loader,
        recipe=recipe,
        epochs=cfg.teacher_epochs,
        device=device,
        amp=cfg.amp,
        amp_dtype=cfg.amp_dtype,
        info=info,
    )
    seconds = time.perf_counter() - began
    facts = {
        "epochs": cfg.teacher_epochs,
        "recipe": cfg.teacher_recipe,
        "aa": cfg.teacher_aa,
        "train_loss": train_loss,
        "train_seconds": seconds,
    }
    randaug = f", RandAugment x{cfg.aa_n}" if cfg.teacher_aa == "randaug" else ""
    where = (
        f"trained here by the {cfg.teacher_recipe} recipe{randaug}, {cfg.teacher_epochs} "
        f"epochs in {seconds:.1f} s"
    )
    return teacher, facts, where


def log_teacher(teacher: CnnTeacher, facts: dict, where: str, info: DistInfo) -> None:
    """One line: the teacher, where it comes from, its top-1 on the run's evaluation images (and
    that of its flip-averaged answers, where --teacher-tta measured it)."""
    if info.is_main:
        flip = facts.get("test_top1_flip")
        logger.info(
            "teacher: CnnTeacher of stages %s, %s stem (%.2fM parameters), %s: top-1 %.2f%%%s",
            "/".join(map(str, teacher.widths)),
            teacher.stem_kind,
            sum(p.numel() for p in teacher.parameters()) / 1e6,
            where,
            100 * facts["test_top1"],
            "" if flip is None else f" ({100 * flip:.2f}% flip-averaged, as --teacher-tta asks it)",
        )
