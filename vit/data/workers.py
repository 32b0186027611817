"""How many data loader processes to use by default (os only: `--help` shows the default)."""

from __future__ import annotations

import os


def default_workers() -> int:
    """Data loader processes by default: one per spare core, at most 4 (on 2 cores: 1, which
    keeps DataLoader from warning that 4 workers exceed the machine)."""
    try:
        cores = len(os.sched_getaffinity(0))  # the cores this process may use
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(0, min(4, cores - 1))
