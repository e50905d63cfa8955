"""What a PostgreSQL fault means to the ledger's caller: the typed error, and whether
anything may have been written."""

from __future__ import annotations

import psycopg

from ledger.core.errors import CommitUncertain, StoreUnavailable
from ledger.core.redact import redact, truncate_bytes

# What a server-reported error (SQLSTATE, by class or code) means to the caller.
_REFUSALS = (
    ("40", "the database aborted the transaction (a deadlock or serialization failure)"),
    ("55P03", "a lock the command needs could not be taken in time (lock_timeout)"),
    ("57014", "the database canceled the statement (statement_timeout or a cancel request)"),
    ("53", "the database is out of resources"),
    ("57P", "the database is shutting down or restarting"),
)


def fault(error: Exception, uncertain: bool) -> StoreUnavailable | CommitUncertain:
    """A database fault as the ledger's typed error. Before COMMIT nothing was written
    (StoreUnavailable: safe to repeat); a lost connection during COMMIT leaves the outcome
    unknown (CommitUncertain). An error the server itself reported (it has a SQLSTATE) means
    the transaction was rolled back, even at COMMIT, except when the server was going away
    (57P: operator intervention). The message says which it was: an unreachable server, a
    lock or statement timeout, a deadlock, a full disk. See ledger/commands/idempotency.py for who
    retries what."""
    detail = truncate_bytes(redact(" ".join(str(error).split())), 500)
    cause = error.__cause__
    sqlstate = getattr(cause, "sqlstate", None) if isinstance(cause, psycopg.Error) else None
    if sqlstate and not (uncertain and sqlstate.startswith("57P")):
        what = next(
            (text for prefix, text in _REFUSALS if sqlstate.startswith(prefix)),
            "the database refused the transaction",
        )
        return StoreUnavailable(f"{what} (SQLSTATE {sqlstate}: {detail}); nothing was written")
    if uncertain:
        return CommitUncertain(
            f"the database connection failed while committing ({detail}); the command may or may "
            "not have been applied: re-read, or repeat it with the same idempotency_key"
        )
    return StoreUnavailable(f"the database is unavailable ({detail}); nothing was written")
