"""The attention figures' former home, kept so that existing imports keep working: every figure
now lives in `vit.plots` (import from there)."""

from .plots import (  # noqa: F401
    denormalize,
    draw_overlay,
    heatmap_for_display,
    overlay,
    plot_attention_distance,
    plot_attention_grid,
    plot_explanations,
)
