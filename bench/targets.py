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
    # "responses" | "raw" (Chat chunks) | "raw-responses" | "raw-messages"; raw: no check
    expect: str = "responses"
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


def start_backend(
    n: int, m: int, cpus: set[int] | None, logs: Path, extra: tuple[str, ...] = ()
) -> Target:
    cmd = [sys.executable, "load_backend.py", "--port", "0", "--n", str(n), "--m", str(m)]
    cmd += extra
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
MESSAGES_RELAY = "raw relay (messages)"
_RELAYS = {  # api -> (name, what its stream ends with for the load client)
    "chat": ("raw relay", "raw"),
    "responses": (RESPONSES_RELAY, "raw-responses"),
    "messages": (MESSAGES_RELAY, "raw-messages"),
}


def start_relay(upstream: str, cpus: set[int] | None, logs: Path, api: str = "chat") -> Target:
    """The raw relay to the backend's Chat endpoint, or (api "responses", "messages") to its
    Responses or Anthropic Messages one."""
    cmd = [sys.executable, "raw_relay.py", "--upstream", upstream, "--port", "0", "--api", api]
    name, expect = _RELAYS[api]
    proc = spawn(cmd, cpus, logs / ("raw-relay.log" if api == "chat" else f"raw-relay-{api}.log"))
    port = read_port(proc, 15)
    return Target(
        name,
        "baseline",
        f"http://127.0.0.1:{port}",
        expect=expect,
        pids=[proc.pid],
        pinned=bool(cpus),
        proc=proc,
        version="bench/raw_relay.py" + ("" if api == "chat" else f" --api {api}"),
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


PEERS = ROOT / ".tools" / "peers"  # scripts/install-peers.sh: a venv per peer


def log_tail(text: str, lines: int = 3, limit: int = 400) -> str:
    """The last `lines` error lines of an installer's log (its last lines if none says
    error), joined with " / ", at most `limit` characters (the end kept)."""
    kept = [ln.strip() for ln in text.splitlines() if ln.strip()]
    noise = ("WARNING: Location", "[notice]")  # pip's chatter about unused index paths
    kept = [ln for ln in kept if not ln.startswith(noise)] or kept
    errors = [ln for ln in kept if "error" in ln.lower()] or kept
    joined = " / ".join(errors[-lines:]).replace("|", "/")
    return joined if len(joined) <= limit else "…" + joined[-limit:]


def install_error(name: str) -> str:
    """Why the peer `name` is not in .tools/peers/<name>: the tail of its installer log
    (scripts/install-peers.sh leaves it in .tools/peers/<name>.install.log), else how to
    install it."""
    log = PEERS / f"{name}.install.log"
    hint = f"scripts/install-peers.sh {name} puts it in .tools/peers/{name}"
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return f"not installed ({hint})"
    tail = log_tail(text)
    if not tail:
        return f"not installed ({hint}; its log {log.name} is empty)"
    return f"install failed: {tail} (see .tools/peers/{log.name})"


def start_litellm(upstream: str, cpus: set[int] | None, logs: Path, timeout: float) -> Target:
    venv = PEERS / "litellm"
    exe = venv / "bin" / "litellm"
    target = Target("LiteLLM proxy", "peer", pinned=bool(cpus))
    if not exe.exists():
        target.status, target.reason = "skipped", install_error("litellm")
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


BENCH_KEY = "sk-bench"  # what the bridges send the backend (it checks no key)


def _start_peer(
    target: Target,
    cmd: list[str],
    cpus: set[int] | None,
    log: Path,
    env: dict[str, str],
    ready: str,
    timeout: float,
) -> Target:
    """Start a peer on the port in `target.url`, wait for GET `ready` to answer; a peer that
    does not come up is "skipped" with why and where its log is."""
    env = {"NO_PROXY": "127.0.0.1,localhost", **env}
    proc = spawn(cmd, cpus, log, env=env, pipe=False)  # they log to stdout: not into a pipe
    target.pids, target.proc = [proc.pid], proc
    try:
        wait_http(target.url + ready, timeout, proc)
    except RuntimeError as exc:
        stop(proc)
        target.status, target.reason = "skipped", f"did not start: {exc}; see {log}"
    return target


def _peer(name: str, venv: str, exe: str, dist: str, cpus: set[int] | None) -> Target:
    """The Target of the peer in .tools/peers/<venv> (on a free port), or "skipped" with the
    installer's error when its executable is not there."""
    target = Target(name, "peer", pinned=bool(cpus))
    if not (PEERS / venv / "bin" / exe).exists():
        target.status, target.reason = "skipped", install_error(venv)
        return target
    target.version = _dist_version(PEERS / venv, dist)
    target.url = f"http://127.0.0.1:{free_port()}"
    return target


def _port(target: Target) -> str:
    return target.url.rsplit(":", 1)[1]


def start_codex_relay(upstream: str, cpus: set[int] | None, logs: Path, timeout: float) -> Target:
    """codex-relay (PyPI `codex-relay`: a Rust binary in the wheel), a Responses to Chat
    Completions bridge for Codex, in front of the backend's /v1/chat/completions."""
    t = _peer("codex-relay", "codex-relay", "codex-relay", "codex_relay", cpus)
    if t.status != "ok":
        return t
    cmd = [str(PEERS / "codex-relay" / "bin" / "codex-relay"), "--bind", "127.0.0.1"]
    cmd += ["--port", _port(t), "--upstream", upstream, "--api-key", BENCH_KEY]
    env = {"RUST_LOG": "error", "TOKIO_WORKER_THREADS": "1"}  # no per-request log; one core
    # it has no health route; its 404 for GET / says it is listening
    return _start_peer(t, cmd, cpus, logs / "codex-relay.log", env, "/", timeout)


def start_ds4codex(upstream: str, cpus: set[int] | None, logs: Path, timeout: float) -> Target:
    """ds4codex (PyPI `ds4codex`, aiohttp), a Responses to Chat Completions bridge for Codex
    and DeepSeek, in front of the backend's /v1/chat/completions. Its settings come from the
    command line alone: `--config-path` names a file that does not exist, so it reads no
    ~/.codex/config.toml."""
    t = _peer("ds4codex", "ds4codex", "ds4codex", "ds4codex", cpus)
    if t.status != "ok":
        return t
    cmd = [str(PEERS / "ds4codex" / "bin" / "ds4codex"), "run"]
    cmd += ["--config-path", str(logs / "ds4codex-no-config.toml"), "--host", "127.0.0.1"]
    cmd += ["--port", _port(t), "--target-url", upstream + "/chat/completions"]
    cmd += ["--api-key", BENCH_KEY, "--thinking", "disabled", "--log-level", "WARNING"]
    return _start_peer(t, cmd, cpus, logs / "ds4codex.log", {}, "/health", timeout)


AGENT_WIRE_CONFIG = """\
[proxy]
default_model = "bench"

[[models]]
id = "bench"
target = "{target}"
upstream_api = "chat_completions"
api_key_env = "BENCH_UPSTREAM_API_KEY"
"""


def start_agent_wire(upstream: str, cpus: set[int] | None, logs: Path, timeout: float) -> Target:
    """agent-wire-proxy (PyPI `agent-wire-proxy`, http.server with a thread per connection),
    model `bench` routed to the backend's Chat Completions, its JSONL request log to
    /dev/null (it still writes an access line per request to stderr, the run's log)."""
    t = _peer("agent-wire-proxy", "agent-wire-proxy", "agent-wire-proxy", "agent_wire_proxy", cpus)
    if t.status != "ok":
        return t
    config = logs / "agent-wire-proxy.toml"
    config.write_text(AGENT_WIRE_CONFIG.format(target=upstream.removesuffix("/v1")))
    cmd = [str(PEERS / "agent-wire-proxy" / "bin" / "agent-wire-proxy"), "--config", str(config)]
    cmd += ["--env-file", "", "--listen", f"127.0.0.1:{_port(t)}", "--log", os.devnull]
    cmd += ["--route-receipt-dir", str(logs / "agent-wire-receipts")]
    cmd += ["--max-concurrent-requests", "1024"]  # its default 64 would refuse c=64's stragglers
    env = {"BENCH_UPSTREAM_API_KEY": BENCH_KEY, "AGENT_WIRE_PROXY_CLIENT_API_KEY": ""}
    return _start_peer(t, cmd, cpus, logs / "agent-wire-proxy.log", env, "/health", timeout)


# run.py's --no-<peer> flag, the start function: the Chat-side bridges beside LiteLLM
BRIDGES = {
    "codex-relay": start_codex_relay,
    "ds4codex": start_ds4codex,
    "agent-wire-proxy": start_agent_wire,
}


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
