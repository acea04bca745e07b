"""Writing a stream's SSE events to the wire, with the transport-level fault modes: CRLF line ends,
events split across two writes (inside a multi-byte character), two events coalesced into one
write, keep-alive comments and ``id:``/``retry:`` blocks between events."""

from __future__ import annotations

import asyncio

from aiohttp import web

from servelens.sim.faults import FaultPlan

SPLIT_GAP_S = 0.002
"""Pause between the two writes of a ``split`` event, so they reach the client as two reads."""


class SSEWriter:
    """Writes SSE events with the transport-level fault modes (crlf, split, coalesce, keepalive)."""

    def __init__(self, resp: web.StreamResponse, plan: FaultPlan) -> None:
        self.resp = resp
        self.nl = b"\r\n" if "crlf" in plan else b"\n"
        self.split = "split" in plan
        self.coalesce = "coalesce" in plan
        self.keepalive = "keepalive" in plan
        self.pending = b""
        self.n = 0

    async def _write(self, data: bytes) -> None:
        if self.split:
            cut = split_point(data)
            await self.resp.write(data[:cut])
            await asyncio.sleep(SPLIT_GAP_S)
            await self.resp.write(data[cut:])
        else:
            await self.resp.write(data)

    async def event(self, payload: bytes, last: bool = False) -> None:
        """One ``data:`` event (plus keep-alive blocks after it in ``keepalive`` mode, except after
        the ``last`` one)."""
        data = b"data: " + payload + self.nl + self.nl
        self.n += 1
        if self.keepalive and not last:
            nl = self.nl
            extra = b": keep-alive" + nl + nl
            if self.n % 2 == 0:
                extra += b"id: " + str(self.n).encode() + nl + b"retry: 3000" + nl + nl
            data += extra
        if self.coalesce:
            if self.pending:
                data, self.pending = self.pending + data, b""
                await self.resp.write(data)
            else:
                self.pending = data
            return
        await self._write(data)

    async def comment(self, text: bytes) -> None:
        """A comment line block (``: text``)."""
        await self.flush()
        await self.resp.write(b": " + text + self.nl + self.nl)

    async def flush(self) -> None:
        """Write what ``coalesce`` holds back."""
        if self.pending:
            data, self.pending = self.pending, b""
            await self.resp.write(data)


def split_point(data: bytes) -> int:
    """Inside the first multi-byte UTF-8 character if any (after its lead byte), else the middle."""
    for i, b in enumerate(data):
        if b >= 0xC0:
            return i + 1
    return max(1, len(data) // 2)
