"""What a ViT looks at: attention maps of every family, and whether they are right.

The package, one job a module, each importing only modules listed before it:

* `vit.explain.rollout`: arithmetic on captured tensors, no model: head fusion, discarding the
  weakest links, the rollout, gradient-rollout and relevance matrices, read out as a patch map.
* `vit.explain.readout`: what a model's head reads: register tokens, readout rows, patch grid.
* `vit.explain.capture`: running a model with its attention recorded (and, for a class or a
  similarity, the gradient with respect to it).
* `vit.explain.maps`: the maps of a model, (B, gh, gw): `attention_rollout`,
  `gradient_rollout`, `relevance`; `last_block_attention` (one map per head); the heads' mean
  attention distance.
* `vit.explain.perturbation`: faithfulness, whether a map is right, by deleting patches.

Every public name is available here, e.g. `from vit.explain import attention_rollout`.
"""

from .capture import (
    AttentionRecord,
    Similarity,
    Target,
    capture_attention,
    embed,
    record_attention,
    similarity_scores,
)
from .maps import (
    METHODS,
    attention_rollout,
    gradient_rollout,
    last_block_attention,
    mean_attention_distance,
    model_attention_distance,
    relevance,
)
from .perturbation import (
    DEFAULT_FRACTIONS,
    Faithfulness,
    area_under_curve,
    faithfulness,
    perturbation_curve,
    random_map,
    remove_patches,
)
from .readout import grid_of, num_registers, readout_tokens
from .rollout import (
    HeadFusion,
    discard_lowest,
    drop_tokens,
    fuse_heads,
    gradient_rollout_matrix,
    patch_map,
    relevance_matrix,
    rollout_matrix,
)

__all__ = [
    "DEFAULT_FRACTIONS",
    "METHODS",
    "AttentionRecord",
    "Faithfulness",
    "HeadFusion",
    "Similarity",
    "Target",
    "area_under_curve",
    "attention_rollout",
    "capture_attention",
    "discard_lowest",
    "drop_tokens",
    "embed",
    "faithfulness",
    "fuse_heads",
    "gradient_rollout",
    "gradient_rollout_matrix",
    "grid_of",
    "last_block_attention",
    "mean_attention_distance",
    "model_attention_distance",
    "num_registers",
    "patch_map",
    "perturbation_curve",
    "random_map",
    "readout_tokens",
    "record_attention",
    "relevance",
    "relevance_matrix",
    "remove_patches",
    "rollout_matrix",
    "similarity_scores",
]
