"""Flower for layby: authentication on, bound to loopback unless told otherwise.

Secrets never go on the command line (where `ps` shows them): basic auth goes to Flower in
its environment variable FLOWER_BASIC_AUTH. Credentials come from LAYBY_FLOWER_BASIC_AUTH or
the file <data_dir>/flower.auth (`layby up` creates it); with Flower's OAuth configured
instead (FLOWER_AUTH and FLOWER_OAUTH2_* in the environment) none are needed.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from layby import broker_config
from layby.broker_config import Settings
from layby.broker_config.settings import write_private

CONFIG_FILE = Path(broker_config.__file__).resolve().parent / "flowerconfig.py"


class FlowerAuthMissing(Exception):
    pass


def ensure_credentials(settings: Settings) -> str:
    """The basic auth credentials, made up into <data_dir>/flower.auth when none are set."""
    existing = settings.resolved_flower_basic_auth()
    if existing:
        return existing
    credentials = "layby:" + secrets.token_urlsafe(18)
    write_private(settings.flower_auth_file, credentials + "\n")
    return credentials


def flower_argv(settings: Settings, host: str | None = None, port: int | None = None
                ) -> list[str]:
    return [*broker_config.celery_argv(settings), "flower", f"--conf={CONFIG_FILE}",
            f"--address={host or settings.flower_host}", f"--port={port or settings.flower_port}"]


def flower_env(settings: Settings, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment Flower runs with: `base` (os.environ) with the credentials added and
    the switches that would open the API to anyone removed."""
    env = dict(os.environ if base is None else base)
    env.pop("FLOWER_UNAUTHENTICATED_API", None)
    # Address and port are layby's settings (on the command line); a FLOWER_ADDRESS left
    # in the environment must not widen them.
    env.pop("FLOWER_ADDRESS", None)
    env.pop("FLOWER_PORT", None)
    credentials = settings.resolved_flower_basic_auth()
    if credentials:
        env["FLOWER_BASIC_AUTH"] = credentials
    elif not env.get("FLOWER_AUTH") and not env.get("FLOWER_BASIC_AUTH"):
        raise FlowerAuthMissing(
            "Flower needs authentication: set LAYBY_FLOWER_BASIC_AUTH=user:password (or "
            f"write it into {settings.flower_auth_file}; `layby up` makes one), or configure "
            "Flower's OAuth with FLOWER_AUTH and FLOWER_OAUTH2_KEY/_SECRET/_REDIRECT_URI")
    return env
