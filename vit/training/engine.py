"""The training loop: `train(cfg)` runs a whole training into a run folder.

    config.yaml            the effective configuration (flags over YAML over defaults), the
                           number of processes included
    metrics.csv            one row per epoch (train loss/acc, test loss/top-1/top-5, lr, ...)
    curves.png             loss and accuracy curves, redrawn after every epoch
    tensorboard/           the same metrics as TensorBoard events
    training_state.pt      everything `--resume` needs (`vit.training.checkpoint.TrainingState`)
    model.safetensors      the latest kept weights (EMA's where on; the final ones once done)
    best.safetensors       the kept weights (EMA's where on) with the best top-1 so far

The order `train` runs things: `vit.training.build.start`, on every process together (a failure
on one stops all: `process_group.failing_together`), builds the run's pieces and writes nothing;
then `start_run_dir` (the first write) and `run_epochs`, whose loop trains (`train_one_epoch`),
evaluates (`vit.inference.evaluation.evaluate`), logs (`vit.training.run_log.RunLog`) and saves
(`vit.training.checkpoint.CheckpointSaver`). On CPU with the same seed, a resumed run ends with
exactly the weights of an uninterrupted one.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import statistics
import time
from pathlib import Path

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from ..inference.evaluation import evaluate
from ..utils import locks, process_group
from ..utils.files import signals_held
from ..utils.process_group import DistInfo
from .build import (
    Run,
    build_schedule,
    default_run_dir,
    optimizer_steps,
    start,
    start_run_dir,
)
from .checkpoint import (
    BEST_WEIGHTS,
    CONFIG_FILE,
    LOG_FILE,
    STATE_FILE,
    TEACHER_FILE,
    CheckpointSaver,
    TrainingState,
    save_yaml,
    saved_epoch,
)
from .distillation import save_teacher
from .errors import (
    START_ERRORS,
    DiskFull,
    NonFiniteLossError,
    PeerGone,
    TrainingError,
    TrainingInterrupted,
    worker_message,
)
from .run_log import LogFile, RunLog
from .settings import (
    PLAN_AFTER_EPOCHS,
    TrainConfig,
    evaluation_split,
    image_size_for_epoch,
    mixup_on_for_epoch,
    patch_drop_for_epoch,
    resolve_ema_decay,
)
from .time_budget import (
    Timings,
    describe_plan,
    epochs_in_budget,
    planned_settings,
    seconds_since_start,
)
from .update_graph import UpdateGraph

logger = logging.getLogger("vit")


# -- training ------------------------------------------------------------------------------------
def train(cfg: TrainConfig, info: DistInfo | None = None, overwrite: bool = False) -> dict:
    """Train per `cfg` into its run folder; returns the last epoch's metrics row.

    Nothing is written until the data, model, loaders and (for --resume) the saved state are
    ready, so a failed start leaves no run folder behind. `overwrite`: the folder holds a
    previous run (train.py refuses it otherwise), whose files are removed at that point.
    Raises NonFiniteLossError (leaving the last checkpoint untouched) if the loss diverges,
    TrainingInterrupted on Ctrl-C, and, under DDP, a start that fails on any process on every
    process (`process_group.failing_together`), PeerGone once another process has ended.
    """
    info = info or DistInfo()
    if cfg.processes is None:  # recorded in config.yaml: --resume continues with as many
        cfg.processes = info.world_size
    elif cfg.processes != info.world_size:
        raise ValueError(
            f"--processes {cfg.processes}: this start has {info.world_size} process(es); "
            f"start {cfg.processes} (torchrun --nproc_per_node {cfg.processes}), or leave the "
            f"setting out (processes: null in a YAML file)"
        )
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    device = process_group.resolve_device(cfg.device, info)
    if cfg.amp and cfg.amp_dtype == "float16" and device.type == "cpu" and info.is_main:
        logger.warning(
            "--amp --amp-dtype float16 on a CPU: float16 matrix products are emulated there "
            "(about 20x slower than float32); use --amp-dtype bfloat16, or no --amp"
        )
    process_group.setup(info, device)
    leave_group = True
    try:
        return _train(cfg, info, device, overwrite)
    except TrainingInterrupted:
        # Rank 0 left first (see process_group.stop_on_interrupt): the others' process group is
        # broken, and taking it down can abort the process.
        leave_group = info.is_main
        raise
    except TrainingError:  # this process's own, met while training: as before
        raise
    except START_ERRORS:
        # A start refused on every process together (failing_together): rank 0 says why and
        # leaves; another's teardown of the group can then abort it ("terminate called without
        # an active exception", SIGABRT, seen once in a suite run), so only rank 0 takes it down
        # and the others leave without one (train.py).
        leave_group = info.is_main
        raise
    except Exception as e:
        if not (info.enabled and process_group.peer_gone(e)):
            raise
        leave_group = False  # broken by the process that ended, as by Ctrl-C above
        raise PeerGone() from e
    finally:
        if leave_group:
            process_group.cleanup()


def _train(cfg: TrainConfig, info: DistInfo, device: torch.device, overwrite: bool) -> dict:
    if cfg.output_dir is None:
        cfg.output_dir = default_run_dir(cfg, info)
    run_dir = Path(cfg.output_dir)
    saver = CheckpointSaver(run_dir, info, data=cfg.data, config=cfg.to_dict())
    started = False  # whether this start wrote the run folder
    lock = contextlib.ExitStack()  # rank 0's hold on the run folder: one writer at a time
    log_file = LogFile()  # train.log: rank 0's lines, held until the folder is written
    if info.is_main:
        logger.addHandler(log_file)
    try:
        # The lock first, in a block of its own: every process knows whether rank 0 got it
        # before any enters start(), whose collectives a refused rank 0 would never reach.
        with process_group.failing_together(info, START_ERRORS):
            if info.is_main:
                lock.enter_context(locks.hold(run_dir, folder=True))
        with process_group.failing_together(info, START_ERRORS):
            run = start(cfg, info, device, saver)
        if info.is_main:  # everything is ready, on every process: the run folder can be written
            start_run_dir(run_dir, cfg, overwrite)
            log_file.open(run_dir / LOG_FILE)
            started = True
            if run.teacher is not None and not cfg.resume:  # what --resume distils from
                save_teacher(run.teacher, run_dir / TEACHER_FILE, run.teacher_facts)
        if run.probed is not None:  # the probed head, before any step: the best so far
            saver.save_weights(run.state, run.probed, (BEST_WEIGHTS,))
        split = evaluation_split(cfg)
        log = RunLog(run_dir, info, cfg.epochs, start_epoch=run.state.epoch, split=split)
        stopped = True  # until the last epoch is done: by an error or Ctrl-C
        try:
            log.start(run, num_images=run.num_images)
            row = run_epochs(run, saver, log)
            stopped = False
            return row
        except START_ERRORS as e:
            raise TrainingError(worker_message(e)) from e  # a worker's: its message alone
        finally:
            log.close(stopped=stopped)
    except BaseException as e:
        if started and isinstance(e, OSError) and e.errno == errno.ENOSPC:  # rank 0's writes
            raise DiskFull(str(run_dir), saver.saved_epoch(), cfg.epochs, e) from None
        if not interrupted(e, info):
            raise
        if not (started or cfg.resume):  # nothing written: a run --overwrite would replace
            raise TrainingInterrupted(None, None, cfg.epochs) from None  # is left as it was
        epoch = saver.saved_epoch() if info.is_main else None
        raise TrainingInterrupted(str(run_dir), epoch, cfg.epochs) from None
    finally:
        logger.removeHandler(log_file)
        log_file.close()
        lock.close()


def interrupted(error: BaseException, info: DistInfo) -> bool:
    """Whether `error` ended the run because of Ctrl-C: a KeyboardInterrupt, or, on a process
    other than rank 0, a collective broken by rank 0 leaving for it (see
    `process_group.stop_on_interrupt`)."""
    if isinstance(error, KeyboardInterrupt):
        return True
    return isinstance(error, Exception) and not info.is_main and process_group.interrupted()


def run_epochs(run: Run, saver: CheckpointSaver, log: RunLog) -> dict:
    """The epoch loop, from the state's epoch to cfg.epochs (which --time-budget sets once, at
    the end of epoch PLAN_AFTER_EPOCHS); returns the last metrics row."""
    cfg, state = run.cfg, run.state
    row: dict = state.history[-1] if state.history else {}
    paces: list[float] = []  # each epoch of this start, in seconds, evaluation and save aside
    while state.epoch < cfg.epochs:
        epoch = state.epoch
        began = time.perf_counter()
        size = start_epoch(run, epoch)
        training = time.perf_counter()
        stats = train_one_epoch(run, epoch=epoch)
        seconds = time.perf_counter() - training
        # The plan's epoch also evaluates and saves, to time them. A start resumed after it
        # (killed between its checkpoint and its config.yaml) plans at its first epoch's end.
        plans = cfg.time_budget is not None and epoch + 1 >= PLAN_AFTER_EPOCHS
        due = plans or ends_period(epoch, cfg.eval_interval, cfg.epochs)
        evaluating = time.perf_counter()
        test, ema_test = evaluate_epoch(run) if due else (None, None)
        evaluation_seconds = time.perf_counter() - evaluating
        row = metrics_row(
            epoch=epoch,
            stats=stats,
            test=test,
            ema_test=ema_test,
            seconds=seconds,
            size=size,
            world_size=run.info.world_size,
        )
        kept_metrics = ema_test if state.ema is not None else test  # see TrainingState.kept
        improved = state.end_epoch(row, kept_metrics)
        # the epoch's row and its checkpoint are written together: a Ctrl-C between them once
        # left a row (and weights) whose state was not saved, a first epoch lost whole
        with signals_held():
            log.epoch(row, state.history)
            saving = time.perf_counter()
            if plans or improved or ends_period(epoch, cfg.checkpoint_interval, cfg.epochs):
                saver.save(state, kept_metrics, improved)
            checkpoint_seconds = time.perf_counter() - saving
        paces.append(time.perf_counter() - began - evaluation_seconds - checkpoint_seconds)
        if plans:
            # the first epoch of a start compiles: the pace is the others', where it has any
            pace = statistics.mean(paces[1:] or paces)
            timings = Timings(
                elapsed=seconds_since_start(),
                epoch=pace,
                evaluation=evaluation_seconds,
                checkpoint=checkpoint_seconds,
                compilation=max(0.0, paces[0] - pace) if cfg.compile else 0.0,
            )
            plan_epochs(run, saver, log, timings)
        process_group.barrier()
    return row


def plan_epochs(run: Run, saver: CheckpointSaver, log: RunLog, timings: Timings) -> None:
    """--time-budget: set the run's epochs to as many as fit, and what follows from them (the
    schedule, the EMA's horizon, config.yaml), in every process as rank 0 decides."""
    cfg, state, done = run.cfg, run.state, run.state.epoch
    epochs = [epochs_in_budget(cfg, done, timings)]
    if run.info.enabled:  # each process timed its own epochs: all take rank 0's plan
        torch.distributed.broadcast_object_list(epochs, src=0)
    if run.info.is_main:
        logger.info(describe_plan(cfg, epochs[0], done, timings))
    for key, value in planned_settings(cfg, epochs[0], done).items():
        setattr(cfg, key, value)
    steps_per_epoch = optimizer_steps(cfg, len(run.train_loader))
    # The step the last scheduler.step() set up keeps its rate, as it would after --resume
    # (the optimizer's saved state holds it); the schedule's new shape starts from the next.
    schedule = build_schedule(cfg, steps_per_epoch)
    state.scheduler.lr_lambdas = [schedule] * len(state.optimizer.param_groups)
    if state.ema is not None:
        state.ema.decay = resolve_ema_decay(cfg, cfg.epochs * steps_per_epoch)
    state.config = saver.config = cfg.to_dict()
    log.epochs = cfg.epochs
    if run.info.is_main:  # what --resume and a start again from it read
        save_yaml(state.config, Path(cfg.output_dir) / CONFIG_FILE)


