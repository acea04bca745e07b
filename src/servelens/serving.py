"""How servelens servers (``servelens sim``, ``servelens gateway``) run from the command line: one
ready line on stdout once listening, then serve until SIGTERM/SIGINT and stop cleanly.
:class:`servelens.process.ServerProcess` waits for the same line."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import logging
import os
import re
import resource
import signal
import socket
import sys
from collections.abc import Awaitable, Callable
from typing import Any

READY_RE = re.compile(r"^servelens (\w+) listening on (http://\S+)\s*$")
"""Matches the ready line; groups: the server's name and its base URL."""


PARENT_PID_ENV = "SERVELENS_PARENT_PID"
"""Set by :class:`servelens.process.ServerProcess` in its child's environment: the parent's pid."""

_PR_SET_PDEATHSIG = 1  # linux/prctl.h

_stop_signals: list[str] = []


def note_stop_signal(name: str) -> None:
    """Record a stop signal (``"SIGTERM"``) just before its handler raises ``KeyboardInterrupt``.

    Python drops an exception raised inside a finalizer or a callback (it prints "Exception ignored"),
    so a signal that lands there would be lost; a later safe point picks it up with
    :func:`pending_stop_signal`. Cleared by :func:`clear_stop_signals`."""
    _stop_signals.append(name)


def pending_stop_signal() -> str | None:
    """The first stop signal recorded by :func:`note_stop_signal` and not cleared, else None."""
    return _stop_signals[0] if _stop_signals else None


def clear_stop_signals() -> None:
    """Forget the recorded stop signals (once the interrupt they raised was handled)."""
    _stop_signals.clear()


def die_with_parent() -> None:
    """In a server started by :class:`~servelens.process.ServerProcess` (``SERVELENS_PARENT_PID``
    set): ask Linux for SIGTERM when the parent goes away, even by SIGKILL (``prctl(PR_SET_PDEATHSIG)``;
    strictly, when the parent's thread that started it ends), so a killed demo, test or benchmark
    leaves no server behind. A parent already gone means SIGTERM now. Elsewhere a no-op."""
    want = os.environ.get(PARENT_PID_ENV)
    if not want or not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if str(os.getppid()) != want:  # the parent died before the request took effect
        os.kill(os.getpid(), signal.SIGTERM)


def ready_line(name: str, url: str) -> str:
    """``servelens <name> listening on <url>``."""
    return f"servelens {name} listening on {url}"


def bad_request_reason(exc: BaseException) -> str:
    """Why aiohttp refused a malformed request, in a few words and without any of the request's own bytes
    (aiohttp's messages quote up to 100 bytes of the offending line, which may be an ``Authorization``
    header or a URL holding an API key): the message up to its first ``:``."""
    text = str(getattr(exc, "message", "") or "").strip()
    text = text.splitlines()[0] if text else ""
    return text.split(":", 1)[0].strip() or type(exc).__name__


class OneLineBadRequests(logging.Filter):
    """A malformed client request (bad request line or header, which aiohttp answers with 400) is
    logged by aiohttp's ``aiohttp.server`` logger with a traceback; this keeps it to one line:
    ``bad HTTP request from <peer>: <reason>`` (:func:`bad_request_reason`: no request content)."""

    def filter(self, record: logging.LogRecord) -> bool:
        from aiohttp.http_exceptions import HttpProcessingError

        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            reason = bad_request_reason(exc)
            peer = record.args[0] if isinstance(record.args, tuple) and record.args else "a client"
            record.msg, record.args = "bad HTTP request from %s: %s", (peer, reason)
            record.exc_info = record.exc_text = None
        return True


