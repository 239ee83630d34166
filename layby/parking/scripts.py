"""Loads the Lua transition scripts in `lua/`, each registered once per client, and lays out
what they are given.

Every script begins `#!lua` (`flags=no-writes` for those that only read): a Redis or
Valkey Cluster then refuses a script that reaches a key of another slot than its keys',
and a full server still runs the reading ones. Then comes `lua/_args.lua`: it reads its
arguments by name. `argv` lays a
mapping out as ARGV (name, value, name, value, …): a string as it is, an int as its
digits, a bool as '1' or '0', and a list or a dict (a repeated group: a park's interrupts,
an answer's answers, a plan; ids) as one argument, JSON whose objects have named members,
a member that is None left out. A record the script stores as it is goes as a string
inside it. A call whose arguments do not fit the script's (one missing, one it does not
read, a name without a value) is refused before the script writes anything. KEYS stay
positional (a Redis Cluster routes by them).

Run scripts get the task queueing (`lua/_queue.lua`) and the shared prelude
(`lua/_prelude.lua`) and the KEYS layout it documents; scripts on global keys only
(outbox, due notifications, live workers) stand alone, or with the queueing alone when they
queue tasks; the two that fold a parked run's events and read them back share
`lua/_folding.lua`. Each carries only the shared definitions it uses (`used_of`): a script
runs all of its source at every call. Settings the scripts need are written into their
source: scripts of one configuration have one SHA1 whichever process loads them. So are
the short names a run's hash stores its notifications under, and an interrupt's reason
(`parking.codecs`): the table is Python's alone, and the Lua reads and writes by it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from redis import Redis
from redis.commands.core import Script

from layby.parking import codecs

RUN_SCRIPTS = ("create_run", "claim_run", "renew_lease", "save_checkpoint", "advance_turn",
               "park_run", "complete_run", "fail_run", "cancel_run", "answer_interrupts",
               "expire_interrupt", "requeue_run", "plan_notifications", "start_delivery",
               "finish_delivery", "retry_notifications", "delegate_interrupt",
               "schedule_retry", "revoke_tokens")
# Scripts on global keys only, without the prelude; those that queue tasks get `_queue`.
STANDALONE_SCRIPTS = ("claim_outbox", "ack_outbox", "claim_due_notifications",
                      "beat_worker", "reap_workers", "switch_format", "count_versions",
                      "move_run", "move_members", "move_key", "merge_stats", "record_audit",
                      "index_asks", "find_due")
QUEUEING_SCRIPTS = ("claim_due_notifications",)
# Scripts on one run's hash and events alone, with what folds and unfolds its events.
FOLDING_SCRIPTS = ("fold_events", "read_events")
# Scripts that write nothing: flagged so (`#!lua flags=no-writes`), they still run on a
# server full under `noeviction`, as plain reads do.
READING_SCRIPTS = ("count_versions", "read_events", "find_due")
# Scripts that move what a store of format 1 holds in the legacy layout into the sharded
# one (migration 2): keys of several slots, on one server (a legacy store is never on a
# cluster).
CROSS_SLOT_SCRIPTS = ("move_run", "move_members", "move_key", "merge_stats")

# Upper bounds (seconds) of the latency histograms the scripts count in `stats`: park →
# answer (people: seconds to days), last answer → a worker taking the run up (queues).
LATENCY_BUCKETS_S: dict[str, tuple[float, ...]] = {
    "answer": (10, 60, 300, 900, 3600, 14400, 86400, 604800),
    "resume": (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
}


@dataclass(frozen=True)
class QueuedTask:
    """A task the scripts queue: its name and queue, and, when the broker is the store's
    server, the key of its queue and the message to push there (with placeholders)."""

    task: str
    queue: str
    key: str | None = None
    message: str | None = None


@dataclass(frozen=True)
class ScriptSettings:
    events_max: int
    outbox_grace_ms: int
    lost_message_ms: int
    tasks: Mapping[str, QueuedTask]  # by kind: turn, resume, notify, deliver
    audit_keep_ms: int = 90 * 86_400_000  # the audit trail's retention


def _lua_buckets() -> str:
    return "{" + ", ".join(f"{what} = {{{', '.join(repr(b) for b in bounds)}}}"
                           for what, bounds in LATENCY_BUCKETS_S.items()) + "}"


def _lua_string(text: str) -> str:
    """`text` as a Lua long string, whatever it holds: its level is one whose closing
    bracket first appears where it closes (not inside, nor made with the text's own end),
    and a newline follows the opening, which Lua drops (so a leading one of the text's
    is kept)."""
    level = 1
    while (text + f"]{'=' * level}]").find(f"]{'=' * level}]") != len(text):
        level += 1
    return f"[{'=' * level}[\n{text}]{'=' * level}]"


# A message's placeholders (layby.broker_config.messages), by the letter `_queue.lua` fills.
PLACEHOLDER = re.compile(r"@@([RVNTDASP])@@")


def _lua_pieces(message: str) -> str:
    """`message` as a Lua array of its text between placeholders (at odd places, as Lua
    counts from 1) and the placeholders' letters (at even places): the script joins them
    with the values in one pass, where a substitution a placeholder went over the whole
    message each time."""
    return "{" + ", ".join(_lua_string(p) for p in PLACEHOLDER.split(message)) + "}"


def _lua_tasks(tasks: Mapping[str, QueuedTask]) -> str:
    rows = []
    for kind, t in tasks.items():
        fields = [f"task = {_lua_string(t.task)}", f"queue = {_lua_string(t.queue)}"]
        if t.key is not None and t.message is not None:
            fields += [f"key = {_lua_string(t.key)}", f"message = {_lua_pieces(t.message)}"]
        rows.append(f"{kind} = {{{', '.join(fields)}}}")
    return "{" + ", ".join(rows) + "}"


@cache
def _source(name: str) -> str:
    return (resources.files("layby.parking") / "lua" / f"{name}.lua").read_text()


# A name or a value as Lua writes it without a long string: quoted.
_PLAIN = re.compile(r"[\w .:-]*", re.ASCII)


def _lua_value(value: str | int) -> str:
    """A str or an int (not a bool) as a Lua literal."""
    if isinstance(value, int):
        return str(value)
    return f"'{value}'" if _PLAIN.fullmatch(value) else _lua_string(value)


def _lua_table(mapping: Mapping[str, str | int]) -> str:
    return "{" + ", ".join(f"[{_lua_value(k)}] = {_lua_value(v)}"
                           for k, v in mapping.items()) + "}"


def shared_source(name: str) -> str:
    """A piece scripts share that names what a run's hash holds (`_notes`, `_folding`), as
    they get it: codecs' short names of a notification's fields and the values it leaves
    out, and of an interrupt's reason and the one it leaves out, written in."""
    return _filled(_source(name), None)


def _args(name: str) -> str:
    """The argument reader, as script `name`'s (its refusals name it)."""
    return _source("_args").replace("__SCRIPT__", _lua_string(name))


def _shebang(name: str) -> str:
    """Every script's first line: with it, a Redis or Valkey Cluster refuses a script that
    touches keys of another slot than those it was given (Redis 7, Valkey 7.2 on); without
    it, a script may touch any key. Those that move a store to the sharded layout say
    they touch several slots (`allow-cross-slot-keys`)."""
    if name in CROSS_SLOT_SCRIPTS:
        return "#!lua flags=allow-cross-slot-keys"
    return "#!lua flags=no-writes" if name in READING_SCRIPTS else "#!lua"


def folding_source(name: str) -> str:
    """A script of FOLDING_SCRIPTS (no settings in them: any process may load them)."""
    assert name in FOLDING_SCRIPTS
    return _assembled(name, ("_notes", "_folding"), None)


def source(name: str, settings: ScriptSettings) -> str:
    if name in FOLDING_SCRIPTS:
        return folding_source(name)
    if name in STANDALONE_SCRIPTS:
        return _assembled(name, ("_queue",) if name in QUEUEING_SCRIPTS else (), settings)
    return _assembled(name, ("_queue", "_notes", "_prelude"), settings)


def _assembled(name: str, pieces: tuple[str, ...], settings: ScriptSettings | None) -> str:
    """Script `name`: its first line, its argument reader, what it uses of the shared
    `pieces`, its own source; then the settings written in."""
    return _filled(_template(name, pieces), settings)


@cache
def _template(name: str, pieces: tuple[str, ...]) -> str:
    own = _source(name)
    shared = used_of("\n".join(_source(piece) for piece in pieces), own)
    return "\n".join((_shebang(name), _args(name), *((shared,) if shared else ()), own))


def _filled(text: str, settings: ScriptSettings | None) -> str:
    """`text` with what it names written in: the short names of `parking.codecs`, and the
    settings (a script that needs them is made with them)."""
    reason = codecs.INTERRUPT_NAMES["reason"]
    values = {"__NOTE_NAMES__": _lua_table(codecs.NOTE_NAMES),
              "__NOTE_IMPLIED__": _lua_table(codecs.NOTE_IMPLIED),
              "__INTERRUPT_REASON__": _lua_value(reason),
              "__INTERRUPT_REASON_IMPLIED__": _lua_value(codecs.INTERRUPT_IMPLIED[reason])}
    if settings is not None:
        values |= {"__TASKS__": _lua_tasks(settings.tasks),
                   "__LOST_MESSAGE_MS__": str(settings.lost_message_ms),
                   "__EVENTS_MAX__": str(settings.events_max),
                   "__OUTBOX_GRACE_MS__": str(settings.outbox_grace_ms),
                   "__AUDIT_KEEP_MS__": str(settings.audit_keep_ms),
                   "__LATENCY_BUCKETS_S__": _lua_buckets()}
    return _PLACEHOLDERS.sub(lambda found: values[found[0]], text)


# Where the pieces' templates take a value (`_filled`): `__NAME__`, in capitals.
_PLACEHOLDERS = re.compile(r"__[A-Z][A-Z_]*[A-Z]__")
# A definition at the top of a shared piece: `local function name(`, `local a, b = …`.
_DEFINES = re.compile(r"local\s+(?:function\s+)?(\w+(?:\s*,\s*\w+)*)")
_NAME = re.compile(r"\b[A-Za-z_]\w*")


def used_of(shared: str, own: str) -> str:
    """What script source `own` uses of the `shared` pieces' definitions, directly or
    through the definitions it uses, in their order.

    A script runs the whole of its source at every call (EVALSHA keeps nothing between
    calls): every helper it carries is made again each time, used or not. Carrying only
    those it names cut a claim from 72-83 to 55-59 µs of the server's time (docs/sizing.md).
    A local can only be reached by its name, so a definition whose names appear nowhere in
    what is kept is never reached; a name in a comment, a string or a field's name keeps
    its definition (more than needed, never less).

    The pieces are cut at each line that begins `local` (the comment lines just before go
    with it); any other line at the start of a line (a loop that fills a table, the `end`
    of a function) stays with the definition before it. Cut as templates, before values
    are written in (a value could hold such a line)."""
    # (names defined, lines); what comes before the first definition defines nothing.
    parts: list[tuple[list[str], list[str]]] = [([], [])]
    comments: list[str] = []
    for line in shared.split("\n"):
        if line.startswith("local "):
            found = _DEFINES.match(line)
            names = [n.strip() for n in found[1].split(",")] if found else []
            parts.append((names, [*comments, line]))
            comments = []
        elif line.startswith("--") or not line.strip():
            comments.append(line)
        else:
            parts[-1][1].extend([*comments, line])
            comments = []
    # A part that defines nothing stays; each kept part's names bring in their own.
    kept = [not names for names, _ in parts]
    used = _names_in(own)
    for (_, lines), keep in zip(parts, kept, strict=True):
        if keep:
            used |= _names_in("\n".join(lines))
    grew = True
    while grew:
        grew = False
        for i, (names, lines) in enumerate(parts):
            if not kept[i] and used.intersection(names):
                kept[i] = grew = True
                used |= _names_in("\n".join(lines))
    return "\n".join("\n".join(lines) for (_, lines), keep in zip(parts, kept, strict=True)
                     if keep and lines)


def _names_in(text: str) -> set[str]:
    """The names `text` may use: every word (a field's name too: `x.name`, more than
    needed, never less)."""
    return set(_NAME.findall(text))


def argv(named: Mapping[str, Any]) -> list[str]:
    """`named` as a script's ARGV, for `lua/_args.lua` to read (the module's docstring)."""
    out: list[str] = []
    for name, value in named.items():
        out += [name, _arg(name, value)]
    return out


def _arg(name: str, value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):  # (before int: a bool is one)
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, list | dict):
        return json.dumps(_without_none(value), separators=(",", ":"), ensure_ascii=False)
    raise TypeError(f"script argument {name}: a {type(value).__name__} has no ARGV form "
                    "(a str, an int, a bool, or a list or dict for JSON)")


def _without_none(value: Any) -> Any:
    """`value` with the None members of its dicts left out, all the way down: the scripts'
    cjson would read a null as a value, and a true one."""
    if isinstance(value, dict):
        return {k: _without_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_none(v) for v in value]
    return value


def standalone(client: Redis, name: str) -> Script:
    """A script of STANDALONE_SCRIPTS that queues nothing, for a reader without a store
    (no settings in it)."""
    assert name in STANDALONE_SCRIPTS and name not in QUEUEING_SCRIPTS
    return client.register_script("\n".join((_shebang(name), _args(name), _source(name))))


def register(client: Redis, settings: ScriptSettings) -> dict[str, Script]:
    return {name: client.register_script(source(name, settings))
            for name in (*RUN_SCRIPTS, *STANDALONE_SCRIPTS, *FOLDING_SCRIPTS)}
