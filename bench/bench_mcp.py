"""What the MCP loop costs the gateway: CPU per MCP call, memory per cached tool list.

    .venv/bin/python bench/bench_mcp.py [turns]

CPU: the gateway, its scripted Chat backend and the OpenAI SDK client run in this process
(the MCP server, tests/mcp_server.py, in its own). `turns` responses that each run one MCP
call (the list cached: two backend answers, one tools/call) are timed by this process's CPU
time against `turns` pairs of plain responses (the same two backend answers, no MCP): the
difference per call is the gateway's own MCP work (the items, the loop, the SDK session:
initialise, call, close), outside the MCP server and the model. Memory: tracemalloc's count
of what one more cached tool list holds (the test server's tools).
"""

from __future__ import annotations

import asyncio
import gc
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from harness import GatewayHarness
from openai import AsyncOpenAI
from scripted_backend import DONE, ScriptedBackend, finish, text_chunks, usage
from test_mcp import caller, mcp_server, mcp_tool

from streamer.core.mcp_servers import servers
from streamer.mcp.client import McpClients, McpSettings
from streamer.mcp.guard import HostRule


def plain(body: dict[str, Any]) -> list[Any]:
    return [*text_chunks(["Said: ", "x"]), finish("stop"), usage(20, 4), DONE]


async def cpu(turns: int, url: str) -> tuple[float, float]:
    async with GatewayHarness(backend=ScriptedBackend(), mcp_allow=("127.0.0.1",)) as gw:
        client = AsyncOpenAI(base_url=gw.url, api_key="k")
        tools = [mcp_tool(url)]
        gw.backend.responder = caller("lookup", {"term": "x"})
        await client.responses.create(model="m", input="warm", tools=tools)  # lists, caches
        start = time.process_time()
        for _ in range(turns):
            await client.responses.create(model="m", input="go", tools=tools)
        with_mcp = time.process_time() - start
        gw.backend.responder = plain
        start = time.process_time()
        for _ in range(turns):
            await client.responses.create(model="m", input="go")
            await client.responses.create(model="m", input="go")
        without = time.process_time() - start
    return with_mcp, without


async def cached_bytes(url: str, lists: int = 20) -> tuple[int, int, int]:
    """Tools per list, bytes held per cached list (`lists` more entries, after a first one
    warmed the SDK up), the list's JSON bytes."""
    clients = McpClients(McpSettings(HostRule.parse(["127.0.0.1"])))
    (first,) = servers([mcp_tool(url)])
    tools = await clients.list_tools(first)
    more = [servers([mcp_tool(url, headers={"X-N": str(i)})])[0] for i in range(lists)]
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for server in more:
        await clients.list_tools(server)
    gc.collect()
    held = (tracemalloc.get_traced_memory()[0] - before) // lists
    tracemalloc.stop()
    return len(tools), held, clients.cached_bytes // (lists + 1)


async def main(turns: int) -> None:
    with mcp_server() as url:
        count, held, wire = await cached_bytes(url)
        with_mcp, without = await cpu(turns, url)
    per_call = (with_mcp - without) / turns * 1000
    print(f"one cached tool list: {count} tools, {held} bytes held ({wire} bytes of JSON)")
    print(
        f"CPU per response: {with_mcp / turns * 1000:.1f} ms with one MCP call, "
        f"{without / turns * 1000:.1f} ms for two plain responses; "
        f"the MCP loop adds {per_call:.1f} ms of gateway CPU per call "
        f"(ratio {with_mcp / without:.2f})"
    )


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 30))
