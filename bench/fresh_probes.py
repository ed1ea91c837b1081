"""Two probes of issue 20's targets, each in a FRESH gateway process (`bench/run.py`).

- Peak RSS: for every N of the run, over SSE and over WebSocket, a new `streamer serve`
  takes `RSS_C` (64) concurrent streams for a few seconds; its figure is the VmHWM of its
  process tree (bench/procstat.py), start-up included: what a new process reaches, never
  reset. The idle RSS right after it answers /healthz is kept too.
- CPU: gateway CPU time (user + system of its process tree, from the load client's
  `--watch`) per request on a near-empty turn, N = 1 text delta and M = 1 argument
  fragment (the request's fixed cost: one call is always made), and per event on a long
  one, N = 2000, M = 50 (the per-event cost, the fixed cost spread over ~2060 events);
  both at c = `CPU_C` (16), where the gateway is busy but not queueing, each in a new
  process, each the median of the run's `--runs` windows.

- `--fast-http` on / off: the CPU probe per request (N = 1, SSE) of `--fast-http true`
  and `--fast-http false`, each in a new process, alternated `FAST_HTTP_ROUNDS` times (the
  machine's noise falls on both alike): the medians, their spread and the saving per
  round. The fast path is kept while its median saving is at least `FAST_HTTP_PAYS_US`.

Each figure is set beside its target (`TARGETS`) with ok / missed; `--quick` runs one short
window each. With `--baseline TREE` every other checkout is probed the same way, one after
the other, for a same-run A/B. `python bench/fresh_probes.py --fast-http-ab` runs only the
on / off comparison, with a load backend of its own.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import procstat
import targets as tg

BENCH = Path(__file__).resolve().parent
RSS_C = 64
CPU_C = 16
REQUEST_N, REQUEST_M = 1, 1  # the fixed cost of a request: one text delta, a 1-fragment call
EVENT_N, EVENT_M = 2000, 50  # the per-event cost
FAST_HTTP_ROUNDS = 5  # --fast-http true / false alternations in one run
FAST_HTTP_PAYS_US = 40.0  # the fast path stays while it saves this much CPU per request
TARGETS = {
    "peak_rss_mb": 64.0,  # under, at c = 64, for every N, in a fresh process
    "cpu_us_per_request": 200.0,  # at most, N = 1
    "cpu_us_per_event": 2.0,  # at most, N = 2000
}


@dataclass
class Setup:
    """What the probes need from the run: the backend, the cores, the timing."""

    backend: tg.Target
    gw: set[int] | None
    load: set[int] | None
    logs: Path
    extra: list[str]  # --gateway-arg
    duration: float
    warmup: float
    runs: int
    ws: bool


def verdict(key: str, value: float | None) -> str:
    """'ok' / 'missed' against TARGETS[key] ('n/a' when nothing was measured)."""
    if value is None:
        return "n/a"
    limit = TARGETS[key]
    good = value < limit if key == "peak_rss_mb" else value <= limit
    return "ok" if good else "missed"


def _client(url: str, c: int, ws: bool, pid: int, s: Setup, duration: float) -> dict[str, Any]:
    cmd = [sys.executable, str(BENCH / "load_client.py"), "--url", url, "-c", str(c), "--json"]
    cmd += ["--duration", str(duration), "--warmup", str(s.warmup), "--watch", f"target={pid}"]
    cmd += ["--ws"] if ws else []

    def pin() -> None:
        if s.load:
            os.sched_setaffinity(0, s.load)

    out = subprocess.run(
        cmd, capture_output=True, timeout=s.warmup + duration + 60, preexec_fn=pin, cwd=BENCH
    )
    if out.returncode != 0:
        raise RuntimeError(out.stderr.decode()[-400:])
    result: dict[str, Any] = json.loads(out.stdout)
    result.pop("samples", None)
    return result


def _fresh(s: Setup, root: Path, name: str) -> tg.Target:
    upstream = s.backend.url + "/v1"
    return tg.start_gateway(upstream, s.gw, s.logs, s.extra, root, f"fresh-{name}")


def rss_cell(s: Setup, root: Path, name: str, n: int, ws: bool) -> dict[str, Any]:
    """One fresh gateway, c = 64 at N for the run's duration: its peak RSS."""
    tg.control_backend(s.backend, n, EVENT_M)
    cell: dict[str, Any] = {"n": n, "m": EVENT_M, "c": RSS_C, "transport": "ws" if ws else "sse"}
    gateway = _fresh(s, root, name)
    try:
        if gateway.status != "ok":
            return cell | {"error": gateway.reason}
        time.sleep(0.2)  # settled after start-up (its first /healthz answered)
        cell["idle_rss_mb"] = procstat.rss_mb(gateway.tree())
        r = _client(gateway.url, RSS_C, ws, gateway.pids[0], s, s.duration)
        cell["peak_rss_mb"] = procstat.peak_rss_mb(gateway.tree())
        cell |= {"requests_per_s": r["requests_per_s"], "failures": r["failures"]}
    except (RuntimeError, subprocess.TimeoutExpired, KeyError, ValueError) as exc:
        cell["error"] = str(exc)[-300:]
    finally:
        tg.stop(gateway.proc)
    return cell


