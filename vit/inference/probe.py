"""Scoring a backbone's frozen features: weighted kNN (DINO, DINOv2) and a linear probe (CLIP).

    features, labels = dataset_features(model, dataset, cache_path)  # (N, D) float32, (N,) int64
    knn = knn_accuracy(train_x, train_y, test_x, test_y, ks=(10, 20, 100, 200))
    probe = linear_probe(train_x, train_y, test_x, test_y, seed=0)

kNN, as DINO's `eval_knn.py` and DINOv2's `dinov2/eval/knn.py` evaluate (Caron et al. 2021,
Wu et al. 2018): features L2-normalised, cosine similarity to every training image, the k most
similar vote for their class with weight exp(similarity / T), T = 0.07; the class with the
largest vote is the prediction (ties: the lower class index). Test images are taken in blocks
whose similarity matrix (block, N_train) and votes (block, k, classes) stay under a fixed
number of elements, so memory is bounded for any number of training images. k larger than
the training set is refused, as both sources refuse it (their `topk` fails).

Linear probe, the CLIP protocol (Radford et al. 2021, appendix A.3): multinomial logistic
regression on the raw frozen features (CLIP standardises nothing), L2 penalty λ/2 ||W||² on the
summed cross-entropy (scikit-learn's convention, C = 1/λ; the bias is not penalised), fitted by
full-batch L-BFGS with a strong-Wolfe line search (`torch.optim.LBFGS`, at most 1,000
iterations as CLIP's scikit-learn fit). λ is chosen on a class-stratified, seeded held-out part
of the training split by CLIP's parametric binary search: λ = 1e-6, 1e-4, ..., 1e6, then the
interval around the best value halved until 8 steps per decade; the probe is then refitted on
the whole training split with that λ and scored on the test split.

Everything here is deterministic for a seed (zero-initialised weights, no sampling besides the
seeded split).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F

from ..utils.files import atomic_write
from ..utils.process_group import barrier
from .embed import extract_features as embed_items
from .embed import model_digest, read_features
from .options import KNN_KS

if TYPE_CHECKING:
    from ..data.datasets import ImageDataset
    from ..models.vision_transformer import VisionTransformer

log = logging.getLogger(__name__)

KNN_LEAD_K = 20  # the figure reports lead with
KNN_TEMPERATURE = 0.07
# At most this many similarities (test block x training images), and votes (test block x k x
# classes), at once: 256 MB of float32, e.g. 64 test images against 1M training images.
SIMILARITY_BUDGET = 1 << 26

HELDOUT_FRACTION = 0.2
SEARCH_START = (-6.0, -4.0, -2.0, 0.0, 2.0, 4.0, 6.0)  # log10 λ, CLIP's starting points
SEARCH_STEPS_PER_DECADE = 8
MAX_ITER = 1000
# Stop when no gradient entry of the mean loss exceeds this: scikit-learn's default `tol`.
GRADIENT_TOLERANCE = 1e-4


# -- features ------------------------------------------------------------------------------------
def dataset_digest(dataset: ImageDataset) -> str:
    """A hash of a dataset's images (files: paths, sizes, modification times; arrays: bytes),
    labels and transform."""
    from ..data.datasets import files_digest

    digest = hashlib.sha256()
    if dataset.paths is not None:
        digest.update(files_digest(dataset.paths).encode())
    else:
        for image in dataset.images:
            digest.update(np.ascontiguousarray(image).tobytes())
    digest.update(np.ascontiguousarray(dataset.labels).tobytes())
    digest.update(transform_identity(dataset.transform).encode())
    return digest.hexdigest()[:32]


def transform_identity(transform: object) -> str:
    """What a dataset's transform does, as text: the preprocessing of an `EvalTransform`,
    else its repr (an object without one names its address, so its features are never
    reused: the safe side)."""
    preprocess = getattr(transform, "preprocess", None)
    if hasattr(preprocess, "to_dict"):
        return f"{type(transform).__name__} {json.dumps(preprocess.to_dict(), sort_keys=True)}"
    return repr(transform)


def read_cached_features(cache_path: Path, identity: dict) -> tuple[np.ndarray, np.ndarray] | None:
    """The (features, labels) stored at `cache_path` if it was written for `identity`."""
    if not cache_path.is_file():
        return None
    try:
        with np.load(cache_path, allow_pickle=False) as stored:
            if json.loads(str(stored["identity"])) != identity:
                return None
            return stored["features"], stored["labels"]
    except (OSError, ValueError, KeyError):  # unreadable or not ours: extract again
        return None


def is_feature_cache(path: Path) -> bool:
    """Whether `path` is a cache `dataset_features` wrote (its features, labels and identity),
    whatever model or data it was for: a file of that name that is not one is someone else's."""
    try:
        with np.load(path, allow_pickle=False) as stored:
            identity = json.loads(str(stored["identity"]))
            return {"features", "labels"} <= set(stored.files) and "model" in identity
    except (OSError, ValueError, KeyError, TypeError):
        return False


