"""AsyncLedger: the same commands, reads, results and typed errors as Ledger, as coroutines
that never block the event loop, on every store; a cancelled call writes nothing."""

from __future__ import annotations

import asyncio
import inspect
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from ledger import AsyncLedger, Ledger
from ledger.core.errors import InvalidInput, NotAuthorized, RunNotFound
from ledger.projections.writer import Projector
from ledger.stores.green import await_only
from tests.support.runs import CONTROLLER, OPERATOR, SUBMITTER, WORKER, manifest

T = TypeVar("T")
ROOT = Path(__file__).resolve().parents[2]
BY_HAND = {"open", "close", "keyed", "iter_audit", "wait_for_events", "using"}


def run(main: Callable[[], Awaitable[T]]) -> T:
    return asyncio.run(main())  # type: ignore[arg-type]


def _public(cls: type) -> dict[str, Any]:
    return {n: f for n, f in inspect.getmembers(cls) if not n.startswith("_") and callable(f)}


def test_every_public_method_of_ledger_has_a_coroutine_with_its_signature() -> None:
    sync, async_ = _public(Ledger), _public(AsyncLedger)
    missing = sorted(set(sync) - set(async_))
    assert not missing, f"AsyncLedger lacks {missing}"
    for name, fn in sync.items():
        twin = async_[name]
        if name in ("keyed", "using"):  # views: they return an AsyncLedger at once
            assert not inspect.iscoroutinefunction(twin)
            continue
        if name == "iter_audit":
            assert inspect.isasyncgenfunction(twin)
        else:
            assert inspect.iscoroutinefunction(twin), name
        ours = list(inspect.signature(twin).parameters.values())
        theirs = list(inspect.signature(fn).parameters.values())
        if name == "open":  # a classmethod: no `cls` in either signature
            assert [p.name for p in ours] == [p.name for p in theirs]
            continue
        assert [(p.name, p.kind, p.default) for p in ours] == [
            (p.name, p.kind, p.default) for p in theirs
        ], name


