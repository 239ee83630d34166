"""The ports layby's embedded servers and the tests listen on (`layby.ops.embedded.free_port`):
free when given, each different from those given before it, and out of the kernel's
ephemeral range, where outgoing connections take their own ports."""

from __future__ import annotations

import socket
from pathlib import Path

from layby.ops.embedded import free_port

RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def test_free_ports_differ_are_free_and_avoid_the_ephemeral_range() -> None:
    given = [free_port() for _ in range(300)]
    assert len(set(given)) == len(given)
    held = []
    try:
        for port in given:  # all of them at once: a caller takes several, then starts
            s = socket.socket()
            held.append(s)
            s.bind(("127.0.0.1", port))
            s.listen()
    finally:
        for s in held:
            s.close()
    if RANGE.exists():
        low, high = (int(n) for n in RANGE.read_text().split())
        assert not any(low <= port <= high for port in given), (low, high)
