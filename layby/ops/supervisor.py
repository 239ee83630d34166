"""`layby up`: the whole system on one machine, started in order and stopped in reverse.

Redis (embedded unless `LAYBY_REDIS_URL` is set), a worker on every layby queue, the
sweeper's clock (Celery beat sending `layby.sweep`), the HTTP gateway, the reply listener,
Flower (basic auth, credentials in <data dir>/flower.auth) and, unless an SMTP server is
configured, a mail catcher that keeps the notifications (read them at <gateway>/mail), each
a child process in its own process group. What a newcomer has not configured is made up in
the data folder: an API key, token keys, Flower's credentials, and a reviewer directory with
one reviewer, you@localhost. Ctrl-C (or SIGTERM) stops the gateway, the clock and the
worker (a warm shutdown puts back what it holds), then Redis.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from layby.broker_config import SWEEP, Settings, celery_argv, worker_queues
from layby.broker_config.settings import write_private
from layby.ops.embedded import EmbeddedRedis
from layby.ops.flower import ensure_credentials, flower_argv, flower_env
from layby.reviewers.tokens import new_keys

DEMO_REVIEWERS = """\
# The reviewer directory `layby up` made (LAYBY_REVIEWERS_FILE points elsewhere to use
# your own). Interrupts that name no reviewers ask the default group.
default_group = "everyone"

[reviewers.you]
name = "You"
email = "you@localhost"

[groups]
everyone = ["you"]
"""


# Celery's gossip and mingle steps (other workers' events, revoked ids at start) serve
# nothing layby does, and on Redis they are what leaves a worker connected but taking no
# task after repeated broker restarts (celery#8030, #10302: fine with both off). Off also
# spares a second of "mingle: searching for neighbors" at every reconnect.
QUIET_STEPS = ["--without-gossip", "--without-mingle"]


def worker_argv(settings: Settings, queues: list[str], concurrency: int | None,
                loglevel: str) -> list[str]:
    argv = [*celery_argv(settings), "worker", "-Q", ",".join(queues), *QUIET_STEPS, "-n",
            f"layby-{os.getpid()}@%h", "-l", loglevel]
    return argv + (["-c", str(concurrency)] if concurrency else [])


def sweeper_argv(settings: Settings) -> list[str]:
    """A one-process worker on the sweep queue, which sweeps on its own clock (a worker
    reading that queue runs `layby.tasks.sweeper.tick`), so sweeps never wait behind model
    calls, put no task on the broker or in Flower every second, and their log lines stay
    out of the worker's."""
    return [*celery_argv(settings), "worker", "-Q", SWEEP, *QUIET_STEPS,
            "-P", "solo", "-n",
            f"layby-sweeper-{os.getpid()}@%h", "-l",
            # A sweep a second at INFO would drown what matters; DEBUG asked for is DEBUG.
            "DEBUG" if settings.log_level == "DEBUG" else "WARNING"]


def gateway_argv(host: str, port: int, log_level: str | None = "warning") -> list[str]:
    """uvicorn on the gateway's factory (it builds the runtime from the LAYBY_* settings)."""
    return [sys.executable, "-m", "uvicorn", "--factory", "layby.http.app:create_app",
            "--host", host, "--port", str(port),
            *(["--log-level", log_level] if log_level else [])]


@dataclass
class Child:
    name: str
    argv: list[str]
    process: subprocess.Popen[bytes] | None = None
    env: dict[str, str] | None = None


