"""What a turn costs as the conversation grows (issue 31): CPU per turn against K history items.

Codex-like conversations (history_workload.py: K items alternating a namespaced
`function_call` and its 1 kB output, 8 namespaced tools, a short answer) through the gateway
and its peers, in the same run, for K = 10, 200, 2,000, 4,000 and three ways of sending a turn:

- `full`: HTTP, the whole history every turn (`store: false`), as Codex sends it;
- `prev`: HTTP, `previous_response_id` and `store: true`: only the new item is sent;
- `ws`: the WebSocket mode, `previous_response_id` on the socket: only the new item.

Every target runs pinned to the gateway core (the client and the load backend on the
others), one turn at a time; the figure is the CPU time (user + system, every thread, from
/proc/<pid>/task/*/schedstat, in ns) the target's processes spent per turn over a window of
turns, the median over `--windows` windows interleaved across targets (a disturbance on the
shared machine hits them all alike), with the spread (min-max) beside it. The orjson floor
is `orjson.loads` + `orjson.dumps` of the same `full` body in this process (thread CPU).
A window is a fresh conversation of K items, one warm turn, then `--turns` turns, each
continuing the last as Codex does (`full`: the last input, its output as it came back and
the new item; the history grows by three items a turn, alike at every K and target).

    python bench/bench_history.py                 # everything, prints the ratios to the targets
    python bench/bench_history.py --quick         # K in {10, 2000}, fewer windows
    python bench/bench_history.py --baseline /work/main   # another checkout, same run (A/B)

Results: bench/results/history.{json,md,png} (`--name` changes the stem).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import history_workload as hw
import orjson
import procstat
import responses_targets
import targets as tg

BENCH = Path(__file__).resolve().parent
RESULTS = BENCH / "results"
MODES = ("full", "prev", "ws")
MODE_NAMES = {
    "full": "HTTP, full history",
    "prev": "HTTP, previous_response_id",
    "ws": "WebSocket, previous_response_id",
}
STREAMER = "streamer"
CODEX_RELAY = "codex-relay"
_LOCAL = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: no proxy


def cpu_ns(t: tg.Target) -> int:
    """CPU ns of the target's process tree, every thread (schedstat: user + system)."""
    total = 0
    for pid in t.tree():
        with contextlib.suppress(OSError):
            for task in os.scandir(f"/proc/{pid}/task"):
                with contextlib.suppress(OSError, ValueError):
                    total += int(Path(task.path, "schedstat").read_text().split()[0])
    return total


def core_busy(cores: set[int] | None) -> float:
    if not cores:
        return 0.0
    busy = procstat.busy_seconds()
    return sum(busy.get(f"core{i}", 0.0) for i in cores)


def window(t: tg.Target, mode: str, k: int, args: argparse.Namespace, gw: set[int] | None) -> dict:
    """One window: a fresh conversation of K items, a warm turn, then turns measured."""
    conv = hw.Conversation(t.url, mode, t.api_key)
    try:
        conv.start(k)
        conv.turn()  # warm: its teardown is not the start's
        turns = args.turns
        busy0, cpu0, wall0 = core_busy(gw), cpu_ns(t), time.monotonic()
        for _ in range(turns):
            conv.turn()
        cpu1, wall = cpu_ns(t), time.monotonic() - wall0
        others = max(0.0, core_busy(gw) - busy0 - (cpu1 - cpu0) / 1e9)
    finally:
        conv.close()
    return {
        "turns": turns,
        "cpu_ms": (cpu1 - cpu0) / 1e6 / turns,
        "wall_ms": wall * 1e3 / turns,
        "core_others": others / wall if wall else 0.0,
    }


