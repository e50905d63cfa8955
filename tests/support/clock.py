"""A manual clock for tests: time moves only when a test says so."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta


class ManualClock:
    """Callable returning an aware datetime; `advance` and `set` move it (also backwards)."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2026, 11, 28, 12, 0, tzinfo=UTC)
        self._lock = threading.Lock()

    def __call__(self) -> datetime:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> datetime:
        with self._lock:
            self._now += timedelta(seconds=seconds)
            return self._now

    def set(self, when: datetime) -> None:
        with self._lock:
            self._now = when
