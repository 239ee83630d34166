"""Every Redis key layby writes, its type and its lifetime: `KEY_SPECS`, one `KeySpec` each,
listed below as `table()` prints them. `Keys` names them. tests/store/test_keys.py checks
that this list is `table()`'s, and runs the store through a whole cycle in each layout to
check that every key it writes is one of `KEY_SPECS`, and every one of them written (but
those only migration 1 reads; those of the legacy layout, by the cycle of a store of
format 1).

`<p>` is the prefix (a setting, LAYBY_KEY_PREFIX). The store is in the sharded layout
(format 2): its runs are spread over a fixed number of shards (the format key's `shards`,
`parking.shards`), each with its own hash tag, `{<shard>}`; a run's keys carry its shard's
tag, `<p>:{<shard>}:<run>:…`, beside that shard's share of the structures its transitions
write (`<p>:{<shard>}:index:<status>`, …): a transition touches one cluster slot. "as the
run": none while the run lives, `retention` seconds once it ended (LAYBY_RETENTION_S);
"none": the key stays, its entries come and go.

<p>:{<shard>}:<run>:run             hash    as the run
    agent, status, version, created_at, updated_at (ms); messages (the history, JSON); input
    (unless it is the first message's text), metadata (only when given), result, error;
    lease_owner, lease_until ('' / 0 when unclaimed, absent while parked or finished), attempts
    (absent: 0); open (ids of the interrupts waiting for an answer, space-separated); waiting
    (ids of those the last park waited on; left out while they are the open ones, written by the
    first answer); checkpointed ('1' while the step saved checkpoints; absent while parked);
    noted ('0' while the run has no notifications; absent once it has: "look"); agent_version
    (the version of the agent it started on; absent: unknown), pinned ('1' when its steps go to
    that version's queue; absent otherwise), sent ("<queue> <n>": the number its step's task
    message took in that queue (queues); absent: queued by a layby before 0.3.0, or before the
    run moved to the sharded layout); retry (while its step waits to try failed tool calls
    again, and until the step commits: RetryWait JSON, layby.wire) and retry_at (when the next
    try is due, ms); tenant (the tenant of the key that started it; absent: `default`), by (who
    started it, when four eyes may apply: `api:<name>`; absent for an admin key's run),
    tokens_after (its run tokens minted before then are refused, ms; absent: none revoked), asks
    (while it waits, the names its interrupts ask, under which the reviewers' request index
    holds it, a JSON array: asks:<name>; absent: in none), trace (the W3C traceparent its steps
    continue; absent: not traced) and trace_was (the one its last park was in, once an answer's
    trace took over). And the run's interrupts, "i:<interrupt id>" → Interrupt JSON (immutable
    once written), and its notifications, "n:<notification id>" → Notification JSON (with its
    token), both under short names (parking.codecs): keys of their own would cost more than they
    hold; events (a run parked a while: its events, folded; see events).
<p>:{<run>}:interrupts              hash    until migration 1
    only a run of 0.1.0's predecessors (its hash has an `id` field): interrupt id → Interrupt
    JSON; migration 1 moves them into the run's hash and deletes it.
<p>:{<shard>}:<run>:answers         hash    as the run
    interrupt id → answer JSON (the first answer only; one given before the park, or by a policy
    rule in the park, too).
<p>:{<run>}:open                    set     until migration 1
    only a run of 0.1.0's predecessors: the ids of its open interrupts; migration 1 writes them
    as the run's `open` field and deletes it.
<p>:{<shard>}:<run>:checkpoints     hash    to the next commit
    "model", "tool:<ref>" → results within the current version (field "v" holds that version);
    deleted by the commit of the step, and at the end of the run.
<p>:{<shard>}:<run>:events          stream  as the run
    type, version, data (JSON), and a step's messages (JSON), a field of their own beside its
    data; when: the entry id's ms (an entry of 0.1.0's predecessors may also have `at`, which
    nothing reads); capped. Copied to an exact fit when the run parks, its steps' events then
    without their messages (`from`/`historyTo` say where they are in the history; parking.events
    fills them in). Parked LAYBY_FOLD_EVENTS_AFTER_S, a run's events move into its hash's field
    `events`, one line each, their data rebuilt from the hash where it can be
    (lua/_folding.lua), and the stream is deleted; later events begin a new one.
<p>:{<shard>}:<run>:events:compact  stream  one park_run call
    park_run.lua's copy of the run's events, made to an exact fit (its steps' messages dropped),
    copied or renamed over events and gone before the script returns.
<p>:{<run>}:notifications           hash    until migration 1
    only a run of 0.1.0's predecessors: notification id → Notification JSON; migration 1 moves
    them into the run's hash and deletes it.
<p>:{<shard>}:<run>:review          hash    as the run
    how people review each interrupt (only interrupts asked under a policy, handed on or
    escalated): "approval:<iid>:<by>" → that reviewer's approval (answer JSON),
    "approvals:<iid>" → how many, "delegated:<iid>:<from>" → the hand-over (Delegation JSON),
    "escalated:<iid>:<level>" → when that level was first asked (ms).
<p>:{<shard>}:index:<status>        zset    none
    run ids in that state, scored by their last change (ms); finished runs' entries are pruned
    by the sweeper once their keys expired.
<p>:{<shard>}:t:<tenant>:index:<status>zset    none
    the same as index:<status>, of the runs of a tenant other than `default` (a run's `tenant`):
    each run is in its own tenant's indexes alone, so that a tenant's list reads its runs only
    (the scripts name them from the run's tenant: lua/_prelude.lua).
<p>:{<shard>}:t:<tenant>:fold:cursorstring  none
    the same as fold:cursor, of a tenant's index of parked runs.
<p>:{<shard>}:audit                 stream  LAYBY_AUDIT_RETENTION_DAYS
    the audit trail of the shard's runs and callers: an entry a thing a caller did or was
    refused, its time the entry's id, its field `e` JSON (caller, tenant, action, run,
    interrupt, channel, outcome, source); entries past the retention trimmed as new ones come
    (parking.audit).
<p>:{<shard>}:tenants               set     none
    the tenants other than `default` with runs in this shard: what scans of every run read
    beside the shard's own indexes.
<p>:{<shard>}:asks:<name>           zset    none
    the reviewers' request index (parking.store.inbox): the shard's waiting runs with an open
    interrupt that asks <name> (a reviewer's id, a group's name, "*" for the default group; at
    any escalation level, or handed to them), scored by when first asked (ms); a run leaves it
    when it stops waiting (the run's `asks`).
<p>:{<shard>}:deadlines             zset    none
    "<run id> <interrupt id>" scored by expiry (ms).
<p>:{<shard>}:leases                zset    none
    running runs' ids scored by the end of their lease (ms).
<p>:{<shard>}:retries               zset    none
    retrying runs' ids (their step waits to try failed tool calls again) scored by when the next
    try is due (ms): the sweeper queues the step again then.
{<p>:format}:workers                zset    none
    layby's processes (a worker "<hostname>:<pid>", a gateway "gateway <host>:<pid>", a reply
    listener "listener <host>:<pid>") scored by the end of their beat's lease (ms): the sweeper
    takes out, once, those whose beat lapsed (and, for a worker, requeues what waits); one that
    stops cleanly takes itself out.
{<p>:format}:workers:about          hash    none
    what each process of workers says it is: "<kind> <newest store format its code knows>
    <release>" (kind: worker, gateway, listener); taken out with it.
<p>:format                          hash    none
    the store's format (parking.formats): version (the format every record is in), shards (how
    many shards its sharded layout has: Keys; absent: the legacy layout of format 1), sharded_at
    (the layout instant of a store of format 1 moving to the sharded layout, ms), writing (the
    one processes write now, while a deployment rolls) and switched_at (when it switched, ms),
    migrating (the migration under way) and that migration's m<n>:cursor (where its scan is),
    m<n>:server (the server that cursor is of), m<n>:seen, m<n>:changed (its counts so far),
    m<n>:done (when it finished, ms).
<p>:migrate:lock                    string  30 s, renewed
    who runs `layby migrate` now ("<host>:<pid>"): one at a time.
{<p>:format}:workers:hosting        hash    none
    worker process name → the agent versions it runs pinned runs of, a JSON list of
    "<agent>@<version>", written at each of its beats (only by workers that take steps); taken
    out with the worker from workers, for layby doctor.
<p>:{<shard>}:outbox                zset    none
    outbox entry ids scored by when to (re)publish: only what a transition could not push itself
    (the broker elsewhere, or announcement tasks, which ack their entry once done).
<p>:{<shard>}:outbox:entries        hash    none
    outbox entry id → {"id", "task", "queue", "args", "agent"} JSON.
<p>:{<shard>}:idem:<key>            string  24 h
    the run id of an idempotency key (LAYBY_IDEMPOTENCY_TTL_S).
<p>:{<shard>}:notify:due            zset    none
    "<run id> <notification id>" scored by when to (re)send: a retry's backoff, a reminder; once
    its delivery is queued, when a lost message would be.
<p>:{<shard>}:grant:<ref>           string  its token's
    a reviewer token's grant, its values space-separated (reviewers.tokens).
<p>:server                          string  none
    the run id of the server (INFO) the sweeper last requeued waiting runs for, or the first a
    process saw: another one there means a restart or a failover since, which may have lost task
    messages.
<p>:broker:server                   string  none
    the same, of the broker's server, when the broker is a Redis server of its own
    (LAYBY_BROKER_URL): its restart or failover may have lost task messages too.
<p>:{<shard>}:fold:cursor           string  none
    the park time (ms) the sweeper's next fold of parked runs' events starts from.
<p>:swept                           string  none
    when (server time, ms) the sweeper last finished a sweep: its liveness, for /metrics and
    doctor.
<p>:seen:<what>                     string  its caller's
    something done once: "mailed-back:<message id>", a reply mail that was mailed back as
    unreadable (a mail provider's retries are not; answering.replies: 3 days).
<p>:{<shard>}:queues                hash    none
    how far the queues of steps have come: "<queue>:sent" (the number the last task message
    queued to it took; each run's `sent` says its own) and "<queue>:taken" (the highest number a
    claim took). A run whose number was passed by a claim, or whose queue is empty, no longer
    has its message in the queue; one that waits behind others does, however long the queue (the
    sweeper's lost-message check).
<p>:{<shard>}:stats                 hash    none
    counters since the data began, for /metrics: answers:<channel> (answers recorded, by
    channel; expiries count as their answer's channel), <what>_latency_ms_sum,
    <what>_latency_count and <what>_latency_le:<bound> (one bucket, not cumulative) for answer
    (park → answer, parked runs only) and resume (last answer → claimed), notifications_failed
    (sends out of attempts), auto_answers:<rule> (interrupts answered by a policy rule),
    escalations:<level> (levels asked), tool_retries:<tool> (failed calls given another
    attempt), tool_retries_exhausted:<tool> (calls out of attempts), finished:<state> (runs that
    ended: completed, failed, cancelled), failed:<code> (failed runs by their error's code),
    notifications_sent:<channel> (notifications delivered).
<p>:{<run>}:run                     hash    as the run, until migration 2
    format 1's (the legacy layout): <p>:{<shard>}:<run>:run of a run not moved yet.
<p>:{<run>}:answers                 hash    as the run, until migration 2
    format 1's (the legacy layout): <p>:{<shard>}:<run>:answers of a run not moved yet.
<p>:{<run>}:checkpoints             hash    to the next commit, until migration 2
    format 1's (the legacy layout): <p>:{<shard>}:<run>:checkpoints of a run not moved yet.
<p>:{<run>}:events                  stream  as the run, until migration 2
    format 1's (the legacy layout): <p>:{<shard>}:<run>:events of a run not moved yet.
<p>:{<run>}:events:compact          stream  one park_run call, until migration 2
    format 1's (the legacy layout): <p>:{<shard>}:<run>:events:compact of a run not moved yet.
<p>:{<run>}:review                  hash    as the run, until migration 2
    format 1's (the legacy layout): <p>:{<shard>}:<run>:review of a run not moved yet.
<p>:index:<status>                  zset    until migration 2
    format 1's (the legacy shard, the one of the legacy layout): <p>:{<shard>}:index:<status>.
<p>:deadlines                       zset    until migration 2
    format 1's (the legacy shard, the one of the legacy layout): <p>:{<shard>}:deadlines.
<p>:leases                          zset    until migration 2
    format 1's (the legacy shard, the one of the legacy layout): <p>:{<shard>}:leases.
<p>:retries                         zset    until migration 2
    format 1's (the legacy shard, the one of the legacy layout): <p>:{<shard>}:retries.
<p>:outbox                          zset    until migration 2
    format 1's (the legacy shard, the one of the legacy layout): <p>:{<shard>}:outbox.
<p>:outbox:entries                  hash    until migration 2
    format 1's (the legacy shard, the one of the legacy layout): <p>:{<shard>}:outbox:entries.
<p>:idem:<key>                      string  until migration 2
    format 1's (the legacy shard, the one of the legacy layout): <p>:{<shard>}:idem:<key>.
<p>:notify:due                      zset    until migration 2
    format 1's (the legacy shard, the one of the legacy layout): <p>:{<shard>}:notify:due.
<p>:grant:<ref>                     string  until migration 2
    format 1's (the legacy shard, the one of the legacy layout): <p>:{<shard>}:grant:<ref>.
<p>:fold:cursor                     string  until migration 2
    format 1's (the legacy shard, the one of the legacy layout): <p>:{<shard>}:fold:cursor.
<p>:queues                          hash    until migration 2
    format 1's (the legacy shard, the one of the legacy layout): <p>:{<shard>}:queues.
<p>:stats                           hash    until migration 2
    format 1's (the legacy shard, the one of the legacy layout): <p>:{<shard>}:stats.
<p>:workers                         zset    until migration 2
    format 1's: {<p>:format}:workers.
<p>:workers:about                   hash    until migration 2
    format 1's: {<p>:format}:workers:about.
<p>:workers:hosting                 hash    until migration 2
    format 1's: {<p>:format}:workers:hosting.

Besides its own keys, the store's scripts push task messages onto the broker's queues
(`<LAYBY_BROKER_KEY_PREFIX>layby.turns`, `…layby.notify`: kombu's lists), when the broker
is this server (`layby.broker_config.messages`). The demo's ledger (layby.demo.ledger)
keeps `<p>:demo:…` keys of its own.

Parked runs never expire. Finished runs expire `retention` seconds after they end; their
index entries are pruned by the sweeper.

The structures a transition writes beside the run's own keys (the indexes, deadlines,
leases, outbox, due notifications, stats, queues, and the idempotency and grant keys it
names), and the fold cursor of the indexes, are a shard's (`ShardKeys`): a transition
writes its run's shard's (`Keys.shard_of`), and whatever scans them reads every shard's
(`Keys.shards`). The process registry's keys are tagged with the format key's name,
`{<p>:format}:workers`, …, in its slot (a beat reads the format).

A store of format 1 (layby 0.2.0's, on one server) is in the legacy layout (`Keys(prefix)`):
one shard, the legacy one, whose keys carry no tag (`<p>:index:<status>`, …), each run's
keys tagged with its own id (`<p>:{<run>}:run`), the registry `<p>:workers`, …: the keys
marked "until migration 2". It moves to the sharded layout online (`parking.formats`,
migration 2): from its layout instant on, a run is moved (lua/move_run.lua) before anything
is done with it, and `layby migrate` moves the rest and deletes the legacy shard's keys.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

from layby.parking import shards as sharding
from layby.wire import Status

RUN_PARTS = ("run", "answers", "checkpoints", "events")
# The tenant of runs started before tenants, or by a key of no tenant: its runs are in the
# shards' own indexes.
DEFAULT_TENANT = "default"
# The states whose indexes come 9th to 15th in the KEYS of transition scripts (`for_scripts`);
# those added since come after the rest.
FIRST_STATES = (Status.QUEUED, Status.RUNNING, Status.INTERRUPTED, Status.RESUMING,
                Status.COMPLETED, Status.FAILED, Status.CANCELLED)


@dataclass(frozen=True)
class KeySpec:
    """One key, or one family of keys, the store writes. `pattern` names it as `Keys` does:
    `<p>` is the prefix, `{<shard>}` a shard's hash tag (`parking.shards.tags`), `<run>` a
    run's id (in the legacy layout, `{<run>}`: its hash tag), `<status>` a `Status`, and any
    other `<…>` the part the `Keys` method is given. `migrated_by`: a key of a format before
    that migration's, which it moves or deletes: migration 1's, of 0.1.0's predecessors,
    nothing writes any more; migration 2's, the legacy layout's, processes write while a
    store is at format 1 and has not reached its layout instant (`parking.formats`)."""

    pattern: str
    type: str
    lifetime: str
    what: str
    migrated_by: int | None = None

    def regex(self, prefix: str) -> re.Pattern[str]:
        """The keys of this spec under `prefix`, as a pattern matching a whole key."""
        parts = re.split(r"(<[^>]+>)", self.pattern)
        out = []
        for part in parts:
            if part == "<p>":
                out.append(re.escape(prefix))
            elif part == "<run>":
                out.append(r"[^{}:]+")  # a hash tag ends at its first '}'
            elif part == "<shard>":
                out.append(r"\d+\.\d+")
            elif part == "<status>":
                out.append("(?:" + "|".join(re.escape(s.value) for s in Status) + ")")
            elif part.startswith("<"):
                out.append(".+")
            else:
                out.append(re.escape(part))
        return re.compile("".join(out))


# Every key the store writes, run's keys first. The module docstring lists them as
# `table()` prints them (tests/store/test_keys.py checks both).
KEY_SPECS: tuple[KeySpec, ...] = (
    KeySpec(
        "<p>:{<shard>}:<run>:run", "hash", "as the run",
        "agent, status, version, created_at, updated_at (ms); messages (the history, JSON); "
        "input (unless it is the first message's text), metadata (only when given), result, "
        "error; lease_owner, lease_until ('' / 0 when unclaimed, absent while parked or "
        "finished), attempts (absent: 0); open (ids of the interrupts waiting for an "
        "answer, space-separated); waiting (ids of those the last park waited on; left out "
        "while they are the open ones, written by the first answer); checkpointed ('1' "
        "while the step saved checkpoints; absent while parked); noted ('0' while the run "
        "has no notifications; absent once it has: \"look\"); agent_version (the version "
        "of the agent it started on; absent: unknown), pinned ('1' when its steps go to "
        "that version's queue; absent otherwise), sent (\"<queue> <n>\": the number its "
        "step's task message took in that queue (queues); absent: queued by a layby before "
        "0.3.0, or before the run moved to the sharded layout); retry (while its step waits "
        "to try failed tool calls again, and until the step commits: RetryWait JSON, "
        "layby.wire) and retry_at (when the next try is due, ms); tenant (the tenant of the key "
        "that started it; absent: `default`), by (who started it, when four eyes may apply: "
        "`api:<name>`; absent for an admin key's run), tokens_after (its run tokens minted "
        "before then are refused, ms; absent: none revoked), asks (while it waits, the names "
        "its interrupts ask, under which the reviewers' request index holds it, a JSON "
        "array: asks:<name>; absent: in none), trace (the W3C traceparent its steps "
        "continue; absent: not traced) and trace_was (the one its last park was in, once an "
        "answer's trace took over). And the run's interrupts, "
        "\"i:<interrupt id>\" → Interrupt JSON (immutable once written), and its "
        "notifications, \"n:<notification id>\" → Notification JSON (with its token), both "
        "under short names (parking.codecs): keys of their own would cost more than they "
        "hold; events (a run parked a while: its events, folded; see events)."),
    KeySpec(
        "<p>:{<run>}:interrupts", "hash", "until migration 1",
        "only a run of 0.1.0's predecessors (its hash has an `id` field): interrupt id → "
        "Interrupt JSON; migration 1 moves them into the run's hash and deletes it.",
        migrated_by=1),
    KeySpec(
        "<p>:{<shard>}:<run>:answers", "hash", "as the run",
        "interrupt id → answer JSON (the first answer only; one given before the park, or by "
        "a policy rule in the park, too)."),
    KeySpec(
        "<p>:{<run>}:open", "set", "until migration 1",
        "only a run of 0.1.0's predecessors: the ids of its open interrupts; migration 1 "
        "writes them as the run's `open` field and deletes it.", migrated_by=1),
    KeySpec(
        "<p>:{<shard>}:<run>:checkpoints", "hash", "to the next commit",
        "\"model\", \"tool:<ref>\" → results within the current version (field \"v\" holds "
        "that version); deleted by the commit of the step, and at the end of the run."),
    KeySpec(
        "<p>:{<shard>}:<run>:events", "stream", "as the run",
        "type, version, data (JSON), and a step's messages (JSON), a field of their own "
        "beside its data; when: the entry id's ms (an entry of 0.1.0's predecessors may "
        "also have `at`, which nothing reads); capped. Copied to an exact fit when the run "
        "parks, its steps' events then without their messages (`from`/`historyTo` say "
        "where they are in the history; parking.events fills them in). Parked LAYBY_FOLD_EVENTS_AFTER_S, a run's events "
        "move into its hash's field `events`, one line each, their data rebuilt from the "
        "hash where it can be (lua/_folding.lua), and the stream is deleted; later events "
        "begin a new one."),
    KeySpec(
        "<p>:{<shard>}:<run>:events:compact", "stream", "one park_run call",
        "park_run.lua's copy of the run's events, made to an exact fit (its steps' "
        "messages dropped), copied or renamed over events and gone before the script "
        "returns."),
    KeySpec(
        "<p>:{<run>}:notifications", "hash", "until migration 1",
        "only a run of 0.1.0's predecessors: notification id → Notification JSON; migration "
        "1 moves them into the run's hash and deletes it.", migrated_by=1),
    KeySpec(
        "<p>:{<shard>}:<run>:review", "hash", "as the run",
        "how people review each interrupt (only interrupts asked under a policy, handed on "
        "or escalated): \"approval:<iid>:<by>\" → that reviewer's approval (answer JSON), "
        "\"approvals:<iid>\" → how many, \"delegated:<iid>:<from>\" → the hand-over "
        "(Delegation JSON), \"escalated:<iid>:<level>\" → when that level was first asked "
        "(ms)."),
    KeySpec(
        "<p>:{<shard>}:index:<status>", "zset", "none",
        "run ids in that state, scored by their last change (ms); finished runs' entries "
        "are pruned by the sweeper once their keys expired."),
    KeySpec(
        "<p>:{<shard>}:t:<tenant>:index:<status>", "zset", "none",
        "the same as index:<status>, of the runs of a tenant other than `default` (a run's "
        "`tenant`): each run is in its own tenant's indexes alone, so that a tenant's list "
        "reads its runs only (the scripts name them from the run's tenant: lua/_prelude.lua)."),
    KeySpec(
        "<p>:{<shard>}:t:<tenant>:fold:cursor", "string", "none",
        "the same as fold:cursor, of a tenant's index of parked runs."),
    KeySpec(
        "<p>:{<shard>}:audit", "stream", "LAYBY_AUDIT_RETENTION_DAYS",
        "the audit trail of the shard's runs and callers: an entry a thing a caller did or "
        "was refused, its time the entry's id, its field `e` JSON (caller, tenant, action, "
        "run, interrupt, channel, outcome, source); entries past the retention trimmed as "
        "new ones come (parking.audit)."),
    KeySpec(
        "<p>:{<shard>}:tenants", "set", "none",
        "the tenants other than `default` with runs in this shard: what scans of every run "
        "read beside the shard's own indexes."),
    KeySpec(
        "<p>:{<shard>}:asks:<name>", "zset", "none",
        "the reviewers' request index (parking.store.inbox): the shard's waiting runs "
        "with an open interrupt that asks <name> (a reviewer's id, a group's name, \"*\" "
        "for the default group; at any escalation level, or handed to them), scored by when "
        "first asked (ms); a run leaves it when it stops waiting (the run's `asks`)."),
    KeySpec(
        "<p>:{<shard>}:deadlines", "zset", "none",
        "\"<run id> <interrupt id>\" scored by expiry (ms)."),
    KeySpec(
        "<p>:{<shard>}:leases", "zset", "none",
        "running runs' ids scored by the end of their lease (ms)."),
    KeySpec(
        "<p>:{<shard>}:retries", "zset", "none",
        "retrying runs' ids (their step waits to try failed tool calls again) scored by when "
        "the next try is due (ms): the sweeper queues the step again then."),
    KeySpec(
        "{<p>:format}:workers", "zset", "none",
        "layby's processes (a worker \"<hostname>:<pid>\", a gateway \"gateway "
        "<host>:<pid>\", a reply listener \"listener <host>:<pid>\") scored by the end of "
        "their beat's lease (ms): the sweeper takes out, once, those whose beat lapsed (and, "
        "for a worker, requeues what waits); one that stops cleanly takes itself out."),
    KeySpec(
        "{<p>:format}:workers:about", "hash", "none",
        "what each process of workers says it is: \"<kind> <newest store format its code "
        "knows> <release>\" (kind: worker, gateway, listener); taken out with it."),
    KeySpec(
        "<p>:format", "hash", "none",
        "the store's format (parking.formats): version (the format every record is in), "
        "shards (how many shards its sharded layout has: Keys; absent: the legacy layout of "
        "format 1), sharded_at (the layout instant of a store of format 1 moving to the "
        "sharded layout, ms), "
        "writing (the one processes write now, while a deployment rolls) and switched_at "
        "(when it switched, ms), migrating (the migration under way) and that migration's "
        "m<n>:cursor (where its scan is), m<n>:server (the server that cursor is of), "
        "m<n>:seen, m<n>:changed (its counts so far), m<n>:done (when it finished, ms)."),
    KeySpec(
        "<p>:migrate:lock", "string", "30 s, renewed",
        "who runs `layby migrate` now (\"<host>:<pid>\"): one at a time."),
    KeySpec(
        "{<p>:format}:workers:hosting", "hash", "none",
        "worker process name → the agent versions it runs pinned runs of, a JSON list of "
        "\"<agent>@<version>\", written at each of its beats (only by workers that take "
        "steps); taken out with the worker from workers, for layby doctor."),
    KeySpec(
        "<p>:{<shard>}:outbox", "zset", "none",
        "outbox entry ids scored by when to (re)publish: only what a transition could not "
        "push itself (the broker elsewhere, or announcement tasks, which ack their entry "
        "once done)."),
    KeySpec(
        "<p>:{<shard>}:outbox:entries", "hash", "none",
        "outbox entry id → {\"id\", \"task\", \"queue\", \"args\", \"agent\"} JSON."),
    KeySpec(
        "<p>:{<shard>}:idem:<key>", "string", "24 h",
        "the run id of an idempotency key (LAYBY_IDEMPOTENCY_TTL_S)."),
    KeySpec(
        "<p>:{<shard>}:notify:due", "zset", "none",
        "\"<run id> <notification id>\" scored by when to (re)send: a retry's backoff, a "
        "reminder; once its delivery is queued, when a lost message would be."),
    KeySpec(
        "<p>:{<shard>}:grant:<ref>", "string", "its token's",
        "a reviewer token's grant, its values space-separated (reviewers.tokens)."),
    KeySpec(
        "<p>:server", "string", "none",
        "the run id of the server (INFO) the sweeper last requeued waiting runs for, or the "
        "first a process saw: another one there means a restart or a failover since, which "
        "may have lost task messages."),
    KeySpec(
        "<p>:broker:server", "string", "none",
        "the same, of the broker's server, when the broker is a Redis server of its own "
        "(LAYBY_BROKER_URL): its restart or failover may have lost task messages too."),
    KeySpec(
        "<p>:{<shard>}:fold:cursor", "string", "none",
        "the park time (ms) the sweeper's next fold of parked runs' events starts from."),
    KeySpec(
        "<p>:swept", "string", "none",
        "when (server time, ms) the sweeper last finished a sweep: its liveness, for "
        "/metrics and doctor."),
    KeySpec(
        "<p>:seen:<what>", "string", "its caller's",
        "something done once: \"mailed-back:<message id>\", a reply mail that was mailed "
        "back as unreadable (a mail provider's retries are not; answering.replies: 3 days)."),
    KeySpec(
        "<p>:{<shard>}:queues", "hash", "none",
        "how far the queues of steps have come: \"<queue>:sent\" (the number the last task "
        "message queued to it took; each run's `sent` says its own) and \"<queue>:taken\" "
        "(the highest number a claim took). A run whose number was passed by a claim, or "
        "whose queue is empty, no longer has its message in the queue; one that waits behind "
        "others does, however long the queue (the sweeper's lost-message check)."),
    KeySpec(
        "<p>:{<shard>}:stats", "hash", "none",
        "counters since the data began, for /metrics: answers:<channel> (answers recorded, "
        "by channel; expiries count as their answer's channel), <what>_latency_ms_sum, "
        "<what>_latency_count and <what>_latency_le:<bound> (one bucket, not cumulative) for "
        "answer (park → answer, parked runs only) and resume (last answer → claimed), "
        "notifications_failed (sends out of attempts), auto_answers:<rule> (interrupts "
        "answered by a policy rule), escalations:<level> (levels asked), tool_retries:<tool> "
        "(failed calls given another attempt), tool_retries_exhausted:<tool> (calls out of "
        "attempts), finished:<state> (runs that ended: completed, failed, cancelled), "
        "failed:<code> (failed runs by their error's code), notifications_sent:<channel> "
        "(notifications delivered)."),
    KeySpec(
        "<p>:{<run>}:run", "hash", "as the run, until migration 2",
        "format 1's (the legacy layout): <p>:{<shard>}:<run>:run of a run not moved yet.", migrated_by=2),
    KeySpec(
        "<p>:{<run>}:answers", "hash", "as the run, until migration 2",
        "format 1's (the legacy layout): <p>:{<shard>}:<run>:answers of a run not moved yet.", migrated_by=2),
    KeySpec(
        "<p>:{<run>}:checkpoints", "hash", "to the next commit, until migration 2",
        "format 1's (the legacy layout): <p>:{<shard>}:<run>:checkpoints of a run not moved yet.", migrated_by=2),
    KeySpec(
        "<p>:{<run>}:events", "stream", "as the run, until migration 2",
        "format 1's (the legacy layout): <p>:{<shard>}:<run>:events of a run not moved yet.", migrated_by=2),
    KeySpec(
        "<p>:{<run>}:events:compact", "stream", "one park_run call, until migration 2",
        "format 1's (the legacy layout): <p>:{<shard>}:<run>:events:compact of a run not moved yet.", migrated_by=2),
    KeySpec(
        "<p>:{<run>}:review", "hash", "as the run, until migration 2",
        "format 1's (the legacy layout): <p>:{<shard>}:<run>:review of a run not moved yet.", migrated_by=2),
    KeySpec(
        "<p>:index:<status>", "zset", "until migration 2",
        "format 1's (the legacy shard, the one of the legacy layout): <p>:{<shard>}:index:<status>.", migrated_by=2),
    KeySpec(
        "<p>:deadlines", "zset", "until migration 2",
        "format 1's (the legacy shard, the one of the legacy layout): <p>:{<shard>}:deadlines.", migrated_by=2),
    KeySpec(
        "<p>:leases", "zset", "until migration 2",
        "format 1's (the legacy shard, the one of the legacy layout): <p>:{<shard>}:leases.", migrated_by=2),
    KeySpec(
        "<p>:retries", "zset", "until migration 2",
        "format 1's (the legacy shard, the one of the legacy layout): <p>:{<shard>}:retries.", migrated_by=2),
    KeySpec(
        "<p>:outbox", "zset", "until migration 2",
        "format 1's (the legacy shard, the one of the legacy layout): <p>:{<shard>}:outbox.", migrated_by=2),
    KeySpec(
        "<p>:outbox:entries", "hash", "until migration 2",
        "format 1's (the legacy shard, the one of the legacy layout): <p>:{<shard>}:outbox:entries.", migrated_by=2),
    KeySpec(
        "<p>:idem:<key>", "string", "until migration 2",
        "format 1's (the legacy shard, the one of the legacy layout): <p>:{<shard>}:idem:<key>.", migrated_by=2),
    KeySpec(
        "<p>:notify:due", "zset", "until migration 2",
        "format 1's (the legacy shard, the one of the legacy layout): <p>:{<shard>}:notify:due.", migrated_by=2),
    KeySpec(
        "<p>:grant:<ref>", "string", "until migration 2",
        "format 1's (the legacy shard, the one of the legacy layout): <p>:{<shard>}:grant:<ref>.", migrated_by=2),
    KeySpec(
        "<p>:fold:cursor", "string", "until migration 2",
        "format 1's (the legacy shard, the one of the legacy layout): <p>:{<shard>}:fold:cursor.", migrated_by=2),
    KeySpec(
        "<p>:queues", "hash", "until migration 2",
        "format 1's (the legacy shard, the one of the legacy layout): <p>:{<shard>}:queues.", migrated_by=2),
    KeySpec(
        "<p>:stats", "hash", "until migration 2",
        "format 1's (the legacy shard, the one of the legacy layout): <p>:{<shard>}:stats.", migrated_by=2),
    KeySpec(
        "<p>:workers", "zset", "until migration 2",
        "format 1's: {<p>:format}:workers.", migrated_by=2),
    KeySpec(
        "<p>:workers:about", "hash", "until migration 2",
        "format 1's: {<p>:format}:workers:about.", migrated_by=2),
    KeySpec(
        "<p>:workers:hosting", "hash", "until migration 2",
        "format 1's: {<p>:format}:workers:hosting.", migrated_by=2),
)


def table() -> str:
    """`KEY_SPECS` as the module docstring lists them."""
    blocks = []
    for spec in KEY_SPECS:
        head = f"{spec.pattern:<36}{spec.type:<8}{spec.lifetime}".rstrip()
        body = textwrap.fill(spec.what, width=96, initial_indent="    ",
                             subsequent_indent="    ", break_long_words=False,
                             break_on_hyphens=False)
        blocks.append(f"{head}\n{body}")
    return "\n".join(blocks)


@dataclass(frozen=True)
class ShardKeys:
    """One shard's keys of the structures transitions write beside a run's own keys.
    `base` comes before each name: the prefix alone in the legacy layout (format 1's one
    shard), so that its keys are those the module docstring lists."""

    base: str

    def index(self, status: Status) -> str:
        return f"{self.base}:index:{status.value}"

    @property
    def deadlines(self) -> str:
        return f"{self.base}:deadlines"

    @property
    def leases(self) -> str:
        return f"{self.base}:leases"

    @property
    def retries(self) -> str:
        return f"{self.base}:retries"

    @property
    def outbox(self) -> str:
        return f"{self.base}:outbox"

    @property
    def outbox_entries(self) -> str:
        return f"{self.base}:outbox:entries"

    @property
    def notify_due(self) -> str:
        return f"{self.base}:notify:due"

    @property
    def stats(self) -> str:
        return f"{self.base}:stats"

    @property
    def queues(self) -> str:
        return f"{self.base}:queues"

    @property
    def fold_cursor(self) -> str:
        return f"{self.base}:fold:cursor"

    def idempotency(self, key: str) -> str:
        return f"{self.base}:idem:{key}"

    def of_tenant(self, tenant: str) -> ShardKeys:
        """The keys of this shard's indexes of a tenant's runs (`index(status)`): those of
        `default`'s runs are the shard's own."""
        return self if tenant == DEFAULT_TENANT else ShardKeys(f"{self.base}:t:{tenant}")

    @property
    def tenants(self) -> str:
        return f"{self.base}:tenants"

    @property
    def audit(self) -> str:
        return f"{self.base}:audit"

    def asks(self, name: str) -> str:
        return f"{self.base}:asks:{name}"

    def grant(self, ref: str) -> str:
        return f"{self.base}:grant:{ref}"


@lru_cache(maxsize=16)
def _sharded(prefix: str, count: int) -> tuple[ShardKeys, ...]:
    return tuple(ShardKeys(f"{prefix}:{{{tag}}}") for tag in sharding.tags(count))


@dataclass(frozen=True)
class Keys:
    """Every key's name under `prefix`, in the layout `shard_count` says. A shard's
    structures (its indexes, deadlines, outbox, …) are named by its `ShardKeys`: the run's
    (`shard_of`), or every shard's (`shards`); a run's keys by the run (`run`, `events`, …).
    The keys of records older than format 1 are named only by migration 1, which moves them.

    `shard_count` None is format 1's layout: one shard, the legacy one, and each run's keys
    tagged with its own id (`<p>:{<run>}:run`). A number is the sharded layout, that of a
    store made on a cluster (its format key says how many shards): `shard_count` shards, each tagged
    `{<tag>}` (`layby.parking.shards`), a run's keys carrying its shard's tag, so that a
    transition's keys share one cluster slot: `<p>:{<tag>}:<run>:run`, and the shard's
    structures `<p>:{<tag>}:index:<status>`, `<p>:{<tag>}:deadlines`, … The process
    registry's keys are tagged with the format key's name, `{<p>:format}:workers`, …, in
    its slot (a beat reads the format)."""

    prefix: str = "layby"
    shard_count: int | None = None

    @property
    def legacy(self) -> ShardKeys:
        """The one shard of format 1, its keys named as before shards."""
        return ShardKeys(self.prefix)

    @property
    def shards(self) -> tuple[ShardKeys, ...]:
        """Every shard, in order: what a reader of a shard's structures scans."""
        if self.shard_count is None:
            return (self.legacy,)
        return _sharded(self.prefix, self.shard_count)

    def shard_number(self, run_id: str) -> int:
        """Which of `shards` run `run_id` is in."""
        return sharding.shard_of(run_id, len(self.shards))

    def shard_of(self, run_id: str) -> ShardKeys:
        """The shard whose structures the run's transitions write."""
        return self.shards[self.shard_number(run_id)]

    def fits_with(self, run_id: str) -> Callable[[str], bool] | None:
        """Which ids of things a run's transition writes beside it (a grant's ref) land in
        its shard, so that a reader given the id alone finds it in one read; None: any
        (one shard)."""
        if len(self.shards) == 1:
            return None
        number = self.shard_number(run_id)
        return lambda other: self.shard_number(other) == number

    def _of(self, run_id: str, part: str) -> str:
        if self.shard_count is None:
            return f"{self.prefix}:{{{run_id}}}:{part}"
        return f"{self.shard_of(run_id).base}:{run_id}:{part}"

    def of_run(self, run_id: str) -> list[str]:
        return [self._of(run_id, part) for part in RUN_PARTS]

    def run(self, run_id: str) -> str:
        return self._of(run_id, "run")

    def answers(self, run_id: str) -> str:
        return self._of(run_id, "answers")

    def checkpoints(self, run_id: str) -> str:
        return self._of(run_id, "checkpoints")

    def events(self, run_id: str) -> str:
        return self._of(run_id, "events")

    def review(self, run_id: str) -> str:
        return self._of(run_id, "review")

    def _registry(self, name: str) -> str:
        """A key of the process registry: in the sharded layout, tagged with the format
        key's own name, so that a beat (which reads the format) touches one slot."""
        if self.shard_count is None:
            return f"{self.prefix}:{name}"
        return f"{{{self.format}}}:{name}"

    @property
    def workers(self) -> str:
        return self._registry("workers")

    @property
    def workers_about(self) -> str:
        return self._registry("workers:about")

    @property
    def format(self) -> str:
        return f"{self.prefix}:format"

    @property
    def migrate_lock(self) -> str:
        return f"{self.prefix}:migrate:lock"

    @property
    def hosting(self) -> str:
        return self._registry("workers:hosting")

    @property
    def server(self) -> str:
        return f"{self.prefix}:server"

    @property
    def broker_server(self) -> str:
        return f"{self.prefix}:broker:server"

    @property
    def swept(self) -> str:
        return f"{self.prefix}:swept"

    def seen(self, what: str) -> str:
        return f"{self.prefix}:seen:{what}"

    def for_scripts(self, run_id: str) -> list[str]:
        """The KEYS every transition script receives, in the order of `lua/_prelude.lua`
        (what came later at the end: lua/move_run.lua reads two such lists side by side)."""
        return list(_script_keys(self, run_id))


# A step's claim and its commit name the same run's keys, as do an answer's read and its
# script: kept for the runs last named (21 names each, built and hashed once).
@lru_cache(maxsize=256)
def _script_keys(keys: Keys, run_id: str) -> tuple[str, ...]:
    shard = keys.shard_of(run_id)
    return (*keys.of_run(run_id), shard.outbox, shard.outbox_entries, shard.leases,
            shard.deadlines, *(shard.index(s) for s in FIRST_STATES), shard.notify_due,
            shard.stats, keys.review(run_id), shard.queues, shard.index(Status.RETRYING),
            shard.retries)
