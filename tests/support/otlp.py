"""A tracing backend for the tests: an OTLP/HTTP receiver on loopback (`POST /v1/traces`,
protobuf), decoding what layby's processes export with OpenTelemetry's own message types
(`opentelemetry-proto`), and keeping every span it was sent."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


@dataclass
class Span:
    name: str
    service: str
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]]
    links: list[tuple[str, str]]  # (trace id, span id)
    start_ns: int
    end_ns: int


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in v.kvlist_value.values}
    return getattr(v, kind) if kind else None


def _attributes(kvs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs}


@dataclass
class Receiver:
    spans: list[Span] = field(default_factory=list)
    raw: list[bytes] = field(default_factory=list)  # every body, to look for secrets in
    server: ThreadingHTTPServer | None = None

    @property
    def endpoint(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                if self.path != "/v1/traces":
                    self.send_response(404)
                    self.end_headers()
                    return
                receiver.take(body)
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def take(self, body: bytes) -> None:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        self.raw.append(body)
        for rs in request.resource_spans:
            service = _attributes(rs.resource.attributes).get("service.name", "")
            for ss in rs.scope_spans:
                for s in ss.spans:
                    self.spans.append(Span(
                        s.name, service, s.trace_id.hex(), s.span_id.hex(),
                        s.parent_span_id.hex(), _attributes(s.attributes),
                        [(e.name, _attributes(e.attributes)) for e in s.events],
                        [(ln.trace_id.hex(), ln.span_id.hex()) for ln in s.links],
                        s.start_time_unix_nano, s.end_time_unix_nano))

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    def named(self, name: str, **attributes: Any) -> list[Span]:
        return [s for s in list(self.spans) if s.name == name and all(
            s.attributes.get(k) == v for k, v in attributes.items())]

    def wait_for(self, name: str, timeout: float = 30, **attributes: Any) -> list[Span]:
        """The spans called `name` (with those attributes), once there is one."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.named(name, **attributes)
            if found:
                return found
            time.sleep(0.1)
        names = sorted({s.name for s in self.spans})
        raise AssertionError(f"no span {name!r} with {attributes} in {timeout} s; "
                             f"received: {names}")
