"""A real Redis Cluster (three masters) and a real Sentinel-managed master, started from
Debian's binaries for the tests (redis-server, its `--sentinel` mode, and `redis-cli
--cluster create` from redis-tools, which redis-server depends on).

    with RedisCluster3() as cluster:   store URL: cluster.url (redis+cluster://…)
    with SentinelSet() as sentinel:    store URL: sentinel.url (redis+sentinel://…/primary)

`redis_cluster` and `redis_sentinel` are module-scoped fixtures on them.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType

import pytest
import redis
from redis_server import REDIS_SERVER, RedisServer, free_port, redis_answers

REDIS_CLI = shutil.which("redis-cli")
requires_cluster_tools = pytest.mark.skipif(
    REDIS_SERVER is None or REDIS_CLI is None, reason="redis-server or redis-cli is not installed"
)
SERVICE = "primary"


def client(port: int) -> redis.Redis:
    """A plain synchronous client of one node (or of the Sentinel)."""
    return redis.Redis(port=port, socket_timeout=2.0, decode_responses=True)


def cluster_ok(port: int) -> bool:
    with client(port) as node:
        return bool(node.execute_command("CLUSTER INFO").get("cluster_state") == "ok")


def role(port: int) -> str:
    with client(port) as node:
        return str(node.info("replication").get("role"))


def wait_until(check: object, what: str, timeout: float = 30.0) -> None:
    """Poll `check()` (a real condition of the servers) until true, or fail saying `what`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():  # type: ignore[operator]
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"timed out waiting for {what}")


class RedisCluster3:
    """Three master nodes on loopback, every slot assigned, no replicas."""

    def __init__(self) -> None:
        self.nodes: list[RedisServer] = []

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes[:2])

    def start(self) -> RedisCluster3:
        assert REDIS_CLI is not None
        for _ in range(3):
            node = RedisServer(
                extra_args=("--cluster-enabled", "yes", "--cluster-node-timeout", "5000")
            )
            self.nodes.append(node.start())
        where = [f"127.0.0.1:{n.port}" for n in self.nodes]
        subprocess.run(
            [REDIS_CLI, "--cluster", "create", *where, "--cluster-replicas", "0", "--cluster-yes"],
            check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, timeout=60,
        )  # fmt: skip
        for node in self.nodes:
            wait_until(
                lambda node=node: cluster_ok(node.port),
                f"cluster_state:ok on {node.port}",
            )
        return self

    def cleanup(self) -> None:
        for node in self.nodes:
            node.cleanup()
        self.nodes = []

    def __enter__(self) -> RedisCluster3:
        try:
            return self.start()
        except BaseException:
            self.cleanup()
            raise

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.cleanup()


class SentinelSet:
    """A master, one replica of it and one Sentinel (quorum 1) watching it as `primary`."""

    def __init__(self) -> None:
        self.master: RedisServer | None = None
        self.replica: RedisServer | None = None
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self._dir: tempfile.TemporaryDirectory[str] | None = None

    @property
    def url(self) -> str:
        return f"redis+sentinel://127.0.0.1:{self.port}/{SERVICE}"

    def master_port(self) -> int:
        with client(self.port) as sentinel:
            return int(sentinel.execute_command("SENTINEL GET-MASTER-ADDR-BY-NAME", SERVICE)[1])

    def start(self) -> SentinelSet:
        assert REDIS_SERVER is not None
        self.master = RedisServer().start()
        replica_of = ("--replicaof", "127.0.0.1", str(self.master.port))
        self.replica = RedisServer(extra_args=replica_of).start()
        self._dir = tempfile.TemporaryDirectory(prefix="streamer-sentinel-")
        self.port = free_port()
        conf = Path(self._dir.name, "sentinel.conf")
        conf.write_text(
            f"port {self.port}\nbind 127.0.0.1\nprotected-mode no\ndir {self._dir.name}\n"
            f"logfile {self._dir.name}/sentinel.log\n"
            f"sentinel monitor {SERVICE} 127.0.0.1 {self.master.port} 1\n"
            f"sentinel down-after-milliseconds {SERVICE} 1000\n"
            f"sentinel failover-timeout {SERVICE} 10000\n"
        )
        self.process = subprocess.Popen(
            [REDIS_SERVER, str(conf), "--sentinel"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        wait_until(lambda: redis_answers(self.port), "the sentinel")
        wait_until(lambda: self.master_port() == self.master.port, "the sentinel's master")  # type: ignore[union-attr]
        # the replica has caught up: a failover can promote it
        replica = self.replica.port

        def linked() -> bool:
            with client(replica) as node:
                return node.info("replication").get("master_link_status") == "up"

        wait_until(linked, "the replica's link")
        return self

    def failover(self) -> int:
        """Promote the replica through Sentinel; the new master's port once it serves writes."""
        assert self.master is not None and self.replica is not None
        old = self.master.port
        with client(self.port) as sentinel:
            sentinel.execute_command("SENTINEL FAILOVER", SERVICE)
        wait_until(lambda: self.master_port() != old, "the failover")
        new = self.master_port()
        wait_until(lambda: role(new) == "master", "the promotion")
        return new

    def cleanup(self) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
            self.process = None
        for server in (self.replica, self.master):
            if server is not None:
                server.cleanup()
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    def __enter__(self) -> SentinelSet:
        try:
            return self.start()
        except BaseException:
            self.cleanup()
            raise

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.cleanup()


@pytest.fixture(scope="module")
def redis_cluster() -> Iterator[RedisCluster3]:
    if REDIS_SERVER is None or REDIS_CLI is None:
        pytest.skip("redis-server or redis-cli is not installed")
    with RedisCluster3() as cluster:
        yield cluster


@pytest.fixture(scope="module")
def redis_sentinel() -> Iterator[SentinelSet]:
    if REDIS_SERVER is None:
        pytest.skip("redis-server is not installed")
    with SentinelSet() as sentinel:
        yield sentinel
