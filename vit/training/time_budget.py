"""--time-budget: a run's length set by the wall time it may take, rather than guessed in epochs.

The GPU speedrun must end within five minutes for the whole command (issue 38), on whichever
GPU runs it: an H200 trained the recipe's epoch in ~1.35 s, an H100 or a busier host is slower,
a better pipeline faster, and a fixed --epochs either ends early, leaving time unused, or runs
past the limit before its learning rate has annealed. With --time-budget the run times its
epochs up to the end of epoch PLAN_AFTER_EPOCHS (settings.py; the first epoch of a start
compiles the step), with one evaluation and one checkpoint, and then, once, sets --epochs to
as many as fit in what is left:

    budget (1 - MARGIN) >= elapsed + n (epoch + evaluation / eval-interval
                                        + checkpoint / checkpoint-interval)
                           + evaluation + checkpoint           (the last epoch's, always due)
                           + what --patch-drop-anneal's final epochs add

where elapsed counts from the process's start (imports, decoding, compilation included) and an
epoch's time is all of it but its evaluation and checkpoint (the log's lines included), and an
annealed epoch costs its tokens' share more (the last, with all of them, twice a timed epoch at
--patch-drop 0.5) and, compiled, one more compilation (the first epoch's time beyond the pace):
those epochs had run past a budget that counted them at the timed pace. --epochs
as given is the first guess: the timed epochs must all be warmup (given or the default 5%
of the first guess: a first guess of 100 or more), whose rate does not depend on the run's
length; a warmup given keeps its length, the default one too where it has ended by the plan
(else it is 5% of the decided epochs), --mixup-off-epoch stays as many epochs before the end
as it was (mixing off by the plan stays off), and the default growth of --progressive-size
keeps the first guess's length. The decided settings replace the run's config.yaml
(time_budget null there), so that --resume, and a run started again from that file, take the
same epochs and the same schedule at any speed; only the EMA's default decay (2% of the steps)
follows the decided epochs from the plan on, where it had the first guess's in the timed epochs.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

from .settings import TrainConfig, patch_drop_for_epoch, resolve_warmup_epochs

# What the plan leaves unspent: epochs vary by a few percent in time (evaluations, the
# host's other work), and a run that ends a little early loses little, one that ends late
# misses its limit.
MARGIN = 0.03

_IMPORTED = time.monotonic()


def seconds_since_start() -> float:
    """Wall seconds since this process started (Linux's /proc), else since this module was
    imported (a second or two after the start: torch's import)."""
    try:
        after_name = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        started_ticks = int(after_name[19])  # field 22, starttime, in clock ticks after boot
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return uptime - started_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.monotonic() - _IMPORTED


@dataclass(frozen=True)
class Timings:
    """What the plan is made from, in seconds: since the process started, per training epoch
    (after the compiling one), one evaluation (of the model and its EMA), one checkpoint."""

    elapsed: float
    epoch: float
    evaluation: float
    checkpoint: float
    # what the compiling epoch took beyond a timed one's pace (0 where nothing compiles): the
    # price of each new token count that --patch-drop-anneal's final epochs compile
    compilation: float = 0.0


def epochs_in_budget(cfg: TrainConfig, epochs_done: int, timings: Timings) -> int:
    """The run's number of epochs in all (at least `epochs_done`) that fits cfg.time_budget."""
    per_epoch = (
        timings.epoch
        + timings.evaluation / cfg.eval_interval
        + timings.checkpoint / cfg.checkpoint_interval
    )
    left = cfg.time_budget * (1 - MARGIN) - timings.elapsed
    last_epoch_extra = timings.evaluation + timings.checkpoint  # always due after the last
    left -= last_epoch_extra + anneal_extra(cfg, timings)
    more = math.floor(left / per_epoch) if per_epoch > 0 else 0
    return epochs_done + max(0, more)


def anneal_extra(cfg: TrainConfig, timings: Timings) -> float:
    """Seconds the final epochs of --patch-drop-anneal take beyond the timed pace: each keeps
    more tokens than the timed epochs' 1 - patch_drop (the last keeps all: 2x the time at 0.5,
    counted in proportion to the tokens, attention's quadratic share left to the margin) and
    compiles the step once more for its token count."""
    if cfg.patch_drop <= 0 or cfg.patch_drop_anneal <= 0:
        return 0.0
    kept = 1 - cfg.patch_drop
    extra = 0.0
    # the annealed epochs, counted back from the last: a rate depends only on the epochs after
    # it, so the first guess's count places them as well as the decided one will
    for remaining in range(math.ceil(cfg.patch_drop_anneal)):
        rate = patch_drop_for_epoch(cfg, cfg.epochs - 1 - remaining)
        extra += timings.epoch * ((1 - rate) / kept - 1) + timings.compilation
    return extra


def planned_settings(cfg: TrainConfig, epochs: int, epochs_done: int) -> dict:
    """The settings that change when the run's length becomes `epochs` (of which `epochs_done`
    are done)."""
    changed = {"epochs": epochs, "time_budget": None}
    # A warmup given keeps its slope (a budget too short for it still ends it before the run
    # does, at half the run). The default one (5% of the first guess) stays as it ran where it
    # has ended by the plan; one still under way follows the decided epochs. (It lasts the
    # timed epochs at least: check_settings.)
    warmup = resolve_warmup_epochs(cfg)  # as given, or 5% of the first guess
    if cfg.warmup_epochs is not None:
        if warmup >= epochs:
            changed["warmup_epochs"] = epochs / 2
    elif epochs_done >= warmup and warmup < epochs:
        changed["warmup_epochs"] = warmup
    if cfg.mixup_off_epoch > epochs_done:  # the same number of final epochs without mixing
        final_unmixed = max(0, cfg.epochs - cfg.mixup_off_epoch)
        changed["mixup_off_epoch"] = max(epochs_done, epochs - final_unmixed)
    # (mixing already off by the plan stays off: turned on again, it would have mixed epochs
    # that a start again from config.yaml trains unmixed)
    if cfg.progressive_size is not None and cfg.progressive_epochs is None:
        # the default growth (half the first guess) keeps its length, as a given one does: one
        # over by the plan started again from the smallest size when it followed the decided
        # epochs, and one under way shrank the images
        changed["progressive_epochs"] = cfg.epochs / 2
    return changed


def describe_plan(cfg: TrainConfig, epochs: int, epochs_done: int, timings: Timings) -> str:
    """The log's line for the plan."""
    line = (
        f"--time-budget {cfg.time_budget:g} s: {epochs} epochs in all (--epochs {cfg.epochs} "
        f"was the first guess), {timings.elapsed:.1f} s after the start, at "
        f"{timings.epoch:.2f} s an epoch, {timings.evaluation:.2f} s an evaluation and "
        f"{timings.checkpoint:.2f} s a checkpoint"
    )
    if epochs == epochs_done:
        line += f"; the budget has no time for more than the {epochs_done} epochs done"
    return line
