"""Host time of each eager part of a GPU speedrun step, measured on this CPU at the recipe's
tensor structure with tiny tensors: what a step costs the host in Python and dispatch before
the GPU's arithmetic, where the arithmetic is negligible.

    python benchmarks/host_overhead.py
    python benchmarks/host_overhead.py --config configs/cifar10_gpu_speedrun.yaml --width 16
    python benchmarks/host_overhead.py --image-size 8

The model is the config's with its width set to --width (the same 103 tensors, the same
number of same-shaped matrix groups for Muon), one thread, each part's median over --repeats
calls: what --graph-step leaves the host each step (the recipe's CutMix on a batch it mixes,
the loop's tally of the loss and correct predictions) and the eager forward and backward
passes its graph replays (on two images: the dispatch, not the arithmetic); the optimizer step
(Muon and AdamW for the rest, as the recipe builds it, the Newton-Schulz iteration in float32
whatever the recipe's), gradient clipping, the EMA update, the three one after the other (what
--graph-update replays as one CUDA graph on a GPU), and one in-memory batch (the pipeline's own
ops; RandAugment eager, on the whole batch as on a GPU, and compiled's single call is not
counted here), alone and as one of 16 augmented in one call (--augment-batches 16: the call's
time over 16, its arithmetic on 16 times the images included). On a GPU each dispatched
operation is also a kernel launch (a few microseconds more), and a torch._foreach_* operation
one launch for all its tensors where the CPU loops over them: the CPU's figure for
those is an overestimate. A figure near a GPU step's time (13.9 ms in the fourth GPU run,
docs/gpu.md) says that part can set the pace, which the GPU's profile (`benchmarks/
training_pipeline.py`: its host_top_ops) then confirms or not. The RandAugment row predicted
the ~8 ms a step it cost on an H200.
"""

from __future__ import annotations

import functools
import itertools
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import _cli
import torch
from torch import nn

import vit
from vit.data.batch_pipeline import InMemoryBatches
from vit.data.batch_randaugment import apply_ops
from vit.training.build import build_mixup
from vit.training.ema import ModelEma
from vit.training.engine import tally
from vit.training.optimizers import build_optimizer
from vit.training.settings import TrainConfig, resolve_weight_decay
from vit.training.update_graph import UpdateGraph


