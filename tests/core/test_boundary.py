"""The input boundary (rules 11 and 17 of the rule book): strict JSON, the id rule, storable
free text, and a Worker that never loses a finished outcome.

Each test names the harm it rules out: without the boundary NaN evidence is stored, a
lone surrogate in a handler's error kills the Worker, lookalike ids make distinct
items, ...
"""

from __future__ import annotations

import contextlib
import json
import math
import unicodedata
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from ledger import Actor, InvalidInput, Ledger, ManifestInvalid, RunNotFound
from ledger.core.validation import check_identifier, plain_json, safe_text, strict_loads
from ledger.worker.worker import Accepted, Quarantine, Worker
from tests.support.drive import event_count
from tests.support.runs import CONTROLLER, OPERATOR, SUBMITTER, WORKER, manifest, running


def _all_reads_are_strict_json(lg: Ledger, run_id: str) -> None:
    """Every Python read of the run gives documents that strict JSON can carry."""
    docs: list[Any] = [lg.status(run_id).to_dict()]
    docs += [i.to_dict() for i in lg.items(run_id)]
    docs += [a.to_dict() for a in lg.attempts(run_id)]
    docs += [t.to_dict() for t in lg.history(run_id)]
    docs += [t.to_dict() for t in lg.audit(run_id=run_id)]
    for doc in docs:
        text = json.dumps(doc, allow_nan=False, ensure_ascii=False)
        text.encode("utf-8")  # no lone surrogate
        strict_loads(text, "read")


# -- a poisoned event --------------------------------------------------------------


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_evidence_is_refused_and_nothing_written(lg: Ledger, bad: float) -> None:
    run_id = running(lg, 3)
    (lease,) = lg.claim(run_id, WORKER)
    before = event_count(lg)
    with pytest.raises(InvalidInput, match="NaN and Infinity"):
        lg.accept(lease, evidence={"score": bad})
    with pytest.raises(InvalidInput, match="NaN and Infinity"):
        lg.accept(lease, evidence={"scores": [1.0, {"deep": bad}]})
    assert event_count(lg) == before
    lg.accept(lease, evidence={"score": 0.5})
    _all_reads_are_strict_json(lg, run_id)


def test_nan_payload_at_submit_is_refused_not_stored_as_null(lg: Ledger) -> None:
    m = manifest(2)
    m["items"][1]["payload"] = {"x": math.nan}
    with pytest.raises(ManifestInvalid) as info:
        lg.submit(m, SUBMITTER)
    assert info.value.field == "items.1.payload"
    text = json.dumps(manifest(1)).replace('"payload": {"n": 0}', '"payload": NaN')
    with pytest.raises(ManifestInvalid, match="NaN"):
        lg.submit(text, SUBMITTER)
    assert lg.runs() == []


def test_duplicate_keys_in_json_text_are_refused(lg: Ledger) -> None:
    text = '{"source_version": "a", "source_version": "b", "config_version": "c", "items": [{"item_id": "x"}]}'
    with pytest.raises(ManifestInvalid, match="appears twice"):
        lg.submit(text, SUBMITTER)
    with pytest.raises(ManifestInvalid, match="appears twice"):
        lg.submit(text.encode(), SUBMITTER)
    assert lg.runs() == []


# -- untyped exceptions from the public API ----------------------------------------


class _Thing:
    pass


def _deep(n: int) -> Any:
    value: Any = 1
    for _ in range(n):
        value = {"a": value}
    return value


BAD_EVIDENCE = [
    {"s": {1, 2}},
    {"b": b"bytes"},
    {"t": datetime(2026, 1, 1, tzinfo=UTC)},
    {"o": _Thing()},
    {1: "a", "1": "b"},
    {1: "a"},
    {("t",): 1},
    {"s": "lone \ud800 surrogate"},
    {"\udc80": 1},
    _deep(1000),
    {"big": 10**5000},
]


@pytest.mark.parametrize("evidence", BAD_EVIDENCE, ids=range(len(BAD_EVIDENCE)))
def test_bad_evidence_is_invalid_input(lg: Ledger, evidence: Any) -> None:
    run_id = running(lg, 3)
    (lease,) = lg.claim(run_id, WORKER)
    before = event_count(lg)
    with pytest.raises(InvalidInput):
        lg.accept(lease, evidence=evidence)
    assert event_count(lg) == before


