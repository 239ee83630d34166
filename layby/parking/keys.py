"""Every Redis key layby uses, its type and its lifetime. The prefix is a setting.

Per run, under one hash tag so a run lives in one cluster slot (`<p>:{<run_id>}:…`):

| key          | type   | holds                                                   | lifetime          |
|--------------|--------|---------------------------------------------------------|-------------------|
| run          | hash   | agent, status, version, messages (JSON), input (unless  | until retention   |
|              |        | it is the first message's text), metadata (only when    | after the end     |
|              |        | given), result, error, lease_owner,                     |                   |
|              |        | lease_until ('' / 0 when unclaimed, absent while parked |                   |
|              |        | or finished), attempts (absent: 0), open (ids of        |                   |
|              |        | interrupts                                              |                   |
|              |        | waiting for an answer, space-separated), waiting (ids   |                   |
|              |        | of those the last park waited on; left out while they   |                   |
|              |        | are the open ones, written by the first answer),        |                   |
|              |        | checkpointed ('1' while the step saved checkpoints;     |                   |
|              |        | absent while parked), noted ('0' while the run has no   |                   |
|              |        | notifications; absent once it has: "look"), …; and the  |                   |
|              |        | run's interrupts,                                       |                   |
|              |        | "i:<interrupt id>" → Interrupt JSON (immutable once     |                   |
|              |        | written), and its notifications, "n:<notification id>"  |                   |
|              |        | → Notification JSON (with its token), both under short  |                   |
|              |        | names (parking.compact): keys of their own would cost   |                   |
|              |        | more than they hold; events (a run parked a while: its  |                   |
|              |        | events, folded; see events below)                       |                   |
| interrupts   | hash   | only runs of an older layby (their hash has an `id`     | same              |
|              |        | field): interrupt id → Interrupt JSON                   |                   |
| answers      | hash   | interrupt id → answer JSON (first answer only)          | same              |
| open         | set    | only runs of an older layby, which kept open interrupts | same              |
|              |        | here: read while the run has no `open` field, dropped   |                   |
|              |        | by the next write                                       |                   |
| checkpoints  | hash   | "model", "tool:<ref>" → results within the current      | cleared at every  |
|              |        | version (field "v" holds that version)                  | commit            |
| events       | stream | type, version, data (JSON), when: the entry id's ms (an | same as run       |
|              |        | older layby's entries also have `at`); capped; copied to|                   |
|              |        | an exact fit when the run parks, its steps' events then |                   |
|              |        | without their messages (`from`/`historyTo` say where    |                   |
|              |        | they are in the history; parking.events fills them in). |                   |
|              |        | Parked LAYBY_FOLD_EVENTS_AFTER_S, a run's events move   |                   |
|              |        | into its hash's field `events`, one line each, their    |                   |
|              |        | data rebuilt from the hash where it can be              |                   |
|              |        | (lua/_folding.lua), and the stream is deleted; later    |                   |
|              |        | events begin a new one                                  |                   |
| notifications| hash   | only runs of an older layby: notification id →          | same as run       |
|              |        | Notification JSON                                       |                   |
| review       | hash   | how people review each interrupt (only runs asked under | same as run       |
|              |        | a policy): "approval:<iid>:<by>" → approval JSON,       |                   |
|              |        | "approvals:<iid>" → their count, "delegated:<iid>:<from>|                   |
|              |        | " → delegation JSON, "escalated:<iid>:<level>" → when   |                   |

Global:

| key                  | type | holds                                             |
|----------------------|------|---------------------------------------------------|
| index:<status>       | zset | run ids in that state, scored by last change (ms) |
| deadlines            | zset | "<run_id> <interrupt_id>" scored by expiry (ms)   |
| leases               | zset | running run ids scored by lease end (ms)          |
| outbox               | zset | outbox entry ids scored by when to (re)publish    |
|                      |      | (only what a transition could not push itself:    |
|                      |      | the broker elsewhere, or announcement tasks, which|
|                      |      | ack their entry once done)                        |
| outbox:entries       | hash | entry id → {"task", "queue", "args"} JSON         |
| idem:<key>           | str  | run id for an idempotency key; expires (24 h)     |
| notify:due           | zset | "<run_id> <notification id>" scored by when to    |
|                      |      | (re)send: a retry's backoff, a reminder; once its |
|                      |      | delivery is queued, when a lost message would be  |
| grant:<ref>          | str  | a reviewer token's grant, its values space-       |
|                      |      | separated (reviewers.tokens; an older layby's:    |
|                      |      | JSON); expires with the token (and retention)     |
| server               | str  | the run id of the server (INFO) the sweeper last  |
|                      |      | requeued waiting runs for, or the first process   |
|                      |      | saw: another one there means a restart or a       |
|                      |      | failover since, which may have lost task messages |
| fold:cursor          | str  | the park time (ms) the sweeper's next fold of     |
|                      |      | parked runs' events starts from                   |
| swept                | str  | when (server time, ms) the sweeper last finished  |
|                      |      | a sweep: its liveness, for /metrics and doctor    |
| seen:<what>          | str  | something taken once: a callback's webhook-id     |
|                      |      | (past the replay tolerance), a reply mail that    |
|                      |      | was mailed back (a provider's retries are not)    |
| stats                | hash | counters since the data began, for /metrics:      |
|                      |      | answers:<channel> (answers recorded, by channel;  |
|                      |      | expiries count as their answer's channel),        |
|                      |      | <what>_latency_ms_sum, <what>_latency_count and   |
|                      |      | <what>_latency_le:<bound> (one bucket, not        |
|                      |      | cumulative) for answer (park → answer, parked     |
|                      |      | runs only) and resume (last answer → claimed),    |
|                      |      | notifications_failed (sends out of attempts),     |
|                      |      | auto_answers:<rule> (interrupts answered by a     |
|                      |      | policy rule), escalations:<level> (levels asked)  |

Besides its own keys, the store's scripts push task messages onto the broker's queues
(`<LAYBY_BROKER_KEY_PREFIX>layby.turns`, `…layby.notify`: kombu's lists), when the broker
is this server (`layby.broker_config.messages`).

Parked runs never expire. Finished runs expire `retention` seconds after they end; their
index entries are pruned by the sweeper.
"""

