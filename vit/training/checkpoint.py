"""What a run keeps on disk, and the one object that saving and resuming both go through.

`TrainingState` holds everything that changes while training (model, EMA, optimizer, scheduler,
gradient scaler, epochs done, best top-1, metrics history, every process's RNG state) and has
one `state_dict()` / `load_state_dict()` pair, so what is saved and what a resume restores
cannot drift apart. `CheckpointSaver` writes a run folder's weights and training state after
each epoch, every file atomically (`vit.utils.files.atomic_write`): a run killed at any moment, even
mid-save, resumes from its last complete `training_state.pt`.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import random
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import yaml
from torch import nn

from ..interop.weights import save_weights
from ..utils.files import atomic_write
from ..utils.process_group import DistInfo

logger = logging.getLogger("vit")

STATE_FILE = "training_state.pt"
CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.csv"
LAST_WEIGHTS, BEST_WEIGHTS = "model.safetensors", "best.safetensors"
CURVES_FILE, TENSORBOARD_DIR = "curves.png", "tensorboard"
TEACHER_FILE = "teacher.safetensors"  # --distillation-type's teacher (vit.training.distillation)
LOG_FILE = "train.log"  # the log lines (vit.training.run_log.LogFile)
# What a run folder holds once a run wrote into it (evaluate.py adds eval-DATA/ folders).
RUN_FILES = (
    CONFIG_FILE,
    METRICS_FILE,
    LOG_FILE,
    CURVES_FILE,
    TENSORBOARD_DIR,
    STATE_FILE,
    LAST_WEIGHTS,
    BEST_WEIGHTS,
    TEACHER_FILE,
)
METRIC_KEYS = (
    "epoch",
    "train_loss",
    "train_acc",
    "test_loss",
    "test_top1",
    "test_top5",
    "ema_top1",
    "ema_top5",
    "lr",
    "epoch_seconds",
    "train_images_per_s",
    "data_seconds",  # of epoch_seconds, the training loop's wait for batches
    "image_size",
    # Unix time when the epoch's evaluation and row were done: a run's progress against the
    # clock (scripts/gpu_check.sh's speedrun times the whole command against it)
    "finished_at",
)


# -- RNG state, saved as plain tensors/lists so torch.load(weights_only=True) reads it -------------
def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def get_rng_state() -> dict:
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def gather_rng_states(info: DistInfo) -> list[dict]:
    """The RNG states of all processes, in rank order (on every process)."""
    state = get_rng_state()
    if not info.enabled:
        return [state]
    states: list = [None] * info.world_size
    torch.distributed.all_gather_object(states, state)
    return states


# -- the training state --------------------------------------------------------------------------
@dataclass
class TrainingState:
    """Everything a resumed run needs. `ema` is a `vit.training.ema.ModelEma` or None."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    ema: object | None
    info: DistInfo
    config: dict  # the run's TrainConfig, saved beside the state for reference
    epoch: int = 0  # epochs completed
    best_top1: float = -1.0  # of the kept weights (the EMA's when there is one)
    history: list[dict] = field(default_factory=list)  # one metrics row per epoch

    def state_dict(self) -> dict:
        """The state as tensors and plain containers. Under DDP every process must call it:
        it gathers every process's RNG state, so a resumed run continues every stream."""
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "ema": self.ema.state_dict() if self.ema is not None else None,
            "epoch": self.epoch,
            "best_top1": self.best_top1,
            "history": self.history,
            "rng": gather_rng_states(self.info),
            "config": self.config,
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore what `state_dict` saved, this process's RNG streams included."""
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        if self.ema is not None:
            if state.get("ema") is None:
                raise ValueError("the saved state has no EMA; resume without --model-ema")
            self.ema.load_state_dict(state["ema"])
        self.epoch, self.best_top1 = state["epoch"], state["best_top1"]
        self.history = list(state["history"])
        rng = state["rng"]  # one RNG state per process of the run
        if len(rng) != self.info.world_size:
            raise ValueError(
                f"the run was trained by {len(rng)} process(es), this start has "
                f"{self.info.world_size}; resume it with {len(rng)}"
            )
        set_rng_state(rng[self.info.rank])

    @property
    def kept(self) -> tuple[nn.Module, str]:
        """The weights a run keeps, judges and saves: the EMA's when there is one."""
        return (self.ema.module, "ema") if self.ema is not None else (self.model, "model")

    def end_epoch(self, row: dict, kept_metrics: dict | None) -> bool:
        """Record an epoch's metrics row; True if the kept weights reached a new best top-1."""
        self.history.append(row)
        self.epoch = row["epoch"]
        improved = kept_metrics is not None and kept_metrics["top1"] > self.best_top1
        if improved:
            self.best_top1 = kept_metrics["top1"]
        return improved


