"""How a training run fails: the kinds of failure train.py answers, each in one line."""

from __future__ import annotations

from ..utils.locks import LockError


class NonFiniteLossError(RuntimeError):
    """The training loss became NaN or infinite; the last good checkpoint is kept."""


class TrainingInterrupted(Exception):
    """Ctrl-C stopped the run (every process raises it).

    run_dir: the run folder, None if this start wrote nothing (a fresh run, before its folder
    was made); epoch: the epoch of the folder's last complete checkpoint (known to rank 0),
    None if it holds none; epochs: the run's length."""

    def __init__(self, run_dir: str | None, epoch: int | None, epochs: int) -> None:
        super().__init__(f"interrupted; last checkpoint: epoch {epoch} of {epochs} in {run_dir}")
        self.run_dir, self.epoch, self.epochs = run_dir, epoch, epochs


class DiskFull(TrainingInterrupted):
    """Rank 0 could not write the run's files (no space left on the device, `error`): stopped
    as Ctrl-C stops it, the last complete checkpoint kept for --resume once there is room."""

    def __init__(self, run_dir: str, epoch: int | None, epochs: int, error: OSError) -> None:
        super().__init__(run_dir, epoch, epochs)
        self.error = error


class PeerGone(Exception):
    """Another process of the run ended (killed, or out on its own error), breaking this one's
    collectives: torchrun, or that process, says why; this one has nothing to add."""


# What a start can find wrong in the settings, the data, the model, a resumed state or the run
# folder (another process writing there): one line for the user (train.py exits with status 2),
# raised by every process together.
START_ERRORS = (ValueError, FileNotFoundError, LockError)


class TrainingError(ValueError):
    """One of START_ERRORS met while training (an image that cannot be read) by this process
    alone, which says it itself (a start's is said by rank 0 for every process)."""


def worker_message(error: BaseException) -> str:
    """The message of `error`; of one a DataLoader worker process raised, the worker's own
    ("cannot read image PATH: ..."): torch raises it again in the main process with its text
    replaced by "Caught X in DataLoader worker process N." and the worker's whole traceback."""
    text = str(error)
    if not (text.startswith("Caught ") and "\nOriginal Traceback" in text):
        return text
    # the traceback's last line: "vit.data.images.CorruptImageError: cannot read image ..."
    name, _, message = text.rstrip().splitlines()[-1].partition(": ")
    return message if name.split(".")[-1] == type(error).__name__ else text