def extract_features(
    model: VisionTransformer,
    dataset: ImageDataset,
    work_path: Path,
    *,
    embedding: str = "pooled",
    batch_size: int = 256,
    workers: int = 0,
    device: torch.device | str = "cpu",
    amp: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """The embedding (`vit.inference.embed.EMBEDDINGS`, the pooled pre-logits one by default) of
    every image of `dataset` (prepared by its own transform), in its order: features (N, D) float32
    and labels (N,) int64. Extracted by the resumable engine `vit.inference.embed.extract_features`:
    its shards are kept beside `work_path` as they are done, so a killed extraction continues
    where it stopped when run again; memory does not grow with N beyond the result."""
    from .precision import autocast

    if len(dataset) == 0:
        raise ValueError("no images to extract features from")
    # A finished work file is an earlier job's whose cache was never written: not resumable work.
    work_path.unlink(missing_ok=True)
    device = torch.device(device)
    with autocast(device, amp, "bfloat16"):
        result = embed_items(
            model,
            keys=[str(i) for i in range(len(dataset))],
            load=lambda i: dataset[i][0],  # a prepared (3, H, W) tensor
            out=work_path,
            embedding=embedding,
            batch_size=batch_size,
            workers=max(1, workers),
            device=device,
        )
    if result.errors:
        index, reason = result.errors[0]
        raise ValueError(
            f"{len(result.errors)} image(s) could not be read (listed in {result.errors_path}); "
            f"the first, image {index}: {reason}"
        )
    _, features = read_features(work_path)
    # Under a process group every process reads the one file rank 0 assembled: the first to
    # have read it removed it from under the others.
    barrier()
    if result.path is not None:  # rank 0's (or the only process's) result names the file
        work_path.unlink()
    if not np.isfinite(features).all():
        raise ValueError(
            "the model's features hold NaN or infinite values: its weights cannot be scored "
            "by kNN or a linear probe"
        )
    return features, dataset.labels.astype(np.int64)


def extraction_path(cache_path: Path) -> Path:
    """Where `dataset_features` extracts the features it then stores at `cache_path` (its
    shards beside it, so that a killed extraction continues): FEATURES.extracting.npz."""
    return cache_path.with_name(f"{cache_path.stem}.extracting.npz")


def dataset_features(
    model: VisionTransformer,
    dataset: ImageDataset,
    cache_path: Path,
    *,
    identity: dict | None = None,
    batch_size: int = 256,
    workers: int = 0,
    device: torch.device | str = "cpu",
    amp: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Features (N, D) float32 and labels (N,) int64 of `dataset`'s images by `model`, read
    from `cache_path` (.npz) when it holds them for the same model, data and settings, else
    extracted (see `extract_features`) and stored there atomically.

    identity: what else names the features (e.g. the embedding); the model's and the
    dataset's digests and `amp` are always part of it. The cache keeps `features`, `labels` and
    `identity` (a JSON string): `np.load(cache_path)` reads it without pickle."""
    identity = {
        **(identity or {}),
        "model": model_digest(model),
        "data": dataset_digest(dataset),
        "images": len(dataset),
        "amp": amp,
    }
    cached = read_cached_features(cache_path, identity)
    if cached is not None:
        log.info("features: reusing %s (%d images)", cache_path, len(cached[1]))
        return cached
    if cache_path.exists():
        log.info("features: %s was made for another model or data; extracting anew", cache_path)
    features, labels = extract_features(
        model,
        dataset,
        extraction_path(cache_path),
        embedding=identity.get("embedding", "pooled"),
        batch_size=batch_size,
        workers=workers,
        device=device,
        amp=amp,
    )

    def save(tmp: Path) -> None:
        with open(tmp, "wb") as f:  # a file object: np.savez would append .npz to a name
            np.savez(f, features=features, labels=labels, identity=json.dumps(identity))

    atomic_write(cache_path, save)
    return features, labels


# -- kNN -----------------------------------------------------------------------------------------
def check_ks(ks: Sequence[int], num_train: int) -> None:
    """Raise ValueError unless every k is in 1..num_train."""
    bad = [k for k in ks if not 1 <= k <= num_train]
    if bad:
        raise ValueError(
            f"kNN with k = {', '.join(map(str, bad))}: k must be between 1 and the number of "
            f"training images ({num_train}); give --knn-k smaller values (the default is "
            f"{' '.join(map(str, KNN_KS))}) or more training images"
        )


def knn_rankings(
    train_features: torch.Tensor | np.ndarray,
    train_labels: torch.Tensor | np.ndarray,
    test_features: torch.Tensor | np.ndarray,
    ks: Sequence[int] = KNN_KS,
    temperature: float = KNN_TEMPERATURE,
    num_classes: int | None = None,
    block_size: int | None = None,
    top: int = 5,
) -> dict[int, torch.Tensor]:
    """For each k, the `top` best classes of each test image by weighted kNN vote: (M, top)
    class indices, best first (fewer columns if there are fewer classes).

    train_features (N, D), train_labels (N,), test_features (M, D); features need not be
    normalised. block_size: test images per similarity block (default: as many as fit
    SIMILARITY_BUDGET similarities); the result does not depend on it.
    """
    train = F.normalize(torch.as_tensor(train_features, dtype=torch.float32), dim=1)  # (N, D)
    test = F.normalize(torch.as_tensor(test_features, dtype=torch.float32), dim=1)  # (M, D)
    labels = torch.as_tensor(train_labels, dtype=torch.int64)  # (N,)
    check_ks(ks, len(train))
    num_classes = int(labels.max()) + 1 if num_classes is None else num_classes
    max_k = max(ks)
    # the similarities (b, N) and the votes (b, max_k, C) both within the budget
    block = block_size or max(1, SIMILARITY_BUDGET // max(len(train), max_k * num_classes))
    rankings: dict[int, list[torch.Tensor]] = {k: [] for k in ks}
    for start in range(0, len(test), block):
        similarity = test[start : start + block] @ train.T  # (b, N)
        nearest, indices = similarity.topk(max_k, dim=1)  # (b, max_k), most similar first
        weights = (nearest / temperature).exp()  # (b, max_k)
        votes = F.one_hot(labels[indices], num_classes) * weights.unsqueeze(2)  # (b, max_k, C)
        cumulative = votes.cumsum(dim=1)  # (b, max_k, C): the votes of the first k neighbours
        for k in ks:
            scores = cumulative[:, k - 1]  # (b, C)
            # a stable sort on the negated votes: equal votes rank the lower class index first
            order = torch.sort(-scores, dim=1, stable=True).indices  # (b, C)
            rankings[k].append(order[:, :top])
    return {k: torch.cat(parts) for k, parts in rankings.items()}


def topk_accuracy(ranking: torch.Tensor, labels: torch.Tensor | np.ndarray) -> tuple[float, float]:
    """(top-1, top-5) of class rankings (M, >=1) against labels (M,)."""
    labels = torch.as_tensor(labels, dtype=torch.int64).view(-1, 1)
    hits = ranking == labels  # (M, top)
    return hits[:, :1].any(1).float().mean().item(), hits[:, :5].any(1).float().mean().item()


def knn_accuracy(
    train_features: torch.Tensor | np.ndarray,
    train_labels: torch.Tensor | np.ndarray,
    test_features: torch.Tensor | np.ndarray,
    test_labels: torch.Tensor | np.ndarray,
    ks: Sequence[int] = KNN_KS,
    temperature: float = KNN_TEMPERATURE,
    block_size: int | None = None,
) -> dict[int, dict[str, float]]:
    """Weighted-kNN top-1 and top-5 accuracy of the test images for every k:
    {k: {"top1": ..., "top5": ...}} (see `knn_rankings`)."""
    num_classes = int(max(np.max(train_labels), np.max(test_labels))) + 1
    rankings = knn_rankings(
        train_features,
        train_labels,
        test_features,
        ks=ks,
        temperature=temperature,
        num_classes=num_classes,
        block_size=block_size,
    )
    result = {}
    for k, ranking in rankings.items():
        top1, top5 = topk_accuracy(ranking, test_labels)
        result[k] = {"top1": top1, "top5": top5}
    return result


# -- linear probe --------------------------------------------------------------------------------
def stratified_holdout(
    labels: np.ndarray, fraction: float = HELDOUT_FRACTION, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Split sample indices into (fit, held out): `fraction` of each class held out (at least
    one image of a class with two or more), chosen at random by `seed`; both sorted."""
    rng = np.random.default_rng(seed)
    held = []
    for c in np.unique(labels):
        members = np.flatnonzero(labels == c)
        count = min(len(members) - 1, max(1, round(fraction * len(members))))
        held += rng.choice(members, size=count, replace=False).tolist() if count > 0 else []
    held = np.sort(np.asarray(held, dtype=np.int64))
    fit = np.setdiff1d(np.arange(len(labels)), held)
    return fit, held


def fit_logistic_regression(
    features: torch.Tensor,
    labels: torch.Tensor,
    num_classes: int,
    l2: float,
    max_iter: int = MAX_ITER,
    start: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Multinomial logistic regression minimising sum(cross-entropy) + l2/2 ||W||² (the bias
    unpenalised) by full-batch L-BFGS with a strong-Wolfe line search, from zero weights or
    from `start` (weight, bias) (a warm start: the problem is convex, so only the time taken
    depends on it, within the tolerance).

    features (N, D), labels (N,) -> weight (C, D) and bias (C,), in the features' dtype."""
    n, dim = features.shape
    if start is None:
        start = (torch.zeros(num_classes, dim, dtype=features.dtype), torch.zeros(num_classes))
    weight = start[0].clone().to(features.dtype).requires_grad_(True)  # (C, D)
    bias = start[1].clone().to(features.dtype).requires_grad_(True)  # (C,)
    optimizer = torch.optim.LBFGS(
        [weight, bias],
        lr=1.0,
        max_iter=max_iter,
        history_size=20,
        tolerance_grad=GRADIENT_TOLERANCE,
        tolerance_change=1e-9,
        line_search_fn="strong_wolfe",
    )

    def objective() -> torch.Tensor:
        optimizer.zero_grad()
        logits = features @ weight.T + bias  # (N, C)
        # divided by N: the same minimum, gradients of a scale L-BFGS's tolerances suit
        penalty = l2 / 2 * weight.square().sum()
        loss = (F.cross_entropy(logits, labels, reduction="sum") + penalty) / n
        loss.backward()
        return loss

    optimizer.step(objective)
    return weight.detach(), bias.detach()


def rank_classes(features: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """The classes of each row of features (M, D) by the linear model's logits, best first:
    (M, C), equal logits ranking the lower class index first."""
    logits = features @ weight.T + bias  # (M, C)
    return torch.sort(-logits, dim=1, stable=True).indices


def search_regularization(
    fit_x: torch.Tensor,
    fit_y: torch.Tensor,
    held_x: torch.Tensor,
    held_y: torch.Tensor,
    num_classes: int,
    max_iter: int = MAX_ITER,
) -> tuple[list[dict[str, float]], float, tuple[torch.Tensor, torch.Tensor]]:
    """CLIP's parametric binary search over λ: the held-out top-1 at λ = 1e-6, 1e-4, ..., 1e6,
    then at half the step on either side of the best so far until 8 steps per decade.
    Returns the search [{"l2": λ, "heldout_top1": ...}] in ascending λ, the chosen λ (the best
    held-out top-1; on a tie the stronger regularisation) and its fit (weight, bias)."""
    tried: dict[float, float] = {}  # log10 λ -> held-out top-1
    solutions: dict[float, tuple[torch.Tensor, torch.Tensor]] = {}  # log10 λ -> (W, b)

    def score(exponent: float) -> None:
        if exponent in tried or not SEARCH_START[0] <= exponent <= SEARCH_START[-1]:
            return
        # warm start from the nearest λ tried (the search walks from strong to weak first)
        nearest = min(solutions, key=lambda e: (abs(e - exponent), e), default=None)
        solutions[exponent] = fit_logistic_regression(
            fit_x,
            fit_y,
            num_classes,
            10.0**exponent,
            max_iter=max_iter,
            start=None if nearest is None else solutions[nearest],
        )
        ranking = rank_classes(held_x, *solutions[exponent])
        tried[exponent], _ = topk_accuracy(ranking, held_y)
        log.info("linear probe: l2 1e%+.3f -> held-out top-1 %.4f", exponent, tried[exponent])

    for exponent in reversed(SEARCH_START):
        score(exponent)
    step = SEARCH_START[1] - SEARCH_START[0]
    while step > 1 / SEARCH_STEPS_PER_DECADE:
        step /= 2
        peak = best_exponent(tried)
        score(peak + step)
        score(peak - step)
    chosen = best_exponent(tried)
    rows = [{"l2": 10.0**e, "heldout_top1": tried[e]} for e in sorted(tried)]
    return rows, 10.0**chosen, solutions[chosen]


def best_exponent(tried: dict[float, float]) -> float:
    """The exponent of the best held-out accuracy; on a tie the stronger regularisation."""
    return max(tried, key=lambda e: (tried[e], e))


@dataclass(frozen=True)
class ProbeFit:
    """A fitted linear probe: logits = features @ weight.T + bias."""

    weight: torch.Tensor  # (C, D) float64
    bias: torch.Tensor  # (C,) float64
    l2: float  # the chosen λ
    search: list[dict[str, float]]  # [{"l2", "heldout_top1"}], ascending λ
    heldout_images: int  # of the training images, those that chose λ


def fit_linear_probe(
    train_x: torch.Tensor,
    train_y: torch.Tensor,
    num_classes: int,
    seed: int = 0,
    heldout_fraction: float = HELDOUT_FRACTION,
    max_iter: int = MAX_ITER,
) -> ProbeFit:
    """The CLIP protocol's fit on train features (N, D) float64 and labels (N,): λ chosen on a
    held-out part (`stratified_holdout`), then the refit on all N with it."""
    fit, held = stratified_holdout(train_y.numpy(), heldout_fraction, seed)
    if len(held) == 0 or len(fit) == 0:
        raise ValueError(
            f"the linear probe needs at least two training images of a class to hold one out "
            f"for choosing its regularisation; got {len(train_y)} training images"
        )
    search, l2, held_fit = search_regularization(
        train_x[fit], train_y[fit], train_x[held], train_y[held], num_classes, max_iter
    )
    weight, bias = fit_logistic_regression(
        train_x, train_y, num_classes, l2, max_iter=max_iter, start=held_fit
    )
    return ProbeFit(weight=weight, bias=bias, l2=l2, search=search, heldout_images=len(held))


def linear_probe(
    train_features: np.ndarray | torch.Tensor,
    train_labels: np.ndarray | torch.Tensor,
    test_features: np.ndarray | torch.Tensor,
    test_labels: np.ndarray | torch.Tensor,
    seed: int = 0,
    heldout_fraction: float = HELDOUT_FRACTION,
    max_iter: int = MAX_ITER,
) -> dict:
    """The CLIP linear-probe protocol (see the module docstring) on train (N, D), (N,) and
    test (M, D), (M,) features. Returns {"top1", "top5", "l2" (the chosen λ), "C" (1/λ),
    "search" [{"l2", "heldout_top1"}], and the settings}. Computed in float64 on the CPU."""
    train_y_np = np.asarray(train_labels, dtype=np.int64)
    train_x = torch.as_tensor(np.asarray(train_features), dtype=torch.float64)  # (N, D)
    train_y = torch.as_tensor(train_y_np)
    test_x = torch.as_tensor(np.asarray(test_features), dtype=torch.float64)  # (M, D)
    test_y = torch.as_tensor(np.asarray(test_labels, dtype=np.int64))
    num_classes = int(max(train_y.max(), test_y.max())) + 1
    fit = fit_linear_probe(train_x, train_y, num_classes, seed, heldout_fraction, max_iter)
    top1, top5 = topk_accuracy(rank_classes(test_x, fit.weight, fit.bias), test_y)
    return {
        "top1": top1,
        "top5": top5,
        "l2": fit.l2,
        "C": 1 / fit.l2,
        "search": fit.search,
        "protocol": "CLIP (Radford et al. 2021, A.3): multinomial logistic regression on raw "
        "features, L2 chosen by parametric binary search on a held-out part of train, refit",
        "objective": "sum of cross-entropy + l2/2 * ||W||^2 (bias unpenalised; C = 1/l2)",
        "optimizer": f"torch.optim.LBFGS, strong Wolfe line search, max_iter {max_iter}",
        "standardize": False,
        "heldout_fraction": heldout_fraction,
        "heldout_images": fit.heldout_images,
        "fit_images": len(train_y) - fit.heldout_images,
        "train_images": len(train_y),
        "test_images": len(test_y),
        "seed": seed,
    }
