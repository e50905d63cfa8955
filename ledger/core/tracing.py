"""OpenTelemetry, when it is installed: the only place the ledger imports it.

The ledger never installs a tracer provider; it asks the global one for its tracer, so
spans go wherever the application sends them, and nowhere when it configured nothing.
Without the `opentelemetry-api` package every function here answers None and the
commands run exactly as they do untraced.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

try:
    from opentelemetry import trace as _trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # pragma: no cover - the traces extra is not installed
    _trace = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from opentelemetry.trace import SpanContext, Tracer

TRACER_NAME = "ledger"


def tracer() -> Tracer | None:
    """The ledger's tracer from the global provider; None when OpenTelemetry is absent."""
    if _trace is None:
        return None
    return _trace.get_tracer(TRACER_NAME)


def current_traceparent() -> str | None:
    """The W3C `traceparent` of the current span, None when there is no valid one."""
    if _trace is None:
        return None
    if not _trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: dict[str, Any] = {}
    TraceContextTextMapPropagator().inject(carrier)
    value = carrier.get("traceparent")
    return value if isinstance(value, str) else None


def span_context_of(traceparent: str) -> SpanContext | None:
    """The span context a stored `traceparent` names; None when it is not a valid one."""
    if _trace is None:
        return None
    ctx = TraceContextTextMapPropagator().extract({"traceparent": traceparent})
    sc = _trace.get_current_span(ctx).get_span_context()
    return sc if sc.is_valid else None
