"""A real llama.cpp `llama-server` on loopback with the tiny model (scripts/build-llamacpp.sh).

Every test here skips, with the build's own reason, when the build is absent.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import os
import socket
import subprocess
import threading
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from harness import GatewayHarness
from openai import AsyncOpenAI

from streamer.cli import build_parser
from streamer.tap.command import run_tap

ROOT = Path(__file__).parent.parent.parent
DIR = Path(os.environ.get("LLAMACPP_DIR", ROOT / ".tools" / "llamacpp"))
BIN, MODEL = DIR / "bin" / "llama-server", DIR / "tiny.gguf"
READY = "listening on"  # printed after "model loaded"
# The tiny model calls tools only with <tool_call> and <|im_end|> favoured (see the notes).
BIAS = ["--logit-bias", "151657+2.5,151645+2.5"]  # this build keeps only the last such flag
THINKING = "Qwen-QwQ-32B.jinja"


def _missing() -> str | None:
    if BIN.exists() and MODEL.exists():
        return None
    failed = DIR / "FAILED"
    why = failed.read_text().strip() if failed.exists() else "not built"
    return f"no llama.cpp build in {DIR} ({why}); run scripts/build-llamacpp.sh"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_ready(proc: subprocess.Popen[str], log: list[str]) -> bool:
    """Read the server's log until it is ready (True) or has exited (False)."""
    assert proc.stdout is not None
    for line in proc.stdout:
        log.append(line)
        if READY in line:
            threading.Thread(target=_drain, args=(proc, log), daemon=True).start()
            return True
    return False


def _drain(proc: subprocess.Popen[str], log: list[str]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        log.append(line)


@contextlib.contextmanager
def _server(*flags: str) -> Iterator[str]:
    """A `llama-server` with the tiny model and `flags`; yields its base URL (…/v1)."""
    missing = _missing()
    if missing:
        pytest.skip(missing)
    port = _free_port()
    argv = [str(BIN), "-m", str(MODEL), "--jinja", "--host", "127.0.0.1", "--port", str(port)]
    argv += ["-t", "1", "--no-webui", "--alias", "tiny", *flags]
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
    )
    log: list[str] = []
    timer = threading.Timer(60, proc.kill)  # a server that never gets ready is a failure
    timer.start()
    try:
        ready = _wait_ready(proc, log)
    finally:
        timer.cancel()
    if not ready:
        pytest.fail("llama-server did not start:\n" + "".join(log[-30:]))
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as r:
        assert r.status == 200
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()


@pytest.fixture(scope="session")
def llama_server() -> Iterator[str]:
    """The base URL (…/v1) of a running `llama-server`; skips when there is no build.

    Its context is 8192 tokens over 2 slots: 4096 a request (what the overflow test exceeds).
    """
    with _server("-c", "8192", "-np", "2", *BIAS) as url:
        yield url


def thinking_template() -> Path | None:
    """A chat template whose generation prompt opens `<think>` (llama.cpp's own test copy of
    Qwen QwQ's, in the sources the build keeps); llama.cpp recognises it as a thinking model."""
    return next(DIR.glob(f"src/*/vendor/llama.cpp/models/templates/{THINKING}"), None)


@pytest.fixture(scope="session")
def llama_thinking_server() -> Iterator[str]:
    """A `llama-server` that streams `reasoning_content`: the thinking template with
    `--reasoning-format deepseek`. Nothing favours `</think>` (1 in 152k random tokens), so
    a short answer is reasoning throughout; favouring it can make the thinking empty."""
    template = thinking_template()
    if template is None and _missing() is None:
        pytest.skip(f"no {THINKING} in the llama.cpp sources under {DIR / 'src'}")
    flags = ["-c", "2048", "-np", "1", "--reasoning-format", "deepseek"]
    flags += ["--chat-template-file", str(template)]
    with _server(*flags) as url:
        yield url


def _kinds(path: Path) -> set[str]:
    return {orjson.loads(line)["kind"] for line in path.read_bytes().splitlines() if line}


async def assert_tap_clean(tap_dir: Path) -> None:
    """`streamer tap` finds no violation in any stream recorded in `tap_dir` (an exchange
    answered with an HTTP error before any event is no stream: it has nothing to check)."""
    paths = sorted(tap_dir.iterdir()) if tap_dir.exists() else []
    assert paths, f"nothing recorded in {tap_dir}"
    for path in paths:
        if "client_event" not in _kinds(path) and "error" in _kinds(path):
            continue
        args = build_parser().parse_args(["tap", str(path), "--color", "never"])
        out = io.StringIO()
        assert await run_tap(args, out) == 0, out.getvalue()


@contextlib.asynccontextmanager
async def recorded_gateway(upstream: str, tap_dir: Path, **settings: Any) -> AsyncIterator[Any]:
    """The gateway in front of `upstream`, recording every exchange; on a clean exit, every
    recorded stream must pass the tap's grammar check."""
    async with GatewayHarness(upstream=upstream, tap_dir=str(tap_dir), **settings) as gw:
        yield gw
    await assert_tap_clean(tap_dir)


@pytest.fixture
def recorded(tmp_path: Path) -> Callable[..., contextlib.AbstractAsyncContextManager[Any]]:
    """`async with recorded(upstream, **settings) as gw`: `recorded_gateway` in this test's
    own directory, one tap directory per gateway."""
    counter = itertools.count()

    def make(upstream: str, **settings: Any) -> contextlib.AbstractAsyncContextManager[Any]:
        return recorded_gateway(upstream, tmp_path / f"tap-{next(counter)}", **settings)

    return make


@pytest.fixture
async def real_gw(
    llama_server: str, request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[Any]:
    """The gateway in front of the real server; `@pytest.mark.gateway(**settings)` adds settings."""
    marker = request.node.get_closest_marker("gateway")
    overrides = dict(marker.kwargs) if marker else {}
    async with recorded_gateway(llama_server, tmp_path / "tap", **overrides) as gw:
        yield gw


@pytest.fixture
async def real_client(real_gw: GatewayHarness) -> AsyncIterator[AsyncOpenAI]:
    async with AsyncOpenAI(base_url=real_gw.url, api_key="k", max_retries=0, timeout=120) as c:
        yield c
