"""OpenAI's CLIP and OpenCLIP checkpoints: the image tower under `visual.`.

    visual.class_embedding (D,)           -> cls_token (1, 1, D)
    visual.positional_embedding (N, D)    -> pos_embed (1, N, D)
    visual.conv1.weight (no bias)         -> patch_embed.proj.weight
    visual.ln_pre / ln_post               -> norm_pre / norm
    visual.transformer.resblocks.{i}.     -> blocks.{i}.  (ln_1, attn.in_proj_*, attn.out_proj,
                                             ls_1.gamma, ln_2, mlp.c_fc, mlp.c_proj, ls_2.gamma)
    visual.proj (D, E), x @ proj          -> head.weight (E, D) and a zero head.bias

`nn.MultiheadAttention` keeps q, k and v stacked in timm's order, so attention is renames only.
OpenCLIP models whose tower is a timm model (`visual.trunk.*`) already use timm's names, and
their `visual.head.proj` (weight, and bias if any) becomes `head`; an MLP projection head
(`visual.head.mlp.*`) or other image-tower tensors outside the trunk are refused. The
text tower is dropped. The keys do not say which activation the tower was trained with
(OpenAI's QuickGELU or OpenCLIP's GELU), nor its image size: the model name does (the
`_quickgelu` variants). LayerNorm eps is PyTorch's default, 1e-5.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

import torch

from .keymap import KeyMap
from .refused import SUPPORTED

BLOCK = "visual.transformer.resblocks.{i}."
KEYS = KeyMap(
    [
        ("visual.class_embedding", "cls_token"),
        ("visual.positional_embedding", "pos_embed"),
        ("visual.conv1.", "patch_embed.proj."),
        ("visual.ln_pre.", "norm_pre."),
        (BLOCK + "ln_1.", "blocks.{i}.norm1."),
        (BLOCK + "attn.in_proj_weight", "blocks.{i}.attn.qkv.weight"),
        (BLOCK + "attn.in_proj_bias", "blocks.{i}.attn.qkv.bias"),
        (BLOCK + "attn.out_proj.", "blocks.{i}.attn.proj."),
        (BLOCK + "ls_1.gamma", "blocks.{i}.ls1.gamma"),
        (BLOCK + "ln_2.", "blocks.{i}.norm2."),
        (BLOCK + "mlp.c_fc.", "blocks.{i}.mlp.fc1."),
        (BLOCK + "mlp.c_proj.", "blocks.{i}.mlp.fc2."),
        (BLOCK + "ls_2.gamma", "blocks.{i}.ls2.gamma"),
        ("visual.ln_post.", "norm."),
    ]
)
TRUNK = "visual.trunk."


def matches(keys: Collection[str]) -> bool:
    return any(
        key in ("visual.class_embedding", "visual.conv1.weight") or key.startswith(TRUNK)
        for key in keys
    )


def to_timm(state: Mapping[str, torch.Tensor], source: str) -> tuple[dict, list[str]]:
    """OpenAI / OpenCLIP names -> timm's (projection -> head, zero bias)."""
    notes = []
    outside = [key for key in state if not key.startswith("visual.")]
    if outside:
        notes.append(
            f"{source}: ignored {len(outside)} tensors outside the image tower visual.* (the "
            f"text tower: {outside[0]}, ...)"
        )
    if any(key.startswith(TRUNK) for key in state):  # a timm model inside OpenCLIP
        out = {k.removeprefix(TRUNK): v for k, v in state.items() if k.startswith(TRUNK)}
        # OpenCLIP's TimmModel head: a Linear `proj` (with a bias when proj_bias=True), or an
        # MLP projection (head.mlp.*) that our single Linear head cannot hold: refused below
        head = {"visual.head.proj.weight", "visual.head.proj.bias"}
        unknown = [k for k in state if k.startswith("visual.") and not k.startswith(TRUNK)]
        unknown = [k for k in unknown if k not in head]
        if unknown:
            raise ValueError(
                f"{source} has image-tower tensors outside its timm trunk that a ViT with one "
                f"linear head cannot hold ({unknown[:8]}; e.g. an MLP projection head): "
                f"supported: {SUPPORTED}"
            )
        if "visual.head.proj.weight" in state:
            out["head.weight"] = state["visual.head.proj.weight"]
            bias = state.get("visual.head.proj.bias")  # proj_bias=False: none, i.e. zero
            out["head.bias"] = torch.zeros(out["head.weight"].shape[0]) if bias is None else bias
        return out, notes
    out, unknown = {}, []
    for key, value in state.items():
        if key == "visual.proj":
            out["head.weight"] = value.T  # used as x @ proj: (D, E) -> Linear's (E, D)
            out["head.bias"] = torch.zeros(value.shape[1])
        elif KEYS.to_timm(key):
            out[KEYS.to_timm(key)] = value
        elif key.startswith("visual."):
            unknown.append(key)
    if unknown:
        raise ValueError(
            f"{source} has image-tower tensors a CLIP ViT does not ({unknown[:8]}; e.g. "
            f"CoCa's attentional pooler): another architecture; supported: {SUPPORTED}"
        )
    out["cls_token"] = out["cls_token"].reshape(1, 1, -1)
    out["pos_embed"] = out["pos_embed"].unsqueeze(0)
    return out, notes
