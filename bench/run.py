"""The benchmark suite (`make bench`): the gateway against the raw relay and the peers.

Starts the load backend, the raw relay, the gateway (`python -m streamer serve`), the peers
in front of the backend's Chat Completions when installed (the LiteLLM proxy, codex-relay,
ds4codex, agent-wire-proxy; one not installed is reported with its installer's error), and
the /v1/responses group (the raw relay of the backend's
Responses stream, `streamer serve --upstream-api responses` when it exists, agentic-api when
installed; see responses_targets.py), the Anthropic Messages group (the raw relay of the
backend's Messages stream, `streamer serve --upstream-api anthropic`; messages_targets.py),
probes what a namespaced tool comes back as through
each gateway, then for every N (text deltas) and concurrency C runs the load
client against each target, R times, interleaved, and writes the medians as JSON and Markdown
(and a PNG plot) under bench/results/. The gateway and the peers run pinned to core 0, the
load client, the backend and this script to the other cores (see bench/README.md).

    python bench/run.py            # the full matrix, SSE and WebSocket rows, ~12-15 minutes
    python bench/run.py --quick    # c in {1, 16}, N = 200, one short run each, < 2 minutes
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import fresh_probes
import messages_targets
import probe_responses
import procstat
import report
import responses_targets
import targets as tg

BENCH = Path(__file__).resolve().parent


class Progress:
    """A one-line progress bar on stderr (a line per finished step when it is not a terminal)."""

    def __init__(self, total: int) -> None:
        self.total, self.done, self.t0 = max(total, 1), 0, time.monotonic()
        self.tty = sys.stderr.isatty()

    def show(self, what: str, final: bool = False) -> None:
        if not self.tty and not final:
            return  # in a log, one line per finished step is enough
        frac = self.done / self.total
        elapsed = time.monotonic() - self.t0
        eta = elapsed / frac - elapsed if self.done else 0.0
        bar = "#" * int(30 * frac) + "." * (30 - int(30 * frac))
        line = f"[{bar}] {self.done}/{self.total} {elapsed:4.0f}s eta {eta:3.0f}s  {what}"
        if self.tty:
            sys.stderr.write("\r\x1b[K" + line[:150])
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def step(self, what: str) -> None:
        self.done += 1
        self.show(what, final=True)

    def close(self) -> None:
        if self.tty:
            sys.stderr.write("\n")


def cpu_sets(args: argparse.Namespace) -> tuple[set[int] | None, set[int] | None, str]:
    avail = sorted(os.sched_getaffinity(0))
    if args.no_pin or len(avail) < 2:
        return None, None, "none (fewer than 2 cores, or --no-pin)"
    gw = {int(x) for x in args.gateway_cpus.split(",")} if args.gateway_cpus else {avail[0]}
    load = {int(x) for x in args.load_cpus.split(",")} if args.load_cpus else set(avail) - gw
    text = (
        f"gateway, raw relay and peers on core(s) {sorted(gw)}; load client, backend and "
        f"harness on core(s) {sorted(load)}"
    )
    return gw, load, text


def client_cmd(
    t: tg.Target, c: int, args: argparse.Namespace, backend: tg.Target, requests: int = 0
) -> list[str]:
    cmd = [
        sys.executable,
        str(BENCH / "load_client.py"),
        "--url",
        t.url,
        "-c",
        str(c),
        "--expect",
        t.expect,
        "--json",
        "--procs",
        str(args.client_procs),
    ]
    if t.transport == "ws":
        cmd.append("--ws")
    if t.api_key:
        cmd += ["--api-key", t.api_key]
    if requests:
        return [*cmd, "--requests", str(requests), "--timeout", str(args.smoke_timeout)]
    cmd += ["--duration", str(args.duration), "--warmup", str(args.warmup)]
    if t.pids:
        cmd += ["--watch", f"target={t.pids[0]}"]
    return [*cmd, "--watch", f"backend={backend.pids[0]}"]


def run_client(cmd: list[str], cpus: set[int] | None, timeout: float) -> dict[str, Any]:
    def pin() -> None:
        if cpus:
            os.sched_setaffinity(0, cpus)

    out = subprocess.run(cmd, capture_output=True, timeout=timeout, preexec_fn=pin, cwd=BENCH)
    if out.returncode != 0:
        raise RuntimeError(out.stderr.decode()[-400:])
    return json.loads(out.stdout)


def settle(t: tg.Target, limit: float) -> float:
    """Wait until the target is idle again (a slow peer may still chew on cancelled streams);
    return how long that took."""
    start = time.monotonic()
    while t.pids and time.monotonic() - start < limit:
        pids = t.tree()
        a = procstat.cpu_seconds(pids)
        time.sleep(0.1)
        if procstat.cpu_seconds(pids) - a <= 0.01:
            break
    return time.monotonic() - start


def freeze(peers: list[tg.Target], running: tg.Target) -> None:
    """Stop every peer but `running` (SIGSTOP), let `running` go on (SIGCONT).

    A slow peer keeps working for a minute on streams its clients already left (LiteLLM
    at N=2000, c=64); stopped, it cannot take the shared core from the next target's run.
    Its own runs start after it has settled.
    """
    for peer in peers:
        sig = signal.SIGCONT if peer is running else signal.SIGSTOP
        for pid in peer.tree():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)


def measure(
    t: tg.Target,
    n: int,
    c: int,
    args: argparse.Namespace,
    backend: tg.Target,
    cores: tuple[set[int] | None, set[int] | None],
) -> dict[str, Any]:
    """One run against one target; the client's figures plus CPU, RSS and contention."""
    gw, load = cores
    settled = settle(t, 15 if t.kind == "peer" else 5)
    tree = t.tree()
    procstat.reset_peak_rss(tree)
    t_run = time.monotonic()
    r = run_client(client_cmd(t, c, args, backend), load, args.warmup + args.duration + 60)
    r["client_wall_s"] = time.monotonic() - t_run
    r.pop("samples", None)
    r["settle_s"] = settled
    if r["requests"] < c and t.extra_events is not None:
        # too slow to finish a round of requests in the window: requests/s from events/s
        r["requests_per_s_completed"] = r["requests_per_s"]
        r["requests_per_s"] = r["events_per_s"] / (n + args.m + t.extra_events)
        r["requests_estimated"] = True
    w = r["window_s"] or 1e-9
    cpu = r["cpu_s"]
    target = cpu.get("target")
    r["peak_rss_mb"] = procstat.peak_rss_mb(t.tree()) if tree else None
    r["target_cpu_util"] = target / w if target is not None else None
    r["cpu_us_per_event"] = target / r["events"] * 1e6 if target and r["events"] else None
    r["client_cpu_util"] = cpu["client"] / w
    r["backend_cpu_util"] = cpu["backend"] / w
    ours = cpu["client"] + cpu["backend"] + (target or 0.0)
    r["others_cpu_util"] = max(0.0, cpu.get("machine", 0.0) - ours) / w

    def busy(cs: set[int]) -> float:
        return sum(cpu.get(f"core{i}", 0.0) for i in cs) / w

    # saturated load cores: the figure is a lower bound of what the target can do
    r["load_bound"] = r["client_cpu_util"] >= 0.85 * args.client_procs or (
        bool(load) and busy(load or set()) >= 0.95 * len(load or ())
    )
    # other processes on the gateway cores: the figure may be low because of them
    r["gateway_core_others"] = (
        max(0.0, busy(gw) - target / w) if gw and target is not None else None
    )
    return r


