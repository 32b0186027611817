"""--model-dtype: inference with the weights themselves in bfloat16 (timm's flag of that name).

Why the weights and not autocast: on a CPU with AMX, ViT-S/16 ran 4.7x timm's float32 with
bfloat16 weights against 3.8x under bfloat16 autocast (batch 32, two threads;
docs/fast-inference.md), because autocast casts every weight again on every call. On a CPU
without those instructions bfloat16 is emulated and slower than float32, so the speed is
detected, never assumed: `fast_bfloat16` says which, and the commands warn where it is slow.
Images enter in float32 either way (PatchEmbed casts them to its weight's dtype); logits and
features leave as float32 (the commands convert them), so reports and files look the same.
"""

from __future__ import annotations

import torch

from .cli import MODEL_DTYPES


def fast_bfloat16(device: torch.device) -> bool:
    """Whether `device` multiplies bfloat16 matrices natively (faster than float32)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type != "cpu":
        return False
    return cpu_has_avx512_bf16() or cpu_has_amx()


def cpu_training_recipe() -> str:
    """The CPU recipe that suits this CPU's instruction sets (scripts/train.sh's choice, each
    measured in docs/cpu-recipe.md): "bfloat16" with AMX (6 blocks x 30 epochs fit the time),
    "bfloat16-avx512" with AVX512-BF16 alone (a bf16 step ~1.5-1.9x float32's but slower than
    with AMX: 4 blocks x 34 epochs), else "float32" (bfloat16 emulated there, slower)."""
    if cpu_has_amx():
        return "bfloat16"
    return "bfloat16-avx512" if cpu_has_avx512_bf16() else "float32"


def cpu_has_avx512_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 natively with AVX512-BF16 (AMD Zen 4, Intel Cooper
    Lake and later)."""
    return _cpu_probe("_is_avx512_bf16_supported")


def cpu_has_amx() -> bool:
    """Whether this CPU has AMX tiles (Intel Sapphire Rapids and later): where bfloat16 matrix
    products ran ~7x float32, enough to make bfloat16 training pay (docs/cpu-recipe.md)."""
    return _cpu_probe("_is_amx_tile_supported")


def _cpu_probe(name: str) -> bool:
    # private but long-standing torch probes of the CPU's instruction sets
    return bool(getattr(torch.cpu, name, lambda: False)())


def cast_for_inference(
    model: torch.nn.Module, model_dtype: str, device: torch.device
) -> str | None:
    """Cast `model` (already on `device`) to --model-dtype in place; returns a warning line
    where that dtype is slow on `device`, else None."""
    if model_dtype not in MODEL_DTYPES:
        raise ValueError(f"--model-dtype {model_dtype!r}: accepted: {', '.join(MODEL_DTYPES)}")
    if model_dtype == "float32":
        return None
    model.to(torch.bfloat16)
    if fast_bfloat16(device):
        return None
    where = "this CPU has neither AVX512-BF16 nor AMX" if device.type == "cpu" else str(device)
    return (
        f"--model-dtype bfloat16: {where}, so bfloat16 is emulated and slower than float32 "
        f"here; leave --model-dtype out for float32"
    )
