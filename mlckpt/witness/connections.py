"""The witness's connections: each one bounded in time and in number, so that a client that
trickles its bytes (slowloris) holds nothing for long (mlckpt/witness/server.py wraps aiohttp's
protocol in :class:`Guarded`)."""

from __future__ import annotations

import asyncio
from typing import Any


class Connections:
    """How many connections a witness holds now."""
    def __init__(self) -> None:
        self.open_now = 0


class Guarded(asyncio.Protocol):
    """One connection, handed to aiohttp's protocol, closed if it has not delivered a request's
    headers within ``header_timeout_s``, closed after ``connection_life_s`` whatever it does, and
    refused at once past ``max_connections`` open: a client that trickles bytes holds nothing for
    long."""

    def __init__(self, inner: Any, count: Connections, *, max_connections: int, header_timeout_s: float,
                 life_s: float) -> None:
        self.inner, self.count = inner, count
        self.max_connections, self.header_timeout_s, self.life_s = max_connections, header_timeout_s, life_s
        self.transport: asyncio.Transport | None = None
        self.seen: bytes | None = b""
        self.timers: list[asyncio.TimerHandle] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.count.open_now += 1
        if self.count.open_now > self.max_connections:
            transport.abort()
            return
        loop = asyncio.get_running_loop()
        self.timers = [loop.call_later(self.header_timeout_s, self._slow),
                       loop.call_later(self.life_s, transport.close)]
        self.inner.connection_made(transport)

    def _slow(self) -> None:
        if self.transport is not None and self.seen is not None:
            self.transport.abort()

    def data_received(self, data: bytes) -> None:
        if self.seen is not None:
            self.seen = (self.seen + data)[-4:] if b"\r\n\r\n" not in self.seen + data else None
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self.count.open_now -= 1
        for t in self.timers:
            t.cancel()
        if self.timers:  # aiohttp's protocol saw the connection made
            self.inner.connection_lost(exc)
