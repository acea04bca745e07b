"""A stop signal whose KeyboardInterrupt Python dropped still stops the demo and its bench.

The demo turns SIGTERM and SIGHUP into KeyboardInterrupt; raised inside a finalizer, Python prints
"Exception ignored" and goes on, and the demo once kept replaying until a second SIGTERM. The handler
records the signal first (:func:`servelens.serving.note_stop_signal`): the bench stops on it when it
takes the signals over, and the demo when its run ends.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from servelens.bench import BenchConfig, run_bench_sync
from servelens.demo import _terminate_as_interrupt
from servelens.process import ServerProcess
from servelens.serving import clear_stop_signals, note_stop_signal, pending_stop_signal

pytestmark = pytest.mark.skipif(threading.current_thread() is not threading.main_thread(),
                                reason="signal handlers are the main thread's")


@pytest.fixture(autouse=True)
def _clean() -> Iterator[None]:
    clear_stop_signals()
    yield
    clear_stop_signals()


def test_the_handler_records_the_signal_before_raising() -> None:
    seen: list[str | None] = []
    with pytest.raises(KeyboardInterrupt, match=r"^SIGTERM$"), _terminate_as_interrupt():
        try:
            signal.raise_signal(signal.SIGTERM)
        finally:
            seen.append(pending_stop_signal())
    assert seen == ["SIGTERM"]
    assert pending_stop_signal() is None, "cleared once the interrupt left the demo"


def test_a_dropped_interrupt_still_ends_the_demo_when_its_run_ends() -> None:
    with pytest.raises(KeyboardInterrupt, match=r"^SIGHUP$"), _terminate_as_interrupt():
        note_stop_signal("SIGHUP")  # what the handler did before its exception was dropped
    assert pending_stop_signal() is None


def test_without_a_signal_the_demo_ends_normally() -> None:
    with _terminate_as_interrupt():
        pass
    assert pending_stop_signal() is None


def test_the_bench_stops_at_once_on_a_signal_recorded_before_it_started(tmp_path: Path) -> None:
    # 20 requests of 50 tokens: without the pick-up the run finishes and nothing is raised
    with ServerProcess(["sim", "--speedup", "50"]) as sim:
        note_stop_signal("SIGTERM")
        with pytest.raises(KeyboardInterrupt, match=r"^SIGTERM$"):
            run_bench_sync(BenchConfig(url=sim.url, isl="64", osl="50", num_requests=20, concurrency=2,
                                       output_dir=str(tmp_path)))
