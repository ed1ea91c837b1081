"""Start, find and stop the servers a benchmark run measures: backend, raw relay, gateway, peers.

Every server we start is pinned with sched_setaffinity before it execs (the gateway and the
peers to the gateway cores, the backend to the load cores) and logs to a file next to the
raw results. A target is what the load client is pointed at: a base URL, the kind of stream it
returns, and the root pids whose process trees are charged for CPU and memory.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import select
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import procstat

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent


@dataclass
class Target:
    name: str
    kind: str  # "gateway" | "baseline" | "peer"
    url: str = ""
    transport: str = "sse"  # "sse" | "ws"
    expect: str = "responses"  # "responses" | "raw" (Chat chunks) | "raw-responses"; raw: no check
    pids: list[int] = field(default_factory=list)  # roots of the process trees to measure
    pinned: bool = False
    status: str = "ok"  # "ok" | "skipped" | "failed"
    reason: str = ""
    version: str = ""
    api_key: str = ""  # sent as a Bearer token by the load client
    extra_events: float | None = None  # events per response beyond N + M (from the smoke test)
    proc: subprocess.Popen[bytes] | None = None
    relay: str = "raw relay"  # the baseline its ratios are to (same upstream API)
    only_n: list[int] | None = None  # measured at these N only (None: every N of the matrix)

    def tree(self) -> list[int]:
        return [p for root in self.pids for p in procstat.tree(root)]

    def describe(self) -> dict[str, object]:
        keys = ("name", "kind", "url", "transport", "expect", "pinned", "status", "reason", "relay")
        return {k: getattr(self, k) for k in keys} | {"version": self.version}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spawn(
    cmd: list[str],
    cpus: set[int] | None,
    log: Path,
    env: dict[str, str] | None = None,
    pipe: bool = True,
) -> subprocess.Popen[bytes]:
    """Start `cmd` pinned to `cpus`, stdout piped (for "listening <port>"; with `pipe` False
    to `log` too: a server that logs to stdout must not fill a pipe nobody reads), stderr to
    `log`."""

    def pin() -> None:
        if cpus:
            os.sched_setaffinity(0, cpus)
        os.setpgrp()  # its own group, so that stopping it stops what it started

    log.parent.mkdir(parents=True, exist_ok=True)
    err = log.open("ab")
    try:
        return subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE if pipe else err,
            stderr=err,
            stdin=subprocess.DEVNULL,
            preexec_fn=pin,
            env={**os.environ, **(env or {})},
            cwd=str(BENCH),
        )
    finally:
        err.close()


def read_port(proc: subprocess.Popen[bytes], timeout: float) -> int:
    """The port from the child's first line, `listening <port>`."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    line = proc.stdout.readline().decode() if ready else ""
    if not line.startswith("listening "):
        raise RuntimeError(f"no 'listening' line from {proc.args!r} (got {line!r})")
    return int(line.split()[1])


_LOCAL = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: no proxy


def wait_http(url: str, timeout: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    """Until GET `url` answers (any status below 500)."""
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"exited with status {proc.returncode} before it was ready")
        try:
            with _LOCAL.open(url, timeout=2) as resp:
                if resp.status < 500:
                    return
        except urllib.error.HTTPError as exc:
            if exc.code < 500:
                return
            last = f"HTTP {exc.code}"
        except OSError as exc:
            last = str(exc)
        time.sleep(0.2)
    raise RuntimeError(f"not ready after {timeout:.0f} s ({last})")


def stop(proc: subprocess.Popen[bytes] | None, grace: float = 5.0) -> None:
    """SIGTERM the process group we started, then SIGKILL it if it lingers."""
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(grace)


def start_backend(n: int, m: int, cpus: set[int] | None, logs: Path) -> Target:
    cmd = [sys.executable, "load_backend.py", "--port", "0", "--n", str(n), "--m", str(m)]
    proc = spawn(cmd, cpus, logs / "backend.log")
    port = read_port(proc, 15)
    url = f"http://127.0.0.1:{port}"
    return Target("backend", "backend", url, pids=[proc.pid], pinned=bool(cpus), proc=proc)


def control_backend(backend: Target, n: int, m: int) -> None:
    req = urllib.request.Request(
        backend.url + "/control", data=f'{{"n":{n},"m":{m}}}'.encode(), method="POST"
    )
    with _LOCAL.open(req, timeout=5) as resp:
        resp.read()


RESPONSES_RELAY = "raw relay (responses)"


def start_relay(upstream: str, cpus: set[int] | None, logs: Path, api: str = "chat") -> Target:
    """The raw relay to the backend's Chat endpoint, or (api "responses") to its Responses one."""
    cmd = [sys.executable, "raw_relay.py", "--upstream", upstream, "--port", "0", "--api", api]
    name = RESPONSES_RELAY if api == "responses" else "raw relay"
    proc = spawn(
        cmd, cpus, logs / ("raw-relay-responses.log" if api == "responses" else "raw-relay.log")
    )
    port = read_port(proc, 15)
    return Target(
        name,
        "baseline",
        f"http://127.0.0.1:{port}",
        expect="raw-responses" if api == "responses" else "raw",
        pids=[proc.pid],
        pinned=bool(cpus),
        proc=proc,
        version="bench/raw_relay.py" + (" --api responses" if api == "responses" else ""),
        relay=name,
    )


