"""The `layby` command: start everything, run the parts, enqueue and follow runs, answer them.

It talks to Redis directly (the same `control.commands` the HTTP API uses), so it needs
`LAYBY_REDIS_URL`, or a `layby up` running on this machine with the same `LAYBY_DATA_DIR`:
then it reads that one's settings (its agents, reviewers, mail) for whatever the LAYBY_*
variables leave unset (`Settings.of_this_folder`). The commands that start parts check
first what would stop them (settings, the user's modules, the reviewer directory, ports)
and refuse in one line with exit code 2.
"""

from __future__ import annotations

import functools
import json
import os
import shlex
import sys
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import redis
import typer
from pydantic import ValidationError

from layby.broker_config import SWEEP, Settings, logs, tracing, worker_queues
from layby.broker_config.settings import broker_shown, settings_problem
from layby.control import Runtime, build
from layby.errors import LaybyError
from layby.generation.interrupts import CONFIRMATION, ResumeEntry
from layby.ops.inbox_command import inbox as inbox_app
from layby.ops.keys_command import audit as audit_command
from layby.ops.keys_command import keys as keys_app
from layby.parking import Store
from layby.parking.formats import FormatError
from layby.wire import InterruptView, RetryWait, RunSummary, RunView, Status

if TYPE_CHECKING:
    from layby.ops.supervisor import System
    from layby.parking.formats import FormatState
    from layby.parking.keys import Keys

# No locals in tracebacks: they would print settings and keys.
cli = typer.Typer(help="layby: durable interrupts for agent runs on Celery and Redis.",
                  no_args_is_help=True, add_completion=False,
                  pretty_exceptions_show_locals=False)
runs = typer.Typer(help="List, inspect, answer, cancel and requeue runs.", no_args_is_help=True)
cli.add_typer(runs, name="runs")
ops = typer.Typer(help="On-call work: stuck runs, failed notifications, purging.",
                  no_args_is_help=True)
cli.add_typer(ops, name="ops")
cli.add_typer(keys_app, name="keys")
cli.command("audit")(audit_command)
cli.add_typer(inbox_app, name="inbox")
policy = typer.Typer(help="Reviewer policy rules: check a file, explain a decision.",
                     no_args_is_help=True)
cli.add_typer(policy, name="policy")


def main() -> None:
    # The user's own modules (LAYBY_AGENT_MODULES, LAYBY_TASK_MODULES) are found in the
    # current folder, as `celery -A` finds them; a console script's path does not have it.
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        cli()
    except FormatError as exc:
        _fail(exc.message, 2)
    except LaybyError as exc:
        # A refused answer's message alone does not say what was wrong with it.
        errors = exc.detail.get("errors", []) if isinstance(exc.detail, dict) else []
        _fail("".join([exc.message, *(f"\n  {e.get('path') or '/'}: {e.get('message')}"
                                      for e in errors)]))
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        _fail(f"Redis does not answer ({exc}): start it (`layby up`), or check "
              "LAYBY_REDIS_URL; `layby doctor` says more")
    except ValidationError as exc:
        if exc.title != Settings.__name__:
            raise
        _fail(f"{settings_problem(exc)} (fix it in the environment)", 2)


def _fail(message: str, code: int = 1) -> NoReturn:
    typer.secho(f"error: {message}", fg="red", err=True)
    raise SystemExit(code)


@functools.cache
def _rt() -> Runtime:
    """This command's runtime, built on first use (commands that start processes need
    none), with the settings of a `layby up` running in this folder for what the
    variables leave unset."""
    return build(Settings.of_this_folder())


def _check_config(settings: Settings) -> dict[str, Any]:
    """Refuse, in one line with exit code 2, to start a part that could not serve; the
    agents, when it could."""
    from layby.control.runtime import check_config

    try:
        return check_config(settings)
    except LaybyError as exc:
        _fail(exc.message, 2)


def _exec(argv: list[str]) -> NoReturn:
    os.execv(sys.executable, [sys.executable, *argv])


@cli.command()
def check() -> None:
    """Check the configuration as `layby up` and the workers read it: the settings, the
    agent and task modules (they import), the reviewer directory and rules (they load).
    One line, and exit code 2, on the first problem; what `layby up` runs first."""
    settings = Settings()
    agents = sorted(_check_config(settings))
    rules = settings.policy_file or settings.reviewers_file
    typer.echo(f"ok: agents {', '.join(agents) or 'none'}; task modules "
               f"{', '.join(settings.task_modules) or 'none'}; reviewers "
               f"{settings.reviewers_file or 'none configured'}; rules {rules or 'none'}")