def test_the_generated_coroutines_are_current() -> None:
    done = subprocess.run(
        [sys.executable, "scripts/gen_async_api.py", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def _lifecycle_sync(lg: Ledger) -> list[tuple[str, str | None]]:
    run_id = lg.submit(manifest(3), SUBMITTER).run_id
    lg.start(run_id, CONTROLLER)
    for lease in lg.claim(run_id, WORKER, limit=3):
        lg.accept(lease)
    lg.complete(run_id, CONTROLLER)
    return [(t.command, t.to_state) for t in lg.history(run_id)]


async def _lifecycle_async(lg: AsyncLedger) -> tuple[str, list[tuple[str, str | None]]]:
    run_id = (await lg.submit(manifest(3), SUBMITTER)).run_id
    await lg.start(run_id, CONTROLLER)
    leases = await lg.claim(run_id, WORKER, limit=3)
    await asyncio.gather(*(lg.accept(lease) for lease in leases))
    await lg.complete(run_id, CONTROLLER)
    return run_id, [(t.command, t.to_state) for t in await lg.history(run_id)]


def test_a_run_through_the_async_api_reads_as_one_through_the_sync_api(store_dsn: str) -> None:
    async def main() -> None:
        async with await AsyncLedger.open(store_dsn) as lg:
            run_id, steps = await _lifecycle_async(lg)
            status = await lg.status(run_id)
            assert status.state == "succeeded"
            assert (await lg.verify()).ok
            audit = [t async for t in lg.iter_audit(run_id=run_id)]
            assert [(t.command, t.to_state) for t in audit] == steps
        # the same run, the sync way, on a fresh ledger of the same kind
        with Ledger.open("memory://") as other:
            assert sorted(_lifecycle_sync(other)) == sorted(steps)

    run(main)


def test_refusals_are_the_same_typed_errors_and_write_nothing(store_dsn: str) -> None:
    async def main() -> None:
        async with await AsyncLedger.open(store_dsn) as lg:
            run_id = (await lg.submit(manifest(2), SUBMITTER)).run_id
            before = await lg.history(run_id)
            with pytest.raises(RunNotFound):
                await lg.status("no-such-run")
            with pytest.raises(NotAuthorized):
                await lg.start(run_id, WORKER)
            with pytest.raises(InvalidInput):
                await lg.pause(run_id, OPERATOR, reason="  ")
            assert await lg.history(run_id) == before
            assert (await lg.status(run_id)).state == "queued"

    run(main)


def test_a_cancelled_command_rolls_back_and_the_ledger_stays_usable(
    store_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The task is cancelled after the command appended its events and wrote its rows,
    before its commit: nothing of it is kept, and the next command goes through."""
    gate: dict[str, asyncio.Event] = {}
    project = Projector.project

    def parked(self: Projector, tx: Any, *args: Any, **kwargs: Any) -> Any:
        result = project(self, tx, *args, **kwargs)
        if "reached" in gate:
            gate["reached"].set()
            await_only(gate["open"].wait())  # the command waits inside its transaction
        return result

    monkeypatch.setattr(Projector, "project", parked)

    async def main() -> None:
        async with await AsyncLedger.open(store_dsn) as lg:
            run_id = (await lg.submit(manifest(2), SUBMITTER)).run_id
            before = await lg.history(run_id)
            gate["reached"], gate["open"] = asyncio.Event(), asyncio.Event()
            task = asyncio.create_task(lg.start(run_id, CONTROLLER))
            await gate["reached"].wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            del gate["reached"]
            assert (await lg.status(run_id)).state == "queued"
            assert await lg.history(run_id) == before
            assert (await lg.start(run_id, CONTROLLER)).state == "running"
            assert (await lg.verify()).ok

    run(main)


class _LoopWatch:
    """Records every blocking database call made on the event loop's thread: psycopg's
    synchronous waits (every sync connection's I/O goes through them) and any call into a
    sqlite3 connection or cursor (seen by a profile hook on that thread)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.loop_thread = threading.get_ident()
        self.calls: list[str] = []
        import psycopg.waiting as waiting

        for name in ("wait", "wait_conn"):
            real = getattr(waiting, name)

            def watched(*args: Any, _real: Any = real, _name: str = name, **kwargs: Any) -> Any:
                if threading.get_ident() == self.loop_thread:
                    self.calls.append(f"psycopg.waiting.{_name}")
                return _real(*args, **kwargs)

            monkeypatch.setattr(waiting, name, watched)

    def profile(self, frame: Any, event: str, arg: Any) -> None:
        if event == "c_call" and isinstance(
            getattr(arg, "__self__", None), sqlite3.Connection | sqlite3.Cursor
        ):
            self.calls.append(f"sqlite3.{arg.__qualname__}")


def test_many_concurrent_calls_never_block_the_loop(
    store_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def main() -> tuple[list[str], int, int]:
        lg = await AsyncLedger.open(store_dsn)
        watch = _LoopWatch(monkeypatch)
        threads_before = threading.active_count()
        peak = threads_before
        sys.setprofile(watch.profile)
        try:
            statuses = await asyncio.gather(*(lg.submit(manifest(2), SUBMITTER) for _ in range(30)))
            await asyncio.gather(*(lg.start(s.run_id, CONTROLLER) for s in statuses))
            peak = max(peak, threading.active_count())
            leases = [
                lease
                for batch in await asyncio.gather(
                    *(lg.claim(s.run_id, WORKER, limit=2) for s in statuses)
                )
                for lease in batch
            ]
            peak = max(peak, threading.active_count())
            await asyncio.gather(*(lg.accept(lease) for lease in leases))
            await asyncio.gather(*(lg.status(s.run_id) for s in statuses), lg.overview())
            peak = max(peak, threading.active_count())
        finally:
            sys.setprofile(None)
            await lg.close()
        return watch.calls, threads_before, peak

    calls, before, peak = run(main)
    assert calls == [], f"blocking database calls on the loop's thread: {sorted(set(calls))}"
    # no thread per call: 30 concurrent commands started no thread (SQLite: its one
    # database thread, started at open)
    assert peak == before


def test_open_refuses_a_clock_that_is_not_callable() -> None:
    async def main() -> None:
        with pytest.raises(InvalidInput):
            await AsyncLedger.open("memory://", clock=3)  # type: ignore[arg-type]

    run(main)
