"""Idempotency keys and transient-fault retry for the ledger's commands.

Every public command runs through `ledger.commands.pipeline.execute`:

- **Transient faults are retried where that is safe.** A store raises
  `StoreUnavailable` when the database could not be reached or dropped the
  connection before the command's transaction committed: nothing was written, so
  the whole command runs again (a bounded number of times, with backoff long
  enough to ride out a server restart). A fault *during* COMMIT raises
  `CommitUncertain`: the command may or may not have been applied, so it is not
  repeated blindly; it surfaces to the caller, unless the call carries an
  idempotency key.

- **`idempotency_key=`** (optional, on every command). The command runs in one
  transaction that also records the key in `ledger_idempotency` with the command
  name, a fingerprint of its arguments, the run id and the response. A repeat with
  the same key returns the recorded response and writes nothing; a repeat with the
  same key but another command or other arguments is refused with `InvalidInput`.
  So a caller that lost the reply (or got `CommitUncertain`) simply repeats the
  call with the same key; the ledger retries that way by itself after a fault
  during COMMIT. A refused command records nothing: the key stays unused.

Reads are wrapped by `read_command`: retried on `StoreUnavailable` only. This module
holds the record (lookup, replay, record, prune), the response codec and the retry loop.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import types
import typing
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, Union

from ledger.commands.sql import SQL
from ledger.core import errors as E
from ledger.core.errors import CommitUncertain, InvalidInput, LedgerError, StoreUnavailable
from ledger.core.validation import check_identifier
from ledger.stores import green

if TYPE_CHECKING:
    from ledger.stores.base import Store, Tx

P = ParamSpec("P")
T = TypeVar("T")

TABLE = "ledger_idempotency"  # (its statements name it: commands.sql, idempotency_*)
# Pauses between attempts after a transient fault: about 20 s in all, enough for a
# PostgreSQL fast restart or a failover of a pooled connection.
RETRY_DELAYS: tuple[float, ...] = (0.05, 0.1, 0.2, 0.4, 0.8, 1.5, 2.5, 4.0, 5.0, 5.0)


def ddl(dialect: str) -> list[str]:
    """The idempotency table (a ledger table, not a projection: rebuilds keep it)."""
    return [
        f"""CREATE TABLE IF NOT EXISTS {TABLE} (
            idempotency_key TEXT PRIMARY KEY,
            command TEXT NOT NULL,
            fingerprint TEXT NOT NULL,
            run_id TEXT,
            response TEXT NOT NULL,
            recorded_at TEXT NOT NULL
        )""",
    ]


class KeyTaken(Exception):
    """Another transaction recorded the same key first: roll back and read its record."""


def check_key(key: Any) -> str:
    """An idempotency key is an identifier: 1-200 characters, no control characters."""
    return check_identifier(key, "idempotency_key")


# --------------------------------------------------------------------------
# fingerprints of arguments and encoded responses
# --------------------------------------------------------------------------
def _canon(value: Any) -> Any:
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 60:
        # (a huge int cannot be turned into JSON text; its bytes still tell it apart)
        size = value.bit_length() // 8 + 1
        return {"$int": hashlib.sha256(value.to_bytes(size, "big", signed=True)).hexdigest()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (bytes, bytearray)):
        return {"$bytes": hashlib.sha256(bytes(value)).hexdigest()}
    if isinstance(value, datetime):
        return value.isoformat()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            "$type": type(value).__name__,
            **{f.name: _canon(getattr(value, f.name)) for f in dataclasses.fields(value)},
        }
    dump = getattr(value, "model_dump", None)
    if callable(dump):  # a pydantic model (a Manifest)
        return _canon(dump(mode="json"))
    if isinstance(value, dict):
        return {str(k): _canon(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_canon(v) for v in value]
    return {"$repr": repr(value)}


def fingerprint(name: str, arguments: dict[str, Any]) -> str:
    """A digest of the command and its arguments, to tell a repeat from a reuse of a key."""
    text = json.dumps(
        {"command": name, "arguments": _canon(arguments)},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        default=repr,
    )
    # surrogatepass: a fingerprint never fails (a lone surrogate in an argument is the
    # command's to refuse, with a typed error)
    return "sha256:" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def encode(value: Any) -> Any:
    """A command's response as JSON data that `decode` turns back into equal values."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, LedgerError):
        attrs = {k: _canon(v) for k, v in vars(value).items() if k != "message"}
        return {"$error": type(value).__name__, "message": value.message, "attrs": attrs}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {"$view": type(value).__name__, "fields": value.to_dict()}  # type: ignore[attr-defined]
    if isinstance(value, list):
        return {"$list": [encode(v) for v in value]}
    raise TypeError(f"cannot record a response of type {type(value).__name__}")


