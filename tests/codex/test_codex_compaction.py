"""The real Codex CLI through a long session that compacts, remotely and locally.

A scripted Chat backend behind the gateway (a subprocess) plays a model that runs one
shell command per turn for `STEPS` turns, then answers. It reports usage that grows with
the tool results in its prompt, so that Codex, with a small `model_auto_compact_token_limit`,
compacts every few steps:

- provider named `"OpenAI"`: Codex compacts remotely (a `compaction_trigger` item); the
  gateway runs the handover turn on the backend (the backend sees the gateway's prompt),
  returns one `compaction` item, and lowers it to its summary on the next turns;
- provider named otherwise: Codex compacts locally (its own prompt, an ordinary turn).

Either way the first turn after each compaction must show the backend that compaction's
summary, and the session must finish, over HTTP and over WebSocket.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from codex_harness import (
    SniffingProxy,
    codex_binary,
    http_get_json,
    run_codex,
    start_gateway,
)
from scripted_backend import (
    DONE,
    ScriptedBackend,
    finish,
    reasoning_chunks,
    text_chunks,
    tool_call_chunks,
    usage,
)

from streamer.core.compaction import HANDOVER_PROMPT

pytestmark = [
    pytest.mark.codex,
    pytest.mark.skipif(
        codex_binary() is None, reason="Codex CLI not installed (scripts/install-codex.sh)"
    ),
]

STEPS = 12
TOKENS_PER_RESULT = 1000  # prompt tokens the backend reports per tool result in its prompt
AUTO_COMPACT_LIMIT = 3500  # so Codex compacts after every fourth step
LOCAL_PROMPT_MARK = "CONTEXT CHECKPOINT COMPACTION"  # Codex's own compaction prompt
FINAL = "ALL-STEPS-DONE"
PROMPT = "Run the steps one by one until you are done."


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return content or ""


@dataclass
class LongSession:
    """The backend's model: a shell step per turn, a summary when asked to compact."""

    steps: int = STEPS
    calls: int = 0
    compactions: dict[str, int] = field(default_factory=lambda: {"remote": 0, "local": 0})
    summaries: list[str] = field(default_factory=list)
    # for each compaction: did the first ordinary turn after it show its summary?
    seen_after: list[bool] = field(default_factory=list)
    waiting: bool = False  # a compaction happened, its next ordinary turn not yet seen
    trace: list[str] = field(default_factory=list)  # one line per request, for failures
    # earlier tool-call turns replayed without their reasoning_content (DeepSeek needs it)
    unreasoned: list[str] = field(default_factory=list)

    def __call__(self, body: dict[str, Any]) -> list[Any]:
        messages = body["messages"]
        last = _text(messages[-1]) if messages[-1].get("role") == "user" else ""
        if last == HANDOVER_PROMPT:
            return self._summary("remote", body)
        if LOCAL_PROMPT_MARK in last:
            return self._summary("local", body)
        everything = "\n".join(_text(m) for m in messages)
        if self.waiting:
            self.seen_after.append(self.summaries[-1] in everything)
            self.waiting = False
        results = sum(m.get("role") == "tool" for m in messages)
        for m in messages:
            for call in m.get("tool_calls") or ():
                if m.get("reasoning_content") != f"thinking about {call['id']}":
                    self.unreasoned.append(call["id"])
        self.trace.append(f"turn: {len(messages)} messages, {results} results")
        end = [usage(200 + TOKENS_PER_RESULT * results, 20), DONE]
        if self.calls >= self.steps:
            return [*text_chunks([f"{FINAL} after {self.calls} steps"]), finish("stop"), *end]
        self.calls += 1
        arguments = f'{{"cmd": "echo STEP-{self.calls}-RAN"}}'
        call_id = f"call_step_{self.calls}"
        call = tool_call_chunks(0, call_id, ["exec_command"], [arguments])
        return [*reasoning_chunks([f"thinking about {call_id}"]), *call, finish("tool_calls"), *end]

    def _summary(self, kind: str, body: dict[str, Any]) -> list[Any]:
        self.compactions[kind] += 1
        self.trace.append(f"{kind} compaction: {len(body['messages'])} messages")
        marker = f"HANDOFF-{len(self.summaries) + 1}"
        self.summaries.append(marker)
        self.waiting = True
        text = f"{marker}: {self.calls} of {self.steps} steps ran; keep going."
        assert "tools" not in body or kind == "local"  # the gateway's handover turn has none
        return [*text_chunks([text]), finish("stop"), usage(300, 40), DONE]


