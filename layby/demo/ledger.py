"""The demo ledger: every executed transfer and every plain tool call, recorded once per
idempotency key, so anyone can check at `GET /demo/ledger` that a side effect happened
exactly once however often a step was retried."""

from __future__ import annotations

import json
import time
from typing import Any

from layby.control import runtime

# KEYS: 1 entries (list), 2 seen keys (hash). ARGV: 1 idempotency key, 2 entry JSON.
# Returns the entry as first recorded for that key.
_RECORD = """
if redis.call('HSETNX', KEYS[2], ARGV[1], ARGV[2]) == 1 then
  redis.call('RPUSH', KEYS[1], ARGV[2])
  return ARGV[2]
end
return redis.call('HGET', KEYS[2], ARGV[1])
"""


def _keys(kind: str) -> list[str]:
    prefix = runtime.store().keys.prefix
    return [f"{prefix}:demo:{kind}", f"{prefix}:demo:{kind}:seen"]


def record(kind: str, idempotency_key: str, entry: dict[str, Any]) -> dict[str, Any]:
    client = runtime.store().redis
    entry = {**entry, "key": idempotency_key, "at": time.time()}
    first = client.eval(_RECORD, 2, *_keys(kind), idempotency_key, json.dumps(entry))
    return json.loads(first)


def read() -> dict[str, list[dict[str, Any]]]:
    client = runtime.store().redis
    return {kind: [json.loads(e) for e in client.lrange(_keys(kind)[0], 0, -1)]
            for kind in ("transfers", "calls")}
