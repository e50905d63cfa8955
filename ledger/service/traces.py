"""A span per command, when OpenTelemetry is installed (ledger/core/tracing.py).

`traced(store, name, arguments, run)` runs `run()` inside a span `ledger <name>`, a child
of the caller's current span. Its attributes: `ledger.run.id` (and OpenTelemetry's
CI/CD `cicd.pipeline.run.id`, the same run id), `ledger.item.id` for a command on one
item, `ledger.item.count` for a command on several; a refusal or fault sets the span's
status to error with `error.type` (the exception's class) and records the exception. A
worker's claim and outcome spans link to the span that submitted the run: its
traceparent is stored on the run's first event. Nothing is read for the spans unless
the span is recorded (a tracer provider is installed and samples it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

from eventsourcing.persistence import StoredEvent

from ledger.core import tracing
from ledger.core.domain import Run, run_stream_id
from ledger.stores.raw import stream_event_at

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from ledger.stores.base import Store

T = TypeVar("T")

RUN_ID = "ledger.run.id"
ITEM_ID = "ledger.item.id"
ITEM_COUNT = "ledger.item.count"
CICD_RUN_ID = "cicd.pipeline.run.id"
ERROR_TYPE = "error.type"

# the commands a worker makes on items: their spans link to the run's submitting span
_LINKED = frozenset({"claim", "heartbeat", "accept", "reject", "fail_attempt", "record"})


def traced(store: Store, name: str, arguments: dict[str, Any], run: Callable[[], T]) -> T:
    """`run()` inside the command's span; just `run()` without OpenTelemetry."""
    tracer = tracing.tracer()
    if tracer is None:
        return run()
    with tracer.start_as_current_span(f"ledger {name}") as span:
        recording = span.is_recording()
        if recording:
            _set_attributes(span, _before(arguments))
        try:
            result = run()
        except Exception as e:
            if recording:
                span.set_attribute(ERROR_TYPE, type(e).__qualname__)
            raise  # the span records the exception and sets its status on the way out
        if recording:
            _set_attributes(span, _after(name, arguments, result))
            if name in _LINKED:
                for run_id in _run_ids(arguments):
                    _link_submitter(store, span, run_id)
        return result


def _set_attributes(span: Span, attributes: dict[str, Any]) -> None:
    for key, value in attributes.items():
        span.set_attribute(key, value)
        if key == RUN_ID:
            span.set_attribute(CICD_RUN_ID, value)


def _before(arguments: dict[str, Any]) -> dict[str, Any]:
    """What the arguments tell: the run, and the item for a command on one item."""
    out: dict[str, Any] = {}
    lease = arguments.get("lease")
    if lease is not None:
        out[RUN_ID] = lease.run_id
        out[ITEM_ID] = lease.item_id
    if isinstance(arguments.get("run_id"), str):
        out[RUN_ID] = arguments["run_id"]
    if isinstance(arguments.get("item_id"), str):
        out[ITEM_ID] = arguments["item_id"]
    outcomes = arguments.get("outcomes")
    if outcomes is not None:
        out[ITEM_COUNT] = len(outcomes)
        runs = {o.lease.run_id for o in outcomes}
        if len(runs) == 1:
            out[RUN_ID] = runs.pop()
    return out


def _after(name: str, arguments: dict[str, Any], result: Any) -> dict[str, Any]:
    """What the answer tells: the run a command created, the items a claim leased."""
    out: dict[str, Any] = {}
    if name == "claim" and isinstance(result, list):
        out[ITEM_COUNT] = len(result)
    run_id = getattr(result, "run_id", None)
    if isinstance(run_id, str) and "run_id" not in arguments:
        out[RUN_ID] = run_id
    return out


def _run_ids(arguments: dict[str, Any]) -> Iterable[str]:
    if isinstance(arguments.get("run_id"), str):
        return [arguments["run_id"]]
    lease = arguments.get("lease")
    if lease is not None:
        return [lease.run_id]
    return sorted({o.lease.run_id for o in arguments.get("outcomes") or ()})


def _link_submitter(store: Store, span: Span, run_id: str) -> None:
    """Link the span to the span that submitted `run_id`, when that one was traced."""
    traceparent = submitted_traceparent(store, run_id)
    context = None if traceparent is None else tracing.span_context_of(traceparent)
    if context is not None:
        span.add_link(context, {RUN_ID: run_id})


def submitted_traceparent(store: Store, run_id: str) -> str | None:
    """The traceparent stored with the run when it was created (None when untraced,
    unknown or archived)."""
    try:
        stream = run_stream_id(run_id)
    except ValueError:
        return None
    with store.read() as tx:
        raw = stream_event_at(tx, stream, 1)
    if raw is None:
        return None
    event = store.decode(StoredEvent(stream, raw.version, raw.topic, raw.state))
    if not isinstance(event, Run.Submitted):
        return None
    return event.traceparent