def floor_ms(k: int, repeat: int) -> float:
    """orjson.loads + orjson.dumps of the `full` body, thread CPU ms (median)."""
    raw = hw.full_body(k)
    calls = max(3, 20_000_000 // len(raw))
    samples = []
    for _ in range(repeat):
        start = time.thread_time_ns()
        for _ in range(calls):
            orjson.dumps(orjson.loads(raw))
        samples.append((time.thread_time_ns() - start) / calls / 1e6)
    return statistics.median(samples)


def send_floor_ms(
    backend: tg.Target, gateway: tg.Target, k: int, repeat: int, gw: set[int] | None
) -> float:
    """CPU ms (thread time, on the gateway core) to send the backend, over loopback from a
    plain blocking socket, the very Chat body the gateway sent it for a `prev` turn at K
    (`GET /last`), and read its answer: what a turn costs any relay of that body, however
    little of it is new (the history a Chat backend must be sent every turn)."""
    conv = hw.Conversation(gateway.url, "prev", gateway.api_key)
    try:
        conv.start(k)
        conv.turn()
    finally:
        conv.close()
    with _LOCAL.open(backend.url + "/last", timeout=30) as resp:
        last = orjson.loads(resp.read())
    body = orjson.dumps(last["body"])
    client = hw.HttpClient(backend.url)
    home = os.sched_getaffinity(0)
    if gw:
        os.sched_setaffinity(0, gw)  # this thread, as the gateway ran
    try:
        client.post(last["path"], body)  # the connection made, and warm
        calls = max(5, min(200, 50_000_000 // len(body)))
        samples = []
        for _ in range(repeat):
            start = time.thread_time_ns()
            for _ in range(calls):
                client.post(last["path"], body)
            samples.append((time.thread_time_ns() - start) / calls / 1e6)
    finally:
        os.sched_setaffinity(0, home)
        client.close()
    return statistics.median(samples)


def probe(t: tg.Target, mode: str) -> str:
    """'' when the target can take the mode (a conversation of 10 and two more turns)."""
    try:
        conv = hw.Conversation(t.url, mode, t.api_key)
    except Exception as exc:
        return f"cannot connect: {exc}"[:300]
    try:
        conv.start(10)
        conv.turn()
        conv.turn()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"[:300]
    finally:
        with contextlib.suppress(Exception):
            conv.close()
    return ""


def start_targets(
    args: argparse.Namespace, backend: tg.Target, gw: set[int] | None, logs: Path, out: list
) -> None:
    upstream = backend.url + "/v1"
    out.append(tg.start_gateway(upstream, gw, logs, args.gateway_arg))
    for root in args.baseline:
        tree = Path(root).resolve()
        name = f"streamer@{tg.git_describe(tree) or tree.name}"
        out.append(tg.start_gateway(upstream, gw, logs, args.gateway_arg, tree, name))
    if not args.no_codex_relay:
        out.append(tg.start_codex_relay(upstream, gw, logs, 60))
    if not args.no_responses:
        t = responses_targets.start_gateway(upstream, gw, logs, args.gateway_arg, tg.ROOT)
        out.append(t)
    if not args.no_agentic:
        out.append(responses_targets.start_agentic(upstream, gw, logs, 60))


def run_cells(
    args: argparse.Namespace, active: list[tg.Target], gw: set[int] | None
) -> dict[str, Any]:
    """Every (target, mode, K): `--windows` windows, interleaved across targets."""
    supported = {(t.name, m): probe(t, m) for t in active for m in args.modes}
    samples: dict[tuple[str, str, int], list[dict]] = {}
    total = args.windows * len(args.k) * len(args.modes) * len(active)
    done, t0 = 0, time.monotonic()
    for rep in range(args.windows):
        for k in args.k:
            for mode in args.modes:
                order = active[rep % len(active) :] + active[: rep % len(active)]
                for t in order:
                    done += 1
                    if supported[(t.name, mode)]:
                        continue
                    try:
                        w = window(t, mode, k, args, gw)
                    except Exception as exc:
                        w = {"error": f"{type(exc).__name__}: {exc}"[:300]}
                    samples.setdefault((t.name, mode, k), []).append(w)
                    print(
                        f"[{done}/{total} {time.monotonic() - t0:5.0f}s] {t.name} {mode} K={k}: "
                        + (f"{w['cpu_ms']:.2f} ms" if "cpu_ms" in w else w["error"]),
                        file=sys.stderr,
                        flush=True,
                    )
    return {"supported": supported, "samples": samples}


def summarise(samples: list[dict]) -> dict[str, Any]:
    good = [s["cpu_ms"] for s in samples if "cpu_ms" in s]
    errors = [s["error"] for s in samples if "error" in s]
    if not good:
        return {"median": None, "errors": errors}
    return {
        "median": statistics.median(good),
        "min": min(good),
        "max": max(good),
        "windows": len(good),
        "turns": sum(s["turns"] for s in samples if "turns" in s),
        "wall_ms": statistics.median(s["wall_ms"] for s in samples if "wall_ms" in s),
        "core_others": statistics.median(s["core_others"] for s in samples if "core_others" in s),
        "errors": errors,
    }


def ratios(
    cells: dict[str, dict], floors: dict[int, float], sends: dict[int, float], ks: list[int]
) -> list[dict]:
    """The issue's targets as same-run ratios (None where a figure is missing); for the
    continuations also the ratio less the growth of the send floor (what relaying the
    longer Chat body costs any relay: the rest is the gateway's own work)."""

    def cell(name: str, mode: str, k: int) -> float | None:
        return cells.get(f"{name}|{mode}|{k}", {}).get("median")

    big, small = (2000, 10) if 2000 in ks and 10 in ks else (max(ks), min(ks))
    s_full, relay = cell(STREAMER, "full", big), cell(CODEX_RELAY, "full", big)
    out = [
        {"target": f"HTTP full replay, K={big}: CPU / orjson floor", "limit": 3.0,
         "value": s_full / floors[big] if s_full and big in floors else None},
        {"target": f"HTTP full replay, K={big}: CPU / codex-relay's", "limit": 0.5,
         "value": s_full / relay if s_full and relay else None},
    ]  # fmt: skip
    grown = sends[big] - sends[small] if big in sends and small in sends else None
    for mode in ("ws", "prev"):
        a, b = cell(STREAMER, mode, big), cell(STREAMER, mode, small)
        name = f"{MODE_NAMES[mode]}: CPU per turn at K={big} / at K={small}"
        out.append({"target": name, "limit": 2.0, "value": a / b if a and b else None})
        net = (a - grown) / b if a and b and grown is not None else None
        out.append({"target": name + ", less the send floor's growth", "limit": 2.0,
                    "value": net})  # fmt: skip
    for r in out:
        r["ok"] = r["value"] is not None and r["value"] <= r["limit"]
    return out


def markdown(result: dict[str, Any]) -> str:
    ks, names = result["k"], result["targets"]
    lines = [
        "# History benchmark (bench/bench_history.py)",
        "",
        f"{result['when']}, {result['machine']}; pinning: {result['pinning']}.",
        "CPU ms per turn, median of the windows (min-max); the orjson floor is loads + dumps"
        " of the `full` body; the send floor is the CPU of sending the backend, from a plain"
        " socket on the gateway core, the Chat body the gateway sent it at K, and reading"
        " its answer.",
        "",
    ]
    for mode in result["modes"]:
        lines += [f"## {MODE_NAMES[mode]}", ""]
        lines.append("| target | " + " | ".join(f"K={k}" for k in ks) + " |")
        lines.append("|---|" + "---|" * len(ks))
        if mode == "full":
            floor = " | ".join(f"{result['floor_ms'][str(k)]:.2f}" for k in ks)
            lines.append(f"| orjson floor | {floor} |")
        if result.get("send_ms"):
            send = " | ".join(f"{result['send_ms'].get(str(k), 0.0):.2f}" for k in ks)
            lines.append(f"| send floor | {send} |")
        for name in names:
            why = result["unsupported"].get(f"{name}|{mode}")
            if why:
                lines.append(f"| {name} | n/a: {why[:120]} |" + " |" * (len(ks) - 1))
                continue
            row = []
            for k in ks:
                c = result["cells"].get(f"{name}|{mode}|{k}", {})
                if c.get("median") is None:
                    row.append("failed" if c.get("errors") else "-")
                else:
                    row.append(f"{c['median']:.2f} ({c['min']:.2f}-{c['max']:.2f})")
            lines.append(f"| {name} | " + " | ".join(row) + " |")
        lines.append("")
    lines += ["## Targets", "", "| target | value | limit | |", "|---|---|---|---|"]
    for r in result["ratios"]:
        value = f"{r['value']:.2f}" if r["value"] is not None else "n/a"
        lines.append(
            f"| {r['target']} | {value} | ≤ {r['limit']:g} | {'ok' if r['ok'] else 'missed'} |"
        )
    for t in result["skipped"]:
        lines.append(f"\nskipped: {t}")
    return "\n".join(lines) + "\n"


def plot(json_path: Path, png: Path) -> str:
    py = tg.ROOT / ".tools" / "bench-venv" / "bin" / "python"
    if not py.exists():
        return "no plot: no .tools/bench-venv (scripts/install-peers.sh plot)"
    out = subprocess.run(
        [str(py), str(BENCH / "plot_history.py"), str(json_path), str(png)], capture_output=True
    )
    return "" if out.returncode == 0 else out.stderr.decode()[-400:]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--k", type=int, nargs="+", default=[10, 200, 2000, 4000])
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    p.add_argument("--windows", type=int, default=5, help="windows per cell (median)")
    p.add_argument("--turns", type=int, default=8, help="turns measured per window")
    p.add_argument("--baseline", action="append", default=[], metavar="TREE")
    p.add_argument("--gateway-arg", action="append", default=[])
    p.add_argument("--no-codex-relay", action="store_true")
    p.add_argument("--no-agentic", action="store_true")
    p.add_argument("--no-responses", action="store_true", help="no streamer (responses) row")
    p.add_argument("--only-streamer", action="store_true", help="no peers at all")
    p.add_argument("--quick", action="store_true", help="K in {10, 2000}, 3 windows")
    p.add_argument("--no-pin", action="store_true")
    p.add_argument("--name", default="history")
    args = p.parse_args()
    if args.quick:
        args.k, args.windows = [10, 2000], min(args.windows, 3)
    if args.only_streamer:
        args.no_codex_relay = args.no_agentic = args.no_responses = True
    return args


def main() -> None:
    args = parse_args()
    avail = sorted(os.sched_getaffinity(0))
    gw = load = None
    pinning = "none"
    if not args.no_pin and len(avail) >= 2:
        gw, load = {avail[0]}, set(avail[1:])
        os.sched_setaffinity(0, load)
        pinning = f"targets on core {avail[0]}, client and backend on {sorted(load)}"
    logs = RESULTS / "raw" / time.strftime("history-%Y%m%d-%H%M%S")
    started: list[tg.Target] = []
    backend = tg.start_backend(3, 2, load, logs, ("--unique-calls",))
    try:
        start_targets(args, backend, gw, logs, started)
        active = [t for t in started if t.status == "ok"]
        skipped = [f"{t.name}: {t.reason}" for t in started if t.status != "ok"]
        floors = {k: floor_ms(k, 7) for k in args.k}
        run = run_cells(args, active, gw)
        streamer = next((t for t in active if t.name == STREAMER), None)
        sends = {k: send_floor_ms(backend, streamer, k, 5, gw) for k in args.k} if streamer else {}
    finally:
        for t in started:
            tg.stop(t.proc)
        tg.stop(backend.proc)
    cells = {"|".join(map(str, key)): summarise(v) for key, v in run["samples"].items()}
    result = {
        "when": time.strftime("%Y-%m-%d %H:%M"),
        "machine": f"{platform.node()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "pinning": pinning,
        "k": args.k,
        "modes": args.modes,
        "targets": [t.name for t in active],
        "versions": {t.name: t.version for t in active},
        "floor_ms": {str(k): v for k, v in floors.items()},
        "send_ms": {str(k): v for k, v in sends.items()},
        "unsupported": {f"{n}|{m}": why for (n, m), why in run["supported"].items() if why},
        "cells": cells,
        "skipped": skipped,
    }
    result["ratios"] = ratios(cells, floors, sends, args.k)
    RESULTS.mkdir(exist_ok=True)
    json_path = RESULTS / f"{args.name}.json"
    json_path.write_text(json.dumps(result, indent=1))
    text = markdown(result)
    (RESULTS / f"{args.name}.md").write_text(text)
    why = plot(json_path, RESULTS / f"{args.name}.png")
    print(text + (f"\n{why}\n" if why else ""))


if __name__ == "__main__":
    main()
