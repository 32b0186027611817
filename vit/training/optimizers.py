"""Optimizers: AdamW everywhere, or Muon for the hidden weight matrices and AdamW for the rest
(or torch's SGD, for fine-tuning as the ViT paper did).

Muon (Jordan et al. 2024, "Muon: an optimizer for hidden layers in neural networks") takes
SGD-momentum's update for a weight matrix and replaces it by the nearest semi-orthogonal
matrix (all singular values ~1), computed with a few Newton-Schulz iterations. Every direction
of the matrix then moves by about the same amount, however unequal its gradient's singular
values were.

PyTorch ships `torch.optim.Muon` (>= 2.9); this one differs where it matters here:
  * the Newton-Schulz iteration runs in float32 or bfloat16, a choice: PyTorch's always runs in
    bfloat16, which on a CPU without bf16 matrix units is slower than float32, and with them
    faster (benchmarks/muon_step.py measures both); same-shaped matrices are iterated as one
    batch, which is what lets bfloat16 pay on a CPU;
  * a fused qkv weight (3D, D) is orthogonalised as three (D, D) matrices, query, key and value,
    which are three different linear maps that happen to share one matmul.
Only the transformer blocks' 2-D weights use Muon; the patch embedding, position embeddings,
class token, norms, biases and the head stay with AdamW (Muon is for hidden layers).

Under DistributedDataParallel every process holds the same averaged gradients, so every process
would compute the same Newton-Schulz iterations. Instead each process orthogonalises its share
of the matrices and one all-reduce hands every process all of them (as Jordan et al.'s
distributed Muon does): the result is bit-identical, the work per process divided by the
number of processes.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn

from ..models.vision_transformer import Attention
from .settings import OPTIMIZERS, SGD_OPTIMIZERS

# Quintic Newton-Schulz coefficients with a steep slope at zero (Jordan et al.): a few steps push
# every singular value up toward 1 (at most ~1.2), which is all Muon needs; those far below the
# largest, common in square matrices, stay below ~0.7 after 5 steps.
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)


def orthogonalize(
    matrix: torch.Tensor, steps: int = 5, eps: float = 1e-7, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """The nearest semi-orthogonal matrix to `matrix` (m, n), approximately: U V^T of its SVD;
    or to each matrix of a batch (b, m, n) of same-shaped ones. The iteration runs in `dtype`."""
    a, b, c = NS_COEFFICIENTS
    x = matrix.to(dtype)
    tall = x.shape[-2] > x.shape[-1]
    if tall:  # iterate on the wide orientation: the Gram matrix x x^T is then the smaller one
        x = x.mT
    # Frobenius norm >= spectral norm: every singular value now <= 1
    x = x / (x.norm(dim=(-2, -1), keepdim=True) + eps)
    for _ in range(steps):
        gram = x @ x.mT  # (..., m, m)
        x = a * x + (b * gram + c * gram @ gram) @ x
    return (x.mT if tall else x).to(matrix.dtype)


def orthogonalize_all(
    matrices: list[torch.Tensor], steps: int, dtype: torch.dtype
) -> list[torch.Tensor]:
    """`orthogonalize` for each matrix, same-shaped ones batched into one iteration: one
    matmul per product for all of them. Batching is what makes bfloat16 pay: one 128 x 128
    bfloat16 product at a time ran no faster than float32, a batch of them ~1.9x
    (benchmarks/muon_step.py). In float32 every result equals the unbatched one bit for bit."""
    by_shape: dict[torch.Size, list[int]] = {}
    for index, matrix in enumerate(matrices):
        by_shape.setdefault(matrix.shape, []).append(index)
    results: list[torch.Tensor] = [torch.empty(0)] * len(matrices)
    for indices in by_shape.values():
        batch = orthogonalize(torch.stack([matrices[i] for i in indices]), steps, dtype=dtype)
        for index, result in zip(indices, batch, strict=True):
            results[index] = result
    return results


class Muon(torch.optim.Optimizer):
    """Muon for groups marked `use_muon`, AdamW for the others, in one optimizer.

    One optimizer object keeps the rest of training unchanged: one learning-rate schedule
    (each group's lr is scaled by the same factor), one state dict to save and resume.

    Muon groups: momentum, then orthogonalisation per weight matrix, or per block of rows when
    the group has `splits` > 1. lr is the step size in the RMS sense used by Moonlight (Liu et
    al. 2025): the orthogonal update is scaled by 0.2 * sqrt(max(m, n)), which gives it AdamW's
    typical RMS of ~0.2, so a learning rate tuned for AdamW is a sensible start. Weight decay is
    decoupled, as AdamW's.

    `share_across_processes` (when torch.distributed is initialised): every process
    orthogonalises only its share of the matrices, and one all-reduce per step gives every
    process all of them. This assumes what DistributedDataParallel guarantees, the same
    gradients in every process; pass False when the processes train different parameters.
    """

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        momentum: float = 0.95,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        ns_steps: int = 5,
        ns_dtype: torch.dtype = torch.float32,
        share_across_processes: bool = True,
    ) -> None:
        defaults = dict(
            lr=lr,
            momentum=momentum,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            use_muon=False,
            splits=1,
        )
        super().__init__(params, defaults)
        self.ns_steps = ns_steps
        self.ns_dtype = ns_dtype
        self.share_across_processes = share_across_processes

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        # each group's parameters that have gradients (a frozen or unused one is left alone)
        trained = [
            [param for param in group["params"] if param.grad is not None]
            for group in self.param_groups
        ]
        orthogonal = self._orthogonal_updates(trained)
        for group, params in zip(self.param_groups, trained, strict=True):
            if not params:
                continue
            # Each update is one torch._foreach_* call over the group's tensors, as torch.optim
            # does: the same per-tensor arithmetic, without ~10 Python-level ops per tensor.
            torch._foreach_mul_(params, 1 - group["lr"] * group["weight_decay"])  # decoupled
            if group["use_muon"]:
                self._muon_update(params, orthogonal, group["lr"])
            else:
                self._adamw_update(params, group)
        return loss

    @staticmethod
    def _muon_update(params: list, orthogonal: dict, lr: float) -> None:
        """Each weight moves by its orthogonalised update (splits, m, n), scaled by
        0.2 sqrt(max(m, n)): one foreach call per scale."""
        by_scale: dict[float, list[int]] = {}
        for index, param in enumerate(params):
            _, m, n = orthogonal[param].shape
            by_scale.setdefault(update_scale(m, n), []).append(index)
        for scale, indices in by_scale.items():
            updates = [orthogonal[params[i]].reshape(params[i].shape) for i in indices]
            torch._foreach_add_([params[i] for i in indices], updates, alpha=-lr * scale)

    def _orthogonal_updates(self, trained: list[list]) -> dict[torch.Tensor, torch.Tensor]:
        """Momentum for every trained Muon parameter (`trained`: each group's parameters with
        gradients), then its orthogonalised update (splits, m, n), each block computed by one
        process and shared with the others."""
        updates = {}
        for group, params in zip(self.param_groups, trained, strict=True):
            if not group["use_muon"]:
                continue
            grads = [param.grad for param in params]
            bufs = momentum_buffers(self.state, params)
            nesterov = nesterov_momentum(grads, bufs, group["momentum"])
            for param, update in zip(params, nesterov, strict=True):
                # (splits * m, n) -> splits blocks of (m, n), each orthogonalised on its own
                updates[param] = update.reshape(group["splits"], -1, update.shape[-1])
        blocks = [(param, i) for param, update in updates.items() for i in range(len(update))]
        rank, world = _rank_and_world() if self.share_across_processes else (0, 1)
        owners = share_work([updates[param][i].shape for param, i in blocks], world)
        mine = [block for block, owner in zip(blocks, owners, strict=True) if owner == rank]
        results = orthogonalize_all(
            [updates[param][i] for param, i in mine], self.ns_steps, self.ns_dtype
        )
        for (param, i), result in zip(mine, results, strict=True):
            updates[param][i] = result
        # the other blocks: another process computes each; adding zeros in the all-reduce is exact
        for (param, i), owner in zip(blocks, owners, strict=True):
            if owner != rank:
                updates[param][i] = 0
        if world > 1 and updates:
            flat = torch.cat([update.flatten() for update in updates.values()])
            # every value is already one of ns_dtype: sending it as such is exact, and shorter
            sent = flat.to(self.ns_dtype)
            dist.all_reduce(sent)  # each block: its owner's result + zeros from the others
            pieces = sent.to(flat.dtype).split([update.numel() for update in updates.values()])
            shaped = zip(updates.items(), pieces, strict=True)
            updates = {param: piece.view_as(update) for (param, update), piece in shaped}
        return updates

    def _adamw_update(self, params: list, group: dict) -> None:
        """AdamW's update (Loshchilov & Hutter) of every tensor in `params`."""
        states = adamw_states(self.state, params, count_dtype=torch.float64)
        grads = [param.grad for param in params]
        exp_avgs = [state["exp_avg"] for state in states]
        exp_avg_sqs = [state["exp_avg_sq"] for state in states]
        torch._foreach_add_([state["step"] for state in states], 1)
        steps = [state["step"].item() for state in states]
        beta1, beta2 = group["betas"]
        adamw_moments_(exp_avgs, exp_avg_sqs, grads, group["betas"])
        denoms = torch._foreach_div(exp_avg_sqs, [1 - beta2**step for step in steps])
        torch._foreach_sqrt_(denoms)
        torch._foreach_add_(denoms, group["eps"])
        step_sizes = [-group["lr"] / (1 - beta1**step) for step in steps]
        torch._foreach_addcdiv_(params, exp_avgs, denoms, step_sizes)


def update_scale(rows: int, cols: int) -> float:
    """The factor on an orthogonalised (rows, cols) update: 0.2 sqrt(max(rows, cols)) gives it
    AdamW's typical RMS of ~0.2 (Moonlight's matching)."""
    return 0.2 * math.sqrt(max(rows, cols))


def momentum_buffers(state: dict, params: list) -> list[torch.Tensor]:
    """Each parameter's Muon momentum buffer in the optimizer's `state`, made (zeros) where
    missing."""
    for param in params:
        if "momentum_buffer" not in state[param]:
            state[param]["momentum_buffer"] = torch.zeros_like(param)
    return [state[param]["momentum_buffer"] for param in params]


def nesterov_momentum(grads: list, buffers: list, momentum: float) -> list[torch.Tensor]:
    """The buffers moved toward the gradients in place (SGD momentum as an EMA); returns the
    Nesterov updates, the gradients moved toward the new buffers."""
    torch._foreach_lerp_(buffers, grads, 1 - momentum)
    return torch._foreach_lerp(grads, buffers, momentum)


def adamw_states(state: dict, params: list, count_dtype: torch.dtype) -> list[dict]:
    """Each parameter's AdamW state in the optimizer's `state` (step count in `count_dtype`,
    on the CPU; the two moments), made (zeros) where missing."""
    for param in params:
        if "step" not in state[param]:
            state[param]["step"] = torch.zeros((), dtype=count_dtype)
            state[param]["exp_avg"] = torch.zeros_like(param)
            state[param]["exp_avg_sq"] = torch.zeros_like(param)
    return [state[param] for param in params]


def adamw_moments_(exp_avgs: list, exp_avg_sqs: list, grads: list, betas) -> None:
    """AdamW's first and second moments, updated in place with this step's gradients."""
    beta1, beta2 = betas
    torch._foreach_lerp_(exp_avgs, grads, 1 - beta1)
    torch._foreach_mul_(exp_avg_sqs, beta2)
    torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1 - beta2)


