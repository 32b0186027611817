"""Fine-tuning pretrained weights: which parameters train (--trainable-blocks), the learning rate
by depth (--layer-decay), and a new head fitted on the frozen features before the first step
(--head-init probe).

Depth, as BEiT's and MAE's layer decay count it (timm's `param_groups_layer_decay` too, but for
the final norm, which it puts at the last block's depth): 0 for what comes before the blocks
(the patch embedding, the position embeddings, the prefix tokens: class, registers,
distillation; CLIP's pre-norm too, which acts on the embeddings alone), i + 1 for block i, and
the top, len(blocks) + 1, for what comes after them (the final norm, SigLIP's attention pool,
the heads). Layer decay scales a parameter's learning rate by
RATE ** (top - depth): the head learns at the full rate, each block below it RATE times slower
(BEiT, MAE, DINOv2 and EVA fine-tune with 0.65-0.75), so the pretrained features deep down move
least.

Probe first (LP-FT, Kumar et al. 2022): a new head starts random, and its first gradients, sent
down through the blocks, distort the features it should read. Fitting it first on the frozen
features, by the package's linear probe (`vit.inference.probe`, the CLIP protocol), starts the
fine-tuning from a head that already reads them.
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
from collections.abc import Collection
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..data.datasets import ImageDataset
from ..inference.probe import ProbeFit, extract_features, fit_linear_probe
from ..models.vision_transformer import VisionTransformer

logger = logging.getLogger("vit")

# Parameters before the blocks (depth 0), by their names' beginnings
STEM = ("patch_embed.", "pos_embed", "cls_token", "reg_token", "dist_token", "norm_pre.")
HEADS = ("head.", "head_dist.")  # the classifiers, all --trainable-blocks 0 trains


def parameter_depths(model: VisionTransformer) -> dict[str, int]:
    """Each parameter's depth (see the module's docstring), by name."""
    top = len(model.blocks) + 1
    depths = {}
    for name, _ in model.named_parameters():
        if name.startswith("blocks."):
            depths[name] = int(name.split(".")[1]) + 1
        elif name.startswith(STEM):
            depths[name] = 0
        else:  # the final norm, the attention pool, the heads
            depths[name] = top
    return depths


def layer_lr_scales(model: VisionTransformer, rate: float) -> dict[str, float]:
    """Each parameter's learning-rate factor under layer decay `rate`: rate ** (top - depth)."""
    top = len(model.blocks) + 1
    return {name: rate ** (top - depth) for name, depth in parameter_depths(model).items()}


def freeze_below(
    model: VisionTransformer, trainable_blocks: int, new: Collection[str] = ()
) -> None:
    """Train only the last `trainable_blocks` blocks and what comes after them (the final norm,
    the pool, the heads): every other parameter is frozen (requires_grad False), so that it
    gets no gradient, no optimizer state and no weight decay. 0: the head alone (and a distilled
    model's second head), the features it reads exactly the pretrained ones. `new`: the names
    of parameters the pretrained weights did not give (the head, an attention pool the weights
    lacked): they always train, as a frozen random parameter helps nobody."""
    depth = len(model.blocks)
    check_trainable_blocks(trainable_blocks, depth=depth)
    first_trained = depth - trainable_blocks + 1  # the depth of the first block that trains
    for name, depth_of in parameter_depths(model).items():
        trains = depth_of >= first_trained if trainable_blocks else name.startswith(HEADS)
        model.get_parameter(name).requires_grad_(trains or name in new)


def check_trainable_blocks(trainable_blocks: int, depth: int) -> None:
    """ValueError, in one line, where --trainable-blocks asks for more blocks than a model of
    `depth` blocks has (or for fewer than none)."""
    if not 0 <= trainable_blocks <= depth:
        raise ValueError(
            f"--trainable-blocks {trainable_blocks}: the model has {depth} blocks; give 0 (the "
            f"head only) to {depth}, or leave it out to train every parameter"
        )


def probe_head(
    model: VisionTransformer,
    train_set: ImageDataset,
    *,
    seed: int,
    batch_size: int,
    workers: int,
    device: torch.device,
    amp: bool,
    work_dir: Path | None = None,
) -> ProbeFit:
    """Fit the model's new head (and a distilled model's second head) on the frozen pooled
    features of `train_set` (prepared by its own transform: the evaluation's, no augmentation)
    with the linear probe's protocol, and copy the fit into it.

    The features are written in `work_dir` (a temporary folder where None). Under a process
    group the embedding engine splits the images between the processes and rank 0 assembles
    their file there, which every process then reads: give a folder they all see."""
    heads = [model.head, getattr(model, "head_dist", None)]
    heads = [head for head in heads if head is not None]
    if not all(isinstance(head, nn.Linear) for head in heads):
        raise ValueError(
            "--head-init probe fits a linear head; this model has none (num_classes=0)"
        )
    model.eval()
    given = contextlib.nullcontext(work_dir) if work_dir else tempfile.TemporaryDirectory()
    with given as folder:
        features, labels = extract_features(
            model,
            train_set,
            Path(folder) / "features.npz",
            batch_size=batch_size,
            workers=workers,
            device=device,
            amp=amp,
        )
    fit = fit_linear_probe(
        torch.as_tensor(features, dtype=torch.float64),
        torch.as_tensor(np.asarray(labels, dtype=np.int64)),
        num_classes=model.num_classes,
        seed=seed,
    )
    with torch.no_grad():
        for head in heads:
            head.weight.copy_(fit.weight)
            head.bias.copy_(fit.bias)
    model.train()
    return fit


def describe_layer_decay(
    model: VisionTransformer, rate: float, optimizer: torch.optim.Optimizer
) -> str:
    """One line for the run's log: the peak learning rate at each depth under layer decay, as
    `optimizer`'s groups hold it (trained parameters only). Where Muon's matrices learn at
    another rate than the AdamW rest (--muon-lr), each has its list, with its rate at the top
    (the rate before layer decay, as metrics.csv's lr gives the first group's)."""
    top = len(model.blocks) + 1
    depth_of = {id(model.get_parameter(name)): d for name, d in parameter_depths(model).items()}
    lists: dict[str, tuple[float, dict[int, float]]] = {}  # kind -> (top rate, depth -> rate)
    for group in optimizer.param_groups:
        kind = "Muon's matrices" if group.get("use_muon") else "the AdamW rest"
        rates = lists.setdefault(kind, (group["lr"] / group.get("lr_scale", 1.0), {}))[1]
        rates.update({depth_of[id(param)]: group["lr"] for param in group["params"]})

    def by_depth(rates: dict[int, float]) -> str:
        return ", ".join(f"{depth}: {rates[depth]:.3g}" for depth in sorted(rates))

    tops = {top_rate for top_rate, _ in lists.values()}
    if len(tops) == 1:  # one rate for both (or AdamW alone)
        said = by_depth({depth: r for _, rates in lists.values() for depth, r in rates.items()})
    else:
        parts = []
        for kind, (top_rate, rates) in lists.items():
            note = "" if parts else ", metrics.csv's lr"  # the first group's, as its column
            parts.append(f"{kind} (top {top_rate:.3g}{note}): {by_depth(rates)}")
        said = "; ".join(parts)
    return (
        f"--layer-decay {rate}: peak learning rate by depth (0: patch and position embeddings, "
        f"prefix tokens; 1-{top - 1}: the blocks; {top}: the final norm and head): {said}"
    )
