"""The bridge that lets the ledger's one synchronous implementation serve `AsyncLedger`.

Every command, read, rule and statement is written once, as plain synchronous code over a
`Tx`. `AsyncLedger` runs that code in a greenlet (`bridged`) on the event loop's thread;
wherever the code would wait for the database, the store's asynchronous shell calls
`await_only(awaitable)`, which switches back to the coroutine that started the greenlet.
That coroutine awaits the awaitable on the loop (other tasks run meanwhile) and switches
the result, or the exception, back in. This is how SQLAlchemy's asyncio extension runs its
synchronous ORM over asyncpg and psycopg; see docs/decisions/ for why the ledger chose it
over generating a second copy of its source.

A cancelled task gets `CancelledError` at the await it is stopped in, inside the greenlet:
the code unwinds as it would for any error (the transaction rolls back) and the error
comes out of `bridged`.
"""

from __future__ import annotations

import asyncio
import contextvars
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")


def _driver() -> Any:
    """The greenlet of the coroutine running the current bridged code, or None. greenlet
    (the `async` extra) is looked up, not imported: where it was never imported, nothing
    runs bridged."""
    module = sys.modules.get("greenlet")
    if module is None:
        return None
    return getattr(module.getcurrent(), "ledger_driver", None)


def in_bridge() -> bool:
    """True inside synchronous code that `bridged` runs (waits must be `await_only`)."""
    return _driver() is not None


def await_only(awaitable: Awaitable[T]) -> T:
    """Wait for `awaitable` on the event loop, from synchronous code `bridged` runs."""
    driver = _driver()
    if driver is None:
        if asyncio.iscoroutine(awaitable):
            awaitable.close()  # never awaited: no "coroutine was never awaited" warning
        raise RuntimeError("await_only() called outside of bridged(): use AsyncLedger's methods")
    result: T = driver.switch(awaitable)
    return result


async def bridged(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """Run synchronous `fn(*args, **kwargs)`, awaiting each `await_only` it reaches.

    The greenlet runs in a copy of the caller's context, so context variables (the
    OpenTelemetry span that is current, for one) are the caller's."""
    import greenlet  # type: ignore[import-untyped]

    driver = greenlet.getcurrent()
    runner = greenlet.greenlet(fn, driver)
    runner.ledger_driver = driver
    runner.gr_context = contextvars.copy_context()
    step = runner.switch(*args, **kwargs)
    while not runner.dead:
        try:
            value = await step
        except BaseException as e:  # handed to the code that awaited it
            step = runner.throw(e)
        else:
            step = runner.switch(value)
    return step  # type: ignore[no-any-return]


def sleep(seconds: float) -> None:
    """`time.sleep`, except inside `bridged` code, where it lets the loop run meanwhile."""
    if in_bridge():
        await_only(asyncio.sleep(seconds))
    else:
        time.sleep(seconds)