def share_work(shapes: list[torch.Size], world: int) -> list[int]:
    """The process (0 .. world-1) that orthogonalises each (m, n) block: largest first, each to
    the least loaded process, the cost of a block being its Newton-Schulz flops, ~ m n min(m, n)."""
    load = [0] * world
    owners = [0] * len(shapes)
    for index in sorted(range(len(shapes)), key=lambda i: -math.prod(shapes[i]) * min(shapes[i])):
        owner = load.index(min(load))
        owners[index] = owner
        load[owner] += math.prod(shapes[index]) * min(shapes[index])
    return owners


def _rank_and_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def param_groups(
    model: nn.Module, weight_decay: float, lr_scales: dict[str, float] | None = None
) -> list[dict]:
    """Weight decay on weights only: not on biases, norms or what `no_weight_decay()` names
    (pos_embed, the class and register tokens; the attention pool's query is decayed, as timm);
    frozen parameters (requires_grad False) in no group. With `lr_scales` (a factor per
    parameter name: layer decay), one group per factor and kind, each with its `lr_scale`."""
    skip = set(getattr(model, "no_weight_decay", set)())
    groups: dict[tuple[float, bool], list] = {}  # (lr factor, decayed) -> parameters
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        decayed = not (param.ndim <= 1 or name in skip)
        scale = 1.0 if lr_scales is None else lr_scales[name]
        groups.setdefault((scale, decayed), []).append(param)
    if lr_scales is None:  # the two groups every run before layer decay saved, in their order
        return [
            {"params": groups.get((1.0, True), []), "weight_decay": weight_decay},
            {"params": groups.get((1.0, False), []), "weight_decay": 0.0},
        ]
    return [
        {"params": params, "weight_decay": weight_decay if decayed else 0.0, "lr_scale": scale}
        for (scale, decayed), params in sorted(groups.items(), key=lambda kv: (kv[0][0], -kv[0][1]))
    ]


