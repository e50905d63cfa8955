"""Light validation helpers shared by the service and the manifest (no pydantic import,
so read-only commands start fast)."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from .errors import InvalidInput

MAX_MANIFEST_BYTES = 16 * 1024 * 1024
MAX_PAYLOAD_BYTES = 64 * 1024
MAX_JSON_DEPTH = 64
MAX_ID_CHARS = 200
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def check_identifier(value: str, what: str) -> str:
    """Ids are 1-200 characters with no control characters (they appear in tables and logs)."""
    if not isinstance(value, str):
        raise InvalidInput(f"{what} must be a string, got {type(value).__name__}")
    check_unicode(value, what)
    if not value or len(value) > MAX_ID_CHARS:
        raise InvalidInput(f"{what} must be 1-{MAX_ID_CHARS} characters, got {len(value)}")
    if _CONTROL.search(value):
        raise InvalidInput(f"{what} must not contain control characters")
    return value


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
        elif isinstance(node, list):
            if depth > limit:
                return False
            stack.extend((v, depth + 1) for v in node)
    return True


def canonical_json(value: Any) -> str:
    """Deterministic JSON used for digests and size limits."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def input_version_of(manifest: dict[str, Any]) -> str:
    """Content digest of a manifest in its JSON form."""
    return input_version_of_text(canonical_json(manifest))


def input_version_of_text(canonical: str) -> str:
    """`input_version_of` from the manifest's canonical JSON text."""
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()[:32]
