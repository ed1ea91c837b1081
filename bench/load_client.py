"""Load client: C concurrent streaming Responses requests, over SSE or WebSocket.

Each request carries a namespace tool (`mcp__bench` with `lookup`) FIRST, so that the load
backend calls its flat name, and a plain function tool. Per request it measures the time to
the first body byte, to the first text delta and to the end of the stream; it counts events
(SSE messages, or WebSocket frames) and bytes, and reads only the last event, where it checks
that the call came back as `name:"lookup"`, `namespace:"mcp__bench"` with valid arguments.
With `--expect raw` (the raw relay, which returns Chat chunks) the last event must be
`[DONE]` and the namespace check is n/a; with `--expect raw-responses` (the raw relay of a
Responses backend) the last event must be `response.completed`, and with `--expect
raw-messages` (the raw relay of an Anthropic Messages backend) `message_stop`; the check is
n/a for both.

Time-window mode (the default): the load runs for `--warmup` seconds, then counters are read
at t0 and again at t1 = t0 + `--duration`; events/s is what arrived in between, requests and
latencies are those that ended in between, and in-flight requests are dropped at t1. CPU time
of `--watch name=pid` process trees is read at t0 and t1 as well. `--requests K` instead runs
exactly K requests and reports them all. `--procs P` splits the concurrency over P processes.

    python bench/load_client.py --url http://127.0.0.1:8080 -c 16 --duration 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Coroutine
from typing import Any

import aiohttp
import orjson
import procstat
from httpwire import install_uvloop
from meter import FN, NS, Meter, merge, meter_fields, summarize
from sse_client import HttpStatusError, StreamConnection, build_request

PARAMS = {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}
TOOLS = [
    {
        "type": "namespace",
        "name": NS,
        "description": "Tools of the bench MCP server.",
        "tools": [
            {
                "type": "function",
                "name": FN,
                "description": "Look a thing up.",
                "parameters": PARAMS,
            }
        ],
    },
    {"type": "function", "name": "echo", "description": "Echo the query.", "parameters": PARAMS},
]
MARK = {
    "responses": b"response.output_text.delta",
    "raw": b'"content":"tok',
    "raw-responses": b"response.output_text.delta",
    "raw-messages": b'"text_delta","text":"tok',
}
SSE_HEADERS = {"Content-Type": "application/json", "Accept": "text/event-stream"}
TERMINAL = ("response.completed", "response.incomplete", "response.failed", '"type":"error"')


def request_body(model: str, ws: bool, store: bool = False) -> dict[str, Any]:
    """`store: false` unless `store` (the API's default: measures keeping every response)."""
    body: dict[str, Any] = {"model": model, "input": "Run the benchmark.", "tools": TOOLS}
    body["store"] = store
    if ws:
        return {"type": "response.create", **body}
    return {**body, "stream": True}


class SseSink:
    """Takes a response body read by read: counts events and bytes, notes the first byte and
    the first text delta, and keeps only the last two events (some servers send
    `data: [DONE]` after the terminal one)."""

    __slots__ = ("carry", "m", "mark", "mcarry", "pending", "sep", "t_send", "text", "ttfb")

    def __init__(self, m: Meter) -> None:
        self.m = m
        self.mark = MARK[m.expect]
        self.sep, self.carry, self.mcarry = b"\n\n", b"", b""
        self.pending = bytearray()
        self.ttfb: float | None = None
        self.text: float | None = None
        self.t_send = time.monotonic()

    def __call__(self, data: bytes) -> None:
        m, sep = self.m, self.sep
        if self.ttfb is None:
            self.ttfb = m.mark(m.ttfb, self.t_send)
            eol = data.find(b"\n")
            if eol > 0 and data[eol - 1] == 13:  # CRLF line ends
                sep = self.sep = b"\r\n\r\n"
        m.events += (self.carry + data).count(sep)
        m.nbytes += len(data)
        self.carry = data[1 - len(sep) :]
        if self.text is None:
            if self.mark in self.mcarry + data:
                self.text = m.mark(m.first_text, self.t_send)
            self.mcarry = data[-len(self.mark) :]
        pending = self.pending
        pending += data
        cut = pending.rfind(sep, 0, len(pending) - len(sep))
        if cut > 0:
            cut = pending.rfind(sep, 0, cut)
            if cut >= 0:
                del pending[: cut + len(sep)]


async def sse_worker(target: tuple[str, int, bytes], m: Meter, count: list[int] | None) -> None:
    """One kept-alive connection posting the same streamed request again and again."""
    host, port, payload = target
    conn: StreamConnection | None = None
    try:
        while count is None or count[0] > 0:
            if count is not None:
                count[0] -= 1
            try:
                if conn is None or conn.closed:
                    conn = await StreamConnection.open(host, port)
                sink = SseSink(m)
                await conn.request(payload, sink)
            except HttpStatusError as exc:
                m.fail(f"HTTP {exc.status}")
                await asyncio.sleep(0.01)
                continue
            except (OSError, ConnectionError) as exc:
                m.fail(type(exc).__name__)
                conn = None
                await asyncio.sleep(0.01)
                continue
            m.done(sink.t_send, bytes(sink.pending))
    finally:
        if conn is not None:
            conn.close()


async def ws_worker(
    session: aiohttp.ClientSession, url: str, frame: str, m: Meter, count: list[int] | None
) -> None:
    """One socket sending `response.create` frames one after the other."""
    while count is None or count[0] > 0:
        try:
            async with session.ws_connect(url, max_msg_size=0) as ws:
                while count is None or count[0] > 0:
                    if count is not None:
                        count[0] -= 1
                    t_send = time.monotonic()
                    ttfb = text = None
                    await ws.send_str(frame)
                    while True:
                        msg = await ws.receive()
                        if msg.type != aiohttp.WSMsgType.TEXT:
                            raise ConnectionError(f"websocket {msg.type.name}")
                        s: str = msg.data
                        m.events += 1
                        m.nbytes += len(s)
                        head = s[:160]
                        if ttfb is None:
                            ttfb = m.mark(m.ttfb, t_send)
                        if text is None and "response.output_text.delta" in head:
                            text = m.mark(m.first_text, t_send)
                        if any(t in head for t in TERMINAL):
                            break
                    m.done(t_send, s.encode())
        except (aiohttp.ClientError, OSError, ConnectionError) as exc:
            m.fail(type(exc).__name__)
            await asyncio.sleep(0.01)


def jobs(
    args: argparse.Namespace, session: aiohttp.ClientSession, m: Meter, count: list[int] | None
) -> list[Coroutine[Any, Any, None]]:
    """The C workers: SSE on our lean client, WebSocket on aiohttp's (session for that)."""
    url = args.url.rstrip("/") + args.path
    body = request_body(args.model, args.ws, args.store)
    if args.ws:
        frame = orjson.dumps(body).decode()
        return [ws_worker(session, ws_url(url), frame, m, count) for _ in range(args.concurrency)]
    target = build_request(url, orjson.dumps(body), {**SSE_HEADERS, **auth_headers(args)})
    return [sse_worker(target, m, count) for _ in range(args.concurrency)]


def auth_headers(args: argparse.Namespace) -> dict[str, str]:
    return {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}


def ws_url(url: str) -> str:
    return "ws" + url[4:] if url.startswith("http") else url


async def run_window(args: argparse.Namespace, start_at: float) -> dict[str, Any]:
    t0 = start_at + args.warmup
    t1 = t0 + args.duration
    m = Meter(args.expect, t0, t1)
    watch = dict(w.split("=", 1) for w in args.watch)
    snaps: list[tuple[float, int, int, float, dict[str, float]]] = []

    def snapshot() -> None:
        cpu = {k: procstat.cpu_seconds(procstat.tree(int(p))) for k, p in watch.items()}
        cpu.update(procstat.busy_seconds())
        ru = resource.getrusage(resource.RUSAGE_SELF)
        snaps.append((time.monotonic(), m.events, m.nbytes, ru.ru_utime + ru.ru_stime, cpu))

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, headers=auth_headers(args)) as session:
        await asyncio.sleep(max(0.0, start_at - time.monotonic()))
        tasks = jobs(args, session, m, None)
        running = [asyncio.ensure_future(t) for t in tasks]
        await asyncio.sleep(max(0.0, t0 - time.monotonic()))
        snapshot()
        await asyncio.sleep(max(0.0, t1 - time.monotonic()))
        snapshot()
        for t in running:
            t.cancel()
        await asyncio.gather(*running, return_exceptions=True)
    (a_t, a_ev, a_b, a_cpu, a_w), (b_t, b_ev, b_b, b_cpu, b_w) = snaps
    return {
        "window_s": b_t - a_t,
        "events": b_ev - a_ev,
        "bytes": b_b - a_b,
        "cpu_s": {"client": b_cpu - a_cpu, **{k: b_w[k] - a_w[k] for k in b_w}},
        **meter_fields(m),
    }


