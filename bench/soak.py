"""The soak: one gateway process under a long mixed load, its resident memory sampled.

Starts bench_websocket.py's backend (one cached stream of `--deltas` text deltas) and a
gateway (`--store memory`), then `-c` clients run a mix until `--requests` requests were
answered (each HTTP request and each WebSocket turn counts one):

- an SSE stream (`stream: true, store: false`);
- a stored JSON turn, then a turn continuing it (`previous_response_id`);
- a background turn, then GETs of it until it completed;
- a WebSocket opened (offering permessage-deflate with `--ws-deflate`, as the OpenAI SDK
  does), two turns on it, the second continuing the first, then closed: socket churn.

VmRSS is read every `--sample` requests, and once more after `--idle` seconds without a
request at the end (the gateway's `--trim-after` gives freed memory back). Any answer that is not a completed turn is an
error (exit 1).

    .venv/bin/python bench/soak.py --requests 50000                      # no compression
    .venv/bin/python bench/soak.py --requests 50000 --ws-deflate --gateway-arg=--ws-compression

`--churn ROUNDS` measures the sockets alone instead: ROUNDS times, `--sockets` WebSockets
opened at once, one turn each, all closed; VmRSS after each round (issue 27 row 10).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import subprocess
import sys
import time
from collections import Counter
from typing import Any

import aiohttp
import orjson
import websockets
from bench_websocket import cpu_seconds, raise_fd_limit, start_processes, status_kb

# one turn of each kind in this many: SSE, stored JSON + chain, background, WebSocket
MIX = ("sse", "sse", "sse", "sse", "chain", "chain", "background", "ws", "ws")


class Soak:
    def __init__(self, port: int, pid: int, args: argparse.Namespace) -> None:
        self.url = f"http://127.0.0.1:{port}/v1"
        self.ws_url = f"ws://127.0.0.1:{port}/v1/responses"
        self.pid = pid
        self.args = args
        self.done = 0
        self.outcomes: Counter[str] = Counter()
        self.samples: list[tuple[int, int]] = []  # (requests answered, VmRSS kB)
        self.idle_kb = 0  # VmRSS after `--idle` seconds without a request, at the end
        self.cpu = 0.0  # the gateway's CPU seconds (user + system) for the whole run
        self._next_sample = 0
        self._kinds = itertools.cycle(MIX)

    def count(self, n: int, ok: bool, kind: str) -> None:
        self.done += n
        self.outcomes["ok" if ok else f"{kind} failed"] += n
        if self.done >= self._next_sample:
            self.samples.append((self.done, status_kb(self.pid, "VmRSS:")))
            self._next_sample += self.args.sample

    async def client(self, http: aiohttp.ClientSession) -> None:
        while self.done < self.args.requests:
            kind = next(self._kinds)
            try:
                n, ok = await getattr(self, kind)(http)
            except (aiohttp.ClientError, websockets.WebSocketException, OSError) as exc:
                n, ok, kind = 1, False, f"{kind} {type(exc).__name__}"
            self.count(n, ok, kind)

    async def post(self, http: aiohttp.ClientSession, body: dict[str, Any]) -> dict[str, Any]:
        async with http.post(f"{self.url}/responses", json={"model": "m", **body}) as reply:
            return dict(await reply.json()) if reply.status == 200 else {"status": reply.status}

    async def sse(self, http: aiohttp.ClientSession) -> tuple[int, bool]:
        body = {"model": "m", "input": "hi", "stream": True, "store": False}
        async with http.post(f"{self.url}/responses", json=body) as reply:
            raw = await reply.read()
        return 1, reply.status == 200 and b'"type":"response.completed"' in raw[-4096:]

    async def chain(self, http: aiohttp.ClientSession) -> tuple[int, bool]:
        first = await self.post(http, {"input": "hi"})
        if first.get("status") != "completed":
            return 1, False
        second = await self.post(http, {"input": "more", "previous_response_id": first["id"]})
        return 2, second.get("status") == "completed"

    async def background(self, http: aiohttp.ClientSession) -> tuple[int, bool]:
        queued = await self.post(http, {"input": "hi", "background": True})
        rid, n = queued.get("id"), 1
        status = queued.get("status")
        while rid and status in ("queued", "in_progress"):
            await asyncio.sleep(0.01)
            async with http.get(f"{self.url}/responses/{rid}") as reply:
                status = (await reply.json()).get("status")
            n += 1
        return n, status == "completed"

    async def ws(self, http: aiohttp.ClientSession) -> tuple[int, bool]:
        compression = "deflate" if self.args.ws_deflate else None
        async with websockets.connect(self.ws_url, compression=compression, max_size=None) as ws:
            first = await _ws_turn(ws, {"input": "hi"})
            if first.get("status") != "completed":
                return 1, False
            second = await _ws_turn(ws, {"input": "more", "previous_response_id": first["id"]})
        return 2, second.get("status") == "completed"

    async def run(self) -> None:
        connector = aiohttp.TCPConnector(limit=self.args.c)
        async with aiohttp.ClientSession(connector=connector) as http:
            await asyncio.gather(*(self.client(http) for _ in range(self.args.c)))


async def _ws_turn(ws: Any, body: dict[str, Any]) -> dict[str, Any]:
    await ws.send(orjson.dumps({"type": "response.create", "model": "m", **body}).decode())
    while True:
        event = orjson.loads(await ws.recv())
        if event["type"] in ("response.completed", "response.failed", "error"):
            return dict(event.get("response") or {"status": "error"})


async def churn(port: int, pid: int, args: argparse.Namespace) -> list[int]:
    """`--churn` rounds of `--sockets` sockets at once, one turn each; VmRSS after each."""
    url = f"ws://127.0.0.1:{port}/v1/responses"
    compression = "deflate" if args.ws_deflate else None
    gate = asyncio.Semaphore(256)
    samples = [status_kb(pid, "VmRSS:")]

    async def one() -> bool:
        async with gate:
            ws = await websockets.connect(url, compression=compression, max_size=None,
                                          open_timeout=60)  # fmt: skip
        try:
            return (await _ws_turn(ws, {"input": "hi", "store": False})).get("status") == (
                "completed"
            )
        finally:
            await ws.close()

    for _ in range(args.churn):
        results = await asyncio.gather(*(one() for _ in range(args.sockets)))
        if not all(results):
            raise SystemExit(f"{results.count(False)} turns failed")
        samples.append(status_kb(pid, "VmRSS:"))
    return samples


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--requests", type=int, default=50_000)
    p.add_argument("-c", type=int, default=16, help="concurrent clients")
    p.add_argument("--sample", type=int, default=2_500, help="requests between RSS samples")
    p.add_argument("--deltas", type=int, default=20, help="text deltas per backend answer")
    p.add_argument("--ws-deflate", action="store_true", help="WebSockets offer permessage-deflate")
    p.add_argument("--gateway-arg", action="append", default=[], help="a `streamer serve` flag")
    p.add_argument("--idle", type=float, default=3.0,
                   help="seconds idle at the end, then a last VmRSS sample")  # fmt: skip
    p.add_argument("--churn", type=int, default=0, help="socket churn rounds instead")
    p.add_argument("--sockets", type=int, default=500, help="sockets open at once per round")
    args = p.parse_args(argv)
    with contextlib.suppress(ImportError):
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    raise_fd_limit(4 * args.sockets + 1024)
    backend, gateway, port = start_processes(args.deltas, tuple(args.gateway_arg))
    started = time.monotonic()
    try:
        if args.churn:
            samples = asyncio.run(churn(port, gateway.pid, args))
            peak = status_kb(gateway.pid, "VmHWM:")
            print(f"churn {args.churn} x {args.sockets} sockets, deflate offered: "
                  f"{args.ws_deflate}, gateway {args.gateway_arg}: VmRSS MB after each round "
                  f"{[round(kb / 1024) for kb in samples]}, peak {round(peak / 1024)}")  # fmt: skip
            return 0
        soak = Soak(port, gateway.pid, args)
        asyncio.run(soak.run())
        time.sleep(args.idle)  # the gateway's --trim-after gives freed memory back meanwhile
        soak.idle_kb = status_kb(gateway.pid, "VmRSS:")
        soak.cpu = cpu_seconds(gateway.pid)
    finally:
        for proc in (gateway, backend):
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
    report(soak, args, time.monotonic() - started)
    return 0 if set(soak.outcomes) == {"ok"} else 1


def report(soak: Soak, args: argparse.Namespace, seconds: float) -> None:
    mb = [(n, round(kb / 1024, 1)) for n, kb in soak.samples]
    after_warmup = [v for n, v in mb if n >= args.sample] or [v for _, v in mb]
    print(f"soak: {soak.done} requests in {seconds:.0f} s (gateway CPU {soak.cpu:.1f} s), "
          f"c = {args.c}, deflate offered: "
          f"{args.ws_deflate}, gateway {args.gateway_arg}: {dict(soak.outcomes)}")  # fmt: skip
    print(f"VmRSS MB by requests answered: {mb}")
    print(f"after the first {args.sample}: min {min(after_warmup)}, max {max(after_warmup)}, "
          f"last {after_warmup[-1]} MB; {args.idle:g} s idle: {round(soak.idle_kb / 1024, 1)} MB")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
