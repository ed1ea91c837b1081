"""The real Codex CLI through the gateway in front of an Anthropic Messages backend (issue 29).

The scripted Messages backend (tests/scripted_messages_backend.py) plays Claude with thinking
on: each turn it thinks (a signed thinking block), then runs one shell command through
Codex's `exec_command`, for `STEPS` turns, then answers. It refuses, as the API does, a
thinking block whose signature it did not make and a tool loop whose last call comes back
without its thinking block first; and it checks, on every turn, that every earlier call of
the session comes back after the very thinking block that preceded it. Codex keeps nothing
at the gateway (`store: false`): it is the reasoning items' sealed `encrypted_content` that
carries the signatures from turn to turn. Over HTTP and over the WebSocket mode.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from codex_harness import SniffingProxy, codex_binary, run_codex, start_gateway
from scripted_backend import DONE, finish, reasoning_chunks, text_chunks, tool_call_chunks, usage
from scripted_messages_backend import ScriptedMessagesBackend

pytestmark = [
    pytest.mark.codex,
    pytest.mark.skipif(
        codex_binary() is None, reason="Codex CLI not installed (scripts/install-codex.sh)"
    ),
]
STEPS = 3
FINAL = "ALL-STEPS-DONE"
PROMPT = "Run the steps one by one until you are done."


def _thought(call_id: str) -> str:
    return f"Next I run the step of {call_id}."


def _result_text(block: dict[str, Any]) -> str:
    content = block.get("content") or ""
    if isinstance(content, str):
        return content
    return "\n".join(b.get("text", "") for b in content if isinstance(b, dict))


@dataclass
class ThinkingSession:
    """The backend's model: think, run a step, for `steps` turns; then answer."""

    steps: int = STEPS
    calls: int = 0
    thinking: list[Any] = field(default_factory=list)  # each request's `thinking`
    unthought: list[str] = field(default_factory=list)  # calls that came back without theirs
    ran: list[str] = field(default_factory=list)  # calls whose result shows the step ran
    trace: list[str] = field(default_factory=list)

    def __call__(self, body: dict[str, Any]) -> list[Any]:
        self.thinking.append(body.get("thinking"))
        messages = body["messages"]
        self.trace.append(f"turn: {len(messages)} messages, tools={len(body.get('tools', []))}")
        for message in messages:
            self._check(message)
        if self.calls >= self.steps:
            return [*text_chunks([f"{FINAL} after {self.calls} steps"]), finish("stop"),
                    usage(300, 20), DONE]  # fmt: skip
        self.calls += 1
        call_id = f"toolu_step_{self.calls}"
        arguments = f'{{"cmd": "echo STEP-{self.calls}-RAN"}}'
        return [
            *reasoning_chunks([_thought(call_id)]),
            *tool_call_chunks(0, call_id, ["exec_command"], [arguments]),
            finish("tool_calls"),
            usage(300, 20),
            DONE,
        ]

    def _check(self, message: dict[str, Any]) -> None:
        content = message["content"] if isinstance(message["content"], list) else []
        if message["role"] == "user":
            for block in content:
                use_id = block.get("tool_use_id")
                if "RAN" in _result_text(block) and use_id not in self.ran:
                    self.ran.append(use_id)
            return
        for i, block in enumerate(content):
            if block.get("type") != "tool_use":
                continue
            before = content[i - 1] if i else {}
            if before.get("type") != "thinking" or before.get("thinking") != _thought(block["id"]):
                self.unthought.append(block["id"])


async def _session(tmp_path: Path, websocket: bool) -> tuple[ThinkingSession, Any, Any, Any]:
    session = ThinkingSession()
    backend = ScriptedMessagesBackend(responder=session)
    upstream = await backend.start()
    try:
        flags = ["--upstream", upstream, "--upstream-api", "anthropic"]
        flags += ["--backend-profile", "anthropic", "--upstream-api-key", "sk-ant-scripted"]
        async with (
            start_gateway(tmp_path / "gateway.log", *flags) as gateway,
            SniffingProxy(gateway.port) as proxy,
        ):
            run = await run_codex(
                f"http://127.0.0.1:{proxy.port}/v1",
                PROMPT,
                tmp_path,
                supports_websockets=websocket,
                timeout=180,
                extra_args=("-c", 'model_reasoning_effort="low"'),
            )
    finally:
        await backend.stop()
    return session, backend, run, proxy.traffic


@pytest.mark.parametrize("websocket", [False, True], ids=["http", "websocket"])
async def test_codex_runs_a_command_loop_on_claude_with_thinking_replayed_every_turn(
    tmp_path: Path, websocket: bool
) -> None:
    session, backend, run, traffic = await _session(tmp_path, websocket)
    why = f"{run.describe()}\ntrace: {session.trace}\nrejections: {backend.rejections}"
    assert run.returncode == 0, why
    messages = [i.get("text", "") for i in run.items("agent_message")]
    assert any(FINAL in m for m in messages), why
    commands = run.items("command_execution")
    assert len(commands) == STEPS and all(c.get("exit_code") == 0 for c in commands), why
    assert backend.rejections == [], why  # every signature held, every loop opened with it
    assert session.unthought == [], why
    assert session.ran == [f"toolu_step_{k}" for k in range(1, STEPS + 1)], why
    assert all(t == {"type": "enabled", "budget_tokens": 4096} for t in session.thinking), why
    for record in backend.records:
        if record.path.endswith("/messages"):
            assert record.headers["x-api-key"] == "sk-ant-scripted"
    if websocket:
        assert traffic.switched >= 1 and traffic.count("POST /v1/responses") == 0, traffic
    else:
        assert traffic.count("POST /v1/responses") >= STEPS + 1 and traffic.switched == 0, traffic
