"""`streamer codex`: the config block it prints, and how it launches Codex.

Codex itself is replaced here by a small script that records what it was given (its args,
`CODEX_HOME`, the key, the gateway's model list as its config points at it) and exits with a
chosen code; tests/codex/ runs the real Codex CLI through the same command.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tomllib
import urllib.request
from pathlib import Path
from typing import Any

from harness import GatewayHarness

from streamer.codex_launch import serve_flags, split_passthrough

REPO = Path(__file__).resolve().parents[1]

FAKE_CODEX = """\
import json, os, sys, tomllib, urllib.request
home = os.environ["CODEX_HOME"]
config = tomllib.load(open(os.path.join(home, "config.toml"), "rb"))
provider = config["model_providers"][config["model_provider"]]
key = os.environ.get(provider.get("env_key", ""), provider.get("experimental_bearer_token"))
request = urllib.request.Request(provider["model_catalog_url"], headers={"Authorization": "Bearer " + key})
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
models = json.loads(opener.open(request, timeout=5).read())["models"]
record = {"argv": sys.argv[1:], "home": home, "config": config, "key": key,
          "slugs": [m["slug"] for m in models]}
open(os.environ["FAKE_CODEX_RECORD"], "w").write(json.dumps(record))
if os.environ.get("FAKE_CODEX_EXIT") == "SIGTERM":
    import signal
    os.kill(os.getpid(), signal.SIGTERM)
