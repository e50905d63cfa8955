"""Cleaning error text before it is stored: bounded, secrets redacted."""

from __future__ import annotations

import re

MAX_ERROR_BYTES = 2048
MAX_REASON_BYTES = 4096

_PATTERNS = [
    (re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^:/@\s]*:)[^@\s]*@"), r"\1***@"),
    (re.compile(r"(?i)\b(bearer\s+)[A-Za-z0-9._~+/=-]+"), r"\1***"),
    (
        re.compile(
            r"(?i)\b(password|passwd|pwd|secret|token|api[_-]?key|access[_-]?key)(\s*[=:]\s*)(\"[^\"]*\"|'[^']*'|[^\s,;&]+)"
        ),
        r"\1\2***",
    ),
    (re.compile(r"\b(sk|pk|ghp|gho|xox[abp])[-_][A-Za-z0-9_-]{10,}"), "***"),
]


def redact(text: str) -> str:
    """Replace secret-looking values (DSN passwords, bearer tokens, key=value secrets)."""
    for pattern, repl in _PATTERNS:
        text = pattern.sub(repl, text)
    return text


def truncate_bytes(text: str, limit: int) -> str:
    """Cut to at most `limit` UTF-8 bytes without splitting a character."""
    raw = text.encode()
    if len(raw) <= limit:
        return text
    return raw[: limit - 3].decode("utf-8", errors="ignore") + "..."


def clean_error(text: str) -> str:
    """An attempt's error as stored: redacted, then at most 2 KiB."""
    return truncate_bytes(redact(text), MAX_ERROR_BYTES)
