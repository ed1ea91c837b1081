"""The `/v1/responses`-upstream group of a benchmark run (issue 18).

Against the load backend's `/v1/responses` (a stream of Responses events): the raw relay of
that stream, the gateway in `--upstream-api responses`, and vLLM's Rust gateway `agentic-api`
(PyPI `agentic-api`, in `.tools/peers/agentic-api`). Their ratios are to the Responses relay.

The gateway row is guarded: until `streamer serve` knows `--upstream-api` as a flag of its
own (before issue 18, argparse took it as an abbreviation of `--upstream-api-key`, which
would silently send "responses" as the key and go on speaking Chat), the row is
"not available" with the reason, and the rest of the run goes on.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import targets as tg

AGENTIC_VENV = tg.PEERS / "agentic-api"
GATEWAY_NAME = "streamer (responses)"
AGENTIC_NAME = "agentic-api"


def gateway_flag_missing(root: Path, flag: str = "--upstream-api") -> str:
    """'' when `streamer serve --help` of the checkout at `root` lists `flag` itself."""
    why = tg.gateway_available() if root == tg.ROOT else ""
    if why:
        return why
    try:
        out = subprocess.run(
            [sys.executable, "-m", "streamer", "serve", "--help"],
            cwd=root,
            env={**os.environ, "PYTHONPATH": str(root)},
            capture_output=True,
            timeout=60,
        )
    except subprocess.TimeoutExpired:
        return "`python -m streamer serve --help` timed out"
    text = out.stdout.decode()
    if out.returncode != 0:
        return "`python -m streamer serve --help` failed: " + out.stderr.decode()[-300:]
    if not re.search(re.escape(flag) + r"(?![\w-])", text):
        return f"`streamer serve` at {tg.git_describe(root)} has no {flag} flag yet"
    return ""


def start_gateway(
    upstream: str, cpus: set[int] | None, logs: Path, extra: list[str], root: Path
) -> tg.Target:
    """`streamer serve --upstream-api responses`, or a "not available" row saying why not."""
    why = gateway_flag_missing(root)
    if why:
        t = tg.Target(GATEWAY_NAME, "gateway", status="not available", reason=why)
    else:
        args = ["--upstream-api", "responses", *extra]
        t = tg.start_gateway(upstream, cpus, logs, args, root, GATEWAY_NAME)
    t.relay = tg.RESPONSES_RELAY
    return t


def start_agentic(upstream: str, cpus: set[int] | None, logs: Path, timeout: float) -> tg.Target:
    """agentic-server (the Rust binary of the wheel) in front of the backend's /v1/responses,
    its SQLite store under the run's log folder."""
    exe = AGENTIC_VENV / "bin" / "agentic-server"
    t = tg.Target(AGENTIC_NAME, "peer", pinned=bool(cpus), relay=tg.RESPONSES_RELAY)
    if not exe.exists():
        t.status, t.reason = "skipped", tg.install_error(AGENTIC_NAME)
        return t
    t.version = tg._dist_version(AGENTIC_VENV, "agentic_api")
    port = tg.free_port()
    db = logs / "agentic-api.db"
    cmd = [str(exe), "--llm-api-base", upstream, "--gateway-host", "127.0.0.1"]
    cmd += ["--gateway-port", str(port), "--db-url", f"sqlite://{db}"]
    env = {"NO_PROXY": "127.0.0.1,localhost", "RUST_LOG": "warn", "OPENAI_API_KEY": "sk-bench"}
    proc = tg.spawn(cmd, cpus, logs / "agentic-api.log", env=env, pipe=False)
    t.url, t.pids, t.proc = f"http://127.0.0.1:{port}", [proc.pid], proc
    try:
        tg.wait_http(t.url + "/health", timeout, proc)
    except RuntimeError as exc:
        tg.stop(proc)
        t.status, t.reason = "skipped", f"did not start: {exc}; see {logs / 'agentic-api.log'}"
    return t


def start_group(
    upstream: str,
    cpus: set[int] | None,
    logs: Path,
    extra: list[str],
    root: Path,
    agentic: bool,
    only_n: list[int] | None,
    out: list[tg.Target],
) -> None:
    """The relay, the gateway and agentic-api, appended to `out` as each exists."""
    group = [tg.start_relay(upstream, cpus, logs, api="responses")]
    out.append(group[0])
    group.append(start_gateway(upstream, cpus, logs, extra, root))
    out.append(group[-1])
    if agentic:
        group.append(start_agentic(upstream, cpus, logs, 60))
        out.append(group[-1])
    for t in group:
        t.only_n = only_n
