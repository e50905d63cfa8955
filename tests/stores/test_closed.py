"""A closed ledger refuses every call with the same error on every store, sync and async
(as a closed file refuses I/O), and says it is closed."""

from __future__ import annotations

import asyncio

import pytest

from ledger import AsyncLedger, Ledger
from tests.support.runs import SUBMITTER, manifest


def test_a_closed_ledger_refuses_commands_and_reads_alike(store_dsn: str) -> None:
    lg = Ledger.open(store_dsn)
    run_id = lg.submit(manifest(1), SUBMITTER).run_id
    assert not lg.store.closed
    lg.close()
    assert lg.store.closed
    with pytest.raises(RuntimeError, match="ledger is closed"):
        lg.status(run_id)
    with pytest.raises(RuntimeError, match="ledger is closed"):
        lg.submit(manifest(1), SUBMITTER)


def test_a_closed_async_ledger_refuses_alike(store_dsn: str) -> None:
    async def main() -> None:
        lg = await AsyncLedger.open(store_dsn)
        run_id = (await lg.submit(manifest(1), SUBMITTER)).run_id
        await lg.close()
        assert lg.store.closed
        with pytest.raises(RuntimeError, match="ledger is closed"):
            await lg.status(run_id)
        with pytest.raises(RuntimeError, match="ledger is closed"):
            await lg.submit(manifest(1), SUBMITTER)

    asyncio.run(main())