def ends_period(epoch: int, interval: int, epochs: int) -> bool:
    """Whether `epoch` (counted from 0) is every `interval`-th of the run's or its last: when
    --eval-interval evaluates and --checkpoint-interval writes."""
    return (epoch + 1) % interval == 0 or epoch + 1 == epochs


def start_epoch(run: Run, epoch: int) -> int:
    """Set what changes from epoch to epoch (the shuffle and augmentations, the image size, the
    patch-drop rate, whether MixUp/CutMix mixes); returns the epoch's image size."""
    cfg = run.cfg
    size = image_size_for_epoch(
        cfg,
        epoch,
        final=run.model.preprocess.input_size[0],
        patch=run.model.patch_embed.patch_size[0],
    )
    run.train_loader.set_epoch(epoch, size)
    run.model.patch_drop.prob = patch_drop_for_epoch(cfg, epoch)
    if run.mixup is not None:
        run.mixup.enabled = mixup_on_for_epoch(cfg, epoch)
    return size


def evaluate_epoch(run: Run) -> tuple[dict, dict | None]:
    """Test metrics of the model and of its EMA (None without one)."""
    settings = {
        "loader": run.test_loader,
        "num_classes": run.model.num_classes,
        "device": run.device,
        "amp": run.cfg.amp,
        "amp_dtype": run.cfg.amp_dtype,
        "progress": run.info.is_main,
    }
    test = evaluate(run.model, **settings)
    ema_test = evaluate(run.state.ema.module, **settings) if run.state.ema is not None else None
    return test, ema_test


