"""`python -m streamer serve` as a real process on loopback, for what only a process shows:
its memory (VmRSS, VmHWM from /proc), another environment (`AIOHTTP_NO_EXTENSIONS=1`),
flags as an operator gives them. Without `--upstream` it serves the embedded model."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from redis_server import free_port

REPO = Path(__file__).resolve().parents[1]


@dataclass
class GatewayProcess:
    port: int
    pid: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def _status_kb(self, key: str) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
        raise KeyError(key)

    def rss_mb(self) -> float:
        return self._status_kb("VmRSS") / 1024

    def peak_rss_mb(self) -> float:
        """The process's high-water mark of resident memory since it started (VmHWM)."""
        return self._status_kb("VmHWM") / 1024


@contextlib.asynccontextmanager
async def gateway_process(
    log: Path, *args: str, env: dict[str, str] | None = None
) -> AsyncIterator[GatewayProcess]:
    """The gateway with `args`, ready (its /healthz answered); killed at the end."""
    port = free_port()
    environ = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), environ.get("PYTHONPATH")]))
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "streamer", "serve", "--port", str(port), *args,
            cwd=REPO, env=environ, stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=out,
        )  # fmt: skip
    try:
        async with aiohttp.ClientSession() as http, asyncio.timeout(30):
            while True:  # polled with a deadline: the process says nothing when it is ready
                assert proc.returncode is None, log.read_text()
                with contextlib.suppress(aiohttp.ClientError):
                    async with http.get(f"http://127.0.0.1:{port}/healthz") as resp:
                        if resp.status == 200:
                            break
                await asyncio.sleep(0.05)
        yield GatewayProcess(port, proc.pid, log)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


@contextlib.contextmanager
def gateway_process_sync(
    log: Path, *args: str, env: dict[str, str] | None = None
) -> Iterator[GatewayProcess]:
    """`gateway_process` for a test without an event loop (hypothesis's)."""
    port = free_port()
    environ = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), environ.get("PYTHONPATH")]))
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "streamer", "serve", "--port", str(port), *args],
            cwd=REPO, env=environ, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:  # polled with a deadline: the process says nothing when it is ready
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            with (
                contextlib.suppress(OSError),
                _LOCAL.open(f"http://127.0.0.1:{port}/healthz", timeout=2) as resp,
            ):
                if resp.status == 200:
                    break
            time.sleep(0.05)
        yield GatewayProcess(port, proc.pid, log)
    finally:
        proc.kill()
        proc.wait()


_LOCAL = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: no proxy
