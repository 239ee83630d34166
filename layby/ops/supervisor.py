"""`layby up`: the whole system on one machine, started in order and stopped in reverse.

Redis (embedded unless `LAYBY_REDIS_URL` is set), a worker on every layby queue, the
sweeper (a one-process worker that sweeps on its own clock), the HTTP gateway, the reply listener,
Flower (basic auth, credentials in <data dir>/flower.auth) and, unless an SMTP server is
configured, a mail catcher that keeps the notifications (read them at <gateway>/mail), each
a child process in its own process group. What a newcomer has not configured is made up in
the data folder: an API key, token keys, Flower's credentials, and a reviewer directory with
one reviewer, you@localhost. Ctrl-C (or SIGTERM, or SIGHUP when its terminal closes) stops
the gateway, the clock and the worker (a warm shutdown puts back what it holds), then Redis.

Before any part starts, what would stop one is checked, each failure one line (`NotStarted`):
no other `layby up` holds the data folder (its lock, `layby.running`), the user's modules
import, the reviewer directory and rules load, the ports are free. Once up, it writes its
effective settings beside the lock for the commands started in the same folder. The children
die with it, even when it is killed outright (`layby.ops.lifetime`).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import redis

from layby import running
from layby.broker_config import (
    CELERY_ENTRY,
    SWEEP,
    SWEEPER_ENTRY,
    Settings,
    celery_argv,
    worker_queues,
)
from layby.broker_config.settings import write_private
from layby.control import connections
from layby.ops.embedded import EmbeddedRedis, free_port
from layby.ops.flower import ensure_credentials, flower_argv, flower_env
from layby.ops.lifetime import die_with_parent
from layby.parking import formats, migrations
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
                loglevel: str, *, sweeps: bool = False) -> list[str]:
    """A worker on `queues`; one that `sweeps` runs the sweeper's clock too."""
    entry = SWEEPER_ENTRY if sweeps else CELERY_ENTRY
    argv = [*celery_argv(settings, entry), "worker", "-Q", ",".join(queues), *QUIET_STEPS,
            "-n", f"layby-{os.getpid()}@%h", "-l", loglevel]
    return argv + (["-c", str(concurrency)] if concurrency else [])


