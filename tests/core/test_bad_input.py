"""Bad input is refused clearly, and nothing is written (rule 11 of the rule book).

Every case of the corpus in tests/bad_inputs/ (see its README) runs on memory, SQLite
and PostgreSQL against one ledger per store holding a running run with a live lease:
the call raises the expected typed error, whose message names the field, and the event
count, the transition log and the run's revision are unchanged.

Legal strings (quotes, SQL look-alikes, unicode, separators, the longest ids and
reasons) are stored and read back byte-exact; attempt errors and error messages are
bounded and scrubbed of secret-looking values.
"""

from __future__ import annotations

import dataclasses
import json
import math
import unicodedata
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from ledger import Actor, Lease, Ledger, LedgerError
from ledger.core import errors
from ledger.core.errors import MAX_MESSAGE_BYTES
from ledger.core.redact import MAX_ERROR_BYTES
from tests.support.clock import ManualClock
from tests.support.runs import CONTROLLER, OPERATOR, REVIEWER, SUBMITTER, WORKER, manifest
from tests.support.stores import STORES

CORPUS = Path(__file__).parents[1] / "bad_inputs"
CASES = sorted(
    p.stem
    for p in CORPUS.glob("*.json")
    if p.name not in ("legal_strings.json", "deeply_nested.json", "nan_lease.json")
)
LEGAL = json.loads((CORPUS / "legal_strings.json").read_text())


@dataclasses.dataclass
class World:
    lg: Ledger
    run_id: str
    lease: Lease


