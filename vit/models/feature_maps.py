"""timm's `features_only` for a ViT: the outputs of chosen blocks as feature maps.

`vit.create_model(name, features_only=True, out_indices=...)` returns a `FeatureMaps`, as
timm's `create_model` returns its `FeatureGetterNet` for a ViT: the model is pruned after the
last block asked for (the final norm and the head go too), kept under `model` so the state
dict keys are timm's, and each call gives one (B, D, gh, gw) map per block, in block order.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from .vision_transformer import VisionTransformer


class FeatureInfo:
    """What each returned map is, as timm's `FeatureInfo`: channels, reduction (the patch
    size: input pixels per map cell), and the module that produced it."""

    def __init__(self, model: VisionTransformer, indices: list[int]) -> None:
        self.out_indices = tuple(indices)
        self.info = [model.feature_info[i] for i in indices]

    def channels(self) -> list[int]:
        return [info["num_chs"] for info in self.info]

    def reduction(self) -> list:
        return [info["reduction"] for info in self.info]

    def module_name(self) -> list[str]:
        return [info["module"] for info in self.info]

    def __getitem__(self, index: int) -> dict:
        return self.info[index]

    def __len__(self) -> int:
        return len(self.info)


class FeatureMaps(nn.Module):
    """A ViT that returns the outputs of blocks `out_indices` (the last n if an int, negative
    from the end) as feature maps, each (B, D, gh, gw), without the final norm (timm's
    default) unless `norm`."""

    def __init__(
        self, model: VisionTransformer, out_indices: int | Sequence[int] = 3, norm: bool = False
    ) -> None:
        super().__init__()
        self.out_indices = model.prune_intermediate_layers(out_indices, prune_norm=not norm)
        self.feature_info = FeatureInfo(model, self.out_indices)
        self.model = model
        self.norm = norm

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Images (B, C, H, W) -> one map (B, D, gh, gw) per selected block."""
        return self.model.forward_intermediates(
            x, indices=self.out_indices, norm=self.norm, intermediates_only=True
        )
