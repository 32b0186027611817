"""The choices inference offers, listed without torch so that a command's --help shows them."""

TTA_CHOICES = (
    "none",
    "flip",
    "shift",
    "flip-shift",
)  # --tta of evaluate.py and predict (vit.inference.tta)
MODEL_DTYPES = ("float32", "bfloat16")  # --model-dtype (vit.inference.precision does the work)
KNN_KS = (
    10,
    20,
    100,
    200,
)  # --knn-k's default, DINO's and DINOv2's (vit.inference.probe does the work)
