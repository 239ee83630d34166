"""`layby keys`: API keys with a tenant and rights, in the keys file (LAYBY_KEYS_FILE); and
`layby audit`: who did what.

`layby keys new NAME --tenant T --agents 'shop.*' --can start,read` makes a key, prints it
once, and appends its SHA-256 (never the key) to the file; `layby keys ls` lists the keys
the gateway takes, without their secrets. `layby audit --since 1h` prints the audit trail
as JSON lines, newest first.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Annotated

import typer

from layby.access.keys import DEFAULT_TENANT, Keyring, KeysFileError, digest_of, parse
from layby.access.rights import DEFAULT_RIGHTS, RIGHTS
from layby.broker_config import Settings

keys = typer.Typer(help="API keys with a tenant and rights (LAYBY_KEYS_FILE).",
                   no_args_is_help=True)


def _fail(message: str, code: int = 2) -> None:
    typer.secho(f"error: {message}", fg="red", err=True)
    raise SystemExit(code)


def _file(given: Path | None) -> Path:
    found = given or Settings().keys_file
    if found is None:
        _fail("no keys file: set LAYBY_KEYS_FILE (the gateway reads it too) or give --file")
    assert found is not None
    return found


@keys.command("new")
def new(name: Annotated[str, typer.Argument(help="the key's name: answers and the audit "
                                                 "record it as api:<name>")],
        tenant: Annotated[str, typer.Option(help="whose runs it starts and sees")]
        = DEFAULT_TENANT,
        agents: Annotated[str, typer.Option(help="comma-separated patterns of the agents "
                                                 "it may start (fnmatch)")] = "*",
        can: Annotated[str, typer.Option(help=f"comma-separated rights, of {sorted(RIGHTS)}")]
        = ",".join(sorted(DEFAULT_RIGHTS)),
        file: Annotated[Path | None, typer.Option(help="the keys file (default: "
                                                       "LAYBY_KEYS_FILE)")] = None) -> None:
    """Make a key: printed once (keep it: it is not stored), its SHA-256 appended to the
    keys file with its tenant, agents and rights. Gateways take it within a second."""
    path = _file(file)
    before = path.read_text(encoding="utf-8") if path.exists() else ""
    secret = "lby_" + secrets.token_urlsafe(32)
    listed = [part.strip() for part in agents.split(",") if part.strip()]
    rights = [part.strip() for part in can.split(",") if part.strip()]
    entry = (f"\n[keys.{name}]\nsha256 = \"{digest_of(secret).hex()}\"\n"
             f"tenant = {_quoted(tenant)}\nagents = [{', '.join(_quoted(a) for a in listed)}]\n"
             f"can = [{', '.join(_quoted(r) for r in rights)}]\n")
    try:
        # The file as it is must be sound before it grows, and sound after.
        if any(k.name == name for k in parse(before, str(path))):
            _fail(f"{path}: a key named {name!r} is there already; choose another name")
        parse(before + entry, str(path))
    except KeysFileError as exc:
        _fail(exc.message)
    created = not path.exists()
    with open(path, "a", encoding="utf-8") as out:
        out.write(entry)
    if created:
        os.chmod(path, 0o600)
    typer.echo(secret)
    typer.secho(f"key {name!r} (tenant {tenant}, rights {', '.join(rights)}, agents "
                f"{', '.join(listed)}) added to {path}; this is the only time it is shown",
                err=True)


@keys.command("ls")
def ls(file: Annotated[Path | None, typer.Option(help="the keys file (default: "
                                                      "LAYBY_KEYS_FILE)")] = None) -> None:
    """The keys the gateway takes: name, tenant, rights, agents (never a secret)."""
    settings = Settings()
    try:
        ring = Keyring(settings.api_key_table, file or settings.keys_file)
    except KeysFileError as exc:
        _fail(exc.message)
    for key in ring.keys:
        where = f"line {key.line}" if key.line else "LAYBY_API_KEYS"
        typer.echo(f"{key.caller:24} {key.tenant:12} {','.join(sorted(key.can)):48} "
                   f"{','.join(key.agents)}  ({where})")


def _quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def audit(since: Annotated[str | None, typer.Option(help="45s, 30m, 1h, 2d ago, or an ISO "
                                                          "8601 time")] = "1h",
          run: Annotated[str | None, typer.Option(help="one run's entries")] = None,
          caller: Annotated[str | None, typer.Option(help="one caller's (api:<name>, "
                                                          "reviewer:<id>)")] = None,
          tenant: Annotated[str | None, typer.Option(help="one tenant's")] = None,
          limit: Annotated[int, typer.Option(min=1, help="at most this many")] = 1000) -> None:
    """Who did what (starts, answers on every channel, cancels, run tokens, refusals), as
    JSON lines, newest first: the audit trail (LAYBY_AUDIT_RETENTION_DAYS)."""
    from layby.control import audit as trail
    from layby.control import build

    rt = build(Settings.of_this_folder())
    cursor: str | None = None
    left = limit
    while left > 0:
        page = trail.read_page(rt, run=run, caller=caller, tenant=tenant, since=since,
                               cursor=cursor, limit=min(500, left))
        for entry in page.entries:
            typer.echo(entry.wire_json())
        left -= len(page.entries)
        cursor = page.next_cursor
        if cursor is None:
            return
