"""`Ledger.audit(...)`: exact filters (against a brute-force filter over every run's
history), keyset paging in both directions, and index use for filtered queries."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledger import Ledger, Transition
from ledger.service.ledger import Outcome
from tests.projections.test_rebuild import PROGRAM, Program
from tests.support.clock import ManualClock
from tests.support.runs import CONTROLLER, OPERATOR, REVIEWER, SUBMITTER, WORKER, manifest

ACTORS = ["sam", "ctl", "w1", "w2", "olga", "rita", "rec", "ledger", "nobody"]
ROLES = ["submitter", "controller", "worker", "reviewer", "operator", "reconciler"]
STATES = [
    "queued",
    "running",
    "paused",
    "pausing",
    "canceled",
    "canceling",
    "failed",
    "succeeded",
    "completed_with_errors",
    "awaiting_review",
    "pending",
    "in_progress",
    "retryable",
    "quarantined",
    "accepted",
    "rejected",
    "skipped",
]


def everything(lg: Ledger) -> list[Transition]:
    """Every transition, from each run's history (the brute-force source)."""
    out = [t for r in lg.runs(limit=10_000) for t in lg.history(r.run_id)]
    return sorted(out, key=lambda t: t.position)


def brute(all_: list[Transition], f: dict[str, Any]) -> list[Transition]:
    out = [
        t
        for t in all_
        if (f.get("run_id") is None or t.run_id == f["run_id"])
        and (f.get("actor") is None or t.actor_id == f["actor"])
        and (f.get("role") is None or t.role == f["role"])
        and (f.get("state") is None or t.to_state == f["state"])
        and (f.get("since") is None or t.at >= f["since"])
        and (f.get("until") is None or t.at <= f["until"])
    ]
    return out[::-1] if f.get("newest_first") else out


FILTER = st.fixed_dictionaries(
    {
        "run": st.one_of(st.none(), st.integers(0, 20)),
        "actor": st.one_of(st.none(), st.sampled_from(ACTORS)),
        "role": st.one_of(st.none(), st.sampled_from(ROLES)),
        "state": st.one_of(st.none(), st.sampled_from(STATES)),
        "since": st.one_of(st.none(), st.integers(0, 400)),
        "until": st.one_of(st.none(), st.integers(0, 400)),
        "newest_first": st.booleans(),
        "page_size": st.sampled_from([1, 2, 5, 1000]),
    }
)


@settings(
    max_examples=6,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=PROGRAM, filters=st.lists(FILTER, min_size=8, max_size=8))
def test_audit_filters_exactly_like_brute_force(
    lg: Ledger, clock: ManualClock, ops: list[tuple[Any, ...]], filters: list[dict[str, Any]]
) -> None:
    start = clock()
    Program(lg, clock).run([("submit", 2, 0), ("start", 0), ("claim", 0), ("advance", 30), *ops])
    all_ = everything(lg)
    runs = sorted({t.run_id for t in all_})
    assert all_ == list(lg.audit())
    for raw in filters:
        f: dict[str, Any] = {
            "run_id": None if raw["run"] is None else runs[raw["run"] % len(runs)],
            "actor": raw["actor"],
            "role": raw["role"],
            "state": raw["state"],
            "since": None if raw["since"] is None else start + timedelta(seconds=raw["since"]),
            "until": None if raw["until"] is None else start + timedelta(seconds=raw["until"]),
            "newest_first": raw["newest_first"],
        }
        assert list(lg.audit(**f, page_size=raw["page_size"])) == brute(all_, f), f


def test_keyset_paging_in_both_directions(lg: Ledger, clock: ManualClock) -> None:
    Program(lg, clock).run(
        [
            ("submit", 4, 0),
            ("start", 0),
            ("claim", 0),
            ("claim", 0),
            ("accept", 0),
            ("advance", 30),
            ("fail", 1),
            ("submit", 3, 2),
            ("start", 1),
            ("claim", 1),
            ("accept", 2),
            ("cancel", 0),
            ("reject", 3),
            ("complete", 1),
        ]
    )
    full = list(lg.audit())
    assert len(full) > 15 and [t.position for t in full] == sorted({t.position for t in full})
    for newest_first, expected in ((False, full), (True, full[::-1])):
        pages: list[list[Transition]] = []
        after: int | None = None
        while page := list(lg.audit(newest_first=newest_first, after=after, limit=4)):
            pages.append(page)
            after = page[-1].position
        assert [t for p in pages for t in p] == expected
        assert all(len(p) == 4 for p in pages[:-1])
    # a cursor in the middle continues from exactly there, in either direction
    middle = full[7].position
    assert list(lg.audit(after=middle)) == full[8:]
    assert list(lg.audit(after=middle, newest_first=True)) == full[:7][::-1]
    assert list(lg.audit(after=middle, limit=3, page_size=2)) == full[8:11]
    worker_rows = [t for t in full if t.role == "worker"]
    assert list(lg.audit(role="worker", after=worker_rows[1].position, limit=2)) == worker_rows[2:4]


