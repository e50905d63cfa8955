"""The history file (format `run-ledger/history/1`): its lines, the hash chains they
carry, and the check of a whole file. Export, import and copy (ledger/transfer/imports.py) and
archives (ledger/transfer/archive.py) write and read it.

The file holds one line per event, in position order:

    {"position": 7, "stream": "<uuid>", "version": 3, "topic": "ledger.domain:Item.Transitioned",
     "state": "<the stored bytes as UTF-8 text>", "hash": "<hash recorded at write time>"}

(`"state_b64"` instead of `"state"` when the stored bytes are not UTF-8), then one closing
line: `{"end": "run-ledger/history/1", "events": N, "streams": S, "heads": {stream:
[version, hash, position]}, "digest": D, "complete": bool}`. `digest` is the heads digest
`ledger verify --heads` prints; for a complete export of a clean ledger the two are equal.

Reading a file (`check_file`) recomputes every hash chain from the bytes (each event's hash
chains to the previous event of its stream, see `ledger/stores/hashchain.py`) and compares
the closing line with what it found, so one edited, missing or reordered event, or a bad
closing line, is refused (`ImportRefused`) with its line and position before anything is
written.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import IO, Any
from uuid import UUID

from ledger.core.archived import ARCHIVED_TOPIC
from ledger.core.errors import InvalidInput
from ledger.core.rule_check import Violation
from ledger.stores import hashchain as hc
from ledger.stores.raw import RawEvent

FORMAT = "run-ledger/history/1"
PAGE = 2000

Progress = Callable[[int, int], None]


# The highest position a history file may carry: one every store holds as it is and can
# still count past (SQLite draws random lower row ids once its highest is 2^63-1;
# PostgreSQL's position announcements add 2^62 to a position, ledger/stores/pg_positions.py),
# and one a JSON reader in any language reads exactly (2^53-1, the largest integer a
# double holds).
MAX_POSITION = 2**53 - 1


class ImportRefused(InvalidInput):
    """A history file that does not check out, or that disagrees with the target ledger;
    nothing was written. `line` and `position` name where (None when not one event);
    `rule` names the rule of the rule checker an event breaks (None for other refusals),
    `stream` and `version` that event."""

    def __init__(
        self,
        message: str,
        line: int | None = None,
        position: int | None = None,
        rule: str | None = None,
        stream: str | None = None,
        version: int | None = None,
    ) -> None:
        super().__init__(message)
        self.line = line
        self.position = position
        self.rule = rule
        self.stream = stream
        self.version = version

    def to_dict(self) -> dict[str, object]:
        out = super().to_dict()
        if self.rule is not None:
            out.update(
                rule=self.rule, stream=self.stream, version=self.version, position=self.position
            )
        return out


def refuse_event(position: int, v: Violation, what: str = "nothing imported") -> ImportRefused:
    """The refusal of a file event that breaks a rule of the rule checker, naming the rule,
    the stream and the event."""
    return ImportRefused(
        f"position {position}: {v.event}, version {v.version} of stream {v.stream} (run "
        f"{v.run_id}) breaks rule {v.rule}: {v.detail}; {what}",
        position=position,
        rule=v.rule,
        stream=v.stream,
        version=v.version,
    )


# --------------------------------------------------------------------------
# lines
# --------------------------------------------------------------------------
def event_line(e: RawEvent) -> str:
    """One event as its line (without the newline)."""
    doc: dict[str, Any] = {
        "position": e.position,
        "stream": str(e.stream),
        "version": e.version,
        "topic": e.topic,
    }
    try:
        doc["state"] = e.state.decode("utf-8")
    except UnicodeDecodeError:
        doc["state_b64"] = base64.b64encode(e.state).decode("ascii")
    doc["hash"] = e.hash
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":"))


def parse_event(doc: Any, line: int, ids: dict[str, UUID] | None = None) -> RawEvent:
    """An event line's document as a RawEvent; ImportRefused naming the line otherwise.
    `ids`, when given, keeps one UUID per stream id text seen (a stream's events then
    share it: parsed once, and found in dicts keyed by it without comparing)."""
    try:
        if not isinstance(doc, dict):
            raise TypeError("not a JSON object")
        if "state" in doc:
            state = doc["state"].encode("utf-8")
        else:
            state = base64.b64decode(doc["state_b64"], validate=True)
        position, version = doc["position"], doc["version"]
        if type(position) is not int or type(version) is not int or position < 1 or version < 1:
            raise ValueError("position and version must be positive integers")
        if position > MAX_POSITION or version > MAX_POSITION:
            raise ValueError(
                f"position {position} and version {version} must be at most {MAX_POSITION}, "
                "the highest every store holds and counts past"
            )
        topic, hx = doc["topic"], doc["hash"]
        if not isinstance(topic, str) or not (hx is None or isinstance(hx, str)):
            raise ValueError("topic must be text and hash text or null")
        text = doc["stream"]
        cached = ids.get(text) if ids is not None and isinstance(text, str) else None
        stream = cached if cached is not None else UUID(text)
        if ids is not None and cached is None:
            ids[text] = stream
        return RawEvent(position, stream, version, topic, state, hx)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise ImportRefused(
            f"line {line} is not an event of a {FORMAT} file ({type(e).__name__}: {e})",
            line=line,
            position=doc.get("position") if isinstance(doc, dict) else None,
        ) from None


_TIMESTAMP = re.compile(rb'"timestamp":\{"_type_":"datetime_iso","_data_":"([^"]+)"\}')


def event_time(e: RawEvent) -> datetime | None:
    """When the event was recorded (from its stored state), if it says."""
    m = _TIMESTAMP.search(e.state, 0, 200)
    if m is None:
        return None
    try:
        return datetime.fromisoformat(m.group(1).decode())
    except ValueError:
        return None


def archived_seed(e: RawEvent) -> str | None:
    """The hash an `Archived` event chains to (the archived run's head before it), which
    stands in for the events that left the store; None for any other event."""
    if e.topic != ARCHIVED_TOPIC:
        return None
    try:
        seed = json.loads(e.state)["head_hash"]
    except (ValueError, KeyError, TypeError):
        return None
    return seed if isinstance(seed, str) else None


# --------------------------------------------------------------------------
# hash chains of a sequence of events
# --------------------------------------------------------------------------
class Chains:
    """Follows every stream's hash chain through events given in position order: each
    event must follow its stream's last version and match the hash its bytes give.

    A stream whose first event here is not its first version chains to something
    outside (an export --since, or an `Archived` event's recorded head): that first
    event is kept in `open` for the caller to check against the store that has the rest."""

    def __init__(self) -> None:
        self.heads: dict[UUID, tuple[int, str, int]] = {}  # stream -> version, hash, position
        self.open: dict[UUID, RawEvent] = {}
        self.last_position = 0
        self.events = 0
        self._digest: str | None = None  # digest() of the heads as they are (None: not yet)

    def add(self, e: RawEvent) -> str | None:
        """Take the next event; a description of what is wrong with it, or None."""
        if e.position <= self.last_position:
            return (
                f"position {e.position} comes after position {self.last_position}: "
                "events are out of order (lines reordered)"
            )
        last = self.heads.get(e.stream)
        prev: str | None
        if last is None:
            prev = hc.GENESIS if e.version == 1 else archived_seed(e)
            if prev is None:
                self.open[e.stream] = e
        elif e.version != last[0] + 1:
            return (
                f"stream {e.stream} goes from version {last[0]} (position {last[2]}) to version "
                f"{e.version}: " + ("events are missing" if e.version > last[0] else "repeated")
            )
        else:
            prev = last[1]
        if prev is None:
            hx = e.hash
            if hx is None:
                return f"version {e.version} of stream {e.stream} has no hash to chain from"
        else:
            hx = hc.event_hash(prev, e.stream, e.version, e.topic, e.state)
            if e.hash is not None and hx != e.hash:
                return (
                    f"version {e.version} of stream {e.stream} does not match its recorded "
                    "hash: its bytes (or the hash, or an earlier event of the stream) were edited"
                )
        self.heads[e.stream] = (e.version, hx, e.position)
        self.last_position = e.position
        self.events += 1
        self._digest = None
        return None

    def _sorted_heads(self) -> list[tuple[UUID, tuple[int, str, int]]]:
        # by the ids' integers: UUID order, without a Python-level comparison per step
        return sorted(self.heads.items(), key=lambda head: head[0].int)

    def digest(self) -> str:
        """The heads digest over the streams seen (as `verify --heads` computes it)."""
        if self._digest is None:
            self._digest = self._digest_of(self._sorted_heads())
        return self._digest

    def _digest_of(self, heads: list[tuple[UUID, tuple[int, str, int]]]) -> str:
        d = hc.HeadsDigest()
        for oid, (version, hx, _pos) in heads:
            d.add(oid, version, hx)
        self._digest = d.hexdigest()
        return self._digest

    def closing(self, complete: bool) -> dict[str, Any]:
        """The closing line's document."""
        heads = self._sorted_heads()
        return {
            "end": FORMAT,
            "events": self.events,
            "streams": len(self.heads),
            "heads": {str(o): [v, h, p] for o, (v, h, p) in heads},
            "digest": self._digest_of(heads),
            # streams that continue events not in the file (an export --since): declared, so
            # a file whose first events of a stream went missing does not pass for one
            "open": {str(o): [e.version, e.position] for o, e in sorted(self.open.items())},
            "complete": complete,
        }


# --------------------------------------------------------------------------
# reading a file
# --------------------------------------------------------------------------
@dataclass
class FileCheck:
    """What a history file holds, once every line checked out."""

    chains: Chains
    first_position: int
    lines: int
    runs: list[str]


_SCAN: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def _lines(f: IO[str]) -> Iterator[tuple[int, Any]]:
    for n, text in enumerate(f, start=1):
        if not text.strip():
            continue
        try:
            # json.loads by its C scanner directly for a line as written (the document,
            # then its newline); json.loads itself for anything else (and its errors)
            try:
                doc, end = _SCAN(text, 0)
            except StopIteration:
                end = -1
            if end != len(text) and (end != len(text) - 1 or text[-1] != "\n"):
                doc = json.loads(text)
            yield n, doc
        except (ValueError, RecursionError) as e:
            raise ImportRefused(f"line {n} is not JSON ({e})", line=n) from None


class EventReader:
    """The events of a history file, in order: iterating yields each event once it is
    parsed and taken into `chains`; once the last line is read, the closing line is
    checked against what the lines held. ImportRefused names the first line that is
    wrong: a line that is not an event, an event that does not follow its stream's
    chain, a line after the closing line, a file without one, a closing line that does
    not match. `check_file`, import, restore and `runs_of_file` all read a file through
    this."""

    def __init__(self, f: IO[str], chains: Chains | None = None) -> None:
        self.f = f
        self.chains = Chains() if chains is None else chains
        self.line = 0  # the number of the line last read (at the end: the file's last line)

    def __iter__(self) -> Iterator[RawEvent]:
        closing: dict[str, Any] | None = None
        n = 0
        add = self.chains.add
        ids: dict[str, UUID] = {}
        for n, doc in _lines(self.f):
            self.line = n
            if closing is not None:
                raise ImportRefused(f"line {n} follows the closing line", line=n)
            if isinstance(doc, dict) and "end" in doc:
                if doc.get("end") != FORMAT:
                    raise ImportRefused(
                        f"line {n}: not a {FORMAT} file (closing line says {doc.get('end')!r})",
                        line=n,
                    )
                closing = doc
                continue
            e = parse_event(doc, n, ids)
            problem = add(e)
            if problem is not None:
                raise ImportRefused(
                    f"line {n}, position {e.position}: {problem}", line=n, position=e.position
                )
            yield e
        if closing is None:
            raise ImportRefused(
                f"the file ends at line {n} without its closing line: it is truncated", line=n
            )
        _check_closing(closing, self.chains, n, ids)


def check_file(f: IO[str], progress: Progress | None = None) -> FileCheck:
    """Read a whole history file and check it: every line, every hash chain, and the closing
    line against what the lines hold. ImportRefused names the first line that is wrong."""
    reader = EventReader(f)
    chains = reader.chains
    first = 0
    runs: list[str] = []
    for e in reader:
        first = first or e.position
        if e.version == 1 and e.topic == "ledger.domain:Run.Submitted":
            runs.append(str(e.stream))
        if progress is not None and chains.events % PAGE == 0:
            progress(chains.events, 0)
    return FileCheck(chains=chains, first_position=first, lines=reader.line, runs=runs)


def _check_closing(
    closing: dict[str, Any], chains: Chains, line: int, ids: dict[str, UUID] | None = None
) -> None:
    """The closing line against what the lines held. `ids`: the stream ids already
    parsed from the lines, by their text (a head's id is looked up there first)."""
    heads = closing.get("heads")
    if not isinstance(heads, dict):
        raise ImportRefused(f"line {line} (closing): no stream heads", line=line)
    known = ids or {}
    for text, head in heads.items():
        try:
            oid = known.get(text) or UUID(text)
        except (ValueError, TypeError):
            raise ImportRefused(
                f"line {line} (closing): {text!r} is not a stream id", line=line
            ) from None
        found = chains.heads.get(oid)
        if found is None or not isinstance(head, list) or list(found) != head:
            have = f"version {found[0]} at position {found[2]}" if found else "no event"
            want = (
                f"version {head[0]} at position {head[2]}"
                if isinstance(head, list) and len(head) == 3
                else repr(head)
            )
            raise ImportRefused(
                f"line {line} (closing): stream {oid} should end with {want}, the file has "
                f"{have}: its last events are missing or were changed",
                line=line,
                position=head[2] if isinstance(head, list) and len(head) == 3 else None,
            )
    declared = closing.get("open") or {}
    for oid, e in chains.open.items():
        if declared.get(str(oid)) != [e.version, e.position]:
            raise ImportRefused(
                f"line {line} (closing): stream {oid} starts at version {e.version} (position "
                f"{e.position}) without its earlier versions: events are missing",
                line=line,
                position=e.position,
            )
    if len(heads) != len(chains.heads):
        extra = next(o for o in chains.heads if str(o) not in heads)
        raise ImportRefused(
            f"line {line} (closing): stream {extra} is in the file but not in its heads",
            line=line,
            position=chains.heads[extra][2],
        )
    if closing.get("events") != chains.events:
        raise ImportRefused(
            f"line {line} (closing): says {closing.get('events')} events, the file holds "
            f"{chains.events}: events are missing or were added",
            line=line,
        )
    if closing.get("digest") != chains.digest():
        raise ImportRefused(
            f"line {line} (closing): digest {closing.get('digest')!r} is not the digest of the "
            f"file's heads ({chains.digest()})",
            line=line,
        )


__all__ = [
    "FORMAT",
    "MAX_POSITION",
    "PAGE",
    "Chains",
    "EventReader",
    "FileCheck",
    "ImportRefused",
    "Progress",
    "archived_seed",
    "check_file",
    "event_line",
    "event_time",
    "parse_event",
    "refuse_event",
]
