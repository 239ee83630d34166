"""The API document is honest: `/openapi.json` says, for every operation, how it is
secured, what it takes (JSON, forms, raw mail) and every status it can answer with the
error body's schema; event streams are `text/event-stream`. Then Schemathesis, reading only
that document, sends thousands of generated requests to a real gateway (every check, every
phase, stateful links; with the API key and real run and interrupt ids, and without a
key) and finds nothing: no 5xx, no undocumented status or content type, no valid request
refused, no invalid one taken. Bounded here (`tests/http/schemathesis.toml`); docs/http-api.md
gives the long run."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from layby.ops.embedded import EmbeddedRedis
from tests.support.harness import API_KEY
from tests.support.reviewers import ReviewedSystem, SmtpServer, WebhookReceiver, own_reviewed

CONFIG = Path(__file__).with_name("schemathesis.toml")
DB = 10  # the reviewer tests' Valkey server, a database of this module's own
KEYED = ("/v1/", "/agui/")


# Keys of the keys file besides LAYBY_API_KEYS' (every right): one that reads, in a tenant
# of its own.
READER = "lby_reader_0123456789abcdef"
KEYS_FILE = f'''
[keys.reader]
secret = "{READER}"
tenant = "reading"
can = ["read"]
'''


@pytest.fixture(scope="module")
def fuzzed(reviewer_redis: EmbeddedRedis, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[ReviewedSystem]:
    """A reviewed system of this module's own: the fuzzer starts, answers and cancels
    hundreds of runs, which no other test should see."""
    tmp = tmp_path_factory.mktemp("fuzzed")
    (tmp / "keys.toml").write_text(KEYS_FILE)
    with own_reviewed(reviewer_redis, tmp, DB, SmtpServer().start(),
                      WebhookReceiver().start(),
                      LAYBY_KEYS_FILE=str(tmp / "keys.toml")) as running:
        yield running


def _document(base_url: str) -> dict[str, Any]:
    got = httpx.get(f"{base_url}/openapi.json", timeout=30)
    assert got.status_code == 200
    return got.json()  # type: ignore[no-any-return]


def test_the_document_says_what_every_operation_takes_and_answers(
        fuzzed: ReviewedSystem) -> None:
    doc = _document(fuzzed.system.base_url)
    schemes = doc["components"]["securitySchemes"]
    assert {"HTTPBearer", "webhookSignature", "inboundBasic"} <= schemes.keys()
    for path, operations in doc["paths"].items():
        for method, op in operations.items():
            where = f"{method.upper()} {path}"
            assert op.get("operationId"), where
            assert "security" in op, f"{where} does not say how it is secured"
            responses = op["responses"]
            assert "503" in responses, f"{where}: the store away is undocumented"
            for status, response in responses.items():
                if status.startswith(("4", "5")) and "application/json" in \
                        response.get("content", {}):
                    schema = response["content"]["application/json"]["schema"]
                    assert schema == {"$ref": "#/components/schemas/ErrorBody"}, where
            if path.startswith(KEYED):
                assert op["security"] == [{"HTTPBearer": []}], where
                assert {"401", "422"} <= responses.keys(), where
            if method == "post" and path.startswith(KEYED):
                assert "413" in responses, f"{where}: the body limit is undocumented"
    paths = doc["paths"]
    callback = paths["/callbacks/answers"]["post"]
    assert callback["requestBody"]["content"]["application/json"]["schema"]["properties"][
        "interruptId"]
    assert callback["security"] == [{"webhookSignature": []}, {}]
    inbound = paths["/inbound/email"]["post"]["requestBody"]["content"]
    assert {"message/rfc822", "multipart/form-data",
            "application/x-www-form-urlencoded"} <= inbound.keys()
    assert "application/x-www-form-urlencoded" in \
        paths["/review/{token}"]["post"]["requestBody"]["content"]
    for stream in (paths["/v1/runs/{run_id}/events"]["get"],
                   paths["/agui/{agent}"]["post"]):
        assert list(stream["responses"]["200"]["content"]) == ["text/event-stream"]
    assert "demo.transfer" in doc["components"]["schemas"]["StartRun"]["properties"][
        "agent"]["enum"]
    runs = paths["/v1/runs"]["get"]["parameters"]
    bounds = {p["name"]: p["schema"] for p in runs}
    assert bounds["limit"]["maximum"] == 500 and bounds["offset"]["maximum"] == 1000


# Examples per operation: a bounded run here; LAYBY_FUZZ_EXAMPLES=100 is the long one
# docs/reliability.md gives figures for.
EXAMPLES = int(os.environ.get("LAYBY_FUZZ_EXAMPLES", "10"))


def _schemathesis(base_url: str, tmp: Path, *args: str, extra_config: str = "",
                  may_not_start: bool = False) -> subprocess.CompletedProcess[str]:
    """`may_not_start`: a caller without the right to start, whose valid starts are 403."""
    text = CONFIG.read_text()
    if may_not_start:
        start = text.index('include-operation-id = "startRun"')
        text = text[:start] + text[start:].replace('["2xx", 401, 404, 409, 422]',
                                                   '["2xx", 401, 403, 404, 409, 422]', 1)
    config = tmp / "schemathesis.toml"
    config.write_text(text + extra_config)
    # One worker: Hypothesis describes filters by parsing their source, and on CPython
    # 3.11 two threads parsing at once have failed with "AST constructor recursion depth
    # mismatch" (CPython gh-106905): a failure of the fuzzer, not of the API.
    return subprocess.run(
        [sys.executable, "-m", "schemathesis.cli", "--config-file", str(config), "run",
         f"{base_url}/openapi.json", "--max-examples", str(EXAMPLES), "--workers", "1",
         "--seed", "20261125",
         # Generating a case is timed by Hypothesis; on 2 cores shared with other test
         # files it is slow for the start's body without anything being wrong.
         "--suppress-health-check", "too_slow", *args],
        capture_output=True, text=True, timeout=600 + 30 * EXAMPLES, cwd=tmp, check=False)


@pytest.mark.timeout(600 + 30 * EXAMPLES)
def test_schemathesis_finds_nothing_with_the_key_and_real_ids(
        fuzzed: ReviewedSystem, tmp_path: Path) -> None:
    run_id = fuzzed.start_run("demo.transfer", "Send 70 to Ida")["id"]
    (interrupt,) = fuzzed.system.open_interrupts(fuzzed.parked(run_id))
    ids = f'\n[parameters]\nrun_id = "{run_id}"\ninterrupt_id = "{interrupt["id"]}"\n'

    done = _schemathesis(fuzzed.system.base_url, tmp_path,
                         "-H", f"Authorization: Bearer {API_KEY}", extra_config=ids)

    print(done.stdout[-1200:])  # the summary (cases, checks), shown with `-s`
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert "passed" in done.stdout and "Stateful" in done.stdout


@pytest.mark.timeout(600 + 30 * EXAMPLES)
def test_schemathesis_finds_nothing_without_a_key(fuzzed: ReviewedSystem,
                                                  tmp_path: Path) -> None:
    done = _schemathesis(fuzzed.system.base_url, tmp_path)

    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert "passed" in done.stdout


@pytest.mark.timeout(600 + 30 * EXAMPLES)
@pytest.mark.parametrize("caller", ["read-only key", "run token"])
def test_schemathesis_finds_nothing_as_the_narrowest_callers(
        fuzzed: ReviewedSystem, tmp_path: Path, caller: str) -> None:
    """The same, as the two narrowest callers: a key of another tenant that may only read
    (every start, answer and cancel refused with a documented 403, every run of the
    default tenant a 404), and a run token that may read and answer one run (every other
    run, list and start refused)."""
    run_id = fuzzed.start_run("demo.transfer", "Send 71 to Ida")["id"]
    (interrupt,) = fuzzed.system.open_interrupts(fuzzed.parked(run_id))
    ids = f'\n[parameters]\nrun_id = "{run_id}"\ninterrupt_id = "{interrupt["id"]}"\n'
    credential = READER
    if caller == "run token":
        with fuzzed.system.api() as api:
            minted = api.post(f"/v1/runs/{run_id}/tokens",
                              json={"can": ["read", "answer"], "ttlS": 3600})
        assert minted.status_code == 201, minted.text
        credential = minted.json()["token"]
    done = _schemathesis(fuzzed.system.base_url, tmp_path,
                         "-H", f"Authorization: Bearer {credential}",
                         extra_config=ids, may_not_start=True)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert "passed" in done.stdout
    # Neither may cancel, and the reader may not answer (nor see the run at all).
    run = fuzzed.system.run(run_id)
    assert run["status"] != "cancelled"
    assert all((i.get("answer") or {}).get("answeredBy") != "api:reader"
               for i in run["interrupts"])
