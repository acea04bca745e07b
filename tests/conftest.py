"""Settings shared by every test: hypothesis profiles.

``default``: few examples, so the whole suite stays fast (the fuzz tests take a few seconds together).
``long``: many examples, for a fuzzing run (``SERVELENS_HYPOTHESIS_PROFILE=long python -m pytest -q
tests -k fuzz``, or hypothesis's own ``--hypothesis-profile long``; see docs/counting.md)."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile("default", max_examples=100, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("long", max_examples=5000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("SERVELENS_HYPOTHESIS_PROFILE", "default"))
