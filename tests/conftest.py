"""Shared fixtures: test helpers live beside the tests and import as plain modules.

Every test runs under `_conformance`: each Response, streaming event (SSE, WebSocket,
background log) and error body the in-process gateway emits is recorded and, at the
test's end, checked against the Open Responses spec and the OpenAI SDK's types
(tests/conformance.py); a violation fails the test. `@pytest.mark.emits_invalid` opts a
test out (one that makes the gateway relay something broken on purpose).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from conformance import Collector
from harness import GatewayHarness
from openai import AsyncOpenAI

from streamer.core.errors import RequestError
from streamer.frontends import background, endpoint, http, retrieval, websocket


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


def _record_sends(monkeypatch: pytest.MonkeyPatch, cls: type, collector: Collector) -> None:
    original = cls.send

    async def send(self: Any, events: Any, *args: Any) -> None:
        for event in events:
            collector.add("event", event.data)
        await original(self, events, *args)

    monkeypatch.setattr(cls, "send", send)


def _record_returns(
    monkeypatch: pytest.MonkeyPatch, owner: Any, name: str, kind: str, collector: Collector
) -> None:
    original = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        collector.add(kind, result if kind != "json" else args[0] if args else kwargs["body"])
        return result

    monkeypatch.setattr(owner, name, wrapper)


@pytest.fixture(autouse=True)
def _conformance(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Collector]:
    collector = Collector()
    if request.node.get_closest_marker("emits_invalid") is None:
        _record_sends(monkeypatch, endpoint.SSESink, collector)  # both servers' streams
        _record_sends(monkeypatch, websocket.Session, collector)
        _record_sends(monkeypatch, background._LogSink, collector)
        for module in (http, retrieval):
            _record_returns(monkeypatch, module, "json_response", "json", collector)
        _record_returns(monkeypatch, endpoint, "json_body", "json", collector)
        _record_returns(monkeypatch, background, "error_event", "event", collector)
        _record_returns(monkeypatch, RequestError, "body", "http_error", collector)
        _record_returns(monkeypatch, RequestError, "ws_event", "ws_error", collector)
    yield collector
    problems = collector.violations()
    if problems:
        shown = "\n".join(problems[:20])
        pytest.fail(
            f"{len(problems)} conformance violation(s) in what the gateway emitted:\n{shown}",
            pytrace=False,
        )