WINDOW_RETRIES = 5


def cpu_cell(s: Setup, root: Path, name: str, n: int, m: int, ws: bool) -> dict[str, Any]:
    """One fresh gateway, c = 16 at (N, M): its CPU per request and per event (medians)."""
    tg.control_backend(s.backend, n, m)
    cell: dict[str, Any] = {"n": n, "m": m, "c": CPU_C, "transport": "ws" if ws else "sse"}
    gateway = _fresh(s, root, name)
    per_request: list[float] = []
    per_event: list[float] = []
    try:
        if gateway.status != "ok":
            return cell | {"error": gateway.reason}
        # A window whose CPU is below the clock tick (/proc counts 10 ms) on a loaded machine
        # measures nothing: it is run again, a bounded number of times.
        for _ in range(max(1, s.runs) + WINDOW_RETRIES):
            if len(per_request) >= max(1, s.runs):
                break
            r = _client(gateway.url, CPU_C, ws, gateway.pids[0], s, s.duration)
            cpu = r["cpu_s"].get("target")
            if cpu and r["requests"] and r["events"]:
                per_request.append(cpu / r["requests"] * 1e6)
                per_event.append(cpu / r["events"] * 1e6)
            cell |= {"requests_per_s": r["requests_per_s"], "failures": r["failures"]}
    except (RuntimeError, subprocess.TimeoutExpired, KeyError, ValueError) as exc:
        cell["error"] = str(exc)[-300:]
    finally:
        tg.stop(gateway.proc)
    if per_request:
        cell["cpu_us_per_request"] = statistics.median(per_request)
        cell["cpu_us_per_event"] = statistics.median(per_event)
        cell["windows"] = len(per_request)
    return cell


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def fast_http_ab(s: Setup, root: Path, name: str, rounds: int) -> dict[str, Any]:
    """CPU µs per request at N = 1 (SSE, c = 16) with `--fast-http true` and `false`, each
    in a new process, alternated `rounds` times: every figure, the medians and the saving."""
    on: list[float] = []
    off: list[float] = []
    saved: list[float] = []
    errors: list[str] = []
    for _ in range(rounds):
        pair = []
        for flag in ("true", "false"):
            setup = replace(s, extra=[*s.extra, "--fast-http", flag], runs=1)
            cell = cpu_cell(setup, root, f"{name}-fast-http-{flag}", REQUEST_N, REQUEST_M, False)
            pair.append(cell.get("cpu_us_per_request"))
            errors += [cell["error"]] if cell.get("error") else []
        if pair[0] is not None and pair[1] is not None:
            on.append(pair[0])
            off.append(pair[1])
            saved.append(pair[1] - pair[0])
    median = _median(saved)
    out: dict[str, Any] = {"rounds": rounds, "on": on, "off": off, "saved": saved}
    out |= {"median_on": _median(on), "median_off": _median(off), "median_saved": median}
    out["pays"] = None if median is None else median >= FAST_HTTP_PAYS_US
    return out | ({"errors": errors[:3]} if errors else {})