sys.exit(int(os.environ.get("FAKE_CODEX_EXIT", "0")))
"""


def _fake_codex(tmp_path: Path) -> Path:
    script = tmp_path / "fake-codex"
    script.write_text(f"#!{sys.executable}\n{FAKE_CODEX}")
    script.chmod(0o755)
    return script


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMER_")}
    env.update(PYTHONPATH=str(REPO), HOME=str(tmp_path), NO_PROXY="127.0.0.1,localhost", **extra)
    return env


async def _streamer(tmp_path: Path, *args: str, **env: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "streamer", *args,
        cwd=REPO, env=_env(tmp_path, **env), stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _answers(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as reply:
            return bool(reply.status == 200)
    except OSError:
        return False


# --- pure parts ------------------------------------------------------------------------


def test_codex_args_are_everything_after_the_double_dash() -> None:
    argv = ["codex", "--port", "9", "--", "exec", "--json", "--", "x"]
    assert split_passthrough(argv) == (["codex", "--port", "9"], ["exec", "--json", "--", "x"])
    assert split_passthrough(["serve", "--", "x"]) == (["serve", "--", "x"], [])
    flags = ["--port", "9", "--codex-home", "/h", "--print-config", "--model", "m", "--codex-sse"]
    assert serve_flags(flags) == ["--port", "9", "--model", "m"]


# --- --print-config --------------------------------------------------------------------


async def test_print_config_is_toml_pointing_at_the_gateway(tmp_path: Path) -> None:
    async with GatewayHarness() as gw:
        port = gw.url.split(":")[2].split("/")[0]
        code, out, err = await _streamer(tmp_path, "codex", "--port", port, "--print-config")
    assert code == 0, err
    config = tomllib.loads(out)
    assert config["model"] == "scripted-backend"  # the first model the gateway lists
    provider = config["model_providers"][config["model_provider"]]
    assert provider["base_url"] == f"http://127.0.0.1:{port}/v1"
    assert provider["model_catalog_url"] == f"http://127.0.0.1:{port}/v1/models"
    assert provider["wire_api"] == "responses" and provider["supports_websockets"] is True
    assert provider["experimental_bearer_token"]  # without a key Codex never asks for metadata


async def test_print_config_with_keys_names_the_variable(tmp_path: Path) -> None:
    code, out, err = await _streamer(
        tmp_path, "codex", "--port", str(_free_port()), "--api-key", "sekrit",
        "--codex-model", "qwen3:8b", "--codex-sse", "--print-config",
    )  # fmt: skip
    assert code == 0, err
    config = tomllib.loads(out)
    provider = config["model_providers"]["streamer"]
    assert config["model"] == "qwen3:8b" and provider["supports_websockets"] is False
    assert provider["env_key"] == "STREAMER_CODEX_API_KEY"
    assert "sekrit" not in out  # a key is never printed


async def test_print_config_takes_the_model_from_the_metadata_file(tmp_path: Path) -> None:
    meta = tmp_path / "meta.toml"
    meta.write_text('[models."qwen3:8b"]\ncontext_window = 40960\n')
    code, out, err = await _streamer(
        tmp_path, "codex", "--port", str(_free_port()), "--upstream", "http://127.0.0.1:9/v1",
        "--model-metadata", str(meta), "--print-config",
    )  # fmt: skip
    assert code == 0, err
    assert tomllib.loads(out)["model"] == "qwen3:8b"


async def test_no_model_known_is_an_error(tmp_path: Path) -> None:
    code, out, err = await _streamer(
        tmp_path, "codex", "--port", str(_free_port()), "--upstream", "http://127.0.0.1:9/v1",
        "--print-config",
    )  # fmt: skip
    assert code == 1 and out == ""
    assert "no model known: give --codex-model or --model" in err


async def test_a_wrong_metadata_file_is_a_usage_error(tmp_path: Path) -> None:
    meta = tmp_path / "meta.toml"
    meta.write_text("[models.m]\ncontext_window = 0\n")
    code, _, err = await _streamer(tmp_path, "codex", "--model-metadata", str(meta))
    assert code == 2 and "models.m.context_window: must be a positive integer" in err


# --- launching -------------------------------------------------------------------------


async def test_starts_a_gateway_runs_codex_and_returns_its_exit_code(tmp_path: Path) -> None:
    port, home, record = _free_port(), tmp_path / "home", tmp_path / "record.json"
    code, _, err = await _streamer(
        tmp_path, "codex", "--port", str(port), "--codex-home", str(home),
        "--codex-bin", str(_fake_codex(tmp_path)), "--api-key", "k1",
        "--", "exec", "--json", "hello there",
        FAKE_CODEX_RECORD=str(record), FAKE_CODEX_EXIT="7",
    )  # fmt: skip
    assert code == 7, err
    seen: dict[str, Any] = json.loads(record.read_text())
    assert seen["argv"] == ["exec", "--json", "hello there"]
    assert seen["home"] == str(home)
    assert seen["key"] == "k1"  # the gateway's key, handed to Codex in STREAMER_CODEX_API_KEY
    assert seen["slugs"] == ["scripted"]  # the started gateway (embedded model) answered
    assert seen["config"]["model"] == "scripted"
    assert (home / "gateway.log").exists()
    assert not _answers(port)  # the gateway it started is gone with Codex


async def test_reuses_a_gateway_that_answers(tmp_path: Path) -> None:
    record = tmp_path / "record.json"
    async with GatewayHarness() as gw:
        port = gw.url.split(":")[2].split("/")[0]
        code, _, err = await _streamer(
            tmp_path, "codex", "--port", port, "--codex-home", str(tmp_path / "home"),
            "--codex-bin", str(_fake_codex(tmp_path)), "--", "exec",
            FAKE_CODEX_RECORD=str(record),
        )  # fmt: skip
        still_there = await asyncio.to_thread(_answers, int(port))
    assert code == 0, err
    assert f"using the gateway at http://127.0.0.1:{port}" in err
    assert json.loads(record.read_text())["slugs"] == ["scripted-backend"]  # the harness's backend
    assert still_there  # not ours to stop


async def test_codex_killed_by_a_signal_is_128_plus_it(tmp_path: Path) -> None:
    code, _, err = await _streamer(
        tmp_path, "codex", "--port", str(_free_port()), "--codex-home", str(tmp_path / "home"),
        "--codex-bin", str(_fake_codex(tmp_path)),
        FAKE_CODEX_RECORD=str(tmp_path / "record.json"), FAKE_CODEX_EXIT="SIGTERM",
    )  # fmt: skip
    assert code == 128 + 15, err  # as a shell reports it


async def test_a_missing_codex_is_said(tmp_path: Path) -> None:
    code, _, err = await _streamer(
        tmp_path, "codex", "--port", str(_free_port()), "--codex-bin", str(tmp_path / "nope"),
    )  # fmt: skip
    assert code == 1 and "Codex CLI not found" in err
