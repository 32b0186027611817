"""`python -m vit.distributed ARGS`: torchrun (the same ARGS, the same engine) answering as its
processes do: their exit status as its own, and none of torchrun's report of a process that
stopped (train.py's rank 0 has said why in one line) or of the Ctrl-C it passed on to them.
An --nproc_per_node it cannot start (`abc`, `0`: torchrun's traceback) is one line, status 2;
so is a Ctrl-C before the processes started (while torch loads, or at their rendezvous),
status 130.

What the processes share once started (the process group, failing together, Ctrl-C) is
`vit.utils.process_group`.
"""

from __future__ import annotations

import logging
import os
import signal
import sys

PROG = "python -m vit.distributed"
NOTHING_STARTED = f"{PROG}: interrupted before the processes started; nothing was written"


def nproc_problem(argv: list[str]) -> str | None:
    """Why torchrun's --nproc_per_node in `argv` cannot start processes (None if it can): torchrun
    answers a number it cannot read, 0 or gpu without CUDA with a traceback."""
    import torch
    from torch.distributed.run import parse_args

    value = parse_args(argv).nproc_per_node  # torchrun's own reading: its spellings, its default
    if (value.isdigit() and int(value) >= 1) or value in ("auto", "cpu"):
        return None
    if value == "gpu" and torch.cuda.is_available():
        return None
    return (
        f"{PROG}: error: --nproc_per_node {value}: processes to start; accepted: an integer >= 1, "
        f"auto, cpu, or gpu where CUDA is available"
    )


def torchrun(argv: list[str]) -> int:
    """Run torchrun with `argv` (its own arguments); return the exit status of the first
    process that failed (128 + N for signal N, as a shell says), 130 after a Ctrl-C (that
    torchrun passed on to its processes, or that came before it started them), or 0."""
    try:
        return _torchrun(argv)
    except KeyboardInterrupt:  # while torch loads or the processes meet: torchrun's traceback
        print(NOTHING_STARTED, file=sys.stderr)
        return 130


def _torchrun(argv: list[str]) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun_main

    # torchrun's own log says which process ended how: the processes say it better (train.py's
    # rank 0 in one line), and a process killed by a signal is named below.
    for name in list(logging.root.manager.loggerDict):
        if name.startswith("torch.distributed"):
            logging.getLogger(name).setLevel(logging.CRITICAL)
    problem = nproc_problem(argv)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    # what the processes' messages name as the command that continues a run: this one
    os.environ["VIT_LAUNCHER"] = PROG
    try:
        torchrun_main(argv)
    except ChildFailedError as e:
        rank, failure = e.get_first_failure()
        if failure.exitcode >= 0:
            return failure.exitcode
        name = signal.Signals(-failure.exitcode).name
        print(f"torchrun: the process of rank {rank} was ended by {name}", file=sys.stderr)
        return 128 - failure.exitcode
    except SignalException as e:  # torchrun got Ctrl-C (or SIGTERM) and passed it on
        return 128 + int(e.sigval)
    return 0


if __name__ == "__main__":
    sys.exit(torchrun(sys.argv[1:]))
