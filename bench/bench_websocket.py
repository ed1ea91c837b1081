"""Many concurrent Responses WebSocket sessions against a real gateway process.

Starts a tiny Chat Completions backend (this file, `--backend`, a separate process that
answers every request with one cached stream of N text deltas) and the gateway
(`python -m streamer serve --upstream ...`), then:

1. warms the gateway up, reads its resident memory (VmRSS from /proc/<pid>/status);
2. opens `--idle` sockets that never send anything, waits, reads VmRSS again:
   (after - before) / idle is the memory one idle connection costs;
3. with the idle sockets still open, runs `--active` sockets that send `response.create`
   back to back for `--seconds`, and counts the event frames they receive.

    .venv/bin/python bench/bench_websocket.py                 # 1,000 idle, 100 active, 10 s
    .venv/bin/python bench/bench_websocket.py --deflate --json

The client only counts frames (it parses none but the terminal one), so that it costs
as little as possible of the machine it shares with the gateway.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import resource
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import orjson
import websockets

REPO = Path(__file__).resolve().parents[1]

# -- the backend ------------------------------------------------------------------------


def backend_stream(deltas: int) -> bytes:
    """One whole streamed chat completion as an HTTP/1.1 response (chunked)."""

    def chunk(choices: list[Any], **extra: Any) -> bytes:
        body = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "bench",
                "choices": choices, **extra}  # fmt: skip
        data = b"data: " + orjson.dumps(body) + b"\n\n"
        return b"%x\r\n%s\r\n" % (len(data), data)

    def delta(d: dict[str, Any], finish: str | None = None) -> bytes:
        return chunk([{"index": 0, "delta": d, "finish_reason": finish}])

    parts = [delta({"role": "assistant", "content": "tok0 "})]
    parts += [delta({"content": f"tok{i} "}) for i in range(1, deltas)]
    parts.append(delta({}, "stop"))
    usage = {"prompt_tokens": 10, "completion_tokens": deltas, "total_tokens": 10 + deltas}
    parts.append(chunk([], usage=usage))
    done = b"data: [DONE]\n\n"
    parts.append(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))
    head = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n")  # fmt: skip
    return head + b"".join(parts)


class BackendProtocol(asyncio.Protocol):
    """Answers every complete request at once: never the bottleneck."""

    def __init__(self, answer: bytes) -> None:
        self.answer = answer
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        with contextlib.suppress(OSError, AttributeError):
            transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while (end := self.buf.find(b"\r\n\r\n")) >= 0:
            head = bytes(self.buf[:end]).lower()
            length = 0
            for line in head.split(b"\r\n"):
                if line.startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            if len(self.buf) < end + 4 + length:
                return
            del self.buf[: end + 4 + length]
            if head.startswith(b"get"):
                body = b'{"object":"list","data":[{"id":"bench","object":"model"}]}'
                self.transport.write(  # type: ignore[union-attr]
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
                )
            else:
                self.transport.write(self.answer)  # type: ignore[union-attr]


async def serve_backend(deltas: int) -> None:
    loop = asyncio.get_running_loop()
    answer = backend_stream(deltas)
    server = await loop.create_server(lambda: BackendProtocol(answer), "127.0.0.1", 0, backlog=1024)
    print(f"listening {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


# -- processes ---------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def status_kb(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key):
            return int(line.split()[1])
    raise KeyError(key)


def cpu_seconds(pid: int) -> float:
    raw = Path(f"/proc/{pid}/stat").read_text()
    fields = raw[raw.rfind(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as resp:  # loopback only
        return orjson.loads(resp.read())


def start_processes(
    deltas: int, gateway_args: tuple[str, ...] = ()
) -> tuple[subprocess.Popen[bytes], subprocess.Popen[bytes], int]:
    backend = subprocess.Popen(
        [sys.executable, __file__, "--backend", "--deltas", str(deltas)], stdout=subprocess.PIPE
    )
    line = backend.stdout.readline().decode()  # type: ignore[union-attr]
    if not line.startswith("listening "):
        backend.kill()
        raise RuntimeError(f"backend did not start: {line!r}")
    upstream = f"http://127.0.0.1:{int(line.split()[1])}/v1"
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    gateway = subprocess.Popen(
        [sys.executable, "-m", "streamer", "serve", "--port", str(port), "--upstream", upstream,
         "--store", "memory", "--log-level", "error", *gateway_args],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 20
    while True:
        with contextlib.suppress(OSError):
            get_json(f"http://127.0.0.1:{port}/healthz")
            break
        if gateway.poll() is not None or time.monotonic() > deadline:
            backend.kill()
            gateway.kill()
            raise RuntimeError("gateway did not start")
        time.sleep(0.1)
    return backend, gateway, port


# -- the client ---------------------------------------------------------------------------

CREATE = orjson.dumps({"type": "response.create", "model": "bench", "input": "hi", "store": False,
                       "tools": [{"type": "namespace", "name": "mcp__docs", "description": "d",
                                  "tools": [{"type": "function", "name": "search",
                                             "parameters": {"type": "object"}}]}]})  # fmt: skip
TERMINAL = (b'"type":"response.completed"', b'"type":"response.failed"', b'"type":"error"',
            b'"type":"response.incomplete"')  # fmt: skip


async def open_idle(url: str, count: int, options: dict[str, Any]) -> list[Any]:
    gate = asyncio.Semaphore(64)

    async def one() -> Any:
        async with gate:
            return await websockets.connect(url, open_timeout=30, ping_interval=None, **options)

    return await asyncio.gather(*(one() for _ in range(count)))


async def active_socket(
    url: str, until: float, options: dict[str, Any], tally: dict[str, int]
) -> None:
    async with websockets.connect(url, open_timeout=30, ping_interval=None, **options) as ws:
        while time.monotonic() < until:
            await ws.send(CREATE.decode())
            while True:
                frame = await ws.recv(decode=False)
                tally["events"] += 1
                if frame.startswith(b'{"type":"response.') and any(
                    t in frame[:40] for t in TERMINAL
                ):
                    ok = frame.startswith(b'{"type":"response.completed"')
                    tally["turns" if ok else "failed"] += 1
                    break
                if frame.startswith(b'{"type":"error"'):
                    tally["failed"] += 1
                    break


async def run(args: argparse.Namespace, pid: int, port: int) -> dict[str, Any]:
    url = f"ws://127.0.0.1:{port}/v1/responses"
    options: dict[str, Any] = {"compression": "deflate" if args.deflate else None, "max_size": None}

    # Warm-up: every code path of a turn imported and allocated once.
    warm = {"events": 0, "turns": 0, "failed": 0}
    await asyncio.gather(*(active_socket(url, time.monotonic() + 1.0, options, warm)
                           for _ in range(8)))  # fmt: skip
    await asyncio.sleep(0.5)
    rss_before = status_kb(pid, "VmRSS:")

    started = time.monotonic()
    idle = await open_idle(url, args.idle, options)
    opened_in = time.monotonic() - started
    await asyncio.sleep(1.0)  # the last handshakes settle on the server
    rss_idle = status_kb(pid, "VmRSS:")
    stats_idle = get_json(f"http://127.0.0.1:{port}/healthz")["stats"]

    tally = {"events": 0, "turns": 0, "failed": 0}
    cpu0, t0 = cpu_seconds(pid), time.monotonic()
    until = t0 + args.seconds
    await asyncio.gather(*(active_socket(url, until, options, tally) for _ in range(args.active)))
    elapsed, cpu = time.monotonic() - t0, cpu_seconds(pid) - cpu0
    rss_active = status_kb(pid, "VmRSS:")

    alive = sum(1 for ws in idle if ws.state is websockets.protocol.State.OPEN)
    await asyncio.gather(*(ws.close() for ws in idle), return_exceptions=True)
    await asyncio.sleep(1.0)
    gc.collect()
    stats = get_json(f"http://127.0.0.1:{port}/healthz")["stats"]
    return {
        "idle_sockets": args.idle,
        "idle_still_open_after_active_phase": alive,
        "idle_open_seconds": round(opened_in, 2),
        "rss_kb_before_idle": rss_before,
        "rss_kb_with_idle": rss_idle,
        "rss_kb_per_idle_connection": round((rss_idle - rss_before) / max(args.idle, 1), 2),
        "active_sockets": args.active,
        "seconds": round(elapsed, 2),
        "turns": tally["turns"],
        "failed_turns": tally["failed"],
        "events": tally["events"],
        "events_per_second": round(tally["events"] / elapsed),
        "turns_per_second": round(tally["turns"] / elapsed, 1),
        "gateway_cpu_seconds": round(cpu, 2),
        "events_per_gateway_cpu_second": round(tally["events"] / cpu) if cpu else None,
        "rss_kb_after_active_phase": rss_active,
        "rss_kb_peak": status_kb(pid, "VmHWM:"),
        "gateway_stats_with_idle": stats_idle,
        "gateway_stats_end": stats,
        "deflate": args.deflate,
        "deltas_per_turn": args.deltas,
    }


def raise_fd_limit(needed: int) -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))  # children inherit it
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--idle", type=int, default=1000, help="sockets opened and left idle")
    p.add_argument("--active", type=int, default=100, help="sockets running turns back to back")
    p.add_argument("--seconds", type=float, default=10.0, help="length of the active phase")
    p.add_argument("--deltas", type=int, default=20, help="text deltas per backend answer")
    p.add_argument("--deflate", action="store_true",
                   help="offer permessage-deflate, as the OpenAI SDK does (and accept it: "
                        "--ws-compression)")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print the result as JSON only")
    p.add_argument("--backend", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:
        pass
    if args.backend:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve_backend(args.deltas))
        return 0

    limit = raise_fd_limit(2 * (args.idle + args.active) + 256)
    if limit < args.idle + args.active + 64:
        print(f"fd limit {limit} is too low for {args.idle + args.active} sockets", file=sys.stderr)
        return 2
    backend, gateway, port = start_processes(
        args.deltas, ("--ws-compression",) if args.deflate else ()
    )
    try:
        result = asyncio.run(run(args, gateway.pid, port))
    finally:
        for proc in (gateway, backend):
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
    if args.json:
        print(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode())
    else:
        r = result
        print(f"idle: {r['idle_sockets']} sockets opened in {r['idle_open_seconds']} s; gateway RSS "
              f"{r['rss_kb_before_idle']} -> {r['rss_kb_with_idle']} kB = "
              f"{r['rss_kb_per_idle_connection']} kB per idle connection")  # fmt: skip
        print(f"active: {r['active_sockets']} sockets x {r['seconds']} s: {r['turns']} turns "
              f"({r['failed_turns']} failed), {r['events']} events = {r['events_per_second']} "
              f"events/s, {r['turns_per_second']} turns/s; gateway CPU {r['gateway_cpu_seconds']} s "
              f"({r['events_per_gateway_cpu_second']} events per CPU-second)")  # fmt: skip
        print(f"idle sockets still open after the active phase: "
              f"{r['idle_still_open_after_active_phase']}/{r['idle_sockets']}; "
              f"gateway stats: {r['gateway_stats_end']}")  # fmt: skip
    return 0 if result["failed_turns"] == 0 and result["turns"] > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