def metrics_row(
    *,
    epoch: int,
    stats: dict,
    test: dict | None,
    ema_test: dict | None,
    seconds: float,
    size: int,
    world_size: int,
) -> dict:
    """One metrics.csv row (see `vit.training.checkpoint.METRIC_KEYS`); test columns None when the
    epoch was not evaluated."""
    return {
        "epoch": epoch + 1,
        "train_loss": stats["loss"],
        "train_acc": stats["acc"],
        "test_loss": test["loss"] if test else None,
        "test_top1": test["top1"] if test else None,
        "test_top5": test["top5"] if test else None,
        "ema_top1": ema_test["top1"] if ema_test else None,
        "ema_top5": ema_test["top5"] if ema_test else None,
        "lr": stats["lr"],
        "epoch_seconds": seconds,
        "train_images_per_s": stats["images"] * world_size / seconds,
        "data_seconds": stats["data_seconds"],
        "image_size": size,
        "finished_at": time.time(),
    }


# Steps between the checks that read device values on the host (the non-finite loss check,
# the progress bar's figures): each read waits for the GPU to finish all queued work, and a
# wait every step keeps the host from queueing the next step's kernels while the GPU runs.
HOST_SYNC_EVERY = 25


def train_one_epoch(run: Run, epoch: int) -> dict:
    """One pass over the training data; returns mean loss, accuracy, last lr, image count, and
    the seconds the loop waited for batches."""
    cfg, info, device = run.cfg, run.info, run.device
    run.train_model.train()
    sums = torch.zeros(2, dtype=torch.float64, device=device)  # loss sum, correct
    first_bad = torch.full((2,), -1.0, dtype=torch.float64, device=device)  # (step, loss)
    images, data_seconds = 0, 0.0
    started = time.perf_counter()
    loader = run.train_loader
    # disable=None: a bar on a terminal only, not in a log redirected to a file
    bar = tqdm(
        loader, desc=f"epoch {epoch + 1}/{cfg.epochs}", disable=None if info.is_main else True
    )
    fetch_started = time.perf_counter()
    accum = cfg.grad_accum_steps
    for step, (batch_images, labels) in enumerate(bar):
        data_seconds += time.perf_counter() - fetch_started
        batch_images = batch_images.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)
        # --grad-accum-steps: this batch is part `part` of an optimizer step over `parts`
        # batches (fewer for the epoch's last step, over the batches left)
        first = step - step % accum
        part, parts = step - first, min(accum, len(loader) - first)
        logits, loss, lr = train_step(run, batch_images, labels, part=part, parts=parts)
        first_bad = tally(sums, first_bad, step=step, loss=loss, logits=logits, labels=labels)
        last = step + 1 == len(loader)
        if (step + 1) % HOST_SYNC_EVERY == 0 or last:
            stop_if_diverged(run, first_bad, epoch=epoch, step=step)
        images += labels.shape[0]
        if not bar.disable and ((step + 1) % HOST_SYNC_EVERY == 0 or last):
            bar.set_postfix(
                loss=f"{sums[0].item() / images:.4f}",
                acc=f"{100 * sums[1].item() / images:.1f}%",
                lr=f"{lr:.2e}",
                img_s=f"{images * info.world_size / (time.perf_counter() - started):.0f}",
            )
        process_group.stop_if_interrupted(info)
        fetch_started = time.perf_counter()
    totals = torch.cat([sums, torch.tensor([float(images)], dtype=torch.float64, device=device)])
    process_group.all_reduce_sum(totals)
    return {
        "loss": totals[0].item() / totals[2].item(),
        "acc": totals[1].item() / totals[2].item(),
        "lr": lr,
        "images": images,
        "data_seconds": data_seconds,
    }


