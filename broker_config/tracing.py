"""Traces: OpenTelemetry's SDK, set up from the standard `OTEL_*` variables in every process
layby starts, and the trace context a run carries from one step to the next.

Tracing is on when the environment asks for an exporter: `OTEL_TRACES_EXPORTER` names one
(`otlp`, over HTTP/protobuf, or `console`), or an OTLP endpoint is set
(`OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`); never with
`OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none`. The SDK reads the rest itself:
the endpoint, headers and timeout of the exporter, `OTEL_SERVICE_NAME` and
`OTEL_RESOURCE_ATTRIBUTES`, the sampler (`OTEL_TRACES_SAMPLER`, `…_ARG`). Off, no tracer
provider is set and no exporter thread runs: layby makes no span at all
(`layby.generation.spans`), and the API's no-op tracer takes the few others.

A run's trace context is a W3C `traceparent` kept in the run's hash (`trace`): the start's,
then, once an answer resumes it, the answer's. The scripts put it into every task message
of the run (`layby.broker_config.messages`), where OpenTelemetry's Celery instrumentation
continues it in the worker; the outbox's entries carry it too, for the publisher.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Link
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from layby.errors import ConfigError

log = logging.getLogger(__name__)
_PROPAGATOR = TraceContextTextMapPropagator()
_EXPORTERS = ("otlp", "console")
_configured: list[str] = []  # the kind of process this one was set up as, once it was


def wanted(env: Mapping[str, str] | None = None) -> bool:
    """Whether the standard variables ask for traces (see the module's docstring)."""
    env = os.environ if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = _exporters(env)
    if exporters:
        return exporters != ["none"]
    return bool(env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
                or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


def _exporters(env: Mapping[str, str]) -> list[str]:
    return [name.strip().lower() for name in env.get("OTEL_TRACES_EXPORTER", "").split(",")
            if name.strip()]


def configure(kind: str, env: Mapping[str, str] | None = None) -> bool:
    """Set up this process's tracer provider when the environment asks for traces; `kind`
    (gateway, worker, sweeper, listener) names the service when `OTEL_SERVICE_NAME` does
    not: `layby-<kind>`. Once per process; returns whether tracing is on. A process whose
    host set up its own tracer provider (layby as a library) keeps it: layby's spans go
    there."""
    env = os.environ if env is None else env
    if _configured:
        return True
    if _tracing():
        _configured.append(kind)
        return True
    if not wanted(env):
        return False
    check(env)
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    exporters = [e for e in _exporters(env) or ["otlp"] if e != "none"]
    named = "OTEL_SERVICE_NAME" in env or "service.name=" in env.get(
        "OTEL_RESOURCE_ATTRIBUTES", "")
    provider = TracerProvider(resource=Resource.create(
        {} if named else {"service.name": f"layby-{kind}"}))
    for name in exporters:
        provider.add_span_processor(BatchSpanProcessor(_exporter(name, env)))
    trace.set_tracer_provider(provider)
    _configured.append(kind)
    log.info("traces on: %s, to %s", kind, ", ".join(exporters))
    return True


def check(env: Mapping[str, str] | None = None) -> None:
    """Refuse, in one line (ConfigError), traces asked of an exporter or protocol layby
    does not ship: checked with the rest of a process's configuration before it starts
    (`control.runtime.check_config`), not when its first span would go."""
    env = os.environ if env is None else env
    if not wanted(env):
        return
    unknown = [e for e in _exporters(env) if e not in (*_EXPORTERS, "none")]
    if unknown:
        raise ConfigError(f"OTEL_TRACES_EXPORTER names {', '.join(unknown)}, which layby does "
                          f"not ship: use {' or '.join(_EXPORTERS)} (or none), and an "
                          "OpenTelemetry Collector for any other backend")
    protocol = env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
                       env.get("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"))
    if protocol != "http/protobuf" and "otlp" in (_exporters(env) or ["otlp"]):
        raise ConfigError(f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol}: layby exports OTLP over "
                          "HTTP/protobuf only; set it to http/protobuf (port 4318)")


def _exporter(name: str, env: Mapping[str, str]) -> Any:
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


