"""Export, import and copy: round trips between stores keep stream versions,
hashes, heads and projections; a damaged file is refused with its position and writes
nothing; importing twice changes nothing."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from ledger import Ledger
from ledger.core.errors import RunNotFound
from ledger.projections.checksums import checksums
from ledger.service.copy import copy_ledger
from ledger.stores.raw import append_raw, max_position
from ledger.transfer import imports as transfer
from ledger.transfer.history_file import ImportRefused
from tests.support.runs import CONTROLLER, SUBMITTER, WORKER, manifest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import make_ledger


def _state(dsn: str) -> tuple[str, dict[str, str], int]:
    """(verify heads, projection checksums, events) of a ledger whose verify is clean."""
    with Ledger.open(dsn) as lg:
        report = lg.verify()
        assert report.ok, report.problems[:5]
        with lg.store.read() as tx:
            sums = checksums(tx)
        return report.heads, sums, report.events


def _export(dsn: str, **kw: Any) -> str:
    out = io.StringIO()
    with Ledger.open(dsn) as lg:
        lg.export(out, **kw)
    return out.getvalue()


def _demo(dsn: str) -> None:
    from ledger.cli.demo import run_demo

    run_demo(dsn, items=6, workers=2, seed=3, as_json=True)


def test_demo_round_trip_sqlite_postgres_sqlite(
    tmp_path: Path, pg_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    first = f"sqlite:///{tmp_path}/first.db"
    back = f"sqlite:///{tmp_path}/back.db"
    _demo(first)
    capsys.readouterr()
    before = _state(first)
    to_pg = copy_ledger(first, pg_dsn)
    assert to_pg.verify_ok and to_pg.events == before[2] and to_pg.digest == before[0]
    assert _state(pg_dsn) == before
    copy_ledger(pg_dsn, back)
    assert _state(back) == before
    # a second copy is a no-op: every event is held already, nothing changes
    again = copy_ledger(first, back)
    assert (again.events, again.skipped) == (0, before[2])
    assert _state(back) == before


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_large_round_trip_sqlite_postgres_sqlite(tmp_path: Path, pg_dsn: str) -> None:
    first = f"sqlite:///{tmp_path}/big.db"
    back = f"sqlite:///{tmp_path}/back.db"
    make_ledger.fill(first, 100_000, items_per_run=2_000, batch=250, seed=4, quiet=True)
    with Ledger.open(first) as lg, lg.store.read() as tx:
        sums = checksums(tx)
    to_pg = copy_ledger(first, pg_dsn, verify=False)
    # the file's digest is the source's heads (what its `verify --heads` prints); the
    # target's verify recomputes every hash from the events and ends at the same heads
    before = (to_pg.digest, sums, to_pg.events)
    assert to_pg.events >= 100_000
    assert _state(pg_dsn) == before
    copy_ledger(pg_dsn, back, verify=False)
    assert _state(back) == before


def test_import_into_a_ledger_with_history_renumbers_positions_but_keeps_streams(
    tmp_path: Path, store_dsn: str
) -> None:
    source = f"sqlite:///{tmp_path}/source.db"
    with Ledger.open(source) as lg:
        run = lg.submit(manifest(3), SUBMITTER).run_id
        lg.start(run, CONTROLLER)
        lease = lg.claim(run, WORKER)[0]
        lg.accept(lease)
        story = [(t.item_id, t.to_state, t.revision) for t in lg.history(run)]
    text = _export(source, runs=[run])
    with Ledger.open(store_dsn) as target:
        other = target.submit(manifest(2), SUBMITTER).run_id  # positions 1.. are taken
        summary = target.import_file(io.StringIO(text))
        assert summary.verify_ok, summary.problems
        assert summary.runs == [run]
        assert target.status(run).counts["accepted"] == 1
        assert [(t.item_id, t.to_state, t.revision) for t in target.history(run)] == story
        assert target.status(other).state == "queued"
        # same stream versions and hashes: the run's own export is the same file, bar positions
        again = io.StringIO()
        target.export(again, runs=[run])
    mine = [json.loads(x) for x in text.splitlines()]
    theirs = [json.loads(x) for x in again.getvalue().splitlines()]

    def strip(d):
        return {k: v for k, v in d.items() if k not in ("position", "heads")}

    assert [strip(d) for d in mine] == [strip(d) for d in theirs]
    assert mine[-1]["digest"] == theirs[-1]["digest"]


def _lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def _edit_state(line: str) -> str:
    doc = json.loads(line)
    doc["state"] = doc["state"].replace('"actor_id":"', '"actor_id":"x', 1)
    assert doc["state"] != json.loads(line)["state"]
    return json.dumps(doc) + "\n"


def _damaged() -> dict[str, Any]:
    def edited(lines: list[str]) -> tuple[list[str], int]:
        k = 5
        return [*lines[:k], _edit_state(lines[k]), *lines[k + 1 :]], json.loads(lines[k])[
            "position"
        ]

    def missing(lines: list[str]) -> tuple[list[str], int]:
        docs = [json.loads(x) for x in lines[:-1]]

        def later(k: int) -> list[dict[str, Any]]:
            return [d for d in docs[k + 1 :] if d["stream"] == docs[k]["stream"]]

        # an event in the middle of its stream (after its first, before its next)
        k = next(k for k in range(len(docs)) if docs[k]["version"] > 1 and later(k))
        return lines[:k] + lines[k + 1 :], later(k)[0]["position"]  # the next one is named

    def first_event_missing(lines: list[str]) -> tuple[list[str], int]:
        docs = [json.loads(x) for x in lines[:-1]]
        # an item stream's first event (its claim): the stream now starts at its accept
        k = next(k for k, d in enumerate(docs) if d["version"] == 1 and "Item." in d["topic"])
        after = next(d for d in docs[k + 1 :] if d["stream"] == docs[k]["stream"])
        return lines[:k] + lines[k + 1 :], after["position"]

    def reordered(lines: list[str]) -> tuple[list[str], int]:
        k = 4
        return (
            [*lines[:k], lines[k + 1], lines[k], *lines[k + 2 :]],
            json.loads(lines[k])["position"],
        )

    def bad_digest(lines: list[str]) -> tuple[list[str], int | None]:
        doc = json.loads(lines[-1])
        doc["digest"] = "0" * 32
        return [*lines[:-1], json.dumps(doc) + "\n"], None

    def last_event_missing(lines: list[str]) -> tuple[list[str], int]:
        return lines[:-2] + lines[-1:], json.loads(lines[-2])["position"]

    def truncated(lines: list[str]) -> tuple[list[str], None]:
        return lines[:-1], None

    return {
        "edited": edited,
        "missing": missing,
        "first_event_missing": first_event_missing,
        "reordered": reordered,
        "bad_digest": bad_digest,
        "last_event_missing": last_event_missing,
        "truncated": truncated,
    }


@pytest.mark.parametrize("page", [None, 3], ids=["one page", "pages of 3"])
@pytest.mark.parametrize("damage", sorted(_damaged()))
def test_a_damaged_file_is_refused_with_its_position_and_nothing_is_written(
    tmp_path: Path,
    store_dsn: str,
    damage: str,
    page: int | None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if page is not None:
        # the damage is found after earlier pages were appended and projected: the one
        # transaction still writes nothing
        monkeypatch.setattr(transfer, "IMPORT_PAGE", page)
    appended: list[int] = []

    def counted(tx: Any, events: Any, *args: Any, **kwargs: Any) -> list[int]:
        appended.append(len(events))
        return append_raw(tx, events, *args, **kwargs)

    monkeypatch.setattr(transfer, "append_raw", counted)
    source = f"sqlite:///{tmp_path}/source.db"
    with Ledger.open(source) as lg:
        run = lg.submit(manifest(4), SUBMITTER).run_id
        lg.start(run, CONTROLLER)
        for lease in lg.claim(run, WORKER, limit=4):
            lg.accept(lease)
        lg.complete(run, CONTROLLER)
    lines, position = _damaged()[damage](_lines(_export(source)))
    with Ledger.open(store_dsn) as target:
        with pytest.raises(ImportRefused) as info:
            target.import_file(io.StringIO("".join(lines)))
        if position is not None and info.value.rule is not None:
            # pages projected before the reader reaches the break: an event the missing one
            # leaves without its cause breaks a rule of the rule checker first
            assert damage in ("missing", "first_event_missing") and page is not None
            assert info.value.position is not None and info.value.position < position
        elif position is not None:
            assert info.value.position == position
            assert f"position {position}" in str(info.value)
        if page is not None and damage not in ("missing", "first_event_missing"):
            assert sum(appended) >= page  # refused after a page was written
        with target.store.read() as tx:
            assert max_position(tx) == 0
        assert target.runs() == []
        with pytest.raises(RunNotFound):
            target.status(run)


def _rehashed(lines: list[str], k: int, topic: str | None, state: bytes) -> list[str]:
    """The file with event line k given another topic and state, every hash chain and the
    closing line computed again over the new bytes: a file that checks out, as one made
    by a faulty or hostile exporter would."""
    from ledger.transfer.history_file import Chains, event_line, parse_event

    chains = Chains()
    out = []
    for n, line in enumerate(lines[:-1]):
        e = parse_event(json.loads(line), n + 1)
        if n == k:
            e = e._replace(topic=topic or e.topic, state=state)
        e = e._replace(hash=None)  # the chain computes it
        assert chains.add(e) is None
        out.append(event_line(e._replace(hash=chains.heads[e.stream][1])) + "\n")
    return [*out, json.dumps(chains.closing(complete=True)) + "\n"]


def _claim_state(doc: dict[str, Any]) -> str:
    assert '"command":"claim"' in doc["state"]
    return str(doc["state"])


_UNREADABLE: dict[str, Any] = {
    "not JSON": lambda doc: (None, b'{"timestamp": 5, not json'),
    "NaN in the evidence": lambda doc: (
        None,
        _claim_state(doc).replace('"attempt":1', '"attempt":NaN').encode(),
    ),
    "a duplicate key behind an escape": lambda doc: (
        None,
        _claim_state(doc).replace('"role":"worker"', '"role":"worker","role":"\\u0077"').encode(),
    ),
    "not UTF-8": lambda doc: (None, b'{"timestamp": "\xff\xfe"}'),
    "an unknown topic": lambda doc: ("ledger.domain:Item.Vanished", doc["state"].encode()),
    "a field missing": lambda doc: (
        None,
        _claim_state(doc).replace('"to_state":"in_progress",', "").encode(),
    ),
}


@pytest.mark.parametrize("bad", sorted(_UNREADABLE))
def test_a_file_that_checks_out_over_bytes_the_ledger_cannot_read_is_refused(
    tmp_path: Path, store_dsn: str, bad: str
) -> None:
    """The hashes and the closing line are right, but an event's bytes are not an event
    the ledger can take: a typed refusal naming it where one event is at fault, and
    nothing written."""
    source = f"sqlite:///{tmp_path}/source.db"
    with Ledger.open(source) as lg:
        run = lg.submit(manifest(3), SUBMITTER).run_id
        lg.start(run, CONTROLLER)
        for lease in lg.claim(run, WORKER, limit=3):
            lg.accept(lease)
    lines = _lines(_export(source))
    k = next(n for n, line in enumerate(lines) if '\\"command\\":\\"claim\\"' in line)
    doc = json.loads(lines[k])
    topic, state = _UNREADABLE[bad](doc)
    forged = _rehashed(lines, k, topic, state)
    with Ledger.open(store_dsn) as target:
        with pytest.raises(ImportRefused) as info:
            target.import_file(io.StringIO("".join(forged)))
        if bad != "a field missing":  # found by the replay, which names the page
            assert info.value.position == doc["position"]
            assert f"position {doc['position']}" in str(info.value)
        assert "nothing imported" in str(info.value)
        with target.store.read() as tx:
            assert max_position(tx) == 0
        assert target.runs() == []
        with pytest.raises(RunNotFound):
            target.status(run)


def test_a_run_held_with_other_events_is_refused_and_nothing_is_written(
    tmp_path: Path,
) -> None:
    a, b = f"sqlite:///{tmp_path}/a.db", f"sqlite:///{tmp_path}/b.db"
    with Ledger.open(a) as lg:
        run = lg.submit(manifest(2), SUBMITTER).run_id
        lg.start(run, CONTROLLER)
    text = _export(a)
    with Ledger.open(b) as lg:
        lg.import_file(io.StringIO(text))
        lg.fail(run, CONTROLLER, "diverge", transient=True)  # b's run moves on
    with Ledger.open(a) as lg:
        lg.cancel(run, SUBMITTER, "another future")  # a's run moves elsewhere
    with Ledger.open(b) as lg, lg.store.read() as tx:
        top = max_position(tx)
    with Ledger.open(b) as lg:
        with pytest.raises(ImportRefused, match="other content"):
            lg.import_file(io.StringIO(_export(a)))
        with lg.store.read() as tx:
            assert max_position(tx) == top
        assert lg.status(run).state == "failed"


def test_the_cli_exports_imports_and_copies(tmp_path: Path, pg_dsn: str) -> None:
    from ledger.cli.entry import main

    first = f"sqlite:///{tmp_path}/first.db"
    with Ledger.open(first) as lg:
        run = lg.submit(manifest(2), SUBMITTER).run_id
        lg.start(run, CONTROLLER)
    heads = _state(first)[0]
    path = tmp_path / "h.jsonl"
    assert main(["--dsn", first, "export", "--to", str(path), "--no-progress"]) == 0
    assert json.loads(path.read_text().splitlines()[-1])["digest"] == heads
    second = f"sqlite:///{tmp_path}/second.db"
    assert main(["--dsn", second, "import", str(path), "--no-progress"]) == 0
    assert _state(second)[0] == heads
    assert main(["copy", "--from", second, "--to", pg_dsn, "--no-progress"]) == 0
    assert _state(pg_dsn)[0] == heads


def test_an_export_since_a_time_never_adds_to_the_runs_a_copy_holds(
    tmp_path: Path, clock: Any
) -> None:
    a, b = f"sqlite:///{tmp_path}/a.db", f"sqlite:///{tmp_path}/b.db"
    with Ledger.open(a, clock=clock) as lg:
        run = lg.submit(manifest(3), SUBMITTER).run_id
        lg.start(run, CONTROLLER)
    first = _export(a)
    with Ledger.open(b) as lg:
        lg.import_file(io.StringIO(first))
    clock.advance(60)
    cut = clock()
    with Ledger.open(a, clock=clock) as lg:
        for lease in lg.claim(run, WORKER, limit=3):
            lg.accept(lease)
        lg.complete(run, CONTROLLER)
        other = lg.submit(manifest(1), SUBMITTER).run_id
    later = _export(a, since=cut)
    assert json.loads(later.splitlines()[-1])["open"]  # streams taken up in the middle
    # into a ledger without the earlier events: refused, nothing written
    with Ledger.open(f"sqlite:///{tmp_path}/empty.db") as lg:
        with pytest.raises(ImportRefused, match="earlier"):
            lg.import_file(io.StringIO(later))
        assert lg.runs() == []
    # into the copy that holds the run's earlier events: an import adds runs, never events
    # to a run the ledger holds (it would write what no command of this ledger wrote)
    before = _state(b)
    with Ledger.open(b) as lg:
        with pytest.raises(ImportRefused, match=f"run {run}, which this ledger holds"):
            lg.import_file(io.StringIO(later))
        assert lg.status(run).state == "running"
        with pytest.raises(RunNotFound):
            lg.status(other)
    assert _state(b) == before


def test_the_cli_imports_from_stdin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ledger.cli.entry import main

    a = f"sqlite:///{tmp_path}/a.db"
    with Ledger.open(a) as lg:
        lg.submit(manifest(2), SUBMITTER)
    monkeypatch.setattr(sys, "stdin", io.StringIO(_export(a)))
    b = f"sqlite:///{tmp_path}/b.db"
    assert main(["--dsn", b, "import", "-", "--no-progress"]) == 0
    assert _state(b)[0] == _state(a)[0]


def test_an_export_reads_past_gaps_in_the_positions(
    tmp_path: Path, store_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # pages are ranges of positions: a range with no event in it must not end the export
    source = f"sqlite:///{tmp_path}/source.db"
    with Ledger.open(source) as lg:
        first = lg.submit(manifest(4), SUBMITTER).run_id
        lg.start(first, CONTROLLER)
        for lease in lg.claim(first, WORKER, limit=4):
            lg.accept(lease)
        second = lg.submit(manifest(2), SUBMITTER).run_id
        lg.start(second, CONTROLLER)
        lease = lg.claim(second, WORKER)[0]
        lg.accept(lease)
    text = _export(source, runs=[second])  # its positions start after the first run's
    events = [json.loads(x) for x in text.splitlines()[:-1]]
    assert events[0]["position"] > 10
    out = io.StringIO()
    with Ledger.open(store_dsn) as target:
        target.import_file(io.StringIO(text))  # an empty target keeps the file's positions
        monkeypatch.setattr("ledger.transfer.exports.PAGE", 3)  # gaps wider than a page
        target.export(out)
    again = [json.loads(x) for x in out.getvalue().splitlines()]
    assert [d["position"] for d in again[:-1]] == [d["position"] for d in events]
    assert again[:-1] == events
    assert again[-1]["digest"] == json.loads(text.splitlines()[-1])["digest"]


def test_raw_events_keep_their_exact_bytes_and_hashes(store_dsn: str) -> None:
    # import appends stored bytes as they are: text where they are NUL-free UTF-8, else
    # base64 (PostgreSQL), and the hashes with them
    from uuid import uuid4

    from ledger.stores.raw import RawEvent, append_raw, read_raw

    states = [b'{"a":"\\u00e9t\\u00e9 \xc3\xa9"}', b"\xff\xfe not utf-8", b"nul \x00 inside", b""]
    stream = uuid4()
    events = [
        RawEvent(10 + k, stream, k + 1, "ledger.domain:Run.Noted", state, f"h{k}" if k else None)
        for k, state in enumerate(states)
    ]
    with Ledger.open(store_dsn) as lg:
        with lg.store.write() as tx:
            assert append_raw(tx, events, keep_positions=True) == [10, 11, 12, 13]
        with lg.store.read() as tx:
            assert read_raw(tx, 0, 100) == events


def _respelled(line: str) -> str:
    """The same event line in another JSON spelling: keys in reverse order, escaped
    (`\\u0073tate`), non-ASCII text escaped, an extra key, spaces."""
    doc = json.loads(line)
    if "end" in doc:
        return line
    text = json.dumps(dict(reversed(list(doc.items()))) | {"note": "ignored"}, indent=1)
    return text.replace('"state"', '"\\u0073tate"', 1).replace("\n", " ") + "\n"


def test_an_import_keeps_the_events_of_a_file_in_any_json_spelling(
    tmp_path: Path, store_dsn: str
) -> None:
    source = f"sqlite:///{tmp_path}/source.db"
    with Ledger.open(source) as lg:
        run = lg.submit(manifest(2) | {"scope": 'é ✓ "quoted" \\ \u2028 😀'}, SUBMITTER).run_id
        lg.start(run, CONTROLLER)
        lg.claim(run, WORKER, limit=2)
    exported = _export(source)
    # (split at newlines only: str.splitlines would split inside a line, at U+2028)
    respelled = "".join(_respelled(x + "\n") for x in exported.split("\n") if x)
    assert "\\u0073tate" in respelled and "😀" not in respelled  # escaped as \ud83d\ude00
    with Ledger.open(store_dsn) as lg:
        summary = lg.import_file(io.StringIO(respelled))
        assert summary.verify_ok, summary.problems  # every stored byte hashes as recorded
        out = io.StringIO()
        lg.export(out)
    assert out.getvalue() == exported  # the same bytes, hashes and positions


def test_lines_read_as_json_reads_them_whitespace_and_all(tmp_path: Path) -> None:
    """Each line is read as json.loads reads it: whitespace around a document (CRLF line
    ends, indents) is no matter; anything else after it, or a broken document, is refused
    with its line."""
    source = f"sqlite:///{tmp_path}/source.db"
    with Ledger.open(source) as lg:
        run = lg.submit(manifest(2), SUBMITTER).run_id
        lg.start(run, CONTROLLER)
    lines = [x for x in _export(source).split("\n") if x]
    spaced = [f"  {x} \r" if k % 2 else f"{x}\t" for k, x in enumerate(lines)]
    with Ledger.open(f"sqlite:///{tmp_path}/a.db") as lg:
        assert lg.import_file(io.StringIO("\n".join(spaced) + "\n")).verify_ok
    assert len(lines) >= 3
    for k, broken in ((2, lines[1] + " x"), (3, lines[2][:-1]), (1, lines[0] + "{}")):
        text = "\n".join([*lines[: k - 1], broken, *lines[k:]]) + "\n"
        with Ledger.open(f"sqlite:///{tmp_path}/b{k}.db") as lg, pytest.raises(ImportRefused) as e:
            lg.import_file(io.StringIO(text))
        assert e.value.line == k and "not JSON" in str(e.value)
        with Ledger.open(f"sqlite:///{tmp_path}/b{k}.db") as lg, lg.store.read() as tx:
            assert max_position(tx) == 0  # nothing written