async def serve_until_signal(name: str, url: str, stop: Callable[[], Awaitable[None]],
                             announce: Callable[[], None] | None = None, cut: Callable[[], None] | None = None) -> None:
    """Print the ready line (flushed; ``announce``: call it instead, as a gateway worker tells its
    supervisor), wait for SIGTERM or SIGINT, then await ``stop()``. The heap
    built at startup is frozen out of garbage collection (``gc.freeze``); a malformed client request
    is logged in one line (:class:`OneLineBadRequests`).

    The handlers stay installed until ``stop()`` returned: a second SIGTERM or SIGINT during it calls
    ``cut()`` ("cut now": the gateway ends its drain at once), or is ignored without ``cut``; later ones
    are ignored. (Was: the default handling, which killed the process mid-drain, or raised
    KeyboardInterrupt in the middle of whatever ran.)"""
    # What exists once the server is up (modules, app, metric families) lives as long as the process:
    # frozen out of the garbage collector, so a full collection scans only what requests allocate
    # (a full scan of the startup heap took ~10 ms, a p99 latency spike for every stream in flight).
    gc.collect()
    gc.freeze()
    server_log = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, OneLineBadRequests) for f in server_log.filters):
        server_log.addFilter(OneLineBadRequests())
    event = asyncio.Event()
    loop = asyncio.get_running_loop()
    sigs = (signal.SIGTERM, signal.SIGINT)
    signals = 0

    def on_signal() -> None:
        nonlocal signals
        signals += 1
        if signals == 1:
            event.set()
        elif signals == 2 and cut is not None:
            cut()

    for sig in sigs:
        loop.add_signal_handler(sig, on_signal)
    die_with_parent()  # after the handlers: a SIGTERM from it stops the server cleanly
    if announce is not None:
        announce()
    else:
        print(ready_line(name, url), flush=True)
    try:
        await event.wait()
    finally:
        try:
            await stop()
        finally:
            for sig in sigs:
                loop.remove_signal_handler(sig)
            sys.stdout.flush()


def listen_error(host: str, port: int, exc: OSError) -> OSError:
    """A one-line error for an address that cannot be listened on (``exc`` from binding or resolving
    ``host``): ``cannot listen on HOST:PORT: <reason>``, the reason being the OS's text for the error
    number (``Address already in use``): asyncio's own text repeats the address ("error while attempting
    to bind on address ('127.0.0.1', 18082): address already in use"). A resolver error keeps its text."""
    if isinstance(exc.errno, int) and exc.errno > 0 and not isinstance(exc, socket.gaierror):
        reason = os.strerror(exc.errno)
    else:
        reason = exc.strerror or str(exc)
    return OSError(f"cannot listen on {host}:{port}: {reason}")


def client_error_reason(exc: BaseException) -> str:
    """Why an aiohttp client request failed, in a few words: for a refused or unresolvable address
    ``cannot connect (<the OS's reason>)`` (aiohttp's own text adds "ssl:default" and repeats the
    address), a bare timeout ``timed out``, else the exception's text or, without one, its class name."""
    from aiohttp import ClientConnectorError

    if isinstance(exc, ClientConnectorError):
        return f"cannot connect ({exc.os_error.strerror or exc.os_error})"
    if isinstance(exc, TimeoutError) and not str(exc):
        return "timed out"
    return str(exc) or type(exc).__name__


def unreadable_body(request: Any, exc: BaseException) -> str:
    """Why an aiohttp request body could not be read (``web.RequestPayloadError``: a Content-Encoding
    the body does not match, a broken chunked body), in one line; marks the body read, else aiohttp
    reads the broken body again after the reply and logs a traceback."""
    request.content.feed_eof()
    cause = exc.__cause__
    return str(getattr(cause, "message", None) or cause or exc)


OPEN_FILES_CEILING = 1 << 20
"""The soft open-files limit asked for when the hard one is unlimited (Linux's default ``fs.nr_open``)."""


def raise_open_files_limit() -> tuple[int, int]:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard one (at most :data:`OPEN_FILES_CEILING`), as
    nginx's ``worker_rlimit_nofile`` lets one: the common default soft limit of 1024 caps a proxy near
    500 streams (a client and an upstream connection each). Returns ``(soft, hard)`` in force after;
    a refusal leaves the limit as it was (never raises)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = OPEN_FILES_CEILING if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < want:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft, hard


def open_files() -> int | None:
    """File descriptors this process has open now (``/proc/self/fd``), None where that cannot be read."""
    try:
        return len(os.listdir("/proc/self/fd")) - 1  # less the one listdir itself opened
    except OSError:
        return None
