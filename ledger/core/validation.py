"""The input boundary: ids and JSON values are normalised and checked here, once, for the
Python API, the CLI and HTTP alike (no pydantic import, so read-only commands start fast).

Ids (rule 17 of the rule book): NFC-normalised, 1-200 characters, and refused when they hold a
control, format (zero width, bidi), surrogate, unassigned, line- or paragraph-separator
character, so two ids that look alike on the page or in the CLI are the same id.

JSON (payloads, evidence, request bodies, files): strict. No NaN or Infinity, object
keys are strings (so `1` and `"1"` can never both be a key), no duplicate keys in
text, bounded depth and size, valid UTF-8 only. What passes is returned as plain
`dict`/`list`/`str`/`int`/`float`/`bool`/`None`, so whatever is stored reads back as
valid JSON on every path.
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, NoReturn

from ledger.core.errors import InvalidInput
from ledger.core.redact import safe_text  # noqa: F401  (part of the boundary's surface)

MAX_MANIFEST_BYTES = 16 * 1024 * 1024
MAX_PAYLOAD_BYTES = 64 * 1024
MAX_EVIDENCE_BYTES = 64 * 1024
MAX_JSON_DEPTH = 64
MAX_ID_CHARS = 200
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# Unicode general categories an id may not hold: controls (C0, C1), format characters
# (zero width joiners and spaces, bidi overrides and isolates), surrogates, unassigned
# code points, and line/paragraph separators (they break a table row like a newline).
ID_REFUSED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Cn", "Zl", "Zp"})
_CATEGORY_NAMES = {
    "Cc": "a control character",
    "Cf": "a format character (zero width or bidi control)",
    "Cs": "a lone surrogate",
    "Cn": "an unassigned code point",
    "Zl": "a line separator",
    "Zp": "a paragraph separator",
}

ErrorFactory = Callable[[str], Exception]


def check_identifier(value: Any, what: str) -> str:
    """An id as the ledger keeps it: NFC-normalised, 1-200 characters, none of them
    control, format, surrogate, unassigned or line/paragraph separator (they appear
    in tables and logs, and lookalike spellings must not make distinct ids). Returns
    the normalised id; raises InvalidInput naming `what` otherwise."""
    if not isinstance(value, str):
        raise InvalidInput(f"{what} must be a string, got {type(value).__name__}")
    if value.isascii():
        # the common case, and NFC already
        if _CONTROL.search(value):
            raise InvalidInput(f"{what} must not contain control characters")
    else:
        check_unicode(value, what)
        for ch in value:
            category = unicodedata.category(ch)
            if category in ID_REFUSED_CATEGORIES:
                raise InvalidInput(
                    f"{what} must not contain {_CATEGORY_NAMES[category]} "
                    f"(U+{ord(ch):04X}); ids are NFC text without control, format or "
                    "unassigned characters"
                )
        value = unicodedata.normalize("NFC", value)
    if not value or len(value) > MAX_ID_CHARS:
        raise InvalidInput(f"{what} must be 1-{MAX_ID_CHARS} characters, got {len(value)}")
    return str(value)


# Actor ids the ledger writes itself: `ledger` for its automatic transitions (cancel's
# skips, a drained run's end) and `reconciler` for a reconcile pass given no actor. No
# token may stand for them and the CLI's --as may not name them, so a person's command
# can never pass for the ledger's own in the audit.
RESERVED_ACTOR_IDS = frozenset({"ledger", "reconciler"})


def check_not_reserved(actor_id: str, what: str = "actor id") -> str:
    """Refuse an actor id the ledger writes itself (RESERVED_ACTOR_IDS)."""
    if unicodedata.normalize("NFC", actor_id).casefold() in RESERVED_ACTOR_IDS:
        raise InvalidInput(
            f"{what} {actor_id!r} is reserved: the ledger records its own transitions under "
            f"{', '.join(sorted(RESERVED_ACTOR_IDS))}; choose another id"
        )
    return actor_id


def utc_time(value: Any, what: str) -> datetime:
    """An aware datetime as UTC. A time whose UTC form falls off the calendar
    (`0001-01-01T00:00:00+14:00`, `9999-12-31T23:59:59-14:00`) is clamped to the
    calendar's first or last instant, so a read bounded by it means "since always" or
    "until forever" instead of an OverflowError."""
    if not isinstance(value, datetime) or value.tzinfo is None:
        raise InvalidInput(f"{what} must be an aware datetime (with a UTC offset)")
    try:
        offset = value.utcoffset()
    except (TypeError, ValueError):
        offset = None
    if offset is None:
        raise InvalidInput(f"{what} must be an aware datetime (with a UTC offset)")
    try:
        return value.astimezone(UTC)
    except OverflowError:
        edge = datetime.min if value.year == 1 else datetime.max
        return edge.replace(tzinfo=UTC)


def check_unicode(value: str, what: str) -> str:
    """Refuse strings that cannot be stored as UTF-8 (lone surrogates)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInput(
            f"{what} is not valid Unicode text (it contains a lone surrogate)"
        ) from None
    return value


