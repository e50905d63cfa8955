"""How every command runs: transient-fault retry, then the idempotency key, then the
handler with its unit of work. Explicit steps, no thread-local state.

`execute(store, projector, name, handler, key, arguments)`:

1. **retry** (`idempotency.with_retry`): `StoreUnavailable` means nothing was written,
   so the whole command runs again; `CommitUncertain` is repeated only with a key
   (the key's record tells whether the first try committed).
2. **idempotency** (with a key): one write transaction looks the key up (a repeat
   answers from the record, or is refused when the command or its arguments differ),
   runs the handler inside that same transaction (passed to the `UnitOfWork`), and
   records the key with the response before it commits.
3. **handler** `handler(uow, **arguments)`: the command itself (ledger/commands/*.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from ledger.commands.idempotency import (
    check_key,
    fingerprint,
    lookup,
    matches,
    record,
    refuse_reuse,
    replay,
    run_id_of,
    with_retry,
)
from ledger.commands.uow import UnitOfWork

if TYPE_CHECKING:
    from ledger.projections.writer import Projector
    from ledger.stores.base import Store

T = TypeVar("T")


def execute(
    store: Store,
    projector: Projector,
    name: str,
    handler: Callable[..., T],
    key: str | None,
    arguments: dict[str, Any],
) -> T:
    """Run one command: `handler(uow, **arguments)` under retry and the optional key.
    `arguments` are the command's public arguments by name (they make the key's
    fingerprint)."""
    if key is None:
        if store.joined:  # the caller's transaction: a fault is the caller's to repeat
            return handler(UnitOfWork(store, projector), **arguments)
        return with_retry(lambda: handler(UnitOfWork(store, projector), **arguments), keyed=False)
    checked = check_key(key)
    fp = fingerprint(name, arguments)

    def once() -> T:
        with store.write() as tx:
            row = lookup(tx, checked)
            if row is not None:
                if not matches(row, name, fp):
                    # the command's own checks answer first (a 403 stays a 403); the
                    # refusal rolls this transaction back, so nothing is written
                    refuse_reuse(
                        lambda: handler(UnitOfWork(store, projector, tx), **arguments), checked
                    )
                return replay(row, checked, name, fp)  # type: ignore[no-any-return]
            result = handler(UnitOfWork(store, projector, tx), **arguments)
            record(tx, checked, name, fp, run_id_of(result, arguments), result)
            return result

    return once() if store.joined else with_retry(once, keyed=True)
