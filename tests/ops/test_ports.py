"""The ports layby's embedded servers and the tests listen on (`layby.ops.embedded.free_port`):
free when given, each different from those given before it (in this process or another
on the machine), and out of the kernel's ephemeral range, where outgoing connections take
their own ports."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

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


@pytest.mark.integration
def test_processes_asking_at_once_are_given_different_ports(tmp_path: Path) -> None:
    """Four processes, each taking 300 ports as fast as it can: no port goes to two of
    them (drawn at random from the 12,000 or so below the ephemeral range, 1,200 picks
    would share about 50). They share what was given through the temporary directory,
    here one of the test's own."""
    ask = "from layby.ops.embedded import free_port; print(*(free_port() for _ in range(300)))"
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    procs = [subprocess.Popen([sys.executable, "-c", ask], env=env, stdout=subprocess.PIPE,
                              text=True) for _ in range(4)]
    outputs = [proc.communicate(timeout=60)[0] for proc in procs]
    assert all(proc.returncode == 0 for proc in procs)
    given = [int(port) for out in outputs for port in out.split()]
    assert len(given) == 1200
    assert len(set(given)) == len(given), sorted(p for p in given if given.count(p) > 1)
    assert (tmp_path / f"layby-ports-{os.getuid()}").is_file()
