"""servelens.process: child servers never outlive the process that started them."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys

PARENT = """
import sys
from servelens.process import ServerProcess
srv = ServerProcess(["sim"]).start()
print(srv.proc.pid, srv.url, flush=True)
sys.stdin.read()  # until the test kills us
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ", 1)[1][0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


def test_child_server_stops_when_its_parent_is_killed() -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        pid_text, url = parent.stdout.readline().split()
        child = int(pid_text)
        assert url.startswith("http://127.0.0.1:")  # loopback unless told otherwise
        assert _alive(child)
        gone = os.pidfd_open(child)  # readable once the process has exited (a non-child has no wait())
        try:
            parent.send_signal(signal.SIGKILL)  # no cleanup runs in the parent: only the kernel can tell the child
            parent.wait(timeout=10)
            readable, _, _ = select.select([gone], [], [], 15)
            assert readable, "the sim outlived its SIGKILLed parent"
        finally:
            os.close(gone)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(timeout=10)
        if "child" in locals() and _alive(child):
            os.killpg(child, signal.SIGKILL)
