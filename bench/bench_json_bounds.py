"""What the bounded parse of a client body costs against a plain `orjson.loads`, same run.

Codex-like history bodies (K items alternating a namespaced `function_call` and a 1 kB
`function_call_output`, 8 namespaced tools: issue 31's shape; K = 2,000 is 1.2 MB) and the
hot route's small body go through `orjson.loads` and through `json_bounds.loads` (depth
and value bounds), interleaved; the figure is the median of the repeats of the CPU time
(this thread's) per parse, and the ratio bounded / plain. The value bound is only counted
past 1.5x `--max-json-values` bytes, so K = 4,000 (2.4 MB) pays one translate of the body
at the default; `--max-values` moves that.

    python bench/bench_json_bounds.py [--k 10 200 2000 4000] [--repeat 15] [--json]

For instruction counts instead of CPU time (the machine is shared), run one parse under
callgrind: `valgrind --tool=callgrind python bench/bench_json_bounds.py --once 2000 bounded`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from streamer.core import json_bounds

clock = time.thread_time_ns
OUTPUT = ("total 8\ndrwxr-xr-x 2 user user 4096 Jan  1 00:00 [dir] {x}, y\n" * 20)[:1000]


def history_body(k: int) -> bytes:
    """A Codex-like request: K history items, 8 namespaced tools, streamed."""
    items: list[dict[str, Any]] = []
    for i in range(k // 2):
        arguments = orjson.dumps({"cmd": f"ls -la /tmp/dir{i}", "workdir": "/work"}).decode()
        items.append(
            {"type": "function_call", "call_id": f"call_{i}", "name": "exec_command",
             "namespace": "mcp__shell", "arguments": arguments}
        )  # fmt: skip
        items.append({"type": "function_call_output", "call_id": f"call_{i}", "output": OUTPUT})
    tools = [
        {"type": "namespace", "name": f"mcp__server{j}", "description": "A server.",
         "tools": [{"type": "function", "name": "run", "description": "Runs it.",
                    "parameters": {"type": "object", "properties": {"q": {"type": "string"}},
                                   "required": ["q"]}}]}
        for j in range(8)
    ]  # fmt: skip
    return orjson.dumps({"model": "m", "input": items, "tools": tools, "stream": True})


def small_body() -> bytes:
    """The hot route's request: one short input, one tool."""
    tool = {"type": "function", "name": "f", "parameters": {"type": "object"}}
    return orjson.dumps({"model": "m", "input": "hi", "stream": True, "tools": [tool]})


def per_call_ns(fns: dict[str, Callable[[], object]], calls: int, repeat: int) -> dict[str, float]:
    """Median over `repeat` rounds of the CPU ns per call; the functions interleaved."""
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for fn in fns.values():
        fn()  # warm up
    for _ in range(repeat):
        for name, fn in fns.items():
            start = clock()
            for _ in range(calls):
                fn()
            samples[name].append((clock() - start) / calls)
    return {name: statistics.median(times) for name, times in samples.items()}


def run(ks: list[int], repeat: int, max_values: int) -> list[dict[str, Any]]:
    rows = []
    bodies = [("small", small_body())] + [(f"K={k}", history_body(k)) for k in ks]
    for name, raw in bodies:
        calls = max(3, 20_000_000 // (len(raw) * 10))
        timed = per_call_ns(
            {
                "plain": lambda raw=raw: orjson.loads(raw),
                "bounded": lambda raw=raw: json_bounds.loads(raw, max_values),
            },
            calls,
            repeat,
        )
        rows.append(
            {"body": name, "bytes": len(raw), "plain_us": timed["plain"] / 1000,
             "bounded_us": timed["bounded"] / 1000, "ratio": timed["bounded"] / timed["plain"]}
        )  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--k", type=int, nargs="+", default=[10, 200, 2000, 4000])
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--max-values", type=int, default=json_bounds.MAX_VALUES)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--once", nargs=2, metavar=("K", "PATH"), help="one parse (callgrind)")
    args = parser.parse_args()
    if args.once:
        raw = history_body(int(args.once[0]))
        parse = orjson.loads if args.once[1] == "plain" else json_bounds.loads
        parse(raw)
        return
    rows = run(args.k, args.repeat, args.max_values)
    if args.json:
        print(orjson.dumps({"rows": rows, "python": sys.version.split()[0]}).decode())
        return
    print(f"{'body':>8} {'bytes':>10} {'orjson.loads':>13} {'bounded':>10} {'ratio':>6}")
    for r in rows:
        print(
            f"{r['body']:>8} {r['bytes']:>10,} {r['plain_us']:>10.1f} us "
            f"{r['bounded_us']:>7.1f} us {r['ratio']:>6.3f}"
        )


if __name__ == "__main__":
    main()
