"""Format 3, which exists only in the tests (tests/upgrades/test_rolling.py), on top of the real
format 2 (the sharded layout, migration 2): a run's metadata is stored compressed, "z:" and
the base64 of its zlib'd JSON. A process that imports this module is "the newer release":
its code knows format 3 (migration 3, registered here) and reads both encodings; one that
does not is "the older release", whose code reads formats 1–2 only, and would fail on a
compressed value: so the newer one writes format 2 while an older one lives.

Processes of the newer release are started with `LAYBY_TASK_MODULES=tests.support.format3` (every
part imports its task modules before it looks at the store), and its CLI as
`python -m tests.support.format3 …`."""

from __future__ import annotations

import base64
import json
import zlib
from typing import Any, cast

from redis import Redis, WatchError

from layby.parking import codecs, migrations
from layby.parking.keys import Keys

TAG = "z:"


def _encode(value: Any) -> str:
    return TAG + base64.b64encode(zlib.compress(json.dumps(value).encode())).decode()


def _decode(raw: str) -> Any:
    return json.loads(zlib.decompress(base64.b64decode(raw[len(TAG):])))


def _rewrite(client: Redis, keys: Keys, key: str, dry: bool) -> bool:
    with client.pipeline(transaction=True) as pipe:
        while True:
            try:
                pipe.watch(key)  # type: ignore[no-untyped-call]
                raw = cast("str | None", pipe.hget(key, "metadata"))
                if not raw or raw.startswith(TAG):
                    return False
                if dry:
                    return True
                pipe.multi()
                pipe.hset(key, "metadata", _encode(json.loads(raw)))
                pipe.execute()
                return True
            except WatchError:
                continue


if migrations.newest() < 3:
    codecs.RUN_METADATA.add(codecs.Encoding(3, _encode, _decode, lambda raw: raw.startswith(TAG)))
    # The run hashes of the sharded layout (format 2's): `<p>:{<shard>}:<run>:run`.
    migrations.register(migrations.Migration(3, "tests: a run's metadata compressed",
                                             ("{*}:*:run",), _rewrite))


def stored_format(raw: str) -> int:
    """The format a stored metadata value was written in (2: not compressed)."""
    return 3 if raw.startswith(TAG) else 2


if __name__ == "__main__":
    from layby.ops.cli import main

    main()