def _views() -> dict[str, type]:
    from ledger.core import views

    return {
        name: obj
        for name, obj in vars(views).items()
        if isinstance(obj, type) and dataclasses.is_dataclass(obj)
    }


def _build(tp: Any, value: Any) -> Any:
    if value is None:
        return None
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        options = [a for a in typing.get_args(tp) if a is not type(None)]
        return _build(options[0], value) if len(options) == 1 else value
    if origin is list:
        (inner,) = typing.get_args(tp) or (Any,)
        return [_build(inner, v) for v in value]
    if tp is datetime:
        return datetime.fromisoformat(value)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _view(tp, value)
    return value


def _view(cls: type, fields: dict[str, Any]) -> Any:
    hints = typing.get_type_hints(cls)
    return cls(
        **{
            f.name: _build(hints[f.name], fields[f.name])
            for f in dataclasses.fields(cls)
            if f.name in fields
        }
    )


def decode(data: Any) -> Any:
    """Inverse of `encode`."""
    if isinstance(data, dict) and "$list" in data:
        return [decode(v) for v in data["$list"]]
    if isinstance(data, dict) and "$view" in data:
        return _view(_views()[data["$view"]], data["fields"])
    if isinstance(data, dict) and "$error" in data:
        cls = getattr(E, data["$error"], LedgerError)
        err = cls.__new__(cls)
        Exception.__init__(err, data["message"])
        err.message = data["message"]
        for k, v in data["attrs"].items():
            setattr(err, k, v)
        return err
    return data


def run_id_of(result: Any, arguments: dict[str, Any]) -> str | None:
    for candidate in (
        result[0] if isinstance(result, list) and result else result,
        arguments.get("run_id"),
        arguments.get("lease"),
    ):
        run_id = candidate if isinstance(candidate, str) else getattr(candidate, "run_id", None)
        if isinstance(run_id, str):
            return run_id
    return None


# --------------------------------------------------------------------------
# the record
# --------------------------------------------------------------------------
PRUNE_PAGE = 1000


def prune(store: Store, before: datetime) -> int:
    """Delete the records of keys recorded before `before` (aware); return how many.

    A pruned key is forgotten: a repeat after that is a new command. Pages through the
    table in key order, a short transaction per page, comparing times as instants (rows
    carry the store clock's offset, so their text does not sort across offsets)."""
    if not isinstance(before, datetime) or before.tzinfo is None:
        raise InvalidInput("before must be an aware datetime")
    removed = 0
    after = ""
    while True:
        with store.write() as tx:
            rows = tx.fetchall(SQL.sql(tx, "idempotency_page"), (after, PRUNE_PAGE))
            if not rows:
                return removed
            after = rows[-1]["idempotency_key"]
            old = [
                (r["idempotency_key"],)
                for r in rows
                if datetime.fromisoformat(r["recorded_at"]) < before
            ]
            if old:
                tx.executemany(SQL.sql(tx, "idempotency_forget"), old)
                removed += len(old)


def lookup(tx: Tx, key: str) -> dict[str, Any] | None:
    return tx.fetchone(SQL.sql(tx, "idempotency_lookup"), (key,))


def reused(key: str) -> InvalidInput:
    """The refusal of a key recorded for another command or other arguments. It never
    names that command or its arguments: they may be another actor's."""
    return InvalidInput(
        f"idempotency_key {key!r} was already used for another command or other arguments; "
        "a repeat must be the same command with the same arguments, a new command needs a new key"
    )


