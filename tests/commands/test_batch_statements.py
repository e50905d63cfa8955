"""A batch command costs a fixed number of statements and round trips on PostgreSQL,
whatever its size: `claim(N)` and `record` of N outcomes send as many statements and
wait for the server as often for 3 items as for 200 (the rows go as one parameter of
each statement, the rule checks run over the batch in memory).

Counted at the driver, in the command's own thread: every statement psycopg sends
(each goes through its cursor's `_execute_send` or `_send_query_prepared`, one per row
of an `executemany` included) and every time it waits for the server (`Connection.wait`: one per round trip, a pipeline's included). The
wake-up thread's NOTIFY after a commit (ledger/stores/pg_recorder.py `Waker`) is sent
on another connection, off the command's path, and is not counted.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from psycopg._cursor_base import BaseCursor

from ledger import Actor, Ledger
from ledger.service.ledger import Outcome
from tests.support.runs import running

pytestmark = pytest.mark.postgres

WORKER = Actor("batch-worker", "worker")


@contextmanager
def counted(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[str]]:
    counts: Counter[str] = Counter()
    caller = threading.get_ident()

    def wrap(cls: Any, name: str, key: str) -> None:
        original: Callable[..., Any] = getattr(cls, name)

        def counting(self: Any, *args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() == caller:
                counts[key] += 1
            return original(self, *args, **kwargs)

        monkeypatch.setattr(cls, name, counting)

    wrap(BaseCursor, "_execute_send", "statements")
    wrap(BaseCursor, "_send_query_prepared", "statements")
    wrap(psycopg.Connection, "wait", "waits")
    try:
        yield counts
    finally:
        monkeypatch.undo()


def cost(lg: Ledger, n: int, monkeypatch: pytest.MonkeyPatch) -> tuple[Counter[str], Counter[str]]:
    """(claim(n)'s counts, record of its n accepts' counts), on a fresh run of n items."""
    run_id = running(lg, n)
    lg.claim(running(lg, 1), WORKER, limit=1)  # warm: statements prepared, pool filled
    with counted(monkeypatch) as claim_counts:
        leases = lg.claim(run_id, WORKER, limit=n)
    assert len(leases) == n
    with counted(monkeypatch) as record_counts:
        results = lg.record([Outcome(lease, "accept") for lease in leases])
    assert not [r for r in results if isinstance(r, Exception)]
    return claim_counts, record_counts


def test_claim_and_record_cost_the_same_statements_and_round_trips_for_3_or_200(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Ledger.open(pg_dsn) as lg:
        small = cost(lg, 3, monkeypatch)
        large = cost(lg, 200, monkeypatch)
    assert small[0]["statements"] > 0 and small[1]["statements"] > 0
    assert large[0] == small[0], f"claim: 3 items {dict(small[0])}, 200 items {dict(large[0])}"
    assert large[1] == small[1], f"record: 3 items {dict(small[1])}, 200 items {dict(large[1])}"
