"""Tracing (pyalk/tracing.py, docs/tracing.md) with the real OpenTelemetry
SDK: an enqueue is a PRODUCER span whose W3C context travels in the job's
headers, and a real worker's handler run is a CONSUMER span whose parent is
that span; a raising handler's span is an error; the caller's headers
survive; with no TracerProvider set nothing is added."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import psycopg
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from opentelemetry.util._once import Once

from pyalk import AsyncAlk, AsyncJobHandle, QueueOpts, Snooze
from pyalk.tasks import Tasks

#: A producer in another language: its span's id is what the consumer's parent must be.
FOREIGN_TRACE = "0af7651916cd43dd8448eb211c80319c"
FOREIGN_SPAN = "b7ad6b7169203331"
FOREIGN_PARENT = f"00-{FOREIGN_TRACE}-{FOREIGN_SPAN}-01"


@pytest.fixture
async def alk(dsn: str) -> AsyncIterator[AsyncAlk]:
    async with AsyncAlk(dsn) as client:
        yield client


def _unset_provider() -> None:
    # The SDK lets a process set its global provider once; its own test
    # utilities reset these two globals the same way.
    trace._TRACER_PROVIDER_SET_ONCE = Once()  # type: ignore[attr-defined]
    trace._TRACER_PROVIDER = None  # type: ignore[attr-defined]


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """A real SDK provider set globally for the test (tracing on), unset after."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    _unset_provider()
    trace.set_tracer_provider(provider)
    try:
        yield exporter
    finally:
        _unset_provider()
        provider.shutdown()


def of_kind(exporter: InMemorySpanExporter, kind: SpanKind) -> list[ReadableSpan]:
    return [span for span in exporter.get_finished_spans() if span.kind is kind]


def parent_of(span: ReadableSpan) -> tuple[int, int]:
    assert span.parent is not None, f"{span.name} has no parent"
    return span.parent.trace_id, span.parent.span_id


def ids_of(span: ReadableSpan) -> tuple[int, int]:
    return span.context.trace_id, span.context.span_id


async def test_a_handler_run_is_a_child_span_of_its_enqueue_and_caller_headers_survive(alk, spans):
    seen: list[tuple[dict[str, Any] | None, int]] = []

    async def handler(job: AsyncJobHandle) -> None:
        # The consumer span is current while the handler runs.
        seen.append((job.job.headers, trace.get_current_span().get_span_context().span_id))

    job_id = await alk.queue("q").enqueue({"n": 1}, headers={"tenant": "acme"})
    counts = await alk.worker("q", handler, burst=True, handle_signals=False).run()
    assert counts.acked == 1

    [producer] = of_kind(spans, SpanKind.PRODUCER)
    [consumer] = of_kind(spans, SpanKind.CONSUMER)
    assert (producer.name, consumer.name) == ("enqueue q", "process q")
    assert parent_of(consumer) == ids_of(producer)
    assert dict(producer.attributes or {}) == {
        "messaging.system": "pyalk",
        "messaging.operation.type": "send",
        "messaging.operation.name": "enqueue",
        "messaging.destination.name": "q",
        "messaging.message.id": str(job_id),
    }
    attributes = dict(consumer.attributes or {})
    assert attributes.pop("messaging.client.id")  # the worker's id
    assert attributes == {
        "messaging.system": "pyalk",
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": "q",
        "messaging.message.id": str(job_id),
        "pyalk.job.attempt": 1,
    }
    assert consumer.status.status_code is StatusCode.UNSET
    [(headers, current)] = seen
    assert current == consumer.context.span_id
    assert headers is not None
    assert headers["tenant"] == "acme"
    context = producer.context
    assert headers["traceparent"] == f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"


