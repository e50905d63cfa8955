"""AsyncLedger.follow and wait_for_events: the feed as an async iterator, each transition
as soon as it commits, filtered by run and kind, without blocking the loop."""

from __future__ import annotations

import asyncio

from ledger import AsyncLedger, Transition
from tests.support.runs import CONTROLLER, SUBMITTER, manifest

WAIT = 60.0  # a bound on waiting for the feed, never a timing assertion


def test_follow_yields_each_transition_as_it_commits(store_dsn: str) -> None:
    async def main() -> None:
        async with await AsyncLedger.open(store_dsn) as lg:
            first = (await lg.submit(manifest(1), SUBMITTER)).run_id
            seen: list[Transition] = []
            want_second = asyncio.Event()

            async def reader() -> None:
                async for t in lg.follow(after=0, kinds=["submit", "start"]):
                    seen.append(t)
                    if len(seen) == 1:
                        want_second.set()
                    if len(seen) == 3:
                        return

            task = asyncio.create_task(reader())
            await asyncio.wait_for(want_second.wait(), WAIT)
            second = (await lg.submit(manifest(1), SUBMITTER)).run_id
            await lg.start(second, CONTROLLER)
            await asyncio.wait_for(task, WAIT)
            assert [(t.run_id, t.command) for t in seen] == [
                (first, "submit"),
                (second, "submit"),
                (second, "start"),
            ]
            positions = [t.position for t in seen]
            assert positions == sorted(positions)

            # one run's feed, from the start; cancelling the iterating task ends it
            only: list[str] = []
            both = asyncio.Event()

            async def one_run() -> None:
                async for t in lg.follow(run_id=second):
                    only.append(t.command)
                    if len(only) == 2:
                        both.set()

            follower = asyncio.create_task(one_run())
            await asyncio.wait_for(both.wait(), WAIT)
            follower.cancel()  # it waits for more: cancelling ends it
            results = await asyncio.gather(follower, return_exceptions=True)
            assert isinstance(results[0], asyncio.CancelledError)
            assert only == ["submit", "start"]

    asyncio.run(main())


def test_wait_for_events_wakes_on_a_commit_and_times_out_without_one(store_dsn: str) -> None:
    async def main() -> None:
        async with await AsyncLedger.open(store_dsn) as lg:
            head = 0
            assert not await lg.wait_for_events(head, 0.1)
            waiting = asyncio.create_task(lg.wait_for_events(head, WAIT))
            await asyncio.sleep(0.05)
            await lg.submit(manifest(1), SUBMITTER)
            assert await asyncio.wait_for(waiting, WAIT)

    asyncio.run(main())
