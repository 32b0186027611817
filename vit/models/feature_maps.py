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
    size: input pixels per map cell), and the module that produced it. As timm's, it holds
    an entry for every block of the model before pruning: an accessor without `idx` answers
    for `out_indices`, with an int or a list for those blocks (`info[i]` and `len(info)` count
    every block)."""

    def __init__(self, info: list[dict], indices: list[int]) -> None:
        self.out_indices = tuple(indices)
        self.info = info  # one dict per block

    def _select(self, entry, idx: int | Sequence[int] | None):
        """`entry(i)` of each returned map (idx None), of block idx (an int), or of blocks idx."""
        if idx is None:
            return [entry(i) for i in self.out_indices]
        if isinstance(idx, (tuple, list)):
            return [entry(i) for i in idx]
        return entry(idx)

    def get(self, key: str, idx: int | Sequence[int] | None = None):
        """`key` of each returned map (idx None), of block idx (an int), or of blocks idx."""
        return self._select(lambda i: self.info[i][key], idx)

    def get_dicts(self, keys: Sequence[str] | None = None, idx=None):
        """The entries (only `keys` of each, where given), chosen by `idx` as in `get`."""
        return self._select(
            lambda i: self.info[i] if keys is None else {key: self.info[i][key] for key in keys},
            idx,
        )

    def channels(self, idx=None):
        return self.get("num_chs", idx)

    def reduction(self, idx=None):
        return self.get("reduction", idx)

    def module_name(self, idx=None):
        return self.get("module", idx)

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
        every_block = model.feature_info  # before pruning, as timm's
        self.out_indices = model.prune_intermediate_layers(out_indices, prune_norm=not norm)
        self.feature_info = FeatureInfo(every_block, self.out_indices)
        self.model = model
        self.norm = norm

    # timm's FeatureGetterNet carries its model's pretrained_cfg, which its data helpers read
    # (without it they fall back to ImageNet's statistics at 224 px, silently)
    @property
    def pretrained_cfg(self) -> dict:
        return self.model.pretrained_cfg

    @property
    def default_cfg(self) -> dict:
        return self.model.pretrained_cfg

    @property
    def preprocess(self):
        """The wrapped model's `vit.Preprocess`: how images are prepared for it."""
        return self.model.preprocess

    @preprocess.setter
    def preprocess(self, value) -> None:
        self.model.preprocess = value

    @property
    def config(self):
        """The wrapped model's `ViTConfig` (its blocks after the last map pruned)."""
        return self.model.config

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Images (B, C, H, W) -> one map (B, D, gh, gw) per selected block."""
        return self.model.forward_intermediates(
            x, indices=self.out_indices, norm=self.norm, intermediates_only=True
        )