def save_training_state(state: dict, path: Path) -> None:
    """torch.save to a temporary file, then an atomic rename over `path`. Tensors are saved
    on the CPU, so a run trained on a GPU loads with a plain torch.load on any machine."""
    cpu_state = _on_cpu(state)
    atomic_write(path, lambda tmp: torch.save(cpu_state, tmp))


def _on_cpu(value):
    """`value` with every tensor in its (nested) dicts, lists and tuples moved to the CPU."""
    if isinstance(value, torch.Tensor):
        return value.cpu()
    if isinstance(value, dict):
        return {key: _on_cpu(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_on_cpu(item) for item in value)
    return value


def load_training_state(path: Path) -> dict:
    """What `save_training_state` saved; ValueError naming the file if it is truncated or
    corrupt."""
    from ..interop.weights import torch_load  # weights_only, and a one-line diagnosis of a bad file

    return torch_load(path)


# -- the run folder, as a whole ------------------------------------------------------------------
def run_files(folder: Path) -> list[Path]:
    """The files and folders a previous run (and evaluate.py) left in `folder`."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = [folder / name for name in RUN_FILES if (folder / name).exists()]
    found += sorted(p for p in folder.glob("eval-*") if p.is_dir())
    reports = sorted(p for p in folder.glob("*.json") if _is_eval_report(p))
    pictures = [p.with_name(f"{p.stem}_confusion_matrix.png") for p in reports]  # beside each
    return found + reports + [p for p in pictures if p.is_file()]


def _is_eval_report(path: Path) -> bool:
    """A JSON report evaluate.py wrote there (`--json RUN/eval.json`): it would describe the
    previous model."""
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(report, dict) and {"top1", "checkpoint", "confusion_matrix"} <= set(report)


def remove_run(folder: Path) -> list[Path]:
    """--overwrite: remove a previous run's files from `folder` (nothing else in it), so that no
    stale weights, metrics or evaluation stay beside the new run's. Returns what was removed."""
    removed = run_files(folder)
    for path in removed:
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
    for leftover in Path(folder).glob(".*.tmp"):  # an interrupted save of the previous run
        leftover.unlink(missing_ok=True)
    return removed


# -- the run folder ------------------------------------------------------------------------------
class CheckpointSaver:
    """Writes a run's weights and training state after each epoch (rank 0 writes, every rank
    takes part in gathering the RNG states).

    model.safetensors: the latest kept weights, loadable alone (config, classes, preprocessing
    and the epoch's metrics in its metadata); best.safetensors: the kept weights (the EMA's
    where EMA is on) of the epoch whose kept weights scored the best top-1 so far (ema_top1 with
    EMA, else test_top1; the earlier epoch of a tie); training_state.pt:
    `TrainingState.state_dict()`, written last, so that a resume never finds weights newer than
    its state.
    """

    def __init__(self, run_dir: Path, info: DistInfo, data: str, config: dict) -> None:
        self.run_dir, self.info = Path(run_dir), info
        self.data, self.config = data, config
        self.state_path = self.run_dir / STATE_FILE

    def remove_interrupted_saves(self) -> None:
        """Temporary files of a save killed before its rename: never complete."""
        for leftover in self.run_dir.glob(".*.tmp"):
            logger.warning("removing %s, left by an interrupted save", leftover)
            leftover.unlink(missing_ok=True)

    def resume(self, state: TrainingState) -> None:
        """Load the run's last complete state into `state` (ValueError, in one line naming the
        file, when it is missing, unreadable or does not fit the model), then remove the
        temporary files of a save the kill interrupted."""
        if not self.state_path.is_file():
            raise ValueError(f"--resume {self.run_dir}: no {STATE_FILE} there")
        saved = load_training_state(self.state_path)
        if not isinstance(saved, dict) or not {"model", "optimizer", "epoch", "rng"} <= set(saved):
            held = sorted(map(str, saved))[:8] if isinstance(saved, dict) else type(saved).__name__
            raise ValueError(f"{self.state_path} is not a training state of train.py ({held})")
        try:
            state.load_state_dict(saved)
        except ValueError as e:
            raise ValueError(f"{self.state_path}: {e}") from e
        except (RuntimeError, KeyError, TypeError, IndexError) as e:  # another model, optimizer
            # load_state_dict's message: a header line, then one line per mismatched tensor
            first = " ".join(line.strip() for line in str(e).strip().splitlines()[:2])
            raise ValueError(
                f"{self.state_path} does not fit the model and optimizer of the run's settings "
                f"(were --model or --model-kwargs changed?): {first or type(e).__name__}"
            ) from e
        if self.info.is_main:
            self.remove_interrupted_saves()

    def saved_epoch(self) -> int | None:
        """The epoch of the last complete state on disk, None if there is none."""
        return saved_epoch(self.state_path)

    def save(self, state: TrainingState, kept_metrics: dict | None, improved: bool) -> None:
        """The epoch's files: best weights if `improved`, the latest weights, the state."""
        self.save_weights(
            state, kept_metrics, (BEST_WEIGHTS, LAST_WEIGHTS) if improved else (LAST_WEIGHTS,)
        )
        saved = state.state_dict()  # on every process: it gathers their RNG states
        if self.info.is_main:
            save_training_state(saved, self.state_path)

    def save_weights(
        self, state: TrainingState, kept_metrics: dict | None, names: tuple[str, ...]
    ) -> None:
        """The kept weights as each of `names` (rank 0), their epoch's metrics in the metadata."""
        if self.info.is_main:
            kept, kept_name = state.kept
            extra = {
                "weights": kept_name,
                "epoch": state.epoch,
                "top1": kept_metrics["top1"] if kept_metrics else None,
                "top5": kept_metrics["top5"] if kept_metrics else None,
                "data": self.data,
                "train_config": self.config,
            }
            fresh = getattr(state.model, "fresh_parameters", None)  # --trainable-blocks
            if fresh is not None:
                extra["fresh_parameters"] = fresh
            for name in names:
                save_weights(
                    kept, self.run_dir / name, kept.class_names, kept.model_name, extra=extra
                )


def save_yaml(data: dict, path: Path) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(yaml.safe_dump(data, sort_keys=False)))


def write_metrics_csv(history: list[dict], path: Path) -> None:
    """The whole history, rewritten each epoch: after a resume it matches the state exactly."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=METRIC_KEYS, extrasaction="ignore")
    writer.writeheader()
    for row in history:
        writer.writerow({k: ("" if row.get(k) is None else row[k]) for k in METRIC_KEYS})
    atomic_write(path, lambda tmp: tmp.write_text(buffer.getvalue()))


def saved_epoch(state_path: Path) -> int | None:
    """The epoch of the state file `state_path`, None if there is none. Read from the file (its
    tensors mapped, not read), since a kill can come between a save's rename and anything after
    it, and checkpoints are written every --checkpoint-interval epochs, not each."""
    try:
        state = torch.load(state_path, map_location="cpu", weights_only=True, mmap=True)
        return int(state["epoch"])
    except Exception:  # absent, or not a state: nothing to resume from either way
        return None
