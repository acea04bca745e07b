"""How servelens servers (``servelens sim``, ``servelens gateway``) run from the command line: one
ready line on stdout once listening, then serve until SIGTERM/SIGINT and stop cleanly.
:class:`servelens.process.ServerProcess` waits for the same line."""

from __future__ import annotations

import asyncio
import re
import signal
import sys
from collections.abc import Awaitable, Callable

READY_RE = re.compile(r"^servelens (\w+) listening on (http://\S+)\s*$")
"""Matches the ready line; groups: the server's name and its base URL."""


def ready_line(name: str, url: str) -> str:
    """``servelens <name> listening on <url>``."""
    return f"servelens {name} listening on {url}"


async def serve_until_signal(name: str, url: str, stop: Callable[[], Awaitable[None]]) -> None:
    """Print the ready line (flushed), wait for SIGTERM or SIGINT, then await ``stop()``."""
    event = asyncio.Event()
    loop = asyncio.get_running_loop()
    sigs = (signal.SIGTERM, signal.SIGINT)
    for sig in sigs:
        loop.add_signal_handler(sig, event.set)
    print(ready_line(name, url), flush=True)
    try:
        await event.wait()
    finally:
        for sig in sigs:
            loop.remove_signal_handler(sig)
        await stop()
        sys.stdout.flush()


def listen_error(host: str, port: int, exc: OSError) -> OSError:
    """A one-line error for an address that cannot be listened on (``exc`` from binding or resolving
    ``host``): ``cannot listen on HOST:PORT: <reason>``."""
    return OSError(f"cannot listen on {host}:{port}: {exc.strerror or exc}")
