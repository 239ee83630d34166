"""The versioned codecs of the store's records: what a field holds in each format, and how
a reader tells which format a value was written in.

A record's encoding changes only with a new format (a numbered migration,
`layby.parking.migrations`). While a deployment rolls, processes of the newer release
write the older format (`layby.parking.formats`: the store's `writing`), and read both;
so a format's new encoding must be told from the one before by a tag of its own (a
prefix a value of the earlier format never has), never guessed from what it holds. A
value without a tag is in format 1.

Today format 1 is the only one: a run's metadata is JSON. (Interrupts' and
notifications' short names are in `parking.compact`; the spec of every record is
docs/stored-format.md.)
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Encoding:
    format: int
    encode: Callable[[Any], str]
    decode: Callable[[str], Any]
    tagged: Callable[[str], bool]  # whether a stored value is in this encoding


@dataclass
class Codec:
    name: str
    first: Encoding  # format 1's, which has no tag
    later: list[Encoding] = field(default_factory=list)

    def add(self, encoding: Encoding) -> Encoding:
        """The encoding of a later format (a migration's)."""
        if encoding.format <= max(e.format for e in [self.first, *self.later]):
            raise ValueError(f"{self.name}: format {encoding.format} is not after the "
                             "encodings it has")
        self.later.append(encoding)
        return encoding

    def encode(self, value: Any, format: int) -> str:
        """`value` as format `format` writes it (the newest encoding not after it)."""
        chosen = self.first
        for encoding in self.later:
            if encoding.format <= format:
                chosen = encoding
        return chosen.encode(value)

    def decode(self, raw: str) -> Any:
        for encoding in reversed(self.later):
            if encoding.tagged(raw):
                return encoding.decode(raw)
        return self.first.decode(raw)


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


# A run's metadata (the hash's `metadata` field), written only when the run has some.
RUN_METADATA = Codec("run metadata", Encoding(1, _dumps, json.loads, lambda raw: False))


def metadata(raw: str | None) -> dict[str, Any]:
    """A run's metadata as stored (none: `{}`)."""
    return RUN_METADATA.decode(raw) if raw else {}