@cli.command()
def up(port: Annotated[int, typer.Option(help="gateway port")] = 0,
       concurrency: Annotated[int, typer.Option(help="worker processes (default: cores)")] = 0,
       flower: Annotated[bool, typer.Option(help="start Flower too")] = True) -> None:
    """Start Redis (embedded unless LAYBY_REDIS_URL is set), a worker, the sweeper, the
    HTTP gateway and Flower; print where everything is; stop it all on Ctrl-C."""
    from layby.ops.supervisor import NotStarted, System

    settings = Settings()
    system = System(settings, port or settings.port, concurrency or None, flower)
    try:
        where = system.start()
    except NotStarted as exc:
        system.stop()
        _fail(str(exc), 2)
    except KeyboardInterrupt:  # Ctrl-C, SIGTERM or SIGHUP while starting
        system.stop()
        _fail("stopped while starting; nothing is left running", 130)
    except BaseException:  # a part that could not be started: none is left running
        system.stop()
        raise
    try:
        typer.echo(_up_banner(settings, system, where))
        code = system.wait()
    finally:
        try:
            typer.echo("layby: stopping…")
        except OSError:  # the terminal is gone (SIGHUP): stop all the same
            pass
        system.stop()
    raise SystemExit(code)


def _up_banner(settings: Settings, system: System, where: dict[str, str]) -> str:
    """What `layby up` prints once every part started: where each is, and a first thing
    to try."""
    return (
        f"layby is up\n"
        f"  gateway   {where['gateway']}   (API docs at {where['gateway']}/docs)\n"
        f"  api key   {where['api_key']}\n"
        f"  redis     {where['redis']}"
        + (f"   (embedded, append-only, malloc {system.redis.allocator})"
           if system.redis else "") + "\n"
        + (f"  broker    {broker_shown(settings.broker_url)}   (LAYBY_BROKER_URL)\n"
           if settings.broker_url and not settings.broker_is_store else "") +
        f"  data      {where['data_dir']}\n"
        f"  queues    {', '.join(worker_queues(settings))} (worker); {SWEEP} (sweeper)\n"
        f"  reviewers {where['reviewers']}\n"
        f"  inbox     {where['gateway']}/inbox   (reviewers sign in with a mailed link)\n"
        f"  replies   {where['replies']}   (the reply listener)\n"
        + (f"  flower    {where['flower']}   (basic auth {where['flower_auth']})\n"
           if where["flower"] else "")
        + (f"  mail      {where['gateway']}/mail   (the mail catcher keeps every "
           f"notification in {where['mail']})\n" if where["mail"] else "")
        + _try_line(settings) +
        f"      curl -H 'Authorization: Bearer {where['api_key']}' "
        f"{where['gateway']}/v1/runs\n"
        f"Ctrl-C stops everything.")


def _try_line(settings: Settings) -> str:
    if "layby.demo.agents" in settings.agent_modules:
        return ("try:  layby run demo.trivia 'Ask me a movie question'   "
                "(./dev run … in a checkout)\n")
    return "try:  layby agents   (your agents; then: layby run <agent> '<request>')\n"


@cli.command()
def worker(queues: Annotated[str | None, typer.Option(
               help="comma-separated queues (default: all but the sweeper's, and the intake)")
           ] = None,
           concurrency: Annotated[int, typer.Option(help="processes")] = 0,
           loglevel: str = "INFO", beat: Annotated[bool, typer.Option(
               help="also sweep, on the sweeper's own clock (one per deployment; "
                    "`layby sweeper` is the sweeper on its own)")] = False,
           agent_versions: Annotated[str | None, typer.Option(
               help="comma-separated agent versions whose pinned runs this worker runs, "
                    "instead of its agents' own (LAYBY_AGENT_VERSIONS)")] = None) -> None:
    """Run a Celery worker on layby's queues, and on the queues of the runs pinned to the
    versions of its agents it hosts (`layby.turns@<version>`)."""
    from layby.generation.agents import hosted
    from layby.ops.supervisor import worker_argv

    if agent_versions is not None:
        # The worker's own process reads it, as it reads every LAYBY_* setting.
        os.environ["LAYBY_AGENT_VERSIONS"] = agent_versions
    settings = Settings()
    agents = _check_config(settings)
    try:
        hosting = hosted(agents.values(), settings.agent_versions)
    except LaybyError as exc:
        _fail(exc.message, 2)
    typer.echo(f"hosting {', '.join(hosting) or 'no agent'}", err=True)
    chosen = queues.split(",") if queues else worker_queues(settings)
    # Named layby-<pid>@<host> as `layby up` names its worker: one worker per queue on the
    # same machine must not share Celery's default node name.
    _exec(worker_argv(settings, chosen, concurrency or None, loglevel, sweeps=beat)[1:])


@cli.command()
def sweeper() -> None:
    """Run the sweeper: a one-process worker on the sweep queue that sweeps every
    LAYBY_SWEEP_INTERVAL_S on its own clock. Run one per deployment."""
    from layby.ops.supervisor import sweeper_argv

    settings = Settings()
    _check_config(settings)
    _exec(sweeper_argv(settings)[1:])


@cli.command()
def gateway(host: Annotated[str | None, typer.Option()] = None,
            port: Annotated[int | None, typer.Option()] = None) -> None:
    """Run the HTTP gateway."""
    from layby.ops.supervisor import NotStarted, check_ports, gateway_argv

    settings = Settings()
    _check_config(settings)
    host, port = host or settings.host, port or settings.port
    try:
        check_ports({"gateway": (host, port, "--port or LAYBY_PORT")})
    except NotStarted as exc:
        _fail(str(exc), 2)
    _exec(gateway_argv(host, port, log_level=None)[1:])


