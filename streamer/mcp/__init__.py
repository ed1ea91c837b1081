"""Remote MCP servers run by the gateway: the I/O shell of `{"type": "mcp"}` tools.

`client.McpClients` lists and calls tools on the official `mcp` SDK (streamable HTTP, and
HTTP+SSE for a server URL ending in `/sse`), every connection checked by `guard` (the
`--mcp-allow` rule); `steps` runs a turn's MCP steps between its backend answers. What the
loop decides is pure: streamer/core/mcp_loop.py, mcp_items.py, mcp_history.py, mcp_servers.py.
"""
