"""`layby inbox revoke ADDRESS`: end a reviewer's inbox sessions now (a lost laptop, a
reviewer who left), on every gateway; their sign-in links made until now stop working too.
They sign in again with a new link, unless the directory no longer has them."""

from __future__ import annotations

import os
from typing import Annotated

import typer

inbox = typer.Typer(help="The reviewers' inbox: end a reviewer's sessions.",
                    no_args_is_help=True)


@inbox.command("revoke")
def revoke(address: Annotated[str, typer.Argument(help="the reviewer's email address, or "
                                                       "their id in the directory")]) -> None:
    """End every inbox session and sign-in link of the reviewer made until now."""
    from layby.broker_config import Settings
    from layby.control import build
    from layby.inbox import revocation

    rt = build(Settings.of_this_folder())
    directory = rt.reviewers.directory()
    reviewer = directory.by_email(address) if "@" in address else directory.reviewers.get(address)
    if reviewer is None:
        typer.secho(f"error: no reviewer {address!r} in the reviewer directory; "
                    "`layby doctor` shows which directory is read", fg="red", err=True)
        raise SystemExit(2)
    revocation.revoke(rt, reviewer, by=f"cli:{os.environ.get('USER') or 'unknown'}")
    typer.echo(f"ended the inbox sessions and sign-in links of reviewer {reviewer.id} "
               f"({reviewer.label}); a new sign-in link signs them in again")
