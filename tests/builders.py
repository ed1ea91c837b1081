"""Shared test fixtures: tool declarations, SSE parsing, a gateway process, a manual clock.

One copy of each, imported by the test files (tests/ is on `sys.path`, as for `harness`).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import os
import resource
import signal
import socket
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from redis_server import free_port

REPO = Path(__file__).resolve().parents[1]

# -- tool declarations --------------------------------------------------------------------

# A namespace (MCP-style) and a plain function: the shape Codex sends.
TOOLS: list[dict[str, Any]] = [
    {
        "type": "namespace",
        "name": "mcp__docs",
        "description": "Docs.",
        "tools": [
            {
                "type": "function",
                "name": "search",
                "description": "Search the docs.",
                "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
            }
        ],
    },
    {"type": "function", "name": "exec_command", "parameters": {"type": "object"}},
]

# Two namespaces, each with one function (tests that follow calls across instances).
TWO_NAMESPACES: list[dict[str, Any]] = [
    {
        "type": "namespace",
        "name": "mcp__docs",
        "description": "Docs.",
        "tools": [{"type": "function", "name": "search", "parameters": {"type": "object"}}],
    },
    {
        "type": "namespace",
        "name": "crm",
        "description": "CRM.",
        "tools": [{"type": "function", "name": "lookup", "parameters": {"type": "object"}}],
    },
]

# One bare function, for tests about something other than tools.
ONE_FUNCTION: list[dict[str, Any]] = [
    {"type": "function", "name": "f", "parameters": {"type": "object"}}
]

# -- SSE ----------------------------------------------------------------------------------


def parse_sse(raw: bytes) -> list[dict[str, Any]]:
    """The gateway's SSE, strictly: `event:` then `data:` per frame, names matching types."""
    assert raw.endswith(b"\n\n"), f"torn SSE frame at the end of the stream: {raw[-120:]!r}"
    events = []
    for frame in raw[:-2].split(b"\n\n"):
        lines = frame.split(b"\n")
        assert len(lines) == 2, f"malformed SSE frame: {frame[:200]!r}"
        assert lines[0].startswith(b"event: ") and lines[1].startswith(b"data: "), frame[:200]
        data = orjson.loads(lines[1][6:])
        assert data["type"] == lines[0][7:].decode(), frame[:200]
        events.append(data)
    return events


