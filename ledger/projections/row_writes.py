"""Writing a replay's batch of rows (ledger/projections/replay.py): statements in the
projector's order, adjacent groups of one statement together, many rows of one statement
in its array form (PostgreSQL), its COPY or its many-row VALUES form."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ledger.stores import statements as rows_sql
from ledger.stores.base import Tx
from ledger.stores.pg_rows import ArrayRows


def _write_rows(tx: Tx, sql: str, rows: list[tuple[Any, ...]], arrays: ArrayRows) -> None:
    """Many rows of one statement: in its array form where the store has one."""
    if len(rows) < 2 or not arrays.write(tx, sql, rows):
        tx.executemany(sql, rows)


def _write_in_order(
    tx: Tx,
    calls: Sequence[tuple[str, list[tuple[Any, ...]]]],
    arrays: ArrayRows,
    add_counts: str,
) -> None:
    """Execute (sql, rows) groups in order, adjacent groups of one statement together.
    The rows of `add_counts` (signed count deltas) are summed per key first."""
    i = 0
    while i < len(calls):
        sql, rows = calls[i][0], list(calls[i][1])
        i += 1
        while i < len(calls) and calls[i][0] == sql:
            rows.extend(calls[i][1])
            i += 1
        if not rows:
            continue
        if sql == add_counts:
            rows = _merge_counts(rows)
        if len(rows) == 1:
            tx.execute(sql, rows[0])
        elif isinstance(sql, rows_sql.RowsSql) and sql.plain_insert:
            _insert_many(tx, sql, rows, arrays)
        else:
            _write_rows(tx, sql, rows, arrays)


def _merge_counts(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Count deltas (run_id, slot, state, n) summed per key, in key order: one statement
    may not upsert a row twice on PostgreSQL, and every key touched keeps its row."""
    merged: dict[tuple[Any, ...], int] = {}
    for r in rows:
        merged[r[:3]] = merged.get(r[:3], 0) + r[3]
    return [(*key, n) for key, n in sorted(merged.items())]


def _pipelined(cur: Any) -> bool:
    """psycopg refuses COPY while the connection is in pipeline mode."""
    from psycopg import pq

    return bool(cur.connection.info.pipeline_status != pq.PipelineStatus.OFF)


_MAX_PARAMS = 30_000  # under SQLite's 32,766 and PostgreSQL's 65,535 bound parameters


def _insert_many(
    tx: Tx, sql: rows_sql.RowsSql, rows: list[tuple[Any, ...]], arrays: ArrayRows
) -> None:
    """Many rows of a plain insert: COPY on PostgreSQL (the array form in a pipeline,
    where psycopg refuses COPY), its many-row VALUES form elsewhere."""
    cur: Any = getattr(tx, "cur", None)
    if tx.store.dialect == "postgres" and hasattr(cur, "copy"):
        if _pipelined(cur):
            _write_rows(tx, sql, rows, arrays)
        else:
            with cur.copy(sql.copy_sql) as copy:
                for row in rows:
                    copy.write_row(sql.copy_row(row))
        return
    per = max(1, min(500, _MAX_PARAMS // max(1, len(rows[0]))))
    for k in range(0, len(rows), per):
        chunk = rows[k : k + per]
        tx.execute(sql.values_many(len(chunk)), [v for r in chunk for v in r])
