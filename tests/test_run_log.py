"""vit.training.run_log: every epoch's row reaches metrics.csv at once; curves.png, which costs
the host ~0.3 s to draw, is redrawn at most every CURVES_REDRAW_SECONDS, after the last epoch,
and when the run stops early."""

from __future__ import annotations

import csv

import pytest

from vit.training import run_log
from vit.training.run_log import CURVES_REDRAW_SECONDS, RunLog
from vit.utils.process_group import DistInfo


def row(epoch: int) -> dict:
    return {
        "epoch": epoch,
        "train_loss": 1.0 / epoch,
        "train_acc": 0.1 * epoch,
        "test_loss": None,
        "test_top1": None,
        "test_top5": None,
        "ema_top1": None,
        "ema_top5": None,
        "lr": 1e-3,
        "epoch_seconds": 1.0,
        "train_images_per_s": 100.0,
        "data_seconds": 0.1,
        "image_size": 32,
        "finished_at": 1e9 + epoch,
    }


@pytest.fixture
def drawn(monkeypatch):
    """The epochs each drawing of curves.png showed; the clock in the test's hands."""
    shown: list[list[int]] = []
    monkeypatch.setattr(run_log, "plot_curves", lambda history: [r["epoch"] for r in history])
    monkeypatch.setattr(run_log, "save_figure", lambda epochs, path: shown.append(epochs))
    clock = {"now": 1000.0}
    monkeypatch.setattr(run_log.time, "monotonic", lambda: clock["now"])
    return shown, clock


def test_curves_are_redrawn_at_most_every_interval_and_after_the_last_epoch(tmp_path, drawn):
    shown, clock = drawn
    log = RunLog(tmp_path, DistInfo(), epochs=6, start_epoch=0)
    history: list[dict] = []
    waits = (0, 1, CURVES_REDRAW_SECONDS - 2, 1, 1, 1)  # seconds before each epoch's end
    for epoch, seconds in enumerate(waits, start=1):
        clock["now"] += seconds
        history.append(row(epoch))
        log.epoch(history[-1], history)
        rows = list(csv.DictReader(open(tmp_path / "metrics.csv")))
        assert [int(r["epoch"]) for r in rows] == list(range(1, epoch + 1))  # every epoch, now
    log.close()
    # the first epoch; the fourth, 30 s after it; the last, at once; close: nothing new to draw
    assert shown == [[1], [1, 2, 3, 4], [1, 2, 3, 4, 5, 6]]


def test_a_run_stopped_early_draws_the_epochs_it_has_not_shown(tmp_path, drawn):
    shown, clock = drawn
    log = RunLog(tmp_path, DistInfo(), epochs=10, start_epoch=0)
    history = [row(1)]
    log.epoch(history[-1], history)
    history.append(row(2))
    clock["now"] += 1
    log.epoch(history[-1], history)
    assert shown == [[1]]
    log.close()  # Ctrl-C after epoch 2
    assert shown == [[1], [1, 2]]


def test_other_ranks_write_and_draw_nothing(tmp_path, drawn):
    shown, _ = drawn
    log = RunLog(tmp_path, DistInfo(rank=1, world_size=2), epochs=1, start_epoch=0)
    log.epoch(row(1), [row(1)])
    log.close()
    assert shown == [] and list(tmp_path.iterdir()) == []


def test_a_drawing_that_fails_after_an_error_does_not_hide_it(tmp_path, drawn, monkeypatch, caplog):
    """A full disk failed the checkpoint, then the closing redraw of curves.png: its error came
    last and buried the first. In a stopped run it is a warning; in a finished one, an error."""

    def full_disk(figure, path):
        raise OSError(28, "No space left on device", str(path))

    monkeypatch.setattr(run_log, "save_figure", full_disk)
    for stopped in (True, False):
        log = RunLog(tmp_path, DistInfo(), epochs=10, start_epoch=0)
        log.undrawn = [row(1)]
        if stopped:
            log.close(stopped=True)
            assert "curves.png was not redrawn: [Errno 28] No space left" in caplog.text
        else:
            with pytest.raises(OSError, match="No space left"):
                log.close()
