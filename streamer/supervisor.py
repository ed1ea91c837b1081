"""`streamer serve --workers N`: N worker processes on one port, and the parent that keeps
them running.

The port: with SO_REUSEPORT (Linux, the BSDs, macOS) the parent binds it without listening
(so the port is taken, and `--port 0` gets its number) and each worker binds its own
listening socket to it, the kernel spreading new connections over them. Without it, the
parent listens and every worker accepts on that one inherited socket.

The parent: a worker that exits while the parent is not stopping is restarted at once,
at most `--worker-restart-limit` times in 60 s per worker (beyond, its next start waits,
and the log says so). SIGTERM or SIGINT sends each worker one SIGTERM: each drains as a
single gateway does, and the parent exits once they all have (0 if every one exited 0). SIGHUP is passed on to
every worker.

What the workers share: the store (a memory store is refused: `check_workers`), the state
key (`--state-key-file`, or one the parent makes and hands to each worker, so any worker
opens the items another sealed, across restarts too), and the metrics (summed over the
workers by `/metrics`, see streamer.metrics). The profile probe runs once, in worker 0's
first start. `--upstream-max-connections` is split between the workers.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import secrets
import shutil
import signal
import socket
import sys
import tempfile
from collections import deque

from streamer import logs
from streamer.config import Settings
from streamer.metrics import MULTIPROC_DIR
from streamer.worker import Seat

log = logging.getLogger("streamer.supervisor")

REUSE_PORT = hasattr(socket, "SO_REUSEPORT")
RESTART_WINDOW = 60.0
# not `-m`: as __main__, a module's app keys would be a second copy of themselves
WORKER_MAIN = "import sys; from streamer.worker_entry import main; sys.exit(main())"
STOP_MARGIN = 15.0
"""Seconds past `--shutdown-grace` the parent waits for its workers before SIGKILL."""


def check_workers(settings: Settings) -> None:
    """Refuse, before anything starts, a worker count that cannot work (ValueError)."""
    if settings.workers < 1:
        raise ValueError(f"--workers must be 1 or more (got {settings.workers})")
    if settings.worker_restart_limit < 1:
        raise ValueError("--worker-restart-limit must be 1 or more")
    if settings.workers == 1:
        return
    if os.name != "posix":
        raise ValueError("--workers above 1 needs a POSIX system (it passes sockets to workers)")
    if settings.store in ("memory", "memory://"):
        raise ValueError(
            f"--workers {settings.workers} needs a shared store: with --store "
            f"{settings.store} each worker keeps its own stored responses and background "
            "turns, and a previous_response_id, GET, cancel or resume that reaches another "
            "worker finds nothing; use --store redis://host:port/db"
        )
    if settings.store.startswith("sqlite:"):
        raise ValueError(
            f"--workers {settings.workers} needs a shared store: a SQLite file serves one "
            "process (the followers and cancels of a background turn stay in it); use "
            "--store redis://host:port/db"
        )


class RestartBudget:
    """At most `limit` restarts in any `window` seconds (pure: the caller gives the time)."""

    def __init__(self, limit: int, window: float = RESTART_WINDOW) -> None:
        self.limit = limit
        self.window = window
        self.times: deque[float] = deque()

    def delay(self, now: float) -> float:
        """Seconds to wait, from `now`, before the next restart may happen."""
        while self.times and now - self.times[0] >= self.window:
            self.times.popleft()
        if len(self.times) < self.limit:
            return 0.0
        return self.times[0] + self.window - now

    def record(self, now: float) -> None:
        self.times.append(now)


@dataclasses.dataclass(slots=True)
class Listener:
    """The port the workers share: reserved (SO_REUSEPORT) or listening (inherited)."""

    sock: socket.socket
    shared: bool  # True: workers accept on this very socket

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])


def open_listener(host: str, port: int, *, reuse_port: bool = REUSE_PORT) -> Listener:
    """Take the port before any worker starts (a taken port is a ValueError)."""
    family, kind, _, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
        if not reuse_port:
            sock.listen(128)
            sock.set_inheritable(True)
    except OSError as exc:
        sock.close()
        raise ValueError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return Listener(sock, shared=not reuse_port)


def _exit_reason(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"signal {signal.Signals(-code).name}"
        return f"signal {-code}"
    return f"exit code {code}"


@dataclasses.dataclass(slots=True)
class Slot:
    """One worker's place: the process running in it now, and its restarts."""

    index: int
    budget: RestartBudget
    process: asyncio.subprocess.Process | None = None
    signalled: bool = False
    starts: int = 0
    code: int | None = None

    def terminate(self) -> None:
        """One SIGTERM (a second one would cut the worker's drain short)."""
        proc = self.process
        if proc is not None and proc.returncode is None and not self.signalled:
            self.signalled = True
            proc.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.kill()


