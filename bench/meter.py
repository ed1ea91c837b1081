"""What the load client counts, and how a run's counts become rates and percentiles.

A `Meter` is shared by the workers of one client process; only what happens inside the
window [t0, t1] is counted. `judge` reads the last event of a response: the terminal kind and
whether the call came back as `lookup` in the `mcp__bench` namespace with valid arguments.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import orjson

NS, FN = "mcp__bench", "lookup"
# The terminal event of a whole answer, by what the load client expects (else the gateway's).
END = {"raw": "[DONE]", "raw-messages": "message_stop"}


def percentiles(xs: list[float]) -> dict[str, float | None]:
    if not xs:
        return {"p50": None, "p99": None}
    s = sorted(xs)

    def at(q: float) -> float:
        return round(s[min(len(s) - 1, int(q * len(s)))] * 1000, 3)

    return {"p50": at(0.5), "p99": at(0.99)}


class Meter:
    """Counters shared by the workers of one process."""

    def __init__(self, expect: str, t0: float, t1: float) -> None:
        self.expect = expect
        self.t0, self.t1 = t0, t1
        self.events = 0
        self.nbytes = 0
        self.ttfb: list[float] = []
        self.first_text: list[float] = []
        self.latency: list[float] = []
        self.ok = 0
        self.failures: Counter[str] = Counter()
        self.terminal: Counter[str] = Counter()
        self.ns_ok = 0
        self.ns_bad: Counter[str] = Counter()

    def in_window(self, t: float) -> bool:
        return self.t0 <= t <= self.t1

    def fail(self, why: str) -> None:
        if self.in_window(time.monotonic()):
            self.failures[why] += 1

    def mark(self, samples: list[float], t_send: float) -> float:
        """Record a first byte or first text that happened now, if now is in the window."""
        now = time.monotonic()
        if self.t0 <= now <= self.t1:
            samples.append(now - t_send)
        return now - t_send

    def done(self, t_send: float, last: bytes) -> None:
        t_end = time.monotonic()
        if not self.in_window(t_end):
            return
        kind, verdict = judge(last, self.expect)
        self.terminal[kind] += 1
        if kind != END.get(self.expect, "response.completed"):
            self.failures[f"ended with {kind}"] += 1
            return
        if verdict == "ok":
            self.ns_ok += 1
        elif verdict is not None:
            self.ns_bad[verdict] += 1
        self.ok += 1
        self.latency.append(t_end - t_send)


def judge(last: bytes, expect: str) -> tuple[str, str | None]:
    """(terminal kind, namespace verdict) of the last event; verdict None: no call to check."""
    data = last
    if not last.lstrip().startswith(b"{"):  # SSE: the data lines of the last event but [DONE]
        events = [
            b"\n".join(ln[5:].lstrip() for ln in ev.splitlines() if ln.startswith(b"data:"))
            for ev in last.replace(b"\r\n", b"\n").split(b"\n\n")
        ]
        events = [e for e in events if e]
        data = events[-1] if events else b""
        if expect != "raw" and data == b"[DONE]" and len(events) > 1:
            data = events[-2]
    if expect == "raw":
        return ("[DONE]" if data.strip() == b"[DONE]" else "no [DONE]"), None
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        return "unparsable last event", None
    kind = str(obj.get("type"))
    if kind != "response.completed" or expect in ("raw-responses", "raw-messages"):
        return kind, None  # the raw relay of a Responses or Messages backend: nothing to check
    calls = [
        i for i in obj.get("response", {}).get("output", []) if i.get("type") == "function_call"
    ]
    if not calls:
        return kind, "no function_call in the output"
    call = calls[0]
    if call.get("name") != FN or call.get("namespace") != NS:
        return kind, f"name={call.get('name')!r} namespace={call.get('namespace')!r}"
    try:
        if not isinstance(orjson.loads(call.get("arguments", "")), dict):
            return kind, "arguments not an object"
    except orjson.JSONDecodeError:
        return kind, "arguments not JSON"
    return kind, "ok"


def meter_fields(m: Meter) -> dict[str, Any]:
    return {
        "requests": m.ok,
        "failures": sum(m.failures.values()),
        "failure_kinds": dict(m.failures.most_common(5)),
        "terminal": dict(m.terminal),
        "namespace_ok": m.ns_ok,
        "namespace_bad": dict(m.ns_bad.most_common(3)),
        "samples": {"ttfb": m.ttfb, "first_text": m.first_text, "latency": m.latency},
    }


def summarize(r: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
    """Rates and percentiles from the raw counts (also after merging processes)."""
    w = r["window_s"] or 1e-9
    s = r.pop("samples")
    if settings["expect"] in ("raw", "raw-responses", "raw-messages"):
        namespace = "n/a"
    elif r["namespace_bad"]:
        namespace = "no"
    else:
        namespace = "yes" if r["namespace_ok"] else "unknown"
    return {
        **settings,
        **r,
        "events_per_s": r["events"] / w,
        "requests_per_s": r["requests"] / w,
        "mb_per_s": r["bytes"] / w / 1e6,
        "ttfb_ms": percentiles(s["ttfb"]),
        "first_text_ms": percentiles(s["first_text"]),
        "latency_ms": percentiles(s["latency"]),
        "namespace": namespace,
        "cpu_util": {k: v / w for k, v in r["cpu_s"].items()},
    }


def merge(parts: list[dict[str, Any]]) -> dict[str, Any]:
    out = dict(parts[0])
    out["window_s"] = max(p["window_s"] for p in parts)
    for key in ("events", "bytes", "requests", "failures", "namespace_ok"):
        out[key] = sum(p[key] for p in parts)
    for key in ("failure_kinds", "terminal", "namespace_bad"):
        out[key] = dict(sum((Counter(p[key]) for p in parts), Counter()))
    out["samples"] = {k: [x for p in parts for x in p["samples"][k]] for k in out["samples"]}
    out["cpu_s"] = {k: sum(p["cpu_s"].get(k, 0.0) for p in parts) for k in parts[0]["cpu_s"]}
    return out