@pytest.mark.parametrize(
    "store_dsn", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
def test_filtered_audit_queries_use_an_index(
    lg: Ledger, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    big = lg.submit(manifest(1500), SUBMITTER).run_id
    lg.start(big, CONTROLLER)
    while leases := lg.claim(big, WORKER, limit=1000):
        clock.advance(1)
        lg.record([Outcome(le, "accept") for le in leases])
    clock.advance(3600)
    small = lg.submit(manifest(2, review={"decision": "ok"}), SUBMITTER).run_id
    lg.start(small, CONTROLLER)
    lg.request_review(small, CONTROLLER, "ok")
    lg.decide(small, REVIEWER, lg.status(small).input_version, False, "no")
    lg.submit(manifest(1), SUBMITTER)
    lg.cancel(lg.runs(limit=1)[0].run_id, OPERATOR, "no")
    with lg.store.write() as tx:
        tx_type = type(tx)
        if lg.store.dialect == "postgres":
            tx.execute("ANALYZE ledger_events")
        else:
            tx.execute("ANALYZE")
    seen: list[tuple[str, tuple[Any, ...]]] = []
    original = tx_type.fetchall

    def capture(self: Any, sql: str, params: Any = ()) -> list[dict[str, Any]]:
        if "FROM lg_transitions" in sql:
            seen.append((sql, tuple(params)))
        return original(self, sql, params)

    monkeypatch.setattr(tx_type, "fetchall", capture)
    late = clock() - timedelta(seconds=1)
    # the transitions are rows of the event log (lg_transitions is a view of them), its
    # indexes named after the store's events table
    events = lg.store.events_table()
    cases: list[tuple[dict[str, Any], str]] = [
        ({"run_id": small}, f"{events}_run"),
        ({"actor": "rita"}, f"{events}_actor"),
        ({"role": "reviewer"}, f"{events}_role"),
        ({"state": "awaiting_review"}, f"{events}_state"),
        ({"since": late, "newest_first": True}, f"{events}_at"),
        ({"run_id": small, "after": 3, "limit": 5}, f"{events}_run"),
    ]
    # PostgreSQL's role and state indexes leave out a worker's transitions and the
    # in_progress and accepted ones (schema v9): those audits walk the log in position
    # order, keeping most rows they read (a page of 10: at this table's size a page of
    # 1,000 is most of the matching rows, which PostgreSQL rightly reads in one scan and
    # sorts)
    pg = lg.store.dialect == "postgres"
    cases += [
        (
            {"role": "worker", "page_size": 10},
            f"{events}_notification_id_idx" if pg else f"{events}_role",
        ),
        (
            {"state": "accepted", "page_size": 10},
            f"{events}_notification_id_idx" if pg else f"{events}_state",
        ),
        (
            {"role": "worker", "state": "in_progress", "newest_first": True, "page_size": 10},
            f"{events}_notification_id_idx" if pg else f"{events}_state",
        ),
    ]
    for f, index in cases:
        seen.clear()
        rows = list(lg.audit(**f))
        assert rows and seen, f
        sql, params = seen[0]
        plan = explain(lg, sql, params)
        if lg.store.dialect == "postgres":
            assert (
                f"Index Scan using {index} on {events}" in plan
                or f"Index Scan Backward using {index} on {events}" in plan
                or f"Bitmap Index Scan on {index}" in plan
            ), (f, plan)
            assert "Seq Scan" not in plan, (f, plan)
        else:  # a search through the filter's index, not a scan of every row
            assert f"SEARCH {events} USING INDEX {index} (" in plan, (f, plan)
            assert f"SCAN {events}" not in plan, (f, plan)


def explain(lg: Ledger, sql: str, params: tuple[Any, ...]) -> str:
    with lg.store.read() as tx:
        if lg.store.dialect == "postgres":
            rows = tx.fetchall("EXPLAIN " + sql, params)
            return "\n".join(r["QUERY PLAN"] for r in rows)
        rows = tx.fetchall("EXPLAIN QUERY PLAN " + sql, params)
        return "\n".join(r["detail"] for r in rows)
