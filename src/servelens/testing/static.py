"""A loopback HTTP server that answers GETs with fixed (or freshly computed) bytes, for tests."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@contextmanager
def serve_static(
    body: bytes | Callable[[], bytes],
    content_type: str = "application/json",
    status: int = 200,
    path: str | None = None,
) -> Iterator[str]:
    """Serve ``body`` (bytes, or a callable called per request) with ``status`` to every GET on
    ``http://127.0.0.1:PORT`` (a free port); with ``path``, other paths get a 404.

    Yields the base URL (no trailing slash); the server thread is stopped on exit.
    """

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if path is not None and self.path.split("?")[0] != path:
                self.send_error(404)
                return
            data = body() if callable(body) else body
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:  # quiet
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="servelens-static", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