@cli.command()
def flower(host: Annotated[str | None, typer.Option(
               help="address to bind (default LAYBY_FLOWER_HOST, 127.0.0.1)")] = None,
           port: Annotated[int | None, typer.Option(
               help="port (default LAYBY_FLOWER_PORT, 5555)")] = None) -> None:
    """Run Flower on layby's Celery app with authentication on: basic auth from
    LAYBY_FLOWER_BASIC_AUTH or <data dir>/flower.auth (passed in Flower's environment,
    never on the command line), or Flower's OAuth (FLOWER_AUTH, FLOWER_OAUTH2_*)."""
    from layby.ops.flower import FlowerAuthMissing, flower_argv, flower_env

    settings = Settings()
    try:
        env = flower_env(settings)
    except FlowerAuthMissing as exc:
        _fail(str(exc), 2)
    argv = flower_argv(settings, host, port)
    os.execve(sys.executable, argv, env)


@cli.command("reply-listener")
def reply_listener(host: Annotated[str | None, typer.Option()] = None,
                   port: Annotated[int | None, typer.Option()] = None) -> None:
    """Run the SMTP listener that takes reviewers' email replies (reply+<token>@…). Point
    the MX of LAYBY_INBOUND_DOMAIN (or your mail provider's forwarding) at it."""
    from layby.answering.listener import ReplyHandler, serve
    from layby.control.announce import about, announce, process_name, withdraw
    from layby.parking import migrations

    rt = _rt()
    logs.configure(rt.settings)
    tracing.configure("listener")
    rt.store  # noqa: B018 (made, it has checked the store's format: refused, it exits 2)
    stop, newest, name = threading.Event(), migrations.newest(), process_name("listener")
    announce(lambda: rt.store, name, about("listener", newest), newest,
             rt.settings.heartbeat_interval_s, stop)
    try:
        serve(host or rt.settings.reply_listener_host, port or rt.settings.reply_listener_port,
              ReplyHandler(rt), "layby reply listener", rt.settings.max_mail_bytes)
    finally:
        stop.set()
        withdraw(lambda: rt.store, name)


@cli.command("mail-catcher")
def mail_catcher(port: Annotated[int | None, typer.Option()] = None) -> None:
    """Run a local SMTP server that keeps every mail (for trying layby on one machine;
    `layby up` starts it). Read them at <gateway>/mail."""
    from layby.answering.catcher import CatcherHandler
    from layby.answering.listener import serve

    settings = Settings()
    logs.configure(settings)
    folder = settings.mail_catcher_dir or settings.data_dir / "mail"
    serve("127.0.0.1", port or settings.mail_catcher_port,
          CatcherHandler(folder, settings.public_url), "layby mail catcher",
          settings.max_mail_bytes)


@cli.command()
def secret(kind: Annotated[str, typer.Argument(help="'tokens' or 'webhook'")]) -> None:
    """Print a new secret: a token key for LAYBY_TOKEN_KEYS (put it first to rotate), or a
    Standard Webhooks secret for a reviewer's webhook."""
    import base64
    import secrets as _secrets

    from layby.reviewers.tokens import new_keys

    if kind == "tokens":
        typer.echo(new_keys())
    elif kind == "webhook":
        typer.echo("whsec_" + base64.b64encode(_secrets.token_bytes(32)).decode())
    else:
        _fail(f"unknown kind {kind!r}: use 'tokens' or 'webhook'", 2)


@cli.command()
def doctor() -> None:
    """Check what guards parked work: Redis persistence and eviction, clocks, Celery's
    loss settings, SMTP, reviewers and token keys. Exits 1 if anything needs fixing."""
    from layby.broker_config import make_celery
    from layby.control import connections
    from layby.errors import ConfigError
    from layby.ops.doctor import run_checks

    settings = Settings.of_this_folder()
    client = sentinel = None
    error = None
    try:
        if settings.resolved_redis_url():
            sentinel = connections.sentinel(settings, timeout_s=5)
            client = connections.redis_client(settings, timeout_s=5)
    except ConfigError as exc:
        error = exc.message
    checks = run_checks(settings, client, make_celery(settings).conf, sentinel=sentinel,
                        redis_error=error)
    for check in checks:
        typer.secho(check.line(), fg=None if check.ok else "red")
    raise SystemExit(0 if all(c.ok for c in checks) else 1)