async def run_count(args: argparse.Namespace) -> dict[str, Any]:
    """Exactly `--requests` requests (for smoke checks): every one is reported."""
    m = Meter(args.expect, 0.0, float("inf"))
    count = [args.requests]
    t_start = time.monotonic()
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, headers=auth_headers(args)) as session:
        c = min(args.concurrency, args.requests)
        args = argparse.Namespace(**{**vars(args), "concurrency": c})
        work = jobs(args, session, m, count)
        await asyncio.wait_for(asyncio.gather(*work), args.timeout)
    return {
        "window_s": time.monotonic() - t_start,
        "events": m.events,
        "bytes": m.nbytes,
        "cpu_s": {},
        **meter_fields(m),
    }


def run_procs(args: argparse.Namespace) -> dict[str, Any]:
    """Split the load over `--procs` child processes that start together."""
    start_at = time.monotonic() + 1.0  # time for the children to import
    shares = [
        args.concurrency // args.procs + (i < args.concurrency % args.procs)
        for i in range(args.procs)
    ]
    base = [
        sys.executable,
        os.path.abspath(__file__),
        "--url",
        args.url,
        "--path",
        args.path,
        "--model",
        args.model,
        "--expect",
        args.expect,
        "--warmup",
        str(args.warmup),
        "--duration",
        str(args.duration),
        "--start-at",
        repr(start_at),
        "--raw",
    ]
    if args.ws:
        base.append("--ws")
    if args.store:
        base.append("--store")
    if args.api_key:
        base += ["--api-key", args.api_key]
    children = [
        subprocess.Popen([*base, "-c", str(c)], stdout=subprocess.PIPE) for c in shares if c
    ]
    # the parent only watches the CPU of the target at t0 and t1
    watch = dict(w.split("=", 1) for w in args.watch)
    t0 = start_at + args.warmup
    time.sleep(max(0.0, t0 - time.monotonic()))
    a = {k: procstat.cpu_seconds(procstat.tree(int(p))) for k, p in watch.items()}
    a.update(procstat.busy_seconds())
    time.sleep(max(0.0, t0 + args.duration - time.monotonic()))
    b = {k: procstat.cpu_seconds(procstat.tree(int(p))) for k, p in watch.items()}
    b.update(procstat.busy_seconds())
    parts = [json.loads(ch.communicate()[0]) for ch in children]
    merged = merge(parts)
    merged["cpu_s"].update({k: b[k] - a[k] for k in b})
    return merged


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--url", required=True, help="base URL of the gateway, e.g. http://h:p")
    p.add_argument("--path", default="/v1/responses")
    p.add_argument("-c", "--concurrency", type=int, default=1)
    p.add_argument("--duration", type=float, default=3.0, help="measured window, seconds")
    p.add_argument("--warmup", type=float, default=1.0, help="load before the window, seconds")
    p.add_argument("--requests", type=int, default=0, help="run exactly K requests instead")
    p.add_argument("--timeout", type=float, default=60.0, help="limit for --requests, seconds")
    p.add_argument("--ws", action="store_true", help="WebSocket mode: C sockets")
    p.add_argument(
        "--expect",
        choices=["responses", "raw", "raw-responses", "raw-messages"],
        default="responses",
        help="raw: Chat chunks from the raw relay, no namespace check; raw-responses: the "
        "relay of a Responses backend (Responses events, no namespace check)",
    )
    p.add_argument("--model", default="bench")
    p.add_argument("--store", action="store_true", help="store: true (measure the response store)")
    p.add_argument(
        "--api-key",
        default=os.environ.get("BENCH_API_KEY", ""),
        help="sent as Authorization: Bearer (default $BENCH_API_KEY)",
    )
    p.add_argument(
        "--watch",
        action="append",
        default=[],
        metavar="NAME=PID",
        help="measure the CPU time of this process tree over the window",
    )
    p.add_argument("--procs", type=int, default=1, help="client processes sharing the load")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--start-at", type=float, default=0.0, help=argparse.SUPPRESS)
    p.add_argument("--raw", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    install_uvloop()
    if args.requests:
        result = asyncio.run(run_count(args))
    elif args.procs > 1:
        result = run_procs(args)
    else:
        result = asyncio.run(run_window(args, args.start_at or time.monotonic()))
    if args.raw:
        sys.stdout.write(json.dumps(result))
        return
    settings = {"url": args.url, "transport": "ws" if args.ws else "sse", "expect": args.expect}
    out = summarize(result, {**settings, "concurrency": args.concurrency})
    if args.json:
        print(json.dumps(out))
        return
    print(
        f"{out['transport']} c={args.concurrency}: {out['events_per_s']:,.0f} events/s, "
        f"{out['requests_per_s']:,.1f} req/s, TTFB p50 {out['ttfb_ms']['p50']} ms, "
        f"first text p50 {out['first_text_ms']['p50']} ms, latency p50/p99 "
        f"{out['latency_ms']['p50']}/{out['latency_ms']['p99']} ms, failures {out['failures']} "
        f"{out['failure_kinds'] or ''}, namespace {out['namespace']} {out['namespace_bad'] or ''}"
    )


if __name__ == "__main__":
    main()
