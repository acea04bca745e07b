"""servelens.asgi.MetricsMiddleware on the edges an adversarial tester found: settings given empty, lax
``stream`` values, made-up model names, absurd usage. Called directly (servelens.asgi.testing); counts,
never speed."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from servelens.asgi import MetricsMiddleware
from servelens.asgi.testing import TinyApp, lifespan


@pytest.mark.parametrize("value", ["", "  "])
async def test_isl_buckets_variable_set_empty_fails_startup_in_one_line(value: str) -> None:
    """``SERVELENS_ISL_BUCKETS=''`` is an error, as ``--isl-buckets ''`` is (was: the defaults in silence)."""
    tiny = TinyApp()
    mw = MetricsMiddleware(tiny, registry=CollectorRegistry(), environ={"SERVELENS_ISL_BUCKETS": value})
    assert mw.error == (f"servelens.asgi.MetricsMiddleware: SERVELENS_ISL_BUCKETS={value!r} is empty: give "
                        "boundaries in tokens (e.g. 512,1024,2048) or 'off' to turn the by-ISL metrics off")
    assert await lifespan(mw, {"app": tiny}) == [{"type": "lifespan.startup.failed", "message": mw.error}]
    assert mw.metrics is None


def test_isl_buckets_variable_unset_or_off() -> None:
    unset = MetricsMiddleware(TinyApp(), registry=CollectorRegistry(), environ={})
    assert unset.error is None and unset.settings.isl_buckets == "512,1024,2048,4096,8192,16384"
    off = MetricsMiddleware(TinyApp(), registry=CollectorRegistry(), environ={"SERVELENS_ISL_BUCKETS": " off "})
    assert off.error is None and off.settings.isl_buckets is None
