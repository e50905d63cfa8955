"""Bearer tokens: a file of `<sha256 hex of the token> <actor_id> <role> [<added at>]` lines.

The file never holds a token, only its digest, so reading it (or a backup of
it) grants nothing. Tokens are shown once, by `add_token`, and never logged.
The server re-reads the file when it changes, so `ledger token add` takes
effect without a restart.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import secrets
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from ledger.core.errors import InvalidInput
from ledger.core.states import ROLES
from ledger.core.validation import check_identifier, check_not_reserved
from ledger.core.views import Actor

ENV_TOKENS = "LEDGER_TOKENS"
DEFAULT_TOKENS_FILE = "ledger.tokens"
TOKEN_PREFIX = "ledger_"  # noqa: S105 (the public prefix of every token, not a secret)
_HEX64 = re.compile(r"^[0-9a-fA-F]{64}$")
_WHITESPACE = re.compile(r"\s")
# Longer bearer values are refused before hashing; real tokens are ~50 characters.
MAX_TOKEN_CHARS = 512

log = logging.getLogger(__name__)


def tokens_path(path: str | os.PathLike[str] | None = None) -> Path:
    """The tokens file: `path`, else `$LEDGER_TOKENS`, else `./ledger.tokens`."""
    if path is not None and str(path) != "":
        return Path(path)
    return Path(os.environ.get(ENV_TOKENS) or DEFAULT_TOKENS_FILE)


def hash_token(token: str) -> str:
    """The digest stored in the tokens file (sha256, lowercase hex)."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def _check_actor(actor_id: str, role: str) -> None:
    check_identifier(actor_id, "actor_id")
    check_not_reserved(actor_id, "actor_id")
    if _WHITESPACE.search(actor_id):
        raise InvalidInput(f"actor_id must not contain whitespace, got {actor_id!r}")
    if role not in ROLES:
        raise InvalidInput(f"role must be one of {', '.join(ROLES)}; got {role!r}")


def add_token(actor_id: str, role: str, path: str | os.PathLike[str] | None = None) -> str:
    """Make a new random token for `actor_id` acting as `role`, append its digest to the
    tokens file (created with mode 0600), and return the token. Prints nothing: the
    caller shows the token once. Raises `InvalidInput` for a bad actor id or role."""
    _check_actor(actor_id, role)
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    target = tokens_path(path)
    if target.parent != Path(""):
        target.parent.mkdir(parents=True, exist_ok=True)
    added = datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    line = f"{hash_token(token)} {actor_id} {role} {added}\n"
    fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        # Start on a fresh line even if someone left the file without a final newline.
        if os.fstat(fd).st_size > 0:
            with open(target, "rb") as existing:
                existing.seek(-1, os.SEEK_END)
                if existing.read(1) != b"\n":
                    line = "\n" + line
        os.write(fd, line.encode("utf-8"))
    finally:
        os.close(fd)
    return token


def parse_tokens(text: str, source: str = "tokens file") -> dict[str, Actor]:
    """Digest -> actor. Blank lines and `#` comments are ignored; a malformed line raises
    `InvalidInput` naming its line number (never its content: it may hold a token pasted
    by mistake)."""
    table: dict[str, Actor] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) not in (3, 4) or not _HEX64.match(parts[0]):
            raise InvalidInput(
                f"{source} line {number}: expected "
                "'<sha256 hex of the token> <actor_id> <role> [<added at>]'"
            )
        digest, actor_id, role = parts[:3]
        try:
            _check_actor(actor_id, role)
        except InvalidInput as e:
            raise InvalidInput(f"{source} line {number}: {e.message}") from None
        table[digest.lower()] = Actor(actor_id, role)
    return table


@dataclass
class _Snapshot:
    stamp: tuple[int, int, int] | None
    table: dict[str, Actor]


