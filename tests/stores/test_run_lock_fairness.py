"""A run command is never starved by item commands (PostgreSQL).

Claims and outcomes share the run's lock so that workers of one run go side by side;
cancel, pause and the other run commands take it exclusively. Shared holders that
overlap one another must not keep an exclusive waiter out for ever: rule 6 of the rule book says
new claims stop *at once* when a cancel is made. Proof with real transactions: one item
command holds the run while a cancel waits for it; a claim made after the cancel began
waiting must not overtake it (it waits, then finds the run canceled).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from ledger import IllegalTransition, Ledger
from ledger.reads.queries import load_run
from tests.support.runs import CONTROLLER, SUBMITTER, WORKER, manifest
from tests.support.waiting import wait_until

pytestmark = pytest.mark.postgres

WAIT = 60.0  # a bound on waiting for another thread, never a timing assertion


def _lock_waiters(dsn: str) -> int:
    """Sessions of this database waiting for a heavyweight lock right now."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
        ).fetchone()
    assert row is not None
    return int(row[0])


def _thread(target: Callable[[], Any], out: dict[str, Any], name: str) -> threading.Thread:
    def body() -> None:
        try:
            out[name] = ("ok", target())
        except BaseException as e:
            out[name] = ("error", e)

    t = threading.Thread(target=body, name=name)
    t.start()
    return t


def test_a_claim_made_while_a_cancel_waits_does_not_overtake_it(pg_dsn: str) -> None:
    with Ledger.open(pg_dsn) as lg:
        run_id = lg.submit(manifest(10), SUBMITTER).run_id
        lg.start(run_id, CONTROLLER)
        held, release = threading.Event(), threading.Event()
        out: dict[str, Any] = {}

        def item_command_in_flight() -> None:
            # an item command's transaction holding the run (as a claim or an outcome does)
            with lg.store.write() as tx:
                load_run(tx, run_id, lock="item")
                held.set()
                assert release.wait(WAIT)

        holder = _thread(item_command_in_flight, out, "holder")
        try:
            assert held.wait(WAIT)
            canceler = _thread(lambda: lg.cancel(run_id, SUBMITTER, "stop"), out, "cancel")
            wait_until(lambda: _lock_waiters(pg_dsn) >= 1, "the cancel to wait for the run", WAIT)
            claimer = _thread(lambda: lg.claim(run_id, WORKER, limit=5), out, "claim")
            # the claim queues behind the cancel (or, wrongly, returns leases at once)
            wait_until(
                lambda: "claim" in out or _lock_waiters(pg_dsn) >= 2,
                "the claim to queue or end",
                WAIT,
            )
            assert "claim" not in out, f"a claim overtook the waiting cancel: {out['claim']}"
        finally:
            release.set()
            holder.join(WAIT)
        canceler.join(WAIT)
        claimer.join(WAIT)
        assert out["holder"][0] == "ok", out["holder"]
        assert out["cancel"][0] == "ok", out["cancel"]
        kind, value = out["claim"]
        assert kind == "error" and isinstance(value, IllegalTransition), out["claim"]
        assert lg.status(run_id).state == "canceled"
        assert [t for t in lg.history(run_id) if t.command == "claim"] == []
