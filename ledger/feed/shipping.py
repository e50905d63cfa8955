"""Signed checkpoints leave the database on a schedule (`ledger checkpoint sign --every`).

A checkpoint only protects what it was signed over once a copy lives where the
database's owner cannot reach it: events after the last shipped checkpoint are only as
safe as the database. So a loop signs the tree every interval and ships it, which bounds
that window to the interval (plus a failed shipment's retries):

- to a directory: one file per checkpoint, `checkpoint-<size>` (12 digits, so names sort
  by size), and `latest`, each written to a temporary name, flushed and renamed, so a
  reader never sees half a checkpoint; an existing file is never rewritten;
- to a URL of the operator's choice (a witness, a ticket system, another organisation's
  endpoint): one `POST` of the note text (`text/plain`), a 2xx answer counts as shipped;
  otherwise it is tried again at the next tick. No redirect is followed.

A tick whose tree did not grow since the last shipped checkpoint ships nothing. The
loop stops at its `stop` event (SIGINT, SIGTERM in the CLI) or after `count` ticks.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ledger.core.errors import CommitUncertain, InvalidInput, StoreUnavailable
from ledger.core.note import Signer
from ledger.feed.webhooks import post_once
from ledger.service.checkpoints import checkpoint, sign_with

if TYPE_CHECKING:
    from ledger.service.ledger import Ledger

POST_TIMEOUT_S = 30.0
LATEST = "latest"


@dataclass(frozen=True)
class Tick:
    """What one tick did: shipped a checkpoint of `size` events, skipped (not grown), or
    failed (`error`, tried again next tick)."""

    size: int
    shipped: bool
    where: str | None = None
    error: str | None = None


def _write_new(path: Path, text: str, replace: bool) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    if replace:
        os.replace(tmp, path)
    else:
        try:
            os.link(tmp, path)  # fails if the file exists: never rewrite a checkpoint
        finally:
            tmp.unlink()


def _last_shipped(folder: Path) -> int | None:
    try:
        lines = (folder / LATEST).read_text(encoding="utf-8").split("\n")
        return int(lines[1])
    except (OSError, IndexError, ValueError):
        return None


class Shipper:
    """Signs the ledger's tree with `signer` and ships it to `to` (a directory, or an
    http(s) URL), remembering the size last shipped."""

    def __init__(self, lg: Ledger, signer: Signer, to: str, origin: str | None = None) -> None:
        self.lg, self.signer, self.to, self.origin = lg, signer, to, origin
        self.is_url = to.startswith(("http://", "https://"))
        if not self.is_url and "://" in to:  # a URL of another scheme is no directory name
            raise InvalidInput(f"checkpoints ship to a directory or an http(s) URL, not {to!r}")
        self.last: int | None = None if self.is_url else _last_shipped(Path(to))

    def tick(self) -> Tick:
        cp = checkpoint(self.lg, self.origin)
        if self.last is not None and cp.size <= self.last:
            return Tick(cp.size, False)
        note = sign_with(cp, self.signer)
        if self.is_url:
            status, error = post_once(
                self.to,
                {"content-type": "text/plain; charset=utf-8", "user-agent": "run-ledger"},
                note.encode(),
                POST_TIMEOUT_S,
            )
            if error is not None or status is None or not 200 <= status < 300:
                return Tick(cp.size, False, self.to, error or f"answered {status}")
            where = self.to
        else:
            folder = Path(self.to)
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"checkpoint-{cp.size:012d}"
            if not path.exists():
                _write_new(path, note, replace=False)
            _write_new(folder / LATEST, note, replace=True)
            where = str(path)
        self.last = cp.size
        return Tick(cp.size, True, where)


def ship_every(
    shipper: Shipper,
    every_s: float,
    stop: threading.Event,
    count: int | None = None,
    on_tick: Callable[[Tick], None] | None = None,
) -> int:
    """Tick now and then every `every_s` seconds until `stop` is set or `count` ticks were
    made; returns how many checkpoints were shipped."""
    shipped = ticks = 0
    while not stop.is_set():
        try:
            t = shipper.tick()
        except (StoreUnavailable, CommitUncertain) as e:  # the database is away: next tick
            t = Tick(-1, False, shipper.to, str(e))
        shipped += t.shipped
        ticks += 1
        if on_tick is not None:
            on_tick(t)
        if count is not None and ticks >= count:
            break
        if stop.wait(every_s):
            break
    return shipped
