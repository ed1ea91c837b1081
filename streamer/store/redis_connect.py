"""Which Redis a store URL names, and redis-py's own client for it: one server, a Cluster
or a master found through Sentinel.

    redis://[user:password@]host:port/db       one server (also unix:///path?db=N)
    rediss://…                                 the same over TLS
    redis+cluster://[user:password@]host:port[,host:port…]     a Redis Cluster (its seed
    rediss+cluster://…                         nodes; redis-py's RedisCluster finds the rest)
    redis+sentinel://[user:password@]host:port[,host:port…]/service[/db]   the master of
    rediss+sentinel://…                        `service`, asked of those Sentinels

redis-py has URLs for one server only; the `+cluster` and `+sentinel` schemes are the
gateway's (the form other Redis clients use), read here into redis-py's `RedisCluster` and
`Sentinel`. The user and password are the data nodes'; Sentinels are asked without them.
A TLS scheme takes `TLS` (CA file, client certificate and key: the `--store-tls-*`
settings) for every connection, the Sentinels' included.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.sentinel import Sentinel

SCHEMES = ("redis://", "rediss://", "unix://")
CLUSTER_SCHEMES = ("redis+cluster://", "rediss+cluster://")
SENTINEL_SCHEMES = ("redis+sentinel://", "rediss+sentinel://")
ALL_SCHEMES = SCHEMES + CLUSTER_SCHEMES + SENTINEL_SCHEMES
FORMS = (
    "redis://host:port/db, rediss://…, redis+cluster://host:port[,host:port…], "
    "redis+sentinel://host:port[,host:port…]/service[/db]"
)


@dataclass(frozen=True, slots=True)
class TLS:
    """`--store-tls-ca-file`, `--store-tls-cert-file`, `--store-tls-key-file`."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None

    def given(self) -> bool:
        return bool(self.ca_file or self.cert_file or self.key_file)

    def options(self) -> dict[str, Any]:
        """redis-py's keywords for a TLS connection (the system's CAs without a CA file)."""
        options: dict[str, Any] = {"ssl": True}
        if self.ca_file:
            options["ssl_ca_certs"] = self.ca_file
        if self.cert_file:
            options["ssl_certfile"] = self.cert_file
        if self.key_file:
            options["ssl_keyfile"] = self.key_file
        return options


@dataclass(frozen=True, slots=True)
class Target:
    """A parsed store URL: the kind of Redis, where it is, how to log in."""

    kind: str  # "server", "cluster", "sentinel"
    url: str = field(repr=False)  # as given (a "server" is opened by redis-py from it)
    nodes: tuple[tuple[str, int], ...] = ()
    service: str = ""
    db: int = 0
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    tls: bool = False

    @property
    def shown(self) -> str:
        """The URL without its password, for logs and errors."""
        where = ",".join(f"{host}:{port}" for host, port in self.nodes)
        if self.kind == "server":
            parts = urlsplit(self.url)
            return self.url.replace(parts.password or "\0", "***") if parts.password else self.url
        return f"{self.kind} {where}" + (f" service {self.service}" if self.service else "")


def parse(url: str) -> Target:
    """The target of a store URL; a ValueError that says what is wrong with it."""
    if url.startswith(SCHEMES):
        return Target("server", url, tls=url.startswith("rediss://"))
    if not url.startswith(CLUSTER_SCHEMES + SENTINEL_SCHEMES):
        raise ValueError(f"not a Redis URL: use {FORMS}")
    scheme, _, rest = url.partition("://")
    login, _, rest = rest.rpartition("@")
    where, _, path = rest.partition("/")
    path = path.partition("?")[0]
    default_port = 26379 if scheme.endswith("+sentinel") else 6379
    nodes = tuple(_node(part, default_port) for part in where.split(",") if part)
    if not nodes:
        raise ValueError(f"{scheme}:// names no host: use {FORMS}")
    username, _, password = login.partition(":") if login else ("", "", "")
    common = {
        "url": url,
        "nodes": nodes,
        "username": unquote(username) or None,
        "password": unquote(password) or None,
        "tls": scheme.startswith("rediss"),
    }
    if scheme.endswith("+cluster"):
        if path.strip("/") not in ("", "0"):
            raise ValueError("a Redis Cluster has only database 0: drop the /db of the URL")
        return Target("cluster", **common)  # type: ignore[arg-type]
    service, _, db = path.strip("/").partition("/")
    if not service:
        raise ValueError(f"{scheme}:// needs the master's service name: {SENTINEL_SCHEMES[0]}"
                         "host:port/service[/db]")  # fmt: skip
    return Target("sentinel", service=unquote(service), db=_db(db), **common)  # type: ignore[arg-type]


def _node(text: str, default_port: int) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = text, str(default_port)
    host = host.strip("[]")
    if not host or not port.isdigit():
        raise ValueError(f"{text!r} is not host:port")
    return host, int(port)


def _db(text: str) -> int:
    if not text:
        return 0
    if not text.isdigit():
        raise ValueError(f"{text!r} is not a database number")
    return int(text)


def connect(target: Target, tls: TLS, **options: Any) -> Any:
    """redis-py's client for `target` (`options`: timeouts, retry): a `Redis`, a
    `RedisCluster`, or the `Redis` of Sentinel's current master (it follows failovers)."""
    if tls.given() and not target.tls:
        raise ValueError("the --store-tls-* settings need a TLS URL (rediss://…)")
    secure = tls.options() if target.tls else {}
    login: dict[str, Any] = {"username": target.username, "password": target.password}
    if target.kind == "server":  # the URL's scheme says TLS itself
        secure.pop("ssl", None)
        return aioredis.Redis.from_url(target.url, **{**options, **secure})
    if target.kind == "cluster":
        nodes = [ClusterNode(host, port) for host, port in target.nodes]
        return RedisCluster(startup_nodes=nodes, **login, **secure, **options)
    asking = {k: v for k, v in options.items() if k in _SENTINEL_OPTIONS}
    sentinel = Sentinel(list(target.nodes), sentinel_kwargs={**asking, **secure})
    return sentinel.master_for(target.service, db=target.db, **login, **secure, **options)


_SENTINEL_OPTIONS = ("socket_timeout", "socket_connect_timeout", "retry")
