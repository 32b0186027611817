"""Google's original JAX ViT checkpoints (`.npz`): vit_jax / augreg and big_vision layouts.

big_vision's MAP head (`MAPHead_0/`, SigLIP's attention-pool readout) becomes timm's
`attn_pool.*` (a model built with global_pool="map"); a ViT-21k `pre_logits` layer is refused.

Flax stores Dense kernels as (in, out) and attention kernels per head: query/key/value
(D, nh, hs) and out (nh, hs, D). PyTorch's Linear wants (out, in), and timm's attention has one
fused qkv Linear, so q, k and v are flattened and stacked along the output axis.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping

import numpy as np
import torch

PREFIXES = ("", "opt/target/", "params/", "params/img/")


def matches(keys: Collection[str]) -> bool:
    return any(f"{prefix}embedding/kernel" in keys for prefix in PREFIXES)


def to_timm(state: Mapping, source: str) -> tuple[dict, list[str]]:
    return convert_jax_checkpoint(state, source=source), []


def convert_jax_checkpoint(arrays: Mapping[str, np.ndarray], source: str = "npz") -> dict:
    """Google's ViT `.npz` arrays (vit_jax / augreg, or big_vision) -> a timm-named state dict.

    `arrays` maps the archive's names to numpy arrays (or CPU tensors of the same layout)."""
    prefix = next((p for p in PREFIXES if f"{p}embedding/kernel" in arrays), None)
    if prefix is None:
        raise ValueError(f"{source} is not a ViT JAX checkpoint: it has no 'embedding/kernel'")

    def get(name: str) -> torch.Tensor:
        try:
            value = arrays[prefix + name]
            if isinstance(value, torch.Tensor):
                return value.detach().float()
            return torch.from_numpy(np.asarray(value, dtype=np.float32))
        except KeyError:
            raise KeyError(f"{source} lacks the array {prefix + name!r}") from None

    def has(name: str) -> bool:
        return prefix + name in arrays

    def dense(name: str) -> tuple[torch.Tensor, torch.Tensor]:
        return get(f"{name}/kernel").T, get(f"{name}/bias")  # (in, out) -> (out, in)

    def norm(name: str) -> tuple[torch.Tensor, torch.Tensor]:
        return get(f"{name}/scale"), get(f"{name}/bias")

    if has("pre_logits/kernel"):
        # the head reads tanh(pre_logits(x)): kept alone on the raw features it gives other
        # predictions; refused as the torchvision layout refuses its heads.pre_logits
        raise ValueError(
            f"{source} is a ViT with a representation layer ({prefix}pre_logits, a ViT-21k "
            f"tanh layer before the head): not supported, our ViT has no representation layer"
        )

    # big_vision names sub-layers from 0 and keeps pos_embedding at the top level
    big_vision = has("pos_embedding") or prefix.startswith("params/")
    attn_i, ln2_i, mlp_i = (0, 1, 0) if big_vision else (1, 2, 3)
    sd: dict[str, torch.Tensor] = {}
    sd["patch_embed.proj.weight"] = get("embedding/kernel").permute(3, 2, 0, 1)  # HWIO -> OIHW
    sd["patch_embed.proj.bias"] = get("embedding/bias")
    if has("cls"):
        sd["cls_token"] = get("cls")  # (1, 1, D)
    pos = get("pos_embedding" if big_vision else "Transformer/posembed_input/pos_embedding")
    sd["pos_embed"] = pos.reshape(1, -1, pos.shape[-1])  # (1, N, D)
    sd["norm.weight"], sd["norm.bias"] = norm("Transformer/encoder_norm")
    if has("head/kernel"):
        sd["head.weight"], sd["head.bias"] = dense("head")

    if has("MAPHead_0/probe"):  # big_vision's attention-pool readout -> timm's attn_pool
        sd.update(attention_pool(get, dense, norm))

    # count encoder blocks by name: a MAP head (MAPHead_0/) has LayerNorms and an MlpBlock too
    block = re.compile(re.escape(prefix) + r"Transformer/encoderblock_(\d+)/")
    depth = len({m.group(1) for m in map(block.match, arrays) if m})
    for i in range(depth):
        src, dst = f"Transformer/encoderblock_{i}/", f"blocks.{i}."
        mha = f"{src}MultiHeadDotProductAttention_{attn_i}/"
        sd[dst + "norm1.weight"], sd[dst + "norm1.bias"] = norm(src + "LayerNorm_0")
        q, k, v = (get(f"{mha}{n}/kernel").flatten(1).T for n in ("query", "key", "value"))
        sd[dst + "attn.qkv.weight"] = torch.cat([q, k, v])  # (3*D, D)
        sd[dst + "attn.qkv.bias"] = torch.cat(
            [get(f"{mha}{n}/bias").flatten() for n in ("query", "key", "value")]
        )  # (3*D,)
        sd[dst + "attn.proj.weight"] = get(f"{mha}out/kernel").flatten(0, 1).T  # (D, D)
        sd[dst + "attn.proj.bias"] = get(f"{mha}out/bias")
        sd[dst + "norm2.weight"], sd[dst + "norm2.bias"] = norm(f"{src}LayerNorm_{ln2_i}")
        mlp = f"{src}MlpBlock_{mlp_i}/"
        sd[dst + "mlp.fc1.weight"], sd[dst + "mlp.fc1.bias"] = dense(mlp + "Dense_0")
        sd[dst + "mlp.fc2.weight"], sd[dst + "mlp.fc2.bias"] = dense(mlp + "Dense_1")
    return sd


def attention_pool(get, dense, norm) -> dict[str, torch.Tensor]:
    """big_vision's MAPHead_0 (through `convert_jax_checkpoint`'s readers) -> timm's attn_pool:
    the probe is the latent query, key and value stack into one kv Linear."""
    head, mha = "MAPHead_0/", "MAPHead_0/MultiHeadDotProductAttention_0/"
    sd = {"attn_pool.latent": get(head + "probe")}  # (1, 1, D)
    sd["attn_pool.q.weight"] = get(f"{mha}query/kernel").flatten(1).T  # (D, nh, hs) -> (D, D)
    sd["attn_pool.q.bias"] = get(f"{mha}query/bias").flatten()
    key_value = ("key", "value")
    sd["attn_pool.kv.weight"] = torch.cat([get(f"{mha}{n}/kernel").flatten(1).T for n in key_value])
    sd["attn_pool.kv.bias"] = torch.cat([get(f"{mha}{n}/bias").flatten() for n in key_value])
    sd["attn_pool.proj.weight"] = get(f"{mha}out/kernel").flatten(0, 1).T  # (nh, hs, D)
    sd["attn_pool.proj.bias"] = get(f"{mha}out/bias")
    sd["attn_pool.norm.weight"], sd["attn_pool.norm.bias"] = norm(head + "LayerNorm_0")
    for i, fc in enumerate(("fc1", "fc2")):
        weight, bias = dense(f"{head}MlpBlock_0/Dense_{i}")
        sd[f"attn_pool.mlp.{fc}.weight"], sd[f"attn_pool.mlp.{fc}.bias"] = weight, bias
    return sd
