"""The real Codex CLI learns the model from the gateway (`GET /v1/models`, `--model-metadata`).

Codex is configured with `streamer codex --print-config`'s block and nothing else about the
model. It must accept that block, list exactly the metadata the gateway serves
(`codex debug models`), and act on it: the `apply_patch` tool type it declares, the reasoning
effort it asks for, and the context window, which sets when it compacts (a window too small for the first turn makes it
compact before sending the tool's output back; the default window does not).
`streamer codex -- exec …` runs the same Codex end to end against a scripted backend.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from codex_harness import (
    MARKER,
    REPO,
    codex_binary,
    free_port,
    parse_jsonl,
    print_config,
    run_codex,
    start_gateway,
)
from scripted_backend import ScriptedBackend

pytestmark = [
    pytest.mark.codex,
    pytest.mark.skipif(
        codex_binary() is None, reason="Codex CLI not installed (scripts/install-codex.sh)"
    ),
]

PROMPT = "Call the echo_marker tool with text hello"
MODEL = "scripted"  # what the embedded scripted model lists, so what the printed config names


def _metadata(tmp_path: Path, body: str) -> str:
    path = tmp_path / "metadata.toml"
    path.write_text(f'[models."{MODEL}"]\n{body}')
    return str(path)


def _client_requests(tap_dir: Path) -> list[dict[str, Any]]:
    """What Codex sent, in order (one --tap-dir file per exchange; Codex waits for each
    answer before its next request, so the last write of each orders them)."""
    bodies = []
    for path in sorted(tap_dir.glob("*.jsonl"), key=lambda p: p.stat().st_mtime_ns):
        for line in parse_jsonl(path.read_text()):
            if line.get("kind") == "client_request":
                bodies.append(line["body"])
    return bodies


def _last_user_text(body: dict[str, Any]) -> str | None:
    """The text of the request's last input item if that is a user message, else None."""
    last = body["input"][-1]
    if last.get("type", "message") != "message" or last.get("role") != "user":
        return None
    content = last.get("content")
    return content if isinstance(content, str) else "".join(p.get("text", "") for p in content)


