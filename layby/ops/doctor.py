"""`layby doctor`: checks of the deployment that would lose or stall parked work, each a
plain function returning what it found and, when it is a problem, what to fix."""

from __future__ import annotations

import smtplib
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import urlsplit

import redis
import redis.cluster
import redis.sentinel
from kombu import Connection
from kombu.exceptions import OperationalError

from layby.broker_config.settings import Settings, broker_shown
from layby.control import connections
from layby.notifier.mail import LOOPBACK
from layby.parking import formats, iso, migrations
from layby.parking.gauges import live_hosting, runs_by_version
from layby.parking.keys import Keys
from layby.parking.store import on_cluster
from layby.wire import Status

MAX_SKEW_S = 2.0
# A failover needs a majority of the sentinels: with fewer than 3, losing the primary's
# machine (and the sentinel on it) leaves too few to agree.
MIN_SENTINELS = 3


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


def check_version(client: redis.Redis) -> Check:
    """Redis 7.0 or newer (or Valkey, 7.2 and on): the scripts begin with `#!lua`, which
    older servers cannot load (and a park copies its run's event stream with COPY)."""
    info = client.info("server")
    name = "valkey" if info.get("valkey_version") else "redis"
    version = str(info.get("valkey_version") or info.get("redis_version") or "0")
    parts = tuple(int(p) for p in version.split(".")[:2] if p.isdigit())
    if name == "valkey" or parts >= (7, 0):
        return Check("redis version", True, f"{name} {version}")
    return Check("redis version", False, f"{name} {version}: layby needs Redis 7.0 or newer "
                 "(or Valkey); its scripts begin with a `#!lua` line older servers refuse")


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


