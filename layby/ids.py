"""Fresh random identifiers: strings of letters drawn from the system's randomness, many
from one read of it when a caller must try several (a run id that must fit a shard, a
reviewer token's ref that must fit its run's)."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from functools import cache

# Strings drawn from one read when one must fit (a shard of a store's 48): about 48 are
# made before one lands where it must, and a read each was 48 system calls at every start
# with an idempotency key, and at every notification of a park.
FITTING_AT_ONCE = 64


def first_fitting(alphabet: str, length: int, fits: Callable[[str], bool] | None,
                  prefix: str = "") -> str:
    """A fresh `prefix` and `length` random letters of `alphabet`; with `fits`, the first
    such string it accepts (drawn FITTING_AT_ONCE to a read of the randomness)."""
    if fits is None:
        return prefix + next(random_strings(alphabet, length))
    drawn = (prefix + letters for letters in random_strings(alphabet, length, FITTING_AT_ONCE))
    return next(found for found in drawn if fits(found))


def random_strings(alphabet: str, length: int, at_once: int = 1) -> Iterator[str]:
    """Random strings of `length` letters of `alphabet` (at most 256 letters), without end,
    about `at_once` from each read of the randomness (a system call, `getrandom`: one a try
    was 48 of them at every start in a store of 48 shards). Every string is as likely as
    any other: a random byte becomes a letter by a table, and the bytes past the last whole
    multiple of the alphabet's size are dropped."""
    table, dropped = _tables(alphabet)
    wanted = length * at_once
    # A few more bytes than letters when some are dropped (3 % for 62 letters).
    size = wanted * 11 // 10 + 4 if dropped else wanted
    while True:
        letters = secrets.token_bytes(size).translate(table, dropped).decode()
        for at in range(0, len(letters) - length + 1, length):
            yield letters[at:at + length]


@cache
def _tables(alphabet: str) -> tuple[bytes, bytes]:
    """The byte → letter table of `alphabet` and the bytes to drop."""
    if not 0 < len(alphabet) <= 256:
        raise ValueError(f"an alphabet of 1 to 256 letters, not {len(alphabet)}")
    even = 256 // len(alphabet) * len(alphabet)
    table = bytes(ord(alphabet[b % len(alphabet)]) for b in range(256))
    return table, bytes(range(even, 256))