@cli.command()
def migrate(dry_run: Annotated[bool, typer.Option(
                "--dry-run", help="count what would change; change nothing")] = False,
            batch: Annotated[int, typer.Option(min=1, max=10_000,
                                               help="keys per batch")] = 500,
            finish: Annotated[bool, typer.Option(
                "--finish", help="write the newer format now, without waiting for the "
                                 "processes of the older release to leave the registry "
                                 "(when you know they are gone)")] = False) -> None:
    """Bring the store's records to the newest format this layby knows, online, in
    batches. Safe to run again: what is done is not done twice, and a run that was killed
    goes on where it stopped. While a deployment rolls, the store keeps writing the older
    format until no process of the older release is left; only then are its records
    migrated (`--finish` does not wait)."""
    from layby.control import connections
    from layby.parking import formats, migrations
    from layby.parking.keys import Keys

    settings = Settings.of_this_folder()
    client = connections.redis_client(settings)
    keys = Keys(settings.key_prefix)
    state = formats.read(client, keys)
    todo = migrations.pending(state)
    if not todo:
        typer.echo(f"nothing to do: the store is at format {state.version}, the newest this "
                   f"layby knows")
        return
    if not dry_run and state.version is not None:
        _write_from_now(client, keys, state, todo[0].number, finish)
    total = int(client.dbsize())
    label = "counting" if dry_run else "migrating"
    with typer.progressbar(length=max(1, total * len(todo)), label=label, file=sys.stderr,
                           show_pos=True) as bar:
        step = bar.update
        reports = (migrations.dry_run(client, keys, batch=batch, progress=step) if dry_run
                   else migrations.migrate(client, keys, batch=batch, progress=step,
                                           shards=settings.store_shards))
    verb = "would change" if dry_run else "changed"
    for r in reports:
        typer.echo(f"migration {r.number} ({r.title}): {r.seen} keys looked at, {r.changed} "
                   f"{verb}")
    if not dry_run:
        after = formats.read(client, keys)
        typer.echo(f"the store is at format {after.version}")


def _write_from_now(client: redis.Redis, keys: Keys, state: FormatState, format: int,
                    force: bool) -> None:
    """Before a migration moves records: the store writes `format` (switched to it unless
    it does already), and every process does too, which it waits for."""
    from layby.parking import formats

    if (state.written or 0) < format:
        _switch_to(format, force)
    waited = formats.settle_after_switch(client, keys)
    if waited:
        typer.echo(f"waited {waited:.1f} s for every process to write format "
                   f"{format}", err=True)


def _switch_to(format: int, force: bool) -> None:
    """The store writes `format` from now on: once no live process is older (or now,
    with `force`); else the command refuses, naming them."""
    store = _rt().store
    older = {name: told for name, told in store.processes.live_processes().items()
             if not told or int(told.split()[1]) < format}
    reply = store.processes.switch_format(format, force=force, shards=_rt().settings.store_shards)
    if reply[0] == "older":
        names = ", ".join(f"{name} ({told or 'no version'})" for name, told in older.items())
        _fail(f"processes of an older release are alive: {names}; the store writes format "
              f"{format - 1} until they are gone (stop them, or wait a lease after they "
              f"were killed), then run this again; `--finish` if you know they are gone")
    if reply[0] not in ("switched", "already"):
        _fail(f"the store cannot switch to format {format} ({' '.join(reply)})")
    if force and older:
        typer.secho(f"warning: switched to format {format} with processes of an older "
                    f"release in the registry: {', '.join(older)}", fg="yellow", err=True)


@cli.command()
def agents() -> None:
    """List the agents this machine loads (LAYBY_AGENT_MODULES)."""
    for agent in _rt().agents.values():
        pinned = " (pins)" if agent.on_change == "pin" else ""
        typer.echo(f"{agent.name:18} {agent.version}{pinned:7} {agent.description}")


@cli.command("run")
def run_agent(agent: str, text: str,
              follow: Annotated[bool, typer.Option(help="follow until it ends or waits")] = True,
              idempotency_key: Annotated[str | None, typer.Option()] = None) -> None:
    """Enqueue a run of AGENT with TEXT as the user's request, and follow it. At a terminal,
    interrupts are asked on the spot; elsewhere the command says how to answer them."""
    from layby.control import commands

    view, _ = commands.start_run(_rt(), agent, input=text, idempotency_key=idempotency_key)
    typer.echo(f"run {view.id} ({agent}) queued")
    if follow:
        raise SystemExit(_follow(view.id))


def _follow(run_id: str) -> int:
    from layby.control import commands

    store = _rt().store
    after = "0-0"
    while True:
        for event in store.runs.events(run_id, after, block_ms=2000):
            after = event.id
            _print_event(event.type, event.data)
            if event.type == "run.completed":
                typer.echo(commands.get_run(_rt(), run_id).result or "")
                return 0
            if event.type in ("run.failed", "run.cancelled"):
                return 1
            if event.type == "run.interrupted":
                view = commands.get_run(_rt(), run_id)
                if view.status is not Status.INTERRUPTED:
                    continue
                if not sys.stdin.isatty():
                    _print_open(view)
                    return 0
                _ask(view)


