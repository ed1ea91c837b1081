"""A real, throwaway redis-server on a free loopback port, for any test that needs Redis.

    from redis_server import RedisServer, requires_redis

    with RedisServer() as server:          # or: async with RedisServer() as server
        store = RedisStore(server.url)

`redis_server` is a module-scoped pytest fixture built on it: import it into a test module
(`from redis_server import redis_server  # noqa: F401`) to share one server per module.
Tests marked with `requires_redis` skip when the binary is missing (.ci/run installs it).
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType

import pytest

REDIS_SERVER = shutil.which("redis-server")

requires_redis = pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server is not installed")
redis_marks = [pytest.mark.redis, requires_redis]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def redis_answers(port: int, timeout: float = 0.5) -> bool:
    """Whether a PING on the port gets PONG (the server is up and not loading)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """One redis-server process: no persistence, loopback only, its own temp dir."""

    def __init__(
        self,
        port: int | None = None,
        *,
        start_timeout: float = 10.0,
        extra_args: tuple[str, ...] = (),  # more redis-server options, e.g. to allow DEBUG
    ) -> None:
        if REDIS_SERVER is None:
            raise RuntimeError("redis-server is not installed")
        self.host = "127.0.0.1"
        self.port = port or 0
        self.start_timeout = start_timeout
        self.extra_args = extra_args
        self.process: subprocess.Popen[bytes] | None = None
        self._dir: tempfile.TemporaryDirectory[str] | None = None

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    @property
    def log(self) -> str:
        path = Path(self._dir.name, "redis.log") if self._dir else None
        return path.read_text(errors="replace") if path and path.exists() else ""

    def start(self) -> RedisServer:
        """Start and wait for PONG; retries on another port if a racing process took it."""
        fixed = self.port != 0
        for _ in range(1 if fixed else 5):
            if not fixed:
                self.port = free_port()
            if self._launch():
                return self
        raise RuntimeError(f"redis-server did not start on port {self.port}:\n{self.log}")

    def _launch(self) -> bool:
        assert REDIS_SERVER is not None
        self._dir = self._dir or tempfile.TemporaryDirectory(prefix="streamer-redis-")
        # The config comes as arguments: nothing is read from or written to /etc or $HOME.
        args = [REDIS_SERVER, "--port", str(self.port), "--bind", self.host]
        args += ["--save", "", "--appendonly", "no", "--daemonize", "no"]
        args += ["--dir", self._dir.name, "--logfile", "redis.log", "--protected-mode", "no"]
        args += self.extra_args
        self.process = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.process = None
                return False
            if redis_answers(self.port):
                return True
            time.sleep(0.02)
        self.stop()
        return False

    def stop(self) -> None:
        """Kill the server (the port stays reserved in `self.port` for `restart`)."""
        process, self.process = self.process, None
        if process is None:
            return
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)

    def restart(self) -> RedisServer:
        """Stop and start again on the same port (an outage the clients can recover from)."""
        self.stop()
        if not self._launch():
            raise RuntimeError(f"redis-server did not restart on port {self.port}:\n{self.log}")
        return self

    def cleanup(self) -> None:
        self.stop()
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.cleanup()

    async def __aenter__(self) -> RedisServer:
        return await asyncio.to_thread(self.start)

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await asyncio.to_thread(self.cleanup)


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    if REDIS_SERVER is None:
        pytest.skip("redis-server is not installed")
    with RedisServer() as server:
        yield server
