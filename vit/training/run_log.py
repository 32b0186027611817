"""Rank 0's record of a run as it goes: TensorBoard, metrics.csv, curves.png and the log lines
(on the terminal and in train.log)."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from ..utils.plots import plot_curves, save_figure
from ..utils.process_group import DistInfo
from .build import Run, optimizer_steps
from .checkpoint import CURVES_FILE, METRICS_FILE, TENSORBOARD_DIR, write_metrics_csv

logger = logging.getLogger("vit")

# curves.png is for a person to look at, and drawing it costs ~0.3 s of the host (matplotlib's
# layout and PNG encoding), which a GPU epoch of ~1 s would wait for: it is redrawn at most this
# often, and after the last epoch. metrics.csv and TensorBoard get every epoch at once.
CURVES_REDRAW_SECONDS = 30.0


class RunLog:
    """Rank 0's record of the run as it goes: TensorBoard, metrics.csv, curves.png, the log.
    Other ranks hold a RunLog that does nothing."""

    def __init__(
        self, run_dir: Path, info: DistInfo, epochs: int, start_epoch: int, split: str = "test"
    ) -> None:
        """split: what the epochs are evaluated on, as the log lines name it ("test", or
        "validation" under --val-split; metrics.csv's test_* columns hold it either way)."""
        self.run_dir, self.epochs, self.writer, self.split = run_dir, epochs, None, split
        self.drawn_at = -float("inf")  # time.monotonic() of the last curves.png
        self.undrawn: list[dict] | None = None  # a history curves.png does not show yet
        if info.is_main:
            from torch.utils.tensorboard import SummaryWriter  # slow import: rank 0 only

            self.writer = SummaryWriter(str(run_dir / TENSORBOARD_DIR), purge_step=start_epoch + 1)

    def start(self, run: Run, num_images: int) -> None:
        if self.writer is None:
            return
        write_metrics_csv(run.state.history, self.run_dir / METRICS_FILE)  # drop later rows
        batches, accum = len(run.train_loader), run.cfg.grad_accum_steps
        steps = f"{batches} step(s) per epoch"
        if accum > 1:  # --grad-accum-steps
            steps = f"{batches} batches per epoch in {optimizer_steps(run.cfg, batches)} step(s)"
        logger.info(
            "training %s (%.2fM parameters) on %d images, %d classes, %s, %d process(es), "
            "device %s",
            run.cfg.model,
            sum(p.numel() for p in run.model.parameters()) / 1e6,
            num_images,
            run.model.num_classes,
            steps,
            run.info.world_size,
            run.device,
        )

    def epoch(self, row: dict, history: list[dict]) -> None:
        if self.writer is None:
            return
        for key, value in row.items():
            if key not in ("epoch", "finished_at") and value is not None:  # TensorBoard keeps
                # each value's wall time itself
                self.writer.add_scalar(key, value, row["epoch"])
        self.writer.flush()
        logger.info(epoch_summary(row, self.epochs, self.split))
        write_metrics_csv(history, self.run_dir / METRICS_FILE)
        self.undrawn = history
        last = row["epoch"] == self.epochs
        if last or time.monotonic() - self.drawn_at >= CURVES_REDRAW_SECONDS:
            self.draw_curves()

    def draw_curves(self) -> None:
        if self.undrawn:
            save_figure(plot_curves(self.undrawn), self.run_dir / CURVES_FILE)
            self.drawn_at, self.undrawn = time.monotonic(), None

    def close(self, stopped: bool = False) -> None:
        """Also draws the epochs curves.png does not show yet (a run stopped by Ctrl-C). In a
        run `stopped` by an error, a drawing that fails too (a full disk fails both) is a
        warning: the error that stopped the run is the one to tell."""
        if self.writer is None:
            return
        try:
            self.draw_curves()
        except Exception as e:
            if not stopped:
                raise
            logger.warning("curves.png was not redrawn: %s", e)
        finally:
            self.writer.close()


class LogFile(logging.Handler):
    """The run's log lines kept in its folder (train.log), as the terminal shows them: the lines
    of a start are held until its folder is written (`open`), so that a refused start leaves no
    file, then written with the rest; a resumed run's are appended to its earlier ones."""

    FORMAT = "%(asctime)s %(levelname)s %(message)s"  # the terminal's too (train.py)

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.setFormatter(logging.Formatter(self.FORMAT))
        self.held: list[logging.LogRecord] | None = []
        self.file = None

    def open(self, path: Path) -> None:
        self.file = open(path, "a", encoding="utf-8")  # noqa: SIM115 (closed by close())
        for record in self.held or ():
            self.emit(record)
        self.held = None

    def emit(self, record: logging.LogRecord) -> None:
        if self.file is None:
            self.held.append(record)
            return
        self.file.write(self.format(record) + "\n")
        self.file.flush()  # a killed run's log ends where it stopped

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None
        super().close()


def epoch_summary(row: dict, epochs: int, split: str = "test") -> str:
    """'epoch 3/10: train loss 1.2345, test loss ..., 812 img/s at 32x32'."""
    test = ""
    if row["test_top1"] is not None:
        test = (
            f", {split} loss {row['test_loss']:.4f}, top-1 {100 * row['test_top1']:.2f}%, "
            f"top-5 {100 * row['test_top5']:.2f}%"
        )
    if row["ema_top1"] is not None:
        test += f", EMA top-1 {100 * row['ema_top1']:.2f}%"
    return (
        f"epoch {row['epoch']}/{epochs}: train loss {row['train_loss']:.4f}{test}, "
        f"{row['train_images_per_s']:.0f} img/s at {row['image_size']}x{row['image_size']}"
        f"{data_wait(row)}"
    )


def data_wait(row: dict) -> str:
    """', 12% of it waiting for batches': where the loader, not the step, set the pace."""
    if row.get("data_seconds") is None or not row.get("epoch_seconds"):
        return ""  # a row of a run saved before the column existed
    return f", {100 * row['data_seconds'] / row['epoch_seconds']:.0f}% of it waiting for batches"