def tally(
    sums: torch.Tensor,
    first_bad: torch.Tensor,
    *,
    step: int,
    loss: torch.Tensor,
    logits: torch.Tensor,
    labels: torch.Tensor,
) -> torch.Tensor:
    """A step's loss (summed over its images) and correct predictions added to `sums` (2,) in
    place; returns `first_bad` (2,), (step, loss) of the epoch's first loss that is not
    finite, -1 until then. On the device, no value read back: the host goes on to the next
    step."""
    loss_now = loss.double()
    first_bad = torch.where(
        (first_bad[0] < 0) & ~torch.isfinite(loss_now),
        torch.stack([torch.full_like(loss_now, step), loss_now]),
        first_bad,
    )
    correct = (logits.argmax(dim=1) == labels).sum()
    sums += torch.stack([loss_now * labels.shape[0], correct.double()])
    return first_bad


def stop_if_diverged(run: Run, first_bad: torch.Tensor, epoch: int, step: int) -> None:
    """NonFiniteLossError if any process's loss was NaN or inf by `step`: every process must
    agree to stop, or the others would wait forever in all-reduce."""
    bad = (first_bad[0] >= 0).double()
    if process_group.all_reduce_sum(bad).item() > 0:
        bad_step, loss = first_bad.tolist()
        if bad_step < 0:  # another process's loss: this one's is still finite
            bad_step, loss = step, float("nan")
        message = diverged_message(run.cfg, loss, epoch, int(bad_step), len(run.train_loader))
        raise NonFiniteLossError(message)