def _print_event(kind: str, data: Any) -> None:
    if kind == "turn.committed":
        for message in data.get("messages", []):
            for part in message.get("content", []):
                if part.get("text"):
                    typer.echo(f"  {message['role']}: {part['text']}")
                elif part.get("toolRequest") and "interrupt" not in (part.get("metadata") or {}):
                    req = part["toolRequest"]
                    typer.echo(f"  model → {req['name']}({json.dumps(req.get('input'))})")
                elif part.get("toolResponse"):
                    resp = part["toolResponse"]
                    typer.echo(f"  {resp['name']} → {json.dumps(resp.get('output'))}")
    elif kind == "interrupt.answered":
        typer.echo(f"  answered {data.get('interruptId')}: {data.get('status')} by "
                   f"{data.get('answeredBy')} via {data.get('channel')}")
    elif kind == "run.retrying":
        for call in data.get("calls", []):
            typer.secho(f"  {call.get('toolName')} failed ({call.get('lastError')}): attempt "
                        f"{call.get('attempt')} of {call.get('maxAttempts')} at "
                        f"{data.get('nextAttemptAt')}", fg="yellow")
    elif kind in ("run.failed", "run.cancelled"):
        typer.secho(f"  {kind}: {data.get('message')}", fg="red")
    elif kind in ("run.interrupted", "run.resuming", "run.requeued"):
        typer.echo(f"  {kind}")


def _open(view: RunView) -> list[InterruptView]:
    return [i for i in view.interrupts if i.state.value == "open"]


def _print_open(view: RunView) -> None:
    for intr in _open(view):
        typer.echo(f"  waiting: {intr.id} [{intr.reason}] {intr.message or ''}")
        if intr.response_schema:
            typer.echo(f"    answer schema: {json.dumps(intr.response_schema)}")
        typer.echo(f"answer with: layby runs answer {view.id} {intr.id} {_answer_flags(intr)}")


def _answer_flags(intr: InterruptView) -> str:
    """The `runs answer` options that fit what the interrupt asks for: the hint a person
    can paste (ids filled in), not a template to fill."""
    from layby.reviewers.schemas import is_confirmation

    if is_confirmation(intr):
        return "--approve   (or: --decline --reason TEXT)"
    schema = intr.response_schema or {}
    if schema.get("type") == "string":
        choices = schema.get("enum") or []
        return (f"--text {shlex.quote(str(choices[0]))}   (one of: "
                f"{', '.join(map(str, choices))})" if choices else "--text TEXT")
    return "--payload JSON" if schema else "--text TEXT   (or: --payload JSON)"


def _ask(view: RunView) -> None:
    from layby.control import commands

    for intr in _open(view):
        typer.echo(f"? {intr.message or intr.reason}")
        entry = _prompt_answer(intr)
        try:
            commands.answer(_rt(), view.id, [entry], by=f"cli:{_user()}", channel="cli")
        except LaybyError as exc:
            typer.secho(f"  refused: {exc.message}", fg="red")
            return _ask(commands.get_run(_rt(), view.id))


def _prompt_answer(intr: InterruptView) -> ResumeEntry:
    schema = intr.response_schema or {}
    if intr.reason == CONFIRMATION:
        yes = typer.confirm("  approve?", default=False)
        return ResumeEntry(interrupt_id=intr.id, status="resolved" if yes else "cancelled",
                           payload={"approved": True} if yes else None,
                           metadata=None if yes else {"reason": "declined at the terminal"})
    choices = schema.get("enum")
    if choices:
        for n, choice in enumerate(choices, 1):
            typer.echo(f"  {n}. {choice}")
        # A number of the list (typer has no IntRange of its own since it vendors click).
        picked: int = typer.prompt("  choice", type=int)
        while not 1 <= picked <= len(choices):
            typer.secho(f"  Error: {picked} is not in the range 1<=x<={len(choices)}.", fg="red")
            picked = typer.prompt("  choice", type=int)
        return ResumeEntry(interrupt_id=intr.id, status="resolved", payload=choices[picked - 1])
    raw = typer.prompt("  answer")
    return ResumeEntry(interrupt_id=intr.id, status="resolved", payload=_json_or_text(raw, schema))


def _json_or_text(raw: str, schema: dict[str, Any]) -> Any:
    if schema.get("type") == "string":
        return raw
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def _user() -> str:
    return os.environ.get("USER") or "unknown"


@runs.command("ls")
def runs_ls(status: Annotated[Status | None, typer.Option(help="only runs in this state")] = None,
            limit: Annotated[int, typer.Option(min=1, help="at most this many")] = 50,
            every: Annotated[bool, typer.Option("--all", help="every run, however many")]
            = False,
            agent_version: Annotated[str | None, typer.Option(
                help="only runs started on this version of their agent")] = None) -> None:
    """List runs, newest first, a page at a time."""
    for r in _every_run(_rt().store, status, None if every else limit, agent_version):
        waiting = f"  {r.open_interrupts} open" if r.open_interrupts else ""
        if r.retry is not None:
            waiting += "  " + _retrying(r.retry)
        typer.echo(f"{r.id}  {r.status.value:11}  {r.agent:16} {r.agent_version or '-':12} "
                   f"{r.updated_at}{waiting}")


