"""Which MCP servers the gateway may reach (`--mcp-allow`): the rule, pure.

With no pattern, any host whose every address is public (no private, loopback, link-local,
shared, reserved or multicast address); with patterns, only the hosts they match, whatever
their addresses (the operator vouched for them). A pattern is a host name
(`mcp.example.com`), its subdomains (`*.example.com`), an IP address, a CIDR (`10.0.0.0/8`:
a host all of whose addresses are in it), `public` (the default rule) or `*` (any host at
all). Where it is checked, on every connection after DNS: streamer/mcp/guard.py.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class Blocked(OSError):
    """A connection the rule does not allow (the server's host or its addresses)."""


def public_address(ip: Address) -> bool:
    """An address on the public internet: not private, loopback, link-local, shared
    (100.64/10), reserved, multicast or unspecified (an IPv4-mapped one as its IPv4)."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


@dataclass(frozen=True, slots=True)
class HostRule:
    """`--mcp-allow`'s patterns, parsed once (a ValueError for one that is none)."""

    names: frozenset[str] = frozenset()
    suffixes: tuple[str, ...] = ()
    networks: tuple[Network, ...] = ()
    public: bool = True
    anything: bool = False

    @classmethod
    def parse(cls, patterns: Sequence[str]) -> HostRule:
        if not patterns:
            return cls()
        names: set[str] = set()
        suffixes: list[str] = []
        networks: list[Network] = []
        public = anything = False
        for raw in patterns:
            pattern = raw.strip().lower().rstrip(".")
            if pattern == "public":
                public = True
            elif pattern == "*":
                anything = True
            elif pattern.startswith("*."):
                suffixes.append(pattern[1:])
            elif (network := network_of(pattern)) is not None:
                networks.append(network)
            elif pattern and all(c.isalnum() or c in "-._[]:" for c in pattern):
                names.add(pattern.strip("[]"))
            else:
                raise ValueError(f"--mcp-allow: not a host pattern: {raw!r}")
        return cls(frozenset(names), tuple(suffixes), tuple(networks), public, anything)

    def check(self, host: str, addresses: Iterable[Address]) -> None:
        """Raise `Blocked` unless `host`, resolved to `addresses`, may be reached."""
        host = host.lower().rstrip(".").strip("[]")
        found = list(addresses)
        if not found:
            raise Blocked(f"{host} has no address")
        if self.anything or host in self.names or host.endswith(self.suffixes):
            return
        if self.networks and all(any(ip in n for n in self.networks) for ip in found):
            return
        if self.public and all(public_address(ip) for ip in found):
            return
        if self.public and not (self.names or self.suffixes or self.networks):
            raise Blocked(
                f"{host} resolves to a private, loopback or link-local address; "
                "the gateway reaches such a server only when --mcp-allow lists it"
            )
        raise Blocked(f"{host} is not a host --mcp-allow lists")


def network_of(pattern: str) -> Network | None:
    try:
        return ipaddress.ip_network(pattern.strip("[]"), strict=False)
    except ValueError:
        return None
