"""The report against servers that answer with something other than a Prometheus API."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from servelens.cli.main import main
from servelens.report.promapi import PromApiError, PromClient

DEEP = b"[" * 200_000 + b"]" * 200_000


@pytest.fixture
def deep_json_server() -> Iterator[str]:
    """A loopback HTTP server answering every GET with JSON nested too deeply to decode."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(DEEP)))
            self.end_headers()
            self.wfile.write(DEEP)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_prometheus_answer_nested_too_deep_is_a_clear_error(deep_json_server: str, capsys: Any) -> None:
    with pytest.raises(PromApiError, match="not JSON"):
        PromClient(deep_json_server).query("up")
    assert main(["report", "--prometheus", deep_json_server]) == 2
    err = capsys.readouterr().err
    assert err.startswith("servelens: error: ") and "not JSON" in err and "Traceback" not in err