async def test_a_caller_s_traceparent_is_kept_and_parents_the_handler_run(alk, db, spans):
    await alk.queue("q").enqueue(1, headers={"traceparent": FOREIGN_PARENT, "tracestate": "vendor=1"})
    # A producer in another language writes the key itself.
    db.execute("SELECT alk.enqueue('q', '2', headers => %s::jsonb)", [f'{{"traceparent": "{FOREIGN_PARENT}"}}'])
    stored: list[dict[str, Any] | None] = []

    async def handler(job: AsyncJobHandle) -> None:
        stored.append(job.job.headers)

    await alk.worker("q", handler, burst=True, handle_signals=False).run()
    assert stored == [{"traceparent": FOREIGN_PARENT, "tracestate": "vendor=1"}, {"traceparent": FOREIGN_PARENT}]
    consumers = of_kind(spans, SpanKind.CONSUMER)
    assert [parent_of(span) for span in consumers] == [(int(FOREIGN_TRACE, 16), int(FOREIGN_SPAN, 16))] * 2
    assert consumers[0].context.trace_state.get("vendor") == "1"


async def test_a_raising_handler_gives_an_error_span_and_a_snooze_does_not(alk, spans):
    async def handler(job: AsyncJobHandle) -> None:
        if job.payload == "boom":
            raise ValueError("boom")

    await alk.queue("q", QueueOpts(max_attempts=1)).enqueue("boom")
    await alk.worker("q", handler, burst=True, handle_signals=False).run()
    [consumer] = of_kind(spans, SpanKind.CONSUMER)
    assert consumer.status.status_code is StatusCode.ERROR
    assert consumer.status.description == "ValueError: boom"
    [event] = consumer.events
    assert event.name == "exception"
    assert (event.attributes or {})["exception.type"] == "ValueError"

    spans.clear()
    snoozed: list[int] = []

    async def snoozer(job: AsyncJobHandle) -> None:
        if not snoozed:
            snoozed.append(job.id)
            raise Snooze(0)

    await alk.queue("q").enqueue("later")
    await alk.worker("q", snoozer, burst=True, handle_signals=False).run()
    statuses = [span.status.status_code for span in of_kind(spans, SpanKind.CONSUMER)]
    assert statuses == [StatusCode.UNSET, StatusCode.UNSET]


async def test_a_batch_is_one_producer_span_that_parents_every_job(alk, spans):
    await alk.queue("q").enqueue_batch([1, 2, 3], headers={"tenant": "acme"})
    tenants: list[str] = []

    async def handler(job: AsyncJobHandle) -> None:
        tenants.append(job.job.headers["tenant"])

    await alk.worker("q", handler, burst=True, handle_signals=False).run()
    [producer] = of_kind(spans, SpanKind.PRODUCER)
    assert (producer.attributes or {})["messaging.batch.message_count"] == 3
    consumers = of_kind(spans, SpanKind.CONSUMER)
    assert [parent_of(span) for span in consumers] == [ids_of(producer)] * 3
    assert tenants == ["acme"] * 3


async def test_a_deferred_task_is_traced_like_an_enqueue(alk, spans):
    @Tasks(queue="q").task
    def add(a: int, b: int) -> int:
        return a + b

    job_id = (await add.defer_async(alk, a=1, b=2)).id  # defer returns the job's handle
    [producer] = of_kind(spans, SpanKind.PRODUCER)
    assert (producer.attributes or {})["messaging.message.id"] == str(job_id)
    job = await alk.queue("q").get_job(job_id)
    assert job is not None and job.headers is not None and "traceparent" in job.headers


async def test_without_a_tracer_provider_nothing_is_added(alk, db: psycopg.Connection):
    # opentelemetry is imported (this module did), but no provider is set.
    job_id = await alk.queue("q").enqueue(1)
    batch = await alk.queue("q").enqueue_batch([2], headers={"tenant": "acme"})
    rows = db.execute("SELECT id, headers FROM alk.list_jobs('q') ORDER BY id").fetchall()
    assert rows == [(job_id, None), (batch[0], {"tenant": "acme"})]
