"""Cleaning free text before it is stored or shown: bounded, made storable, secrets
redacted.

`redact` covers the shapes secrets take in error text and reasons (see
tests/core/test_redact.py for the table): URL userinfo (a password, or a token as the user), `Authorization:`
headers (Bearer, Basic, Token), `key=value` / `key: value` / JSON `"key": "value"`
pairs whose key names a secret (`password`, `DB_PASSWORD`, `PGPASSWORD`,
`client_secret`, `access_token`, `api_key`, `aws_secret_access_key`, ...) in query
strings, environment dumps, Python reprs and JSON, PEM private keys, JWTs, AWS
access key ids, provider keys (`sk-`, `ghp_`, `xoxb-`, `AIza...`) and the ledger's own
`ledger_...` bearer tokens. `redact_evidence` replaces the values of evidence keys
that look secret.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

MAX_ERROR_BYTES = 2048
MAX_REASON_BYTES = 4096
MASK = "***"

# Key names that hold secrets, as a key in key=value text or in evidence.
# (names of secrets, not one: S105 does not apply)
_SECRET_WORDS = (
    r"pass(?:word|wd|phrase)?|pwd|secret|token|api[_-]?key|apikey|access[_-]?key"  # noqa: S105
    r"|private[_-]?key|credentials?|auth[_-]?key|session[_-]?id|signature"
)
_SECRET_KEY = re.compile(rf"(?i)(?:^|[_.-])(?:{_SECRET_WORDS})(?:$|[_.-])|^(?:{_SECRET_WORDS})$")
# A key: letters, digits and _.- around a secret word (DB_PASSWORD, client_secret,
# x-api-key, aws_secret_access_key), optionally quoted (JSON, Python reprs).
# (bounded repetitions: every start position costs a bounded time, so redaction stays
# linear in the text's length)
_KEY = (
    rf"(?:[A-Za-z0-9]{{1,32}}[_.-]){{0,4}}[A-Za-z0-9]{{0,12}}?(?:{_SECRET_WORDS})"
    rf"(?:[_.-][A-Za-z0-9]{{1,32}}){{0,4}}"
)
_VALUE = r"(?:\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*'|[^\s,;&\"'}\])]+)"


def _mask_value(value: str) -> str:
    # keep the quotes, so a JSON document or a repr still reads as one
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return value[0] + MASK + value[0]
    return MASK


def _mask_userinfo(m: re.Match[str]) -> str:
    user, colon, _secret = m.group(2).partition(":")
    if not colon or "@" in user:
        return f"{m.group(1)}{MASK}@"  # a token as the user name, or no user name to keep
    return f"{m.group(1)}{user}:{MASK}@"


_PATTERNS: list[tuple[re.Pattern[str], str | Callable[[re.Match[str]], str]]] = [
    # PEM private key blocks (before anything inside them is matched)
    (
        re.compile(
            r"-----BEGIN ([A-Z0-9 ]*)PRIVATE KEY-----.*?(?:-----END \1PRIVATE KEY-----|$)",
            re.DOTALL,
        ),
        r"-----BEGIN \1PRIVATE KEY-----***",
    ),
    # scheme://user:password@host and scheme://token@host (DSNs, URLs): the userinfo runs
    # to the authority's last "@" (a password may hold "@" and ":" unencoded), so all of
    # it is masked but a user name before a ":" (redis://:pw@host has an empty one)
    (
        re.compile(r"(?i)\b([a-z][a-z0-9+.-]{0,31}://)([^/?#\s]{0,512})@"),
        _mask_userinfo,
    ),
    # Authorization / Proxy-Authorization headers, any scheme
    (
        re.compile(
            r"(?i)\b((?:proxy-)?authorization[\"']?\s*[:=]\s*[\"']?)(?:(basic|bearer|token|digest|negotiate)\s+)?[^\s\"',;]+"
        ),
        rf"\1\2 {MASK}",
    ),
    # a bare "Bearer <token>" or "Basic <credentials>"
    (re.compile(r"(?i)\b(bearer|basic)(\s+)[A-Za-z0-9._~+/=-]{8,}"), rf"\1\2{MASK}"),
    # key=value, key: value, "key": "value", 'key': 'value', --key value, ?key=value
    (
        re.compile(rf"(?i)([\"']?\b{_KEY}[\"']?)(\s*(?:=|:)\s*|\s+(?=[\"']))({_VALUE})"),
        lambda m: m.group(1) + m.group(2) + _mask_value(m.group(3)),
    ),
    (
        re.compile(rf"(?i)(--{_KEY})(\s+|=)({_VALUE})"),
        lambda m: m.group(1) + m.group(2) + _mask_value(m.group(3)),
    ),
    # JSON Web Tokens
    (re.compile(r"\beyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]*"), MASK),
    # AWS access key ids
    (re.compile(r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA)[A-Z0-9]{16}\b"), MASK),
    # Google API keys
    (re.compile(r"\bAIza[0-9A-Za-z_-]{30,}"), MASK),
    # provider keys: OpenAI/Stripe sk-/pk-/rk-, GitHub ghp_/gho_/ghs_/github_pat_, Slack xox?-
    (
        re.compile(
            r"\b(?:sk|pk|rk|ghp|gho|ghu|ghs|ghr|github_pat|glpat|xox[abposr])[-_][A-Za-z0-9_-]{10,}"
        ),
        MASK,
    ),
    # the ledger's own bearer tokens (ledger.http.tokens.TOKEN_PREFIX + 43 characters)
    (re.compile(r"\bledger_[A-Za-z0-9_-]{20,}"), MASK),
]


def redact(text: str) -> str:
    """Replace secret-looking values (see the module's docstring) with `***`."""
    for pattern, repl in _PATTERNS:
        text = pattern.sub(repl, text)
    return text


def is_secret_key(key: str) -> bool:
    """True for an evidence key that names a secret (`password`, `api_key`, `DB_TOKEN`...)."""
    return bool(_SECRET_KEY.search(key))


def redact_evidence(value: Any) -> Any:
    """A JSON value with every value under a secret-looking key replaced by `***`, and
    every other string redacted as text. Returns a new value; containers are copied."""
    if isinstance(value, dict):
        return {
            k: (MASK if is_secret_key(k) and v is not None else redact_evidence(v))
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [redact_evidence(v) for v in value]
    if isinstance(value, str):
        return redact(value)
    return value


def safe_text(value: Any) -> str:
    """Free text the ledger stores whatever it is (a handler's error, an exception's
    message): a string that encodes as UTF-8 and that every store accepts. Lone
    surrogates and NUL are escaped (`\\udc80`, `\\x00`), never dropped, so the text
    still says what the caller said; a non-string is given as its `repr`."""
    if not isinstance(value, str):
        try:
            value = repr(value)
        except Exception:
            value = f"<unprintable {type(value).__name__}>"
        if not isinstance(value, str):
            value = f"<unprintable {type(value).__name__}>"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        value = value.encode("utf-8", "backslashreplace").decode("utf-8")
    if "\x00" in value:
        value = value.replace("\x00", "\\x00")
    return str(value)


def truncate_bytes(text: str, limit: int) -> str:
    """Cut to at most `limit` UTF-8 bytes without splitting a character."""
    raw = text.encode("utf-8", "backslashreplace")
    if len(raw) <= limit:
        return text
    return raw[: limit - 3].decode("utf-8", errors="ignore") + "..."


def clean_error(text: Any) -> str:
    """An attempt's error as stored: made storable (`safe_text`), redacted, then at
    most 2 KiB."""
    text = truncate_bytes(safe_text(text), 2 * MAX_ERROR_BYTES)
    return truncate_bytes(redact(text), MAX_ERROR_BYTES)


def clean_reason(text: str) -> str:
    """A reason or detail as stored: secret-looking values redacted."""
    return redact(text)
