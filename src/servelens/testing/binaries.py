"""The outside programs some tests need (Debian packages), and what a test does when one is missing.

A test marked ``@pytest.mark.binaries("promtool", ...)`` is skipped, with the missing program and its
Debian package as the reason, when one is not installed; with ``SERVELENS_REQUIRE_BINARIES=1`` in the
environment (``.ci/run`` sets it) the same test fails instead, so CI never skips them in silence.
``tests/conftest.py`` applies the rule.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from pathlib import Path

REQUIRE_ENV = "SERVELENS_REQUIRE_BINARIES"
"""Environment variable: ``1`` turns a missing program into a test failure (CI)."""

PACKAGES: dict[str, str] = {
    "prometheus": "prometheus",
    "promtool": "prometheus",
    "victoria-metrics": "victoria-metrics",
    "nginx": "nginx",
}
"""Program -> the Debian package that installs it."""

_SBIN = (Path("/usr/sbin"), Path("/sbin"))  # nginx lives there, often off a normal user's PATH


def find_binary(name: str) -> str | None:
    """The program's path: from ``PATH``, else ``/usr/sbin`` or ``/sbin``; None when not installed."""
    found = shutil.which(name)
    if found:
        return found
    for d in _SBIN:
        if (d / name).is_file() and os.access(d / name, os.X_OK):
            return str(d / name)
    return None


def missing_reason(names: Iterable[str]) -> str | None:
    """None when every program in ``names`` is installed, else one line naming the missing ones and
    the ``apt-get install`` that brings them."""
    missing = [n for n in names if find_binary(n) is None]
    if not missing:
        return None
    packages = sorted({PACKAGES.get(n, n) for n in missing})
    return f"needs {', '.join(missing)} (not installed: apt-get install {' '.join(packages)})"


def required() -> bool:
    """True when a missing program must fail the test (``SERVELENS_REQUIRE_BINARIES=1``)."""
    return os.environ.get(REQUIRE_ENV, "") == "1"
