"""An nginx (Debian package ``nginx``) on a free loopback port in front of an upstream, for tests and
benchmarks: started from a temporary config, stopped on exit."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from servelens.process import free_port
from servelens.testing.binaries import find_binary

UNBUFFERED = """
            proxy_pass http://engine;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_read_timeout 600s;
"""
"""A ``location`` as a streaming proxy should be set up: keep-alive HTTP/1.1 upstream, no buffering."""

PROXY_PASS_ONLY = """
            proxy_pass http://engine;
"""
"""A ``location`` with nginx's defaults: ``proxy_buffering on``, HTTP/1.0 to the upstream."""


def nginx_binary() -> str | None:
    """The nginx binary, or None when it is not installed."""
    return find_binary("nginx")


@dataclass
class Nginx:
    """An nginx started from a temporary config (one worker)."""

    url: str
    proc: subprocess.Popen[bytes]
    prefix: Path

    def pids(self) -> list[int]:
        """Master and worker pids."""
        out = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True).stdout
        return [self.proc.pid, *(int(p) for p in out.split())]


@contextmanager
def run_nginx(upstream_url: str | Sequence[str], location: str = UNBUFFERED) -> Iterator[Nginx]:
    """Start nginx on 127.0.0.1 (a free port) proxying every path to ``upstream_url`` (``http://host:port``;
    several: nginx's round robin over them, one request each in turn) with the directives ``location``
    (upstream block name ``engine``); stop it on exit. Raises RuntimeError when nginx is not installed
    or does not start within 10 s."""
    binary = nginx_binary()
    if binary is None:
        raise RuntimeError("nginx is not installed (Debian package nginx)")
    prefix = Path(tempfile.mkdtemp(prefix="servelens-nginx-"))
    os.chmod(prefix, 0o777)
    port = free_port()
    urls = [upstream_url] if isinstance(upstream_url, str) else list(upstream_url)
    servers = " ".join(f"server {u.removeprefix('http://')};" for u in urls)
    conf = prefix / "nginx.conf"
    conf.write_text(f"""
worker_processes 1;
daemon off;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
events {{ worker_connections 8192; }}
http {{
    access_log off;
    client_body_temp_path {prefix}/body;
    proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
    upstream engine {{ {servers} keepalive 1024; }}
    server {{
        listen 127.0.0.1:{port} backlog=2048;
        location / {{{location}        }}
    }}
}}
""")
    proc = subprocess.Popen([binary, "-p", str(prefix), "-c", str(conf)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    err = proc.stderr.read().decode() if proc.stderr else ""
                    raise RuntimeError(f"nginx did not start: {err.strip()}") from None
                time.sleep(0.05)  # startup poll of a child process, not a test wait
        yield Nginx(f"http://127.0.0.1:{port}", proc, prefix)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(prefix, ignore_errors=True)