def gateway_available() -> str:
    """'' when `python -m streamer serve --help` works, else why not."""
    if not (ROOT / "streamer" / "cli.py").exists():
        return "streamer/cli.py does not exist yet"
    try:
        out = subprocess.run(
            [sys.executable, "-m", "streamer", "serve", "--help"],
            cwd=ROOT,
            capture_output=True,
            timeout=60,
        )
    except subprocess.TimeoutExpired:
        return "`python -m streamer serve --help` timed out"
    if out.returncode != 0:
        return "`python -m streamer serve --help` failed: " + out.stderr.decode()[-300:]
    return ""


def start_gateway(
    upstream: str,
    cpus: set[int] | None,
    logs: Path,
    extra: list[str],
    root: Path = ROOT,
    name: str = "streamer",
) -> Target:
    """`streamer serve` from the checkout at `root` (another tree: a same-run baseline)."""
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "streamer",
        "serve",
        "--upstream",
        upstream,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *extra,
    ]
    log = logs / (re.sub(r"[^A-Za-z0-9.-]+", "-", name).strip("-") + ".log")
    proc = spawn(cmd, cpus, log, env={"PYTHONPATH": str(root)})
    url = f"http://127.0.0.1:{port}"
    target = Target(name, "gateway", url, pids=[proc.pid], pinned=bool(cpus), proc=proc)
    target.version = git_describe(root)
    try:
        wait_http(url + "/healthz", 30, proc)
    except RuntimeError as exc:
        stop(proc)
        target.status, target.reason = "failed", f"{exc}; see {log}"
    return target


def git_describe(root: Path = ROOT) -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.decode().strip() or "uncommitted"


LITELLM_CONFIG = """\
model_list:
  - model_name: bench
    litellm_params:
      model: {provider}/bench
      api_base: {upstream}
      api_key: sk-bench
litellm_settings:
  drop_params: true
  telemetry: false
  set_verbose: false
"""


def start_litellm(upstream: str, cpus: set[int] | None, logs: Path, timeout: float) -> Target:
    venv = ROOT / ".tools" / "peers" / "litellm"
    exe = venv / "bin" / "litellm"
    target = Target("LiteLLM proxy", "peer", pinned=bool(cpus))
    if not exe.exists():
        target.status = "skipped"
        target.reason = "not installed (scripts/install-peers.sh puts it in .tools/peers/litellm)"
        return target
    target.version = _dist_version(venv, "litellm")
    config = logs / "litellm.yaml"
    config.write_text(LITELLM_CONFIG.format(provider=LITELLM_PROVIDER, upstream=upstream))
    port = free_port()
    target.api_key = "sk-bench-" + secrets.token_hex(16)
    env = {
        "LITELLM_MASTER_KEY": target.api_key,  # it refuses to start without one
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no fetch of the cost map at start
        "LITELLM_LOG": "ERROR",
        "LITELLM_TELEMETRY": "False",
        "DISABLE_SCHEMA_UPDATE": "True",
        "NO_PROXY": "127.0.0.1,localhost",
    }
    cmd = [
        str(exe),
        "--config",
        str(config),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--num_workers",
        "1",
    ]
    proc = spawn(cmd, cpus, logs / "litellm.log", env=env)
    target.url, target.pids, target.proc = f"http://127.0.0.1:{port}", [proc.pid], proc
    try:
        wait_http(target.url + "/health/liveliness", timeout, proc)
    except RuntimeError as exc:
        stop(proc)
        target.status, target.reason = "skipped", f"did not start: {exc}"
    return target


# custom_openai: an OpenAI-compatible Chat backend with no native Responses API, so the
# proxy serves /v1/responses through its Chat Completions bridge (hosted_vllm would not).
LITELLM_PROVIDER = "custom_openai"


def _dist_version(venv: Path, dist: str) -> str:
    for meta in venv.glob(f"lib/python*/site-packages/{dist}-*.dist-info/METADATA"):
        for line in meta.read_text(errors="replace").splitlines():
            if line.startswith("Version:"):
                return line.split(":", 1)[1].strip()
    return ""


def external_peer(spec: str) -> Target:
    """`name=base_url` of a gateway that is already running (not started, not pinned by us)."""
    name, _, url = spec.partition("=")
    url = url.rstrip("/")
    if url.endswith("/v1"):
        url = url[:-3]
    target = Target(name or url, "peer", url, version="already running; not pinned by the bench")
    port = int(url.rsplit(":", 1)[1].split("/")[0]) if url.count(":") >= 2 else 80
    target.pids = procstat.pids_listening_on(port)
    if not target.pids:
        target.reason = "its process is not visible: no CPU or RSS figures"
    return target
