"""The physical limit: a byte-for-byte relay through the same HTTP hops as a gateway.

`POST /v1/responses` (any POST, in fact) is forwarded, body unchanged, as
`POST {upstream}/chat/completions` (or `{upstream}/responses` with `--api responses`, or
`{upstream}/messages` with `--api messages`: the same relay in front of a backend that serves
the Responses or the Anthropic Messages API) over a kept-alive connection owned by the client's
connection, and the backend's response (head and chunked body) is written back to the client
as it arrives, byte for byte, one write per read, with no parsing beyond finding where the
response ends. TCP_NODELAY on both sides; the client's send buffer filling up pauses the
reading from the backend.

    python bench/raw_relay.py --upstream http://127.0.0.1:8900/v1 --port 0  # prints "listening <port>"
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from dataclasses import dataclass
from urllib.parse import urlsplit

from httpwire import BadRequest, install_uvloop, set_nodelay, simple_response, take_request

CHUNKED_END = b"\r\n0\r\n\r\n"
ENDPOINTS = {"chat": "/chat/completions", "responses": "/responses", "messages": "/messages"}


@dataclass(frozen=True, slots=True)
class UpstreamTarget:
    host: str
    port: int
    path: bytes  # the full path of the chat completions endpoint
    host_header: bytes

    @classmethod
    def parse(cls, url: str, api: str = "chat") -> UpstreamTarget:
        parts = urlsplit(url)
        host = parts.hostname or "127.0.0.1"
        port = parts.port or 80
        path = parts.path.rstrip("/") + ENDPOINTS[api]
        return cls(host, port, path.encode(), f"{host}:{port}".encode())

    def request(self, body: bytes) -> bytes:
        return (
            b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
            b"Accept: text/event-stream\r\nContent-Length: %d\r\n\r\n%s"
            % (self.path, self.host_header, len(body), body)
        )


class UpstreamSide(asyncio.Protocol):
    """The backend connection of one client connection: relays every byte back to it."""

    def __init__(self, client: ClientSide) -> None:
        self.client = client
        self.transport: asyncio.Transport | None = None
        self.head = bytearray()  # until the response head is complete
        self.in_body = False
        self.remaining = -1  # body bytes left when the backend sent Content-Length; -1: chunked
        self.tail = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass
        set_nodelay(transport)

    def start_response(self) -> None:
        self.head.clear()
        self.in_body = False
        self.remaining = -1
        self.tail = b""

    def data_received(self, data: bytes) -> None:
        self.client.write(data)
        if not self.in_body:
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                return
            self.in_body = True
            head = bytes(self.head[:end]).lower()
            body = bytes(self.head[end + 4 :])
            self.head.clear()
            at = head.find(b"\r\ncontent-length:")
            if at >= 0 and b"chunked" not in head:
                line_end = head.find(b"\r\n", at + 2)
                length = int(head[at + 17 : line_end if line_end >= 0 else None])
                self.remaining = length - len(body)
                if self.remaining <= 0:
                    self.client.response_done()
                return
            data = b"\r\n\r\n" + body  # so that an empty chunked body is seen to end
        if self.remaining >= 0:
            self.remaining -= len(data)
            if self.remaining <= 0:
                self.client.response_done()
            return
        self.tail = (self.tail + data[-7:])[-7:]
        if self.tail == CHUNKED_END:
            self.client.response_done()

    def connection_lost(self, exc: Exception | None) -> None:
        self.client.upstream_lost(self)

    def pause_reading(self) -> None:
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None:
            self.transport.resume_reading()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class ClientSide(asyncio.Protocol):
    """One client connection; requests on it are relayed one at a time."""

    def __init__(self, target: UpstreamTarget) -> None:
        self.target = target
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.up: UpstreamSide | None = None
        self.busy = False
        self.keep_alive = True

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass
        set_nodelay(transport)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        self._next()

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def _next(self) -> None:
        while not self.busy and self.transport is not None and not self.transport.is_closing():
            try:
                req = take_request(self.buf)
            except BadRequest:
                self.transport.write(simple_response(400, b'{"error":{"message":"bad"}}'))
                self.transport.close()
                return
            if req is None:
                return
            if req.method != b"POST":
                self.transport.write(simple_response(200, b'{"ok":true}'))
                continue
            self.busy = True
            self.keep_alive = req.keep_alive
            payload = self.target.request(req.body)
            if self.up is not None and self.up.transport is not None:
                self.up.start_response()
                self.up.transport.write(payload)
            else:
                asyncio.get_running_loop().create_task(self._connect(payload))

    async def _connect(self, payload: bytes) -> None:
        loop = asyncio.get_running_loop()
        try:
            _, up = await loop.create_connection(
                lambda: UpstreamSide(self), self.target.host, self.target.port
            )
        except OSError as exc:
            self.write(simple_response(502, b'{"error":{"message":"%s"}}' % str(exc).encode()))
            self.response_done()
            return
        if self.transport is None or self.transport.is_closing():
            up.close()
            return
        self.up = up
        up.transport.write(payload)  # type: ignore[union-attr]

    def response_done(self) -> None:
        self.busy = False
        if not self.keep_alive and self.transport is not None:
            self.transport.close()
            return
        self._next()

    def upstream_lost(self, up: UpstreamSide) -> None:
        if self.up is up:
            self.up = None
        if self.busy and self.transport is not None:
            self.transport.close()  # the backend died mid-response: so does the relayed one

    def pause_writing(self) -> None:
        if self.up is not None:
            self.up.pause_reading()

    def resume_writing(self) -> None:
        if self.up is not None:
            self.up.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self.up is not None:
            self.up.close()  # cancel the backend request at once, as a gateway must
            self.up = None


async def start(
    upstream: str, host: str = "127.0.0.1", port: int = 0, api: str = "chat"
) -> asyncio.Server:
    target = UpstreamTarget.parse(upstream, api)
    loop = asyncio.get_running_loop()
    return await loop.create_server(lambda: ClientSide(target), host, port, backlog=1024)


async def _main(args: argparse.Namespace) -> None:
    server = await start(args.upstream, args.host, args.port, args.api)
    print(f"listening {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--upstream", required=True, help="the backend's base URL, e.g. http://h:p/v1")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8901)
    p.add_argument(
        "--api",
        choices=list(ENDPOINTS),
        default="chat",
        help="the backend endpoint: chat (/chat/completions), responses (/responses) or "
        "messages (/messages)",
    )
    args = p.parse_args(argv)
    install_uvloop()
    try:
        asyncio.run(_main(args))
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
