"""The Redis store on every kind of Redis redis-py serves: store URLs, TLS (`rediss://` and
the `--store-tls-*` files) on a real TLS redis-server, a Sentinel failover, and a Cluster
node named with `redis://` (refused with the URL to use). The shared contract runs on each
kind in tests/test_store.py; whole gateways on them in tests/test_store_topologies.py."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from redis_server import RedisServer, free_port, requires_redis
from redis_topologies import RedisCluster3, SentinelSet, client, requires_cluster_tools
from redis_topologies import redis_cluster as redis_cluster  # the module-scoped fixtures
from redis_topologies import redis_sentinel as redis_sentinel

from streamer.store import StoredResponse, StoreUnavailable, check_spec, open_store
from streamer.store.redis_connect import TLS, Target, parse


def record(response_id: str) -> StoredResponse:
    body = {"id": response_id, "object": "response", "status": "completed", "output": []}
    return StoredResponse(body, [{"type": "message", "role": "user", "content": "x"}])


def new_id() -> str:
    return f"resp_{uuid.uuid4().hex}"


# -- URLs ------------------------------------------------------------------------------------


def test_store_urls_name_each_kind_of_redis() -> None:
    assert parse("redis://h:1/2") == Target("server", "redis://h:1/2")
    assert parse("rediss://h:1/2").tls
    cluster = parse("redis+cluster://u:p%40ss@a:7000,b,[::1]:7002")
    assert (cluster.kind, cluster.nodes) == ("cluster", (("a", 7000), ("b", 6379), ("::1", 7002)))
    assert (cluster.username, cluster.password, cluster.tls) == ("u", "p@ss", False)
    sentinel = parse("rediss+sentinel://:secret@s1:26380,s2/mymaster/3")
    assert (sentinel.kind, sentinel.service, sentinel.db, sentinel.tls) == (
        "sentinel", "mymaster", 3, True,
    )  # fmt: skip
    assert sentinel.nodes == (("s1", 26380), ("s2", 26379))
    assert "secret" not in repr(sentinel) and "secret" not in sentinel.shown
    assert "***" in parse("redis://:hunter2@h:1/0").shown


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("redis+sentinel://h:26379", "service name"),
        ("redis+sentinel://h:26379/", "service name"),
        ("redis+sentinel://h/s/x", "not a database number"),
        ("redis+cluster://h:1/3", "only database 0"),
        ("redis+cluster://", "names no host"),
        ("redis+cluster://h:port", "not host:port"),
        ("mongodb://h", "unknown store"),
    ],
)
def test_a_store_url_that_cannot_work_is_refused_before_serving(url: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        check_spec(url)


def test_a_key_prefix_with_a_hash_tag_is_refused() -> None:
    with pytest.raises(ValueError, match="may not hold"):
        check_spec("redis://h:1/0", "a{b}:")
    with pytest.raises(ValueError, match="may not hold"):
        open_store("redis://h:1/0", key_prefix="{x}")


def test_tls_files_need_a_tls_url() -> None:
    with pytest.raises(ValueError, match="need a TLS URL"):
        open_store("redis://h:1/0", tls=TLS(ca_file="/x"))


# -- TLS -------------------------------------------------------------------------------------


def _certificates(folder: Path) -> tuple[Path, Path, Path]:
    """A CA, and a certificate it signed for 127.0.0.1: (ca, cert, key) PEM files."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "streamer test CA")])
    ca = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
        .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    san = x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(ca_name)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(san, critical=False)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    paths = folder / "ca.pem", folder / "cert.pem", folder / "key.pem"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return paths