class TokenFile:
    """The tokens file, re-read when its size or modification time changes."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = tokens_path(path)
        self._lock = threading.Lock()
        self._snapshot = _Snapshot(stamp=None, table={})
        self.reload(strict=True)

    def _stamp(self) -> tuple[int, int, int] | None:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def reload(self, strict: bool = False) -> None:
        """Read the file again. With `strict`, a malformed file raises `InvalidInput`;
        otherwise the last good table stays in force and a warning is logged."""
        stamp = self._stamp()
        try:
            text = self.path.read_text(encoding="utf-8") if stamp is not None else ""
            table = parse_tokens(text, source=str(self.path))
        except (InvalidInput, OSError, UnicodeDecodeError) as e:
            if strict:
                if isinstance(e, InvalidInput):
                    raise
                raise InvalidInput(f"cannot read tokens file {str(self.path)!r}: {e}") from None
            log.warning("tokens file %s not reloaded: %s", self.path, e)
            self._snapshot = _Snapshot(stamp=stamp, table=self._snapshot.table)
            return
        self._snapshot = _Snapshot(stamp=stamp, table=table)

    def lookup(self, token: str) -> Actor | None:
        """The actor a presented bearer token stands for, or None."""
        if not token or len(token) > MAX_TOKEN_CHARS:
            return None
        with self._lock:
            if self._stamp() != self._snapshot.stamp:
                self.reload()
            table = self._snapshot.table
        # Only digests are compared, so response timing says nothing about a token.
        return table.get(hash_token(token))


# -- listing and revoking (`ledger token list` / `ledger token revoke`) ------------------

FINGERPRINT_CHARS = 12  # of the digest: names a token in a listing, grants nothing


@dataclass(frozen=True)
class TokenEntry:
    """One line of the tokens file, without anything that grants access."""

    fingerprint: str
    actor_id: str
    role: str
    added_at: str | None

    def to_dict(self) -> dict[str, str | None]:
        """JSON-ready dict."""
        return {
            "fingerprint": self.fingerprint,
            "actor_id": self.actor_id,
            "role": self.role,
            "added_at": self.added_at,
        }


def _read_entries(target: Path) -> list[tuple[str, TokenEntry | None]]:
    """Each line of the file, with its entry (None for a blank or comment line)."""
    try:
        text = target.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    except (OSError, UnicodeDecodeError) as e:
        raise InvalidInput(f"cannot read tokens file {str(target)!r}: {e}") from None
    parse_tokens(text, source=str(target))  # a malformed file is refused, naming the line
    out: list[tuple[str, TokenEntry | None]] = []
    for raw in text.splitlines(keepends=True):
        parts = raw.split()
        if not parts or parts[0].startswith("#"):
            out.append((raw, None))
            continue
        added = parts[3] if len(parts) == 4 else None
        entry = TokenEntry(parts[0][:FINGERPRINT_CHARS].lower(), parts[1], parts[2], added)
        out.append((raw, entry))
    return out


def list_tokens(path: str | os.PathLike[str] | None = None) -> list[TokenEntry]:
    """The tokens in the file, oldest first: actor, role, when added, a fingerprint."""
    return [e for _raw, e in _read_entries(tokens_path(path)) if e is not None]


def revoke_tokens(who: str, path: str | os.PathLike[str] | None = None) -> list[TokenEntry]:
    """Remove every token of actor `who`, or the token whose fingerprint starts with `who`
    (at least 8 hex digits); return what was removed. The server stops accepting them
    as soon as it sees the file change. Raises `InvalidInput` when nothing matches."""
    target = tokens_path(path)
    lines = _read_entries(target)
    prefix = who.lower() if len(who) >= 8 and _HEX_PREFIX.match(who) else None
    by_actor = [e for _r, e in lines if e is not None and e.actor_id == who]

    def matches(entry: TokenEntry, raw: str) -> bool:
        if by_actor:
            return entry.actor_id == who
        return prefix is not None and raw.split()[0].lower().startswith(prefix)

    removed = [e for raw, e in lines if e is not None and matches(e, raw)]
    if not removed:
        raise InvalidInput(f"no token of actor {who!r} nor with that fingerprint in {target}")
    kept = "".join(raw for raw, e in lines if e is None or not matches(e, raw))
    # a new file beside the old one, then an atomic rename: a reader sees one or the other
    tmp = target.with_name(f".{target.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, kept.encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, target)
    return removed


_HEX_PREFIX = re.compile(r"^[0-9a-fA-F]+$")
