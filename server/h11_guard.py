"""`GuardedH11Protocol`, uvicorn's h11 protocol with a header deadline (see server/limits.py) and a request-body
deadline. A module of its own so that only HTTP and SSE serving imports uvicorn's protocol (and h11), not stdio
or the CLI."""

from __future__ import annotations

import asyncio
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from .limits import ServerLimits

# A request's whole body must arrive within this long of its headers, keyed client or not: uvicorn times out
# neither a body nor an app waiting for one, so a body sent a byte at a time (or never) held its connection
# forever. 30 s still lets the largest accepted body (4 MiB, server/limits.py) through at about 140 KB/s.
BODY_TIMEOUT_S = 30.0


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with two deadlines: uvicorn times out idle keep-alive connections, but not one
    that opens and then sends its headers (header deadline) or its body (body deadline: 408, then closed) a
    byte at a time, or never. A response sent before the body is in (a 401, say) re-arms the header
    deadline, which then closes the connection."""

    header_timeout_s = ServerLimits.header_timeout_s
    body_timeout_s = BODY_TIMEOUT_S

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_deadline()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm_header_deadline()

    def handle_events(self) -> None:
        cycle = self.cycle
        super().handle_events()
        if self.cycle is not cycle and self.conn.their_state is h11.SEND_BODY:  # a new request, its body to come
            self._cancel("_body_deadline")
            self._body_deadline = self.loop.call_later(self.body_timeout_s, self._body_timeout, self.cycle)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel("_header_deadline")
        self._cancel("_body_deadline")
        super().connection_lost(exc)

    def _cancel(self, name: str) -> None:
        timer = getattr(self, name, None)
        if timer is not None:
            timer.cancel()

    def _arm_header_deadline(self) -> None:
        self._cancel("_header_deadline")
        self._header_deadline = self.loop.call_later(self.header_timeout_s, self._header_timeout)

    def _header_timeout(self) -> None:
        waiting_for_headers = self.cycle is None or self.cycle.response_complete
        if waiting_for_headers and not self.transport.is_closing():
            self.transport.close()

    def _body_timeout(self, cycle: object) -> None:
        if cycle is not self.cycle or self.conn.their_state is not h11.SEND_BODY or self.transport.is_closing():
            return  # that body arrived, or the connection is already going
        self.cycle.disconnected = True  # the app now reads http.disconnect and its sends are dropped, not interleaved
        self.cycle.message_event.set()
        if not self.cycle.response_started:
            body = b"Request body not received in time."
            headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode()),
                       (b"connection", b"close")]
            self.transport.write(self.conn.send(h11.Response(status_code=408, headers=headers, reason=b"Request Timeout")))
            self.transport.write(self.conn.send(h11.Data(data=body)))
            self.transport.write(self.conn.send(h11.EndOfMessage()))
        self.transport.close()


def guarded_uvicorn_options(limits: ServerLimits) -> dict[str, Any]:
    """uvicorn.Config arguments every HTTP front end runs with (`serve`, `amfs-server ui`): this protocol with the
    configured header deadline, the keep-alive timeout, the connection cap and the header size limit."""
    protocol = type("H11", (GuardedH11Protocol,), {"header_timeout_s": limits.header_timeout_s})
    return {
        "http": protocol, "timeout_keep_alive": int(limits.keep_alive_s), "limit_concurrency": limits.max_connections,
        "h11_max_incomplete_event_size": limits.max_header_bytes,
    }
