"""A real llama.cpp `llama-server` on loopback with the tiny model (scripts/build-llamacpp.sh).

Every test here skips, with the build's own reason, when the build is absent.
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import GatewayHarness
from openai import AsyncOpenAI

ROOT = Path(__file__).parent.parent.parent
DIR = Path(os.environ.get("LLAMACPP_DIR", ROOT / ".tools" / "llamacpp"))
BIN, MODEL = DIR / "bin" / "llama-server", DIR / "tiny.gguf"
READY = "listening on"  # printed after "model loaded"
# The tiny model calls tools only with <tool_call> and <|im_end|> favoured (see the notes).
BIAS = ["--logit-bias", "151657+2.5,151645+2.5"]


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


@pytest.fixture(scope="session")
def llama_server() -> Iterator[str]:
    """The base URL (…/v1) of a running `llama-server`; skips when there is no build."""
    missing = _missing()
    if missing:
        pytest.skip(missing)
    port = _free_port()
    argv = [str(BIN), "-m", str(MODEL), "--jinja", "--host", "127.0.0.1", "--port", str(port)]
    argv += ["-c", "8192", "-t", "1", "-np", "2", "--no-webui", "--alias", "tiny", *BIAS]
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
    yield f"http://127.0.0.1:{port}/v1"
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    assert proc.stdout is not None
    proc.stdout.close()


@pytest.fixture
async def real_gw(llama_server: str, request: pytest.FixtureRequest) -> AsyncIterator[Any]:
    """The gateway in front of the real server; `@pytest.mark.gateway(**settings)` adds settings."""
    marker = request.node.get_closest_marker("gateway")
    overrides = dict(marker.kwargs) if marker else {}
    async with GatewayHarness(upstream=llama_server, **overrides) as gw:
        yield gw


@pytest.fixture
async def real_client(real_gw: GatewayHarness) -> AsyncIterator[AsyncOpenAI]:
    async with AsyncOpenAI(base_url=real_gw.url, api_key="k", max_retries=0, timeout=120) as c:
        yield c
