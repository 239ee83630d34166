"""Task messages made ahead, for the store's transition scripts to push themselves.

When the broker and the store are one Redis server (layby's only layout), the script that
commits a transition can put the next task on its queue in the same atomic step: no
publish after the commit, nothing for the sweeper to republish, one round trip fewer. A
template is the message exactly as kombu's Redis transport writes it (the JSON envelope
LPUSHed to the queue's key, Celery's task protocol 2 headers from Celery itself), with
placeholders the script fills in:

| placeholder | replaced by                                         |
|-------------|-----------------------------------------------------|
| `@@R@@`     | the run id                                          |
| `@@V@@`     | the run's version (a JSON number)                   |
| `@@N@@`     | a notification id (`layby.notify.deliver`)          |
| `@@T@@`     | the task id (`<run>:<kind>:<version>`, or the note) |
| `@@D@@`     | kombu's delivery tag, unique per message            |
| `@@A@@`     | `agent=<the run's agent> `, or nothing              |
| `@@S@@`     | `@<version>` for a pinned run's step, or nothing    |
| `@@P@@`     | the run's trace context (`traceparent`), or nothing  |

A pinned run's steps go to the queue of its agent's version, `layby.turns@<version>`: the
script pushes onto that queue's key, and the message's routing key names it too (`@@S@@`),
so that kombu gives a message back to that queue, not to `layby.turns`, when a worker
dies holding it.

The arguments Flower shows (the `argsrepr` header) are the run's agent and the ids,
`agent=demo.transfer ['run_…', 3]` (`shown_args`; the agent first, as Flower's narrow
column cuts the end off): an operator finds a run's steps by its id, and sees which agent
they served. Ids and the agent's name only: never a message, an
answer or a token.

The `traceparent` header is the run's stored trace context (`layby.broker_config.tracing`):
the worker's span of the step continues the run's trace from it, as OpenTelemetry's Celery
instrumentation reads it from a message's headers (an empty one starts no trace of its own
and is ignored).

The body is the task's JSON as is, without kombu's base64 (a message says how its body is
encoded, and kombu reads an unencoded one as it is): Lua has no base64, and the version
goes inside the body. Such a message sends no `task-sent` event; Flower shows the task from
`task-received` on.
"""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass
from typing import Any

from celery import Celery

from layby.broker_config.names import DELIVER_TASK, NOTIFY, NOTIFY_TASK, RESUME_RUN, RUN_TURN, TURNS

RUN, VERSION, NOTE, TASK_ID, TAG, AGENT, SUFFIX, TRACE = (
    "@@R@@", "@@V@@", "@@N@@", "@@T@@", "@@D@@", "@@A@@", "@@S@@", "@@P@@")


def shown_args(args: list[Any] | tuple[Any, ...], agent: str | None = None) -> str:
    """The arguments as Flower shows them (`argsrepr`): the run's agent, then the ids."""
    return (f"agent={agent} " if agent else "") + repr(list(args))


@dataclass(frozen=True)
class Template:
    """One task's message: the key of its queue (with the broker's key prefix) and the
    envelope with placeholders."""

    queue_key: str
    message: str


def template(app: Celery, task: str, queue: str, args: tuple[str, str],
             key_prefix: str = "", *, pinnable: bool = False) -> Template:
    """The message of `task` on `queue` with `args` (placeholders; `VERSION` stands for a
    number); a `pinnable` one routed to `queue` + `SUFFIX`."""
    # The origin names the host, not the process: a template is written into the scripts'
    # source, and one per process would load a new copy of every script each restart.
    made = app.amqp.as_task_v2(TASK_ID, task, args=args, kwargs={}, root_id=TASK_ID,
                               argsrepr=AGENT + shown_args(args), kwargsrepr="{}",
                               origin=f"layby@{socket.gethostname()}")
    body = json.dumps(made.body)  # what kombu's json serializer writes
    envelope = {
        "body": body,
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": {**made.headers, "traceparent": TRACE},
        "properties": {**made.properties, "reply_to": "", "delivery_mode": 2,
                       "delivery_info": {"exchange": "", "routing_key": queue
                                         + (SUFFIX if pinnable else "")},
                       "priority": 0, "delivery_tag": TAG},
    }
    text = json.dumps(envelope)
    # The version is a number: unquote its placeholder, in the body's escaped JSON and in
    # argsrepr.
    text = text.replace(f'\\"{VERSION}\\"', VERSION).replace(f"'{VERSION}'", VERSION)
    return Template(key_prefix + queue, text)


def templates(app: Celery, key_prefix: str = "") -> dict[str, Template]:
    """The tasks layby's transitions queue, by the kind of step they take."""
    return {
        "turn": template(app, RUN_TURN, TURNS, (RUN, VERSION), key_prefix, pinnable=True),
        "resume": template(app, RESUME_RUN, TURNS, (RUN, VERSION), key_prefix,
                           pinnable=True),
        "notify": template(app, NOTIFY_TASK, NOTIFY, (RUN, VERSION), key_prefix),
        "deliver": template(app, DELIVER_TASK, NOTIFY, (RUN, NOTE), key_prefix),
    }
