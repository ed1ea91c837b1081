"""Proxy selection from the environment and the CONNECT handshake, as plain values."""

from __future__ import annotations

import base64

import pytest

from streamer.upstream.http1.proxy import (
    ConnectReply,
    Proxy,
    ProxyConfigError,
    ProxyRefused,
    connect_request,
    no_proxy_matches,
    parse_proxy_url,
    select_proxy,
)
from streamer.upstream.http1.wire import ProtocolError


@pytest.mark.parametrize(
    ("host", "port", "no_proxy", "matches"),
    [
        ("example.com", 80, "example.com", True),
        ("api.example.com", 80, "example.com", True),  # a suffix on a dot boundary
        ("api.example.com", 80, ".example.com", True),
        ("example.com", 80, ".example.com", True),  # a leading dot: the domain too
        ("api.example.com", 80, "*.example.com", True),
        ("badexample.com", 80, "example.com", False),
        ("example.com.evil", 80, "example.com", False),
        ("API.Example.COM", 80, "example.com", True),
        ("example.com.", 80, "EXAMPLE.com", True),
        ("anything.at.all", 1, "*", True),
        ("other.org", 80, "example.com, localhost other.org", True),  # commas or spaces
        ("other.org", 80, " , ,", False),
        ("127.0.0.1", 8000, "127.0.0.1", True),
        ("127.0.0.2", 8000, "127.0.0.1", False),
        ("127.0.0.1", 8000, "127.0.0.1:8000", True),  # a port: only that one
        ("127.0.0.1", 8001, "127.0.0.1:8000", False),
        ("10.1.2.3", 80, "10.0.0.0/8", True),  # CIDR
        ("11.1.2.3", 80, "10.0.0.0/8", False),
        ("::1", 80, "::1", True),
        ("::1", 80, "[::1]", True),
        ("::1", 8000, "[::1]:8000", True),
        ("::1", 8001, "[::1]:8000", False),
        ("fd00::5", 80, "fd00::/8", True),
        ("10.0.0.1", 80, "example.com", False),  # an address never matches a name
        ("api.internal", 8080, "internal:8080", True),
        ("api.internal", 80, "internal:8080", False),
    ],
)
def test_no_proxy_matching(host: str, port: int, no_proxy: str, matches: bool) -> None:
    assert no_proxy_matches(host, port, no_proxy) is matches


def test_proxy_url_credentials_become_proxy_authorization_and_stay_out_of_repr() -> None:
    proxy = parse_proxy_url("http://us%40er:p%3Ass@proxy.internal:3128")
    token = base64.b64encode(b"us@er:p:ss").decode()
    assert (proxy.host, proxy.port, proxy.authorization) == (
        "proxy.internal",
        3128,
        f"Basic {token}",
    )
    assert proxy.where == "proxy.internal:3128"
    assert "p:ss" in proxy.secrets and token in proxy.secrets
    assert "p:ss" not in repr(proxy) and token not in repr(proxy)


def test_a_bare_host_and_port_is_an_http_proxy_on_port_80_by_default() -> None:
    assert parse_proxy_url("proxy.internal:8080") == Proxy("proxy.internal", 8080)
    assert parse_proxy_url("http://proxy.internal") == Proxy("proxy.internal", 80)


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("https://proxy.internal:3128", "https:// proxies"),
        ("socks5://proxy.internal:1080", "only http://"),
        ("http://:3128", "only http://"),
        ("http://proxy.internal:99999", "not a proxy URL"),
    ],
)
def test_unsupported_proxy_urls_are_refused(url: str, says: str) -> None:
    with pytest.raises(ProxyConfigError, match=says):
        parse_proxy_url(url)