def diverged_message(cfg: TrainConfig, loss: float, epoch: int, step: int, steps: int) -> str:
    """What a NaN/inf loss stopped, and what is left to resume from (if anything)."""
    saved = saved_epoch(Path(cfg.output_dir) / STATE_FILE)
    if saved is not None:
        kept = f"The last complete checkpoint (end of epoch {saved}) is kept in {cfg.output_dir}"
    else:
        kept = "No checkpoint was written: the loss diverged before the run's first checkpoint"
    return (
        f"training loss became {loss} at epoch {epoch + 1}, step {step + 1}/{steps}; stopped. "
        f"{kept}. Try a lower --lr, --clip-grad, or --amp-dtype bfloat16."
    )


def train_step(
    run: Run, images: torch.Tensor, labels: torch.Tensor, part: int = 0, parts: int = 1
) -> tuple[torch.Tensor, torch.Tensor, float]:
    """One optimizer step on a batch, or with --grad-accum-steps part `part` (from 0) of one
    over `parts` batches: (logits (B, K), loss, the learning rate the step takes), detached.
    --graph-step's graph takes it where there is one (until CUDA refuses its capture), else
    the forward pass and `optimizer_step`."""
    state = run.state
    if parts > 1:
        logits, loss = accumulate_gradients(run, images, labels, part=part, parts=parts)
        lr = top_lr(state.optimizer)
        if part + 1 == parts:
            apply_update(state, run.cfg.clip_grad, update=run.update)
        return logits, loss, lr
    if run.step is None or not run.step.capturable:
        logits, loss = forward_loss(run, images, labels)
        lr = optimizer_step(state, loss, run.cfg.clip_grad, update=run.update)
        return logits.detach(), loss.detach(), lr
    lr = top_lr(state.optimizer)
    logits, loss = run.step(*mixed(run, images, labels))
    state.scheduler.step()
    return logits, loss, lr


