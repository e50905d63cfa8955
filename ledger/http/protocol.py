"""Uvicorn's h11 protocol with a deadline for request headers.

Uvicorn closes an idle keep-alive connection after `timeout_keep_alive`, but a
client that opens a connection and sends its request line and headers a byte at a
time (or never finishes them) is held for ever. `HeaderDeadlineProtocol` closes a
connection whose next request's headers have not all arrived `header_timeout`
seconds after the connection opened or the previous response ended. The request
*body* has its own deadline in the app (guard.py).
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

HEADER_TIMEOUT_SECONDS = 10.0


class HeaderDeadlineProtocol(H11Protocol):
    """An H11Protocol that closes connections whose request headers arrive too slowly."""

    header_timeout: float = HEADER_TIMEOUT_SECONDS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_task: asyncio.TimerHandle | None = None
        self._armed_for: Any = None

    def _arm(self) -> None:
        self._disarm()
        self._armed_for = self.cycle
        self._header_task = self.loop.call_later(self.header_timeout, self._headers_late)

    def _disarm(self) -> None:
        if self._header_task is not None:
            self._header_task.cancel()
            self._header_task = None

    def _headers_late(self) -> None:
        self._header_task = None
        waiting = self.cycle is self._armed_for and (
            self.cycle is None or self.cycle.response_complete
        )
        if waiting and not self.transport.is_closing():
            self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def handle_events(self) -> None:
        super().handle_events()
        if self._header_task is not None and self.cycle is not self._armed_for:
            self._disarm()  # a request's headers arrived: the app's deadlines take over

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)


def protocol_with(header_timeout: float) -> type[HeaderDeadlineProtocol]:
    """The protocol class with its own header deadline (uvicorn takes a class)."""
    return type(
        "HeaderDeadlineProtocol", (HeaderDeadlineProtocol,), {"header_timeout": header_timeout}
    )