def _retrying(wait: RetryWait) -> str:
    """What a run waits to try again: each call's tool and next attempt, and when."""
    calls = ", ".join(f"{c.tool_name} attempt {c.attempt} of {c.max_attempts}"
                      for c in wait.calls)
    return f"{calls} at {wait.next_attempt_at}"


def _every_run(store: Store, status: Status | None, limit: int | None,
               agent_version: str | None = None) -> Iterator[RunSummary]:
    """Runs, newest first, following the list's cursor (each page costs the same)."""
    cursor: str | None = None
    left = limit
    while left is None or left > 0:
        size = 500 if left is None else min(500, left)
        page, cursor = store.lists.list_page(status, limit=size, cursor=cursor,
                                             agent_version=agent_version)
        yield from page
        if left is not None:
            left -= len(page)
        if cursor is None:
            return


@runs.command("show")
def runs_show(run_id: str, as_json: Annotated[bool, typer.Option("--json")] = False,
              timeline: Annotated[bool, typer.Option(
                  "--timeline", help="what happened when: each step, on which worker, how "
                                     "long its model and tool calls took, where it waited "
                                     "and for whom, retries, answers")] = False) -> None:
    """Show a run: its state, history, interrupts and who answered them."""
    from layby.control import commands
    from layby.control import timeline as timelines

    rt = _rt()
    view = commands.get_run(rt, run_id)
    if timeline:
        entries = timelines.of_run(rt.store, run_id)
        if as_json:
            typer.echo(json.dumps([e.wire() for e in entries], indent=2))
            return
        typer.echo(f"{view.id}  {view.agent}  {view.status.value}  created {view.created_at}")
        for line in timelines.render(entries):
            typer.echo(line)
        return
    if as_json:
        typer.echo(json.dumps(view.wire(), indent=2))
        return
    typer.echo(f"{view.id}  {view.agent}  {view.status.value}  v{view.version}")
    if view.retry is not None:
        typer.echo(f"  waits to try again: {_retrying(view.retry)}")
        for call in view.retry.calls:
            typer.echo(f"    {call.tool_name} ({call.tool_call_id}) last error: {call.last_error}")
    if view.agent_version:
        typer.echo(f"  agent version {view.agent_version}"
                   + (" (pinned: its steps run only where it is hosted)" if view.pinned
                      else ""))
    _show_history(view)
    for intr in view.interrupts:
        _show_interrupt(intr, view)
    if view.result:
        typer.echo(f"result: {view.result}")
    if view.error:
        typer.echo(f"error [{view.error.get('code')}]: {view.error.get('message')}")


def _show_history(view: RunView) -> None:
    """The run's messages, a line a part: text, a tool call with its input, a tool's
    output."""
    for message in view.messages:
        for part in message.content:
            if part.text:
                typer.echo(f"  {message.role}: {part.text}")
            elif part.tool_request:
                typer.echo(f"  {message.role} → {part.tool_request.name}"
                           f"({json.dumps(part.tool_request.input)})")
            elif part.tool_response:
                typer.echo(f"  {part.tool_response.name} → "
                           f"{json.dumps(part.tool_response.output)}")


def _show_interrupt(intr: InterruptView, view: RunView) -> None:
    """One interrupt of the run: its state and who answered, then what else is known of
    its review (the agent version that asked, the rule, approvals, escalation, hand-overs)."""
    who = (f" by {intr.answer.answered_by} via {intr.answer.channel} at "
           f"{intr.answer.answered_at}" if intr.answer else "")
    typer.echo(f"  interrupt {intr.id} [{intr.reason}] {intr.state.value}{who}: "
               f"{intr.message or ''}")
    if intr.agent_version and intr.agent_version != view.agent_version:
        typer.echo(f"    asked on agent version {intr.agent_version}")
    if intr.rule:
        typer.echo(f"    rule {intr.rule}")
    if intr.required_approvals > 1:
        typer.echo(f"    approvals {len(intr.approvals)} of {intr.required_approvals}: "
                   + (", ".join(f"{a.answered_by} via {a.channel}" for a in intr.approvals)
                      or "none yet"))
    if intr.escalation_level:
        typer.echo(f"    escalated to level {intr.escalation_level}")
    for handed in intr.delegations:
        typer.echo(f"    handed from {handed.reviewer} to {handed.to} by {handed.by} "
                   f"via {handed.channel} at {handed.at}")