def median_ms(call: Callable, repeats: int) -> float:
    for _ in range(3):  # warm-up: first-call allocations, lazy initialisation
        call()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    parser = _cli.parser(__doc__)
    parser.add_argument("--config", type=Path, default=_cli.SPEEDRUN_CONFIG, help=_cli.CONFIG_HELP)
    parser.add_argument("--width", type=int, default=16, help="embed_dim (divisible by heads)")
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument(
        "--compile-seconds",
        action="store_true",
        help="also time torch.compile of the three as one function (UpdateGraph.apply) from a "
        "cold cache: what a bare machine would pay, and why --graph-update captures instead",
    )
    parser.add_argument(
        "--image-size",
        type=int,
        default=32,
        help="side of the batch rows' images (8: their arithmetic, which a GPU does in parallel, "
        "all but gone from the 16-batch calls)",
    )
    args = parser.parse_args(argv)
    cfg = _cli.checked_config(parser, args.config)
    torch.set_num_threads(1)
    model = vit.create_model(cfg.model, **{**cfg.model_kwargs, "embed_dim": args.width})
    for param in model.parameters():
        param.grad = torch.randn_like(param)
    opt = cfg.opt or "adamw"
    optimizer = build_optimizer(
        model,
        opt,
        lr=cfg.lr,
        weight_decay=resolve_weight_decay(cfg),
        # float32: a CPU without bfloat16 products emulates them, arithmetic this does not time
        muon_ns_dtype="float32",
    )
    ema = ModelEma(model, 0.999)

    def eager_update() -> None:
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        ema.update(model)

    side = args.image_size
    images = torch.randint(0, 256, (64, 3, side, side), dtype=torch.uint8)
    rows = {
        **step_rows(model, cfg),
        f"optimizer step ({opt})": optimizer.step,
        "gradient clipping": lambda: nn.utils.clip_grad_norm_(model.parameters(), 1.0),
        "EMA update": lambda: ema.update(model),
        "the three, one after the other": eager_update,
    }
    per_call = {}  # row name -> batches augmented in one call (--augment-batches)
    for randaug, augment_batches in itertools.product((0, 2), (1, 16)):
        batches = InMemoryBatches(
            images,
            range(64),
            batch_size=4,
            mean=(0.5,) * 3,
            std=(0.25,) * 3,
            pad=side // 8,
            hflip_alternate=True,
            randaug_ops=randaug,
        )
        # a GPU's eager RandAugment: every op on the whole batch
        batches.apply_randaug = functools.partial(apply_ops, whole_batch=True)
        generator = torch.Generator().manual_seed(0)
        name = f"a batch, RandAugment x{randaug} eager" if randaug else "a batch, no RandAugment"
        if augment_batches > 1:
            name += f", {augment_batches} batches a call (the call's time / {augment_batches})"
        n = 4 * augment_batches
        rows[name] = lambda b=batches, g=generator, n=n: b.augment(images[:n], g, torch.arange(n))
        per_call[name] = augment_batches
    params = sum(1 for _ in model.parameters())
    print(
        f"{args.config} at width {args.width}: {params} tensors, 1 thread, median of "
        f"{args.repeats}; {_cli.machine()}"
    )
    print("| part of a step | host ms |\n|---|---:|")
    for name, call in rows.items():
        print(f"| {name} | {median_ms(call, args.repeats) / per_call.get(name, 1):.2f} |")
    if args.compile_seconds:
        seconds = compile_seconds(model, optimizer)
        print(f"torch.compile of the three as one function, cold cache: {seconds:.1f} s")


def step_rows(model: nn.Module, cfg: TrainConfig) -> dict[str, Callable]:
    """The rest of a training step, on a batch of 64: what --graph-step leaves the host each
    step (the recipe's CutMix on a batch it mixes, the loop's tally of loss and correct
    predictions; its replay and three copies are a few launches more on a GPU), and the eager
    forward and backward passes that its graph replays with one launch (on two images: what
    the host pays, the arithmetic all but gone)."""
    batch = torch.randn(64, 3, *model.patch_embed.img_size)
    labels = torch.arange(64) % model.num_classes
    mixup = build_mixup(cfg, model.num_classes)
    if mixup is not None:
        mixup.prob = 1.0  # a batch it mixes (the recipe's mixes half of them)
    sums = torch.zeros(2, dtype=torch.float64)
    first_bad = torch.full((2,), -1.0, dtype=torch.float64)
    logits, loss = torch.randn(64, model.num_classes), torch.tensor(1.0)

    def outside_the_graph() -> None:
        if mixup is not None:
            mixup(batch, labels)
        tally(sums, first_bad, step=0, loss=loss, logits=logits, labels=labels)

    def forward_backward() -> None:  # on two images: the dispatch, not the arithmetic
        model.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(batch[:2]), labels[:2]).backward()

    return {
        "a step's CutMix and tally: what --graph-step leaves the host": outside_the_graph,
        "forward and backward, eager: what --graph-step --no-compile replays": forward_backward,
    }


def compile_seconds(model: nn.Module, optimizer: torch.optim.Optimizer) -> float:
    """Seconds to the end of the first call of the update compiled with torch.compile
    (fullgraph), inductor's caches empty (a fresh folder)."""
    update = UpdateGraph(optimizer, model, ModelEma(model, 0.999), clip_grad=1.0)
    grads = [param.grad for param in update.params]
    scalars = torch.tensor(update.scalars(), dtype=torch.float32)
    with tempfile.TemporaryDirectory() as cache:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
        started = time.perf_counter()
        torch.compile(update.apply, fullgraph=True)(grads, scalars)
        return time.perf_counter() - started


if __name__ == "__main__":
    _cli.run(main)