def test_selection_reads_the_backends_scheme_lower_case_first_then_all_proxy() -> None:
    env = {"http_proxy": "http://lower:1", "HTTP_PROXY": "http://upper:2"}
    assert select_proxy("http://backend/v1", None, env) == Proxy("lower", 1)
    assert select_proxy("http://backend/v1", None, {"HTTP_PROXY": "upper:2"}) == Proxy("upper", 2)
    assert select_proxy("https://backend/v1", None, env) is None  # https_proxy is not set
    env = {"HTTPS_PROXY": "http://tls:3", "ALL_PROXY": "http://all:4"}
    assert select_proxy("https://backend/v1", None, env) == Proxy("tls", 3)
    assert select_proxy("http://backend/v1", None, env) == Proxy("all", 4)
    assert select_proxy("http://backend/v1", None, {"http_proxy": "  "}) is None


def test_the_setting_overrides_the_environment_and_no_proxy_still_applies() -> None:
    env = {"http_proxy": "http://from-env:1", "no_proxy": "direct.internal"}
    assert select_proxy("http://backend/v1", "none", env) is None
    assert select_proxy("http://backend/v1", "NONE", env) is None
    assert select_proxy("https://backend/v1", "http://set:9", env) == Proxy("set", 9)
    assert select_proxy("http://direct.internal:8000/v1", "http://set:9", env) is None
    assert select_proxy("http://direct.internal:8000/v1", None, env) is None


def test_a_refused_proxy_url_is_refused_even_for_a_no_proxy_backend() -> None:
    env = {"https_proxy": "https://tls-proxy:3128", "no_proxy": "*"}
    with pytest.raises(ProxyConfigError, match="https_proxy: https:// proxies"):
        select_proxy("https://backend/v1", None, env)


def test_connect_request() -> None:
    proxy = Proxy("p", 1, "Basic abc")
    assert connect_request("backend", 443, proxy) == (
        b"CONNECT backend:443 HTTP/1.1\r\nHost: backend:443\r\n"
        b"Proxy-Authorization: Basic abc\r\n\r\n"
    )
    assert connect_request("::1", 8443, Proxy("p", 1)).startswith(
        b"CONNECT [::1]:8443 HTTP/1.1\r\n"
    )


def test_connect_reply_fed_in_pieces_after_an_informational_answer() -> None:
    reply = ConnectReply()
    raw = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 Connection established\r\nVia: p\r\n\r\n"
    done = [reply.feed(raw[i : i + 1]) for i in range(len(raw))]
    assert done == [False] * (len(raw) - 1) + [True]
    assert reply.status == 200
    whole = ConnectReply()
    assert whole.feed(raw) and whole.status == 200


def test_connect_reply_refusals_and_violations() -> None:
    reply = ConnectReply()
    assert reply.feed(
        b"HTTP/1.1 407 Proxy Authentication Required\r\nContent-Length: 9\r\n\r\nrefused!!"
    )
    assert reply.status == 407  # a refusal's body is not read: the connection is dropped
    with pytest.raises(ProtocolError, match="before the tunnel"):
        ConnectReply().feed(b"HTTP/1.1 200 OK\r\n\r\n\x16\x03\x01")
    with pytest.raises(ProtocolError, match="too large"):
        ConnectReply().feed(b"HTTP/1.1 200 OK\r\nX: " + b"a" * (70 << 10))
    with pytest.raises(ProtocolError, match="bad status line"):
        ConnectReply().feed(b"SSH-2.0-OpenSSH\r\n\r\n")


def test_a_refused_connect_names_the_status_with_its_standard_phrase_only() -> None:
    proxy = Proxy("proxy.internal", 3128, "Basic c2VjcmV0", ("secret", "c2VjcmV0"))
    assert str(ProxyRefused(proxy, 407)) == (
        "the proxy at proxy.internal:3128 answered CONNECT with 407 Proxy Authentication Required"
    )
    assert str(ProxyRefused(proxy, 599)).endswith("answered CONNECT with 599")
    assert str(ProxyRefused(Proxy("::1", 3128), 403)).startswith("the proxy at [::1]:3128 ")
