"""vit: a Vision Transformer written from scratch, numerically identical to timm's.

`import vit` is lazy: each public name (and each submodule, `vit.weights`, `vit.io`, ...) is
imported the first time it is used, so that `import vit` and a command's `--help` do not pay
for torch, torchvision and albumentations before they are needed.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

# Public name -> the submodule that defines it. A new public name is one line here.
_EXPORTS = {
    "Attention": "model",
    "Block": "model",
    "LoadReport": "weights",
    "Mlp": "model",
    "PatchEmbed": "model",
    "Preprocess": "configs",
    "ViTConfig": "model",
    "VisionTransformer": "model",
    "create_model": "factory",
    "create_transform": "factory",
    "list_models": "configs",
    "load_model": "factory",
    "load_weights": "weights",
    "resample_abs_pos_embed": "pos_embed",
    "resolve_model_data_config": "configs",
    "resolve_model": "factory",
    "save_weights": "weights",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    """Import a public name's module on first use (PEP 562); `vit.io` & co as submodules."""
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
    from .configs import Preprocess, list_models, resolve_model_data_config  # noqa: F401
    from .factory import create_model, create_transform, load_model, resolve_model  # noqa: F401
    from .model import Attention, Block, Mlp, PatchEmbed, VisionTransformer, ViTConfig  # noqa: F401
    from .pos_embed import resample_abs_pos_embed  # noqa: F401
    from .weights import LoadReport, load_weights, save_weights  # noqa: F401