def _compactions(bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Requests that end in a user message Codex wrote itself (its compaction request)."""
    return [b for b in bodies[1:] if _last_user_text(b) not in (None, PROMPT)]


def _apply_patch_type(body: dict[str, Any]) -> str | None:
    kinds = [t.get("type") for t in body.get("tools", []) if t.get("name") == "apply_patch"]
    return kinds[0] if kinds else None


async def _codex_env(tmp_path: Path, home: Path) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "CODEX_HOME": str(home),
        "LANG": "C.UTF-8",
        "NO_PROXY": "127.0.0.1,localhost",
    }


async def test_codex_accepts_the_printed_config_and_lists_the_gateways_metadata(
    tmp_path: Path,
) -> None:
    meta = _metadata(
        tmp_path,
        'context_window = 54321\nreasoning_levels = ["low", "high"]\n'
        'input_modalities = ["text"]\napply_patch_tool_type = "none"\n',
    )
    async with start_gateway(tmp_path / "gateway.log", "--model-metadata", meta) as gateway:
        printed = await print_config(gateway.base_url)
        home = tmp_path / "codex-home"
        home.mkdir()
        (home / "config.toml").write_text(printed)  # exactly as printed
        binary = codex_binary()
        assert binary is not None
        proc = await asyncio.create_subprocess_exec(
            str(binary), "debug", "models",
            env=await _codex_env(tmp_path, home), stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    models = json.loads(out)["models"]
    assert [m["slug"] for m in models] == [MODEL], (out, err)  # the gateway's, not the bundled
    info = models[0]
    assert info["context_window"] == 54321
    assert [level["effort"] for level in info["supported_reasoning_levels"]] == ["low", "high"]
    assert info["input_modalities"] == ["text"]
    assert info["apply_patch_tool_type"] is None


@pytest.mark.parametrize("websockets", [False, True], ids=["http", "websocket"])
async def test_codex_acts_on_the_gateways_metadata(tmp_path: Path, websockets: bool) -> None:
    runs = {}
    for name, args in {
        "default": (),
        "small": (
            "--model-metadata",
            _metadata(
                tmp_path,
                'context_window = 200\napply_patch_tool_type = "none"\n'
                'reasoning_levels = ["low", "high"]\n',
            ),
        ),
    }.items():
        work, tap = tmp_path / name, tmp_path / name / "tap"
        tap.mkdir(parents=True)
        async with start_gateway(work / "gateway.log", "--tap-dir", str(tap), *args) as gateway:
            run = await run_codex(gateway.base_url, PROMPT, work, supports_websockets=websockets)
        assert run.returncode == 0, run.describe()
        assert run.metadata_warnings(MODEL) == [], run.describe()
        call = run.completed_mcp_call("echo_marker")
        assert call is not None, run.describe()
        assert run.probe_calls == [{"tool": "echo_marker", "arguments": {"text": "hello"}}]
        runs[name] = _client_requests(tap)
    default, small = runs["default"], runs["small"]
    # apply_patch as the gateway says: freeform (a custom tool) by default, or none
    assert _apply_patch_type(default[0]) == "custom"
    assert _apply_patch_type(small[0]) is None
    # the reasoning effort Codex asks for: the gateway's default level (medium), else the
    # first of the model's levels
    assert default[0]["reasoning"].get("effort") == "medium", default[0]["reasoning"]
    assert small[0]["reasoning"].get("effort") == "low", small[0]["reasoning"]
    # the window: the default one holds the turn; 200 tokens do not, so Codex compacts
    # after the call, before sending its output back
    assert _compactions(default) == [], [_last_user_text(b) for b in default]
    assert len(_compactions(small)) >= 1, [_last_user_text(b) for b in small]
    assert any(MARKER in json.dumps(b["input"]) for b in small[1:])  # and then goes on


async def test_streamer_codex_exec_against_a_scripted_backend(tmp_path: Path) -> None:
    binary = codex_binary()
    assert binary is not None
    cwd, home = tmp_path / "cwd", tmp_path / "codex-home"
    cwd.mkdir()
    async with ScriptedBackend(models=["backend-model"]) as backend:
        env = {
            **await _codex_env(tmp_path, home),
            "PYTHONPATH": str(REPO),
        }
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "streamer", "codex", "--port", str(free_port()),
            "--upstream", backend.base_url, "--codex-home", str(home), "--codex-bin", str(binary),
            "--", "exec", "--ephemeral", "--skip-git-repo-check",
            "--disable", "unbounded_connection_retries", "--json", "-C", str(cwd), "say hello",
            cwd=REPO, env=env, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(proc.communicate(), 180)
        requests = backend.requests
    events = parse_jsonl(out.decode())
    assert proc.returncode == 0, err.decode()[-3000:]
    messages = [
        e["item"]["text"]
        for e in events
        if e.get("type") == "item.completed" and e["item"].get("type") == "agent_message"
    ]
    assert messages == ["Hello!"], out.decode()  # the scripted backend's default answer
    assert not any("Model metadata for" in json.dumps(e) for e in events), out.decode()
    assert requests and all(r["model"] == "backend-model" for r in requests)
    assert "backend-model" in (home / "config.toml").read_text()


async def test_streamer_codex_returns_codexs_exit_code(tmp_path: Path) -> None:
    binary = codex_binary()
    assert binary is not None
    env = {**await _codex_env(tmp_path, tmp_path / "home"), "PYTHONPATH": str(REPO)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "streamer", "codex", "--port", str(free_port()),
        "--codex-home", str(tmp_path / "home"), "--codex-bin", str(binary),
        "--", "exec", "--no-such-flag",
        cwd=REPO, env=env, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 2, err.decode()  # clap's usage error, passed on
    assert "--no-such-flag" in err.decode()
