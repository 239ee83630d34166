"""Settings, from `LAYBY_*` environment variables (pydantic-settings). Units are in the names.

Where Redis is: `LAYBY_REDIS_URL`, or else the file `<LAYBY_DATA_DIR>/redis.url` that
`layby up` writes for the embedded server it starts, so every other `layby` command on the
same machine finds it. The URL names one server, or a Sentinel group in kombu's form
(`sentinel://[:password@]host:26379/0;sentinel://host2:26379;…`) whose primary is
LAYBY_REDIS_SENTINEL_MASTER; `control.connections` builds the clients. A URL of a scheme
the broker and the store do not both take is refused here, before anything connects.

Where the broker is: the store's own server, unless `LAYBY_BROKER_URL` names another: a
Redis/Valkey server (`redis://`, `rediss://`), a Sentinel group (`sentinel://…`, its
primary LAYBY_BROKER_SENTINEL_MASTER) or RabbitMQ (`amqp://`, `amqps://`).
`Settings.broker_is_store` tells which; `layby.control.runtime` makes the store push task
messages itself only then.

`Settings.of_this_folder()` is what the `layby` command reads: the variables, and for what
they leave unset, the settings of a `layby up` running on the same data folder
(`layby.running`).
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from layby import running

CommaList = Annotated[list[str], NoDecode]
# The embedded server's malloc (layby.ops.embedded).
Malloc = Literal["mimalloc", "libc"]

SENTINEL_PORT = 26379
# Sentinels answer at once: a short timeout and no retries let a client that finds one
# away ask the next at once (redis-py's default retries cost seconds per sentinel away).
SENTINEL_TIMEOUT_S = 3.0


# A key's name in LAYBY_API_KEYS (`name:key`): what the audit records its caller as.
KEY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
# The longest bearer key: the gateway refuses a longer one before any comparison.
MAX_KEY_BYTES = 512


@dataclass(frozen=True)
class ApiKey:
    """One bearer key of LAYBY_API_KEYS and the caller it stands for: `api:<name>` for a
    named key (`name:key`), or `api-key:<fingerprint>` (12 hex digits of the SHA-256 of the
    whole key) for a bare one. The identity is what answers, approvals and the audit
    record, so two keys never share one: a quorum of 2 needs two keys."""

    caller: str
    secret: bytes

    @classmethod
    def parse(cls, entry: str) -> ApiKey:
        name, colon, key = entry.partition(":")
        if not colon or not KEY_NAME.fullmatch(name):
            name, key = "", entry
        if not key:
            raise ValueError(f"the entry {name + ':'!r} names no key after its colon; "
                             "write name:key, or the key alone")
        if not all(33 <= ord(c) <= 126 for c in key):
            raise ValueError(f"a key{' named ' + name if name else ''} holds a space, a control "
                             "or a non-ASCII character: an Authorization header carries "
                             "printable ASCII only")
        secret = key.encode()
        if len(secret) > MAX_KEY_BYTES:
            raise ValueError(f"a key{' named ' + name if name else ''} is longer than "
                             f"{MAX_KEY_BYTES} bytes, which the gateway never accepts")
        if name:
            return cls(f"api:{name}", secret)
        return cls(f"api-key:{hashlib.sha256(secret).hexdigest()[:12]}", secret)


def is_sentinel_url(url: str) -> bool:
    return url.strip().lower().startswith("sentinel://")


# What both the broker (kombu) and the store (redis-py) take. kombu reads any other
# `redis+…://` as plain redis:// on localhost, and `unix://` not at all.
REDIS_SCHEMES = ("redis", "rediss", "sentinel")
# What the store alone may be besides: a Redis or Valkey Cluster (redis-py's RedisCluster).
# kombu has no cluster transport, so the broker is never one (LAYBY_BROKER_URL).
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster", "valkey+cluster", "valkeys+cluster")
STORE_SCHEMES = REDIS_SCHEMES + CLUSTER_SCHEMES
# What the broker alone may be besides: RabbitMQ (kombu's py-amqp transport).
AMQP_SCHEMES = ("amqp", "amqps")
BROKER_SCHEMES = REDIS_SCHEMES + AMQP_SCHEMES


def is_cluster_url(url: str) -> bool:
    scheme = urlsplit(url.strip()).scheme.lower() if "://" in url else ""
    return scheme in CLUSTER_SCHEMES
HTTP_SCHEMES = ("http", "https")


def url_problem(url: str, schemes: tuple[str, ...]) -> str | None:
    """What is wrong with the scheme of `url` for a setting that takes `schemes`, or None
    (the rest of a Redis URL is checked where clients are made, `control.connections`).
    Never repeats the URL: it may hold a password."""
    scheme = urlsplit(url.strip()).scheme.lower() if "://" in url else ""
    taken = ", ".join(f"{s}://" for s in schemes)
    if not scheme:
        return f"not a URL (no scheme://): give one of {taken}"
    if scheme not in schemes:
        return f"the scheme {scheme}:// is not one layby takes: give one of {taken}"
    return None


def broker_shown(url: str) -> str:
    """The broker's kind and address, as logs and `layby doctor` say it: never its
    password."""
    first = urlsplit(url.split(";")[0].strip())
    kind = {"amqp": "RabbitMQ", "amqps": "RabbitMQ", "sentinel": "the Sentinel group of"
            }.get(first.scheme.lower(), "Redis")
    return f"{kind} {first.hostname}:{first.port or ''}".rstrip(":")


class Settings(BaseSettings):
    # A setting refused is named with its error, never its value: it may be a secret.
    model_config = SettingsConfigDict(env_prefix="LAYBY_", extra="ignore",
                                      hide_input_in_errors=True)

    redis_url: str | None = Field(None, description="Redis/Valkey for broker and store")
    # The Celery broker when it is not the store's server: Redis/Valkey, Sentinel or
    # RabbitMQ. Unset: the store's server (LAYBY_REDIS_URL).
    broker_url: str | None = Field(None, description="the broker, when not the store's server")
    # The primary's name in the broker's Sentinel group; unset, LAYBY_REDIS_SENTINEL_MASTER.
    broker_sentinel_master: str | None = None
    data_dir: Path = Field(Path(".layby"), description="embedded server's data and state")
    # The malloc of the embedded server (`layby up` without LAYBY_REDIS_URL): its binary's
    # own is glibc's, slower as its heap grows (layby.ops.embedded); "libc" keeps it.
    embedded_malloc: Malloc = "mimalloc"
    # Comma-separated; each `name:key` (the caller is recorded as `api:<name>`) or a bare
    # key (recorded by its fingerprint). `api_key_table` holds them parsed.
    api_keys: CommaList = Field(default_factory=list, description="bearer keys for /v1")
    # A TOML file of keys with a tenant and rights (layby.access.keys), read again when it
    # changes; beside LAYBY_API_KEYS, whose keys have every right in tenant `default`.
    keys_file: Path | None = Field(None, description="TOML file of API keys with tenants "
                                   "and rights")
    # How long the audit trail keeps what callers did (GET /v1/audit, `layby audit`).
    audit_retention_days: int = Field(90, ge=1, le=3650)
    agent_modules: CommaList = Field(default_factory=lambda: ["layby.demo.agents"])
    task_modules: CommaList = Field(default_factory=lambda: ["layby.demo.jobs"],
                                    description="modules with Celery tasks to run as jobs")
    # The versions of its agents a worker runs pinned runs of (and reads the queues of,
    # `layby.turns@<version>`); empty: each agent's own version.
    agent_versions: CommaList = Field(default_factory=list)
    key_prefix: str = "layby"
    # How many shards a store holds (format 2, on one server as on a cluster), fixed when
    # it is made, or when a store of 0.2.0 switches to format 2 (the sweeper's), and
    # recorded in it (`layby.parking.shards`): a process given another number (set, or on a
    # cluster) refuses to start. Each transition touches one shard, so one slot; what
    # reads every shard (a list page, a sweep) costs more the more there are. 48 spread
    # evenly over 1, 2, 3, 4, 6, 8, 12, 16, 24 or 48 primaries.
    store_shards: int = Field(48, ge=1, le=1024)
    # Empty by default: another service reaches layby with nothing but the broker URL.
    # Set it (e.g. "layby:broker:") when the broker's Redis database is shared.
    broker_key_prefix: str = ""
    # Where a bare `send_task("layby.start_run", …)` lands: Celery's default queue.
    # Empty stops layby's workers from reading it (then senders must name layby.turns).
    intake_queue: str = "celery"
    host: str = "127.0.0.1"
    port: int = 8000
    # /metrics on a port of its own, without the API key (the gateway opens it); unset,
    # /metrics is on the gateway's port and needs the key.
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"

    retention_s: int = 7 * 24 * 3600
    idempotency_ttl_s: int = 24 * 3600
    # A step's claim lapses this long after its worker's last heartbeat (every
    # `heartbeat_s`, by default a third of it): a dead worker's step runs again that soon;
    # a live one keeps its claim however long its model or tools take.
    lease_s: float = Field(6.0, gt=0)
    heartbeat_s: float | None = Field(None, gt=0)
    # Queued or resuming this long, its message no longer in the queue (a claim passed its
    # number, or the queue is empty), a run's task message is lost (a task that failed
    # before its claim, a queue purged): the sweeper queues its step again. A run whose
    # message waits in a long queue is left to wait (`store.deadlines.waiting_too_long`).
    lost_message_s: float = Field(300.0, gt=0)
    turn_budget_s: float = 30.0  # keep taking turns in one task for this long
    visibility_timeout_s: int = 3600  # above lease_s: kombu redelivers unacked after this
    outbox_grace_s: float = 10.0
    sweep_interval_s: float = 1.0
    events_max: int = 2000
    # A run parked this long has its events folded from their stream into its hash (by the
    # sweeper): a stream costs hundreds of bytes of its own for as long as the run waits.
    # Readers see no difference; a park's notifications are usually sent by then.
    fold_events_after_s: float = Field(30.0, ge=0)
    # Celery's task events (what Flower shows of tasks), one PUBLISH a task. Off, Flower
    # still shows workers, queues and their control.
    task_events: bool = True
    # The gateway's OpenTelemetry spans and metrics (FastAPI's own, to the providers the
    # process sets up, e.g. with FASTAPI_OTEL_AUTO_CONFIGURE=true and OTEL_* variables).
    # Off by default: with no exporter they cost every request, and the reviewer routes
    # (whose paths carry tokens) are never traced.
    telemetry: bool = False
    # Every request body but a mail's, and whatever a caller puts into a run.
    max_answer_bytes: int = Field(256 * 1024, gt=0)
    # A reply mail, by SMTP (refused with 552) or POSTed to /inbound/email (413).
    max_mail_bytes: int = Field(10 * 1024 * 1024, gt=0)
    worker_concurrency: int | None = None
    redis_socket_timeout_s: float = 30.0
    # Every process's log lines: "text", or "json" (one object per line, with the run,
    # interrupt and task ids as fields). `layby worker -l` overrides the level.
    log_format: Literal["text", "json"] = "text"
    log_level: str = "INFO"
    redis_health_check_interval_s: int = 25
    # -- Redis Sentinel (LAYBY_REDIS_URL=sentinel://…;sentinel://…) ------------------------
    redis_sentinel_master: str = "mymaster"  # the name the sentinels monitor the primary under
    # For sentinels that require a password (`requirepass` in sentinel.conf); the data
    # nodes' password is the one in LAYBY_REDIS_URL.
    redis_sentinel_password: SecretStr | None = None
    # Replication is asynchronous: a failover loses what the primary acknowledged but had
    # not yet sent on. With n > 0, the transitions that answer someone (start, park, answer,
    # expire, complete, fail, cancel) wait until n replicas have them (WAIT), and are
    # refused as not durable (HTTP 503) when fewer confirm within the timeout.
    redis_min_replicas_ack: int = Field(0, ge=0)
    redis_replica_ack_timeout_s: float = Field(1.0, gt=0)

    # -- reviewers (notifier/) --------------------------------------------------------------
    reviewers_file: Path | None = Field(None, description="TOML or YAML reviewer directory")
    # Reviewer policy rules (layby.reviewers.policy); unset, the directory file's `rules`.
    policy_file: Path | None = Field(None, description="TOML or YAML reviewer policy rules")
    # "kid:secret,kid2:secret2": the first signs reviewer tokens, all verify (rotation).
    # Unset: the file <data_dir>/token.keys, which `layby up` creates.
    token_keys: SecretStr | None = None
    token_ttl_s: int = 30 * 24 * 3600  # tokens of interrupts that never expire
    public_url: str = Field("http://127.0.0.1:8000",
                            description="where reviewers reach the gateway (links in mail)")
    smtp_host: str | None = None
    smtp_port: int = 25
    smtp_security: Literal["none", "starttls", "tls"] = "none"
    smtp_username: str | None = None
    smtp_password: SecretStr | None = None
    smtp_timeout_s: float = 20.0
    mail_from: str = "layby <layby@localhost>"
    inbound_domain: str = "localhost"  # replies go to reply+<token>@<inbound_domain>
    # Shared secret mail providers must send to POST /inbound/email (bearer or basic auth
    # password); unset, the endpoint relies on the reply token alone.
    inbound_mail_secret: SecretStr | None = None
    reply_listener_host: str = "127.0.0.1"
    reply_listener_port: int = 2525
    mail_catcher_port: int = 1025
    # Where the local mail catcher keeps what it receives; set by `layby up`, which also
    # turns on the gateway's /mail pages. Unset in production.
    mail_catcher_dir: Path | None = None
    # Per notification, before it is recorded as failed: with the defaults, retries go on
    # for about 12 hours (halved at worst by jitter), so a receiver down overnight still
    # gets it.
    notify_attempts: int = 20
    notify_backoff_s: float = 5.0  # first retry delay; doubles each time, with jitter
    notify_backoff_max_s: float = 3600.0
    # A send that has not finished this long after it started is taken as dead and tried
    # again (so it may arrive twice, with the same id): keep it above the slowest send.
    notify_send_timeout_s: float = 300.0
    webhook_timeout_s: float = 10.0
    remind_before_s: float | None = None  # remind reviewers this long before expiry
    # Slack (layby.notifier.slack_messages, layby.answering.slack_interactions): the bot
    # token ("xoxb-…") that posts the messages and the app's signing secret that verifies
    # clicks; both unset, no Slack.
    slack_bot_token: SecretStr | None = None
    slack_signing_secret: SecretStr | None = None
    # Slack's Web API; tests point it at a local server that answers as Slack does.
    slack_api_url: str = Field("https://slack.com/api/", pattern=r"^https?://")
    slack_timeout_s: float = 10.0
    # The reviewers' inbox (`/inbox`, layby.inbox.signin): a mailed sign-in link works once,
    # for this long; the session it opens lasts this long.
    inbox_link_ttl_s: int = Field(15 * 60, gt=0, le=24 * 3600)
    inbox_session_ttl_s: int = Field(12 * 3600, gt=0, le=30 * 24 * 3600)
    # A request header set by a trusted sign-in proxy (oauth2-proxy's X-Forwarded-Email,
    # Pomerium's X-Pomerium-Claim-Email, …) naming the reviewer by email or id. Off unless
    # set: only set it when every request reaches the gateway through that proxy.
    inbox_trusted_header: str | None = Field(None, pattern=r"^[A-Za-z0-9-]{1,100}$")

    # -- Flower (`layby flower`, started by `layby up`) ---------------------------------------
    flower_host: str = "127.0.0.1"
    flower_port: int = 5555
    # "user:password" (comma-separated for several). Unset: the file <data_dir>/flower.auth,
    # which `layby up` creates. `layby flower` refuses to start without credentials unless
    # Flower's own OAuth is configured (FLOWER_AUTH and FLOWER_OAUTH2_*).
    flower_basic_auth: SecretStr | None = None

    @field_validator("log_level")
    @classmethod
    def _level(cls, value: str) -> str:
        levels = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
        if value.upper() not in levels:
            raise ValueError(f"not a log level; use one of {', '.join(levels)}")
        return value.upper()

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        problem = url_problem(value, STORE_SCHEMES)
        if problem:
            raise ValueError(problem)
        return value.strip()

    @field_validator("broker_url")
    @classmethod
    def _broker_url(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        if is_cluster_url(value):
            raise ValueError(
                "a cluster cannot be the broker: kombu (Celery's transport) has no cluster "
                "transport; give a redis://, sentinel:// or amqp:// URL of a server beside "
                "the cluster")
        problem = url_problem(value, BROKER_SCHEMES)
        if problem:
            raise ValueError(problem)
        return value.strip()

    @model_validator(mode="after")
    def _broker_beside_a_cluster(self) -> Settings:
        if self.redis_url and is_cluster_url(self.redis_url) and not self.broker_url:
            raise ValueError(
                "LAYBY_REDIS_URL names a cluster, which cannot carry Celery's queues (kombu "
                "has no cluster transport): set LAYBY_BROKER_URL to a redis://, sentinel:// "
                "or amqp:// server beside it")
        return self

    @property
    def store_is_cluster(self) -> bool:
        """Whether the store is a Redis or Valkey Cluster (LAYBY_REDIS_URL=redis+cluster://…)."""
        return is_cluster_url(self.resolved_redis_url() or "")

    @property
    def wanted_shards(self) -> int | None:
        """The shard count this process asks of the store: LAYBY_STORE_SHARDS on a cluster
        or when set; None on one server when unset (the store's, as it was made; a new
        store is still made with `store_shards`)."""
        if self.store_is_cluster or "store_shards" in self.model_fields_set:
            return self.store_shards
        return None

    @field_validator("public_url")
    @classmethod
    def _public_url(cls, value: str) -> str:
        problem = url_problem(value, HTTP_SCHEMES)
        if problem is None and not urlsplit(value.strip()).hostname:
            problem = "it names no host: give http(s)://host[:port]"
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("api_keys", "agent_modules", "task_modules", "agent_versions",
                     mode="before")
    @classmethod
    def _split(cls, value: object) -> object:
        if isinstance(value, str):
            return [v.strip() for v in value.split(",") if v.strip()]
        return value

    @field_validator("api_keys")
    @classmethod
    def _keys(cls, value: list[str]) -> list[str]:
        parsed = [ApiKey.parse(entry) for entry in value]
        for field, what in (("caller", "caller name"), ("secret", "key")):
            seen = [getattr(key, field) for key in parsed]
            twice = sorted({key.caller for key in parsed
                            if seen.count(getattr(key, field)) > 1})
            if twice:
                raise ValueError(f"the same {what} is given twice ({', '.join(twice)}): "
                                 "give each service a key and a name of its own")
        return value

    @cached_property
    def api_key_table(self) -> tuple[ApiKey, ...]:
        return tuple(ApiKey.parse(entry) for entry in self.api_keys)

    @property
    def bearer_keys(self) -> list[str]:
        """The keys of LAYBY_API_KEYS without their names: what a client sends."""
        return [key.secret.decode() for key in self.api_key_table]

    @property
    def heartbeat_interval_s(self) -> float:
        return self.heartbeat_s or self.lease_s / 3

    @property
    def url_file(self) -> Path:
        return self.data_dir / "redis.url"

    @property
    def token_keys_file(self) -> Path:
        return self.data_dir / "token.keys"

    @property
    def slack(self) -> bool:
        """Whether Slack is configured (a bot token to post with)."""
        return self.slack_bot_token is not None

    def resolved_token_keys(self) -> str | None:
        if self.token_keys:
            return self.token_keys.get_secret_value()
        try:
            return self.token_keys_file.read_text().strip() or None
        except OSError:
            return None

    @property
    def flower_auth_file(self) -> Path:
        return self.data_dir / "flower.auth"

    def resolved_flower_basic_auth(self) -> str | None:
        if self.flower_basic_auth:
            return self.flower_basic_auth.get_secret_value()
        try:
            return self.flower_auth_file.read_text().strip() or None
        except OSError:
            return None

    def sentinel_kwargs(self, timeout_s: float | None = None) -> dict[str, Any]:
        """How to connect to the sentinels themselves (kombu's and redis-py's
        `sentinel_kwargs`): without them, redis-py would log in to sentinels with no
        password and retry a sentinel that is away."""
        timeout = timeout_s or SENTINEL_TIMEOUT_S
        options: dict[str, Any] = {"socket_timeout": timeout, "socket_connect_timeout": timeout,
                                   "socket_keepalive": True, "retry": None}
        if self.redis_sentinel_password:
            options["password"] = self.redis_sentinel_password.get_secret_value()
        return options

    def resolved_redis_url(self) -> str | None:
        if self.redis_url:
            return self.redis_url
        try:
            return self.url_file.read_text().strip() or None
        except OSError:
            return None

    def resolved_broker_url(self) -> str | None:
        """The broker's URL: LAYBY_BROKER_URL, or else the store's."""
        return self.broker_url or self.resolved_redis_url()

    @property
    def broker_is_store(self) -> bool:
        """Whether the broker is the store's own server (LAYBY_BROKER_URL unset, or the
        same URL): then the store's transitions push their task messages themselves."""
        return self.broker_url is None or self.broker_url == self.resolved_redis_url()

    @property
    def broker_is_amqp(self) -> bool:
        url = self.resolved_broker_url() or ""
        return urlsplit(url).scheme.lower() in AMQP_SCHEMES if "://" in url else False

    @property
    def resolved_broker_sentinel_master(self) -> str:
        return self.broker_sentinel_master or self.redis_sentinel_master

    @classmethod
    def of_this_folder(cls) -> Settings:
        """The settings of a command started in this folder: the LAYBY_* variables, and for
        every setting they leave unset, the one of the `layby up` running on the same data
        folder (so a second terminal serves the same agents, reviewers and mail)."""
        given = cls()
        stack = running.running(given.data_dir)
        if stack is None:
            return given
        fields = set(cls.model_fields)
        found = {name: value for name, value in stack.settings.items()
                 if name in fields and name not in given.model_fields_set}
        return cls(**found) if found else given


def settings_problem(exc: ValidationError) -> str:
    """Refused settings in one line: each variable and what is wrong with it, never its
    value (it may be a secret)."""
    # A rule of several settings (a model validator) has no one place: its message names them.
    return "; ".join(
        (f"LAYBY_{str(e['loc'][0]).upper()}: " if e['loc'] else "")
        + e['msg'].removeprefix('Value error, ')
        for e in exc.errors(include_input=False, include_url=False))


def write_private(path: Path, text: str) -> None:
    """Write a secret of the data folder (API key, token keys, Flower's credentials),
    created readable by its owner only: never readable by others, not even for a moment."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