def matches(row: dict[str, Any], name: str, fp: str) -> bool:
    """Whether a key's record is of this command with these arguments (a repeat)."""
    return bool(row["command"] == name and row["fingerprint"] == fp)


def replay(row: dict[str, Any], key: str, name: str, fp: str) -> Any:
    if not matches(row, name, fp):
        raise reused(key)
    return decode(json.loads(row["response"]))


# Errors a command raises before or at its role check (the rule book's order of checks): they
# answer a reused key first, so a caller who may not make the command learns that (403),
# not that someone else used the key.
BEFORE_AUTHORIZATION = (InvalidInput, E.RunNotFound, E.ItemNotFound, E.NotAuthorized)


def refuse_reuse(call: Callable[[], Any], key: str) -> None:
    """A key recorded for another command or other arguments: the command's own checks
    run first (inside the caller's transaction, which the refusal rolls back, so nothing
    is written); an error up to the role check is raised as it is, anything after it, or
    success, becomes the key's refusal."""
    try:
        call()
    except BEFORE_AUTHORIZATION:
        raise
    except LedgerError:
        pass
    raise reused(key)


def record(tx: Tx, key: str, name: str, fp: str, run_id: str | None, result: Any) -> None:
    # RETURNING, not rowcount: the answer is read back even when statements are pipelined
    inserted = tx.fetchall(
        SQL.sql(tx, "idempotency_record"),
        (
            key,
            name,
            fp,
            run_id,
            json.dumps(encode(result), ensure_ascii=False, separators=(",", ":")),
            tx.now().isoformat(),
        ),
    )
    if len(inserted) != 1:
        raise KeyTaken(key)


# --------------------------------------------------------------------------
# retry
# --------------------------------------------------------------------------
def with_retry(
    call: Callable[[], T], keyed: bool, sleep: Callable[[float], None] = green.sleep
) -> T:
    delays = iter(RETRY_DELAYS)
    while True:
        try:
            return call()
        except ValueError as e:
            raise _typed(e) from None
        except KeyTaken:
            continue  # a concurrent repeat committed first: its record answers us now
        except CommitUncertain:
            if not keyed:
                raise  # it may have been applied: only the key can tell, so the caller decides
            delay = next(delays, None)
            if delay is None:
                raise
            sleep(delay)
        except StoreUnavailable:
            delay = next(delays, None)
            if delay is None:
                raise
            sleep(delay)


def retry_transient(step: Callable[..., T], *args: Any) -> T:
    """Run `step(*args)` (one transaction of an idempotent step, such as one run's reconcile
    pass), repeating it on StoreUnavailable and CommitUncertain: repeating it is always safe."""
    return with_retry(lambda: step(*args), keyed=True)


def _typed(error: ValueError) -> Exception:
    """Python cannot even show an int past its 4,300-digit limit, so a message naming such
    an argument fails while it is made: that is bad input, refused as InvalidInput."""
    if "integer string conversion" not in str(error):
        return error
    return InvalidInput(
        "an argument holds an integer of more than 4300 digits; no argument allows one"
    )


def typed_refusals(fn: Callable[P, T]) -> Callable[P, T]:
    """Wrap a public `Ledger` method that is neither a command nor a retried read, so its
    refusals are typed too (see `_typed`)."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return fn(*args, **kwargs)
        except ValueError as e:
            typed = _typed(e)
            if typed is e:
                raise
            raise typed from None

    return wrapper


def read_command(fn: Callable[P, T]) -> Callable[P, T]:
    """Wrap a `Ledger` read: retried on `StoreUnavailable` (a read never changes anything)."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        if getattr(getattr(args[0], "store", None), "joined", False):
            return fn(*args, **kwargs)  # in the caller's transaction: not repeated here
        return with_retry(lambda: fn(*args, **kwargs), keyed=False)

    return wrapper


__all__ = [
    "PRUNE_PAGE",
    "RETRY_DELAYS",
    "TABLE",
    "KeyTaken",
    "check_key",
    "ddl",
    "decode",
    "encode",
    "fingerprint",
    "lookup",
    "prune",
    "read_command",
    "record",
    "replay",
    "retry_transient",
    "run_id_of",
    "with_retry",
]
