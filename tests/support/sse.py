"""Reading a run's server-sent events the way a client does: over HTTP, line by line."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator
from typing import Any

from tests.support.harness import LaybySystem


def parse(lines: Iterable[str], deadline_s: float = 30.0) -> Iterator[dict[str, Any]]:
    """SSE frames as `{id, event, data}`; fails if the server keeps the stream open past
    the deadline (keep-alive comments would otherwise hide a stream that never ends)."""
    ends = time.monotonic() + deadline_s
    frame: dict[str, Any] = {}
    for line in lines:
        assert time.monotonic() < ends, f"the event stream is still open after {deadline_s} s"
        if not line:
            if frame:
                yield frame
            frame = {}
        elif line.startswith(":"):
            continue
        else:
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            frame[name] = json.loads(value) if name == "data" else value
    if frame:
        yield frame


def history(system: LaybySystem, run_id: str, last_event_id: str | None = None
            ) -> list[dict[str, Any]]:
    """Every event of the run so far (`?follow=false`), after `last_event_id` if given."""
    headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
    with system.api() as api, api.stream("GET", f"/v1/runs/{run_id}/events",
                                         params={"follow": "false"}, headers=headers) as reply:
        assert reply.status_code == 200, reply.read()
        return list(parse(reply.iter_lines()))


def id_key(event_id: str) -> tuple[int, int]:
    ms, _, seq = event_id.partition("-")
    return int(ms), int(seq or 0)