def flush(timeout_ms: int = 5000) -> None:
    """Send the spans this process still holds (a process about to exit)."""
    if _configured:
        provider: Any = trace.get_tracer_provider()
        provider.force_flush(timeout_ms)


def instrument_celery() -> None:
    """Celery's own spans (publish, run) from OpenTelemetry's instrumentation, once tracing
    is on: a worker's step continues the trace its message names."""
    if not _configured:
        return
    from opentelemetry.instrumentation.celery import CeleryInstrumentor

    instrumentor = CeleryInstrumentor()  # type: ignore[no-untyped-call]
    if not instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.instrument()


def current() -> str | None:
    """The current span's context as a traceparent, or None (no span, or tracing off)."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return carrier.get("traceparent")


def context_of(traceparent: str | None) -> otel_context.Context | None:
    """The context a stored traceparent names, to continue; None for none."""
    if not traceparent:
        return None
    found = _PROPAGATOR.extract({"traceparent": traceparent})
    return found if trace.get_current_span(found).get_span_context().is_valid else None


def links_to(*traceparents: str | None) -> list[Link]:
    """Span links to the spans the stored traceparents name (none for None)."""
    links = []
    for value in traceparents:
        found = context_of(value)
        if found is not None:
            links.append(Link(trace.get_current_span(found).get_span_context()))
    return links


@contextmanager
def continued(traceparent: str | None) -> Iterator[None]:
    """Within it, the stored trace context is the current one (nothing changes for None)."""
    found = context_of(traceparent)
    if found is None:
        yield
        return
    token = otel_context.attach(found)
    try:
        yield
    finally:
        otel_context.detach(token)


def tracer() -> trace.Tracer:
    return trace.get_tracer("layby")


def _tracing() -> bool:
    """Whether this process has a tracer provider (layby's, or its host's own): without
    one, layby makes no span at all rather than the API's no-op ones."""
    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


def resumed(run_id: str, parked_in: str | None) -> AbstractContextManager[None]:
    """A resumed step, in the trace of the answer that resumed it, linked to the trace the
    run parked in; and in that trace, a `layby.run.resumed` span linked back to this one, so
    that each trace leads to the other. Nothing when the park was not traced."""
    if not parked_in or not _tracing() or context_of(parked_in) is None:
        return nullcontext()
    return _resumed(run_id, parked_in)


@contextmanager
def _resumed(run_id: str, parked_in: str) -> Iterator[None]:
    with tracer().start_as_current_span(
            "layby.resume", links=links_to(parked_in),
            attributes={"layby.run.id": run_id}) as span:
        back = tracer().start_span("layby.run.resumed", context=context_of(parked_in),
                                   links=[Link(span.get_span_context())],
                                   attributes={"layby.run.id": run_id})
        back.end()
        yield


def parked(run_id: str, interrupts: list[tuple[str, str]]) -> None:
    """The end of the run's trace for now: an event on the step's span, with the interrupts
    it waits on (ids and reasons)."""
    span = trace.get_current_span()
    if span.is_recording():
        span.add_event("layby.run.parked", {
            "layby.run.id": run_id,
            "layby.interrupt.ids": [i for i, _ in interrupts],
            "layby.interrupt.reasons": [r for _, r in interrupts]})


def answering(run_id: str, channel: str, interrupt_ids: list[str],
              run_trace: str | None) -> AbstractContextManager[None]:
    """An answer, whichever way it came (`layby.answer`): in the trace of its request (the
    HTTP call's, or a trace of its own: a mail, the sweeper), linked to the run's trace.
    A resume it causes continues it (`resumed`)."""
    return _answering(run_id, channel, interrupt_ids, run_trace) if _tracing() \
        else nullcontext()


@contextmanager
def _answering(run_id: str, channel: str, interrupt_ids: list[str],
               run_trace: str | None) -> Iterator[None]:
    with tracer().start_as_current_span(
            "layby.answer", links=links_to(run_trace),
            attributes={"layby.run.id": run_id, "layby.answer.channel": channel,
                        "layby.interrupt.ids": interrupt_ids}):
        yield
