"""Forward proxies for backend connections, as curl and requests choose them.

Sans I/O but for `open_tunnel`:

- `select_proxy(backend_url, setting, env)`: the `Proxy` for a backend, or None. `setting`
  is `--upstream-proxy`: unset, from `http_proxy`/`https_proxy`/`all_proxy` (lower case
  first, then upper case); `none`, never; a URL, that proxy for every backend. `no_proxy`
  / `NO_PROXY` applies either way (`no_proxy_matches`).
- http:// backends are reached through the proxy with absolute-form request targets and a
  `Proxy-Authorization` header; https:// backends through `CONNECT host:port`, then TLS to
  the backend inside the tunnel (`connect_request`, `ConnectReply`).
- Only http:// proxy URLs: an https:// (TLS to the proxy) or socks proxy is refused when
  the gateway starts (`ProxyConfigError`), never silently bypassed.

The proxy's credentials live only in `Proxy.authorization`; `Proxy.where` (host:port) is
what messages show, and a refused CONNECT is reported by its status alone.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import TypeVar
from urllib.parse import unquote, urlsplit

from streamer.upstream.http1.wire import (
    MAX_HEAD,
    ConnectError,
    ProtocolError,
    ServerDisconnected,
    parse_head,
)

DISABLED = "none"
_P = TypeVar("_P", bound=asyncio.BaseProtocol)


class ProxyConfigError(ValueError):
    """A proxy setting the gateway will not use (raised at startup)."""


@dataclass(frozen=True, slots=True)
class Proxy:
    """An http:// forward proxy; `authorization` (secret) is the `Proxy-Authorization` value."""

    host: str
    port: int
    authorization: str | None = field(default=None, repr=False)
    secrets: tuple[str, ...] = field(default=(), repr=False)  # to scrub: password, token

    @property
    def where(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


class ProxyRefused(ConnectError):
    """The proxy answered CONNECT with a non-2xx status."""

    def __init__(self, proxy: Proxy, status: int) -> None:
        phrase = _phrase(status)
        super().__init__(f"the proxy at {proxy.where} answered CONNECT with {status}{phrase}")
        self.status = status


def _phrase(status: int) -> str:
    # the standard phrase, not the proxy's own reason text: that may echo anything
    try:
        return " " + HTTPStatus(status).phrase
    except ValueError:
        return ""


def parse_proxy_url(url: str, *, origin: str = "--upstream-proxy") -> Proxy:
    """An http:// proxy URL (`host:port` alone means http://) -> `Proxy`; else raises."""
    text = url.strip()
    if "://" not in text:
        text = "http://" + text
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError:
        raise ProxyConfigError(f"{origin}: not a proxy URL") from None
    scheme = parts.scheme.lower()
    if scheme == "https":
        raise ProxyConfigError(
            f"{origin}: https:// proxies (TLS to the proxy) are not supported; use an "
            f"http:// proxy URL (https backends are still reached through CONNECT), or "
            f"--upstream-proxy none"
        )
    if scheme != "http" or not parts.hostname:
        raise ProxyConfigError(f"{origin}: only http:// proxy URLs are supported, not {scheme!r}")
    auth: str | None = None
    secrets: tuple[str, ...] = ()
    if parts.username is not None:
        user, password = unquote(parts.username), unquote(parts.password or "")
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        auth = "Basic " + token
        secrets = tuple(s for s in (password, token) if s)
    return Proxy(parts.hostname, port or 80, auth, secrets)


def _env(env: Mapping[str, str], name: str) -> str | None:
    """`name` in lower case, else upper case (curl and requests read both, lower first)."""
    value = env.get(name)
    if value is None:
        value = env.get(name.upper())
    return value.strip() if value and value.strip() else None


def select_proxy(backend_url: str, setting: str | None, env: Mapping[str, str]) -> Proxy | None:
    """The proxy to reach `backend_url` through, or None for a direct connection."""
    parts = urlsplit(backend_url)
    scheme = parts.scheme.lower()
    host = parts.hostname or ""
    port = parts.port or (443 if scheme == "https" else 80)
    if setting is not None and setting.strip().lower() == DISABLED:
        return None
    url: str | None
    if setting:
        url, origin = setting, "--upstream-proxy"
    else:
        name = f"{scheme}_proxy"
        url = _env(env, name) or _env(env, "all_proxy")
        origin = name if _env(env, name) else "all_proxy"
        if url is None:
            return None
    proxy = parse_proxy_url(url, origin=origin)  # refused loudly even if not used below
    no_proxy = _env(env, "no_proxy")
    if no_proxy and no_proxy_matches(host, port, no_proxy):
        return None
    return proxy


def no_proxy_matches(host: str, port: int, no_proxy: str) -> bool:
    """`host:port` is excluded by a `no_proxy` list (comma or space separated).

    `*` matches every host; `example.com`, `.example.com` and `*.example.com` match the
    domain and its subdomains (not `badexample.com`); IP addresses match exactly and
    CIDR blocks by range; `host:port` (`[v6]:port`) only that port. Case-insensitive.
    """
    host = host.lower().rstrip(".").strip("[]")
    address = _address(host)
    for raw in no_proxy.replace(",", " ").split():
        entry = raw.lower()
        if entry == "*":
            return True
        entry, entry_port = _split_port(entry)
        if entry_port is not None and entry_port != port:
            continue
        if address is not None:
            if _address_matches(address, entry):
                return True
            continue
        entry = entry.lstrip("*").lstrip(".").rstrip(".")
        if entry and (host == entry or host.endswith("." + entry)):
            return True
    return False


def _split_port(entry: str) -> tuple[str, int | None]:
    if entry.startswith("["):  # [v6] or [v6]:port
        end = entry.find("]")
        rest = entry[end + 1 :]
        port = int(rest[1:]) if rest.startswith(":") and rest[1:].isdigit() else None
        return entry[1:end], port
    if entry.count(":") == 1:  # host:port (a bare v6 address has more colons)
        name, _, digits = entry.partition(":")
        return name, int(digits) if digits.isdigit() else None
    return entry, None


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _address_matches(address: ipaddress.IPv4Address | ipaddress.IPv6Address, entry: str) -> bool:
    try:
        return address in ipaddress.ip_network(entry, strict=False)
    except ValueError:  # a host name: it does not match an address
        return False


def connect_request(host: str, port: int, proxy: Proxy) -> bytes:
    """The CONNECT request that opens a tunnel to `host:port`."""
    target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    lines = [f"CONNECT {target} HTTP/1.1", f"Host: {target}"]
    if proxy.authorization:
        lines.append(f"Proxy-Authorization: {proxy.authorization}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


class ConnectReply:
    """The proxy's answer to CONNECT, fed as it arrives: `feed` is True once the head is in.

    Then `status` is set; a 2xx has opened the tunnel. Bytes after the head (the backend
    cannot have spoken before our TLS hello) or a head past `MAX_HEAD` raise `ProtocolError`.
    """

    __slots__ = ("_buf", "status")

    def __init__(self) -> None:
        self._buf = bytearray()
        self.status = 0

    def feed(self, data: bytes) -> bool:
        buf = self._buf
        start = max(0, len(buf) - 3)  # a blank line split across reads
        buf += data
        while (end := buf.find(b"\r\n\r\n", start)) >= 0:
            status, _, _, _ = parse_head(bytes(buf[:end]))
            if not 100 <= status < 200:
                if 200 <= status < 300 and len(buf) > end + 4:
                    raise ProtocolError("the proxy sent bytes before the tunnel's TLS began")
                self.status = status
                return True
            del buf[: end + 4]  # informational: the real answer follows
            start = 0
        if len(buf) > MAX_HEAD:
            raise ProtocolError("the proxy's answer to CONNECT is too large")
        return False


class _Handshake(asyncio.Protocol):
    """Reads the answer to CONNECT on the proxy connection, before TLS takes it over."""

    def __init__(self, proxy: Proxy) -> None:
        self.proxy = proxy
        self.reply = ConnectReply()
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def data_received(self, data: bytes) -> None:
        if self.done.done():
            return
        try:
            if self.reply.feed(data):
                status = self.reply.status
                if 200 <= status < 300:
                    self.done.set_result(None)
                else:
                    self.done.set_exception(ProxyRefused(self.proxy, status))
        except ProtocolError as exc:
            self.done.set_exception(ConnectError(f"the proxy at {self.proxy.where}: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            where = self.proxy.where
            self.done.set_exception(ServerDisconnected(f"the proxy at {where} closed the tunnel"))


async def connect_to_proxy(proxy: Proxy, factory: Callable[[], _P]) -> tuple[asyncio.Transport, _P]:
    """A TCP connection to the proxy; failing, a `ConnectError` that names the proxy."""
    loop = asyncio.get_running_loop()
    try:
        return await loop.create_connection(factory, proxy.host, proxy.port)
    except OSError as exc:
        reason = "connection refused" if isinstance(exc, ConnectionRefusedError) else None
        reason = reason or exc.strerror or str(exc) or type(exc).__name__
        raise ConnectError(f"the proxy at {proxy.where}: {reason}") from None


async def open_tunnel(
    proxy: Proxy,
    host: str,
    port: int,
    protocol: asyncio.BaseProtocol,
    ssl_context: ssl.SSLContext,
) -> None:
    """CONNECT through `proxy` to `host:port`, then TLS inside; `protocol` gets the transport.

    The caller bounds the time (its connect timeout covers proxy, CONNECT and TLS).
    """
    loop = asyncio.get_running_loop()
    transport, handshake = await connect_to_proxy(proxy, lambda: _Handshake(proxy))
    try:
        transport.write(connect_request(host, port, proxy))
        await handshake.done
        tls = await loop.start_tls(transport, protocol, ssl_context, server_hostname=host)
    except BaseException:
        transport.abort()
        raise
    if tls is None:  # the loop closed it under us
        raise ServerDisconnected(f"the proxy at {proxy.where} closed the tunnel")
    protocol.connection_made(tls)  # start_tls does not call it