@runs.command("answer")
def runs_answer(run_id: str, interrupt_id: Annotated[str | None, typer.Argument(
                    help="which interrupt (optional when only one is open)")] = None,
                approve: bool = False, decline: bool = False,
                text: Annotated[str | None, typer.Option(help="a text answer")] = None,
                payload: Annotated[str | None, typer.Option(help="a JSON answer")] = None,
                reason: Annotated[str | None, typer.Option(help="why (with --decline)")] = None,
                replace_input: Annotated[str | None, typer.Option(
                    help="JSON: new arguments for the tool (with --approve)")] = None) -> None:
    """Answer one interrupt of a run."""
    from layby.control import commands

    chosen = [x for x in (approve, decline, text is not None, payload is not None) if x]
    if len(chosen) != 1:
        _fail("give exactly one of --approve, --decline, --text, --payload", 2)
    view = commands.get_run(_rt(), run_id)
    if interrupt_id is None:
        waiting = _open(view)
        if not waiting:  # "name one: []" would send people looking for an id that is not there
            _fail(f"run {run_id} is {view.status.value}: no interrupt is waiting for an "
                  "answer")
        if len(waiting) != 1:
            _fail(f"run {run_id} has {len(waiting)} open interrupts; name one: "
                  f"{[i.id for i in waiting]}", 2)
        interrupt_id = waiting[0].id
    metadata: dict[str, Any] = {}
    if reason:
        metadata["reason"] = reason
    if replace_input:
        metadata["replaceInput"] = _load_json(replace_input, "--replace-input")
    if decline:
        entry = ResumeEntry(interrupt_id=interrupt_id, status="cancelled",
                            metadata=metadata or None)
    else:
        value: Any = {"approved": True} if approve else text
        if payload is not None:
            value = _load_json(payload, "--payload")
        entry = ResumeEntry(interrupt_id=interrupt_id, status="resolved", payload=value,
                            metadata=metadata or None)
    result = commands.answer(_rt(), run_id, [entry], by=f"cli:{_user()}", channel="cli")
    typer.echo(f"answered {interrupt_id}" + ("; the run resumes" if result.resumed else
                                             "; other interrupts are still open"))


def _load_json(raw: str, flag: str) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        _fail(f"{flag} is not valid JSON: {exc}", 2)


@runs.command("cancel")
def runs_cancel(run_id: str, reason: str | None = None) -> None:
    """Cancel a run that has not finished."""
    from layby.control import commands

    view = commands.cancel(_rt(), run_id, by=f"cli:{_user()}", reason=reason)
    typer.echo(f"run {view.id} is {view.status.value}")


@runs.command("requeue")
def runs_requeue(run_id: str) -> None:
    """Queue a run's pending step again (its task message was lost; or a retrying run's
    failed tool calls, to try them now)."""
    from layby.control import commands

    commands.requeue(_rt(), run_id)
    typer.echo(f"run {run_id}: pending step queued again")


@runs.command("events")
def runs_events(run_id: str, follow: bool = False,
                as_json: Annotated[bool, typer.Option(
                    "--json", help="JSON lines (the default; kept for scripts)")] = False,
                text: Annotated[bool, typer.Option(
                    "--text", help="one readable line per event")] = False) -> None:
    """Print a run's full event history, oldest first: every event's id, time, type,
    version and data, as JSON lines (or readable lines with --text)."""
    from layby.control import commands

    if as_json and text:
        _fail("give --json or --text, not both", 2)
    commands.get_run(_rt(), run_id)
    store = _rt().store
    after = "0-0"
    while True:
        batch = store.runs.events(run_id, after, block_ms=5000 if follow else None)
        for event in batch:
            after = event.id
            if text:
                typer.echo(f"{event.at}  {event.type:24} v{event.version}  "
                           f"{json.dumps(event.data, ensure_ascii=False)}")
            else:
                typer.echo(json.dumps(event.wire()))
        if not follow and not batch:
            return


@ops.command("stuck")
def ops_stuck(as_json: Annotated[bool, typer.Option("--json")] = False,
              limit: Annotated[int, typer.Option(
                  min=1, help="at most this many of each kind (and parked runs scanned)")] = 200
              ) -> None:
    """List what is stuck: runs whose lease lapsed, runs queued or resuming longer than the
    lease (message lost), overdue outbox entries, parked runs with failed notifications.
    Each says what is wrong and the command that fixes it."""
    from layby.control import oncall

    findings = oncall.stuck(_rt(), limit=limit)
    if as_json:
        typer.echo(json.dumps([f.wire() for f in findings], indent=2))
        return
    for finding in findings:
        typer.echo(finding.line())
    if not findings:
        typer.echo("nothing is stuck")


@ops.command("requeue-stuck")
def ops_requeue_stuck(limit: Annotated[int, typer.Option(min=1)] = 200) -> None:
    """Requeue runs whose lease lapsed or whose message looks lost, and publish overdue
    outbox entries."""
    from layby.control import oncall

    done, published = oncall.requeue_stuck(_rt(), limit=limit)
    for item in done:
        typer.echo(f"{item.run_id}  {item.outcome}  ({item.why})")
    typer.echo(f"{sum(i.outcome == 'requeued' for i in done)} run(s) requeued, "
               f"{published} outbox entr{'y' if published == 1 else 'ies'} published")


