"""An in-database follower's handler may command the ledger through `lg.using(tx)`: what
it does commits with the batch and its checkpoint, and rolls back with them, on every
store. A command or read of the ledger's own transactions inside the handler is refused
the same way on every store (it would not commit with the batch)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from ledger import AsyncLedger, Follower, Ledger, Transition
from ledger.core.errors import InvalidInput
from ledger.feed.async_follower import AsyncFollower
from tests.support.runs import CONTROLLER, SUBMITTER, WORKER, running


def _completer(lg: Ledger | AsyncLedger, fail_first: bool) -> Any:
    """A handler that completes a run once its last item is accepted, failing after the
    command on its first call when `fail_first`."""
    calls = {"n": 0}

    def complete_when_done(batch: list[Transition], tx: Any) -> None:
        calls["n"] += 1
        joined = lg.using(tx)
        assert isinstance(joined, Ledger)
        for t in batch:
            if t.command == "accept":
                status = joined.status(t.run_id)
                left = sum(n for state, n in status.counts.items() if state != "accepted")
                if status.state == "running" and left == 0:
                    joined.complete(t.run_id, CONTROLLER)
        if fail_first and calls["n"] == 1:
            raise RuntimeError("the handler failed after its command")

    return complete_when_done, calls


def test_a_follower_that_completes_runs_commits_with_its_checkpoint(lg: Ledger) -> None:
    run_id = running(lg, 2)
    for lease in lg.claim(run_id, WORKER, limit=2):
        lg.accept(lease)
    handler, calls = _completer(lg, fail_first=True)
    f = Follower(lg, "completer", handler, kinds=["accept"])
    before = f.position
    with pytest.raises(RuntimeError, match="after its command"):
        f.run_once()
    # the command rolled back with the batch: the run is still running, nothing delivered
    assert lg.status(run_id).state == "running"
    assert f.position == before
    assert "complete" not in [t.command for t in lg.history(run_id)]
    assert f.catch_up() == 2
    assert calls["n"] == 2
    assert lg.status(run_id).state == "succeeded"
    assert f.position >= lg.events(kinds=["accept"])[-1].position
    assert lg.verify().ok
    f.close()


def test_a_command_outside_using_inside_the_handler_is_refused_on_every_store(
    lg: Ledger,
) -> None:
    run_id = running(lg, 1)
    (lease,) = lg.claim(run_id, WORKER, limit=1)
    lg.accept(lease)

    def careless(batch: list[Transition], tx: Any) -> None:
        lg.complete(run_id, CONTROLLER)  # not lg.using(tx)

    f = Follower(lg, "careless", careless, kinds=["accept"])
    with pytest.raises(InvalidInput, match=r"lg\.using\(tx\)"):
        f.run_once()
    assert lg.status(run_id).state == "running"
    assert f.position == 0
    f.close()


def test_an_async_follower_whose_coroutine_handler_commands_commits_with_its_checkpoint(
    store_dsn: str,
) -> None:
    async def main() -> None:
        async with await AsyncLedger.open(store_dsn) as lg:
            run_id = (
                await lg.submit(
                    {
                        "source_version": "s",
                        "config_version": "c",
                        "items": [{"item_id": "a"}, {"item_id": "b"}],
                    },
                    SUBMITTER,
                )
            ).run_id
            await lg.start(run_id, CONTROLLER)
            for lease in await lg.claim(run_id, WORKER, limit=2):
                await lg.accept(lease)
            calls = {"n": 0}

            async def complete_when_done(batch: list[Transition], tx: Any) -> None:
                calls["n"] += 1
                joined = lg.using(tx)
                status = await joined.status(run_id)
                if status.state == "running" and any(t.command == "accept" for t in batch):
                    await joined.complete(run_id, CONTROLLER)
                if calls["n"] == 1:
                    raise RuntimeError("the handler failed after its command")

            async with AsyncFollower(lg, "completer", complete_when_done, kinds=["accept"]) as f:
                with pytest.raises(RuntimeError):
                    await f.run_once()
                assert (await lg.status(run_id)).state == "running"
                assert await f.position() == 0
                assert await f.catch_up() == 2
                assert (await lg.status(run_id)).state == "succeeded"

            async def careless(batch: list[Transition], tx: Any) -> None:
                await lg.status(run_id)  # not lg.using(tx)

            async with AsyncFollower(lg, "careless", careless) as f:
                with pytest.raises(InvalidInput, match=r"lg\.using\(tx\)"):
                    await asyncio.wait_for(f.run_once(), timeout=60)

    asyncio.run(main())
