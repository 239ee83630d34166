"""The dashboard and the alert rules that ship (deploy/grafana/layby.json,
deploy/prometheus/alerts.yml): every expression parses (promql-parser, a maintained PromQL
parser) and every metric it names is on a live gateway's /metrics; the dashboard is what
Grafana's own dashboard types accept (@grafana/schema, checked by TypeScript), and
Prometheus itself loads the rules."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx
import promql_parser
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.support import npm
from tests.support.harness import API_KEY, ROOT, LaybySystem, free_port, wait_until

DASHBOARD = ROOT / "deploy" / "grafana" / "layby.json"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
# Grafana's dashboard types as Grafana publishes them (@grafana/schema) and TypeScript.
GRAFANA_TYPES = Path(__file__).resolve().parent / "grafana_types"


def _selected(expr: str) -> set[str]:
    """The metric names an expression reads (it must parse)."""
    names: set[str] = set()

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector) and node.name:
            names.add(node.name)

    promql_parser.walk(promql_parser.parse(expr), visit)
    return names


def _rules() -> list[dict[str, Any]]:
    loaded = yaml.safe_load(ALERTS.read_text())
    return [rule for group in loaded["groups"] for rule in group["rules"]]


def _dashboard_exprs() -> list[tuple[str, str]]:
    found = json.loads(DASHBOARD.read_text())
    return [(panel["title"], target["expr"]) for panel in found["panels"]
            for target in panel.get("targets", [])]


def test_the_rules_are_prometheus_rules_and_cover_what_operators_need() -> None:
    rules = _rules()
    names = {r["alert"] for r in rules}
    assert {"LaybyRunsStuckPastTheirDeadline", "LaybyNotificationsFailing",
            "LaybySweeperSilent", "LaybyNoWorker", "LaybyStoreMemoryNearMaxmemory",
            "LaybyBacklogGrowing"} <= names
    assert len(names) == len(rules), "two rules of one name"
    for rule in rules:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule
        assert rule["labels"]["severity"] in ("warning", "critical")
        assert rule["annotations"]["summary"]
        assert _selected(rule["expr"]), rule["alert"]


def test_a_bad_expression_is_caught_by_the_parser() -> None:
    """The check above can fail: the parser refuses what Prometheus would."""
    with pytest.raises(ValueError):
        promql_parser.parse("sum by (queue (layby_queue_depth)")


def test_the_dashboard_is_a_grafana_dashboard_over_a_chosen_prometheus() -> None:
    found = json.loads(DASHBOARD.read_text())
    assert found["uid"] == "layby" and found["schemaVersion"] >= 36
    [source] = found["templating"]["list"]
    assert (source["type"], source["query"]) == ("datasource", "prometheus")
    titles = [p["title"] for p in found["panels"] if p["type"] != "row"]
    for wanted in ("Runs by state", "Parked now", "Answer latency (park → answer)",
                   "Runs completed / s", "Tool retries and exhausted attempts",
                   "Failures by code", "Notifications delivered and failed",
                   "Queue depth (steps waiting for a worker)"):
        assert wanted in titles
    for panel in found["panels"]:
        box = panel["gridPos"]
        assert box["x"] + box["w"] <= 24, panel["title"]
        for target in panel.get("targets", []):
            assert target["datasource"]["uid"] == "${datasource}"
            assert _selected(target["expr"]), (panel["title"], target["expr"])


def _typecheck(dashboard: str, folder: Path) -> subprocess.CompletedProcess[str]:
    """TypeScript's verdict on a dashboard's JSON written as an object literal that must
    satisfy Grafana's `Dashboard`: a field Grafana does not know (at any depth), or a value
    of the wrong type, is an error."""
    modules = npm.installed(GRAFANA_TYPES, "@grafana/schema", "the dashboard's check")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "node_modules").symlink_to(modules)
    source = folder / "dashboard.ts"
    source.write_text('import type { Dashboard } from "@grafana/schema";\n\n'
                      f"export const dashboard = {dashboard.strip()} satisfies Dashboard;\n")
    return subprocess.run(["node", str(modules / "typescript" / "bin" / "tsc"), "--noEmit",
                           "--strict", "--target", "es2022", "--module", "nodenext",
                           "--moduleResolution", "nodenext", "--skipLibCheck", str(source)],
                          cwd=folder, capture_output=True, text=True, timeout=120)


@pytest.mark.integration
def test_grafanas_own_dashboard_types_accept_the_dashboard(tmp_path: Path) -> None:
    done = _typecheck(DASHBOARD.read_text(), tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.integration
def test_grafanas_types_refuse_a_field_grafana_does_not_know_or_a_value_it_cannot_take(
        tmp_path: Path) -> None:
    """The check above can fail: a panel's `gridPos` misspelt, and a variable whose
    `current` is empty (which the dashboard had until Grafana's types said so)."""
    shipped = DASHBOARD.read_text()
    misspelt = _typecheck(shipped.replace('"gridPos"', '"gridPosition"', 1), tmp_path / "a")
    assert misspelt.returncode != 0 and "'\"gridPosition\"' does not exist" in misspelt.stdout
    empty = shipped.replace('"type": "datasource",', '"type": "datasource", "current": {},', 1)
    assert empty != shipped
    refused = _typecheck(empty, tmp_path / "b")
    assert refused.returncode != 0 and "VariableOption" in refused.stdout


@pytest.mark.integration
def test_every_metric_the_dashboard_and_alerts_name_is_on_a_live_gateway(
        system: LaybySystem) -> None:
    run_id = system.start_run("demo.trivia", "Quiz me")["id"]
    run = system.wait_status(run_id, "interrupted")
    [intr] = system.open_interrupts(run)
    assert system.answer(run_id, intr["id"], payload="Jaws").status_code == 200
    system.wait_status(run_id, "completed")
    with system.api() as api:
        text = api.get("/metrics").text
    families = list(text_string_to_metric_families(text))
    # What a family serves: its samples, and for one that has none yet (a counter by tool
    # before any retry), the names its type gives its samples.
    served = {s.name for family in families for s in family.samples} | {
        family.name + suffix for family in families for suffix in
        {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}.get(
            family.type, ("",))}
    named = {name for expr in [r["expr"] for r in _rules()]
             + [e for _, e in _dashboard_exprs()] for name in _selected(expr)}
    missing = sorted(named - served)
    assert not missing, f"named but not served: {missing}"
    # The figures behind the new panels and rules are live ones.
    values = {(s.name, tuple(sorted(s.labels.items()))): s.value
              for family in families for s in family.samples}
    assert values[("layby_runs_finished_total", (("state", "completed"),))] >= 1
    assert values[("layby_processes", (("kind", "worker"),))] >= 1
    assert values[("layby_processes", (("kind", "sweeper"),))] == 1
    assert values[("layby_queue_depth", (("queue", "layby.turns"),))] >= 0
    assert values[("layby_redis_used_memory_bytes", ())] > 0


@pytest.mark.integration
def test_prometheus_loads_the_rules_and_evaluates_every_expression_on_a_live_gateway(
        system: LaybySystem, tmp_path: Path) -> None:
    """Prometheus itself (Debian's): it scrapes the gateway with the API key, loads the
    alert rules that ship, and evaluates each rule and each panel's query without an
    error."""
    binary = shutil.which("prometheus")
    assert binary, "Prometheus is not installed: apt-get install prometheus (.ci/run does)"
    port = free_port()
    host, gateway_port = system.base_url.removeprefix("http://").split(":")
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(ALERTS)],
        "scrape_configs": [{"job_name": "layby", "authorization": {"credentials": API_KEY},
                            "static_configs": [{"targets": [f"{host}:{gateway_port}"]}]}]}))
    log = (tmp_path / "prometheus.log").open("w")
    server = subprocess.Popen([binary, f"--config.file={tmp_path / 'prometheus.yml'}",
                               f"--storage.tsdb.path={tmp_path / 'data'}",
                               f"--web.listen-address=127.0.0.1:{port}"],
                              stdout=log, stderr=subprocess.STDOUT)
    api = f"http://127.0.0.1:{port}/api/v1"
    try:
        def scraped_and_evaluated() -> bool:
            try:
                targets = httpx.get(f"{api}/targets", timeout=2).json()["data"]
                rules = httpx.get(f"{api}/rules", timeout=2).json()["data"]["groups"]
            except (httpx.HTTPError, KeyError, ValueError):  # ValueError: 503s while it starts
                return False
            up = [t["health"] for t in targets["activeTargets"]] == ["up"]
            # A rule not evaluated yet says so with the zero time, year 0001.
            evaluated = [r for g in rules for r in g["rules"]
                         if not r.get("lastEvaluation", "0001").startswith("0001")]
            return up and len(evaluated) == len(_rules())

        wait_until(scraped_and_evaluated, 60, what="Prometheus to scrape and evaluate")
        groups = httpx.get(f"{api}/rules", timeout=5).json()["data"]["groups"]
        health = {r["name"]: (r["health"], r.get("lastError")) for g in groups
                  for r in g["rules"]}
        assert set(health) == {r["alert"] for r in _rules()}
        assert all(h == "ok" for h, _ in health.values()), health
        # A healthy system fires none of them.
        firing = [r["name"] for g in groups for r in g["rules"] if r["state"] == "firing"]
        assert not firing, firing
        for title, expr in _dashboard_exprs():
            reply = httpx.get(f"{api}/query", params={"query": expr}, timeout=5).json()
            assert reply["status"] == "success", (title, expr, reply)
        up = httpx.get(f"{api}/query", params={"query": "layby_redis_up"}, timeout=5).json()
        assert [s["value"][1] for s in up["data"]["result"]] == ["1"]
    finally:
        server.terminate()
        server.wait(30)
        log.close()
