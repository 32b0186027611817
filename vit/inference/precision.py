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

import time

import torch

from .options import MODEL_DTYPES


def fast_bfloat16(device: torch.device) -> bool:
    """Whether `device` multiplies bfloat16 matrices natively (faster than float32)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type != "cpu":
        return False
    return cpu_has_avx512_bf16() or cpu_has_amx()


# bfloat16 over float32 matrix-product speed from which an AVX512-BF16 CPU takes the "fast"
# recipe: 4.4-4.9x measured on AMD Zen 5 hosts, 2.3x on Zen 4 ones, whose flags are the same
# (docs/cpu-recipe.md); the threshold lies between them.
FAST_BF16_SPEEDUP = 3.2


def cpu_training_recipe(bf16_speedup: float | None = None) -> str:
    """The CPU recipe that suits this CPU (scripts/train.sh's choice, each measured in
    docs/cpu-recipe.md): "bfloat16" with AMX (6 blocks x 30 epochs fit the time); with
    AVX512-BF16 alone, "bfloat16-avx512-fast" where bfloat16 products run at least
    FAST_BF16_SPEEDUP x float32's (Newton-Schulz in bfloat16 too, and 60 epochs fit), else
    "bfloat16-avx512" (34 epochs); "float32" elsewhere (bfloat16 emulated there, slower).
    `bf16_speedup`: `cpu_bf16_matmul_speedup()`'s figure, measured here if not given."""
    if cpu_has_amx():
        return "bfloat16"
    if not cpu_has_avx512_bf16():
        return "float32"
    if bf16_speedup is None:
        bf16_speedup = cpu_bf16_matmul_speedup()
    return "bfloat16-avx512-fast" if bf16_speedup >= FAST_BF16_SPEEDUP else "bfloat16-avx512"


def cpu_bf16_matmul_speedup(repeats: int = 5) -> float:
    """bfloat16 over float32 speed of one thread's matrix products at the CPU recipe's shape
    (the qkv product of 64 images x 65 tokens, (4160 x 128) @ (128 x 384)), from the best of
    `repeats` timings of each: ~0.3 s. Flags cannot tell apart hosts whose bfloat16 units differ
    (AMD Zen 4 and Zen 5 both show avx512_bf16); a timing can, and a load on the other cores
    slows both dtypes alike."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        generator = torch.Generator().manual_seed(0)
        a = torch.randn(4160, 128, generator=generator)
        b = torch.randn(128, 384, generator=generator)
        seconds = {}
        for dtype in (torch.float32, torch.bfloat16):
            x, y = a.to(dtype), b.to(dtype)
            torch.mm(x, y)  # the first call picks and packs the kernel
            best = float("inf")
            for _ in range(repeats):
                start = time.perf_counter()
                for _ in range(10):
                    torch.mm(x, y)
                best = min(best, time.perf_counter() - start)
            seconds[dtype] = best
        return seconds[torch.float32] / seconds[torch.bfloat16]
    finally:
        torch.set_num_threads(threads)


def cpu_has_avx512_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 natively with AVX512-BF16 (AMD Zen 4, Intel Cooper
    Lake and later)."""
    return _cpu_probe("_is_avx512_bf16_supported")


def cpu_has_amx() -> bool:
    """Whether this CPU has AMX tiles (Intel Sapphire Rapids and later): where bfloat16 matrix
    products ran ~7x float32, enough to make bfloat16 training pay (docs/cpu-experiments.md)."""
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


def autocast(device: torch.device, cfg_amp: bool, amp_dtype: str, cache: bool = True):
    """Mixed precision for training and evaluation (--amp, --amp-dtype); off when `cfg_amp` is
    False. `cache`: autocast's cache of the weights' casts, reused within the region."""
    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(amp_dtype)
    if dtype is None:
        raise ValueError(f"--amp-dtype must be 'bfloat16' or 'float16', got {amp_dtype!r}")
    return torch.autocast(device.type, dtype=dtype, enabled=cfg_amp, cache_enabled=cache)