def sweeper_argv(settings: Settings) -> list[str]:
    """A one-process worker on the sweep queue, which sweeps on its own clock (started from
    the sweeper's entry, `layby.tasks.clock`), so sweeps never wait behind model calls, put
    no task on the broker or in Flower every second, and their log lines stay out of the
    worker's."""
    return [*celery_argv(settings, SWEEPER_ENTRY), "worker", "-Q", SWEEP, *QUIET_STEPS,
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


class NotStarted(Exception):
    """What keeps `layby up` (or a part of it) from starting, in one line."""


def port_free(host: str, port: int) -> bool:
    with socket.socket() as probe:
        # As the servers bind: a port whose last connections linger in TIME_WAIT is free.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def check_ports(wanted: dict[str, tuple[str, int, str]]) -> None:
    """Refuse, naming the part and its setting, a port that is taken or wanted twice.
    `wanted`: part → (host, port, the option or setting that chooses it)."""
    seen: dict[int, str] = {}
    for part, (host, port, setting) in wanted.items():
        if port in seen:
            raise NotStarted(f"the {seen[port]} and the {part} both want port {port}: give "
                             f"one another ({setting})")
        seen[port] = part
        if not port_free(host, port):
            raise NotStarted(f"port {port} on {host} (the {part}) is taken: stop what holds "
                             f"it, or choose another ({setting})")


def _say(text: str) -> None:
    """A line on stderr; the terminal may be gone (SIGHUP), which must not stop a stop."""
    try:
        print(text, file=sys.stderr, flush=True)
    except OSError:
        pass


@dataclass
class System:
    settings: Settings
    port: int
    concurrency: int | None = None
    flower: bool = True
    redis: EmbeddedRedis | None = None
    children: list[Child] = field(default_factory=list)
    stopping: bool = False
    started: bool = False  # every part started: a signal now only ends `wait`
    lock: running.Lock | None = None

    def api_key(self) -> str:
        if self.settings.bearer_keys:
            return self.settings.bearer_keys[0]
        key_file = self.settings.data_dir / "api_key"
        if key_file.exists():
            return key_file.read_text().strip()
        key = "lby_" + secrets.token_urlsafe(24)
        write_private(key_file, key + "\n")
        return key

    @property
    def gateway_url(self) -> str:
        return f"http://{self.settings.host}:{self.port}"

    def start(self) -> dict[str, str]:
        """Check, then start every part; NotStarted if a check fails, KeyboardInterrupt on
        a signal while starting (the caller then stops what did start)."""
        self._on_signals()
        data_dir = self.settings.data_dir.resolve()
        try:
            self.lock = running.Lock.take(data_dir, self.gateway_url)
        except running.Taken as exc:
            raise NotStarted(str(exc)) from None
        env = {**os.environ, "LAYBY_DATA_DIR": str(data_dir), "LAYBY_PORT": str(self.port)}
        key = self.api_key()
        if not self.settings.api_keys:
            env["LAYBY_API_KEYS"] = key
        env.update(self._reviewer_env(data_dir))
        ports = self._check(env)
        url = self.settings.redis_url or self._start_embedded(data_dir, avoid=ports)
        env["LAYBY_REDIS_URL"] = url
        self._store_format(url, owned=not self.settings.redis_url)
        self.children = self._parts(env)
        flower_url, flower_auth = "", ""
        if self.flower:
            flower_auth = ensure_credentials(self.settings)
            self.children.append(Child("flower", flower_argv(self.settings),
                                       env=flower_env(self.settings, env)))
            flower_url = f"http://{self.settings.flower_host}:{self.settings.flower_port}"
        for child in self.children:
            # From this (the main) thread: the parent-death signal follows the thread.
            child.process = subprocess.Popen(child.argv, env=child.env or env,
                                             start_new_session=True,
                                             preexec_fn=die_with_parent())
        running.write(data_dir, self._stack(data_dir, env, url))
        self.started = True
        return {"redis": url, "gateway": self.gateway_url,
                "api_key": key, "data_dir": str(data_dir),
                "reviewers": env["LAYBY_REVIEWERS_FILE"],
                "replies": f"smtp://{self.settings.reply_listener_host}:"
                           f"{self.settings.reply_listener_port}",
                "mail": env.get("LAYBY_MAIL_CATCHER_DIR", ""),
                "flower": flower_url, "flower_auth": flower_auth}

    def _start_embedded(self, data_dir: Path, avoid: set[int]) -> str:
        """The embedded server, started in the data folder on a free port none of the parts
        will bind (`avoid`: they are free now too, and not bound yet); its URL, written
        there too for the commands started in the same folder
        (`Settings.resolved_redis_url`)."""
        port = free_port()
        while port in avoid:  # seen once: the gateway's port, then "address already in use"
            port = free_port()
        # Kept before it starts: stopped with the rest if a signal comes while it does.
        self.redis = EmbeddedRedis(data_dir / "valkey", port=port,
                                   malloc=self.settings.embedded_malloc)
        try:
            self.redis.start()
        except RuntimeError as exc:
            raise NotStarted(str(exc)) from None
        url = self.redis.url
        self.settings.url_file.write_text(url + "\n")
        return url

    def _parts(self, env: dict[str, str]) -> list[Child]:
        """Every part but Flower: the worker, the sweeper, the gateway, the reply listener,
        and, with no SMTP server configured, the mail catcher (`_reviewer_env`)."""
        children = [
            Child("worker", worker_argv(self.settings, worker_queues(self.settings),
                                        self.concurrency, "INFO")),
            Child("sweeper", sweeper_argv(self.settings)),
            Child("gateway", gateway_argv(self.settings.host, self.port)),
            Child("replies", [sys.executable, "-m", "layby", "reply-listener"]),
        ]
        if "LAYBY_MAIL_CATCHER_DIR" in env:
            children.append(Child("mail", [sys.executable, "-m", "layby", "mail-catcher"]))
        return children

    def _store_format(self, url: str, *, owned: bool) -> None:
        """Whether this layby reads the store's format, before any part starts. The
        embedded server is this `layby up`'s alone (its data folder is locked): data an
        older layby left there is migrated at once, saying so. Another server may be shared
        with processes this one does not see: NotStarted, with what to run."""
        client = redis.Redis.from_url(url, decode_responses=True) if owned \
            else connections.redis_client(self.settings)
        try:
            keys = formats.keys_of(client, self.settings.key_prefix)
            state = formats.read(client, keys)
            newest = migrations.newest()
            why = formats.readable(state, newest, empty=not formats.has_data(client, keys)) \
                or formats.layout_problem(state, self.settings.wanted_shards)
            todo = migrations.pending(state)
            if why is None and not todo:
                return
            if why is not None and (not owned or not todo):
                raise NotStarted(why)  # shared, or written by a newer layby
            if not owned:
                return  # readable; `layby migrate` when the deployment is through
            for report in migrations.migrate(client, keys, shards=self.settings.store_shards):
                _say(f"layby up: migrated the data in {self.settings.data_dir} to format "
                     f"{report.number} ({report.changed} of {report.seen} keys changed)")
        finally:
            client.close()

    def _on_signals(self) -> None:
        """Ctrl-C, SIGTERM and a closed terminal (SIGHUP) all stop everything, in order.
        While parts start, one raises at once (a user's module that hangs at import must
        not keep Ctrl-C waiting; what was started is stopped by the caller); once they run,
        it only asks `wait` to end. A SIGHUP ignored by whoever started us (`nohup`)
        stays ignored."""
        def _stop(signum: int, _frame: object) -> None:
            self.stopping = True
            if not self.started:
                raise KeyboardInterrupt(signal.Signals(signum).name)

        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            if sig == signal.SIGHUP and signal.getsignal(sig) is signal.SIG_IGN:
                continue
            signal.signal(sig, _stop)

    def _check(self, env: dict[str, str]) -> set[int]:
        """What would stop a part once started, checked before any is: the user's modules,
        the reviewer directory and rules the parts will read (`layby check`, in a process
        of its own: the user's code, and whatever threads it starts at import, stay out of
        the process that starts every part), and the ports; those ports."""
        settings = self.settings
        checked = subprocess.run([sys.executable, "-m", "layby", "check"], env=env,
                                 capture_output=True, text=True, check=False)
        if checked.returncode != 0:
            said = checked.stderr.strip().splitlines() or [f"exit code {checked.returncode}"]
            raise NotStarted(said[-1].removeprefix("error: "))
        wanted = {"gateway": (settings.host, self.port, "--port or LAYBY_PORT"),
                  "reply listener": (settings.reply_listener_host,
                                     settings.reply_listener_port,
                                     "LAYBY_REPLY_LISTENER_PORT")}
        if "LAYBY_MAIL_CATCHER_DIR" in env:
            wanted["mail catcher"] = ("127.0.0.1", settings.mail_catcher_port,
                                      "LAYBY_MAIL_CATCHER_PORT")
        if settings.metrics_port:
            wanted["metrics exporter"] = (settings.metrics_host, settings.metrics_port,
                                          "LAYBY_METRICS_PORT")
        if self.flower:
            wanted["Flower dashboard"] = (settings.flower_host, settings.flower_port,
                                "LAYBY_FLOWER_PORT, or --no-flower")
        check_ports(wanted)
        return {port for _, port, _ in wanted.values()}

    def _stack(self, data_dir: Path, env: dict[str, str], url: str) -> running.Stack:
        """What the commands started in this folder need of this system: its settings as
        the parts read them, without a secret (where the API key is, not the key)."""
        s = self.settings
        # A password in the URL (user info, or redis-py's `?password=`) stays in the
        # terminal's environment: this file holds no secret.
        passwords = any(urlsplit(part.strip()).password
                        or "password" in parse_qs(urlsplit(part.strip()).query)
                        for part in url.split(";"))
        found = {
            "redis_url": None if passwords else url,  # a password stays in the terminal's env
            "agent_modules": s.agent_modules, "task_modules": s.task_modules,
            "key_prefix": s.key_prefix, "broker_key_prefix": s.broker_key_prefix,
            "intake_queue": s.intake_queue, "host": s.host, "port": self.port,
            "reviewers_file": env["LAYBY_REVIEWERS_FILE"],
            "policy_file": str(s.policy_file.resolve()) if s.policy_file else None,
            "public_url": env.get("LAYBY_PUBLIC_URL", s.public_url),
            "smtp_host": env.get("LAYBY_SMTP_HOST", s.smtp_host),
            "smtp_port": int(env.get("LAYBY_SMTP_PORT", s.smtp_port)),
            "smtp_security": env.get("LAYBY_SMTP_SECURITY", s.smtp_security),
            "smtp_username": s.smtp_username, "mail_from": s.mail_from,
            "inbound_domain": s.inbound_domain,
            "mail_catcher_dir": env.get("LAYBY_MAIL_CATCHER_DIR"),
        }
        key_file = None if s.bearer_keys else str(data_dir / "api_key")
        return running.Stack(pid=os.getpid(), url=self.gateway_url, api_key_file=key_file,
                             settings={k: v for k, v in found.items() if v is not None})

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
        while not self.stopping:
            for child in self.children:
                if child.process and child.process.poll() is not None:
                    _say(f"layby: {child.name} exited with code {child.process.returncode}; "
                         "stopping everything")
                    return 1
            time.sleep(0.2)
        return 0

    def stop(self, grace_s: float = 30.0) -> None:
        """SIGTERM to every part at once; what still runs `grace_s` later is killed, with
        whatever it started (its pool), saying so. Then the embedded server (it saves),
        then the folder's lock. So a stop takes at most `grace_s` and the server's save,
        however many parts are slow."""
        for child in reversed(self.children):
            if child.process and child.process.poll() is None:
                child.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for child in reversed(self.children):
            if child.process is None:
                continue
            try:
                child.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _say(f"layby: the {child.name} did not stop within {grace_s:.0f} s of SIGTERM; "
                     "killing it")
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.process.pid, signal.SIGKILL)  # its own session's group
                child.process.wait()
        if self.redis is not None:
            self.redis.stop()
            url_file: Path = self.settings.url_file
            url_file.unlink(missing_ok=True)
        if self.lock is not None:  # last: the folder is free once nothing holds its data
            running.remove(self.lock.path.parent)
            self.lock.release()
            self.lock = None
