"""A run's life in the store: made, claimed, its step's lease renewed and checkpoints
saved, committed (on, parked, retrying, completed, failed), cancelled, queued again; and
what it is (its view, events, lease, owner, status)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, cast

from layby.generation.interrupts import Interrupt
from layby.generation.messages import Message, dump_messages, load_messages
from layby.parking import codecs, events, results
from layby.parking import shards as sharding
from layby.parking.clock import iso
from layby.parking.keys import DEFAULT_TENANT, Keys
from layby.parking.records import Announcements, Ownership
from layby.parking.results import Transition
from layby.parking.store.core import Part, generated_run_id
from layby.parking.store.fields import (
    INTERRUPT,
    NOTE,
    dumps,
    event_args,
    first_text,
    interrupts_of,
    notifications_of,
    open_of,
    prefixed,
    retry_of,
    reviews_of,
    traceparent,
)
from layby.parking.store.inbox import names_asked
from layby.parking.store.outbox import plan_args
from layby.wire import Answer, Event, InterruptView, RetryWait, RunView, Status


class Runs(Part):
    """A run's life and views (`store.runs`)."""

    def new_run_id(self, idempotency_key: str | None = None) -> str:
        """A fresh run id; with `idempotency_key`, one in the shard that key names (in the
        sharded layout the key is written by the run's creation, in the run's shard: a
        retry with the key, under another fresh id, must look in the same one)."""
        keys = self.core.keys
        if idempotency_key is None or len(keys.shards) == 1:
            return generated_run_id()
        wanted = sharding.shard_of(idempotency_key, len(keys.shards))
        return generated_run_id(lambda run_id: keys.shard_number(run_id) == wanted)

    def create_run(self, run_id: str, agent: str, *, input: Any, messages: list[Message],
                   metadata: dict[str, Any], idempotency_key: str | None,
                   agent_version: str | None = None, pinned: bool = False,
                   tenant: str = DEFAULT_TENANT, started_by: str | None = None,
                   audit: Sequence[str] = (), trace: str | None = None) -> Transition:
        """`agent_version`: the version the run starts on; `pinned`: its steps go to that
        version's queue, for the workers that host it. `tenant`: whose run it is (its lists'
        and who may see it); `started_by`: the caller that started it, kept when four eyes
        may apply; `trace`: the trace context its steps continue (a traceparent). While
        the store is between layouts, the run's id and its idempotency key
        are looked for in the other one too."""
        layout = self.core.layout
        other = layout.legacy or layout.next

        def extra(keys: Keys) -> tuple[str, ...]:
            # Without one, no key: an empty name would be a key of another cluster slot.
            found = [keys.shard_of(run_id).idempotency(idempotency_key)] \
                if idempotency_key else []
            elsewhere = layout.keys if keys != layout.keys else other
            if elsewhere is not None:  # (in the sharded layout, in the key's own shard)
                found.append(elsewhere.run(run_id))
                if idempotency_key:
                    found.append(elsewhere.shard_of(idempotency_key)
                                 .idempotency(idempotency_key))
            return tuple(found)

        # An input that is the first message's text is read back from there: a prompt is
        # not kept twice for as long as the run lives.
        stored_input = "" if len(messages) == 1 and first_text(messages) == input \
            else dumps(input)
        # No metadata is written as none (the script stores none).
        stored_metadata = codecs.RUN_METADATA.encode(metadata, self.core.writing) if metadata \
            else "{}"
        reply = self.core.run_script(
            "create_run", run_id, run_id=run_id, agent=agent, input=stored_input,
            messages=dumps(dump_messages(messages)), metadata=stored_metadata,
            idempotency_ttl_s=self.config.idempotency_ttl_s, agent_version=agent_version or "",
            pinned=bool(pinned and agent_version), keyed=bool(idempotency_key),
            elsewhere=other is not None, tenant="" if tenant == DEFAULT_TENANT else tenant,
            by=started_by or "", audit=list(audit), trace=traceparent(trace), extra_keys=extra,
            under=layout.keys)
        if reply[0] == "created" and tenant != DEFAULT_TENANT:
            self.core.forget_tenants()  # scans of every run read it from now on
        return results.created(reply, run_id)

    def claim(self, run_id: str, version: int, owner: str,
              hosted: Sequence[str] = ()) -> Transition:
        """Claim the run's step at `version`; when it applies, `record` holds all the step
        needs (messages, metadata, this version's checkpoints, a parked turn's interrupts
        and answers). A run pinned to an agent version not in `hosted` (`<agent>@<version>`)
        is refused, ELSEWHERE, with nothing written."""
        reply = self.core.run_script(
            "claim_run", run_id, version=version, owner=owner, lease_ms=self.config.lease_ms,
            max_attempts=self.config.max_attempts, hosts="\n".join(hosted))
        return results.claimed(reply, run_id, version)

    def renew(self, run_id: str, version: int, owner: str) -> bool:
        """The heartbeat of the worker holding the claim: False when the claim is not its
        own any more (the step must not commit)."""
        reply = self.core.run_script("renew_lease", run_id, version=version, owner=owner,
                                     lease_ms=self.config.lease_ms)
        return bool(reply[0] == "ok")

    def save_checkpoint(self, run_id: str, version: int, owner: str, name: str,
                        value: Any) -> bool:
        reply = self.core.run_script(
            "save_checkpoint", run_id, version=version, owner=owner, field=name, value=dumps(value),
            lease_ms=self.config.lease_ms)
        return bool(reply[0] == "ok")

    def checkpoints(self, run_id: str, version: int) -> dict[str, Any]:
        raw = cast("dict[str, str]",
                   self.redis.hgetall(self.core.keys_of(run_id).checkpoints(run_id)))
        if raw.get("v") != str(version):
            return {}
        return {k: json.loads(v) for k, v in raw.items() if k != "v"}

    def advance(self, run_id: str, version: int, owner: str, messages: list[Message],
                event: dict[str, Any], *, inline: bool,
                exhausted: Sequence[str] = ()) -> Transition:
        """Commit a turn that goes on. `event`: the step's, as readers get it (`_event`).
        `exhausted` (here and in the other commits): the tools whose calls ran out of
        attempts in the step, counted for /metrics."""
        data, added = event_args(event)
        reply = self.core.run_script(
            "advance_turn", run_id, version=version, owner=owner,
            messages=dumps(dump_messages(messages)), event=data, added=added, keep_lease=inline,
            lease_ms=self.config.lease_ms, exhausted=list(exhausted))
        return results.committed(reply)

    def schedule_retry(self, run_id: str, version: int, owner: str, wait: RetryWait,
                       due_ms: int, event: dict[str, Any], *, checkpoints: Mapping[str, Any],
                       tools: Sequence[str]) -> Transition:
        """The step's failed tool calls wait to be tried again: the run is `retrying` until
        `due_ms`, when the sweeper queues the step again at `version` (`due_retries`,
        `requeue`). `checkpoints`: what the step holds that is not saved yet (saved now);
        `tools`: the tool of each call tried again (counted for /metrics)."""
        reply = self.core.run_script("schedule_retry", run_id, version=version, owner=owner,
                                     retry=dumps(wait.wire()), due_ms=due_ms, event=dumps(event),
                                     checkpoints={k: dumps(v) for k, v in checkpoints.items()},
                                     tools=list(tools))
        return results.scheduled(reply, version)

    def park(self, run_id: str, version: int, owner: str, messages: list[Message],
             interrupts: list[Interrupt], event: dict[str, Any], *,
             plan: Announcements | None = None,
             by_rule: dict[str, Answer] | None = None,
             exhausted: Sequence[str] = (), audit: Sequence[str] = ()) -> Transition:
        """Park the run on `interrupts` and record `plan`, the announcements of those that
        wait on people (None: queue the announcement task to plan them). `by_rule`: the
        answers policy rules give (by interrupt id), recorded in the park."""
        parked: list[dict[str, Any]] = []
        for intr in interrupts:
            expires = None
            if intr.expires_at:
                moment = datetime.fromisoformat(intr.expires_at.replace("Z", "+00:00"))
                expires = int(moment.timestamp() * 1000)
            auto = (by_rule or {}).get(intr.id)
            parked.append({"id": intr.id, "record": codecs.stored_interrupt(intr),
                           "expires": expires, "auto": dumps(auto.wire()) if auto else None,
                           "rule": intr.rule, "asks": names_asked([intr])})
        given, grant_keys = plan_args(plan or Announcements())
        # A park's event is stored without messages, as the earlier steps' events of a
        # parked run are: the history holds them (parking.events fills them in).
        data, _ = event_args(event)
        reply = self.core.run_script("park_run", run_id, version=version, owner=owner,
                                     messages=dumps(dump_messages(messages)), event=data,
                                     announce=plan is None, interrupts=parked, plan=given,
                                     exhausted=list(exhausted), audit=list(audit),
                                     extra_keys=grant_keys)
        return results.committed(reply)

    def complete(self, run_id: str, version: int, owner: str, messages: list[Message],
                 result: str, event: dict[str, Any],
                 exhausted: Sequence[str] = ()) -> Transition:
        data, added = event_args(event)
        reply = self.core.run_script("complete_run", run_id, version=version, owner=owner,
                                     messages=dumps(dump_messages(messages)), result=result,
                                     event=data, added=added, retention_s=self.config.retention_s,
                                     exhausted=list(exhausted))
        return results.committed(reply)

    def fail(self, run_id: str, error: dict[str, Any], *, version: int | None = None,
             owner: str | None = None, messages: list[Message] | None = None,
             exhausted: Sequence[str] = ()) -> Transition:
        reply = self.core.run_script(
            "fail_run", run_id, version="" if version is None else version, owner=owner or "",
            error=dumps(error), messages="" if messages is None else dumps(dump_messages(messages)),
            retention_s=self.config.retention_s, exhausted=list(exhausted))
        return results.committed(reply)

    def cancel(self, run_id: str, by: str, reason: str | None,
               audit: Sequence[str] = (), *, slack: bool = False) -> Transition:
        """`slack`: the update of the Slack messages of what it leaves unanswered is among
        the result's `entries` (`answers.answer`)."""
        data = {"code": "cancelled", "message": reason or "cancelled", "by": by}
        reply = self.core.run_script("cancel_run", run_id, event=dumps(data),
                                     retention_s=self.config.retention_s, audit=list(audit),
                                     slack=slack)
        return results.committed(reply)

    def requeue(self, run_id: str, *, owner: str = "") -> Transition:
        """Queue the run's pending step again. `owner`: '' once its lease lapsed (or its
        retry is due), '*' now."""
        reply = self.core.run_script("requeue_run", run_id, owner=owner)
        return results.requeued(reply)

    def revoke_tokens(self, run_id: str, by: str, audit: Sequence[str] = ()) -> int | None:
        """Refuse the run's run tokens minted until now; when that is (ms), or None for a
        run that is not there."""
        reply = self.core.run_script("revoke_tokens", run_id, by=by, audit=list(audit))
        return int(reply[1]) if reply[0] == "ok" else None

    def view(self, run_id: str) -> RunView | None:
        # One round trip, and one moment: the run, its interrupts and its notifications.
        keys = self.core.keys_of(run_id)
        return view_of(run_id, *self.core.pipelined(
            lambda pipe: read_view(pipe, keys, run_id), transaction=True))

    def views(self, run_ids: Sequence[str]) -> list[RunView]:
        """The runs of `run_ids` that still exist, in that order: one round trip (two while
        the store moves to the sharded layout), each run read at one moment."""
        if not run_ids:
            return []

        def fill(pipe: Any) -> None:
            for run_id, keys in zip(run_ids, self.core.located(run_ids), strict=True):
                read_view(pipe, keys, run_id)
        replies = self.core.pipelined(fill)
        found = (view_of(run_id, *replies[3 * at:3 * at + 3])
                 for at, run_id in enumerate(run_ids))
        return [view for view in found if view is not None]

    def events(self, run_id: str, after: str = "0-0", *, block_ms: int | None = None,
               count: int = 500) -> list[Event]:
        return events.read(self.redis, self.core.keys_of(run_id).events(run_id), after,
                           block_ms=block_ms, count=count)

    def last_park(self, run_id: str, interrupt_ids: set[str] | None = None) -> Event | None:
        """The run's newest `run.interrupted` event (that parked on one of `interrupt_ids`)."""
        return events.last_park(self.redis, self.core.keys_of(run_id).events(run_id),
                                interrupt_ids)

    def lease_of(self, run_id: str) -> tuple[str | None, int | None]:
        """Who holds the run's claim, and until when (ms)."""
        owner, until = cast("list[str | None]", self.redis.hmget(
            self.core.keys_of(run_id).run(run_id), "lease_owner", "lease_until"))
        # Most commits leave them empty ('' and 0: one call fewer); a park and the end of a
        # run delete them.
        return owner or None, int(until) if until and until != "0" else None

    def whose(self, run_id: str) -> Ownership:
        """Whose the run is (`Ownership`): one read, for the checks of who may see and act
        on it."""
        tenant, by, status, after = cast("list[str | None]", self.redis.hmget(
            self.core.keys_of(run_id).run(run_id), "tenant", "by", "status", "tokens_after"))
        if status is None:
            return Ownership(False)
        return Ownership(True, tenant or DEFAULT_TENANT, by, Status(status),
                         int(after) if after else None)

    def status_of(self, run_id: str) -> tuple[Status | None, int | None]:
        """The run's status and when it last changed (ms)."""
        status, updated = cast("list[str | None]", self.redis.hmget(
            self.core.keys_of(run_id).run(run_id), "status", "updated_at"))
        return Status(status) if status else None, int(updated) if updated else None


