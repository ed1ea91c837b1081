"""Which backend profile fits the backend (issue 15): a pure recognition over the base
URL, headers and `GET /models` answer (table-driven), and the startup probe that logs it
without delaying startup."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import orjson
import pytest
from aiohttp import web
from harness import GatewayHarness
from openai import AsyncOpenAI
from scripted_backend import ScriptedBackend

from streamer.app import PROFILE_PROBE
from streamer.upstream.chat.detect import fitting_profile

LOCAL = "http://127.0.0.1:8000/v1"


def _models(*entries: dict[str, Any], **extra: Any) -> bytes:
    return orjson.dumps({"object": "list", "data": list(entries), **extra})


# case -> (base URL, headers, status, body, the profile that fits)
CASES: dict[str, tuple[str, dict[str, str], int, bytes, str | None]] = {
    "vllm": (
        LOCAL,
        {"server": "uvicorn"},
        200,
        _models({"id": "Qwen/Qwen3-8B", "object": "model", "owned_by": "vllm", "root": "x"}),
        "vllm",
    ),
    "sglang": (LOCAL, {}, 200, _models({"id": "m", "owned_by": "sglang"}), "sglang"),
    "llama.cpp": (
        "http://127.0.0.1:8001/v1",
        {},
        200,
        _models({"id": "tiny", "owned_by": "llamacpp", "meta": {}}, models=[{"name": "tiny"}]),
        "llamacpp",
    ),
    "ollama": (
        "http://127.0.0.1:11434/v1",
        {},
        200,
        _models({"id": "qwen3:8b", "object": "model", "created": 1, "owned_by": "library"}),
        "ollama",
    ),
    "lm studio": (
        "http://127.0.0.1:1234/v1",
        {},
        200,
        _models({"id": "qwen/qwen3-8b", "object": "model", "owned_by": "organization_owner"}),
        "lmstudio",
    ),
    "openrouter by its fields": (
        "http://router.internal/api/v1",
        {},
        200,
        _models(
            {"id": "a/b", "canonical_slug": "a/b", "pricing": {}, "top_provider": {}, "name": "B"}
        ),
        "openrouter",
    ),
    "openrouter by host": ("https://openrouter.ai/api/v1", {}, 401, b"", "openrouter"),
    "deepseek by host": ("https://api.deepseek.com", {}, 200, b"{}", "deepseek"),
    "deepseek by owner": (LOCAL, {}, 200, _models({"id": "x", "owned_by": "deepseek"}), "deepseek"),
    "kimi": ("https://api.moonshot.ai/v1", {}, 200, b"", "kimi"),
    "glm": ("https://open.bigmodel.cn/api/paas/v4", {}, 200, b"", "glm"),
    "openai by host": ("https://api.openai.com/v1", {}, 200, b"", "openai"),
    "openai by header": (
        "https://gateway.example/v1",
        {"OpenAI-Organization": "org-1", "openai-processing-ms": "5"},
        200,
        _models({"id": "gpt-5", "owned_by": "system"}),
        "openai",
    ),
    # nothing says: a LiteLLM proxy says "openai" of every model it lists ...
    "litellm": (LOCAL, {}, 200, _models({"id": "m", "owned_by": "openai"}), None),
    # ... but its answers carry its version
    "litellm by header": (
        LOCAL,
        {"x-litellm-version": "1.80.0"},
        200,
        _models({"id": "m", "owned_by": "openai"}),
        "litellm",
    ),
    "anthropic by host": ("https://api.anthropic.com/v1", {}, 401, b"", "anthropic"),
    "anthropic by header": (
        "https://claude-gw.example/v1",
        {"anthropic-organization-id": "org-1"},
        200,
        b"{}",
        "anthropic",
    ),
    "anthropic by its model list": (
        "https://claude-gw.example/v1",
        {},
        200,
        orjson.dumps(
            {
                "data": [
                    {
                        "type": "model",
                        "id": "claude-sonnet-4-5",
                        "display_name": "Claude Sonnet 4.5",
                        "created_at": "2025-09-29T00:00:00Z",
                    }
                ],
                "has_more": False,
                "first_id": "claude-sonnet-4-5",
                "last_id": "claude-sonnet-4-5",
            }
        ),
        "anthropic",
    ),
    "an error": (LOCAL, {}, 404, _models({"id": "m", "owned_by": "vllm"}), None),
    "not json": (LOCAL, {}, 200, b"<html>", None),
    "a list": (LOCAL, {}, 200, b"[]", None),
    "no data": (LOCAL, {}, 200, b'{"data": "x"}', None),
}


@pytest.mark.parametrize("case", list(CASES))
def test_fitting_profile(case: str) -> None:
    base_url, headers, status, body, profile = CASES[case]
    fit = fitting_profile(base_url, headers, status, body)
    assert (fit.profile if fit else None) == profile
    if fit is not None:
        assert fit.reason


class OwnedBy(ScriptedBackend):
    """A backend whose `GET /v1/models` says who serves it; `hold` keeps it from answering."""

    def __init__(self, owner: str, hold: asyncio.Event | None = None) -> None:
        super().__init__()
        self.owner, self.hold = owner, hold

    async def _models(self, request: web.Request) -> web.Response:
        if self.hold is not None:
            await self.hold.wait()
        data = [{"id": "m", "object": "model", "created": 0, "owned_by": self.owner}]
        return web.json_response({"object": "list", "data": data})


async def test_startup_logs_the_profile_that_fits(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "streamer.upstream")
    async with GatewayHarness(backend=OwnedBy("vllm"), profile_probe=True) as gw:
        assert gw.runner is not None
        fit = await gw.runner.app[PROFILE_PROBE].task
    assert fit is not None and fit.profile == "vllm"
    (line,) = [r.getMessage() for r in caplog.records if "fits it" in r.getMessage()]
    assert "looks like vllm" in line and "--backend-profile vllm" in line
    assert "configured: generic" in line


async def test_nothing_is_logged_when_the_configured_profile_fits(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "streamer.upstream")
    async with GatewayHarness(
        backend=OwnedBy("llamacpp"), backend_profile="llamacpp", profile_probe=True
    ) as gw:
        assert gw.runner is not None
        await gw.runner.app[PROFILE_PROBE].task
    assert not [r for r in caplog.records if "fits it" in r.getMessage()]


async def test_a_backend_that_never_lists_its_models_delays_nothing() -> None:
    """The probe waits in the background; turns are served meanwhile, and shutdown ends it."""
    backend = OwnedBy("vllm", hold=asyncio.Event())
    async with (
        GatewayHarness(backend=backend, profile_probe=True) as gw,
        AsyncOpenAI(base_url=gw.url, api_key="k", max_retries=0) as sdk,
    ):
        response = await sdk.responses.create(model="m", input="hi")
        assert gw.runner is not None
        task = gw.runner.app[PROFILE_PROBE].task
        assert not task.done()
    assert response.status == "completed"
    assert task.cancelled()


async def test_the_probe_gives_up_within_its_bound(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "streamer.upstream")
    backend = OwnedBy("vllm", hold=asyncio.Event())
    async with GatewayHarness(
        backend=backend, upstream_connect_timeout=0.2, profile_probe=True
    ) as gw:
        assert gw.runner is not None
        assert await gw.runner.app[PROFILE_PROBE].task is None
    assert any("could not ask the backend" in r.getMessage() for r in caplog.records)