class Supervisor:
    """Keeps `settings.workers` workers running on `listener` until SIGTERM/SIGINT."""

    def __init__(self, settings: Settings, listener: Listener, metrics_dir: str) -> None:
        self.settings = settings
        self.listener = listener
        self.env = {**os.environ, MULTIPROC_DIR: metrics_dir}
        self.metrics_dir = metrics_dir
        # one key for every worker and every restart, unless the operator gave a file
        self.state_key = None if settings.state_key_file else secrets.token_urlsafe(48).encode()
        limit = settings.worker_restart_limit
        self.slots = [Slot(i, RestartBudget(limit)) for i in range(settings.workers)]
        self.stopping = asyncio.Event()

    def seat(self, slot: Slot) -> Seat:
        s, n = self.settings, self.settings.workers
        limit = s.upstream_max_connections  # "across the gateway": split between workers
        settings = dataclasses.replace(
            s,
            port=self.listener.port,
            profile_probe=s.profile_probe and slot.index == 0 and slot.starts == 0,
            upstream_max_connections=max(1, limit // n) if limit else 0,
        )
        fd = self.listener.sock.fileno() if self.listener.shared else None
        return Seat(settings, slot.index, n, fd=fd, state_key=self.state_key)

    async def start(self, slot: Slot) -> asyncio.subprocess.Process:
        seat = self.seat(slot)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", WORKER_MAIN,
            stdin=asyncio.subprocess.PIPE, env=self.env,
            pass_fds=() if seat.fd is None else (seat.fd,),
            start_new_session=True,  # a terminal's Ctrl-C reaches the parent only
        )  # fmt: skip
        assert proc.stdin is not None
        proc.stdin.write(seat.encode() + b"\n")  # kept open: its end tells the worker we left
        await proc.stdin.drain()
        slot.process, slot.signalled, slot.starts = proc, False, slot.starts + 1
        log.info("worker %d started (pid %d)", slot.index, proc.pid)
        return proc

    async def keep(self, slot: Slot) -> None:
        """Run `slot`'s worker, restarting it (within its budget) until stopping."""
        loop = asyncio.get_running_loop()
        while True:
            proc = await self.start(slot)
            if self.stopping.is_set():
                slot.terminate()
            slot.code = code = await proc.wait()
            self.mark_dead(proc.pid)
            if self.stopping.is_set():
                return
            slot.code = None  # a crash, not how it stopped: the exit code is of the last one
            delay = slot.budget.delay(loop.time())
            if delay > 0:
                log.error(
                    "worker %d (pid %d) exited (%s) after %d restarts in %.0f s "
                    "(--worker-restart-limit): restarting it in %.1f s",
                    slot.index, proc.pid, _exit_reason(code), len(slot.budget.times),
                    RESTART_WINDOW, delay,
                )  # fmt: skip
            else:
                log.warning(
                    "worker %d (pid %d) exited (%s): restarting it",
                    slot.index, proc.pid, _exit_reason(code),
                )  # fmt: skip
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), delay)
            if self.stopping.is_set():
                return
            slot.budget.record(loop.time())

    def pass_hangup(self) -> None:
        """SIGHUP goes to every worker (each ignores it unless it reloads on it)."""
        running = [s.process for s in self.slots if s.process and s.process.returncode is None]
        for proc in running:
            proc.send_signal(signal.SIGHUP)
        log.info("SIGHUP passed to %d workers", len(running))

    def mark_dead(self, pid: int) -> None:
        """Its gauges leave the sum; its counters stay in it."""
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid, self.metrics_dir)

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stopping.set)
        loop.add_signal_handler(signal.SIGHUP, self.pass_hangup)
        tasks = [asyncio.create_task(self.keep(slot)) for slot in self.slots]
        stopped = asyncio.create_task(self.stopping.wait())
        await asyncio.wait([stopped, *tasks], return_when=asyncio.FIRST_COMPLETED)
        self.stopping.set()  # a keep() that failed (a worker that cannot start) stops all
        log.info("stopping %d workers", len(self.slots))
        for slot in self.slots:
            slot.terminate()
        if self.listener.shared:  # the workers closed theirs: now nothing accepts on it
            self.listener.sock.close()
        patience = self.settings.shutdown_grace + STOP_MARGIN
        _, late = await asyncio.wait(tasks, timeout=patience)
        for slot in self.slots:
            if late:
                log.error("worker %d did not stop within %.0f s: killed", slot.index, patience)
                slot.kill()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        failed = [r for r in results if isinstance(r, BaseException)]
        for exc in failed:
            log.error("a worker could not be started: %s", exc)
        return 0 if not failed and all(s.code in (0, None) for s in self.slots) else 1


def supervise(settings: Settings) -> int:
    """Run `settings.workers` workers until SIGTERM/SIGINT; the exit code."""
    logs.configure(settings.log_level)
    try:
        listener = open_listener(settings.host, settings.port)
    except ValueError as exc:
        print(f"streamer: {exc}", file=sys.stderr)
        return 1
    how = "one shared socket" if listener.shared else "SO_REUSEPORT"
    print(
        f"streamer: {settings.workers} workers serving http://{settings.host}:{listener.port}"
        f"/v1 ({how}; supervisor pid {os.getpid()})",
        flush=True,
    )
    metrics_dir = tempfile.mkdtemp(prefix="streamer-metrics-")
    try:
        return asyncio.run(Supervisor(settings, listener, metrics_dir).run())
    finally:
        listener.sock.close()
        shutil.rmtree(metrics_dir, ignore_errors=True)
