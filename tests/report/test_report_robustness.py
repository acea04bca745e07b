"""The report against servers that answer with something other than a Prometheus API."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from servelens.cli.main import main
from servelens.report.promapi import PromApiError, PromClient
from servelens.testing.static import serve_static

DEEP = b"[" * 200_000 + b"]" * 200_000


@pytest.fixture
def deep_json_server() -> Iterator[str]:
    """A loopback HTTP server answering every GET with JSON nested too deeply to decode."""
    with serve_static(DEEP) as url:
        yield url


def test_prometheus_answer_nested_too_deep_is_a_clear_error(deep_json_server: str, capsys: Any) -> None:
    with pytest.raises(PromApiError, match="not JSON"):
        PromClient(deep_json_server).query("up")
    assert main(["report", "--prometheus", deep_json_server]) == 2
    err = capsys.readouterr().err
    assert err.startswith("servelens: error: ") and "not JSON" in err and "Traceback" not in err