def probe_tree(s: Setup, root: Path, name: str, ns: list[int]) -> dict[str, Any]:
    """Both probes for one checkout."""
    transports = [False, True] if s.ws else [False]
    rss = [rss_cell(s, root, name, n, ws) for n in ns for ws in transports]
    peaks = [c["peak_rss_mb"] for c in rss if "peak_rss_mb" in c]
    request = [cpu_cell(s, root, name, REQUEST_N, REQUEST_M, ws) for ws in transports]
    event = [cpu_cell(s, root, name, EVENT_N, EVENT_M, ws) for ws in transports]
    worst = max(peaks) if peaks and len(peaks) == len(rss) else None  # any cell missing: n/a
    out: dict[str, Any] = {"name": name, "version": tg.git_describe(root), "rss": rss}
    out |= {"cpu_request": request, "cpu_event": event, "peak_rss_mb": worst}
    out["fast_http"] = fast_http_ab(s, root, name, FAST_HTTP_ROUNDS if s.runs > 1 else 2)
    out["verdicts"] = {
        "peak_rss_mb": verdict("peak_rss_mb", worst),
        "cpu_us_per_request": verdict("cpu_us_per_request", _worst(request, "cpu_us_per_request")),
        "cpu_us_per_event": verdict("cpu_us_per_event", _worst(event, "cpu_us_per_event")),
    }
    return out


def _worst(cells: list[dict[str, Any]], key: str) -> float | None:
    values = [c.get(key) for c in cells]
    return max(v for v in values if v is not None) if all(v is not None for v in values) else None


def run(
    setup: Setup, ns: list[int], baselines: list[str], restore: tuple[int, int]
) -> dict[str, Any]:
    """The probes for this checkout and every baseline; the backend is left at `restore`."""
    trees = [(tg.ROOT, "streamer")]
    for root in baselines:
        tree = Path(root).resolve()
        trees.append((tree, f"streamer@{tg.git_describe(tree) or tree.name}"))
    try:
        probed = [probe_tree(setup, root, name, ns) for root, name in trees]
    finally:
        tg.control_backend(setup.backend, *restore)
    settings = {"rss_c": RSS_C, "cpu_c": CPU_C, "request": [REQUEST_N, REQUEST_M]}
    settings |= {"event": [EVENT_N, EVENT_M], "duration": setup.duration, "runs": setup.runs}
    return {"settings": settings, "targets": TARGETS, "trees": probed}


def _fmt(x: float | None, digits: int) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _by(cells: list[dict[str, Any]], transport: str, key: str) -> float | None:
    for cell in cells:
        if cell["transport"] == transport:
            value: float | None = cell.get(key)
            return value
    return None


def _tree_rows(tree: dict[str, Any]) -> list[str]:
    name, v = tree["name"], tree["verdicts"]
    rows = []
    for n in dict.fromkeys(c["n"] for c in tree["rss"]):
        cells = [c for c in tree["rss"] if c["n"] == n]
        sse, ws = _by(cells, "sse", "peak_rss_mb"), _by(cells, "ws", "peak_rss_mb")
        idle = _by(cells, "sse", "idle_rss_mb")
        rows.append(
            f"| {name} | peak RSS, c={RSS_C}, N={n} (idle {_fmt(idle, 1)} MB) "
            f"| {_fmt(sse, 1)} MB | {_fmt(ws, 1)} MB | < {TARGETS['peak_rss_mb']:g} MB "
            f"| {verdict('peak_rss_mb', _max(sse, ws))} |"
        )
    for key, cells, what in (
        ("cpu_us_per_request", tree["cpu_request"], f"N={REQUEST_N}, M={REQUEST_M}"),
        ("cpu_us_per_event", tree["cpu_event"], f"N={EVENT_N}, M={EVENT_M}"),
    ):
        label = "CPU µs per request" if key == "cpu_us_per_request" else "CPU µs per event"
        digits = 0 if key == "cpu_us_per_request" else 2
        sse, ws = _by(cells, "sse", key), _by(cells, "ws", key)
        rows.append(
            f"| {name} | {label}, {what}, c={CPU_C} | {_fmt(sse, digits)} | {_fmt(ws, digits)} "
            f"| ≤ {TARGETS[key]:g} | {v[key]} |"
        )
    return rows


