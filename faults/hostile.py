"""Hostile mail under load: while ten senders keep POSTing ~5 MB replies of 100,000 MIME
parts to the inbound-mail webhook, the gateway refuses each one cheaply (413 with its
reason, or 403) and its ordinary readers (GET /v1/runs) barely notice. Figures: the
readers' p50 at idle and under the load, the hostile requests and their answers, and the
gateway's CPU time per hostile request.

Half the senders name a forged reply token in `?to=` (refused before the body is read),
half name none (the whole body is read, and refused for its shape). Each uploads at
100 Mbit/s, as a sender across a network would: ten senders flooding the loopback at full
speed saturate one gateway process with any request, hostile or not; rate limits for that
belong to the proxy in front of it."""

from __future__ import annotations

import statistics
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil

from faults.common import Outcome, Size, start_runs, system
from layby.answering.mime import MailTooLarge, check_shape
from tests.http.test_hostile_input import MAIL_LIMIT, _many_parts
from tests.support.harness import LaybySystem
from tests.support.reviewers import TOKEN_KEYS

NAME = "hostile mail"
SENDERS = 10
PARTS = 100_000
UPLOAD_BYTES_PER_S = 100e6 / 8
CHUNK = 64 * 1024
REFUSED = {"413 with a JSON reason", "403"}


def run(size: Size, folder: Path) -> Outcome:
    reads, load_s = size.pick((100, 10.0), (200, 30.0))
    # With token keys, as a gateway that takes mail has: a forged token is refused as such.
    layby, server = system(folder / "hostile", LAYBY_TOKEN_KEYS=TOKEN_KEYS)
    try:
        _park(layby, 3)
        mail = _many_parts(PARTS, "mallory@example.com", "reply+hostile@x")
        gateway = psutil.Process(layby.procs["gateway"].process.pid)  # type: ignore[union-attr]
        alone = max(_alone(layby, gateway, mail) for _ in range(size.pick(3, 10)))
        before = _cpu(gateway)
        idle = _reading(layby, lambda n, _: n < reads)
        per_read = (_cpu(gateway) - before) / len(idle)
        before, began = _cpu(gateway), time.monotonic()
        loaded, answers = _under_load(layby, mail, lambda n, took: n < reads or took < load_s)
        spent, took = _cpu(gateway) - before, time.monotonic() - began
        outcome = _outcome(idle, loaded, answers,
                           # The readers' own share, as measured at idle, is not the
                           # hostile mails' doing.
                           spent - per_read * len(loaded), alone, mail)
        outcome.figures["gateway CPU under load (cores busy)"] = round(spent / took, 2)
        outcome.figures["of one mail: check_shape alone (s)"] = round(_shape_cost(mail), 3)
        return outcome
    finally:
        layby.stop()
        server.stop()


def _under_load(layby: LaybySystem, mail: bytes, going: Any) -> tuple[list[float], list[str]]:
    """The readers' latencies while SENDERS threads keep POSTing `mail`, and every answer
    the senders got (each sender finishes the request it is in before stopping)."""
    senders = [Sender(layby, mail, i) for i in range(SENDERS)]
    for sender in senders:
        sender.start()
    try:
        latencies = _reading(layby, going)
    finally:
        for sender in senders:
            sender.halt.set()
        for sender in senders:
            sender.join(120)
    return latencies, [a for s in senders for a in s.answers]


def _park(layby: LaybySystem, count: int) -> None:
    """A few runs waiting on their question, so GET /v1/runs has something to list."""
    for run_id in start_runs(layby, count, text="Trivia {i}", agent="demo.trivia"):
        layby.wait_status(run_id, "interrupted", timeout=60)


