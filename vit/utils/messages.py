"""An exception's message as the one line a command prints: lines joined, long lists cut.

The library raises exceptions carrying every fact (all 200 missing keys of a weights file); a
command line prints one line, so it shows the first few items of a list and how many there are.
"""

from __future__ import annotations

import re
from pathlib import Path


def one_line(error: BaseException | str, *paths: Path | str) -> str:
    """An error's message (or a message) as one line, without a leading path (the caller names
    it): its lines joined, more than four cut to four and a count, each bracketed list cut after
    four items."""
    if isinstance(error, str):
        text = error
    else:  # a KeyError's str() is its message quoted: take the message itself
        text = error.args[0] if error.args and isinstance(error.args[0], str) else str(error)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) > 4:
        lines = lines[:4] + [f"... ({len(lines) - 4} more)"]
    joined = lines[0] if lines else type(error).__name__
    for line in lines[1:]:
        joined += (" " if joined.endswith(":") else "; ") + line
    joined = re.sub(r"\[([^\[\]]*)\]", _first_items, joined)
    for path in paths:
        for prefix in (f"{path}: ", f"{path} "):
            if joined.startswith(prefix):
                return joined[len(prefix) :]
    return joined


def _first_items(match: re.Match, shown: int = 4) -> str:
    """A bracketed list of a message, cut after `shown` items (200 missing keys in one line)."""
    items = match.group(1).split(", ")
    if len(items) <= shown + 1:
        return match.group(0)
    return f"[{', '.join(items[:shown])}, ... ({len(items)} in all)]"
