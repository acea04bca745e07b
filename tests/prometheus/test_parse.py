"""servelens.prometheus.parse: reading a /metrics text back, and refusing what is not one."""

from __future__ import annotations

import json

import pytest

from servelens.prometheus.parse import parse_exposition


def test_samples_by_name_and_labels() -> None:
    text = '# TYPE x_total counter\nx_total{model="m",status="success"} 3\ny 1.5\n'
    got = parse_exposition(text)
    assert got[("x_total", (("model", "m"), ("status", "success")))] == 3.0
    assert got[("y", ())] == 1.5


@pytest.mark.parametrize("text", [json.dumps({"requests": 3, "rows": [1, 2]}, indent=2) + "\n", "foo bar baz\n"])
def test_not_exposition_is_one_line_with_a_reason(text: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_exposition(text)
    msg = str(err.value)
    assert msg.startswith("not Prometheus text exposition: ")
    assert msg.removeprefix("not Prometheus text exposition: ").strip()  # a reason, never empty
    assert "\n" not in msg
