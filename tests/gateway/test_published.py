"""Worker state files: each worker's counts are in the sum exactly once, before and after it is retired."""

from __future__ import annotations

import asyncio
from pathlib import Path

from servelens.core.merge import merge_snapshots
from servelens.core.snapshot import StateSnapshot, take_snapshot
from servelens.gateway.published import (
    Connections,
    MergedScrape,
    Published,
    StatePublisher,
    abandon,
    read_others,
    read_retired,
    retire,
)
from servelens.prometheus import FrontendMetrics

MS = 1_000_000


def _worker(folder: Path, pid: int, requests: int, in_flight: int) -> tuple[FrontendMetrics, StatePublisher]:
    m = FrontendMetrics(isl_buckets="512,1024")
    m.register_model("m")
    for i in range(requests):
        r = m.begin("m", "chat_completions", "stream", 0)
        r.output(50 * MS)
        r.output(60 * MS, tokens=2)
        r.set_isl(100 + 600 * (i % 2), "final_usage")
        r.finish(70 * MS, "success", osl=3)
    for _ in range(in_flight):
        m.begin("m", "chat_completions", "stream", 0)
    pub = StatePublisher(folder, f"{pid}-0", m, lambda: Connections({"open_files": pid}, 100, 1))
    pub.write()
    return m, pub


def _requests(parts: list[Published]) -> int:
    return sum(c for m in merge_snapshots([p.snapshot for p in parts]).models for _, c in m.requests)


def test_a_retired_worker_counts_once_with_nothing_in_flight(tmp_path: Path) -> None:
    a, _ = _worker(tmp_path, 101, 5, in_flight=2)
    b, _ = _worker(tmp_path, 102, 3, in_flight=0)
    like = take_snapshot(b.state)
    others = read_others(tmp_path, "102-0", like)
    assert len(others) == 1 and others[0].snapshot == take_snapshot(a.state)
    assert others[0].connections == Connections({"open_files": 101}, 100, 1)

    retire(tmp_path, "101-0", like)
    assert not (tmp_path / "worker-101-0.pkl").exists()
    assert read_retired(tmp_path).keys == {"101-0"}
    others = read_others(tmp_path, "102-0", like)
    assert len(others) == 1 and _requests(others) == 5
    assert [m.inflight for m in others[0].snapshot.models] == [0]  # its requests in flight ended with it
    assert others[0].connections == Connections({"open_files": 101}, 0, 1)

    retire(tmp_path, "101-0", like)  # reaped twice: nothing added twice
    assert _requests(read_others(tmp_path, "102-0", like)) == 5
    _worker(tmp_path, 103, 4, in_flight=0)  # the replacement
    retire(tmp_path, "102-0", like)
    assert _requests(read_others(tmp_path, "103-0", like)) == 5 + 3
    assert _requests(read_others(tmp_path, "999-0", like)) == 5 + 3 + 4


def test_a_worker_file_still_listed_after_its_retirement_is_not_added_twice(tmp_path: Path) -> None:
    _, pub = _worker(tmp_path, 201, 2, in_flight=0)
    b, _ = _worker(tmp_path, 202, 1, in_flight=0)
    like = take_snapshot(b.state)
    kept = pub.path.read_bytes()
    retire(tmp_path, "201-0", like)
    pub.path.write_bytes(kept)  # a reader that listed the folder before the removal reads it still
    assert _requests(read_others(tmp_path, "202-0", like)) == 2


def test_the_last_abandoned_worker_removes_the_state_folder(tmp_path: Path) -> None:
    folder = tmp_path / "state"
    folder.mkdir()
    for name in ("worker-11-0.pkl", "worker-12-0.pkl", "worker-12-0.pkl.12.tmp", "retired.pkl"):
        (folder / name).write_bytes(b"x")
    abandon(folder, "12-0")  # another worker still runs: its file and the folder stay
    assert sorted(p.name for p in folder.iterdir()) == ["retired.pkl", "worker-11-0.pkl"]
    abandon(folder, "11-0")
    assert not folder.exists()


def test_a_replacement_given_a_retired_workers_pid_is_counted(tmp_path: Path) -> None:
    # pids come back (pid_max wraps); the supervisor's count of workers started does not
    _worker(tmp_path, 301, 2, in_flight=0)
    b, _ = _worker(tmp_path, 302, 1, in_flight=0)
    like = take_snapshot(b.state)
    retire(tmp_path, "301-0", like)
    again = FrontendMetrics(isl_buckets="512,1024")
    again.register_model("m")
    for _ in range(4):
        again.begin("m", "chat_completions", "stream", 0).finish(10 * MS, "success", osl=1)
    StatePublisher(tmp_path, "301-2", again, Connections).write()  # pid 301 again, the third worker started
    assert _requests(read_others(tmp_path, "302-0", like)) == 2 + 4  # its own file left out


def test_a_scrape_never_shows_less_than_an_earlier_one_on_another_worker(tmp_path: Path) -> None:
    # a TTFT is observed at the first token, long before the request is counted: a scrape on the worker
    # that holds it serves it, and a later scrape on another worker must not lose it again
    a, pub_a = _worker(tmp_path, 401, 0, in_flight=0)
    b, pub_b = _worker(tmp_path, 402, 0, in_flight=0)
    live = a.begin("m", "chat_completions", "stream", 0)
    live.set_isl(100, "first_chunk_usage")
    live.output(40 * MS)  # its TTFT: observed now, not yet written by a count

    def ttft_count(snap: StateSnapshot) -> int:
        (model,) = snap.models
        return model.histograms[0].total  # the stock TTFT histogram

    on_a = asyncio.run(MergedScrape(a, pub_a).snapshot())
    on_b = asyncio.run(MergedScrape(b, pub_b).snapshot())
    assert ttft_count(on_a) == 1
    assert ttft_count(on_b) == 1
