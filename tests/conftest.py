"""Settings shared by every test: hypothesis profiles, and the ``binaries`` marker's rule.

``default``: few examples, so the whole suite stays fast (the fuzz tests take a few seconds together).
``long``: many examples, for a fuzzing run (``SERVELENS_HYPOTHESIS_PROFILE=long python -m pytest -q
tests -k fuzz``, or hypothesis's own ``--hypothesis-profile long``; see docs/counting.md)."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

from servelens.testing.binaries import REQUIRE_ENV, missing_reason, required

settings.register_profile("default", max_examples=100, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("long", max_examples=5000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("SERVELENS_HYPOTHESIS_PROFILE", "default"))


@pytest.hookimpl(tryfirst=True)  # before any fixture starts a server
def pytest_runtest_setup(item: pytest.Item) -> None:
    """``@pytest.mark.binaries("promtool", ...)``: skip with the reason when a program is missing, fail
    instead with ``SERVELENS_REQUIRE_BINARIES=1`` (CI), see :mod:`servelens.testing.binaries`."""
    for mark in item.iter_markers("binaries"):
        reason = missing_reason(mark.args)
        if reason is None:
            continue
        if required():
            pytest.fail(f"{reason}; {REQUIRE_ENV}=1 requires it", pytrace=False)
        pytest.skip(reason)
