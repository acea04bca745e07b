"""The gateway against its open-files limit: the soft limit raised at start, the capacity said, and
connections past it refused with a clear 503 and counted (not reset unseen, as libuv does on EMFILE)."""

from __future__ import annotations

import asyncio
import errno
import json
import re
import socket
from contextlib import ExitStack

import pytest

from servelens.gateway.connections import ConnectionGuard, file_budget
from servelens.process import ServerProcess
from servelens.prometheus.parse import parse_exposition

GATEWAY = ["gateway", "--upstream", "http://127.0.0.1:9", "--connect-timeout", "0.5", "--models-refresh", "0"]


def get(sock: socket.socket, path: str, close: bool = False) -> tuple[int, bytes]:
    """One HTTP/1.1 GET on ``sock``; the status and body of its answer (Content-Length framed)."""
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: gw\r\n{'Connection: close' + chr(13) + chr(10) if close else ''}\r\n"
                 .encode())
    data = b""
    while b"\r\n\r\n" not in data:
        part = sock.recv(65536)
        assert part, f"connection closed after {data!r}"
        data += part
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))  # type: ignore[union-attr]
    while len(body) < length:
        part = sock.recv(65536)
        assert part
        body += part
    return int(head.split()[1]), body


def scrape(sock: socket.socket) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    status, body = get(sock, "/metrics")
    assert status == 200
    return parse_exposition(body.decode())


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_connections_past_the_open_files_limit_get_a_503_and_are_counted(loop: str) -> None:
    args = [*GATEWAY, *(["--no-uvloop"] if loop == "asyncio" else [])]
    with ServerProcess(args, open_files=(160, 160)) as gw:  # a hard limit the gateway cannot raise
        line = next(x for x in gw.startup_lines if x.startswith("servelens gateway:"))
        cap = int(re.search(r"open files 160 \(hard 160\): up to (\d+) streams", line).group(1))  # type: ignore[union-attr]
        host, port = gw.url.removeprefix("http://").split(":")
        extra = 12
        with socket.create_connection((host, int(port)), timeout=10) as first:
            assert get(first, "/health")[0] == 200
            with ExitStack() as stack:
                answers = []
                for _ in range(cap - 1 + extra):  # one at a time: each is answered before the next connects
                    conn = stack.enter_context(socket.create_connection((host, int(port)), timeout=10))
                    answers.append(get(conn, "/health"))
                assert [st for st, _ in answers[:cap - 1]] == [200] * (cap - 1)  # held open: keep-alive
                refused = answers[cap - 1:]
                assert [st for st, _ in refused] == [503] * extra
                err = json.loads(refused[0][1])["error"]
                assert err["code"] == "too_many_connections" and str(cap) in err["message"]
            # the gateway still serves the connections it took, and says what happened
            got = scrape(first)
        assert got[("servelens_gateway_max_connections", ())] == cap
        assert got[("servelens_gateway_accept_failures_total", (("reason", "connection_limit"),))] == extra
        assert got[("servelens_gateway_accept_failures_total", (("reason", "open_files"),))] == 0
    log = "\n".join(gw.startup_lines)
    assert "Traceback" not in log


def test_the_soft_limit_is_raised_to_the_hard_one_at_start() -> None:
    with ServerProcess(GATEWAY, open_files=(128, 4096)) as gw:
        line = next(x for x in gw.startup_lines if x.startswith("servelens gateway:"))
    assert "open files 4096 (hard 4096)" in line


async def test_accept_failures_asyncio_reports_are_counted_not_logged_as_tracebacks() -> None:
    guard = ConnectionGuard(file_budget(1024, 1024, 20))
    seen: list[dict[str, object]] = []
    handler = guard.exception_handler(lambda _loop, ctx: seen.append(ctx))
    loop = asyncio.get_running_loop()
    emfile = OSError(errno.EMFILE, "Too many open files")
    for _ in range(3):  # what BaseSelectorEventLoop._accept_connection passes on
        handler(loop, {"message": "socket.accept() out of system resource", "exception": emfile})
    handler(loop, {"message": "something else", "exception": ValueError("x")})
    assert guard.failures == {"connection_limit": 0, "open_files": 3}
    assert [c["message"] for c in seen] == ["something else"]
    assert guard.budget.max_connections == (1024 - 20 - 64) // 2