@pytest.fixture(scope="module", params=STORES)
def world(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[World]:
    """One ledger per store for the whole corpus: refusals write nothing, so cases can share it."""
    kind = request.param
    cleanup = None
    if kind == "memory":
        dsn = "memory://"
    elif kind == "sqlite":
        dsn = f"sqlite:///{tmp_path_factory.mktemp('bad')}/ledger.db"
    else:
        databases = request.getfixturevalue("pg_databases")
        name, dsn = databases.create()

        def cleanup():
            return databases.drop(name)

    lg = Ledger.open(dsn, clock=ManualClock())
    try:
        run_id = lg.submit(manifest(3), SUBMITTER).run_id
        lg.start(run_id, CONTROLLER)
        (lease,) = lg.claim(run_id, WORKER)
        yield World(lg, run_id, lease)
    finally:
        lg.close()
        if cleanup:
            cleanup()


def generated_manifest(size: int) -> dict[str, Any]:
    """A manifest of about `size` bytes of JSON, every payload under the 64 KiB limit."""
    chunk = "x" * 60_000
    n = size // len(chunk) + 1
    return {
        "source_version": "s",
        "config_version": "c",
        "items": [{"item_id": f"i{k}", "payload": chunk} for k in range(n)],
    }


class _Opaque:
    """An object that is no JSON value."""


def _deep(n: int) -> Any:
    value: Any = 1
    for _ in range(n):
        value = {"a": value}
    return value


def _with_payload(payload: Any) -> dict[str, Any]:
    return {
        "source_version": "s",
        "config_version": "c",
        "items": [{"item_id": "x", "payload": payload}],
    }


# `{"$python": name}`: values JSON cannot spell, as a careless Python caller passes them
PYTHON_VALUES: dict[str, Any] = {
    "nan": lambda: math.nan,
    "inf": lambda: math.inf,
    "-inf": lambda: -math.inf,
    "set": lambda: {1, 2},
    "bytes": lambda: b"\x00\xff",
    "datetime": lambda: datetime(2026, 1, 1, tzinfo=UTC),
    "object": _Opaque,
    "int_and_str_keys": lambda: {1: "a", "1": "b"},
    "int_key": lambda: {1: "a"},
    "deep_1000": lambda: _deep(1000),
    "huge_int": lambda: 10**5000,
    "manifest_nan_payload": lambda: _with_payload({"score": math.nan}),
    "manifest_int_keys_payload": lambda: _with_payload({1: "a", "1": "b"}),
    "manifest_set_payload": lambda: _with_payload({1, 2}),
}


def expand(value: Any, world: World) -> Any:
    if isinstance(value, list):
        return [expand(v, world) for v in value]
    if not isinstance(value, dict):
        return value
    if "$python" in value:
        return PYTHON_VALUES[value["$python"]]()
    if "$actor" in value:
        ident, role = value["$actor"]
        return Actor(ident, role)
    if "$ref" in value:
        return {"run_id": world.run_id, "lease": world.lease}[value["$ref"]]
    if "$lease" in value:
        return dataclasses.replace(world.lease, **value["$lease"])
    if "$repeat" in value:
        text, n = value["$repeat"]
        return text * n
    if "$file" in value:
        return (CORPUS / value["$file"]).read_bytes()
    if "$generate" in value:
        m = generated_manifest(value["bytes"])
        kind = value["$generate"]
        if kind == "manifest_dict":
            return m
        text = json.dumps(m)
        return text if kind == "manifest_text" else text.encode()
    return {k: expand(v, world) for k, v in value.items()}


def snapshot(lg: Ledger, run_id: str) -> tuple[int, int, int, int]:
    with lg.store.read() as tx:
        events = tx.fetchone(f"SELECT COUNT(*) AS n FROM {lg.store.events_table()}")  # noqa: S608 (our own table/column names; values are bound parameters)
        transitions = tx.fetchone("SELECT COUNT(*) AS n FROM lg_transitions")
        runs = tx.fetchone("SELECT COUNT(*) AS n FROM lg_runs")
    assert events is not None and transitions is not None and runs is not None
    return int(events["n"]), int(transitions["n"]), int(runs["n"]), lg.status(run_id).revision


def test_the_corpus_is_big_enough_and_well_formed() -> None:
    assert len(CASES) >= 30
    calls = set()
    for name in CASES:
        case = json.loads((CORPUS / f"{name}.json").read_text())
        assert set(case) <= {"about", "call", "args", "kwargs", "expect"}, name
        assert callable(getattr(Ledger, case["call"], None)), name
        assert issubclass(getattr(errors, case["expect"]["error"]), LedgerError), name
        assert case["expect"]["mentions"], f"{name}: say what the message must name"
        calls.add(case["call"])
    assert {"submit", "claim", "accept", "amend", "skip", "fail", "start"} <= calls


@pytest.mark.parametrize("name", CASES)
def test_bad_input_is_refused_and_nothing_is_written(world: World, name: str) -> None:
    case = json.loads((CORPUS / f"{name}.json").read_text())
    expect = case["expect"]
    args = expand(case["args"], world)
    kwargs = expand(case.get("kwargs", {}), world)
    before = snapshot(world.lg, world.run_id)
    with pytest.raises(LedgerError) as info:
        getattr(world.lg, case["call"])(*args, **kwargs)
    err = info.value
    assert isinstance(err, getattr(errors, expect["error"])), f"{type(err).__name__}: {err}"
    if "field" in expect:
        assert getattr(err, "field", None) == expect["field"], err.message
    for text in expect["mentions"]:
        assert text in err.message, f"{text!r} not in {err.message!r}"
    assert len(err.message.encode()) <= MAX_MESSAGE_BYTES
    assert snapshot(world.lg, world.run_id) == before, "a refused command wrote something"
    # the lease the corpus uses is still live: nothing touched it
    assert world.lg.item(world.run_id, "i0").lease == dataclasses.replace(world.lease, payload=None)


# --------------------------------------------------------------------------
# legal strings come back byte-exact
# --------------------------------------------------------------------------
def _as_id(entry: dict[str, Any], k: int) -> str:
    """The id a legal string gives: itself, its NFC form, or (refused as an id) a stand-in."""
    rule = entry.get("id")
    if rule == "refused":
        return f"id-{k}"
    if rule == "nfc":
        return unicodedata.normalize("NFC", entry["text"])
    return str(entry["text"])


def test_legal_strings_are_stored_and_returned_byte_exact(lg: Ledger, clock: ManualClock) -> None:
    texts = [s["text"] for s in LEGAL["strings"]]
    ids = [_as_id(s, k) for k, s in enumerate(LEGAL["strings"])]
    m = {
        "source_version": ids[1],
        "config_version": ids[2][:200],
        "scope": " | ".join(texts)[:2000],
        "items": [
            {"item_id": i, "payload": {"text": t, "list": [t, {t: t}]}}
            for i, t in zip(ids, texts, strict=True)
        ],
    }
    run_id = lg.submit(m, SUBMITTER).run_id
    st = lg.status(run_id)
    assert (st.source_version, st.config_version, st.scope) == (
        m["source_version"],
        m["config_version"],
        m["scope"],
    )
    items = lg.items(run_id)
    assert [i.item_id for i in items] == ids
    assert [i.item_id.encode() for i in items] == [t.encode() for t in ids]
    assert [i.payload for i in items] == [it["payload"] for it in m["items"]]

    lg.start(run_id, CONTROLLER)
    leases = lg.claim(run_id, WORKER, limit=len(texts))
    assert [(le.item_id, le.payload) for le in leases] == [
        (it["item_id"], it["payload"]) for it in m["items"]
    ]
    for k, (lease, t) in enumerate(zip(leases, texts, strict=True)):
        i = ids[k]
        if k % 3 == 0:
            lg.accept(lease, evidence={"receipt": t, t: [t]}, stage=i)
        elif k % 3 == 1:
            lg.reject(lease, i, detail=t, stage=i)
        else:
            lg.fail_attempt(lease, t, stage=i)
            lg.skip(run_id, i, OPERATOR, t)
    hist = {(t.item_id, t.command): t for t in lg.history(run_id) if t.item_id is not None}
    for k, t in enumerate(texts):
        i = ids[k]
        if k % 3 == 0:
            assert hist[(i, "accept")].evidence["evidence"] == {"receipt": t, t: [t]}
            assert hist[(i, "accept")].evidence["stage"] == i
        elif k % 3 == 1:
            ev = hist[(i, "reject")]
            assert (ev.reason, ev.evidence["rule"], ev.evidence["detail"]) == (i, i, t)
        else:
            assert hist[(i, "fail_attempt")].evidence["error"] == t
            assert hist[(i, "skip")].reason == t
            assert lg.item(run_id, i).last_error == t
    attempts = {a.item_id: a for a in lg.attempts(run_id)}
    for k, t in enumerate(texts):
        assert attempts[ids[k]].stage == ids[k]
        if k % 3 == 2:
            assert attempts[ids[k]].error == t

    for entry in LEGAL["reasons_only"]:
        reason = entry["text"]
        lg.pause(run_id, OPERATOR, reason)
        assert lg.history(run_id)[-1].reason == reason
        summary = lg.status(run_id).summary
        assert len(summary.encode()) <= 1024
        assert reason.startswith(summary.removesuffix("..."))
        lg.resume(run_id, OPERATOR, reason="back to work")


# --------------------------------------------------------------------------
# error text: bounded and scrubbed
# --------------------------------------------------------------------------
SECRETS = ["hunter2", "eyJhbGciOiJIUzI1NiJ9.payload.sig", "pw-123", "sk_live_ABCDEFGHIJKLMNOP"]
NOISY = (
    "connect to postgresql://bob:hunter2@db.internal:5432/prod failed; "
    "headers: Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.payload.sig; password=pw-123 "
    "api_key=sk_live_ABCDEFGHIJKLMNOP; "
)


def test_attempt_errors_are_scrubbed_and_bounded(lg: Ledger) -> None:
    run_id = lg.submit(manifest(1, max_attempts=2), SUBMITTER).run_id
    lg.start(run_id, CONTROLLER)
    (lease,) = lg.claim(run_id, WORKER)
    lg.fail_attempt(lease, NOISY + "\u00e9" * 5000)
    (attempt,) = lg.attempts(run_id)
    stored = [
        attempt.error,
        lg.item(run_id, "i0").last_error,
        next(t for t in lg.history(run_id) if t.command == "fail_attempt").evidence["error"],
    ]
    for text in stored:
        assert text is not None
        assert len(text.encode()) <= MAX_ERROR_BYTES
        assert not [s for s in SECRETS if s in text], text[:300]
        assert text.startswith("connect to postgresql://bob:***@db.internal:5432/prod failed")
        assert "\ufffd" not in text  # cut on a character boundary
    assert len(set(stored)) == 1


def test_error_messages_are_scrubbed_and_bounded(lg: Ledger) -> None:
    run_id = lg.submit(manifest(2), SUBMITTER).run_id
    probes = [
        lambda: lg.start("postgresql://bob:hunter2@db/x", CONTROLLER),
        lambda: lg.skip(run_id, "password=pw-123", OPERATOR, "x"),
        lambda: lg.skip(run_id, "Bearer eyJhbGciOiJIUzI1NiJ9.payload.sig", OPERATOR, "x"),
        lambda: lg.release(run_id, "api_key=sk_live_ABCDEFGHIJKLMNOP", REVIEWER, "x"),
        lambda: lg.status("postgresql://bob:hunter2@db/x"),
    ]
    for probe in probes:
        with pytest.raises(LedgerError) as info:
            probe()
        message = info.value.message
        assert not [s for s in SECRETS if s in message], message
        assert not [s for s in SECRETS if s in str(info.value)]
        assert not [s for s in SECRETS if s in json.dumps(info.value.to_dict())]
    # a long refusal (NotComplete naming many long ids) stays bounded
    long_ids = [{"item_id": f"{k:03d}" + "\u00e9" * 190} for k in range(30)]
    big = lg.submit(
        {"source_version": "s", "config_version": "c", "items": long_ids}, SUBMITTER
    ).run_id
    lg.start(big, CONTROLLER)
    for it in long_ids:
        lg.skip(big, it["item_id"], OPERATOR, "not needed")
    with pytest.raises(LedgerError) as info:
        lg.complete(big, CONTROLLER)
    assert len(info.value.message.encode()) <= MAX_MESSAGE_BYTES
