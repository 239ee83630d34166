"""layby on a Valkey Cluster with RabbitMQ as the broker beside it (LAYBY_BROKER_URL=amqp://…,
Debian's package): the core scenarios run as they run on one server (the same tests, given
this module's `system`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

# The same scenarios as on one server (collected here, they get this module's `system`).
from tests.support.core_scenarios import *  # noqa: F403
from tests.support.core_scenarios import on_a_cluster
from tests.support.harness import LaybySystem
from tests.support.rabbit import running

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LaybySystem]:
    root = tmp_path_factory.mktemp("cluster-rabbit")
    with running(root / "rabbit") as rabbit, on_a_cluster(root, rabbit.url) as (_, system):
        yield system
