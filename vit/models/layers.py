"""Small parameter-light layers the model is built from: activations (`ACT_LAYERS`), LayerScale,
stochastic depth (`DropPath`) and `PatchDropout`. Each is timm's layer of the same name, in maths
and parameter names; `vit.models.vision_transformer` assembles them into blocks.

Shape legend: B batch, N tokens, D embed dim, L patch tokens.
"""

from __future__ import annotations

import torch
from torch import nn


class QuickGELU(nn.Module):
    """x * sigmoid(1.702 x): the GELU approximation OpenAI's CLIP was trained with."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(1.702 * x)


# act_layer names (timm's) -> activation modules; a checkpoint needs the one it was trained with
ACT_LAYERS = {
    "gelu": nn.GELU,  # exact (erf) GELU: ViT, DeiT, DINOv2, timm's CLIP and SigLIP
    "gelu_tanh": lambda: nn.GELU(approximate="tanh"),  # transformers' SigLIP
    "quick_gelu": QuickGELU,  # OpenAI CLIP
    "silu": nn.SiLU,  # the gate of DINOv2 ViT-g/14's SwiGLU MLP
}


class LayerScale(nn.Module):
    """A learned per-channel scale on a residual branch, starting small (DINOv2, DeiT III).

    Deep ViTs train more stably when each block starts close to the identity (Touvron et al.
    2021, "Going deeper with image transformers").
    """

    def __init__(self, dim: int, init_values: float) -> None:
        super().__init__()
        self.init_values = init_values
        self.gamma = nn.Parameter(torch.full((dim,), init_values))  # (D,)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma  # (B, N, D)


class DropPath(nn.Module):
    """Stochastic depth: in training, skip a residual branch for a random subset of samples.

    Kept samples are scaled by 1/keep_prob so the expected output is unchanged.
    """

    def __init__(self, drop_prob: float = 0.0) -> None:
        super().__init__()
        self.drop_prob = drop_prob

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.drop_prob == 0.0 or not self.training:
            return x
        keep_prob = 1.0 - self.drop_prob
        mask = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(keep_prob)  # (B, 1, 1)
        if keep_prob > 0.0:  # with drop_prob 1 every branch is dropped: nothing to rescale
            mask.div_(keep_prob)
        return x * mask

    def extra_repr(self) -> str:
        return f"drop_prob={self.drop_prob}"


class PatchDropout(nn.Module):
    """In training, keep a random subset of the patch tokens of each image (prefix tokens stay).

    Fewer tokens make every block cheaper, so more images fit in the same time (Liu et al.
    2023, "PatchDropout"). Evaluation always sees every token.
    """

    def __init__(self, prob: float, num_prefix_tokens: int) -> None:
        super().__init__()
        if not 0.0 <= prob < 1.0:
            raise ValueError(f"patch_drop_rate must be in [0, 1), got {prob}")
        self.prob = prob
        self.num_prefix_tokens = num_prefix_tokens

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.prob == 0.0:
            return x
        prefix, patches = x[:, : self.num_prefix_tokens], x[:, self.num_prefix_tokens :]
        B, L, D = patches.shape
        keep = max(1, int(L * (1.0 - self.prob)))
        # A random permutation per image; its first `keep` entries are the kept tokens.
        kept = torch.randn(B, L, device=x.device).argsort(dim=1)[:, :keep]  # (B, keep)
        patches = patches.gather(1, kept[:, :, None].expand(-1, -1, D))  # (B, keep, D)
        return torch.cat([prefix, patches], dim=1)  # (B, prefix + keep, D)

    def extra_repr(self) -> str:
        return f"prob={self.prob}"