from __future__ import annotations

from dataclasses import dataclass

from layby.wire import Status

RUN_PARTS = ("run", "interrupts", "answers", "open", "checkpoints", "events")


@dataclass(frozen=True)
class Keys:
    prefix: str = "layby"

    def of_run(self, run_id: str) -> list[str]:
        return [f"{self.prefix}:{{{run_id}}}:{part}" for part in RUN_PARTS]

    def run(self, run_id: str) -> str:
        return f"{self.prefix}:{{{run_id}}}:run"

    def interrupts(self, run_id: str) -> str:
        return f"{self.prefix}:{{{run_id}}}:interrupts"

    def answers(self, run_id: str) -> str:
        return f"{self.prefix}:{{{run_id}}}:answers"

    def open(self, run_id: str) -> str:
        return f"{self.prefix}:{{{run_id}}}:open"

    def checkpoints(self, run_id: str) -> str:
        return f"{self.prefix}:{{{run_id}}}:checkpoints"

    def events(self, run_id: str) -> str:
        return f"{self.prefix}:{{{run_id}}}:events"

    def notifications(self, run_id: str) -> str:
        return f"{self.prefix}:{{{run_id}}}:notifications"

    def review(self, run_id: str) -> str:
        return f"{self.prefix}:{{{run_id}}}:review"

    def index(self, status: Status) -> str:
        return f"{self.prefix}:index:{status.value}"

    @property
    def deadlines(self) -> str:
        return f"{self.prefix}:deadlines"

    @property
    def leases(self) -> str:
        return f"{self.prefix}:leases"

    @property
    def workers(self) -> str:
        return f"{self.prefix}:workers"

    @property
    def outbox(self) -> str:
        return f"{self.prefix}:outbox"

    @property
    def outbox_entries(self) -> str:
        return f"{self.prefix}:outbox:entries"

    def idempotency(self, key: str) -> str:
        return f"{self.prefix}:idem:{key}"

    @property
    def server(self) -> str:
        return f"{self.prefix}:server"

    @property
    def notify_due(self) -> str:
        return f"{self.prefix}:notify:due"

    def grant(self, ref: str) -> str:
        return f"{self.prefix}:grant:{ref}"

    @property
    def swept(self) -> str:
        return f"{self.prefix}:swept"

    @property
    def fold_cursor(self) -> str:
        return f"{self.prefix}:fold:cursor"

    def seen(self, what: str) -> str:
        return f"{self.prefix}:seen:{what}"

    @property
    def stats(self) -> str:
        return f"{self.prefix}:stats"

    def for_scripts(self, run_id: str) -> list[str]:
        """The KEYS every transition script receives, in the order of `lua/_prelude.lua`."""
        return [*self.of_run(run_id), self.outbox, self.outbox_entries, self.leases,
                self.deadlines, *(self.index(s) for s in Status), self.notifications(run_id),
                self.notify_due, self.stats, self.review(run_id)]