def _cpu(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


def _reading(layby: LaybySystem, going: Any) -> list[float]:
    """The latencies of sequential GET /v1/runs?limit=50 while `going(count, elapsed)`."""
    latencies: list[float] = []
    began = time.monotonic()
    with layby.api() as api:
        while going(len(latencies), time.monotonic() - began):
            started = time.monotonic()
            reply = api.get("/v1/runs", params={"limit": 50})
            latencies.append(time.monotonic() - started)
            if reply.status_code != 200:
                raise RuntimeError(f"GET /v1/runs answered {reply.status_code}: "
                                   f"{reply.text[:200]}")
    return latencies


def _alone(layby: LaybySystem, gateway: psutil.Process, mail: bytes) -> float:
    """The gateway's CPU time for one hostile mail with nothing else going on: the cost
    that is that request's alone. A short pause after, for its last work to be counted."""
    before = _cpu(gateway)
    with httpx.Client(base_url=layby.base_url, timeout=60) as http:
        _post(http, mail, "reply+alone@x")
    time.sleep(0.2)
    return _cpu(gateway) - before


def _shape_cost(mail: bytes) -> float:
    """The CPU time of the byte-search shape check on `mail`, here: the part of a hostile
    request's cost that is layby's own check rather than HTTP."""
    started = time.process_time()
    try:
        check_shape(mail, MAIL_LIMIT)
    except MailTooLarge:
        pass
    return time.process_time() - started


def _paced(mail: bytes) -> Iterator[bytes]:
    for start in range(0, len(mail), CHUNK):
        yield mail[start:start + CHUNK]
        time.sleep(CHUNK / UPLOAD_BYTES_PER_S)


def _post(http: httpx.Client, mail: bytes, to: str | None, paced: bool = False) -> str:
    """One hostile mail; what came back, as a verdict."""
    try:
        reply = http.post("/inbound/email", content=_paced(mail) if paced else mail,
                          params={"to": to} if to else None,
                          headers={"Content-Type": "message/rfc822"})
    except httpx.HTTPError as exc:  # a reset or a timeout: what the sender must never see
        return f"no answer ({type(exc).__name__})"
    if reply.status_code == 403:
        return "403"
    if reply.status_code == 413 and _json_reason(reply):
        return "413 with a JSON reason"
    return f"{reply.status_code}: {reply.text[:100]}"


def _json_reason(reply: httpx.Response) -> bool:
    if not reply.headers.get("content-type", "").startswith("application/json"):
        return False
    try:
        return bool(reply.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return False


class Sender(threading.Thread):
    """Keeps POSTing the hostile mail until halted, each to another reply address."""

    def __init__(self, layby: LaybySystem, mail: bytes, index: int) -> None:
        super().__init__(daemon=True)
        self.layby, self.mail, self.index = layby, mail, index
        self.answers: list[str] = []
        self.halt = threading.Event()

    def run(self) -> None:
        with httpx.Client(base_url=self.layby.base_url, timeout=60) as http:
            while not self.halt.is_set():
                to = f"reply+hostile{self.index}n{len(self.answers)}@x" \
                    if self.index % 2 else None
                self.answers.append(_post(http, self.mail, to, paced=True))


def _ms(latencies: list[float]) -> float:
    return round(statistics.median(latencies) * 1000, 1)


def _outcome(idle: list[float], loaded: list[float], answers: list[str],
             hostile_cpu: float, alone: float, mail: bytes) -> Outcome:
    ratio = statistics.median(loaded) / statistics.median(idle)
    per_request = hostile_cpu / max(len(answers), 1)
    figures: dict[str, Any] = {
        "hostile mail (MB, MIME parts)": f"{len(mail) / 1e6:.1f}, {PARTS:,}",
        "GET /v1/runs p50 idle (ms)": _ms(idle),
        "GET /v1/runs p50 under load (ms)": _ms(loaded),
        "GET /v1/runs p95 under load (ms)": round(
            statistics.quantiles(loaded, n=20)[-1] * 1000, 1),
        "reads idle / under load": f"{len(idle)} / {len(loaded)}",
        "p50 ratio (load / idle)": round(ratio, 2),
        "hostile requests sent": len(answers),
        "their answers": dict(Counter(answers)),
        "gateway CPU per hostile request (s)": round(per_request, 3),
        "gateway CPU, one hostile request alone, max (s)": round(alone, 3),
    }
    return Outcome(NAME, figures, {
        "p50 under load within 2x idle": ratio <= 2,
        "every hostile mail refused with 413 + JSON reason or 403 (no 5xx, no reset)":
            bool(answers) and set(answers) <= REFUSED,
        "gateway CPU per hostile request under 1 s": per_request < 1 and alone < 1,
    })