def mixed(run: Run, images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(images, targets): MixUp/CutMix's mixed images and soft targets (B, K), smoothing
    included, when on; else the batch as it is. The mixing stays outside `run.forward_loss`
    (compiled with --compile) and --graph-step's graph: its boxes are drawn on the host, and a
    graph would be made again for each."""
    if run.mixup is None:
        return images, labels
    return run.mixup(images, labels)


def forward_loss(
    run: Run, images: torch.Tensor, labels: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits (B, K), loss): on MixUp/CutMix's soft targets when on, else on label-smoothed
    labels."""
    return run.forward_loss(*mixed(run, images, labels))


def accumulate_gradients(
    run: Run, images: torch.Tensor, labels: torch.Tensor, *, part: int, parts: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward and backward pass of one of an optimizer step's `parts` batches, its
    gradients added to those of the parts before it: (logits (B, K), loss), detached. Each
    part's loss counts 1/parts, so the step's gradient is their mean, as one batch of all of
    their images would give (batches of the same size). Under torchrun the processes exchange
    gradients once a step, on its last part, not on every batch."""
    state = run.state
    if part == 0:
        state.optimizer.zero_grad(set_to_none=True)
    exchange = part + 1 == parts or not isinstance(run.train_model, DistributedDataParallel)
    with contextlib.nullcontext() if exchange else run.train_model.no_sync():
        logits, loss = forward_loss(run, images, labels)
        state.scaler.scale(loss / parts).backward()
    return logits.detach(), loss.detach()


def top_lr(optimizer: torch.optim.Optimizer) -> float:
    """The learning rate the next step takes (metrics.csv's lr): the first group's, which is
    Muon's where Muon trains matrices (--opt muon: --muon-lr's), else AdamW's; under
    --layer-decay, its rate at the top (the rate before layer decay), as the log's line of
    rates by depth gives it (`finetune.describe_layer_decay`)."""
    group = optimizer.param_groups[0]
    return group["lr"] / group.get("lr_scale", 1.0)


def optimizer_step(
    state: TrainingState,
    loss: torch.Tensor,
    clip_grad: float | None,
    update: UpdateGraph | None = None,
) -> float:
    """Backward, clip, step, EMA (one CUDA graph's replay with `update`, --graph-update),
    schedule; returns the learning rate the step used."""
    optimizer = state.optimizer
    optimizer.zero_grad(set_to_none=True)
    state.scaler.scale(loss).backward()
    lr = top_lr(optimizer)
    apply_update(state, clip_grad, update=update)
    return lr


def apply_update(
    state: TrainingState, clip_grad: float | None, update: UpdateGraph | None = None
) -> None:
    """Clip the gradients the backward passes left, step, EMA (one CUDA graph's replay with
    `update`, --graph-update), schedule."""
    optimizer, scaler = state.optimizer, state.scaler
    if update is not None and update.capturable:  # the same clipping to clip_grad, step and EMA
        update()
    else:  # also once CUDA refused the update's capture: uncaptured, this is the faster way
        if clip_grad:  # 0 or None: no clipping
            scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
            nn.utils.clip_grad_norm_(state.model.parameters(), clip_grad)
        scaler.step(optimizer)
        scaler.update()
        if state.ema is not None:
            state.ema.update(state.model)
    state.scheduler.step()
