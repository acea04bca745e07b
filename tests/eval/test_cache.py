"""The response cache: what its key covers, and what survives an interrupted write."""

from __future__ import annotations

from pathlib import Path

import pytest

from servelens.eval.cache import ResponseCache, cache_key

URL = "http://127.0.0.1:8000/v1/chat/completions"
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


def test_key_differs_by_endpoint_model_request_and_run() -> None:
    base = cache_key(URL, "m", BODY, 0)
    assert base == cache_key(URL, "m", dict(reversed(list(BODY.items()))), 0)  # key order does not matter
    assert cache_key("http://127.0.0.1:8001/v1/chat/completions", "m", BODY, 0) != base  # another endpoint
    assert cache_key(URL, "m2", BODY, 0) != base  # another model, same body (lm-eval issue 4063)
    assert cache_key(URL, "m", BODY | {"temperature": 0}, 0) != base  # another request
    assert cache_key(URL, "m", BODY, 1) != base  # another run


def test_answers_persist_and_no_cache_ignores_them(tmp_path: Path) -> None:
    path = tmp_path / "cache.jsonl"
    c = ResponseCache(path)
    c.put("k1", {"choices": []}, 123)
    c.close()
    again = ResponseCache(path)
    hit = again.get("k1")
    assert hit is not None and hit.latency_ns == 123 and hit.response == {"choices": []}
    assert len(ResponseCache(path, read=False)) == 0


def test_interrupted_last_line_is_dropped_and_appends_stay_clean(tmp_path: Path) -> None:
    path = tmp_path / "cache.jsonl"
    c = ResponseCache(path)
    c.put("k1", {"a": 1}, 1)
    c.close()
    with path.open("a") as f:
        f.write('{"key": "k2", "latency_ns": 2, "resp')  # the write a kill cut short
    d = ResponseCache(path)
    assert d.get("k2") is None and d.get("k1") is not None
    d.put("k3", {"b": 2}, 3)
    d.close()
    e = ResponseCache(path)
    assert e.get("k3") is not None and len(e) == 2


def test_not_a_cache_file(tmp_path: Path) -> None:
    path = tmp_path / "cache.jsonl"
    path.write_text("hello\nworld\n")
    with pytest.raises(ValueError, match="line 1: not a servelens eval cache line"):
        ResponseCache(path)
