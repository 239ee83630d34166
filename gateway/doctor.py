"""`layby doctor`: checks of the deployment that would lose or stall parked work, each a
plain function returning what it found and, when it is a problem, what to fix."""

from __future__ import annotations

import smtplib
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis

from broker_config.settings import Settings

MAX_SKEW_S = 2.0


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    message: str

    def line(self) -> str:
        return f"{'OK' if self.ok else 'PROBLEM':7} {self.name}: {self.message}"


def _config(client: redis.Redis, name: str) -> str | None:
    return client.config_get(name).get(name)


def check_appendonly(client: redis.Redis) -> Check:
    value = _config(client, "appendonly")
    if value == "yes":
        return Check("redis appendonly", True, "yes")
    return Check("redis appendonly", False,
                 f"{value!r}: a restart loses what changed since the last snapshot; set "
                 "`appendonly yes` in the server's configuration (CONFIG SET appendonly yes, "
                 "then CONFIG REWRITE)")


def check_appendfsync(client: redis.Redis) -> Check:
    value = _config(client, "appendfsync")
    if value in ("everysec", "always"):
        return Check("redis appendfsync", True, value)
    return Check("redis appendfsync", False,
                 f"{value!r}: the OS decides when writes reach disk; set `appendfsync everysec`")


def check_eviction(client: redis.Redis) -> Check:
    value = _config(client, "maxmemory-policy")
    if value == "noeviction":
        return Check("redis maxmemory-policy", True, value)
    return Check("redis maxmemory-policy", False,
                 f"{value!r}: under memory pressure the server deletes keys, parked runs "
                 "included; set `maxmemory-policy noeviction`")


def check_clock(client: redis.Redis) -> Check:
    before = time.time()
    seconds, micros = client.time()
    after = time.time()
    skew = seconds + micros / 1e6 - (before + after) / 2
    text = f"this machine's clock is {abs(skew):.3f} s {'behind' if skew > 0 else 'ahead of'} " \
           "the Redis server's"
    if abs(skew) <= MAX_SKEW_S:
        return Check("clock skew", True, text)
    return Check("clock skew", False,
                 f"{text} (more than {MAX_SKEW_S:g} s): deadlines, leases and tokens are "
                 "timed on both; run NTP (chrony, systemd-timesyncd) on every machine")


def check_celery(conf: object, settings: Settings) -> list[Check]:
    get = conf.get  # type: ignore[attr-defined]
    checks = []
    for name, want in (("task_acks_late", True), ("task_reject_on_worker_lost", True),
                       ("worker_prefetch_multiplier", 1)):
        value = get(name)
        checks.append(Check(f"celery {name}", value == want, f"{value!r}" if value == want
                            else f"{value!r}, should be {want!r}: a worker that dies loses "
                                 "or holds back the tasks it took"))
    visibility = (get("broker_transport_options") or {}).get("visibility_timeout")
    if visibility is not None and visibility > settings.lease_s:
        checks.append(Check("celery visibility_timeout", True,
                            f"{visibility} s > lease {settings.lease_s:g} s"))
    else:
        checks.append(Check("celery visibility_timeout", False,
                            f"{visibility!r} s is not above the lease ({settings.lease_s:g} s): "
                            "the broker redelivers turns still running; raise "
                            "LAYBY_VISIBILITY_TIMEOUT_S above LAYBY_LEASE_S"))
    return checks


def check_smtp(settings: Settings) -> Check:
    if not settings.smtp_host:
        return Check("smtp", True, "not configured (LAYBY_SMTP_HOST unset): no email")
    where = f"{settings.smtp_host}:{settings.smtp_port}"
    timeout = min(settings.smtp_timeout_s, 10.0)
    try:
        if settings.smtp_security == "tls":
            conn: smtplib.SMTP = smtplib.SMTP_SSL(settings.smtp_host, settings.smtp_port,
                                                  timeout=timeout,
                                                  context=ssl.create_default_context())
        else:
            conn = smtplib.SMTP(settings.smtp_host, settings.smtp_port, timeout=timeout)
        with conn:
            code, _ = conn.ehlo()
            if code != 250:
                return Check("smtp", False, f"{where} answered EHLO with {code}")
    except (OSError, smtplib.SMTPException) as exc:
        return Check("smtp", False, f"cannot reach {where}: {exc}; check LAYBY_SMTP_HOST, "
                                    "LAYBY_SMTP_PORT and the network")
    return Check("smtp", True, f"{where} answers EHLO")


def check_reviewers(settings: Settings) -> list[Check]:
    from notifier.directory import load_directory
    from notifier.tokens import parse_keys

    checks = []
    try:
        directory = load_directory(settings.reviewers_file)
        count = len(getattr(directory, "reviewers", []) or [])
        checks.append(Check("reviewer directory", True,
                            f"{settings.reviewers_file}: {count} reviewer(s)"
                            if settings.reviewers_file else "none configured"))
    except Exception as exc:  # noqa: BLE001  (any failure to load is the finding)
        checks.append(Check("reviewer directory", False,
                            f"{settings.reviewers_file} does not load: {exc}"))
    spec = settings.resolved_token_keys()
    if not spec:
        needed = settings.reviewers_file is not None
        checks.append(Check("token keys", not needed,
                            "none: reviewer links cannot be signed; set LAYBY_TOKEN_KEYS "
                            "(`layby secret tokens`)" if needed
                            else "none (not needed without reviewers)"))
    else:
        try:
            checks.append(Check("token keys", True, f"{len(parse_keys(spec))} key(s)"))
        except ValueError as exc:
            checks.append(Check("token keys", False, f"LAYBY_TOKEN_KEYS is invalid: {exc}"))
    return checks


def run_checks(settings: Settings, client: redis.Redis | None, conf: object) -> list[Check]:
    checks: list[Check] = []
    if client is None:
        checks.append(Check("redis", False, "no Redis server configured: set LAYBY_REDIS_URL"))
    else:
        try:
            client.ping()
            checks.append(Check("redis", True, "answers"))
            redis_checks: list[Callable[[redis.Redis], Check]] = [
                check_appendonly, check_appendfsync, check_eviction, check_clock]
            for check in redis_checks:
                try:
                    checks.append(check(client))
                except redis.ResponseError as exc:  # CONFIG renamed or refused by a host
                    checks.append(Check(check.__name__.removeprefix("check_"), False,
                                        f"cannot read it: {exc}; check it by hand"))
        except redis.RedisError as exc:
            checks.append(Check("redis", False, f"does not answer: {exc}"))
    checks.extend(check_celery(conf, settings))
    checks.append(check_smtp(settings))
    checks.extend(check_reviewers(settings))
    return checks
