"""Classifying, explaining and embedding a list of images: the work of `python -m vit.predict`.

A `PredictJob` is what the command's flags ask for, fixed once at the edge; its steps take the
model and return what they did: `classified_batches` yields each batch's records and unreadable
images (explaining the batch on the way when the job asks), `embed` runs the embedding engine
(and classifies from the same forward pass when given a sink for the records).
The command line decides what to print and where to write.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import numpy as np
import torch

from ..data.images import CorruptImageError, open_image
from ..data.transforms_factory import create_transform
from ..models.class_names import class_names_for
from ..models.vision_transformer import VisionTransformer
from .embed import FeaturesResult, extract_features
from .tta import black_pixel, tta_logits


@dataclass(frozen=True)
class PredictJob:
    """What to do with which images, as the flags said it (checked before it is built).

    top_k is already capped at the model's classes; method is the --explain method (None when
    nothing is explained); weights names where the weights came from, for figure titles.
    """

    paths: tuple[Path, ...]
    top_k: int = 5
    batch_size: int = 32
    workers: int = 4
    tta: str = "none"
    explain: Path | None = None
    method: str | None = None
    weights: str = ""
    features: Path | None = None
    embedding: str = "pooled"
    shard_size: int = 2048
    overwrite: bool = False


@dataclass(frozen=True)
class BatchResult:
    """One batch's outcome: a record per image read (path, label, probability, ...; the path
    alone for a headless model) and one message per image that could not be read."""

    records: list[dict]
    unreadable: list[str]


def best_of(logits: torch.Tensor, top_k: int) -> tuple:
    """Logits (B, num_classes) -> (probabilities, class indices), each (B, k), best first."""
    probs = logits.float().softmax(dim=-1)  # (B, num_classes)
    return probs.topk(min(top_k, probs.shape[-1]), dim=-1)


def prepared_batches(
    paths: Sequence[Path], transform, batch_size: int, workers: int
) -> Iterator[tuple[list[Path], torch.Tensor | None, list[str]]]:
    """Decode and prepare images batch by batch: (paths read, (B, 3, H, W) or None, errors)."""

    def prepare(path: Path) -> torch.Tensor | str:
        try:
            return transform(open_image(path))
        except CorruptImageError as e:
            return str(e)

    with ThreadPoolExecutor(max(1, workers)) as pool:  # PIL decodes without holding the GIL
        for start in range(0, len(paths), batch_size):
            chunk = paths[start : start + batch_size]
            results = list(pool.map(prepare, chunk))
            good = [(p, r) for p, r in zip(chunk, results, strict=True) if not isinstance(r, str)]
            errors = [r for r in results if isinstance(r, str)]
            batch = torch.stack([r for _, r in good]) if good else None
            yield [p for p, _ in good], batch, errors


def records_for(paths, probs, indices, names: list[str]) -> list[dict]:
    """One dict per image: path, label, probability, label_2, probability_2, ..."""
    records = []
    for path, row_p, row_i in zip(paths, probs.tolist(), indices.tolist(), strict=True):
        record = {"path": str(path)}
        for rank, (p, i) in enumerate(zip(row_p, row_i, strict=True), start=1):
            suffix = "" if rank == 1 else f"_{rank}"
            record[f"label{suffix}"] = names[i]
            record[f"probability{suffix}"] = round(p, 6)
        records.append(record)
    return records


class RecordWriter:
    """Records streamed to an open file as they come: CSV (a header row, one row per image) or
    JSON (a list of objects, as json.dumps(records, indent=2) writes it)."""

    def __init__(self, file: TextIO, top_k: int, as_json: bool) -> None:
        self.file, self.as_json, self.count = file, as_json, 0
        fields = ["path", "label", "probability"]
        fields += [
            f"{name}_{rank}" for rank in range(2, top_k + 1) for name in ("label", "probability")
        ]
        self.csv = None if as_json else csv.DictWriter(file, fieldnames=fields, lineterminator="\n")
        if self.csv is not None:
            self.csv.writeheader()

    def write(self, records: list[dict]) -> None:
        for record in records:
            if self.csv is not None:
                self.csv.writerow(record)
            else:
                indented = json.dumps(record, indent=2).replace("\n", "\n  ")
                self.file.write(("[\n  " if self.count == 0 else ",\n  ") + indented)
            self.count += 1

    def close(self) -> None:
        if self.as_json and self.count:
            self.file.write("\n]\n")


def print_records(records: list[dict], top_k: int) -> None:
    """The terminal format: the path, then one `probability  label` line per class."""
    for record in records:
        print(record["path"])
        for rank in range(1, top_k + 1):
            suffix = "" if rank == 1 else f"_{rank}"
            print(f"  {record[f'probability{suffix}']:7.2%}  {record[f'label{suffix}']}")


def classified_batches(
    job: PredictJob, model: VisionTransformer, device: torch.device
) -> Iterator[BatchResult]:
    """Classify (and, if the job says so, explain) the job's images batch by batch; nothing is
    kept from one batch to the next."""
    names = class_names_for(model)
    transform = create_transform(model.preprocess)
    if job.explain:  # matplotlib, which draws the maps, is imported only then
        from .explanations import explanation_paths, save_explanations

        targets = explanation_paths(job.paths, job.explain)
    black = black_pixel(model.preprocess).to(device)  # --tta shift's border, normalised
    for batch_paths, batch, errors in prepared_batches(
        job.paths, transform, job.batch_size, job.workers
    ):
        records = []
        if batch is not None:
            batch = batch.to(device)
            if model.num_classes > 0:
                with torch.inference_mode():
                    _, logits = tta_logits(model.eval(), batch, job.tta, black)  # (B, K)
                probs, indices = best_of(logits, job.top_k)
                records = records_for(batch_paths, probs, indices, names)
            else:  # a headless model: paths only
                records = [{"path": str(path)} for path in batch_paths]
            if job.explain:
                save_explanations(
                    model, batch, records, targets, batch_paths, job.method, job.weights
                )
        yield BatchResult(records=records, unreadable=errors)


def embed(
    job: PredictJob,
    model: VisionTransformer,
    device: torch.device,
    sink: Callable[[list[dict]], None] | None = None,
) -> FeaturesResult:
    """The job's --features file through the embedding engine (resumable, flat in memory).
    sink: also classify every image from the same forward pass as its features, and hand the
    records (as `classified_batches` makes them) to `sink`, in the images' order, at the end."""
    paths = job.paths
    classify = None
    if sink is not None:
        names = class_names_for(model)

        def classify(keys: list[str], logits: np.ndarray) -> None:
            probs, indices = best_of(torch.from_numpy(logits), job.top_k)
            sink(records_for(keys, probs, indices, names))

    return extract_features(
        model,
        [str(p) for p in paths],
        lambda i: open_image(paths[i]),
        job.features,
        embedding=job.embedding,
        batch_size=job.batch_size,
        workers=job.workers,
        device=device,
        shard_images=job.shard_size,
        overwrite=job.overwrite,
        classify=classify,
    )
