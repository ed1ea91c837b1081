"""Where the gateway's CPU time per request goes: py-spy samples sorted into the layers.

A backend (load_backend.py) and a gateway (`streamer serve`, this checkout) are started
pinned as in the bench; the load client runs c streams for a while, py-spy samples the
gateway meanwhile, and the gateway's CPU time per request (user + system, from /proc) is
split over the layers in proportion to the samples. A sample belongs to the layer of the
innermost frame that names one (a frame in orjson, say, counts for the layer that called
it); socket writes and the event loop itself are layers of their own.

    python bench/breakdown.py [--n 1 --m 1] [-c 16] [--seconds 6] [--ws] [--json]

py-spy comes from the bench's own venv (scripts/install-peers.sh plot): without it the
script says so and stops. Sampling slows the gateway a little, evenly: the shares hold,
the requests/s printed are the ones measured while sampling.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import targets as tg

# (layer, pattern on "file:function") in the order a frame is tried; the first that
# matches names the frame's layer. Socket writes first: they sit inside the server's frames.
LAYERS: tuple[tuple[str, str], ...] = (
    (
        "socket writes",
        r"http_writer\.py:\S*_writelines|connection\.py:Connection\.exchange"
        r"|fast_http\S*:\S*write|websocket\.py:Session\.send",
    ),
    ("SSE / WS encoding", r"core/sse\.py:encode|ws_frames\.py"),
    ("streamer (events)", r"core/output\.py|core/output_items\.py|core/events\.py"),
    (
        "decoding the backend stream",
        r"upstream/chat/(decoder|stream|chunk_shapes|runs)\.py|core/sse\.py"
        r"|http1/wire\.py:ChunkedDecoder|upstream/responses/(decoder|framing|event_shapes)",
    ),
    (
        "prepare (validate, names, lowering)",
        r"turn\.py:(prepare|validate|_all_typed)"
        r"|core/(tools|tool_decls|tool_templates|lowering"
        r"|response|echo|request_fields|input_items"
        r"|media_parts|tool_choice|responses_lowering)\.py"
        r"|compaction\.py|gateway\.py:Gateway\.prepare",
    ),
    ("backend client (HTTP/1.1, routing)", r"upstream/|redact\.py"),
    (
        "turn loop, metrics, tap",
        r"turn_runner\.py|in_flight\.py|gateway\.py|observe\.py|metrics\.py"
        r"|prometheus_client|recorder\.py",
    ),
    ("HTTP server and middlewares", r"aiohttp/|frontends/|app\.py:(?!serve)|multidict"),
    ("event loop", r"asyncio/|uvloop|app\.py:serve|<module>|runpy"),
)
_COMPILED = [(name, re.compile(pattern)) for name, pattern in LAYERS]
_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^()]*?)(?::\d+)?\)$")


def layer_of(stack: list[str]) -> str:
    """The layer of a sample: its innermost frame that matches one."""
    for frame in reversed(stack):
        m = _FRAME.match(frame)
        key = f"{m['file']}:{m['func']}" if m else frame
        for name, pattern in _COMPILED:
            if pattern.search(key):
                return name
    return "other"


def tally(collapsed: str) -> Counter[str]:
    """Samples per layer from py-spy's raw (collapsed) output."""
    out: Counter[str] = Counter()
    for line in collapsed.splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            out[layer_of(stack.split(";"))] += int(count)
    return out


def measure(args: argparse.Namespace, spy: Path) -> dict[str, object]:
    logs = Path(tempfile.mkdtemp(prefix="breakdown-"))
    gw_cpus, load_cpus = ({0}, {1}) if (os.cpu_count() or 1) > 1 else (None, None)
    backend = tg.start_backend(args.n, args.m, load_cpus, logs)
    gateway = tg.start_gateway(backend.url + "/v1", gw_cpus, logs, args.gateway_args)
    try:
        if gateway.status != "ok":
            raise SystemExit(f"breakdown: the gateway did not start: {gateway.reason}")
        pid = gateway.pids[0]
        client = [sys.executable, "load_client.py", "--url", gateway.url, "-c", str(args.c)]
        client += ["--duration", str(args.seconds + 2), "--warmup", "1", "--json"]
        client += ["--watch", f"gw={pid}"] + (["--ws"] if args.ws else [])
        load = subprocess.Popen(
            client, cwd=tg.BENCH, stdout=subprocess.PIPE, preexec_fn=_pin(load_cpus)
        )
        time.sleep(1.5)  # into the client's measured window: warm-up is over
        raw = logs / "samples.txt"
        record = [str(spy), "record", "-p", str(pid), "-d", str(args.seconds)]
        subprocess.run(
            [*record, "-r", str(args.rate), "--format", "raw", "-o", str(raw)],
            check=True,
            capture_output=True,
        )
        result = json.loads(load.communicate(timeout=args.seconds + 60)[0])
    finally:
        tg.stop(gateway.proc)
        tg.stop(backend.proc)
    counts = tally(raw.read_text())
    total = sum(counts.values()) or 1
    cpu = result["cpu_s"]["gw"]
    per_request = 1e6 * cpu / max(1, result["requests"])
    return {
        "n": args.n,
        "m": args.m,
        "c": args.c,
        "transport": "ws" if args.ws else "sse",
        "requests_per_s": round(result["requests_per_s"], 1),
        "cpu_us_per_request": round(per_request, 1),
        "cpu_us_per_event": round(1e6 * cpu / max(1, result["events"]), 3),
        "layers_us": {k: round(per_request * v / total, 1) for k, v in counts.most_common()},
        "samples": total,
    }


def _pin(cpus: set[int] | None):  # type: ignore[no-untyped-def]
    def pin() -> None:
        if cpus:
            os.sched_setaffinity(0, cpus)

    return pin


def render(r: dict[str, object]) -> str:
    lines = [
        f"N={r['n']} M={r['m']} c={r['c']} {r['transport']}: {r['requests_per_s']} req/s while "
        f"sampled; gateway CPU {r['cpu_us_per_request']} µs per request "
        f"({r['cpu_us_per_event']} µs per event), {r['samples']} samples",
        "",
        "| layer | µs per request | share |",
        "|---|---|---|",
    ]
    layers: dict[str, float] = r["layers_us"]  # type: ignore[assignment]
    total = sum(layers.values()) or 1
    for name, us in layers.items():
        lines.append(f"| {name} | {us:,.1f} | {100 * us / total:.0f}% |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=1, help="text deltas per response (default 1)")
    p.add_argument("--m", type=int, default=1, help="argument fragments (default 1)")
    p.add_argument("-c", type=int, default=16, help="concurrent streams (default 16)")
    p.add_argument("--seconds", type=int, default=6, help="sampled seconds (default 6)")
    p.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    p.add_argument("--ws", action="store_true", help="over WebSocket")
    p.add_argument("--json", action="store_true")
    p.add_argument("gateway_args", nargs="*", help="extra `streamer serve` flags (after --)")
    args = p.parse_args(argv)
    spy = tg.ROOT / ".tools" / "bench-venv" / "bin" / "py-spy"
    if not spy.exists():
        print(f"breakdown: py-spy not found at {spy} (scripts/install-peers.sh plot)")
        return 2
    result = measure(args, spy)
    print(json.dumps(result) if args.json else render(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