def client_session(**kwargs: Any) -> aiohttp.ClientSession:
    """A test client that keeps no idle connection, so connection counts are exact."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, force_close=True), **kwargs
    )


async def sse_events(url: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """POST `body` to `{url}/responses` as a stream; its events, parsed strictly."""
    async with (
        client_session() as session,
        session.post(url + "/responses", json={**body, "stream": True}) as resp,
    ):
        assert resp.status == 200, await resp.text()
        return parse_sse(await resp.read())


# -- a gateway process --------------------------------------------------------------------


@dataclass
class GatewayProcess:
    """A running `python -m streamer serve`; stderr in `log_path`, stdout next to it."""

    process: asyncio.subprocess.Process
    port: int
    log_path: Path
    host: str = "127.0.0.1"

    @property
    def origin(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"{self.origin}/v1"

    @property
    def ws_url(self) -> str:
        return f"ws://{self.host}:{self.port}/v1/responses"

    @property
    def stdout_path(self) -> Path:
        return self.log_path.with_name(self.log_path.name + ".stdout")

    def stderr(self) -> str:
        return _read(self.log_path)

    def stdout(self) -> str:
        return _read(self.stdout_path)

    def log(self) -> str:
        """Everything the process wrote: stderr, then stdout."""
        return self.stderr() + self.stdout()

    def log_lines(self) -> list[dict[str, Any]]:
        """Every stderr line, each of which must be one JSON object."""
        return [orjson.loads(line) for line in self.stderr().splitlines() if line.strip()]

    def rss(self) -> int:
        """Resident memory of the gateway process, in bytes."""
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS")

    def accepts(self) -> bool:
        """Whether a new TCP connection to the gateway is accepted."""
        try:
            with socket.create_connection((self.host, self.port), timeout=1):
                return True
        except OSError:
            return False

    async def wait(self, timeout: float) -> int:
        return await asyncio.wait_for(self.process.wait(), timeout)

    async def terminate(self, timeout: float = 15) -> int:
        """SIGTERM and wait for the exit: afterwards its logs hold all it will ever write."""
        self.process.send_signal(signal.SIGTERM)
        return await self.wait(timeout)


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


@contextlib.asynccontextmanager
async def gateway_process(
    log_path: Path,
    *args: str,
    env: dict[str, str] | None = None,
    graceful: bool = False,
    nofile: int | tuple[int, int] | None = None,
) -> AsyncIterator[GatewayProcess]:
    """`python -m streamer serve *args`, ready (/healthz answers) until the block ends.

    The process sees no STREAMER_* variable but those in `env`. A free `--port` is added
    unless the arguments or `env` name one; `--host` is never added (the default is
    loopback). At the end a running process is killed, or with `graceful` sent SIGTERM
    first (so what it writes while shutting down is in its log too). `nofile`: its open-file
    limit, soft and hard (as `prlimit --nofile=N:N`), or a (soft, hard) pair.
    """
    environ = {k: v for k, v in os.environ.items() if not k.startswith("STREAMER_")}
    environ.update(env or {})
    environ["PYTHONUNBUFFERED"] = "1"
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), environ.get("PYTHONPATH")]))
    argv = list(args)
    if "--port" in argv:
        port = int(argv[argv.index("--port") + 1])
    elif "STREAMER_PORT" in environ:
        port = int(environ["STREAMER_PORT"])
    else:
        port = free_port()
        argv += ["--port", str(port)]
    host = argv[argv.index("--host") + 1] if "--host" in argv else "127.0.0.1"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    gateway_log = log_path.with_name(log_path.name + ".stdout")
    with log_path.open("wb") as err, gateway_log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "streamer", "serve", *argv,
            cwd=REPO, env=environ, stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=err,
            preexec_fn=None if nofile is None else _open_files(nofile),
        )  # fmt: skip
    gateway = GatewayProcess(proc, port, log_path, host)
    try:
        await _until_healthy(gateway)
        yield gateway
    finally:
        await _stop(proc, graceful)


def _open_files(limit: int | tuple[int, int]) -> Callable[[], None]:
    """A preexec_fn that sets the child's RLIMIT_NOFILE to `limit` (soft and hard)."""
    soft, hard = limit if isinstance(limit, tuple) else (limit, limit)

    def preexec() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    return preexec


async def _until_healthy(gateway: GatewayProcess) -> None:
    """Poll /healthz (the process gives no other sign of readiness) for up to 30 s."""
    async with aiohttp.ClientSession() as session, asyncio.timeout(30):
        while True:
            if gateway.process.returncode is not None:
                code = gateway.process.returncode
                raise RuntimeError(f"gateway exited {code}:\n{gateway.log()}")
            with contextlib.suppress(aiohttp.ClientError):
                async with session.get(gateway.origin + "/healthz") as resp:
                    if resp.status == 200:
                        return
            await asyncio.sleep(0.05)


async def _stop(proc: asyncio.subprocess.Process, graceful: bool) -> None:
    if proc.returncode is not None:
        return
    if graceful:
        proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), 15)
            return
    proc.kill()
    await proc.wait()


# -- a manual clock -----------------------------------------------------------------------


@dataclass(order=True)
class _Timer:
    when: float
    order: int
    callback: Callable[[], None] = field(compare=False)
    cancelled: bool = field(default=False, compare=False)

    def cancel(self) -> None:
        self.cancelled = True


class ManualClock:
    """Time that moves only when a test says so: `clock()` reads it, `call_later` schedules
    on it (the signature `QuietTrim` and `asyncio.loop.call_later` share), `advance` runs
    whatever falls due, in order, including timers those callbacks set."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start
        self._timers: list[_Timer] = []
        self._order = itertools.count()

    def __call__(self) -> float:
        return self.now

    def call_later(self, delay: float, callback: Callable[[], None]) -> _Timer:
        timer = _Timer(self.now + delay, next(self._order), callback)
        heapq.heappush(self._timers, timer)
        return timer

    @property
    def pending(self) -> int:
        return sum(1 for timer in self._timers if not timer.cancelled)

    def advance(self, seconds: float) -> None:
        end = self.now + seconds
        while self._timers and self._timers[0].when <= end:
            timer = heapq.heappop(self._timers)
            self.now = max(self.now, timer.when)
            if not timer.cancelled:
                timer.callback()
        self.now = end