def smoke(
    t: tg.Target, args: argparse.Namespace, backend: tg.Target, load: set[int] | None
) -> None:
    """Two requests before the matrix: a target that cannot answer them is left out."""
    try:
        r = run_client(client_cmd(t, 1, args, backend, requests=2), load, args.smoke_timeout + 30)
    except (RuntimeError, subprocess.TimeoutExpired, json.JSONDecodeError) as exc:
        r = {"requests": 0, "failure_kinds": {"client": str(exc)[-200:]}, "terminal": {}}
    if r["requests"] == 0:
        t.status = "skipped" if t.kind == "peer" else "failed"
        t.reason = f"smoke requests failed: {r['failure_kinds'] or r['terminal']}"
        return
    if not r["failures"]:
        t.extra_events = r["events"] / r["requests"] - (args.n[0] + args.m)
    if r.get("namespace_bad"):
        t.reason = f"namespace not restored: {r['namespace_bad']}"


def run_probes(targets: list[tg.Target], backend: tg.Target, n: int) -> dict[str, Any]:
    """A namespaced tool through every gateway and peer over SSE: what comes back
    (probe_responses.py), for the report."""
    out: dict[str, Any] = {}
    for t in targets:
        if t.status != "ok" or t.kind == "baseline" or t.transport != "sse" or not t.url:
            continue
        result = probe_responses.probe(t.url, backend.url, t.api_key)
        out[t.name] = {"n": n, "verdict": probe_responses.verdict(result, n), "result": result}
    return out