@pytest.fixture
def tls_redis(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    """A redis-server that speaks only TLS, its certificate signed by a CA of ours."""
    ca, cert, key = _certificates(tmp_path)
    port = free_port()
    args = ("--tls-port", str(port), "--tls-cert-file", str(cert), "--tls-key-file", str(key),
            "--tls-ca-cert-file", str(ca), "--tls-auth-clients", "no")  # fmt: skip
    server = RedisServer(extra_args=args)
    with server:  # its plain port answers the PING that says it is up
        yield port, ca


@requires_redis
@pytest.mark.redis
async def test_rediss_with_the_ca_file_is_served_and_without_it_refused(
    tls_redis: tuple[int, Path],
) -> None:
    port, ca = tls_redis
    url = f"rediss://127.0.0.1:{port}/0"
    store = open_store(url, tls=TLS(ca_file=str(ca)))
    stranger = open_store(url)  # the system's CAs do not know ours
    try:
        rid = new_id()
        await store.put(record(rid))
        assert (await store.get(rid)) is not None
        assert await store.ping() is True
        with pytest.raises(StoreUnavailable, match="certificate"):
            await stranger.get(rid)
    finally:
        await store.close()
        await stranger.close()


# -- Sentinel and Cluster ----------------------------------------------------------------------


@requires_redis
@pytest.mark.redis
async def test_a_sentinel_failover_moves_the_store_to_the_new_master() -> None:
    with SentinelSet() as sentinel:
        store = open_store(sentinel.url)
        try:
            before = new_id()
            await store.put(record(before))
            await asyncio.to_thread(sentinel.failover)

            async def written() -> bool:
                try:
                    await store.put(record(new_id()))
                except StoreUnavailable:
                    return False  # the old master, now a replica, refuses writes a while
                return True

            async with asyncio.timeout(30):
                while not await written():
                    await asyncio.sleep(0.1)  # polling a real condition: the switch
            assert (await store.get(before)) is not None  # replicated before the switch
            assert await store.ping() is True
        finally:
            await store.close()


@requires_redis
@pytest.mark.redis
async def test_sentinel_without_the_service_is_unavailable_not_a_crash(
    redis_sentinel: SentinelSet,
) -> None:
    store = open_store(f"redis+sentinel://127.0.0.1:{redis_sentinel.port}/nosuch")
    try:
        with pytest.raises(StoreUnavailable, match="MasterNotFoundError"):
            await store.get(new_id())
        assert await store.ping() is False
    finally:
        await store.close()


def _elsewhere(port: int, key: str) -> bool:
    """Whether the cluster node on `port` sends `key` to another node (MOVED)."""
    with client(port) as node:
        try:
            node.get(key)
        except redis.exceptions.MovedError:
            return True
    return False


@requires_cluster_tools
@pytest.mark.redis
async def test_a_cluster_node_named_as_one_server_is_not_ready_and_says_why(
    redis_cluster: RedisCluster3,
) -> None:
    port = redis_cluster.nodes[0].port
    url = f"redis://127.0.0.1:{port}/0"
    stores = [open_store(url)]
    try:
        (advice,) = await stores[0].check()
        assert "redis+cluster://" in advice
        # an instance whose readiness probe key lives on another node's slots
        while not _elsewhere(port, stores[-1]._probe):  # 2 in 3 land elsewhere
            assert len(stores) < 64
            stores.append(open_store(url))
        assert await stores[-1].ping() is False
        rid = next(
            r for r in (new_id() for _ in range(100)) if _elsewhere(port, f"streamer:rec:{{{r}}}")
        )
        with pytest.raises(StoreUnavailable, match="redis\\+cluster://"):
            await stores[0].get(rid)
    finally:
        for store in stores:
            await store.close()


@requires_cluster_tools
@pytest.mark.redis
async def test_the_config_check_reads_every_cluster_primary(redis_cluster: RedisCluster3) -> None:
    store = open_store(redis_cluster.url)
    try:
        advice = await store.check()
        # the test cluster keeps nothing on disk: said once per primary
        assert len(advice) == 3 and all("keeps nothing on disk" in a for a in advice)
    finally:
        await store.close()


pytestmark = [pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")]


def test_the_tls_settings_are_checked_before_serving(tmp_path: Path) -> None:
    from streamer.app import check_settings
    from streamer.config import Settings

    ca = tmp_path / "ca.pem"
    with pytest.raises(ValueError, match="no such file"):
        check_settings(Settings(store="rediss://h:1/0", store_tls_ca_file=str(ca)))
    ca.write_text("")
    with pytest.raises(ValueError, match="need a TLS store URL"):
        check_settings(Settings(store="redis://h:1/0", store_tls_ca_file=str(ca)))
    check_settings(Settings(store="rediss+sentinel://h/primary", store_tls_ca_file=str(ca)))