@ops.command("retry-notifications")
def ops_retry_notifications(run_id: Annotated[str | None, typer.Argument(
                                help="the run (or --all)")] = None,
                            all_runs: Annotated[bool, typer.Option(
                                "--all", help="every parked run's failed notifications")
                            ] = False) -> None:
    """Send a parked run's failed notifications again, with their attempts reset."""
    from layby.control import commands, oncall

    if (run_id is None) == (not all_runs):
        _fail("give a RUN_ID or --all", 2)
    if run_id is not None:
        view = commands.get_run(_rt(), run_id)
        if view.status is not Status.INTERRUPTED:
            _fail(f"run {run_id} is {view.status.value}: only a parked run's notifications "
                  "are sent again")
        run_ids = [run_id]
    else:
        run_ids = oncall.with_failed_notifications(_rt().store)
    retried = oncall.retry_notifications(_rt(), run_ids)
    for rid, ids in retried.items():
        for nid in ids:
            typer.echo(f"{rid}  {nid}  sent again")
    count = sum(len(ids) for ids in retried.values())
    typer.echo(f"{count} failed notification(s) queued again" if count else
               "no failed notification to retry (only those of open interrupts are sent)")


@ops.command("purge")
def ops_purge(dry_run: Annotated[bool, typer.Option(
                  help="count only")] = False) -> None:
    """Drop finished runs past retention (LAYBY_RETENTION_S) from the indexes."""
    from layby.control import oncall

    counts = oncall.purge(_rt().store, dry_run=dry_run)
    found = ", ".join(f"{counts[s]} {s}" for s in ("completed", "failed", "cancelled"))
    if dry_run:
        typer.echo(f"would purge: {found}")
    else:
        typer.echo(f"purged {counts['pruned']} index entr"
                   f"{'y' if counts['pruned'] == 1 else 'ies'} ({found})")


# -- reviewer policy ------------------------------------------------------------------------


def _rules(path: Any) -> Any:
    """The rules in `path` (or the configured file), checked against the directory."""
    from pathlib import Path

    from layby.errors import ConfigError
    from layby.reviewers.directory import load_directory
    from layby.reviewers.policy import load_rules

    settings = Settings.of_this_folder()
    where = Path(path) if path else settings.policy_file or settings.reviewers_file
    if where is None:
        _fail("no rules to read: give a FILE, or set LAYBY_POLICY_FILE (or "
              "LAYBY_REVIEWERS_FILE, with `[[rules]]` in it)")
    try:
        rules = load_rules(where)
        # Checked against the configured directory, or against the file itself when the
        # rules live in a directory file.
        directory_file = settings.reviewers_file or where
        rules.check(load_directory(directory_file))
    except ConfigError as exc:
        _fail(exc.message)
    return rules


@policy.command("check")
def policy_check(file: Annotated[str, typer.Argument(help="a rules file (TOML or YAML)")]
                 ) -> None:
    """Validate a rules file: it parses, its conditions compile, the reviewers and groups
    it names are in the directory (LAYBY_REVIEWERS_FILE). Exits 1 with the reason if not."""
    rules = _rules(file)
    typer.echo(f"{file}: {len(rules.rules)} rule(s), all valid")
    for rule in rules.rules:
        typer.echo(f"  {rule.name:24} {_summary(rule)}")


@policy.command("explain")
def policy_explain(
        agent: Annotated[str, typer.Option(help="the agent's name")],
        tool: Annotated[str, typer.Option(help="the tool's name")],
        input: Annotated[str, typer.Option("--input", help="the tool's input, JSON")] = "{}",
        metadata: Annotated[str, typer.Option(help="the run's metadata, JSON")] = "{}",
        reason: Annotated[str, typer.Option(help="the interrupt's reason")] = CONFIRMATION,
        file: Annotated[str | None, typer.Option(help="a rules file (default: the "
                                                 "configured one)")] = None) -> None:
    """Which rule decides an interrupt of TOOL with this input, and why each rule before
    it did not."""
    try:
        tool_input, run_metadata = json.loads(input), json.loads(metadata)
    except json.JSONDecodeError as exc:
        _fail(f"--input and --metadata take JSON: {exc}")
    if not isinstance(run_metadata, dict):
        _fail("--metadata takes a JSON object")
    rules = _rules(file)
    rule, checks = rules.evaluate(agent, tool, reason, tool_input, run_metadata)
    for check in checks:
        typer.echo(f"  {'match' if check.matched else 'skip ':5}  {check.rule:24} {check.why}")
    if rule is None:
        typer.echo("no rule matches: asked as the tool asks (its reviewers, or the "
                   "default group)")
    else:
        typer.echo(f"rule {rule.name!r} decides: {_summary(rule)}")


def _summary(rule: Any) -> str:
    if rule.action == "approve":
        return "approve at once (nobody is asked)"
    if rule.action == "decline":
        return f"decline at once ({rule.note or 'no reason given'})"
    parts = [f"ask {', '.join(rule.reviewers) if rule.reviewers else 'the tool’s reviewers'}"]
    if rule.required_approvals and rule.required_approvals > 1:
        parts.append(f"{rule.required_approvals} approvals needed")
    parts += [f"after {_duration(level.after)} also {', '.join(level.to)}"
              for level in rule.escalate]
    if rule.remind_every:
        parts.append(f"remind every {_duration(rule.remind_every)}")
    return "; ".join(parts)


def _duration(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


if __name__ == "__main__":
    main()
