"""The SSE head leaves with the first events, in one write (`SSEReply`).

`SSEReply` relies on aiohttp's private `_send_headers_immediately`; this fails when an
aiohttp release stops honouring it (then drop the flag, or find the new way).
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from streamer.frontends.http import SSE_HEADERS, SSEReply

EVENT = b'event: response.created\ndata: {"type":"response.created"}\n\n'


async def serve_once(cls: type[web.StreamResponse]) -> tuple[list[int], bytes]:
    """Serve one SSE reply of `cls`; the transport writes counted after `prepare`, after
    the first events and after the end, and the bytes the client got."""
    counts: list[int] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        transport: Any = request.transport
        writes = [0]
        write, writelines = transport.write, transport.writelines

        def counted_write(data: bytes) -> None:
            writes[0] += 1
            write(data)

        def counted_writelines(data: list[bytes]) -> None:
            writes[0] += 1
            writelines(data)

        transport.write, transport.writelines = counted_write, counted_writelines
        reply = cls(headers=SSE_HEADERS)
        await reply.prepare(request)
        counts.append(writes[0])
        await reply.write(EVENT)
        counts.append(writes[0])
        await reply.write_eof(EVENT)
        counts.append(writes[0])
        return reply

    app = web.Application()
    app.router.add_get("/", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = runner.addresses[0][1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        received = await reader.read()
        writer.close()
    finally:
        await runner.cleanup()
    return counts, received


async def test_the_head_leaves_with_the_first_events() -> None:
    counts, received = await serve_once(SSEReply)
    assert counts[0] == 0  # prepare wrote nothing: the head waits for the events
    assert counts[1] == 1  # head and first events: one write
    assert received.startswith(b"HTTP/1.1 200 OK\r\n")
    assert received.count(b"response.created") == 4  # two events, type and data each


async def test_a_plain_stream_response_sends_its_head_alone() -> None:
    # the difference SSEReply makes (if this fails, aiohttp buffers heads by itself now)
    counts, _ = await serve_once(web.StreamResponse)
    assert counts[0] == 1
