"""Bounded waits and threads for tests that watch another thread, process or server."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

WAIT = 30.0  # seconds: a bound on waiting, never a timing assertion


def wait_until(condition: Callable[[], Any], what: str, timeout: float = WAIT) -> Any:
    """Poll `condition` until it is truthy (bounded by `timeout`); returns its value."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)
    return value


def start_thread(command: Callable[[], Any], into: list[Any]) -> threading.Thread:
    """`command()` in a started thread; its result or exception is appended to `into`."""

    def run() -> None:
        try:
            into.append(command())
        except Exception as e:
            into.append(e)

    t = threading.Thread(target=run)
    t.start()
    return t