def read_view(pipe: Any, keys: Keys, run_id: str) -> None:
    pipe.hgetall(keys.run(run_id))
    pipe.hgetall(keys.answers(run_id))
    pipe.hgetall(keys.review(run_id))


def view_of(run_id: str, raw: dict[str, str], given: dict[str, str],
            review: dict[str, str]) -> RunView | None:
    if not raw:
        return None
    specs, answers, open_ids = interrupts_of(prefixed(raw, INTERRUPT), given,
                                             open_of(raw.get("open")))
    reviews = reviews_of(review)
    messages = load_messages(json.loads(raw["messages"]))
    input = json.loads(raw["input"]) if "input" in raw else first_text(messages)
    return RunView(
        id=run_id, agent=raw["agent"], status=Status(raw["status"]),
        version=int(raw["version"]), agent_version=raw.get("agent_version"),
        pinned=raw.get("pinned") == "1", input=input,
        messages=messages,
        interrupts=[InterruptView.of(s, answers.get(s.id), s.id in open_ids,
                                     reviews.get(s.id)) for s in specs],
        notifications=notifications_of(prefixed(raw, NOTE)),
        result=raw.get("result"), error=json.loads(raw["error"]) if raw.get("error") else None,
        metadata=codecs.metadata(raw.get("metadata")),
        retry=retry_of(raw.get("retry")), tenant=raw.get("tenant", DEFAULT_TENANT),
        started_by=raw.get("by"), created_at=iso(raw["created_at"]),
        updated_at=iso(raw["updated_at"]))
