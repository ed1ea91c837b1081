"""A backend kind is one row (streamer/upstream/kind.py): a third kind added to the list is
served end to end with nothing else changed: `api = "..."` in `--config`, a fallback to it
lowered by its own lowering, its path, body, headers and key header on the wire, its
decoders on the answer, and `streamer replay` recognising a recording of it."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import openai
import pytest
from aiohttp import web
from scripted_backend import ScriptedBackend, Status

from streamer.app import create_app
from streamer.config import Settings
from streamer.core.lowering import lower
from streamer.frontends.frontdoor import GuardedSite
from streamer.tap.replay import Recording
from streamer.upstream.chat.kind import CHAT, streaming
from streamer.upstream.chat.profiles import BackendProfile
from streamer.upstream.kind import STREAM_HEADERS, Body
from streamer.upstream.kinds import KINDS

KEY = "sk-third-kind"


def _lower(request: Any, items: Any, names: Any, options: Any) -> dict[str, Any]:
    return {**lower(request, items, names, options), "lowered_by": "third"}


def _body(profile: BackendProfile) -> Body:
    return lambda body: {**streaming(True, body), "sent_by": "third"}


# Chat Completions on the wire (so the scripted backend can answer it), but every field of
# its own: how it is lowered, sent (body, headers, the key's header) and recognised.
THIRD = replace(
    CHAT,
    name="third",
    lower=_lower,
    body=_body,
    headers=(*STREAM_HEADERS, ("x-kind-version", "3")),
    auth=lambda key: ("x-api-key", key),
    recorded=lambda sent: sent.get("lowered_by") == "third",
    tap=None,
    embedded=False,
)

CONFIG = """
[[models]]
name = "first"
upstreams = ["{first}"]
fallbacks = ["third"]

[[models]]
name = "third"
api = "third"
upstreams = ["{third}"]
api_key_env = "THIRD_KEY"
"""


@contextlib.asynccontextmanager
async def _gateway(path: Path) -> AsyncIterator[str]:
    """A gateway serving the config file at `path`: its /v1 URL."""
    settings = Settings(config=str(path), profile_probe=False, health_interval=0)
    runner = web.AppRunner(create_app(settings), handler_cancellation=True)
    await runner.setup()
    try:
        site = GuardedSite(runner, "127.0.0.1", 0)
        await site.start()
        yield f"http://127.0.0.1:{site.port}/v1"
    finally:
        await runner.cleanup()


async def test_a_third_kind_is_one_row(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(KINDS, "third", THIRD)
    monkeypatch.setenv("THIRD_KEY", KEY)
    first = ScriptedBackend(default_script=[Status(503, {"error": {"message": "down"}})])
    third = ScriptedBackend()
    async with first, third:
        path = tmp_path / "streamer.toml"
        path.write_text(CONFIG.format(first=first.base_url, third=third.base_url))
        async with _gateway(path) as url:
            client = openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0)
            answer = await client.responses.create(model="first", input="hi")
    assert answer.model == "third" and answer.output_text == "Hello!"
    (sent,) = third.requests
    assert sent["lowered_by"] == "third" and sent["sent_by"] == "third"
    headers = third.records[-1].headers
    assert headers["x-api-key"] == KEY and "Authorization" not in headers
    assert headers["x-kind-version"] == "3"
    assert "lowered_by" not in first.requests[0]  # the first model's own kind: Chat
    recording = Recording([{"kind": "backend_request", "body": sent}])
    assert recording.kind is THIRD
