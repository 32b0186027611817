"""The whole training step as one CUDA graph (`--graph-step`): the forward pass and the loss,
the backward pass, and `UpdateGraph`'s update (clipping, the optimizer's step, the EMA),
captured once and replayed.

Why: on the H200 the speedrun's step of 512 images took 17.9 ms, and the GPU ran a kernel 22%
of it (docs/gpu.md, the fifth run): the host set the pace, launching the compiled model's CUDA
graphs through dynamo's guards, AOTAutograd's wrappers and the autograd engine, then the
update's hundreds of kernels. `--graph-update` captured the update alone; this captures the
step around it, so that a step costs the host one replay, a few copies and the bookkeeping the
training loop does on the step's loss and logits, and the GPU's arithmetic sets the pace. The
model and loss run as `build_forward_loss` built them (compiled with --compile, in a mode
without CUDA graphs of its own: the step's graph holds their kernels).

What stays outside the graph, per step: MixUp/CutMix (their boxes and weights are drawn on the
host; the mixed batch and its soft targets are the graph's inputs, copied into its own
tensors), this step's numbers (learning rates, bias corrections, the EMA's decay: computed on
the host as the eager optimizer computes them, `UpdateGraph.scalars`), and the scheduler. What
is fixed when a graph is captured: the shapes of the inputs and the model's patch-drop rate
(both change between epochs at most, under progressive resizing or --patch-drop-anneal; a
change captures the step again). The parameters, the optimizer's state and the EMA are the
run's own tensors, updated in place: checkpoints are the same files, and --resume works as it
does without the graph. Stochastic depth draws from the CUDA generator inside the graph, whose
replays advance it as the eager steps would.

On a CPU, which has no launches to save, the step runs as it is: --graph-update's arithmetic
to the bit (tests/test_step_graph.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..models.vision_transformer import VisionTransformer
from ..utils.messages import one_line
from .update_graph import UpdateGraph, captured_after_warm_up

logger = logging.getLogger("vit")


@dataclass
class CapturedStep:
    """One captured step: the graph, the tensors it reads its inputs from, and those it writes
    its outputs to (overwritten by every replay)."""

    key: tuple  # what the graph fixed: input shapes and dtypes, the patch-drop rate
    graph: torch.cuda.CUDAGraph
    images: torch.Tensor  # (B, 3, H, W)
    targets: torch.Tensor  # (B, K) soft targets, or (B,) labels
    scalars: torch.Tensor  # (S,) this step's numbers, UpdateGraph.scalars
    logits: torch.Tensor  # (B, K)
    loss: torch.Tensor  # ()


class StepGraph:
    """Call it with a batch (mixed already, where MixUp/CutMix is on): one training step,
    forward, backward and `update`'s update; returns (logits (B, K), loss), detached.

    On a GPU the first call for a key (the inputs' shapes and dtypes, the model's patch-drop
    rate) captures the step as one CUDA graph, and every later call with that key replays it;
    its outputs are the graph's own tensors, valid until the next call. Where CUDA refuses a
    capture: one warning, that call's step taken uncaptured, and `capturable` turns False, which
    tells the training loop to take its ordinary steps from then on. Build it after any
    `optimizer.load_state_dict` (as `update`)."""

    def __init__(
        self,
        forward_loss: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
        model: VisionTransformer,
        update: UpdateGraph,
    ) -> None:
        self.forward_loss, self.model, self.update = forward_loss, model, update
        self.captured: CapturedStep | None = None  # the latest key's graph: keys never return
        self.capturable = True  # until a capture fails; then the caller steps its own way

    def __call__(
        self, images: torch.Tensor, targets: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        scalars = torch.tensor(self.update.scalars(), dtype=torch.float32)  # (S,)
        key = (
            *images.shape,
            images.dtype,
            *targets.shape,
            targets.dtype,
            self.model.patch_drop.prob,
        )
        if images.is_cuda and (self.captured is None or self.captured.key != key):
            self.captured = self.capture_or_warn(key, images, targets, scalars)
        if not images.is_cuda or self.captured is None:  # a CPU, or the capture was refused
            outputs = self.step(images, targets, scalars.to(images.device))
        else:
            step = self.captured
            step.images.copy_(images)
            step.targets.copy_(targets)
            # from pinned memory: the copy is queued, and the host goes on
            step.scalars.copy_(scalars.pin_memory(), non_blocking=True)
            step.graph.replay()
            outputs = step.logits, step.loss
        self.update.finish()
        return outputs

    def step(
        self, images: torch.Tensor, targets: torch.Tensor, scalars: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The step's arithmetic, from `scalars` (on the parameters' device): no host reads, so
        it can be captured. The gradients start from None: backward makes them (in a capture,
        from the graph's memory, where every replay rewrites them)."""
        for param in self.update.params:
            param.grad = None
        logits, loss = self.forward_loss(images, targets)
        loss.backward()
        self.update.apply(self.update.gradients(), scalars)
        return logits.detach(), loss.detach()

    def capture_or_warn(
        self, key: tuple, images: torch.Tensor, targets: torch.Tensor, scalars: torch.Tensor
    ) -> CapturedStep | None:
        """`capture`; where CUDA refuses it, one warning and None (`capturable` False)."""
        started = time.perf_counter()
        try:
            captured = self.capture(key, images, targets, scalars)
        except RuntimeError as error:
            self.capturable = False
            for param in self.update.params:  # what a broken capture left: nothing to keep
                param.grad = None
            logger.warning(
                "--graph-step: the training step could not be captured as a CUDA graph (%s); "
                "the steps go on without it",
                one_line(error),
            )
            return None
        logger.info(
            "--graph-step: the training step captured as one CUDA graph in %.2f s "
            "(compilation included)",
            time.perf_counter() - started,
        )
        return captured

    def capture(
        self, key: tuple, images: torch.Tensor, targets: torch.Tensor, scalars: torch.Tensor
    ) -> CapturedStep:
        """Record `step` on the graph's own input tensors (copies of these) as one CUDA graph
        (`captured_after_warm_up`: the warm-up's update and random draws undone). `step`
        starts from no gradients, so that the capture's backward makes them anew, in the
        graph's memory."""
        static_images, static_targets = images.clone(), targets.clone()
        static_scalars = scalars.to(images.device)
        graph, (logits, loss) = captured_after_warm_up(
            lambda: self.step(static_images, static_targets, static_scalars),
            updated=self.update.updated_tensors(),
            # the default mode: the autograd engine runs the backward pass on its own thread
            # for the device, which a thread-local capture would not watch
            capture_error_mode="global",
        )
        return CapturedStep(
            key=key,
            graph=graph,
            images=static_images,
            targets=static_targets,
            scalars=static_scalars,
            logits=logits,
            loss=loss,
        )