def check_sweeper(client: redis.Redis, settings: Settings) -> Check:
    """The sweeper's liveness: when it last finished a sweep (it notes each one; it sweeps
    in its own loop, so Flower shows no task for it)."""
    raw = client.get(formats.keys_of(client, settings.key_prefix).swept)
    if not raw:
        return Check("sweeper", True, "no sweep recorded yet: start `layby sweeper` (one "
                                      "per deployment) before runs are started")
    seconds, micros = client.time()
    age = max(0.0, (int(seconds) * 1000 + int(micros) // 1000 - int(raw)) / 1000)
    late = max(10.0, 10 * settings.sweep_interval_s)
    if age <= late:
        return Check("sweeper", True, f"last sweep {age:.1f} s ago")
    return Check("sweeper", False,
                 f"last sweep {age:.0f} s ago (it sweeps every {settings.sweep_interval_s:g} "
                 "s): is `layby sweeper` running? Without it nothing expires, lost steps "
                 "are not requeued and unpublished work waits")


def check_format(client: redis.Redis, settings: Settings) -> Check:
    """Whether this code reads the store's format, as every process checks before it
    serves; a migration under way and how far it got."""
    keys = formats.keys_of(client, settings.key_prefix)
    state = formats.read(client, keys)
    newest = migrations.newest()
    why = formats.readable(state, newest, empty=not formats.has_data(client, keys))
    if why is not None:
        return Check("store format", False, why)
    if state.version is None:
        return Check("store format", True, f"none yet (an empty store: the first process "
                                           f"stamps format {newest})")
    line = f"format {state.version}"
    if state.written != state.version:
        line += f", writing format {state.written}"
    if state.sharded_at is not None and state.version < formats.SHARDED:
        line += (f"; moving to the sharded layout ({state.shards} shards) since "
                 f"{iso(state.sharded_at)}: runs move as they are touched, `layby migrate` "
                 "moves the rest")
    if state.migrating is not None:
        line += (f"; migration {state.migrating} under way (`layby migrate` goes on "
                 "where it stopped)")
    elif state.version < newest:
        line += f"; this layby writes format {newest} once `layby migrate` has run"
    return Check("store format", True, line)


def check_pinned_versions(client: redis.Redis, settings: Settings) -> list[Check]:
    """Runs pinned to an agent version (`on_change="pin"`) that no live worker hosts: queued
    or resuming, they wait now; parked or retrying, they would wait once answered or due.
    One line each version."""
    layout = formats.layout_of(client, settings.key_prefix)
    counts = runs_by_version(client, layout, (Status.INTERRUPTED, Status.QUEUED,
                                              Status.RESUMING, Status.RETRYING))
    pinned = sorted(((c.agent, c.version or ""), n) for c, n in counts.items() if c.pinned)
    if not pinned:
        return [Check("pinned versions", True, "no waiting run is pinned to a version")]
    hosted = {token for tokens in live_hosting(client, layout).values() for token in tokens}
    missing = [(agent, version, n) for (agent, version), n in pinned
               if f"{agent}@{version}" not in hosted]
    if not missing:
        return [Check("pinned versions", True,
                      f"{sum(n for _, n in pinned)} waiting run(s) pinned to {len(pinned)} "
                      "version(s), each hosted by a live worker")]
    return [Check("pinned versions", False,
                  f"{n} run(s) of agent {agent!r} wait pinned to version {version}, which no "
                  "live worker hosts: keep (or start) a worker on the code of that version "
                  f"until they are done, or start one with `--agent-versions {version}` "
                  "whose code can run them")
            for agent, version, n in missing]


def check_processes(client: redis.Redis, settings: Settings) -> Check:
    """The live processes of the registry, by kind and release: mid-deployment, two
    releases, and which format the store writes meanwhile."""
    keys = formats.keys_of(client, settings.key_prefix)
    seconds, micros = client.time()
    now = int(seconds) * 1000 + int(micros) // 1000
    names = cast("list[str]", client.zrangebyscore(keys.workers, f"({now}", "+inf"))
    told = cast("list[str | None]", client.hmget(keys.workers_about, names)) if names else []
    counts: dict[tuple[str, str], int] = {}
    for about in told:
        kind, _, rest = (about or "worker ? unknown").partition(" ")
        release = rest.partition(" ")[2] or "unknown"
        counts[(kind, release)] = counts.get((kind, release), 0) + 1
    if not counts:
        return Check("processes", True, "none beats in the registry (none running, or "
                                        "all of a release before 0.2.0)")
    listed = ", ".join(f"{n} {kind}{'s' if n > 1 else ''} of {release}"
                       for (kind, release), n in sorted(counts.items()))
    releases = {release for _, release in counts}
    if len(releases) > 1:
        state = formats.read(client, keys)
        listed += (f"; a deployment is rolling: the store writes format {state.written} "
                   "until no process of the older release is left")
    return Check("processes", True, listed)


def _where(node: redis.Redis) -> str:
    return "{host}:{port}".format_map(node.connection_pool.connection_kwargs)


def _why(exc: redis.RedisError) -> str:
    if isinstance(exc, redis.AuthenticationError):
        return f"{exc} (check LAYBY_REDIS_SENTINEL_PASSWORD)"
    if "no such master" in str(exc).lower():
        return f"{exc} (check LAYBY_REDIS_SENTINEL_MASTER)"
    return str(exc)


def check_sentinels(group: redis.sentinel.Sentinel, master: str,
                    min_replicas_ack: int = 0) -> list[Check]:
    """Sentinels reachable, agreeing on the primary of `master`, and its replicas in sync."""
    states: dict[str, dict[str, Any]] = {}
    failures = []
    for node in group.sentinels:
        try:
            # One sentinel's own client answers with the master's state (redis-py's `bool`
            # is what the Sentinel object's fan-out returns).
            states[_where(node)] = cast("dict[str, Any]", node.sentinel_master(master))
        except redis.RedisError as exc:
            failures.append(f"{_where(node)}: {_why(exc)}")
    listed = len(group.sentinels)
    known = min((int(s["num-other-sentinels"]) + 1 for s in states.values()), default=0)
    problems = [*failures]
    if listed < MIN_SENTINELS:
        problems.append(f"LAYBY_REDIS_URL lists {listed}: a failover needs a majority of "
                        f"the sentinels; run {MIN_SENTINELS} or more on separate machines "
                        "and list them all")
    elif states and known < MIN_SENTINELS:
        problems.append(f"a sentinel knows only {known} sentinel(s) in all: they must reach "
                        "each other (check their network, and `sentinel announce-ip` "
                        "behind NAT)")
    summary = f"{len(states)} of {listed} answer for {master!r}"
    checks = [Check("redis sentinels", not problems,
                    "; ".join([summary, *problems]) if problems else summary)]
    primaries = {f"{s['ip']}:{s['port']}" for s in states.values()}
    if not states:
        return [*checks, Check("redis primary", False, "no sentinel answered")]
    if len(primaries) > 1:
        named = ", ".join(f"{w} says {s['ip']}:{s['port']}" for w, s in states.items())
        checks.append(Check("redis primary", False, f"the sentinels disagree ({named}): a "
                            "failover is under way, or they are split; run doctor again "
                            "in a minute"))
    elif any(s["is_sdown"] or s["is_odown"] for s in states.values()):
        checks.append(Check("redis primary", False, f"{primaries.pop()} is down as the "
                            "sentinels see it; a failover should follow"))
    else:
        checks.append(Check("redis primary", True, f"{primaries.pop()}, named by "
                            f"{len(states)} sentinel(s)"))
    checks.append(check_replicas(group, master, min_replicas_ack))
    return checks


def check_replicas(group: redis.sentinel.Sentinel, master: str,
                   min_replicas_ack: int = 0) -> Check:
    replicas = None
    for node in group.sentinels:
        try:
            replicas = node.sentinel_slaves(master)
            break
        except redis.RedisError as exc:
            why = _why(exc)
    if replicas is None:
        return Check("redis replicas", False, f"no sentinel lists them: {why}")
    in_sync = [f"{r['ip']}:{r['port']}" for r in replicas
               if not (r["is_sdown"] or r["is_odown"]) and r.get("master-link-status") == "ok"]
    if not in_sync:
        return Check("redis replicas", False,
                     "none in sync with the primary: a failover has nothing to promote; "
                     "run a replica (`replicaof <primary> <port>`) the sentinels can see")
    if len(in_sync) < min_replicas_ack:
        return Check("redis replicas", False,
                     f"{len(in_sync)} in sync ({', '.join(in_sync)}) but "
                     f"LAYBY_REDIS_MIN_REPLICAS_ACK={min_replicas_ack}: acknowledged "
                     "transitions are refused until more replicas are in sync")
    return Check("redis replicas", True, f"{len(in_sync)} in sync: {', '.join(in_sync)}")


def check_cluster(client: redis.cluster.RedisCluster, settings: Settings) -> list[Check]:
    """A cluster store's health as CLUSTER NODES and CLUSTER INFO tell it: every node up,
    every slot served, a replica for every primary, the store's shard count the one set
    here, and the broker not one of its nodes."""
    nodes = cast("dict[str, dict[str, Any]]", client.cluster_nodes())
    info: dict[str, str] = client.cluster_info()
    failing = sorted(addr.split("@")[0] for addr, n in nodes.items()
                     if "fail" in n["flags"] or not n["connected"])
    primaries = {n["node_id"]: addr.split("@")[0] for addr, n in nodes.items()
                 if "master" in n["flags"] and "fail" not in n["flags"] and n["slots"]}
    checks = [Check("cluster nodes", not failing,
                    f"{len(nodes)} known, {len(primaries)} primaries serve slots"
                    + (f"; failing or unreachable: {', '.join(failing)} (a replica takes "
                       "over a failed primary; start the node again or forget it)"
                       if failing else ""))]
    covered = int(info.get("cluster_slots_ok", 0))
    if info.get("cluster_state") == "ok" and covered == 16384:
        checks.append(Check("cluster slots", True, "all 16384 served"))
    else:
        checks.append(Check("cluster slots", False,
                            f"{covered} of 16384 served (state {info.get('cluster_state')}): "
                            "runs in the others cannot be reached; assign them (CLUSTER "
                            "ADDSLOTSRANGE, or `valkey-cli --cluster fix`)"))
    bare = sorted(addr for node_id, addr in primaries.items()
                  if not any(n["master_id"] == node_id and n["connected"]
                             and "fail" not in n["flags"] for n in nodes.values()))
    checks.append(Check("cluster replicas", not bare,
                        f"a replica in sync for each of {len(primaries)} primaries"
                        if not bare else
                        f"no replica for {', '.join(bare)}: its failure would leave its "
                        "slots unserved; attach one (CLUSTER REPLICATE)"))
    checks.append(_store_shards(client, settings))
    checks.append(_broker_apart(nodes, settings))
    return checks


def _store_shards(client: redis.cluster.RedisCluster, settings: Settings) -> Check:
    """The store's shard count, as its format key says, against the one set here."""
    state = formats.read(cast("redis.Redis", client), Keys(settings.key_prefix))
    why = formats.layout_problem(state, settings.wanted_shards)
    return Check("store shards", why is None, why or (
        f"{state.shards} (LAYBY_STORE_SHARDS)" if state.shards is not None
        else f"none yet (an empty store: the first process makes {settings.store_shards})"))


def _broker_apart(nodes: dict[str, dict[str, Any]], settings: Settings) -> Check:
    """The broker is none of the cluster's `nodes` (CLUSTER NODES): Celery's queues cannot
    live on a cluster."""
    broker = urlsplit((settings.resolved_broker_url() or "").split(";")[0])
    # A node is named by its address or, announced, by its hostname (on Compose, say).
    names = {addr.split("@")[0] for addr in nodes} | {
        f"{n['hostname']}:{addr.split('@')[0].rpartition(':')[2]}"
        for addr, n in nodes.items() if n.get("hostname")}
    on_it = names & {f"{broker.hostname}:{broker.port or 6379}"}
    return Check("broker apart", not on_it,
                 f"{broker_shown(settings.resolved_broker_url() or '')}, not a node "
                 "of the cluster" if not on_it else
                 f"LAYBY_BROKER_URL names {on_it.pop()}, a node of the cluster: "
                 "Celery's queues cannot live on a cluster (kombu has no cluster "
                 "transport); give a Redis, Sentinel or RabbitMQ beside it")


def per_node(client: redis.cluster.RedisCluster, settings: Settings,
             check: Callable[[redis.Redis], Check]) -> Check:
    """`check` on every node of the cluster (each keeps its own configuration): one line,
    the nodes that fail it named."""
    login = connections.cluster_nodes(connections.redis_url(settings))
    found: list[tuple[str, Check]] = []
    for addr, node in cast("dict[str, dict[str, Any]]", client.cluster_nodes()).items():
        if "fail" in node["flags"]:
            continue
        host, _, port = addr.split("@")[0].rpartition(":")
        one = redis.Redis(host, int(port), username=login.username, ssl=login.tls,
                          password=login.password.get_secret_value() if login.password
                          else None, socket_timeout=5, decode_responses=True)
        try:
            found.append((f"{host}:{port}", check(one)))
        finally:
            one.close()
    bad = [(where, c) for where, c in found if not c.ok]
    name = found[0][1].name if found else check.__name__.removeprefix("check_")
    if not bad:
        return Check(name, True, f"{found[0][1].message} on all {len(found)} nodes"
                     if found else "no node answers")
    return Check(name, False, "; ".join(f"{where}: {c.message}" for where, c in bad))


def check_celery(conf: object, settings: Settings) -> list[Check]:
    get = conf.get  # type: ignore[attr-defined]
    checks = []
    for name, want in (("task_acks_late", True), ("task_reject_on_worker_lost", True),
                       ("worker_prefetch_multiplier", 1)):
        value = get(name)
        checks.append(Check(f"celery {name}", value == want, f"{value!r}" if value == want
                            else f"{value!r}, should be {want!r}: a worker that dies loses "
                                 "or holds back the tasks it took"))
    if settings.broker_is_amqp:  # RabbitMQ redelivers what a lost consumer held, at once
        return checks
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


def check_broker(settings: Settings, conf: object, timeout_s: int = 3) -> Check:
    """Where the broker is and whether it answers: a broker of its own (LAYBY_BROKER_URL)
    is not checked with the store."""
    if settings.broker_is_store:
        return Check("broker", True, "the store's server (LAYBY_BROKER_URL unset)")
    url = settings.resolved_broker_url() or ""
    where = broker_shown(url)
    conn = Connection(url, transport_options=conf.get(  # type: ignore[attr-defined]
        "broker_transport_options") or {}, connect_timeout=timeout_s)
    # kombu raises its own OperationalError for what the transport's client raised.
    errors: tuple[type[BaseException], ...] = (*conn.connection_errors, *conn.channel_errors,
                                               OSError, OperationalError)
    try:
        conn.ensure_connection(max_retries=1, timeout=int(timeout_s))
    except errors as exc:
        return Check("broker", False, f"{where} does not answer ({exc}): start it, or fix "
                                      "LAYBY_BROKER_URL")
    finally:
        conn.release()
    return Check("broker", True, f"{where} answers")


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


def check_inbox(settings: Settings) -> Check:
    """How reviewers sign in to `/inbox`, and whether their sessions travel encrypted."""
    ways = []
    if settings.inbox_trusted_header:
        ways.append(f"named by a sign-in proxy's {settings.inbox_trusted_header} header "
                    "(only that proxy may reach the gateway)")
    if settings.smtp_host:
        ways.append("by a link mailed to their directory address")
    url = urlsplit(settings.public_url)
    if ways and url.scheme != "https" and url.hostname not in LOOPBACK:
        return Check("inbox", False, f"LAYBY_PUBLIC_URL is {url.scheme}://{url.hostname}: "
                     "sign-in links and session cookies would cross the network unencrypted; "
                     "serve the gateway behind TLS and give its https:// address")
    if not ways:
        return Check("inbox", True, "no way to sign in to /inbox: set LAYBY_SMTP_HOST (for "
                     "sign-in links) or LAYBY_INBOX_TRUSTED_HEADER")
    return Check("inbox", True, "reviewers sign in " + " or ".join(ways))


def check_slack(settings: Settings) -> list[Check]:
    """Whether Slack's bot token works (`auth.test`) and every Slack user of the directory
    exists (`users.info`), when Slack is configured."""
    from layby.notifier import slack_messages
    from layby.notifier.mail import PermanentFailure
    from layby.reviewers.directory import load_directory

    if not settings.slack:
        return [Check("slack", True, "not configured (LAYBY_SLACK_BOT_TOKEN unset): no Slack")]
    checks = []
    if settings.slack_signing_secret is None:
        checks.append(Check("slack signing secret", False, "unset: clicks in Slack cannot be "
                            "verified and are refused; set LAYBY_SLACK_SIGNING_SECRET to the "
                            "app's signing secret"))
    try:
        who = slack_messages.call(settings, "auth.test")
    except (PermanentFailure, ConnectionError) as exc:
        return [*checks, Check("slack token", False, f"{exc}; check LAYBY_SLACK_BOT_TOKEN "
                               f"and LAYBY_SLACK_API_URL ({settings.slack_api_url})")]
    checks.append(Check("slack token", True, f"works: bot {who.get('user')!r} of "
                                             f"{who.get('team')!r}"))
    try:
        directory = load_directory(settings.reviewers_file)
    except Exception:  # noqa: BLE001  (reported by the reviewer directory's check)
        return checks
    missing: list[str] = []
    for reviewer in directory.reviewers.values():
        if reviewer.slack_id:
            try:
                found = slack_messages.call(settings, "users.info", user=reviewer.slack_id)
                if (found.get("user") or {}).get("deleted"):
                    missing.append(f"{reviewer.id} ({reviewer.slack_id}: deactivated)")
            except (PermanentFailure, ConnectionError) as exc:
                missing.append(f"{reviewer.id} ({reviewer.slack_id}: {exc})")
    count = sum(1 for r in directory.reviewers.values() if r.slack_id)
    checks.append(Check("slack users", not missing,
                        f"all {count} of the directory exist" if not missing else
                        f"not found in Slack: {', '.join(missing)}; fix their slack_id in "
                        "the reviewer directory"))
    return checks


def check_keys(settings: Settings) -> Check:
    """The API keys: LAYBY_KEYS_FILE parses (rights known, names and keys given once)."""
    from layby.access.keys import Keyring, KeysFileError

    try:
        ring = Keyring(settings.api_key_table, settings.keys_file)
    except KeysFileError as exc:
        return Check("api keys", False, exc.message)
    tenants = sorted({k.tenant for k in ring.keys})
    return Check("api keys", True, f"{len(ring.keys)} key(s) of tenant(s) {', '.join(tenants)}"
                 + (f" ({settings.keys_file})" if settings.keys_file else "")
                 if ring.keys else "none: /v1 and AG-UI refuse every call (LAYBY_API_KEYS, "
                 "LAYBY_KEYS_FILE)")


def check_reviewers(settings: Settings) -> list[Check]:
    from layby.reviewers.directory import load_directory
    from layby.reviewers.tokens import parse_keys

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
        directory = None
    checks += check_policy(settings, directory)
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


def check_policy(settings: Settings, directory: Any) -> list[Check]:
    """The reviewer policy rules: refused ones leave the previous rules in force in running
    processes, so a broken file is easy to miss without this."""
    from layby.errors import ConfigError
    from layby.reviewers.policy import load_rules

    path = settings.policy_file or settings.reviewers_file
    if path is None:
        return []
    try:
        rules = load_rules(path)
        if directory is not None:
            rules.check(directory)
    except ConfigError as exc:
        return [Check("policy rules", False, f"{exc.message}; running processes keep the "
                                             "rules they loaded before (`layby policy check`)")]
    if not rules.rules and settings.policy_file is None:
        return []  # a directory without rules: nothing to report
    return [Check("policy rules", True, f"{path}: {len(rules.rules)} rule(s)")]


def run_checks(settings: Settings, client: redis.Redis | None, conf: object, *,
               sentinel: redis.sentinel.Sentinel | None = None,
               redis_error: str | None = None) -> list[Check]:
    """All checks; `redis_error` says why there is no `client` (a configuration error)."""
    checks: list[Check] = []
    if sentinel is not None:
        checks.extend(check_sentinels(sentinel, settings.redis_sentinel_master,
                                      settings.redis_min_replicas_ack))
    if client is None:
        checks.append(Check("redis", False, redis_error
                            or "no Redis server configured: set LAYBY_REDIS_URL"))
    else:
        checks.extend(_store_checks(settings, client))
    checks.append(check_broker(settings, conf))
    checks.extend(check_celery(conf, settings))
    checks.append(check_smtp(settings))
    checks.append(check_inbox(settings))
    checks.append(check_keys(settings))
    checks.extend(check_reviewers(settings))
    checks.extend(check_slack(settings))
    return checks


def _store_checks(settings: Settings, client: redis.Redis) -> list[Check]:
    """The checks of the store's server, each of its nodes' on a cluster, and of what the
    store records (the sweeper, the format, the processes); a server that stops answering
    ends them with why."""
    checks: list[Check] = []
    try:
        client.ping()
        checks.append(Check("redis", True, "answers"))
        redis_checks: list[Callable[[redis.Redis], Check]] = [
            check_version, check_appendonly, check_appendfsync, check_eviction,
            check_clock]
        cluster = cast("redis.cluster.RedisCluster", client) if on_cluster(client) \
            else None
        if cluster is not None:
            checks.extend(check_cluster(cluster, settings))
        for check in redis_checks:
            try:
                # A cluster's nodes each have their own configuration (one clock).
                checks.append(check(client) if cluster is None or check is check_clock
                              else per_node(cluster, settings, check))
            except redis.ResponseError as exc:  # CONFIG renamed or refused by a host
                checks.append(Check(check.__name__.removeprefix("check_"), False,
                                    f"cannot read it: {exc}; check it by hand"))
        checks.append(check_sweeper(client, settings))
        checks.append(check_format(client, settings))
        checks.extend(check_pinned_versions(client, settings))
        checks.append(check_processes(client, settings))
    except redis.sentinel.MasterNotFoundError:
        # Its text lists every sentinel client's settings; the sentinels' checks say why.
        checks.append(Check("redis", False, "does not answer: the sentinels name no "
                            f"primary for {settings.redis_sentinel_master!r}"))
    except redis.RedisError as exc:
        checks.append(Check("redis", False, f"does not answer: {exc}"))
    return checks
