"""A two-way key map between another library's tensor names and timm's.

Written as pairs of templates in which `{i}` stands for a block number, e.g.
`("encoder.layers.encoder_layer_{i}.ln_1.", "blocks.{i}.norm1.")`. A template ending in "."
is a prefix (the rest of the key, such as "weight", is carried over); any other template must
match the whole key.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

import torch


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


def rename(
    state: Mapping[str, torch.Tensor],
    keys: KeyMap,
    qkv: re.Pattern | None = None,
    ignored: Mapping[str, str | None] | None = None,
) -> tuple[dict[str, torch.Tensor], list[str], list[str]]:
    """Rename a state dict by `keys`, fusing separate q, k and v Linear layers into timm's qkv.

    qkv: matches the key of one q/k/v weight or bias with named groups `block`, `part`
        (q, k, v or query, key, value: the first letter counts) and `kind` (weight or bias).
    ignored: keys dropped on purpose -> a note for the user (None: drop silently).
    Returns (timm-named tensors, notes, keys nothing matched); the caller refuses the last.
    """
    out: dict[str, torch.Tensor] = {}
    parts: dict[tuple[int, str], dict[str, torch.Tensor]] = {}  # (block, kind) -> {q, k, v}
    notes, unknown = [], []
    for key, value in state.items():
        found = qkv.match(key) if qkv else None
        if found:
            block, kind = int(found["block"]), found["kind"]
            parts.setdefault((block, kind), {})[found["part"][0]] = value
        elif ignored and key in ignored:
            if ignored[key]:
                notes.append(f"ignored {key}, {ignored[key]}")
        elif keys.to_timm(key):
            out[keys.to_timm(key)] = value
        else:
            unknown.append(key)
    for (block, kind), qkv_parts in sorted(parts.items()):
        if sorted(qkv_parts) != ["k", "q", "v"]:
            raise ValueError(f"block {block} has a {kind} for {sorted(qkv_parts)} only, not qkv")
        # timm's qkv Linear: q's output rows, then k's, then v's
        out[f"blocks.{block}.attn.qkv.{kind}"] = torch.cat([qkv_parts[p] for p in "qkv"])
    return out, notes, unknown