def run_extra(script: Path, quick: bool, gw: set[int] | None, timeout: float) -> dict[str, Any]:
    """Another engineer's micro-benchmark (bench_streamer.py, bench_tools.py), if present:
    its text output for the Markdown and, when it has `--json`, its JSON for the record."""
    if not script.exists():
        return {"status": "absent", "output": ""}
    env = {**os.environ, "PYTHONPATH": str(BENCH.parent)}

    def pin() -> None:
        if gw:
            os.sched_setaffinity(0, gw)

    def call(*flags: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            [sys.executable, str(script), *flags],
            capture_output=True,
            timeout=timeout,
            env=env,
            preexec_fn=pin,
            cwd=BENCH.parent,
        )

    try:
        helptext = call("--help").stdout.decode()
        flags = ["--quick"] if quick and "--quick" in helptext else []
        out = call(*flags)
        as_json = call(*flags, "--json") if out.returncode == 0 and "--json" in helptext else None
    except subprocess.TimeoutExpired:
        return {"status": f"timed out after {timeout:.0f} s", "output": ""}
    text = out.stdout.decode() + (out.stderr.decode()[-2000:] if out.returncode else "")
    result: dict[str, Any] = {"status": "ok" if out.returncode == 0 else f"exit {out.returncode}"}
    result["output"] = text
    if as_json is not None and as_json.returncode == 0:
        with contextlib.suppress(json.JSONDecodeError):
            result["json"] = json.loads(as_json.stdout)
    return result


def start_targets(
    args: argparse.Namespace,
    backend: tg.Target,
    gw: set[int] | None,
    logs: Path,
    out: list[tg.Target],
) -> None:
    """Start (or find) every target, appending each to `out` as soon as it exists, so that
    the caller can stop them all whatever happens."""
    upstream = backend.url + "/v1"
    out.append(tg.start_relay(upstream, gw, logs))
    if not args.no_gateway:
        why = tg.gateway_available()
        if why:
            out.append(tg.Target("streamer", "gateway", status="failed", reason=why))
        else:
            gateway = tg.start_gateway(upstream, gw, logs, args.gateway_arg)
            out.append(gateway)
            if args.ws:
                ws = tg.Target("streamer", "gateway", gateway.url, transport="ws")
                ws.pids, ws.pinned, ws.version = gateway.pids, gateway.pinned, gateway.version
                ws.status, ws.reason = gateway.status, gateway.reason
                out.append(ws)
    for root in args.baseline:  # another checkout, measured in the same run (A/B)
        tree = Path(root).resolve()
        name = f"streamer@{tg.git_describe(tree) or tree.name}"
        out.append(tg.start_gateway(upstream, gw, logs, args.gateway_arg, tree, name))
    if not args.no_litellm:
        out.append(tg.start_litellm(upstream, gw, logs, args.litellm_timeout))
    for name, start in tg.BRIDGES.items():  # codex-relay, ds4codex, agent-wire-proxy
        if name not in args.no_peer:
            out.append(start(upstream, gw, logs, 60))
    out += [tg.external_peer(spec) for spec in args.peer]
    if args.responses:  # the backends that speak /v1/responses (issue 18)
        root = Path(args.responses_root).resolve() if args.responses_root else tg.ROOT
        only = [n for n in args.n if n in args.responses_n] or None  # none of them: every N
        extra = args.gateway_arg
        responses_targets.start_group(upstream, gw, logs, extra, root, args.agentic, only, out)
    if args.messages:  # the backends that speak Anthropic's /v1/messages (issue 29)
        only = [n for n in args.n if n in args.responses_n] or None
        messages_targets.start_group(upstream, gw, logs, args.gateway_arg, tg.ROOT, only, out)


def run_matrix(
    args: argparse.Namespace,
    active: list[tg.Target],
    backend: tg.Target,
    cores: tuple[set[int] | None, set[int] | None],
    progress: Progress,
) -> list[dict[str, Any]]:
    """Every N, every C, R runs of every target interleaved; one cell per (target, N, C)."""
    cells: list[dict[str, Any]] = []
    peers = [t for t in active if t.kind == "peer" and t.pids]
    try:
        _run_cells(args, active, peers, backend, cores, progress, cells)
    finally:
        for peer in peers:  # all running again, for their shutdown
            for pid in peer.tree():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGCONT)
    report.add_ratios(cells)
    return cells


