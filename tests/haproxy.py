"""A real haproxy (the Debian package) in front of gateway processes, for tests.

    async with HAProxy([gw0.port, gw1.port], server_timeout="2s") as lb:
        lb.url                        # http://127.0.0.1:<port>/v1, balanced over the servers
        await lb.until("s0", "UP")    # as its health checks (GET /readyz) see the server

Each server is `s<i>`, checked with `GET /readyz` every `check_interval` (down after one
failed check, up after one good one). The runtime API (a Unix socket) tells a server's state.
`requires_haproxy` skips a test when the binary is missing (.ci/run installs it).
"""

from __future__ import annotations

import asyncio
import csv
import shutil
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType

import pytest
from redis_server import free_port

HAPROXY = shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin:/usr/local/sbin")
requires_haproxy = pytest.mark.skipif(HAPROXY is None, reason="haproxy is not installed")

CONFIG = """
global
    maxconn 2000
    stats socket {socket} level admin

defaults
    mode http
    option http-keep-alive
    timeout connect 2s
    timeout client 60s
    timeout server {server_timeout}
    timeout http-keep-alive 60s
    retries 0

frontend gateways
    bind 127.0.0.1:{port}
    default_backend gateways

backend gateways
    balance roundrobin
    option httpchk GET /readyz
    http-check expect status 200
    default-server inter {check_interval} fall 1 rise 1
{servers}
"""


class HAProxy:
    """One haproxy process in the foreground, its config and socket in a temp dir."""

    def __init__(
        self,
        ports: list[int],
        *,
        server_timeout: str = "60s",
        check_interval: str = "100ms",
        checks: bool = True,
    ) -> None:
        if HAPROXY is None:
            raise RuntimeError("haproxy is not installed")
        self.port = free_port()
        self._dir = tempfile.TemporaryDirectory(prefix="haproxy-")
        self.socket = Path(self._dir.name, "admin.sock")
        check = " check" if checks else ""
        servers = "\n".join(
            f"    server s{i} 127.0.0.1:{port}{check}" for i, port in enumerate(ports)
        )
        self.config = Path(self._dir.name, "haproxy.cfg")
        self.config.write_text(
            CONFIG.format(
                socket=self.socket,
                server_timeout=server_timeout,
                port=self.port,
                check_interval=check_interval,
                servers=servers,
            )
        )
        self.log_path = Path(self._dir.name, "haproxy.log")
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"{self.origin}/v1"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    async def start(self) -> HAProxy:
        with self.log_path.open("wb") as out:
            self.process = subprocess.Popen(
                [str(HAPROXY), "-db", "-f", str(self.config)], stdout=out, stderr=out
            )
        async with asyncio.timeout(20):
            while True:
                if self.process.poll() is not None:
                    raise RuntimeError(f"haproxy exited {self.process.returncode}:\n{self.log()}")
                try:
                    if "Name: HAProxy" in await self.command("show info"):
                        return self
                except OSError:
                    pass
                await asyncio.sleep(0.02)

    async def command(self, line: str) -> str:
        """One runtime API command, its whole answer."""
        reader, writer = await asyncio.open_unix_connection(str(self.socket))
        try:
            writer.write(line.encode() + b"\n")
            await writer.drain()
            return (await reader.read()).decode()
        finally:
            writer.close()

    async def states(self) -> dict[str, str]:
        """Each server's state as haproxy sees it: UP, DOWN, MAINT, `UP 1/2`, …"""
        text = (await self.command("show stat")).lstrip("# ")
        rows = csv.DictReader(line for line in text.splitlines() if line)
        return {
            row["svname"]: row["status"]
            for row in rows
            if row["pxname"] == "gateways" and row["svname"] not in ("FRONTEND", "BACKEND")
        }

    async def until(self, server: str, state: str, timeout: float = 30) -> None:
        """Until haproxy sees `server` in `state` (a failure after `timeout`)."""
        try:
            async with asyncio.timeout(timeout):
                while (await self.states()).get(server) != state:
                    await asyncio.sleep(0.02)
        except TimeoutError:
            seen = await self.states()
            raise AssertionError(f"{server} is not {state} after {timeout} s: {seen}") from None

    async def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                await asyncio.wait_for(asyncio.to_thread(self.process.wait), 10)
            except TimeoutError:
                self.process.kill()
                self.process.wait()
        self._dir.cleanup()

    async def __aenter__(self) -> HAProxy:
        return await self.start()

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()
