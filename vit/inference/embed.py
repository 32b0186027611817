"""The embedding engine: one feature vector per item of an ordered list, for any number of items,
in memory that does not grow with their number, resumable after a kill, across processes.

    result = extract_features(model, keys, load, Path("emb.npz"), embedding="pooled")
    keys, features = read_features("emb.npz")  # (N,) str, (N, D) float32

`keys` name the items in order (image paths for `vit.predict`, dataset indices for evaluate);
`load(i)` returns item i as an RGB PIL image (prepared with the model's preprocessing) or as a
prepared tensor (3, H, W). A load that raises `CorruptImageError` or `OSError` skips the item:
it is listed in FILE.errors.txt (one `key<TAB>reason` line each) and in the result.

Work is cut into shards of `shard_images` consecutive items, each written atomically, as it is
done, to a hidden folder beside the output, `.FILE.parts/`, with a manifest naming the job
(the keys, the model's weights and preprocessing, the embedding, the shard size). Run again
after a kill, the same job skips the shards already there; a different job's parts are refused
in one line. When every shard is there, the output file is assembled from them, in item order
(so it equals an uninterrupted run's), written atomically, and the parts are removed. A
finished output is replaced only with overwrite=True.

Under torchrun (torch.distributed initialised, e.g. by `vit.utils.process_group.setup`), shard k is
computed by rank k % world_size and rank 0 assembles the file once every rank is done: the file
is the single-process one. The parts folder must be on a filesystem every rank sees.

Embeddings (`EMBEDDINGS`), named as their sources name them:
* "pooled": timm's pre-logits features, `forward_head(tokens, pre_logits=True)`, what a
  headless backbone returns as `model(x)` (DINOv2's pooler_output, the class token).
* "clstoken": DINOv2's x_norm_clstoken, the class token after the final norm.
* "clstoken_avgpool": DINOv2's linear protocol (n=1, avgpool): the class token concatenated
  with the mean of the normed patch tokens (registers left out), 2D values.
* "lastN_clstoken" (e.g. "last4_clstoken"): DINO's eval_linear (n_last_blocks=N,
  avgpool_patchtokens=False, its ViT-S setting): the last N blocks' normed class tokens
  concatenated, N*D values.
* "image_embeds": CLIP's projected embedding, the output of a CLIP image tower with its
  projection as head. "output": the model's output whatever the model (image_embeds for such a
  tower, logits for a classifier).

Formats, by the output's suffix: .npz (arrays `paths` (N,) str and `features` (N, D) float32,
written in a stream: for large jobs), .csv (`path, f0, ..., f{D-1}`), .json (a list of
{"path", "embedding"}); values written with 9 significant digits read back exactly.
"""

from __future__ import annotations

import csv
import hashlib
import json
import re
import shutil
import sys
import time
import zipfile
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from PIL import Image
from tqdm import tqdm

from ..data.images import CorruptImageError
from ..models.families import family_of
from ..utils.files import atomic_write, atomic_write_dir
from ..utils.process_group import barrier

EMBEDDINGS = {
    "pooled": "pooled pre-logits features",
    "clstoken": "the normed class token",
    "clstoken_avgpool": "the class token and the mean patch token",
    "lastN_clstoken": "the last N blocks' class tokens",
    "image_embeds": "CLIP's projected embedding",
    "output": "the model's output",
}
FEATURE_SUFFIXES = (".npz", ".csv", ".json")
DEFAULT_SHARD_IMAGES = 2048  # a minute or two of DINOv2-S on a CPU, seconds on a GPU
_LAST_N = re.compile(r"last(\d+)_clstoken")
_FORMAT = 1  # the parts' layout; parts of another layout are another job's


class FeaturesError(ValueError):
    """A job that cannot run as asked (an embedding the model cannot give, an output that
    exists, another job's parts): one line for the user."""


@dataclass
class FeaturesResult:
    """What `extract_features` wrote: `count` rows of `dim` values in `path` (None when no item
    could be read), and the items skipped, (key, reason) each, also in `errors_path`."""

    path: Path | None
    count: int
    dim: int
    errors: list[tuple[str, str]] = field(default_factory=list)
    errors_path: Path | None = None
    resumed_shards: int = 0  # shards found done by an earlier run


