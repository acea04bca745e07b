"""Fixtures for the gateway tests (helpers live in :mod:`servelens.gateway.testing`)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest

from servelens.gateway.testing import ScriptedUpstream


@pytest.fixture
async def fake() -> AsyncIterator[ScriptedUpstream]:
    up = await ScriptedUpstream().start()
    try:
        yield up
    finally:
        await up.stop()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s
