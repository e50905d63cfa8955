"""AsyncWorker: the Worker's outcomes from coroutine handlers on the event loop, plain
handlers off it, and a cancelled worker that records what it was doing and stops."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from ledger import Accepted, AsyncLedger, AsyncWorker, Lease, Quarantine, Rejected
from tests.support.clock import ManualClock
from tests.support.runs import CONTROLLER, SUBMITTER, items_from_one


async def _running(lg: AsyncLedger, n: int, **policy: Any) -> str:
    run_id = (await lg.submit(items_from_one(n, **policy), SUBMITTER)).run_id
    await lg.start(run_id, CONTROLLER)
    return run_id


async def _states(lg: AsyncLedger, run_id: str) -> dict[str, str]:
    return {item.item_id: item.state for item in await lg.items(run_id)}


def test_outcomes_of_coroutine_handlers_are_recorded(store_dsn: str, clock: ManualClock) -> None:
    async def main() -> None:
        async with await AsyncLedger.open(store_dsn, clock=clock) as lg:
            run_id = await _running(lg, 5, max_attempts=3)
            calls: dict[str, int] = {}

            async def handle(lease: Lease) -> Accepted | Rejected | Quarantine:
                calls[lease.item_id] = calls.get(lease.item_id, 0) + 1
                await asyncio.sleep(0)
                if lease.item_id == "i2":
                    return Rejected("amount_positive", detail="amount is -3", stage="validate")
                if lease.item_id == "i3":
                    return Quarantine("checksum mismatch", stage="parse")
                if lease.item_id == "i4" and calls["i4"] == 1:
                    raise ConnectionError("upstream reset the connection")
                if lease.item_id == "i5":
                    raise ValueError("always broken")
                return Accepted(evidence={"receipt": lease.item_id}, stage="delivered")

            summary = await AsyncWorker(
                lg, run_id, handle, worker_id="w-async", concurrency=3
            ).run()
            assert await _states(lg, run_id) == {
                "i1": "accepted",
                "i2": "rejected",
                "i3": "quarantined",
                "i4": "accepted",
                "i5": "quarantined",
            }
            assert calls == {"i1": 1, "i2": 1, "i3": 1, "i4": 2, "i5": 3}
            assert (summary.accepted, summary.rejected, summary.quarantined) == (2, 1, 2)
            assert summary.stopped == "nothing left to claim"
            attempts = await lg.attempts(run_id, item_id="i4")
            assert [a.outcome for a in attempts] == ["failed", "accepted"]
            assert attempts[0].worker_id == "w-async"
            assert attempts[0].error is not None and "ConnectionError" in attempts[0].error

    asyncio.run(main())


def test_a_plain_function_handler_runs_off_the_loops_thread(store_dsn: str) -> None:
    async def main() -> None:
        async with await AsyncLedger.open(store_dsn) as lg:
            run_id = await _running(lg, 3)
            loop_thread = threading.get_ident()
            seen: set[int] = set()

            def handle(lease: Lease) -> Accepted:
                seen.add(threading.get_ident())
                return Accepted()

            summary = await AsyncWorker(lg, run_id, handle, concurrency=2).run()
            assert summary.accepted == 3
            assert seen and loop_thread not in seen

    asyncio.run(main())


def test_cancelling_the_worker_records_its_attempts_and_stops(store_dsn: str) -> None:
    """Cancelled while its handlers wait: each attempt in flight is recorded as a
    retryable failure (another worker takes the item), then the cancellation goes on."""

    async def main() -> None:
        async with await AsyncLedger.open(store_dsn) as lg:
            run_id = await _running(lg, 3)
            started = asyncio.Event()
            running_now = 0

            async def handle(lease: Lease) -> Accepted:
                nonlocal running_now
                running_now += 1
                if running_now == 3:
                    started.set()
                await asyncio.Event().wait()  # never set: only cancellation ends it
                return Accepted()

            task = asyncio.create_task(AsyncWorker(lg, run_id, handle, concurrency=3).run())
            await asyncio.wait_for(started.wait(), timeout=60)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert await _states(lg, run_id) == {
                "i1": "retryable",
                "i2": "retryable",
                "i3": "retryable",
            }
            for item_id in ("i1", "i2", "i3"):
                (attempt,) = await lg.attempts(run_id, item_id=item_id)
                assert attempt.outcome == "failed"
                assert attempt.error is not None and "HandlerCancelled" in attempt.error
            assert (await lg.verify()).ok
            # the ledger goes on: another worker finishes the run
            summary = await AsyncWorker(lg, run_id, lambda lease: Accepted()).run()
            assert summary.accepted == 3

    asyncio.run(main())
