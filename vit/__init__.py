"""vit: a Vision Transformer written from scratch, numerically identical to timm's.

`import vit` is lazy: each public name (and each subpackage, `vit.models`, `vit.utils`, ...) is
imported the first time it is used, so that `import vit` and a command's `--help` do not pay
for torch, torchvision and albumentations before they are needed.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

# Public name -> the submodule that defines it. A new public name is one line here.
_EXPORTS = {
    "Attention": "models.vision_transformer",
    "Block": "models.vision_transformer",
    "LoadReport": "interop.weights",
    "Mlp": "models.vision_transformer",
    "PatchEmbed": "models.vision_transformer",
    "Preprocess": "models.registry",
    "ViTConfig": "models.vision_transformer",
    "VisionTransformer": "models.vision_transformer",
    "create_model": "factory.create",
    "create_transform": "data.transforms_factory",
    "list_models": "models.registry",
    "load_model": "factory.create",
    "load_weights": "interop.weights",
    "resample_abs_pos_embed": "models.pos_embed",
    "resolve_model_data_config": "models.registry",
    "resolve_model": "cli.model_argument",
    "save_weights": "interop.weights",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    """Import a public name's module on first use (PEP 562); `vit.utils.files` & co as
    submodules."""
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    elif not name.startswith("_"):
        try:
            value = importlib.import_module(f".{name}", __name__)
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":  # the submodule exists but its import failed
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


if TYPE_CHECKING:  # static tools (type checkers, IDEs) see the names directly
    from .cli.model_argument import resolve_model  # noqa: F401
    from .data.transforms_factory import create_transform  # noqa: F401
    from .factory.create import create_model, load_model  # noqa: F401
    from .interop.weights import LoadReport, load_weights, save_weights  # noqa: F401
    from .models.pos_embed import resample_abs_pos_embed  # noqa: F401
    from .models.registry import Preprocess, list_models, resolve_model_data_config  # noqa: F401
    from .models.vision_transformer import (  # noqa: F401
        Attention,
        Block,
        Mlp,
        PatchEmbed,
        VisionTransformer,
        ViTConfig,
    )