def muon_param_groups(
    model: nn.Module,
    weight_decay: float,
    muon_lr: float,
    lr_scales: dict[str, float] | None = None,
) -> list[dict]:
    """Muon groups for the blocks' trainable 2-D weights (a fused qkv split in three), one per
    learning-rate factor with `lr_scales`, then AdamW groups (with `param_groups`' rules) for
    every other trainable parameter."""
    fused_qkv = {id(m.qkv.weight) for m in model.modules() if isinstance(m, Attention)}
    muon: dict[tuple[float, int], list] = {}  # (lr factor, splits) -> parameters
    for name, param in model.named_parameters():
        if param.requires_grad and param.ndim == 2 and name.startswith("blocks."):
            scale = 1.0 if lr_scales is None else lr_scales[name]
            muon.setdefault((scale, 3 if id(param) in fused_qkv else 1), []).append(param)
    in_muon = {id(p) for params in muon.values() for p in params}
    groups = []
    for (scale, splits), params in sorted(muon.items()):
        group = {"params": params, "use_muon": True, "splits": splits}
        group.update(lr=muon_lr, weight_decay=weight_decay)
        if lr_scales is not None:
            group["lr_scale"] = scale
        groups.append(group)
    adamw = [
        {**group, "params": [p for p in group["params"] if id(p) not in in_muon]}
        for group in param_groups(model, weight_decay, lr_scales)
    ]
    return groups + [g for g in adamw if g["params"]]


