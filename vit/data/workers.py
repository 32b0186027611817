"""How many cores this process may use, and data loader processes by default (os only:
`--help` shows the default)."""

from __future__ import annotations

import os


def usable_cores() -> int:
    """The cores this process may use (its affinity on Linux, the machine's elsewhere)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def default_workers() -> int:
    """Data loader processes by default: one per spare core, at most 4 (on 2 cores: 1, which
    keeps DataLoader from warning that 4 workers exceed the machine)."""
    return max(0, min(4, usable_cores() - 1))