# -- the feature choices -----------------------------------------------------------------------
POOLS_NOTHING = "the model does not pool its tokens (global_pool=''): it gives one output per token"
POOL_HINT = (
    "in Python, model.reset_classifier(model.num_classes, global_pool='avg') (or 'token') "
    "and vit.save_weights give a model that does"
)


def pools_nothing(model: torch.nn.Module) -> bool:
    """Whether the model reads out every token (timm's global_pool=''): (B, N, D) features and
    (B, N, K) logits, where every command that classifies or embeds images wants a row each."""
    return getattr(model, "global_pool", "token") == ""


def check_embedding(model: torch.nn.Module, embedding: str) -> str:
    """The embedding's canonical name, or FeaturesError (one line) if the model cannot give it."""
    last_n = _LAST_N.fullmatch(embedding)
    if (embedding not in EMBEDDINGS and last_n is None) or embedding == "lastN_clstoken":
        raise FeaturesError(
            f"--embedding {embedding}: not a feature choice; accepted: pooled, clstoken, "
            "clstoken_avgpool, last4_clstoken (any lastN_clstoken), image_embeds, output"
        )
    if embedding in ("pooled", "output") and pools_nothing(model):
        raise FeaturesError(
            f"--embedding {embedding}: {POOLS_NOTHING}, not one per image; use --embedding "
            "clstoken, clstoken_avgpool or last4_clstoken"
            + ("" if getattr(model, "cls_token", None) is not None else f"; {POOL_HINT}")
        )
    needs_class_token = embedding.startswith(("clstoken", "last"))
    if needs_class_token and getattr(model, "cls_token", None) is None:
        raise FeaturesError(
            f"--embedding {embedding}: the model has no class token (it reads "
            f"global_pool={model.global_pool!r}); use --embedding pooled"
        )
    if last_n is not None:
        n, depth = int(last_n.group(1)), len(model.blocks)
        if not 1 <= n <= depth:
            raise FeaturesError(
                f"--embedding {embedding}: the model has {depth} blocks; "
                f"N must be between 1 and {depth}"
            )
    if embedding == "image_embeds" and not (
        family_of(model).name == "clip" and model.num_classes > 0
    ):
        outputs = model.num_classes
        head = " without a head" if outputs == 0 else f" with a head of {outputs} outputs"
        raise FeaturesError(
            f"--embedding image_embeds: CLIP's projected embedding needs a CLIP image tower "
            f"with its projection as head; this model is a {family_of(model).title}{head}; "
            "use --embedding pooled (or output)"
        )
    return embedding


def describe(embedding: str) -> str:
    """A few words for the embedding, for messages."""
    last_n = _LAST_N.fullmatch(embedding)
    if last_n:
        return f"the last {last_n.group(1)} blocks' class tokens"
    return EMBEDDINGS[embedding]