def _run_cells(
    args: argparse.Namespace,
    active: list[tg.Target],
    peers: list[tg.Target],
    backend: tg.Target,
    cores: tuple[set[int] | None, set[int] | None],
    progress: Progress,
    cells: list[dict[str, Any]],
) -> None:
    for n in args.n:
        tg.control_backend(backend, n, args.m)
        for c in args.concurrency:
            runs: list[list[dict[str, Any]]] = [[] for _ in active]
            for rep in range(args.runs):
                for i, t in enumerate(active):
                    if t.only_n is not None and n not in t.only_n:
                        continue
                    label = f"{t.name} {t.transport} N={n} c={c} run {rep + 1}/{args.runs}"
                    progress.show(label)
                    freeze(peers, t)
                    for other in active:  # a slow peer may still chew on the last run's
                        if other is not t and other not in peers:  # cancelled streams
                            settle(other, 2)
                    try:
                        runs[i].append(measure(t, n, c, args, backend, cores))
                    except (RuntimeError, subprocess.TimeoutExpired, KeyError) as exc:
                        print(f"\nbench: {label} failed: {exc}", file=sys.stderr)
                    progress.step(label)
            for i, t in enumerate(active):
                if runs[i]:
                    cell = {"target": t.name, "transport": t.transport, "kind": t.kind}
                    cell["relay"] = t.relay
                    cell |= {"order": i, "n": n, "c": c, "m": args.m}
                    cell |= {"median": report.cell_summary(runs[i]), "runs": runs[i]}
                    cells.append(cell)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    gw, load, pinning = cpu_sets(args)
    if load:
        os.sched_setaffinity(0, load)
    logs = args.out / "raw" / time.strftime("%Y%m%d-%H%M%S")
    logs.mkdir(parents=True, exist_ok=True)
    started = time.strftime("%Y-%m-%d %H:%M")
    print(f"bench: {pinning}; logs in {logs}", file=sys.stderr)
    backend = tg.start_backend(args.n[0], args.m, load, logs)
    targets: list[tg.Target] = []
    extras: dict[str, Any] = {}
    try:
        print("bench: starting the targets (LiteLLM takes a while)", file=sys.stderr)
        start_targets(args, backend, gw, logs, targets)
        for t in targets:
            if t.status == "ok":
                smoke(t, args, backend, load)
            mark = "ok" if t.status == "ok" else f"{t.status}: {t.reason}"
            print(f"bench: {t.name} [{t.transport}] {mark}", file=sys.stderr)
        probes = run_probes(targets, backend, args.n[0])
        active = [t for t in targets if t.status == "ok"]
        scripts = [] if args.no_extras else ["bench_streamer.py", "bench_tools.py"]
        per_n = sum(len(args.n) if t.only_n is None else len(t.only_n) for t in active)
        steps = per_n * len(args.concurrency) * args.runs + len(scripts)
        progress = Progress(steps)
        cells = run_matrix(args, active, backend, (gw, load), progress)
        for t in targets:
            tg.stop(t.proc)  # the micro-benchmarks get the gateway core to themselves
        fresh = fresh_probes.from_run(args, backend, gw, load, logs) if args.fresh else {}
        for name in scripts:
            progress.show(name)
            timeout = 90 if args.quick else 300
            extras[f"bench/{name}"] = run_extra(BENCH / name, args.quick, gw, timeout)
            progress.step(name)
        progress.close()
    finally:
        for t in targets:
            tg.stop(t.proc)
        tg.stop(backend.proc)
    settings = {k: getattr(args, k) for k in ("concurrency", "n", "m", "runs", "duration")}
    settings |= {"warmup": args.warmup, "quick": args.quick, "client_procs": args.client_procs}
    command = "python bench/run.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    result = {
        "meta": {
            "started": started,
            "command": command.strip(),
            "machine": machine(),
            "pinning": pinning,
            "settings": settings,
            "logs": os.path.relpath(logs, BENCH.parent),
        },
        "targets": [t.describe() for t in targets],
        "cells": cells,
        "probes": probes,
        "fresh": fresh,
        "extras": extras,
    }
    paths = report.write(result, args.out, args.name or ("quick" if args.quick else "bench"))
    sys.stdout.write(report.markdown(result))
    print("bench: wrote " + ", ".join(str(p) for p in paths.values()), file=sys.stderr)
    failed = [t for t in targets if t.kind == "gateway" and t.status == "failed"]
    return 1 if failed and not args.allow_gateway_failure else 0


