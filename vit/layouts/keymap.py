"""A two-way key map between another library's tensor names and timm's.

Written as pairs of templates in which `{i}` stands for a block number, e.g.
`("encoder.layers.encoder_layer_{i}.ln_1.", "blocks.{i}.norm1.")`. A template ending in "."
is a prefix (the rest of the key, such as "weight", is carried over); any other template must
match the whole key.
"""

from __future__ import annotations

import re
from collections.abc import Iterable


def _compile(template: str) -> re.Pattern:
    pattern = re.escape(template).replace(re.escape("{i}"), r"(?P<i>\d+)")
    return re.compile(f"^{pattern}" + ("(?P<rest>.+)$" if template.endswith(".") else "$"))


class KeyMap:
    """Rename keys template by template, in either direction."""

    def __init__(self, pairs: Iterable[tuple[str, str]]) -> None:
        self.pairs = list(pairs)
        self._theirs = [(_compile(theirs), ours) for theirs, ours in self.pairs]
        self._ours = [(_compile(ours), theirs) for theirs, ours in self.pairs]

    @staticmethod
    def _rename(key: str, table: list[tuple[re.Pattern, str]]) -> str | None:
        for pattern, template in table:
            found = pattern.match(key)
            if found:
                groups = found.groupdict()
                renamed = template.replace("{i}", groups.get("i") or "")
                return renamed + (groups.get("rest") or "")
        return None

    def to_timm(self, key: str) -> str | None:
        """Their key -> timm's, or None when no template matches."""
        return self._rename(key, self._theirs)

    def from_timm(self, key: str) -> str | None:
        """timm's key -> theirs, or None when no template matches."""
        return self._rename(key, self._ours)
