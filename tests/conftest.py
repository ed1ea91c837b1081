"""Shared fixtures: test helpers live beside the tests and import as plain modules."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from collections.abc import AsyncIterator

import pytest
from harness import GatewayHarness
from openai import AsyncOpenAI


@pytest.fixture
async def gw() -> AsyncIterator[GatewayHarness]:
    """The gateway (memory store) in front of a scripted backend, both on loopback."""
    async with GatewayHarness() as harness:
        yield harness


@pytest.fixture
async def client(gw: GatewayHarness) -> AsyncIterator[AsyncOpenAI]:
    """The official SDK pointed at the gateway (no retries: each request is one attempt)."""
    async with AsyncOpenAI(base_url=gw.url, api_key="test-key", max_retries=0) as sdk:
        yield sdk
