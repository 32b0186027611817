"""ViT relatives this package cannot express, recognised so that they fail in one clear line.

EVA / EVA-02, DINOv3 and AIMv2 look like ViTs (patch embedding, blocks, class token) and a key
map could rename most of their tensors, but they compute something else: rotary position
encoding (RoPE) inside attention, RMSNorm, SwiGLU MLPs, separate q and v biases. Loading them
into a plain ViT would run without error and give wrong features, so they are named and refused
before any layout is tried.
"""

from __future__ import annotations

import re
from collections.abc import Collection

SUPPORTED = (
    "plain ViT (timm; transformers ViTModel, ViTForImageClassification, ViTMAEModel, "
    "ViTMAEForPreTraining; torchvision vit_*; Google .npz), "
    "DINOv2 (transformers Dinov2Model, Dinov2WithRegistersModel; facebookresearch/dinov2), "
    "CLIP (transformers CLIPVisionModel, CLIPVisionModelWithProjection, CLIPModel; OpenAI and "
    "OpenCLIP visual.*), "
    "SigLIP (transformers SiglipVisionModel, SiglipModel), "
    "DeiT distilled (transformers DeiTForImageClassificationWithTeacher)"
)

# family: (what it computes that a ViT does not, a test on its key names)
FAMILIES: dict[str, tuple[str, re.Pattern]] = {
    "EVA-02": (
        "rotary position encoding (RoPE) and a SwiGLU MLP",
        re.compile(r"(^|\.)rope\.|\.mlp\.(fc1_g|w1|ffn_ln)\."),
    ),
    "EVA / EVA-02 / BEiT": (
        "separate q and v biases without a k bias, and (BEiT) relative position biases",
        re.compile(r"\.attn\.[qv]_bias$|relative_position_bias_table"),
    ),
    "DINOv3": (
        "rotary position encoding (RoPE) and storage (register) tokens",
        re.compile(r"^storage_tokens$|rope_embed|^model\.layer\.\d+\.layer_scale1\."),
    ),
    "AIMv2": (
        "RMSNorm and a SwiGLU MLP",
        re.compile(r"^preprocessor\.patchifier\.|(^|\.)rms_norm\d?\.|\.ffn\.gate_proj\."),
    ),
}
# transformers config.json model_type -> family
MODEL_TYPES = {
    "dinov3_vit": "DINOv3",
    "aimv2": "AIMv2",
    "aimv2_vision_model": "AIMv2",
    "siglip2": "SigLIP 2",
    "siglip2_vision_model": "SigLIP 2",
    "beit": "EVA / EVA-02 / BEiT",
    "data2vec-vision": "EVA / EVA-02 / BEiT",
}
WHY = {
    **{family: why for family, (why, _) in FAMILIES.items()},
    "SigLIP 2": "NaFlex variable-resolution patches with resampled position embeddings per image",
}


def refusal(family: str, source: str) -> ValueError:
    return ValueError(
        f"{source} is a {family} checkpoint ({WHY[family]}), which this package's ViT does not "
        f"compute; supported: {SUPPORTED}"
    )


def check_keys(keys: Collection[str], source: str) -> None:
    """Raise a ValueError naming the family if these keys are one this package cannot express."""
    for family, (_, pattern) in FAMILIES.items():
        if any(pattern.search(key) for key in keys):
            raise refusal(family, source)


def check_model_type(model_type: str | None, source: str) -> None:
    """Raise a ValueError naming the family of a refused transformers `model_type`."""
    if model_type in MODEL_TYPES:
        raise refusal(MODEL_TYPES[model_type], source)
