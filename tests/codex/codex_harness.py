"""Drive the real Codex CLI against a Responses server on loopback.

- `codex_binary()`: the pinned CLI installed by `scripts/install-codex.sh` (or `$CODEX_BIN`).
- `run_codex(base_url, prompt, workdir)`: one isolated `codex exec --json` turn with the probe
  MCP server (`mcp_probe.py`); returns its JSONL events and the probe's call log.
- `SniffingProxy`: a byte-for-byte TCP relay in front of the server that records which
  requests crossed it (POSTs, WebSocket upgrades and their 101s), so a test can tell which
  transport really carried the turn whatever Codex chose to print.
- `start_gateway()`: `python -m streamer serve` as a subprocess on a free port.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import socket
import sys
import time
import tomllib
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
PROBE = Path(__file__).resolve().parent / "mcp_probe.py"
MARKER = "PROBE-MARKER"
FALLBACK_TEXT = "Falling back from WebSockets"
METADATA_TEXT = "Model metadata for"


def codex_binary() -> Path | None:
    """The Codex CLI to test with, or None when it is not installed."""
    explicit = os.environ.get("CODEX_BIN")
    candidates = [Path(explicit)] if explicit else []
    candidates.append(REPO / ".tools" / "codex" / "node_modules" / ".bin" / "codex")
    return next((c for c in candidates if c.is_file() and os.access(c, os.X_OK)), None)


def _toml(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return _toml(str(value))


def dump_toml(table: dict[str, Any], prefix: str = "") -> str:
    """A tiny TOML writer for configs (strings, ints, bools, lists, nested tables)."""
    lines = [f"{k} = {_toml_value(v)}" for k, v in table.items() if not isinstance(v, dict)]
    text = "\n".join(lines) + ("\n" if lines else "")
    for key, value in table.items():
        if isinstance(value, dict):
            name = f"{prefix}.{_toml(key)}" if prefix else _toml(key)
            text += f"\n[{name}]\n" + dump_toml(value, name)
    return text


async def print_config(base_url: str, *args: str) -> str:
    """`streamer codex --print-config` for the gateway at `base_url` (http://host:port/v1)."""
    host, port = base_url.split("//")[1].split("/")[0].rsplit(":", 1)
    env = {**os.environ, "PYTHONPATH": str(REPO), "NO_PROXY": "127.0.0.1,localhost"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "streamer", "codex", "--host", host, "--port", port,
        "--print-config", *args,
        cwd=REPO, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    if proc.returncode != 0:
        raise RuntimeError(f"streamer codex --print-config failed: {err.decode()}")
    return out.decode()


def write_config(
    home: Path,
    printed: str,
    *,
    supports_websockets: bool,
    probe_log: Path,
) -> Path:
    """Write an isolated `$CODEX_HOME/config.toml`: `streamer codex --print-config`'s block,
    plus what a test needs (no approvals, no retries, the probe MCP server)."""
    home.mkdir(parents=True, exist_ok=True)
    config = tomllib.loads(printed)
    config.update(approval_policy="never", sandbox_mode="danger-full-access")
    provider = config["model_providers"][config["model_provider"]]
    provider.update(
        request_max_retries=0, stream_max_retries=0, supports_websockets=supports_websockets
    )
    config["mcp_servers"] = {
        "probe": {
            "command": sys.executable,
            "args": [str(PROBE)],
            "env": {"MCP_PROBE_LOG": str(probe_log)},
        }
    }
    path = home / "config.toml"
    path.write_text(dump_toml(config))
    return path


@dataclass
class CodexRun:
    returncode: int | None  # None: killed on timeout
    events: list[dict[str, Any]]
    stdout: str
    stderr: str
    probe_calls: list[dict[str, Any]] = field(default_factory=list)

    def items(self, item_type: str | None = None) -> list[dict[str, Any]]:
        """Completed items (`item.completed`), optionally of one type."""
        items = [
            e["item"] for e in self.events if e.get("type") == "item.completed" and "item" in e
        ]
        return [i for i in items if item_type is None or i.get("type") == item_type]

    def mcp_tool_calls(self, tool: str | None = None) -> list[dict[str, Any]]:
        return [i for i in self.items("mcp_tool_call") if tool is None or i.get("tool") == tool]

    def completed_mcp_call(self, tool: str) -> dict[str, Any] | None:
        """The first completed `mcp_tool_call` item for `tool`, if any."""
        done = [i for i in self.mcp_tool_calls(tool) if i.get("status") == "completed"]
        return done[0] if done else None

    def fallback_messages(self) -> list[str]:
        """Anything Codex said about falling back from WebSockets (items or stderr)."""
        texts = [json.dumps(e) for e in self.events] + self.stderr.splitlines()
        return [t for t in texts if FALLBACK_TEXT in t]

    def metadata_warnings(self, model: str) -> list[str]:
        """Codex's "Model metadata for `…` not found" item, or its log line for `model` (it
        also looks up an internal model of its own, which is not ours to describe)."""
        texts = [json.dumps(e) for e in self.events] + self.stderr.splitlines()
        return [t for t in texts if METADATA_TEXT in t or f"Unknown model {model} " in t]

    def describe(self) -> str:
        """A compact transcript for assertion messages."""
        return (
            f"rc={self.returncode}\nstdout:\n{self.stdout[-4000:]}\nstderr:\n{self.stderr[-2000:]}"
        )


def result_text(item: dict[str, Any]) -> str:
    """The text parts of an `mcp_tool_call` item's result."""
    content = (item.get("result") or {}).get("content") or []
    return "".join(c.get("text", "") for c in content if isinstance(c, dict))


def parse_jsonl(text: str) -> list[dict[str, Any]]:
    events = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            with contextlib.suppress(json.JSONDecodeError):
                events.append(json.loads(line))
    return events


async def run_codex(
    base_url: str,
    prompt: str,
    workdir: Path,
    *,
    supports_websockets: bool = False,
    timeout: float = 120.0,
    extra_args: tuple[str, ...] = (),
    config_args: tuple[str, ...] = (),
    ephemeral: bool = True,
    subcommand: tuple[str, ...] = (),
) -> CodexRun:
    """Run one `codex exec` turn; async so that servers in this event loop keep serving.

    `ephemeral=False` keeps the session in `workdir`'s Codex home, so that a later run with
    `subcommand=("resume", "--last")` continues it as a second turn of one conversation."""
    binary = codex_binary()
    if binary is None:
        raise RuntimeError("codex is not installed: run scripts/install-codex.sh")
    home, cwd, probe_log = workdir / "codex-home", workdir / "cwd", workdir / "probe-calls.jsonl"
    cwd.mkdir(parents=True, exist_ok=True)
    printed = await print_config(base_url, *config_args)
    write_config(home, printed, supports_websockets=supports_websockets, probe_log=probe_log)
    # A minimal environment: no user config, keys or proxies leak in.
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(workdir),
        "CODEX_HOME": str(home),
        "LANG": "C.UTF-8",
        "NO_PROXY": "127.0.0.1,localhost",
    }
    args = [
        str(binary), "exec", *(["--ephemeral"] if ephemeral else []), "--skip-git-repo-check",
        "--disable", "unbounded_connection_retries", "--json", "-C", str(cwd),
        *extra_args, *subcommand, prompt,
    ]  # fmt: skip
    proc = await asyncio.create_subprocess_exec(
        *args,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,  # otherwise codex exec waits for more input
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
        returncode: int | None = proc.returncode
    except TimeoutError:
        proc.kill()
        out, err = await proc.communicate()
        returncode = None
    stdout, stderr = out.decode(errors="replace"), err.decode(errors="replace")
    calls = parse_jsonl(probe_log.read_text()) if probe_log.exists() else []
    return CodexRun(returncode, parse_jsonl(stdout), stdout, stderr, calls)


# --- what crossed the wire -------------------------------------------------------------

_REQUEST_LINE = re.compile(rb"(GET|POST|PUT|DELETE|HEAD|OPTIONS|PATCH) (\S+) HTTP/1\.[01]\r\n")


@dataclass
class Traffic:
    requests: list[str] = field(default_factory=list)  # "POST /v1/responses", "GET ... (upgrade)"
    switched: int = 0  # upgrade requests answered 101 Switching Protocols

    def count(self, prefix: str) -> int:
        return sum(r.startswith(prefix) for r in self.requests)


class SniffingProxy:
    """A TCP relay that records HTTP request lines and WebSocket upgrades passing through.

    It parses only the head of each request, never the body or the WebSocket frames: once a
    connection has switched protocols it is a plain byte pipe.
    """

    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.traffic = Traffic()
        self._server: asyncio.Server | None = None
        self.port = 0

    async def __aenter__(self) -> SniffingProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_connection(*self.target)
        except OSError:
            client_w.close()
            return
        upgraded = asyncio.Event()
        await asyncio.gather(
            self._pipe(client_r, up_w, sniff_requests=True, upgraded=upgraded),
            self._pipe(up_r, client_w, sniff_requests=False, upgraded=upgraded),
            return_exceptions=True,
        )

    async def _pipe(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        sniff_requests: bool,
        upgraded: asyncio.Event,
    ) -> None:
        try:
            while data := await reader.read(65536):
                if not upgraded.is_set():
                    self._sniff(data, sniff_requests, upgraded)
                writer.write(data)
                await writer.drain()
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    def _sniff(self, data: bytes, is_request: bool, upgraded: asyncio.Event) -> None:
        if is_request:
            for m in _REQUEST_LINE.finditer(data):
                head = data[m.start() : data.find(b"\r\n\r\n", m.start())].lower()
                upgrade = b"\r\nupgrade: websocket" in head
                line = f"{m.group(1).decode()} {m.group(2).decode()}"
                self.traffic.requests.append(line + (" (upgrade)" if upgrade else ""))
        elif data.startswith(b"HTTP/1.1 101"):
            self.traffic.switched += 1
            upgraded.set()


# --- the gateway as a subprocess -------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Gateway:
    process: asyncio.subprocess.Process
    port: int
    log_path: Path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def _get(url: str, timeout: float = 1.0) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=timeout) as resp:  # loopback only
        return resp.status, resp.read()


async def http_get_json(url: str) -> Any:
    status, body = await asyncio.to_thread(_get, url, 5.0)
    return json.loads(body) if status == 200 else None


@contextlib.asynccontextmanager
async def start_gateway(log_path: Path, *args: str, ready_timeout: float = 30.0):
    """Run `python -m streamer serve --port <free> *args` until the context exits."""
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    with log_path.open("wb") as log:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "streamer", "serve", "--host", "127.0.0.1", "--port", str(port), *args,
            cwd=REPO, env=env, stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log,
        )  # fmt: skip
    gateway = Gateway(proc, port, log_path)
    try:
        deadline = time.monotonic() + ready_timeout
        while True:
            if proc.returncode is not None:
                raise RuntimeError(f"gateway exited with {proc.returncode}:\n{gateway.log()}")
            with contextlib.suppress(OSError):
                status, _ = await asyncio.to_thread(_get, f"http://127.0.0.1:{port}/healthz")
                if status == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"gateway not ready after {ready_timeout}s:\n{gateway.log()}")
            await asyncio.sleep(0.1)
        yield gateway
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()