def fast_http_rows(tree: dict[str, Any]) -> list[str]:
    """The on / off comparison of one tree, as a table row (none when it did not run)."""
    ab = tree.get("fast_http")
    if not ab or ab.get("median_saved") is None:
        return []
    spread = f"{min(ab['saved']):.0f} to {max(ab['saved']):.0f}"
    pays = "pays" if ab["pays"] else "does not pay"
    return [
        f"| {tree['name']} | {len(ab['saved'])} | {_fmt(ab['median_on'], 0)} "
        f"({min(ab['on']):.0f}-{max(ab['on']):.0f}) | {_fmt(ab['median_off'], 0)} "
        f"({min(ab['off']):.0f}-{max(ab['off']):.0f}) | {_fmt(ab['median_saved'], 0)} "
        f"({spread}) | ≥ {FAST_HTTP_PAYS_US:g}: {pays} |"
    ]


def _max(*xs: float | None) -> float | None:
    got = [x for x in xs if x is not None]
    return max(got) if got else None


def markdown(fresh: dict[str, Any] | None) -> list[str]:
    """The probes' table for the report's summary (nothing when they did not run)."""
    if not fresh or not fresh.get("trees"):
        return []
    lines = [
        "## Fresh-process probes (issue 20's targets)",
        "",
        "A new gateway process for each row: peak RSS is its VmHWM after a run at c = "
        f"{RSS_C} (start-up included); CPU is its user + system time over the window, per "
        "request completed and per event received (median of the windows).",
        "",
        "| gateway | probe | SSE | WS | target | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for tree in fresh["trees"]:
        lines += _tree_rows(tree)
    ab = [row for tree in fresh["trees"] for row in fast_http_rows(tree)]
    if ab:
        lines += [
            "",
            f"`--fast-http true` vs `false`, CPU µs per request (N={REQUEST_N}, M={REQUEST_M}, "
            f"SSE, c={CPU_C}), a new process each, alternated: median (range)",
            "",
            "| gateway | rounds | on | off | saved | verdict |",
            "|---|---|---|---|---|---|",
            *ab,
        ]
    errors = [
        f"- {t['name']} {c['transport']} N={c['n']}: {c['error']}"
        for t in fresh["trees"]
        for c in t["rss"] + t["cpu_request"] + t["cpu_event"]
        if c.get("error")
    ]
    return [*lines, *(["", *errors] if errors else []), ""]


PROBE_N = [50, 200, 2000]  # the target is for every N: always these, whatever the matrix


def from_run(
    args: Any, backend: tg.Target, gw: set[int] | None, load: set[int] | None, logs: Path
) -> dict[str, Any]:
    """The probes with `bench/run.py`'s arguments, after its matrix (the targets stopped,
    the backend still up); the backend is left at the matrix's first N."""
    setup = Setup(
        backend, gw, load, logs, args.gateway_arg, args.duration, args.warmup, args.runs, args.ws
    )
    print("bench: fresh-process probes (peak RSS, CPU per request and per event)", file=sys.stderr)
    return run(setup, PROBE_N, args.baseline, (args.n[0], args.m))


def main(argv: list[str] | None = None) -> int:
    """`--fast-http-ab`: the on / off comparison alone, with its own load backend."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--fast-http-ab", action="store_true", required=True)
    p.add_argument("--rounds", type=int, default=FAST_HTTP_ROUNDS)
    p.add_argument("--duration", type=float, default=3.0)
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--root", default=str(tg.ROOT), help="the checkout to measure")
    args = p.parse_args(argv)
    logs = Path(tempfile.mkdtemp(prefix="fast-http-ab-"))
    backend = tg.start_backend(REQUEST_N, REQUEST_M, None, logs)
    try:
        s = Setup(backend, None, None, logs, [], args.duration, args.warmup, 1, False)
        tree = {
            "name": "streamer",
            "fast_http": fast_http_ab(s, Path(args.root), "ab", args.rounds),
        }
    finally:
        tg.stop(backend.proc)
    print(json.dumps(tree["fast_http"], indent=1))
    print("\n".join(fast_http_rows(tree)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
