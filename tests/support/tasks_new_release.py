"""A task only "the newer release" has (tests/upgrades/test_rolling.py): workers started with
`LAYBY_TASK_MODULES=tests.support.tasks_new_release` know it; the others must hand its messages
back, never drop them. It counts its runs in the Redis key it is given."""

from __future__ import annotations

import os

import redis
from celery import shared_task

NAME = "tests.new_release_task"


@shared_task(name=NAME)
def new_release_task(counter_key: str) -> int:
    client = redis.Redis.from_url(os.environ["LAYBY_REDIS_URL"])
    return int(client.incr(counter_key))
