"""Where the MCP client connects, the `--mcp-allow` rule (core/mcp_hosts.py) is checked.

`GuardedBackend` is the network backend of the MCP client's connection pool: every TCP
connection, to the server itself, to where it redirects, to where an SSE endpoint points,
resolves the host first, checks its addresses, and connects to a checked address, so
the answer DNS gave the check is the one used (no rebinding between the two).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterable
from typing import Any

from httpcore2 import AsyncNetworkBackend, AsyncNetworkStream, ConnectError, ConnectTimeout
from httpcore2._backends.auto import AutoBackend

from streamer.core.mcp_hosts import Address, Blocked, HostRule, network_of, public_address

__all__ = ["Address", "Blocked", "GuardedBackend", "HostRule", "public_address", "resolve"]


async def resolve(host: str, port: int) -> list[Address]:
    """The host's addresses (an IP literal as itself), in the resolver's order."""
    literal = network_of(host)
    if literal is not None and literal.num_addresses == 1 and "/" not in host:
        return [literal.network_address]
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    out: list[Address] = []
    for *_, sockaddr in infos:
        ip = ipaddress.ip_address(sockaddr[0])
        if ip not in out:
            out.append(ip)
    return out


class GuardedBackend(AsyncNetworkBackend):
    """httpcore2's network backend, checking every connection against the rule first."""

    def __init__(self, rule: HostRule) -> None:
        self.rule = rule
        self._backend = AutoBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> AsyncNetworkStream:
        addresses = await resolve(host, port)
        self.rule.check(host, addresses)
        error: Exception | None = None
        for ip in addresses:  # the checked addresses only, in order
            try:
                return await self._backend.connect_tcp(
                    str(ip), port, timeout, local_address, socket_options
                )
            except (ConnectError, ConnectTimeout, OSError) as exc:
                error = exc
        assert error is not None
        raise error

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> AsyncNetworkStream:
        raise Blocked("MCP servers are reached over TCP only")

    async def sleep(self, seconds: float) -> None:
        await self._backend.sleep(seconds)