@torch.inference_mode()
def embed_batch(
    model: torch.nn.Module, batch: torch.Tensor, embedding: str, logits: bool = False
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """A prepared batch (B, 3, H, W) -> the embeddings (B, D) float32 on the CPU, in storage of
    their own: never a view that would keep the token tensor (B, N, D) alive.
    logits: also the model's output (B, K), from the same pass through the blocks (the head
    applied to the tokens the embedding was read from): (embeddings, logits)."""
    model.eval()
    last_n = _LAST_N.fullmatch(embedding)
    head = None
    if embedding in ("output", "image_embeds"):
        features = head = model(batch)  # (B, D)
    elif last_n is not None:
        found = model.forward_intermediates(
            batch,
            indices=int(last_n.group(1)),
            return_prefix_tokens=True,
            norm=True,
            output_fmt="NLC",
            intermediates_only=not logits,  # with logits: also the last block's normed tokens
        )  # N pairs (patch tokens (B, gh*gw, D), prefix tokens (B, P, D))
        if logits:
            final, found = found  # (B, N, D), the pairs
            head = model.forward_head(final)  # (B, K)
        features = torch.cat([prefix[:, 0] for _, prefix in found], dim=-1)  # (B, N*D)
    else:
        tokens = model.forward_features(batch)  # (B, N, D)
        if embedding == "pooled":
            features = model.forward_head(tokens, pre_logits=True)  # (B, D)
        elif embedding == "clstoken":
            features = tokens[:, 0]  # (B, D)
        else:  # clstoken_avgpool
            patches = tokens[:, model.num_prefix_tokens :].mean(dim=1)  # (B, D)
            features = torch.cat([tokens[:, 0], patches], dim=-1)  # (B, 2D)
        if logits:
            head = model.forward_head(tokens)  # (B, K)
    if not logits:
        return _own(features)
    return _own(features), _own(head)


def _own(values: torch.Tensor) -> torch.Tensor:
    """float32 on the CPU in storage of its own (.to() alone may return the very view)."""
    return values.detach().to("cpu", torch.float32).clone()


# -- the job -----------------------------------------------------------------------------------
def parts_folder(out: Path) -> Path:
    """The hidden work folder beside the output: .FILE.parts/."""
    return out.parent / f".{out.name}.parts"


def finished_shards(out: Path) -> int:
    """How many shards of the job writing `out` are finished (0 without a parts folder): where
    the same job continues from."""
    parts = parts_folder(out)
    return len(list(parts.glob("shard-*.npz"))) if parts.is_dir() else 0


def errors_file(out: Path) -> Path:
    return out.parent / f"{out.name}.errors.txt"


def model_digest(model: torch.nn.Module) -> str:
    """A hash of the weights (every parameter and buffer, by name) and the preprocessing:
    equal for the same model wherever it was loaded from. Names this engine's jobs and
    evaluate's feature caches (`vit.inference.probe`)."""
    digest = hashlib.sha1()
    for name, tensor in model.state_dict().items():
        digest.update(name.encode())
        # reshape(-1): a 0-dim buffer cannot be viewed as bytes directly
        digest.update(tensor.detach().to("cpu").reshape(-1).view(torch.uint8).numpy().tobytes())
    preprocess = getattr(model, "preprocess", None)
    digest.update(json.dumps(getattr(preprocess, "to_dict", dict)(), sort_keys=True).encode())
    return digest.hexdigest()


def _keys_digest(keys: Sequence[str]) -> str:
    digest = hashlib.sha1()
    for key in keys:
        digest.update(key.encode("utf-8", "surrogateescape") + b"\0")
    return digest.hexdigest()


def _rank_and_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _prepare_parts(out: Path, manifest: dict, overwrite: bool) -> int:
    """Check the output and the parts folder for this job (rank 0): FeaturesError if the output
    exists (without overwrite) or the parts are another job's (overwrite starts anew); returns
    the number of shards already done."""
    if out.exists() and not overwrite:
        raise FeaturesError(
            f"{out} exists (a finished features file); add --overwrite (in Python: "
            "overwrite=True) to replace it, or choose another file"
        )
    parts = parts_folder(out)
    manifest_path = parts / "manifest.json"
    if parts.exists():
        try:
            found = json.loads(manifest_path.read_text())
        except (OSError, ValueError):
            found = None
        if found != manifest:
            if not overwrite:
                raise FeaturesError(
                    f"{parts} holds the parts of another job (other items, model, embedding or "
                    f"shard size); remove it, choose another file, or add --overwrite (in "
                    "Python: overwrite=True) to start anew"
                )
            shutil.rmtree(parts)
    if not parts.exists():
        # whole or not at all: a folder left without its manifest (a full disk) would read as
        # another job's parts, and refuse the same command run again once there is room
        atomic_write_dir(
            parts, lambda tmp: (tmp / manifest_path.name).write_text(json.dumps(manifest))
        )
    return finished_shards(out)


def _shard_path(parts: Path, shard: int) -> Path:
    return parts / f"shard-{shard:06d}.npz"


def extract_features(
    model: torch.nn.Module,
    keys: Sequence[str],
    load: Callable[[int], Image.Image | torch.Tensor],
    out: Path,
    *,
    embedding: str = "pooled",
    batch_size: int = 32,
    workers: int = 4,
    device: torch.device | str | None = None,
    shard_images: int = DEFAULT_SHARD_IMAGES,
    overwrite: bool = False,
    progress: bool | None = None,
    classify: Callable[[list[str], np.ndarray], None] | None = None,
) -> FeaturesResult:
    """Embed items 0..len(keys)-1 (`load(i)`: a PIL image or a prepared (3, H, W) tensor) and
    write `out` (.npz, .csv or .json): one row per readable item, in order. See the module
    docstring for shards, resuming, torchrun and the embeddings. progress: a tqdm bar (True),
    a line per shard (False), or the bar on a terminal only (None). Every rank returns; rank 0's
    result names the file.
    classify: also keep the model's logits of each item, from the same forward pass as its
    features, in the shards (so they too continue after a kill), and hand them to
    `classify(keys, logits (n, K))` on rank 0, shard by shard in item order, once all are done.
    Raises FeaturesError (one line) before any work for a job that cannot run."""
    from ..data.transforms_factory import create_transform

    out = Path(out)
    if out.suffix.lower() not in FEATURE_SUFFIXES:
        raise FeaturesError(f"{out}: the file name must end in .npz, .csv or .json")
    embedding = check_embedding(model, embedding)
    if shard_images < 1 or batch_size < 1:
        raise FeaturesError("shard_images and batch_size must be at least 1")
    device = torch.device(device) if device is not None else next(model.parameters()).device
    keys = [str(k) for k in keys]
    rank, world = _rank_and_world()
    manifest = {
        "format": _FORMAT,
        "items": len(keys),
        "keys": _keys_digest(keys),
        "model": model_digest(model),
        "embedding": embedding,
        "shard_images": shard_images,
    }
    if classify is not None:  # parts without logits are another job's
        manifest["logits"] = True
    parts = parts_folder(out)
    done = _on_rank0_first(rank, world, lambda: _prepare_parts(out, manifest, overwrite))
    shards = range(-(-len(keys) // shard_images))  # ceiling division
    todo = [s for s in shards if s % world == rank and not _shard_path(parts, s).exists()]
    preprocess = getattr(model, "preprocess", None)
    transform = create_transform(preprocess) if preprocess is not None else None
    reporter = _Progress(
        total=sum(_shard_len(s, shard_images, len(keys)) for s in todo),
        shards=len(todo),
        bar=progress,
        show=rank == 0,
    )
    how = _How(load, transform, embedding, batch_size, workers, device, classify is not None)
    model = model.to(device).eval()
    for shard in todo:
        start = shard * shard_images
        indices = range(start, min(start + shard_images, len(keys)))
        _write_shard(
            _shard_path(parts, shard),
            _embed_items(model, indices, how, reporter),
        )
        reporter.shard_done()
    reporter.close()
    barrier()  # every rank's shards are written
    result = FeaturesResult(path=None, count=0, dim=0, resumed_shards=done)
    if rank == 0:
        result = _assemble(out, keys, parts, len(shards), result, classify)
    barrier()  # rank 0 has assembled: the file is there for every rank
    return result


def _on_rank0_first(rank: int, world: int, step: Callable[[], int]) -> int:
    """`step()` on rank 0 alone; its FeaturesError raised on every rank (the others with its
    message), its result sent to all."""
    outcome: list = [None, None]
    if rank == 0:
        try:
            outcome[0] = step()
        except FeaturesError as e:
            outcome[1] = str(e)
    if world > 1:
        dist.broadcast_object_list(outcome, src=0)
    if outcome[1] is not None:
        raise FeaturesError(outcome[1])
    return outcome[0]


def _shard_len(shard: int, shard_images: int, total: int) -> int:
    return min(shard_images, total - shard * shard_images)


@dataclass
class _ShardData:
    indices: list[int]  # the items embedded, in order
    features: list[np.ndarray]  # (b, D) per batch
    errors: list[tuple[int, str]]  # (item, reason) for each item skipped
    logits: list[np.ndarray] = field(default_factory=list)  # (b, K) per batch, if kept


@dataclass(frozen=True)
class _How:
    """How `_embed_items` reads and embeds items (extract_features' arguments)."""

    load: Callable[[int], Image.Image | torch.Tensor]
    transform: Callable | None
    embedding: str
    batch_size: int
    workers: int
    device: torch.device
    logits: bool  # keep each item's logits too, from the same forward pass


def _embed_items(model, indices: range, how: _How, reporter: _Progress) -> _ShardData:
    """Embed the items `indices` batch by batch (with their logits if `how.logits`); images are
    decoded by `how.workers` threads, the next batch while the model runs on this one."""
    data = _ShardData([], [], [])

    def prepare(i: int) -> torch.Tensor | str:
        try:
            item = how.load(i)
        except (CorruptImageError, OSError) as e:
            return str(e) or type(e).__name__
        if not isinstance(item, Image.Image):
            return item  # already prepared, (3, H, W)
        if how.transform is None:
            raise FeaturesError("the model has no preprocess: load(i) must return tensors")
        return how.transform(item)

    size = how.batch_size
    batches = [indices[s : s + size] for s in range(0, len(indices), size)]
    pool = ThreadPoolExecutor(max(1, how.workers))  # PIL decodes without holding the GIL
    try:
        pending = _submit(pool, prepare, batches[0]) if batches else []
        for b in range(len(batches)):
            results = [f.result() for f in pending]
            pending = _submit(pool, prepare, batches[b + 1]) if b + 1 < len(batches) else []
            good = [i for i, r in zip(batches[b], results, strict=True) if not isinstance(r, str)]
            data.errors += [
                (i, r) for i, r in zip(batches[b], results, strict=True) if isinstance(r, str)
            ]
            if good:
                batch = torch.stack([r for r in results if not isinstance(r, str)]).to(how.device)
                if how.logits:
                    features, logits = embed_batch(model, batch, how.embedding, logits=True)
                    data.logits.append(logits.numpy())
                else:
                    features = embed_batch(model, batch, how.embedding)
                data.features.append(features.numpy())
                data.indices += good
                del batch, results  # the images go now, not at the next batch
            reporter.update(len(batches[b]))
    finally:  # Ctrl-C or an error: the next batch's decodes are cancelled, not waited for
        pool.shutdown(cancel_futures=True)
    return data


def _submit(pool: ThreadPoolExecutor, prepare, indices: range) -> list[Future]:
    return [pool.submit(prepare, i) for i in indices]


def _write_shard(path: Path, data: _ShardData) -> None:
    """One shard, atomically: indices (n,), features (n, D), the skipped items and reasons, and
    the logits (n, K) when kept."""
    features = np.concatenate(data.features) if data.features else np.zeros((0, 0), np.float32)
    kept = {"logits": np.concatenate(data.logits)} if data.logits else {}

    def save(tmp: Path) -> None:
        with open(tmp, "wb") as f:  # a file object: np.savez would append .npz to a name
            np.savez(
                f,
                indices=np.asarray(data.indices, dtype=np.int64),
                features=features,
                error_indices=np.asarray([i for i, _ in data.errors], dtype=np.int64),
                error_reasons=np.asarray([r for _, r in data.errors], dtype=str),
                **kept,
            )

    atomic_write(path, save)


def _read_shards(
    parts: Path, count: int, features: bool = True
) -> Iterator[tuple[np.ndarray, np.ndarray | None, list]]:
    """(indices, features or None, [(index, reason)]) of each shard, in order."""
    for shard in range(count):
        with np.load(_shard_path(parts, shard)) as saved:
            errors = list(
                zip(saved["error_indices"].tolist(), saved["error_reasons"].tolist(), strict=True)
            )
            yield saved["indices"], saved["features"] if features else None, errors


def _assemble(
    out: Path,
    keys: list[str],
    parts: Path,
    count: int,
    result: FeaturesResult,
    classify: Callable[[list[str], np.ndarray], None] | None = None,
) -> FeaturesResult:
    """The output file from the shards, in item order, then the errors file; the shards' logits
    to `classify`; then the parts go."""
    rows, dim = 0, 0
    for indices, features, errors in _read_shards(parts, count):
        rows += len(indices)
        dim = features.shape[1] if len(indices) else dim  # (n, D); (0, 0) for an empty shard
        result.errors += [(keys[i], reason) for i, reason in errors]
    result.count, result.dim = rows, dim
    errors_path = errors_file(out)
    if result.errors:
        lines = "".join(f"{key}\t{reason}\n" for key, reason in result.errors)
        atomic_write(errors_path, lambda tmp: tmp.write_text(lines, encoding="utf-8"))
        result.errors_path = errors_path
    else:
        errors_path.unlink(missing_ok=True)  # an earlier run's list would mislead
    if rows:  # nothing read: nothing written, an earlier file stays
        writer = {".npz": _write_npz, ".csv": _write_csv, ".json": _write_json}
        atomic_write(
            out, lambda tmp: writer[out.suffix.lower()](tmp, keys, parts, count, rows, dim)
        )
        result.path = out
    if classify is not None:
        for shard in range(count):
            with np.load(_shard_path(parts, shard)) as saved:
                if len(saved["indices"]):
                    classify([keys[i] for i in saved["indices"].tolist()], saved["logits"])
    shutil.rmtree(parts)
    return result


def _write_npz(tmp: Path, keys, parts: Path, count: int, rows: int, dim: int) -> None:
    """np.savez's layout (paths.npy, features.npy in a zip), the features streamed shard by
    shard: the whole (N, D) array is never in memory."""
    shards = _read_shards(parts, count, features=False)
    width = max(len(keys[i]) for indices, _, _ in shards for i in indices)
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
        with archive.open("paths.npy", "w", force_zip64=True) as f:
            np.lib.format.write_array_header_2_0(
                f, {"descr": f"<U{width}", "fortran_order": False, "shape": (rows,)}
            )
            for indices, _, _ in _read_shards(parts, count, features=False):
                f.write(np.asarray([keys[i] for i in indices], dtype=f"<U{width}").tobytes())
        with archive.open("features.npy", "w", force_zip64=True) as f:
            header = {"descr": "<f4", "fortran_order": False, "shape": (rows, dim)}
            np.lib.format.write_array_header_2_0(f, header)
            for _, features, _ in _read_shards(parts, count):
                f.write(np.ascontiguousarray(features, dtype="<f4").tobytes())


def _rows(keys, parts: Path, count: int) -> Iterator[tuple[str, list[float]]]:
    """(key, values) per row, in order; 9 significant digits: every float32 reads back exactly."""
    for indices, features, _ in _read_shards(parts, count):
        for i, row in zip(indices.tolist(), features.tolist(), strict=True):
            yield keys[i], [float(f"{v:.9g}") for v in row]


def _write_csv(tmp: Path, keys, parts: Path, count: int, rows: int, dim: int) -> None:
    # a path that is not UTF-8 is written as its bytes (as predict's --output), read back so
    with open(tmp, "w", newline="", encoding="utf-8", errors="surrogateescape") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(["path", *(f"f{i}" for i in range(dim))])
        writer.writerows([key, *values] for key, values in _rows(keys, parts, count))


def _write_json(tmp: Path, keys, parts: Path, count: int, rows: int, dim: int) -> None:
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("[")
        for n, (key, values) in enumerate(_rows(keys, parts, count)):
            f.write((", " if n else "") + json.dumps({"path": key, "embedding": values}))
        f.write("]\n")


def read_features(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """A features file (.npz, .csv or .json) -> (keys (N,) str, features (N, D) float32)."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".npz":
        with np.load(path) as saved:
            return saved["paths"], saved["features"].astype(np.float32, copy=False)
    if suffix == ".json":
        records = json.loads(path.read_text(encoding="utf-8"))
        keys = np.asarray([r["path"] for r in records], dtype=str)
        return keys, np.asarray([r["embedding"] for r in records], dtype=np.float32)
    with open(path, newline="", encoding="utf-8", errors="surrogateescape") as f:
        rows = list(csv.reader(f))[1:]
    keys = np.asarray([r[0] for r in rows], dtype=str)
    return keys, np.asarray([r[1:] for r in rows], dtype=np.float32)


# -- progress ----------------------------------------------------------------------------------
class _Progress:
    """images/s and the time left: a tqdm bar on a terminal, else one line per shard."""

    def __init__(self, total: int, shards: int, bar: bool | None, show: bool) -> None:
        self.total, self.shards, self.show = total, shards, show
        self.done, self.shards_done, self.start = 0, 0, time.monotonic()
        self.bar = None
        tty = sys.stderr.isatty()
        self.lines = show and not (tty if bar is None else bar)
        if show and not self.lines and total:
            self.bar = tqdm(total=total, unit="img", file=sys.stderr, dynamic_ncols=True)

    def update(self, n: int) -> None:
        self.done += n
        if self.bar is not None:
            self.bar.update(n)

    def shard_done(self) -> None:
        self.shards_done += 1
        if not self.lines:
            return
        elapsed = time.monotonic() - self.start
        rate = self.done / elapsed if elapsed > 0 else 0.0
        left = (self.total - self.done) / rate if rate > 0 else 0.0
        print(
            f"shard {self.shards_done}/{self.shards}: {self.done}/{self.total} images, "
            f"{rate:.1f} images/s, about {_duration(left)} left",
            file=sys.stderr,
            flush=True,
        )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"
