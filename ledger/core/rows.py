"""Conversions between aggregates and projection rows.

The run and item rows are the aggregates' current state (a snapshot projection):
loading one gives back the aggregate at its last version without a replay.
"""

from __future__ import annotations

import json
from datetime import UTC as UTC_TZ
from datetime import datetime
from typing import Any, cast
from uuid import UUID

from ledger.core.domain import Item, Run, item_stream_id
from ledger.core.states import ITEM_STATES, TERMINAL_RUN_STATES


def iso(dt: datetime | None) -> str | None:
    """Fixed-width UTC ISO text, so text comparison orders times correctly.

    A command stamps all its rows with one time object, asked for here several times
    per item: the last one's text is kept (the pair is replaced whole, so a thread
    reads either the old pair or the new one; it holds its time, whose identity
    cannot then pass to another object)."""
    if dt is None:
        return None
    last = _last_iso
    if last[0] is dt:
        return last[1]
    text = dt.astimezone(UTC_TZ).isoformat(timespec="microseconds")
    _remember_iso((dt, text))
    return text


_last_iso: tuple[datetime | None, str | None] = (None, None)


def _remember_iso(pair: tuple[datetime, str]) -> None:
    global _last_iso
    _last_iso = pair


def parse_dt(text: str | None) -> datetime | None:
    """Inverse of `iso`."""
    return None if text is None else datetime.fromisoformat(text)


def _not_json(o: Any) -> Any:
    raise TypeError(f"Object of type {type(o).__name__} is not JSON serializable")


# json.dumps with these arguments builds a JSONEncoder and then its C encoder on every
# call: a third of its time for the small values of a projection row (measured in an
# import's profile). The C encoder built once writes the very same text (no circular
# check: a projection value is never circular; tests/projections/test_rows_json.py compares them).
_C_ENCODER = getattr(json.encoder, "c_make_encoder", None)
_ENCODE = (
    _C_ENCODER(None, _not_json, json.encoder.encode_basestring, None, ":", ",", True, False, True)
    if _C_ENCODER is not None
    else None
)


def dumps(value: Any) -> str:
    """Deterministic JSON for projection columns (keys sorted, compact, not ASCII-escaped)."""
    if _ENCODE is None:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "".join(_ENCODE(value, 0))


RUN_COLUMNS = (
    "run_id",
    "seq",
    "state",
    "revision",
    "source_version",
    "config_version",
    "scope",
    "created_by",
    "created_at",
    "started_at",
    "stopped_at",
    "updated_at",
    "failure_kind",
    "failure_reason",
    "stop_reason",
    "summary",
    "input_version",
    "policy",
    "review",
    "cancel_requested",
    "links",
    "root_run_id",
    "counts",
    "item_count",
)


def run_to_row(run: Run) -> tuple[Any, ...]:
    """The run's projection row, in RUN_COLUMNS order."""
    return (
        run.run_id,
        run.seq,
        run.state,
        run.version,
        run.source_version,
        run.config_version,
        run.scope,
        run.created_by,
        iso(run.created_on),
        iso(run.started_at),
        iso(run.stopped_at),
        iso(run.modified_on),
        run.failure_kind,
        run.failure_reason,
        run.stop_reason,
        run.summary,
        run.input_version,
        dumps(run.policy),
        None if run.review is None else dumps(run.review),
        int(run.cancel_requested),
        dumps(run.links),
        run.root_run_id,
        # an open run's counts are in lg_run_counts (ledger/projections/counts.py); an ended run's here
        dumps(run.counts) if run.state in TERMINAL_RUN_STATES else "{}",
        run.item_count,
    )


def _shell(
    cls: type[Any], stream_id: UUID, version: int, created: datetime, modified: datetime
) -> Any:
    agg = cast(Any, cls).__new__(cls)
    agg.__base_init__(originator_id=stream_id, originator_version=version, timestamp=created)
    agg._modified_on = modified
    return agg


def run_from_row(row: dict[str, Any]) -> Run:
    """Rebuild the Run aggregate from its projection row. Its `counts` are the row's column:
    an open run's true counts add its lg_run_counts rows (ledger/projections/counts.py `attach`)."""
    created = parse_dt(row["created_at"])
    modified = parse_dt(row["updated_at"])
    assert created is not None and modified is not None
    run: Run = _shell(Run, UUID(row["run_id"]), row["revision"], created, modified)
    run.run_id = row["run_id"]
    run.seq = row["seq"]
    run.state = row["state"]
    run.source_version = row["source_version"]
    run.config_version = row["config_version"]
    run.scope = row["scope"]
    run.policy = json.loads(row["policy"])
    run.input_version = row["input_version"]
    run.created_by = row["created_by"]
    run.links = json.loads(row["links"])
    run.root_run_id = row["root_run_id"]
    run.started_at = parse_dt(row["started_at"])
    run.stopped_at = parse_dt(row["stopped_at"])
    run.stop_reason = row["stop_reason"]
    run.failure_kind = row["failure_kind"]
    run.failure_reason = row["failure_reason"]
    run.summary = row["summary"]
    run.review = None if row["review"] is None else json.loads(row["review"])
    run.cancel_requested = bool(row["cancel_requested"])
    counts = json.loads(row["counts"])
    run.counts = {s: int(counts.get(s, 0)) for s in ITEM_STATES}
    run.item_count = row["item_count"]
    return run


ITEM_STREAM_COLUMNS = (
    "state",
    "revision",
    "attempts",
    "lease_token",
    "lease_worker",
    "lease_expires_at",
    "eligible_at",
    "last_error",
    "reason",
    "updated_at",
    "lease_started_at",
)


def item_stream_values(item: Item) -> tuple[Any, ...]:
    """The item-stream part of an item row, in ITEM_STREAM_COLUMNS order."""
    return (
        item.state,
        item.version,
        item.attempts,
        item.lease_token,
        item.lease_worker,
        item.lease_expires_at,
        item.eligible_at,
        item.last_error,
        item.reason,
        iso(item.modified_on),
        iso(item.lease_started_on),
    )


def item_from_row(row: dict[str, Any]) -> Item | None:
    """The Item aggregate of a row, or None while its stream has not begun."""
    if row["revision"] == 0:
        return None
    modified = parse_dt(row["updated_at"])
    assert modified is not None
    item: Item = _shell(
        Item, item_stream_id(row["run_id"], row["item_id"]), row["revision"], modified, modified
    )
    item.run_id = row["run_id"]
    item.item_id = row["item_id"]
    item.state = row["state"]
    item.attempts = row["attempts"]
    item.lease_token = row["lease_token"]
    item.lease_worker = row["lease_worker"]
    item.lease_expires_at = row["lease_expires_at"]
    item.lease_started_on = parse_dt(row["lease_started_at"])
    item.ended_leases = {}
    item.eligible_at = row["eligible_at"]
    item.last_error = row["last_error"]
    item.reason = row["reason"]
    return item