def port_free(host: str, port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


@dataclass
class System:
    settings: Settings
    port: int
    concurrency: int | None = None
    flower: bool = True
    redis: EmbeddedRedis | None = None
    children: list[Child] = field(default_factory=list)
    stopping: bool = False

    def api_key(self) -> str:
        if self.settings.bearer_keys:
            return self.settings.bearer_keys[0]
        key_file = self.settings.data_dir / "api_key"
        if key_file.exists():
            return key_file.read_text().strip()
        key = "lby_" + secrets.token_urlsafe(24)
        write_private(key_file, key + "\n")
        return key

    def start(self) -> dict[str, str]:
        data_dir = self.settings.data_dir.resolve()
        data_dir.mkdir(parents=True, exist_ok=True)
        url = self.settings.redis_url
        if not url:
            self.redis = EmbeddedRedis(data_dir / "valkey",
                                       malloc=self.settings.embedded_malloc).start()
            url = self.redis.url
            self.settings.url_file.write_text(url + "\n")
        env = {**os.environ, "LAYBY_REDIS_URL": url, "LAYBY_DATA_DIR": str(data_dir),
               "LAYBY_PORT": str(self.port)}
        key = self.api_key()
        if not self.settings.api_keys:
            env["LAYBY_API_KEYS"] = key
        env.update(self._reviewer_env(data_dir))
        self.children = [
            Child("worker", worker_argv(self.settings, worker_queues(self.settings),
                                        self.concurrency, "INFO")),
            Child("sweeper", sweeper_argv(self.settings)),
            Child("gateway", gateway_argv(self.settings.host, self.port)),
            Child("replies", [sys.executable, "-m", "layby", "reply-listener"]),
        ]
        if "LAYBY_MAIL_CATCHER_DIR" in env:
            self.children.append(Child("mail", [sys.executable, "-m", "layby",
                                                "mail-catcher"]))
        flower_url, flower_auth = "", ""
        if self.flower:
            flower_auth = ensure_credentials(self.settings)
            if port_free(self.settings.flower_host, self.settings.flower_port):
                self.children.append(Child("flower", flower_argv(self.settings),
                                           env=flower_env(self.settings, env)))
                flower_url = f"http://{self.settings.flower_host}:{self.settings.flower_port}"
            else:
                print(f"layby: port {self.settings.flower_port} is taken: not starting Flower "
                      "(set LAYBY_FLOWER_PORT)", file=sys.stderr)
        for child in self.children:
            child.process = subprocess.Popen(child.argv, env=child.env or env,
                                             start_new_session=True)
        return {"redis": url, "gateway": f"http://{self.settings.host}:{self.port}",
                "api_key": key, "data_dir": str(data_dir),
                "reviewers": env["LAYBY_REVIEWERS_FILE"],
                "replies": f"smtp://{self.settings.reply_listener_host}:"
                           f"{self.settings.reply_listener_port}",
                "mail": env.get("LAYBY_MAIL_CATCHER_DIR", ""),
                "flower": flower_url, "flower_auth": flower_auth}

    def _reviewer_env(self, data_dir: Path) -> dict[str, str]:
        """Token keys, a reviewer directory, links to this gateway and a mail catcher, for
        whatever the environment does not already say."""
        env: dict[str, str] = {}
        settings = self.settings
        if not settings.resolved_token_keys():
            write_private(settings.token_keys_file, new_keys() + "\n")
        if settings.reviewers_file:
            env["LAYBY_REVIEWERS_FILE"] = str(settings.reviewers_file)
        else:
            directory = data_dir / "reviewers.toml"
            if not directory.exists():
                directory.write_text(DEMO_REVIEWERS)
            env["LAYBY_REVIEWERS_FILE"] = str(directory)
        if "LAYBY_PUBLIC_URL" not in os.environ:
            env["LAYBY_PUBLIC_URL"] = f"http://{settings.host}:{self.port}"
        if not settings.smtp_host:
            env.update({"LAYBY_SMTP_HOST": "127.0.0.1",
                        "LAYBY_SMTP_PORT": str(settings.mail_catcher_port),
                        "LAYBY_SMTP_SECURITY": "none",
                        "LAYBY_MAIL_CATCHER_DIR": str(data_dir / "mail")})
        return env

    def wait(self) -> int:
        """Until a signal or a child's death; returns the exit code for `layby up`."""
        def _stop(signum: int, _frame: object) -> None:
            self.stopping = True

        signal.signal(signal.SIGINT, _stop)
        signal.signal(signal.SIGTERM, _stop)
        while not self.stopping:
            for child in self.children:
                if child.process and child.process.poll() is not None:
                    print(f"layby: {child.name} exited with code {child.process.returncode}; "
                          "stopping everything", file=sys.stderr)
                    return 1
            time.sleep(0.2)
        return 0

    def stop(self) -> None:
        for child in reversed(self.children):
            if child.process and child.process.poll() is None:
                child.process.send_signal(signal.SIGTERM)
        for child in reversed(self.children):
            if child.process is None:
                continue
            try:
                child.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                child.process.kill()
                child.process.wait()
        if self.redis is not None:
            self.redis.stop()
            url_file: Path = self.settings.url_file
            url_file.unlink(missing_ok=True)
