"""OpenTelemetry traces of jobs (the ``otel`` extra; docs/tracing.md): an
enqueue is a PRODUCER span whose W3C trace context travels in the job's
``headers``, and each handler run is a CONSUMER span whose parent is that
producer span.

This is the only module that imports opentelemetry, and it never imports it
first: tracing is on once the application has loaded ``opentelemetry.trace``
and set a real global TracerProvider (the SDK's, say). Until then every entry
point returns after one dictionary lookup, so pyalk without the extra imports
nothing and pays nothing.
"""

from __future__ import annotations

import sys
from types import TracebackType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, Tracer

    from pyalk.values import Job

#: The W3C trace context keys pyalk reads and writes in a job's headers. Any
#: producer (Node, psql) that sets them makes its span the consumer's parent.
TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
#: ``messaging.system`` of every pyalk span.
SYSTEM = "pyalk"

_TRACE_MODULE = "opentelemetry.trace"


class _Otel:
    """The opentelemetry names pyalk uses, bound once the application has
    loaded ``opentelemetry.trace``, and the tracer of the current provider."""

    def __init__(self) -> None:
        from opentelemetry import context, trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
        from opentelemetry.trace.status import Status, StatusCode

        self.context = context
        self.trace = trace
        self.Status = Status
        self.ERROR = StatusCode.ERROR
        self.PRODUCER = trace.SpanKind.PRODUCER
        self.CONSUMER = trace.SpanKind.CONSUMER
        # W3C only, whatever the global propagator: the header keys are a
        # contract with producers in other languages.
        self.propagator = TraceContextTextMapPropagator()
        self._unset = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)
        self._cached: tuple[object, Tracer | None] = (None, None)

    def tracer(self) -> Tracer | None:
        """pyalk's tracer from the global provider; None while none is set."""
        provider = self.trace.get_tracer_provider()
        cached_provider, tracer = self._cached
        if provider is not cached_provider:
            tracer = None if isinstance(provider, self._unset) else provider.get_tracer("pyalk")
            self._cached = (provider, tracer)  # one tuple: a racing thread sees a matching pair
        return tracer


_otel: _Otel | None = None


def _tracer() -> tuple[_Otel, Tracer] | None:
    """The bindings and the tracer when tracing is on, else None (cheaply)."""
    global _otel
    otel = _otel
    if otel is None:
        if _TRACE_MODULE not in sys.modules:
            return None
        otel = _otel = _Otel()
    tracer = otel.tracer()
    return None if tracer is None else (otel, tracer)


def _fail(otel: _Otel, span: Span, error: BaseException) -> None:
    span.record_exception(error)
    span.set_status(otel.Status(otel.ERROR, f"{type(error).__name__}: {error}"))


class Enqueue:
    """The PRODUCER span of one enqueue call, a context manager (no span
    while tracing is off). :attr:`headers` are the caller's headers with the
    span's trace context added under the keys the caller did not set: a
    caller's own ``traceparent`` or ``tracestate`` is kept as given."""

    __slots__ = ("_otel", "_span", "_token", "headers")

    def __init__(self, queue: str, headers: dict[str, Any] | None, count: int | None = None) -> None:
        """``count``: the batch size of an enqueue_batch, None for one job."""
        self.headers = headers
        self._span: Span | None = None
        on = _tracer()
        if on is None:
            return
        otel, tracer = on
        attributes: dict[str, str | int] = {
            "messaging.system": SYSTEM,
            "messaging.operation.type": "send",
            "messaging.operation.name": "enqueue",
            "messaging.destination.name": queue,
        }
        if count is not None:
            attributes["messaging.batch.message_count"] = count
        span = tracer.start_span(f"enqueue {queue}", kind=otel.PRODUCER, attributes=attributes)
        self._otel, self._span = otel, span
        if headers is None or isinstance(headers, dict):  # anything else is the database's LK002
            carrier: dict[str, str] = {}
            otel.propagator.inject(carrier, otel.trace.set_span_in_context(span))
            if carrier:  # empty when the span is not recording (a disabled SDK)
                self.headers = {**carrier, **headers} if headers else carrier

    def __enter__(self) -> Enqueue:
        span = self._span
        if span is not None:  # current during the call: a database client's spans nest in it
            self._token = self._otel.context.attach(self._otel.trace.set_span_in_context(span))
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        span = self._span
        if span is None:
            return
        self._otel.context.detach(self._token)
        if error is not None:
            _fail(self._otel, span, error)
        span.end()

    def enqueued(self, job_id: int) -> None:
        """The id of the one job enqueued (``messaging.message.id``)."""
        if self._span is not None:
            self._span.set_attribute("messaging.message.id", str(job_id))


def _parent(headers: dict[str, Any] | None, otel: _Otel) -> Context:
    """The producer's context from a job's headers (an empty context, so a
    root span, when they carry none or a malformed one)."""
    carrier: dict[str, str] = {}
    if isinstance(headers, dict):
        for key in (TRACEPARENT, TRACESTATE):
            value = headers.get(key)
            if isinstance(value, str):
                carrier[key] = value
    return otel.propagator.extract(carrier, otel.context.Context())


class Process:
    """The CONSUMER span of one handler run, current while the handler runs
    (its own spans nest in it); its parent is the producer's span."""

    __slots__ = ("_otel", "_span", "_token")

    def __init__(self, otel: _Otel, tracer: Tracer, job: Job) -> None:
        self._otel = otel
        self._span = span = tracer.start_span(
            f"process {job.queue}",
            context=_parent(job.headers, otel),
            kind=otel.CONSUMER,
            attributes={
                "messaging.system": SYSTEM,
                "messaging.operation.type": "process",
                "messaging.operation.name": "process",
                "messaging.destination.name": job.queue,
                "messaging.message.id": str(job.id),
                "messaging.client.id": job.worker_id or "",
                "pyalk.job.attempt": job.attempts,
            },
        )
        self._token = otel.context.attach(otel.trace.set_span_in_context(span))

    def end(self, error: BaseException | None) -> None:
        """The handler returned (``error`` None) or raised ``error``; called
        on the thread or task that started the span."""
        otel, span = self._otel, self._span
        otel.context.detach(self._token)
        if error is not None:
            _fail(otel, span, error)
        span.end()


def process(job: Job) -> Process | None:
    """Start the consumer span of ``job``'s handler run; None while tracing is off."""
    on = _tracer()
    return None if on is None else Process(on[0], on[1], job)
