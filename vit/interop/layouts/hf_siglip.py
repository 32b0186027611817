"""transformers' SigLIP image tower: `SiglipVisionModel` and the vision half of `SiglipModel`.

CLIP's encoder layers without a class token: the position embeddings cover the patches only,
tanh-approximated GELU, LayerNorm eps 1e-6, and the pooled output comes from an attention-pool
head (a learned probe attending over the normed tokens, then a residual MLP), timm's
`global_pool="map"`. Its `nn.MultiheadAttention` keeps q, k and v stacked in `in_proj_weight`;
timm's pool has a `q` Linear for the probe and a `kv` Linear for the tokens, so the stack is
split after its first third. Without the head (`vision_use_head=False`) nothing is pooled and
`model(x)` is last_hidden_state. The text tower is dropped.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping

import torch

from . import hf_clip
from . import hf_common as hf
from .keymap import KeyMap
from .refused import SUPPORTED

PAIRS = [
    ("embeddings.patch_embedding.", "patch_embed.proj."),
    ("embeddings.position_embedding.weight", "pos_embed"),
    *hf_clip.BLOCK_PAIRS,
    ("post_layernorm.", "norm."),
    ("head.probe", "attn_pool.latent"),
    ("head.attention.out_proj.", "attn_pool.proj."),
    ("head.layernorm.", "attn_pool.norm."),
    ("head.mlp.fc1.", "attn_pool.mlp.fc1."),
    ("head.mlp.fc2.", "attn_pool.mlp.fc2."),
]
IN_PROJ = "head.attention.in_proj_"  # + weight (3*D, D) / bias (3*D,)
IN_PROJ_OURS = "attn_pool.in_proj."  # the same stack, only while writing
# transformers' SiglipVisionConfig defaults
DEFAULTS = {**hf.DEFAULTS, "hidden_act": "gelu_pytorch_tanh", "layer_norm_eps": 1e-6}
ARCHITECTURES = ("SiglipVisionModel", "SiglipModel")


def default_processor(img_size: tuple[int, int]) -> dict:
    """The preprocessing of a folder saved without preprocessor_config.json:
    SiglipImageProcessor's defaults (both sides resized, bicubic, mean and std 0.5) at
    config.json's image_size, as the published processors are; not ViTImageProcessor's
    bilinear resize."""
    return {
        "size": {"height": img_size[0], "width": img_size[1]},
        "resample": 3,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
    }


def matches(keys: Collection[str]) -> bool:
    return any(key.endswith(hf_clip.PATCH_KEY) for key in keys) and not hf_clip.matches(keys)


def to_timm(state: Mapping[str, torch.Tensor], source: str) -> tuple[dict, list[str]]:
    """transformers' SigLIP image tower -> timm's names (attention-pool head -> attn_pool)."""
    prefix, state, notes = hf_clip.tower(state, source)
    in_proj = {kind: state.pop(prefix + IN_PROJ + kind, None) for kind in ("weight", "bias")}
    keys = KeyMap(hf.prefixed(prefix, PAIRS))
    ignored = {prefix + name: note for name, note in hf_clip.IGNORED.items()}
    qkv = re.escape(prefix) + hf_clip.QKV_BODY
    out, more = hf.convert(state, source, "SigLIP image tower", keys, qkv, ignored)
    hf_clip.vector_shapes(out)
    for kind, value in in_proj.items():
        if value is not None:
            dim = value.shape[0] // 3
            out[f"attn_pool.q.{kind}"] = value[:dim]  # the probe's query projection
            out[f"attn_pool.kv.{kind}"] = value[dim:]  # keys, then values, as timm's kv
    return out, notes + more


def config_from_hf(hf_config: dict, source: str) -> tuple[dict, None]:
    """A transformers SigLIP `config.json` -> our `ViTConfig` arguments (a headless tower:
    num_classes=0, model(x) is the attention-pooled embedding, pooler_output)."""
    vision, architectures = hf_clip.vision_config(hf_config, source)
    other = [a for a in architectures if a not in ARCHITECTURES]
    if other:
        raise ValueError(f"{source} holds a {other[0]}; supported: {SUPPORTED}")
    config = dict(
        hf.backbone_config(vision, source, DEFAULTS),
        num_classes=0,
        class_token=False,
        global_pool="map" if vision.get("vision_use_head", True) else "",
    )
    return config, None


def write_state(state: Mapping[str, torch.Tensor], hf_class: str) -> dict[str, torch.Tensor]:
    """timm names -> SiglipVisionModel's: the attention pool's `q` and `kv` stacked again into
    `nn.MultiheadAttention`'s in_proj."""
    state = dict(state)
    for kind in ("weight", "bias"):
        if f"attn_pool.q.{kind}" in state:
            parts = [state.pop(f"attn_pool.q.{kind}"), state.pop(f"attn_pool.kv.{kind}")]
            state[IN_PROJ_OURS + kind] = torch.cat(parts)  # q, then k and v
    in_proj = [(IN_PROJ + kind, IN_PROJ_OURS + kind) for kind in ("weight", "bias")]
    return hf_clip.write_tower(state, KeyMap([*PAIRS, *in_proj]), "", hf_class)


def write_config(config, hf_class: str, class_names: list[str] | None) -> dict:
    """Our SigLIP config -> SiglipVisionModel's `config.json` (vision_use_head: the pool)."""
    why = "transformers' SigLIP pools with an attention-pool head, or not at all"
    pool = config.global_pool if config.global_pool in ("map", "") else "map"
    hf.check_switches(config, "SigLIP", why, class_token=False, global_pool=pool)
    if not config.qkv_bias:
        raise ValueError("transformers' SigLIP cannot hold this model: it has qkv_bias=False")
    out = {"architectures": [hf_class], "model_type": "siglip_vision_model"}
    out.update(hf.backbone_to_hf(config), attention_dropout=0.0)
    return out | {"vision_use_head": config.global_pool == "map"}
