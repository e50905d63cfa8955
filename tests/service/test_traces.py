"""Traces: a span per command, a child of the caller's span, with the run's attributes;
the run keeps the submitting trace context and the workers' spans link to it.

The recording tracer provider here is built on the OpenTelemetry API's abstract classes
only (the ledger depends on the API, never on an SDK)."""

from __future__ import annotations

import contextlib
import json
import random
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pytest
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import (
    INVALID_SPAN,
    Link,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
)

from ledger import Ledger
from ledger.core import tracing
from ledger.core.domain import run_stream_id
from ledger.core.errors import LedgerError
from ledger.service.traces import submitted_traceparent
from ledger.stores.raw import stream_event_at
from tests.support.runs import CONTROLLER, SUBMITTER, WORKER, manifest, running


class RecordedSpan(Span):
    """A span that keeps what it was told."""

    def __init__(
        self, name: str, context: SpanContext, parent: SpanContext | None, links: Sequence[Link]
    ) -> None:
        self.name = name
        self.context = context
        self.parent = parent
        self.links: list[Link] = list(links)
        self.attributes: dict[str, Any] = {}
        self.status = Status(StatusCode.UNSET)
        self.exceptions: list[BaseException] = []
        self.ended = False

    def end(self, end_time: int | None = None) -> None:
        self.ended = True

    def get_span_context(self) -> SpanContext:
        return self.context

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        self.attributes.update(attributes)

    def set_attribute(self, key: str, value: Any) -> None:
        self.attributes[key] = value

    def add_event(self, name: str, attributes: Any = None, timestamp: int | None = None) -> None:
        pass

    def add_link(self, context: SpanContext, attributes: Any = None) -> None:
        self.links.append(Link(context, attributes))

    def update_name(self, name: str) -> None:
        self.name = name

    def is_recording(self) -> bool:
        return not self.ended

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        self.status = status if isinstance(status, Status) else Status(status, description)

    def record_exception(
        self,
        exception: BaseException,
        attributes: Any = None,
        timestamp: int | None = None,
        escaped: bool = False,
    ) -> None:
        self.exceptions.append(exception)


class RecordingTracer(trace.Tracer):
    def __init__(self, provider: RecordingProvider) -> None:
        self.provider = provider

    def start_span(
        self,
        name: str,
        context: otel_context.Context | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: Any = None,
        links: Sequence[Link] | None = None,
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
    ) -> Span:
        if not self.provider.active:
            return INVALID_SPAN
        parent = trace.get_current_span(context).get_span_context()
        trace_id = parent.trace_id if parent.is_valid else random.getrandbits(128)
        ctx = SpanContext(trace_id, random.getrandbits(64), False, TraceFlags(TraceFlags.SAMPLED))
        span = RecordedSpan(name, ctx, parent if parent.is_valid else None, links or ())
        if attributes:
            span.set_attributes(attributes)
        self.provider.spans.append(span)
        return span

    @contextlib.contextmanager
    def start_as_current_span(
        self,
        name: str,
        context: otel_context.Context | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: Any = None,
        links: Sequence[Link] | None = None,
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
        end_on_exit: bool = True,
    ) -> Iterator[Span]:
        span = self.start_span(name, context, kind, attributes, links)
        with trace.use_span(
            span,
            end_on_exit=end_on_exit,
            record_exception=record_exception,
            set_status_on_exception=set_status_on_exception,
        ) as current:
            yield current


class RecordingProvider(trace.TracerProvider):
    """Records spans only while a test has it `active` (it is the process's global
    provider, set once; other tests see non-recording spans)."""

    def __init__(self) -> None:
        self.active = False
        self.spans: list[RecordedSpan] = []

    def get_tracer(self, *args: Any, **kwargs: Any) -> trace.Tracer:
        return RecordingTracer(self)

    def named(self, name: str) -> list[RecordedSpan]:
        return [s for s in self.spans if s.name == name]


_PROVIDER = RecordingProvider()
trace.set_tracer_provider(_PROVIDER)


@pytest.fixture
def spans() -> Iterator[RecordingProvider]:
    if trace.get_tracer_provider() is not _PROVIDER:
        pytest.skip("another tracer provider is installed in this process")
    _PROVIDER.spans.clear()
    _PROVIDER.active = True
    try:
        yield _PROVIDER
    finally:
        _PROVIDER.active = False
        _PROVIDER.spans.clear()


def _caller() -> Any:
    return trace.get_tracer("the-service").start_as_current_span("POST /orders")