def machine() -> str:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"{os.cpu_count()} cores ({model or platform.machine()}), Linux {platform.release()}, "
        f"Python {platform.python_version()}"
    )


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="c in {1,16}, N=200, 1 run of 1.5 s")
    p.add_argument(
        "--ws",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the gateway's WebSocket mode rows too (Codex's transport; default on)",
    )
    p.add_argument("--concurrency", type=_ints, help="comma list (default 1,16,64)")
    p.add_argument("--n", type=_ints, help="text deltas, comma list (default 50,200,2000)")
    p.add_argument("--m", type=int, default=50, help="argument fragments (default 50)")
    p.add_argument("--runs", type=int, help="runs per cell, the median is kept (default 3)")
    p.add_argument("--duration", type=float, help="measured seconds per run (default 3)")
    p.add_argument("--warmup", type=float, help="seconds of load before each run (default 1)")
    p.add_argument(
        "--baseline",
        action="append",
        default=[],
        metavar="TREE",
        help="another checkout of streamer (e.g. a git worktree of an older commit) to run "
        "beside this one in the same run, over SSE (a same-run A/B)",
    )
    p.add_argument(
        "--peer",
        action="append",
        default=[],
        metavar="NAME=BASE_URL",
        help="another gateway, already running, to measure too",
    )
    p.add_argument("--no-litellm", action="store_true", help="leave the LiteLLM proxy out")
    for name in tg.BRIDGES:
        p.add_argument(
            f"--no-{name}",
            dest="no_peer",
            action="append_const",
            const=name,
            help=f"leave {name} out",
        )
    p.add_argument(
        "--no-peers",
        dest="no_peer",
        action="store_const",
        const=list(tg.BRIDGES),
        help="leave codex-relay, ds4codex and agent-wire-proxy out (not LiteLLM, agentic-api)",
    )
    p.add_argument(
        "--responses",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the /v1/responses-upstream rows: the raw relay of the backend's Responses "
        "stream, streamer --upstream-api responses, agentic-api (default on)",
    )
    p.add_argument(
        "--no-agentic", dest="agentic", action="store_false", help="leave agentic-api out"
    )
    p.add_argument(
        "--messages",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the Anthropic /v1/messages-upstream rows: the raw relay of the backend's "
        "Messages stream, streamer --upstream-api anthropic (default on; at --responses-n)",
    )
    p.add_argument(
        "--responses-n",
        type=_ints,
        help="the N the /v1/responses rows are measured at (default 200; the full matrix "
        "stays within 15 minutes)",
    )
    p.add_argument(
        "--responses-root",
        metavar="TREE",
        help="the checkout whose `streamer serve --upstream-api responses` is measured "
        "(default this one)",
    )
    p.add_argument("--no-gateway", action="store_true", help="leave streamer out")
    p.add_argument(
        "--gateway-arg",
        action="append",
        default=[],
        help="extra argument for `streamer serve` (repeatable)",
    )
    p.add_argument(
        "--fresh",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the fresh-process probes: peak RSS at c=64 for N in 50,200,2000 (SSE, WS), "
        "CPU per request (N=1, M=1) and per event (N=2000), c=16 (fresh_probes.py; default on)",
    )
    p.add_argument(
        "--no-extras", action="store_true", help="skip bench_streamer.py and bench_tools.py"
    )
    p.add_argument("--gateway-cpus", help="cores for the gateway and peers (default: the first)")
    p.add_argument("--load-cpus", help="cores for the load client and backend (default: the rest)")
    p.add_argument("--no-pin", action="store_true", help="do not pin anything")
    p.add_argument("--client-procs", type=int, default=1, help="load client processes")
    p.add_argument("--litellm-timeout", type=float, default=120.0, help="its start-up limit (s)")
    p.add_argument("--smoke-timeout", type=float, default=30.0)
    p.add_argument("--out", type=Path, default=BENCH / "results")
    p.add_argument("--name", help="result file name (default: bench, or quick with --quick)")
    p.add_argument(
        "--allow-gateway-failure",
        action="store_true",
        help="exit 0 even when the gateway failed to start or answer",
    )
    args = p.parse_args(argv)
    args.no_peer = args.no_peer or []
    quick = args.quick
    args.concurrency = args.concurrency or ([1, 16] if quick else [1, 16, 64])
    args.n = args.n or ([200] if quick else [50, 200, 2000])
    args.runs = args.runs or (1 if quick else 3)
    args.responses_n = args.responses_n or [200]
    args.duration = args.duration or (1.5 if quick else 3.0)
    args.warmup = args.warmup if args.warmup is not None else (0.5 if quick else 1.0)
    return args


if __name__ == "__main__":
    sys.exit(main())
