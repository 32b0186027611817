"""`python -m vit.distributed ARGS`: torchrun (the same ARGS, the same engine) answering as its
processes do: their exit status as its own, and none of torchrun's report of a process that
stopped (train.py's rank 0 has said why in one line) or of the Ctrl-C it passed on to them.

What the processes share once started (the process group, failing together, Ctrl-C) is
`vit.utils.process_group`.
"""

from __future__ import annotations

import logging
import signal
import sys


def torchrun(argv: list[str]) -> int:
    """Run torchrun with `argv` (its own arguments); return the exit status of the first
    process that failed (128 + N for signal N, as a shell says), 130 after a Ctrl-C that
    torchrun passed on to its processes, or 0."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun_main

    # torchrun's own log says which process ended how: the processes say it better (train.py's
    # rank 0 in one line), and a process killed by a signal is named below.
    for name in list(logging.root.manager.loggerDict):
        if name.startswith("torch.distributed"):
            logging.getLogger(name).setLevel(logging.CRITICAL)
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
