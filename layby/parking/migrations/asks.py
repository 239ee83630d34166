"""The reviewers' request index (`parking.store.inbox`) for the runs that waited in the
legacy layout: migration 2's last step.

In the sharded layout every park and hand-over keeps the index itself (lua/_prelude.lua
`ask`); a run parked in the legacy layout (layby 0.2.0's) is in none, and moving it changes
nothing of that. So once migration 2 has moved every run, `index_waiting` puts each run
still waiting, in any shard and of any tenant, under the names its open interrupts ask and
those they were handed to (`lua/index_asks.lua`): a run that stopped waiting meanwhile is
left out, one indexed already is left as it is. The inbox reads through the index once the
store's version is 2 (`layby.inbox.waiting`).
"""

from __future__ import annotations

import json
from typing import cast

from redis import Redis

from layby.parking import codecs
from layby.parking.keys import Keys, ShardKeys
from layby.parking.scripts import standalone
from layby.parking.store.fields import INTERRUPT, open_of
from layby.parking.store.inbox import names_asked
from layby.wire import Status

_DELEGATED = "delegated:"


def index_waiting(client: Redis, sharded: Keys, dry: bool) -> tuple[int, int]:
    """Every waiting run of `sharded`'s shards put in the index; returns (the runs looked
    at, those put in it), or would be."""
    seen = changed = 0
    for shard in sharded.shards:
        tenants = sorted(cast("set[str]", client.smembers(shard.tenants)))
        for of in (shard, *(shard.of_tenant(tenant) for tenant in tenants)):
            # ZSCAN: a run there from start to end is seen, however many leave meanwhile.
            for run_id, _ in client.zscan_iter(of.index(Status.INTERRUPTED), count=500):
                seen += 1
                changed += _index_run(client, shard, sharded.run(run_id), dry)
    return seen, changed


def _index_run(client: Redis, shard: ShardKeys, run_key: str, dry: bool) -> bool:
    names = _names(client, run_key, run_key.removesuffix(":run") + ":review")
    if not names or client.hget(run_key, "status") != "interrupted":
        return False
    if dry:
        return client.hget(run_key, "asks") is None
    reply = standalone(client, "index_asks")(
        keys=[run_key, *(shard.asks(name) for name in names)],
        args=["names", json.dumps(names)])
    return bool(reply == "indexed")


def _names(client: Redis, run_key: str, review_key: str) -> list[str]:
    """The names the run's open interrupts ask, and whom they were handed to."""
    open_ids = sorted(open_of(cast("str | None", client.hget(run_key, "open"))))
    if not open_ids:
        return []
    specs = cast("list[str | None]", client.hmget(run_key, [INTERRUPT + i for i in open_ids]))
    names = names_asked(codecs.interrupt(i, raw)
                        for i, raw in zip(open_ids, specs, strict=True) if raw is not None)
    for field, record in cast("dict[str, str]", client.hgetall(review_key)).items():
        if field.startswith(_DELEGATED) and field.split(":")[1] in open_ids:
            names.append(json.loads(record)["to"])
    return list(dict.fromkeys(names))