def test_each_command_is_a_child_span_named_for_it_with_the_run_and_items(
    lg: Ledger, spans: RecordingProvider
) -> None:
    with _caller() as request:
        run_id = lg.submit(manifest(2), SUBMITTER).run_id
        lg.start(run_id, CONTROLLER)
        leases = lg.claim(run_id, WORKER, limit=2)
        lg.accept(leases[0])
    parent = request.get_span_context()

    (submit,) = spans.named("ledger submit")
    (start,) = spans.named("ledger start")
    (claim,) = spans.named("ledger claim")
    (accept,) = spans.named("ledger accept")
    for span in (submit, start, claim, accept):
        assert span.parent == parent
        assert span.context.trace_id == parent.trace_id
        assert span.attributes["ledger.run.id"] == run_id
        assert span.attributes["cicd.pipeline.run.id"] == run_id
        assert span.status.status_code is StatusCode.UNSET
    assert claim.attributes["ledger.item.count"] == 2
    assert accept.attributes["ledger.item.id"] == leases[0].item_id
    assert "ledger.item.id" not in submit.attributes


def test_a_refused_command_sets_the_error_status_and_records_the_exception(
    lg: Ledger, spans: RecordingProvider
) -> None:
    run_id = running(lg)
    with pytest.raises(LedgerError) as refused:
        lg.start(run_id, CONTROLLER)  # already running
    first, span = spans.named("ledger start")
    assert first.status.status_code is StatusCode.UNSET
    assert span.status.status_code is StatusCode.ERROR
    assert span.attributes["error.type"] == type(refused.value).__qualname__
    assert span.exceptions == [refused.value]
    assert span.attributes["ledger.run.id"] == run_id


def test_a_workers_claim_and_outcome_spans_link_to_the_submitting_span(
    dsn: str, spans: RecordingProvider
) -> None:
    with Ledger.open(dsn) as service:
        with _caller():
            run_id = service.submit(manifest(2), SUBMITTER).run_id
        service.start(run_id, CONTROLLER)
    (submit,) = spans.named("ledger submit")

    # later, elsewhere: a worker on its own connection, in a trace of its own
    with Ledger.open(dsn) as worker, _caller() as job:
        leases = worker.claim(run_id, WORKER, limit=2)
        worker.accept(leases[0])
        worker.fail_attempt(leases[1], "boom")
    for name in ("ledger claim", "ledger accept", "ledger fail_attempt"):
        (span,) = spans.named(name)
        assert span.context.trace_id == job.get_span_context().trace_id != submit.context.trace_id
        linked = [(link.context.trace_id, link.context.span_id) for link in span.links]
        assert linked == [(submit.context.trace_id, submit.context.span_id)], name


def test_the_submitting_trace_is_stored_with_the_run(dsn: str, spans: RecordingProvider) -> None:
    with Ledger.open(dsn) as lg:
        run_id = lg.submit(manifest(1), SUBMITTER).run_id
        (submit,) = spans.named("ledger submit")
        traceparent = submitted_traceparent(lg.store, run_id)
    assert traceparent is not None
    assert tracing.span_context_of(traceparent) == SpanContext(
        submit.context.trace_id, submit.context.span_id, True, TraceFlags(TraceFlags.SAMPLED)
    )


def test_untraced_runs_keep_the_submit_events_shape(lg: Ledger) -> None:
    run_id = lg.submit(manifest(1), SUBMITTER).run_id
    assert submitted_traceparent(lg.store, run_id) is None
    with lg.store.read() as tx:
        raw = stream_event_at(tx, run_stream_id(run_id), 1)
    assert raw is not None
    assert "traceparent" not in json.loads(raw.state)


def test_without_opentelemetry_the_ledger_runs_unchanged(
    lg: Ledger, spans: RecordingProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tracing, "_trace", None)
    with _caller():
        run_id = running(lg)
        (lease,) = lg.claim(run_id, WORKER)
        lg.accept(lease)
    assert [s.name for s in spans.spans] == ["POST /orders"]
    assert submitted_traceparent(lg.store, run_id) is None


def test_async_calls_are_children_of_the_callers_span_in_its_task(
    store_dsn: str, spans: RecordingProvider
) -> None:
    """AsyncLedger runs the ledger's code in a copy of the calling task's context: each
    task's commands are children of that task's own span, also when tasks interleave."""
    import asyncio

    from ledger import AsyncLedger

    async def main() -> dict[str, Any]:
        async with await AsyncLedger.open(store_dsn) as lg:

            async def request(k: int) -> tuple[str, SpanContext]:
                with trace.get_tracer("svc").start_as_current_span(f"POST /orders/{k}") as span:
                    run_id = (await lg.submit(manifest(1), SUBMITTER)).run_id
                    await lg.start(run_id, CONTROLLER)
                    return run_id, span.get_span_context()

            return dict(await asyncio.gather(*(request(k) for k in range(5))))

    parents = asyncio.run(main())
    for name in ("ledger submit", "ledger start"):
        found = spans.named(name)
        assert len(found) == 5
        for span in found:
            assert span.parent == parents[span.attributes["ledger.run.id"]], name