async def _session(
    tmp_path: Path, *, remote: bool, websockets: bool
) -> tuple[LongSession, Any, Any, dict[str, Any]]:
    session = LongSession()
    backend = ScriptedBackend()
    backend.responder = session
    upstream = await backend.start()
    try:
        async with (
            start_gateway(
                tmp_path / "gateway.log", "--upstream", upstream, "--backend-profile", "deepseek"
            ) as gateway,
            SniffingProxy(gateway.port) as proxy,
        ):
            run = await run_codex(
                f"http://127.0.0.1:{proxy.port}/v1",
                PROMPT,
                tmp_path,
                supports_websockets=websockets,
                timeout=240,
                extra_args=("-c", f"model_auto_compact_token_limit={AUTO_COMPACT_LIMIT}"),
                # remote: the printed config names the provider "OpenAI"
                config_args=("--codex-remote-compaction",) if remote else (),
            )
            stats = (await http_get_json(f"http://127.0.0.1:{gateway.port}/healthz"))["stats"]
    finally:
        await backend.stop()
    return session, run, proxy.traffic, stats


def _assert_long_session(session: LongSession, run: Any, kind: str) -> None:
    assert run.returncode == 0, run.describe()
    assert session.calls == STEPS, (session, run.describe())
    ran = [i for i in run.items("command_execution") if "RAN" in str(i.get("aggregated_output"))]
    assert len(ran) == STEPS, run.describe()
    messages = [i.get("text", "") for i in run.items("agent_message")]
    assert any(FINAL in m for m in messages), run.describe()
    other = "local" if kind == "remote" else "remote"
    assert session.compactions[kind] >= 2 and session.compactions[other] == 0, "; ".join(
        session.trace
    )
    # the turn after each compaction saw its summary (the last may have ended the session)
    assert all(session.seen_after) and len(session.seen_after) >= 2, session
    assert "remote compaction" not in run.stderr, run.describe()
    # the reasoning of every earlier tool-call turn came back with it (sealed and opened)
    assert session.unreasoned == [], session.unreasoned


@pytest.mark.parametrize("websockets", [False, True], ids=["http", "websocket"])
async def test_codex_compacts_remotely_through_the_gateway(
    tmp_path: Path, websockets: bool
) -> None:
    session, run, traffic, stats = await _session(tmp_path, remote=True, websockets=websockets)
    _assert_long_session(session, run, "remote")
    _assert_transport(run, traffic, stats, websockets)


@pytest.mark.parametrize("websockets", [False, True], ids=["http", "websocket"])
async def test_codex_compacts_locally_with_another_provider_name(
    tmp_path: Path, websockets: bool
) -> None:
    session, run, traffic, stats = await _session(tmp_path, remote=False, websockets=websockets)
    _assert_long_session(session, run, "local")
    _assert_transport(run, traffic, stats, websockets)


def _assert_transport(run: Any, traffic: Any, stats: dict[str, Any], websockets: bool) -> None:
    if websockets:
        assert run.fallback_messages() == [], run.describe()
        assert stats["ws_turns"] >= STEPS and stats["http_turns"] == 0, stats
        assert traffic.count("POST /v1/responses") == 0, traffic
    else:
        assert traffic.switched == 0 and traffic.count("POST /v1/responses") > STEPS, traffic
