"""`GuardedH11Protocol`, uvicorn's h11 protocol with a header deadline (see server/limits.py). A module of its
own so that only HTTP and SSE serving imports uvicorn's protocol (and h11), not stdio or the CLI."""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.h11_impl import H11Protocol

from .limits import ServerLimits


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a header deadline: uvicorn times out idle keep-alive connections, but
    not one that opens and then sends its headers a byte at a time (or never)."""

    header_timeout_s = ServerLimits.header_timeout_s

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_deadline()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm_header_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        deadline = getattr(self, "_header_deadline", None)
        if deadline is not None:
            deadline.cancel()
        super().connection_lost(exc)

    def _arm_header_deadline(self) -> None:
        previous = getattr(self, "_header_deadline", None)
        if previous is not None:
            previous.cancel()
        self._header_deadline = self.loop.call_later(self.header_timeout_s, self._header_timeout)

    def _header_timeout(self) -> None:
        waiting_for_headers = self.cycle is None or self.cycle.response_complete
        if waiting_for_headers and not self.transport.is_closing():
            self.transport.close()
