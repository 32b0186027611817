"""vit: a Vision Transformer written from scratch, numerically identical to timm's."""

from .configs import Preprocess, list_models
from .factory import create_model, create_transform, load_model
from .model import Attention, Block, Mlp, PatchEmbed, VisionTransformer, ViTConfig
from .pos_embed import resample_abs_pos_embed
from .weights import LoadReport, load_weights, save_weights

__version__ = "0.1.0"

__all__ = [
    "Attention",
    "Block",
    "LoadReport",
    "Mlp",
    "PatchEmbed",
    "Preprocess",
    "ViTConfig",
    "VisionTransformer",
    "create_model",
    "create_transform",
    "list_models",
    "load_model",
    "load_weights",
    "resample_abs_pos_embed",
    "save_weights",
]
