"""Fixtures of the eval tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from servelens.eval.testing import Endpoint, answering_endpoint


@pytest.fixture
async def endpoint() -> AsyncIterator[Endpoint]:
    async with answering_endpoint() as ep:
        yield ep