def json_depth_ok(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """True when nested lists/dicts go no deeper than `limit` (checked without recursion)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            if depth > limit:
                return False
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, (list, tuple)):
            if depth > limit:
                return False
            stack.extend((v, depth + 1) for v in node)
    return True


def _not_json(value: Any) -> NoReturn:
    raise TypeError(
        f"a {type(value).__name__} is not a JSON value (JSON has objects with string keys, "
        "arrays, strings, finite numbers, true, false and null)"
    )


def _first_non_plain(value: Any) -> str | None:
    """Why `value` is not plain JSON data that `json.loads` would give back, or None
    (tuples count as lists). Only called once a value failed the fast round-trip check."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        node, path = stack.pop()
        if isinstance(node, dict):
            for k, v in node.items():
                if not isinstance(k, str):
                    return f"object keys must be strings, got the {type(k).__name__} key {k!r:.40}"
                stack.append((v, f"{path}.{k}" if path else k))
        elif isinstance(node, (list, tuple)):
            stack.extend((v, f"{path}.{i}" if path else str(i)) for i, v in enumerate(node))
    return None


def plain_json(
    value: Any,
    what: str,
    max_bytes: int = MAX_PAYLOAD_BYTES,
    max_depth: int = MAX_JSON_DEPTH,
    error: ErrorFactory = InvalidInput,
) -> tuple[Any, str]:
    """`value` as plain JSON data and its canonical text, or `error(message)` naming
    `what`: no NaN or Infinity, string keys only, no bytes/sets/datetimes/objects,
    valid Unicode, at most `max_depth` levels and `max_bytes` bytes of JSON."""
    if not json_depth_ok(value, max_depth):
        raise error(f"{what} must not nest deeper than {max_depth} levels")
    try:
        text = json.dumps(
            value,
            sort_keys=True,
            separators=(",", ":"),
            ensure_ascii=False,
            allow_nan=False,
            default=_not_json,
        )
    except RecursionError:
        raise error(f"{what} must not nest deeper than {max_depth} levels") from None
    except (TypeError, ValueError) as e:
        message = str(e)
        if "float" in message and "JSON compliant" in message:
            message = "NaN and Infinity are not JSON numbers"
        elif "not supported between" in message or "keys must be" in message:
            message = "object keys must be strings"
        raise error(f"{what} is not strict JSON: {message}") from None
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise error(f"{what} is not valid Unicode text (it contains a lone surrogate)") from None
    if size > max_bytes:
        raise error(
            f"{what} is {size} bytes of JSON; at most {max_bytes} bytes ({max_bytes / 1024:g} KiB) allowed"
        )
    plain = json.loads(text)
    if plain != value:
        why = _first_non_plain(value)
        if why is not None:
            raise error(f"{what} is not strict JSON: {why}")
    if '"_data_":' in text and '"_type_":' in text and _has_wrapper(plain):
        raise error(
            f"{what} holds an object whose only keys are _type_ and _data_: the stored "
            "event format reads that shape as an encoded value (a time, a UUID), so it "
            "would not read back as written; rename either key"
        )
    return plain, text


def _has_wrapper(value: Any) -> bool:
    """Whether an object of `value` has exactly the keys `_type_` and `_data_`, the shape
    eventsourcing's JSON transcoder writes for the values JSON has no type for."""
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if len(node) == 2 and "_type_" in node and "_data_" in node:
                return True
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return False


def _refuse_constant(name: str) -> NoReturn:
    raise _StrictJSONError(f"{name} is not a JSON number")


class _StrictJSONError(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    d = dict(pairs)
    if len(d) != len(pairs):
        seen: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                raise _StrictJSONError(f"the key {k!r:.60} appears twice in one object")
            seen.add(k)
    return d


def first_bad_string(value: Any) -> str | None:
    """The first string in a JSON value that is not valid Unicode (a lone surrogate
    such as the JSON escape \\ud800), or None. Such strings cannot be stored as UTF-8."""
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            try:
                node.encode("utf-8")
            except UnicodeEncodeError:
                return node
        elif isinstance(node, dict):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return None


def strict_loads(
    data: str | bytes | bytearray,
    what: str,
    max_bytes: int = MAX_MANIFEST_BYTES,
    max_depth: int = MAX_JSON_DEPTH,
    error: ErrorFactory = InvalidInput,
) -> Any:
    """Parse JSON text strictly, or raise `error(message)` naming `what`: valid UTF-8,
    at most `max_bytes` bytes, no NaN/Infinity, no duplicate keys, no lone surrogate
    escapes, at most `max_depth` levels."""
    if len(data) > max_bytes:
        raise error(f"{what} is {len(data)} bytes; at most {max_bytes} bytes allowed")
    if isinstance(data, (bytes, bytearray)):
        try:
            data = bytes(data).decode("utf-8")
        except UnicodeDecodeError as e:
            raise error(f"{what} is not valid UTF-8: {e.reason} at byte {e.start}") from None
    try:
        value = json.loads(data, parse_constant=_refuse_constant, object_pairs_hook=_no_duplicates)
    except RecursionError:
        raise error(f"{what} nests too deeply; at most {max_depth} levels") from None
    except json.JSONDecodeError as e:
        raise error(
            f"{what} is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}"
        ) from None
    except _StrictJSONError as e:
        raise error(f"{what} is not strict JSON: {e}") from None
    except ValueError as e:  # e.g. integers beyond Python's digit limit
        raise error(f"{what} is not acceptable JSON: {e}") from None
    if not json_depth_ok(value, max_depth):
        raise error(f"{what} nests too deeply; at most {max_depth} levels")
    if first_bad_string(value) is not None:
        raise error(
            f"{what} holds a string that is not valid Unicode (a lone surrogate escape such as \\ud800)"
        )
    return value


def stored_payload_problem(raw: bytes) -> str | None:
    """Why a stored event's payload is not strict JSON (rule 17 of the rule book), or None: NaN or
    Infinity (which older versions stored from a float evidence value), a duplicate key
    or a lone surrogate escape, any of which breaks every strict JSON reader of its
    history. Only payloads holding `NaN`/`Infinity` or a `\\u` escape are parsed again
    (the ledger writes its payloads from dicts, as UTF-8: nothing else can hide a
    violation). `verify` reports such an event; an import refuses it."""
    if b"NaN" not in raw and b"Infinity" not in raw and b"\\u" not in raw:
        return None
    try:
        # (the ledger's own wrapping adds a few levels around a caller's evidence)
        strict_loads(raw, "payload", max_bytes=len(raw), max_depth=MAX_JSON_DEPTH + 16)
    except InvalidInput as e:
        return e.message
    return None


def canonical_json(value: Any) -> str:
    """Deterministic JSON used for digests and size limits."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def input_version_of(manifest: dict[str, Any]) -> str:
    """Content digest of a manifest in its JSON form."""
    return input_version_of_text(canonical_json(manifest))


def input_version_of_text(canonical: str) -> str:
    """`input_version_of` from the manifest's canonical JSON text."""
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()[:32]