def build_optimizer(
    model: nn.Module,
    name: str,
    lr: float,
    weight_decay: float,
    muon_lr: float | None = None,
    muon_ns_dtype: str = "float32",
    fused: bool = False,
    lr_scales: dict[str, float] | None = None,
    momentum: float = 0.9,
) -> torch.optim.Optimizer:
    """`name` "adamw": AdamW on every trainable parameter; "muon": Muon (lr `muon_lr`, default
    `lr`; its Newton-Schulz iteration in `muon_ns_dtype`) for the blocks' weight matrices and
    AdamW for the rest; "sgd": SGD with Nesterov `momentum`, "momentum": with plain momentum
    (timm's names; torch's SGD, its weight decay added to the gradient); "lamb" and "lion":
    timm's LAMB (betas 0.9 and 0.999, the gradients' global norm clipped at 1, the decayed
    tensors' updates scaled to their norms) and Lion (betas 0.9 and 0.99). `fused`: torch's fused
    AdamW or SGD, one kernel for every tensor (for a GPU). `lr_scales`: each parameter's learning
    rate is its group's times its factor (layer decay)."""
    if name == "muon":
        groups = muon_param_groups(
            model, weight_decay, lr if muon_lr is None else muon_lr, lr_scales
        )
    elif name in OPTIMIZERS:
        groups = param_groups(model, weight_decay, lr_scales)
    else:
        raise ValueError(f"unknown optimizer {name!r}; accepted: {', '.join(OPTIMIZERS)}")
    for group in groups:  # each group's base rate (Muon's own, --lr the rest's) times its factor
        if "lr_scale" in group:
            group["lr"] = group.get("lr", lr) * group["lr_scale"]
    if name == "adamw":
        return torch.optim.AdamW(groups, lr=lr, fused=fused or None)
    if name in SGD_OPTIMIZERS:
        nesterov = name == "sgd"
        return torch.optim.SGD(
            groups, lr=lr, momentum=momentum, nesterov=nesterov, fused=fused or None
        )
    if name in ("lamb", "lion"):  # timm's, with its defaults; each group brings its decay
        from timm.optim import Lamb, Lion

        return Lamb(groups, lr=lr) if name == "lamb" else Lion(groups, lr=lr)
    return Muon(groups, lr=lr, ns_dtype=getattr(torch, muon_ns_dtype))
