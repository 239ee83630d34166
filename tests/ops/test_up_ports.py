"""`layby up`'s embedded Valkey never takes a port one of its parts will bind: the parts'
ports are only checked free before they start, so a free port picked for Valkey could be
the gateway's (seen once in the suite: the gateway then failed with "address already in
use" and took everything down)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from layby.broker_config import Settings
from layby.ops import supervisor
from layby.ops.embedded import free_port
from layby.ops.supervisor import System


@pytest.fixture
def up_system(tmp_path: Path) -> Iterator[System]:
    made = System(Settings(data_dir=tmp_path), port=free_port())
    yield made
    if made.redis is not None:
        made.redis.stop()


def test_the_embedded_server_skips_the_ports_the_parts_will_bind(
        up_system: System, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The port picker's draws, made to give the gateway's port first, as it once did.
    draws = iter([up_system.port, free_port()])
    monkeypatch.setattr(supervisor, "free_port", lambda: next(draws))

    url = up_system._start_embedded(tmp_path, avoid={up_system.port})

    assert up_system.redis is not None and up_system.redis.port != up_system.port
    assert url == up_system.redis.url
    with redis.Redis.from_url(url) as client:
        assert client.ping()
    assert (tmp_path / "redis.url").read_text().strip() == url
