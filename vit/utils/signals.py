"""Signal handlers set for the length of a block, the previous ones put back after it.

Each user decides what its handler does (note the signal, raise at once, raise later);
Python runs handlers in the main thread only, so each also decides what to do elsewhere.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager


@contextmanager
def handled(signals: Sequence[int], handler: Callable) -> Iterator[None]:
    """`handler` for each of `signals` within the block (main thread only); whatever was set
    before is back after it, however the block ends."""
    previous = {signum: signal.signal(signum, handler) for signum in signals}
    try:
        yield
    finally:
        for signum, before in previous.items():
            signal.signal(signum, before)
