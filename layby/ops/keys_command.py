"""`layby keys`: API keys with a tenant and rights, in the keys file (LAYBY_KEYS_FILE).

`layby keys new NAME --tenant T --agents 'shop.*' --can start,read` makes a key, prints it
once, and appends its SHA-256 (never the key) to the file; `layby keys ls` lists the keys
the gateway takes, without their secrets.
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