@pytest.mark.parametrize("payload", BAD_EVIDENCE, ids=range(len(BAD_EVIDENCE)))
def test_bad_payloads_are_manifest_invalid(lg: Ledger, payload: Any) -> None:
    m = manifest(1)
    m["items"][0]["payload"] = payload
    with pytest.raises(ManifestInvalid):
        lg.submit(m, SUBMITTER)
    assert lg.runs() == []


def test_surrogates_in_free_text_never_escape_as_unicode_errors(lg: Ledger) -> None:
    run_id = running(lg, 3, max_attempts=5)
    m = manifest(1)
    m["scope"] = "bad \ud800 scope"
    with pytest.raises(ManifestInvalid):
        lg.submit(m, SUBMITTER)
    with pytest.raises(InvalidInput):
        lg.pause(run_id, OPERATOR, "reason \udc80")
    (lease,) = lg.claim(run_id, WORKER)
    # an attempt's error is free text: the surrogate is escaped, never dropped
    item = lg.fail_attempt(lease, "cannot open /data/caf\udce9.txt")
    assert item.state == "retryable"
    (attempt,) = lg.attempts(run_id, "i0")
    assert attempt.error == "cannot open /data/caf\\udce9.txt"
    _all_reads_are_strict_json(lg, run_id)


@pytest.mark.parametrize(
    "when",
    [
        datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=14))),
        datetime.max.replace(tzinfo=timezone(timedelta(hours=-14))),
    ],
    ids=["first", "last"],
)
def test_times_at_the_calendars_ends_are_read_not_overflow(lg: Ledger, when: datetime) -> None:
    run_id = running(lg, 3)
    assert list(lg.audit(since=when)) == [] or when.year == 1
    assert isinstance(list(lg.audit(until=when)), list)
    with contextlib.suppress(RunNotFound):  # "did not exist yet" at the first instant
        lg.status_at(run_id, when)


# -- lookalike ids -----------------------------------------------------------------


def test_nfc_and_nfd_spellings_are_one_id(lg: Ledger) -> None:
    nfd = unicodedata.normalize("NFD", "café")
    nfc = unicodedata.normalize("NFC", "café")
    assert nfd != nfc
    m = manifest(0)
    m["items"] = [{"item_id": nfd}]
    run_id = lg.submit(m, SUBMITTER).run_id
    assert [i.item_id for i in lg.items(run_id)] == [nfc]
    assert lg.item(run_id, nfd).item_id == nfc
    m["items"] = [{"item_id": nfd}, {"item_id": nfc}]
    with pytest.raises(ManifestInvalid, match="duplicate"):
        lg.submit(m, SUBMITTER)
    actor = Actor(unicodedata.normalize("NFD", "josé"), "operator")
    lg.pause(lg.start(run_id, CONTROLLER).run_id, actor, "x")
    assert lg.history(run_id)[-1].actor_id == unicodedata.normalize("NFC", "josé")


LOOKALIKES = {
    "zero width space": "item\u200b",
    "zero width joiner": "a\u200db",
    "right-to-left override": "\u202eexe.txt",
    "bidi isolate": "a\u2066b",
    "BOM": "\ufeffitem",
    "C1 control NEL": "item\u0085",
    "C1 control CSI": "\u009bitem",
    "unassigned": "item\u0378",
    "line separator": "a\u2028b",
    "lone surrogate": "a\ud800",
}


@pytest.mark.parametrize("ident", LOOKALIKES.values(), ids=LOOKALIKES.keys())
def test_ids_with_invisible_or_unassigned_characters_are_refused(lg: Ledger, ident: str) -> None:
    m = manifest(1)
    m["items"][0]["item_id"] = ident
    with pytest.raises(ManifestInvalid) as info:
        lg.submit(m, SUBMITTER)
    assert info.value.field == "items.0.item_id"
    run_id = lg.submit(manifest(1), SUBMITTER).run_id
    with pytest.raises(InvalidInput, match=r"actor\.id"):
        lg.start(run_id, Actor(ident, "controller"))
    with pytest.raises(InvalidInput, match="item_id"):
        lg.item(run_id, ident)
    with pytest.raises(InvalidInput, match="run_id"):
        lg.status(run_id + ident)


