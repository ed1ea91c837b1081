"""The real Codex CLI in a two-turn loop with `view_image` and a mid-conversation developer
message, through the gateway to a Chat backend that, like the Qwen, Mistral and Llama chat
templates, rejects a system message that is not first (issue 15).

Turn 1 (`codex exec`): the backend asks for `view_image` on a PNG in the workspace; Codex
answers with a `function_call_output` holding the image as an `input_image` data URL; the
backend must get it as an image part of a user message right after the tool message.
Turn 2 (`codex exec resume --last` with another `sandbox_mode`): Codex 0.169 puts a developer
message with the new `<permissions instructions>` in the middle of the conversation
(codex-rs/core/src/context_manager/updates.rs, `build_settings_update_items`); the gateway
joins it into the one leading system message, and the loop with `view_image` runs again.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path
from typing import Any

import orjson
import pytest
from codex_harness import CodexRun, codex_binary, run_codex
from harness import GatewayHarness
from scripted_backend import DONE, ScriptedBackend, Status, finish, text_chunks, tool_call_chunks
from scripted_backend import usage as usage_chunk

from streamer.core.lowering import TOOL_MEDIA_MARK

pytestmark = [
    pytest.mark.codex,
    pytest.mark.skipif(
        codex_binary() is None, reason="Codex CLI not installed (scripts/install-codex.sh)"
    ),
]

SYSTEM_NOT_FIRST = "System message must be at the beginning."  # the templates' own words
ANSWER = "The image is a red square."
SECOND_PROMPT = "Look at it once more."
MAX_CALLS = 4  # view_image calls the backend asks for at most (two are expected)
NEW_POLICY = "`sandbox_mode` is `read-only`"  # in the developer message of turn 2 only


def png(width: int = 4, height: int = 4) -> bytes:
    """A small red PNG (8-bit RGB), written with the standard library."""

    def block(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    rows = b"".join(b"\x00" + b"\xff\x00\x00" * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + block(b"IHDR", header)
        + block(b"IDAT", zlib.compress(rows))
        + block(b"IEND", b"")
    )


def misplaced_system(messages: list[dict[str, Any]]) -> int | None:
    """The index of a system message that is not first, if any."""
    return next((i for i, m in enumerate(messages) if m["role"] == "system" and i > 0), None)


def image_after_tool(messages: list[dict[str, Any]]) -> bool:
    """The last messages are a tool message, then a user message carrying its image."""
    if len(messages) < 2 or messages[-2]["role"] != "tool" or messages[-1]["role"] != "user":
        return False
    parts = messages[-1]["content"]
    if not isinstance(parts, list):
        return False
    call_id = messages[-2]["tool_call_id"]
    urls = [p["image_url"]["url"] for p in parts if p.get("type") == "image_url"]
    heads = [p["text"] for p in parts if p.get("type") == "text"]
    return (
        bool(urls)
        and all(u.startswith("data:image/") for u in urls)
        and (heads == [f"{TOOL_MEDIA_MARK} {call_id}]"])
    )


class RejectingTemplateBackend:
    """Answers like a chat template that takes one leading system message: 400 otherwise;
    asks for `view_image` on a user turn and describes the image once it has it."""

    def __init__(self) -> None:
        self.rejected: list[list[dict[str, Any]]] = []
        self.calls = 0
        self.backend = ScriptedBackend(responder=self.respond)

    def respond(self, body: Any) -> list[Any]:
        messages = body["messages"]
        if misplaced_system(messages) is not None:
            self.rejected.append(messages)
            error = {"code": 400, "message": SYSTEM_NOT_FIRST, "type": "invalid_request_error"}
            return [Status(400, {"error": error})]
        if image_after_tool(messages) or self.calls >= MAX_CALLS:  # bounded if it never comes
            return [*text_chunks([ANSWER]), finish("stop"), usage_chunk(50, 6), DONE]
        self.calls += 1
        arguments = orjson.dumps({"path": "red.png"}).decode()
        call = tool_call_chunks(0, f"call_view_{self.calls}", ["view_image"], [arguments])
        return [*call, finish("tool_calls"), usage_chunk(50, 8), DONE]


def test_the_backend_rejects_a_late_system_message() -> None:
    """The scripted backend really is strict (what the Codex test relies on)."""
    strict = RejectingTemplateBackend()
    late = [{"role": "user", "content": "hi"}, {"role": "system", "content": "x"}]
    (answer,) = strict.respond({"messages": late})
    assert isinstance(answer, Status) and answer.status == 400
    assert strict.rejected == [late]


def assert_turn_done(run: CodexRun) -> None:
    assert run.returncode == 0, run.describe()
    assert any(e.get("type") == "turn.completed" for e in run.events), run.describe()
    assert [i.get("text") for i in run.items("agent_message")] == [ANSWER], run.describe()
    assert not [e for e in run.events if e.get("type") in ("turn.failed", "error")], run.describe()


def client_inputs(tap_dir: Path) -> list[list[dict[str, Any]]]:
    """The `input` of every request Codex sent (from the gateway's --tap-dir recordings)."""
    inputs = []
    for path in sorted(tap_dir.iterdir()):
        for line in path.read_bytes().splitlines():
            record = orjson.loads(line)
            if record["kind"] == "client_request":
                inputs.append(record["body"].get("input") or [])
    return inputs


def developer_after_conversation(items: list[dict[str, Any]]) -> bool:
    """A developer message that comes after a user message or a call (mid-conversation)."""
    seen_turn = False
    for item in items:
        if item.get("role") == "developer" and seen_turn:
            return True
        seen_turn = seen_turn or item.get("role") == "user" or item.get("type") == "function_call"
    return False


async def test_codex_view_image_loop_with_a_mid_conversation_developer_message(
    tmp_path: Path,
) -> None:
    strict = RejectingTemplateBackend()
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    (cwd / "red.png").write_bytes(png())
    tap_dir = tmp_path / "tap"
    async with GatewayHarness(backend=strict.backend, tap_dir=str(tap_dir)) as gw:
        first = await run_codex(gw.url, "Look at red.png", tmp_path, ephemeral=False)
        assert_turn_done(first)
        sent_first = len(strict.backend.requests)
        second = await run_codex(
            gw.url,
            SECOND_PROMPT,
            tmp_path,
            ephemeral=False,
            extra_args=("-c", 'sandbox_mode="read-only"'),
            subcommand=("resume", "--last"),
        )
    assert_turn_done(second)
    assert [e for e in first.events if e.get("type") == "thread.started"] == [
        e for e in second.events if e.get("type") == "thread.started"
    ]  # one conversation, resumed
    assert strict.rejected == []
    requests = strict.backend.requests
    assert strict.calls == 2 and len(requests) == 4, [len(r["messages"]) for r in requests]
    for body in requests:
        messages = body["messages"]
        assert misplaced_system(messages) is None
        assert messages[0]["role"] == "system"
    # Each turn's second request carried the image right after its tool message.
    assert image_after_tool(requests[1]["messages"])
    assert image_after_tool(requests[3]["messages"])
    assert "[image omitted]" not in orjson.dumps(requests).decode()
    # Turn 2: Codex sent the new permissions as a developer message mid-conversation, and
    # the backend got them inside its one leading system message.
    inputs = client_inputs(tap_dir)
    assert len(inputs) == 4
    turn2 = [i for i in inputs if SECOND_PROMPT in orjson.dumps(i).decode()]
    assert len(turn2) == 2
    assert all(developer_after_conversation(i) for i in turn2)
    assert not any(developer_after_conversation(i) for i in inputs if i not in turn2)
    assert all(NEW_POLICY not in r["messages"][0]["content"] for r in requests[:sent_first])
    assert all(NEW_POLICY in r["messages"][0]["content"] for r in requests[sent_first:])
