"""`--traces`: what tracing costs a worker. The same interrupt cycles, in rounds that
alternate (ABBA) a worker started without the OTEL_* variables and one started with them
(OTLP/HTTP to a sink in the bench process that answers as a collector does), on one server
and one queue: cycles/s and the worker's CPU per cycle on each side, and their ratio.

Off, what a cycle runs of tracing is a few checks: `off_path_us` times exactly the calls
a cycle makes (in the bench's process, which sets up no tracer provider, as a process
without the OTEL_* variables does) and gives them as a share of the worker's CPU per cycle.
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from statistics import median
from typing import Any

import psutil

from bench import measure
from bench.processes import Parts, Worker


@dataclass
class Sink:
    """An OTLP/HTTP endpoint that takes every export and says it was taken (what a
    collector answers), counting them; it decodes nothing."""

    requests: int = 0
    bytes: int = 0
    server: ThreadingHTTPServer | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> Sink:
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                with sink.lock:
                    sink.requests += 1
                    sink.bytes += len(body)
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    @property
    def endpoint(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


def _cpu_s(worker: Worker) -> float:
    """CPU seconds the worker's process and its pool have used so far."""
    assert worker.process is not None
    main = psutil.Process(worker.process.pid)
    total = 0.0
    for proc in [main, *main.children(recursive=True)]:
        try:
            times = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def run(parts: Parts, rt: Any, env: dict[str, str], *, runs: int, rounds: int,
        concurrency: int, in_flight: int, warmup: int, timeout_s: float) -> dict[str, Any]:
    sink = Sink().start()
    traced = {"OTEL_EXPORTER_OTLP_ENDPOINT": sink.endpoint,
              "OTEL_SERVICE_NAME": "layby-bench-worker"}
    clean = {k: v for k, v in env.items() if not k.startswith("OTEL_")}
    sides: dict[str, dict[str, str]] = {"off": clean, "on": {**clean, **traced}}
    seen: dict[str, list[tuple[int, float, float]]] = {"off": [], "on": []}
    try:
        for i, n in enumerate(measure.split(runs, rounds)):
            for side in ("off", "on") if i % 2 == 0 else ("on", "off"):
                worker = parts.start_worker(measure.WORKER_QUEUES, concurrency, sides[side])
                try:
                    measure.wait_for_worker(rt.store, worker.alive)
                    measure.layby_cycles(rt, warmup, in_flight, timeout_s)  # its pool warm
                    before, began = _cpu_s(worker), time.monotonic()
                    done = measure.layby_cycles(rt, n, in_flight, timeout_s)
                    wall, cpu = time.monotonic() - began, _cpu_s(worker) - before
                finally:
                    worker.stop()
                seen[side].append((len(done.cycles), wall, cpu))
                print(f"bench: round {i + 1}, traces {side}: {len(done.cycles) / wall:.1f} "
                      f"cycles/s", file=sys.stderr)
    finally:
        sink.stop()
    figures = {side: _side(rounds_seen) for side, rounds_seen in seen.items()}
    off, on = figures["off"], figures["on"]
    idle_us = off_path_us()
    return {**figures,
            "off: tracing calls per cycle (µs)": round(idle_us, 2),
            "off: share of the worker's CPU per cycle": round(
                idle_us / 1000 / off["worker CPU ms per cycle"], 5),
            "on/off cycles/s": round(on["cycles/s"] / off["cycles/s"], 3),
            "on/off worker CPU per cycle": round(on["worker CPU ms per cycle"]
                                                 / off["worker CPU ms per cycle"], 3),
            "exports received": sink.requests, "bytes exported": sink.bytes,
            "exported bytes per cycle": round(sink.bytes / max(1, sum(
                c for c, _, _ in seen["on"]) + warmup * len(seen["on"])))}


def off_path_us(repeat: int = 20_000) -> float:
    """µs of CPU that one cycle's tracing calls take with tracing off: the start's and the
    answer's context reads, the answer's and the resume's spans, two agent turns with a
    model call each, a tool call and the park's event (layby's calls, as a cycle makes
    them)."""
    from layby.broker_config import tracing
    from layby.generation import spans
    from layby.generation.messages import text_message

    reply = text_message("model", "done")

    def cycle() -> None:
        tracing.current()
        with tracing.answering("run_1", "api", ["int_1"], None):
            tracing.current()
        with tracing.resumed("run_1", None):
            pass
        for _ in range(2):
            with spans.agent_turn("bench.approval", "scripted", "run_1", 1), \
                    spans.model_call("scripted", "run_1", []) as call:
                spans.record_reply(call, reply, "stop", None)
        with spans.tool_call("ask", "call_0", "bench.approval", "run_1") as tool:
            spans.record_outcome(tool, "interrupt")
        tracing.parked("run_1", [("int_1", "input_required")])

    assert not spans.on(), "the bench's own process must not trace"
    began = time.process_time()
    for _ in range(repeat):
        cycle()
    return (time.process_time() - began) / repeat * 1e6


def _side(rounds: list[tuple[int, float, float]]) -> dict[str, Any]:
    cycles = sum(c for c, _, _ in rounds)
    return {"cycles": cycles,
            "cycles/s": round(cycles / sum(w for _, w, _ in rounds), 1),
            "cycles/s by round (median)": round(median(c / w for c, w, _ in rounds), 1),
            "worker CPU ms per cycle": round(1000 * sum(cpu for _, _, cpu in rounds) / cycles,
                                             2)}


def table(result: dict[str, Any]) -> str:
    t = result["traces"]
    lines = ["traces off vs on (the worker; ABBA rounds, one server)", ""]
    for side in ("off", "on"):
        s = t[side]
        lines.append(f"  {side:<4} {s['cycles/s']:>8} cycles/s   {s['worker CPU ms per cycle']:>7} "
                     f"ms worker CPU per cycle   ({s['cycles']} cycles)")
    lines += ["", f"  on/off: cycles/s x{t['on/off cycles/s']}, worker CPU per cycle "
                  f"x{t['on/off worker CPU per cycle']}; {t['exported bytes per cycle']} "
                  f"bytes of spans exported per cycle",
              f"  off: the tracing calls of a cycle take "
              f"{t['off: tracing calls per cycle (µs)']} µs of CPU, "
              f"{t['off: share of the worker' + chr(39) + 's CPU per cycle']:.3%} of the "
              "worker's per cycle"]
    return "\n".join(lines)