def test_id_rule_units() -> None:
    assert check_identifier("plain-id_1.2", "x") == "plain-id_1.2"
    assert check_identifier("漢字かなカナ", "x") == "漢字かなカナ"
    assert check_identifier("e\u0301", "x") == "\u00e9"
    for bad in ["", "a" * 201, "tab\there", "\x7f", 5, None]:
        with pytest.raises(InvalidInput):
            check_identifier(bad, "x")


def test_strict_json_units() -> None:
    assert plain_json({"a": (1, 2)}, "v")[0] == {"a": [1, 2]}
    assert plain_json({"a": 1.5, "b": None, "c": [True]}, "v")[1] == '{"a":1.5,"b":null,"c":[true]}'
    for text in [
        "NaN",
        '{"a": Infinity}',
        "[-Infinity]",
        '{"a":1,"a":2}',
        '"\\ud800"',
        "[" * 70 + "]" * 70,
    ]:
        with pytest.raises(InvalidInput):
            strict_loads(text, "v")
    with pytest.raises(InvalidInput, match="UTF-8"):
        strict_loads(b'"\xff"', "v")
    cyclic: list[Any] = []
    cyclic.append(cyclic)
    with pytest.raises(InvalidInput):
        plain_json(cyclic, "v")
    assert safe_text("a\udc80b\x00") == "a\\udc80b\\x00"
    assert safe_text(b"x") == "b'x'"


# -- a Worker that loses its whole batch -------------------------------------------


def test_worker_records_every_outcome_whatever_the_handler_does(lg: Ledger) -> None:
    run_id = running(lg, 8, max_attempts=1)

    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no text")

    def handle(lease: Any) -> Any:
        n = lease.payload["n"]
        if n == 1:
            raise OSError(f"cannot open /data/f\udcff{n}.bin")  # non-UTF-8 file name
        if n == 2:
            return Accepted(evidence={"score": math.nan})  # refused by the ledger
        if n == 3:
            raise Unprintable()
        if n == 4:
            return Quarantine(error="bad \ud800 input")
        if n == 5:
            return "not an outcome"
        if n == 6:
            return Accepted(evidence={"n": {1, 2}})
        return Accepted(evidence={"n": n})

    summary = Worker(lg, run_id, handle, concurrency=4, prefetch=8).run()
    items = {i.item_id: i for i in lg.items(run_id)}
    assert {k: v.state for k, v in items.items()} == {
        "i0": "accepted",
        "i1": "quarantined",
        "i2": "quarantined",
        "i3": "quarantined",
        "i4": "quarantined",
        "i5": "quarantined",
        "i6": "quarantined",
        "i7": "accepted",
    }
    assert items["i1"].last_error is not None and "\\udcff1.bin" in items["i1"].last_error
    assert items["i4"].last_error == "bad \\ud800 input"
    assert summary.accepted == 2
    assert summary.claimed == 8
    _all_reads_are_strict_json(lg, run_id)


def test_a_ledger_error_while_recording_is_reported_per_item(lg: Ledger) -> None:
    run_id = running(lg, 3)
    real_record = lg.record
    real_accept = lg.accept

    def broken_record(outcomes: Any) -> Any:
        raise RuntimeError("a bug in record")

    def flaky_accept(lease: Any, evidence: Any = None, stage: Any = None) -> Any:
        if lease.item_id == "i1":
            raise UnicodeEncodeError("utf-8", "x", 0, 1, "boom")
        return real_accept(lease, evidence=evidence, stage=stage)

    lg.record = broken_record  # type: ignore[method-assign]
    lg.accept = flaky_accept  # type: ignore[method-assign]
    try:
        summary = Worker(lg, run_id, lambda lease: Accepted(), concurrency=1, prefetch=3).run()
    finally:
        lg.record = real_record  # type: ignore[method-assign]
        lg.accept = real_accept  # type: ignore[method-assign]
    states = {i.item_id: i.state for i in lg.items(run_id)}
    assert states["i0"] == "accepted" and states["i2"] == "accepted"
    # i1's outcome could not be recorded: a failed attempt says why, and the summary too
    # (every attempt of it fails the same way, so it ends quarantined, never lost)
    assert states["i1"] in ("retryable", "quarantined")
    error = lg.item(run_id, "i1").last_error
    assert error is not None and "recording the handler's outcome failed" in error
    assert "UnicodeEncodeError" in error
    assert summary.accepted == 2
