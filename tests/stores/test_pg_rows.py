"""PostgreSQL: the projection statements' array form (ledger/stores/pg_rows.py) writes
the same rows as their one-row form, and leaves rows it could not write exactly to it."""

from __future__ import annotations

from typing import Any
from uuid import UUID

import pytest

from ledger import Ledger
from ledger.projections.checksums import iter_rows
from ledger.projections.rebuild import create_tables, drop_tables
from ledger.projections.schema import TABLE_KEYS
from ledger.projections.writer import Projector
from ledger.stores.pg_rows import ArrayRows

pytestmark = pytest.mark.postgres

A, B = "_rows_a", "_rows_b"
RUN = "0b6f64b2-6c1f-4a3e-9d67-3b8f1e2f4c11"


def items(n: int) -> list[tuple[Any, ...]]:
    return [
        (RUN, f"doc-{k}", k, k % 2, f'{{"n":{k},"s":"wörker ✓ \\"quoted\\" \\\\ back\\ny"}}')
        for k in range(n)
    ]


UPDATE = (
    "accepted",
    3,
    1,
    None,
    "w1",
    None,
    None,
    "é\u2028",
    "done",
    "2026-12-01T21:36:11+00:00",
    None,
)


def attempts(n: int) -> list[tuple[Any, ...]]:
    return [
        (
            RUN,
            f"doc-{k}",
            1 + k % 3,
            "w1",
            f"tok-{k}",
            "2026-12-01T21:36:10.842797+00:00",
            "2026-12-01T21:37:10.842797+00:00",
            "2026-12-01T21:36:11+00:00",
            None if k % 2 else "fetch",
            "failed" if k % 2 else "accepted",
            None if k % 2 == 0 else "é\u2028 boom",
        )
        for k in range(n)
    ]


def item_updates(n: int) -> list[tuple[Any, ...]]:
    return [(*UPDATE, RUN, f"doc-{k}") for k in range(n)]


def table(tx: Any, name: str) -> list[dict[str, Any]]:
    return list(iter_rows(tx, name, TABLE_KEYS[name.rsplit("_rows_", 1)[0]]))


def test_the_array_form_writes_what_the_one_row_form_writes(pg_dsn: str) -> None:
    with Ledger.open(pg_dsn) as lg, lg.store.write() as tx:
        create_tables(tx, A)
        create_tables(tx, B)
        try:
            arrays = ArrayRows()
            for suffix, write in ((A, True), (B, False)):
                p = Projector(suffix)
                for sql, rows in (
                    (p.insert_item, items(50)),
                    (p.update_item, item_updates(30)),
                    (p.insert_attempt, attempts(20)),
                    (p.add_counts, [(RUN, 1, "pending", 5), (RUN, 2, "accepted", -2)]),
                    (p.add_counts, [(RUN, 1, "pending", 3), (RUN, 3, "failed", 1)]),
                ):
                    if write:
                        assert arrays.write(tx, sql, rows), sql
                    else:
                        tx.executemany(str(sql), rows)  # a plain str: the one-row form
            for name in ("lg_items", "lg_attempts", "lg_run_counts"):
                mine, reference = table(tx, name + A), table(tx, name + B)
                assert len(mine) > 1
                assert mine == reference, name
        finally:
            drop_tables(tx, A)
            drop_tables(tx, B)


@pytest.mark.parametrize(
    "value", [1.5, 1e-05, True, b"bytes"], ids=["float", "exponent", "bool", "bytes"]
)
def test_rows_it_cannot_write_exactly_are_left_to_the_caller(pg_dsn: str, value: Any) -> None:
    with Ledger.open(pg_dsn) as lg, lg.store.write() as tx:
        rows = items(3)
        rows[1] = (*rows[1][:4], value)  # the payload column (text)
        assert not ArrayRows().write(tx, Projector().insert_item, rows)
        uuid_rows = [(RUN, UUID(int=k), k, 1, "{}") for k in range(3)]
        assert ArrayRows().write(tx, Projector().insert_item, uuid_rows)  # text and ints: done
        assert not ArrayRows().write(tx, "INSERT INTO lg_runs (run_id) VALUES (?)", [("x",)] * 2)


def test_an_integer_beyond_64_bits_is_left_to_the_caller(pg_dsn: str) -> None:
    with Ledger.open(pg_dsn) as lg, lg.store.write() as tx:
        rows = [(RUN, f"i{k}", 2**70 if k == 1 else k, 1, "{}") for k in range(3)]
        assert not ArrayRows().write(tx, Projector().insert_item, rows)


def test_the_bulk_json_of_rows_is_the_standard_librarys_or_none() -> None:
    import json
    from datetime import UTC, datetime

    from ledger.stores.pg_tx import _rows_json

    names = ("a", "b", "c")
    rows = [(UUID(int=7), 'ünï \u2028 "q"', None), (2**63 - 1, True, -0.5)]
    got = _rows_json(names, rows)
    assert got is not None
    assert json.loads(got) == json.loads(
        json.dumps(
            [
                dict(
                    zip(names, (str(r[0]) if isinstance(r[0], UUID) else r[0], *r[1:]), strict=True)
                )
                for r in rows
            ]
        )
    )
    # what has no exact JSON form: left to the caller (executemany), as before
    for bad in (float("nan"), float("inf"), datetime(2026, 1, 1, tzinfo=UTC), b"x", 2**70):
        assert _rows_json(names, [(1, bad, None)]) is None, bad
