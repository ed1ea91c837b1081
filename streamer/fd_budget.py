"""The open-file budget: how one process's file descriptors are shared out (pure).

Every socket and file is a descriptor, and a process may hold RLIMIT_NOFILE of them (the
gateway raises its soft limit to the hard one at startup, as servers do). Once they are
gone `accept()` fails and new clients are reset, whoever used them up: background turns
holding backend connections did (issue 25, row 4). So the limit is split, and each kind
of holder is capped at its share:

- a reserve, an eighth (at least 32): the listening sockets, the event loop's own, the
  store's connections, logs, health checks and profile probes, imports;
- client connections (`--max-client-connections`, the front door's cap): half the rest,
  one descriptor each, two under `--tap-dir` (a turn's recording is a file);
- backend connections (`--upstream-max-open-connections`, in use or idle, every backend
  together): the other half, one descriptor each, two for the embedded scripted model
  (both ends of the connection are in this process);
- background turns (`--background-max-turns`): half the backend connections, so that
  turns with a client always have the other half; each holds one backend connection
  (counted above) and, under `--tap-dir`, a recording. One client (API key) may run a
  quarter of them (`--background-max-per-client`).

A setting given explicitly is taken as given; the defaults share out what it leaves.
`FdBudget.over` says when the explicit ones ask for more than the limit (logged).
"""

from __future__ import annotations

from dataclasses import dataclass

from streamer.config import Settings

RESERVE_SHARE = 8  # the reserve is 1/8 of the limit ...
RESERVE_MIN = 32  # ... and at least this many
PER_CLIENT_SHARE = 4  # one client may run 1/4 of the background turns


@dataclass(frozen=True, slots=True)
class FdBudget:
    """One process's share-out of `nofile` descriptors (counts, not descriptors)."""

    nofile: int
    reserve: int
    clients: int  # client connections open at once
    backend: int  # backend connections open at once (in use or idle)
    background: int  # background turns running at once
    background_per_client: int
    backend_fds: int = 1  # descriptors per backend connection (2: the embedded model)
    turn_files: int = 0  # files per turn in flight (1: --tap-dir)

    @property
    def fds(self) -> int:
        """The descriptors the caps allow, reserve included."""
        return (
            self.reserve
            + self.clients * (1 + self.turn_files)
            + self.backend * self.backend_fds
            + self.background * self.turn_files
        )

    @property
    def over(self) -> bool:
        """Explicit settings ask for more descriptors than the limit has."""
        return self.fds > self.nofile

    def describe(self) -> str:
        return (
            f"open files {self.nofile}: {self.clients} client connections, {self.backend}"
            f" backend connections, {self.background} background turns"
            f" ({self.background_per_client} per client), {self.reserve} in reserve"
        )


def split(
    nofile: int,
    *,
    clients: int = 0,
    backend: int = 0,
    background: int = 0,
    per_client: int = 0,
    backend_fds: int = 1,
    turn_files: int = 0,
) -> FdBudget:
    """Share out `nofile` descriptors; a cap given (> 0) is kept, the others (0) get their
    share of what it leaves (at least 1 each)."""
    reserve = min(max(RESERVE_MIN, nofile // RESERVE_SHARE), nofile // 2)
    client_cost, backend_cost = 1 + turn_files, backend_fds
    left = nofile - reserve - clients * client_cost - backend * backend_cost
    left -= background * turn_files
    if not clients:
        share = left // 2 if not backend else left
        clients = max(1, share // client_cost)
        left -= clients * client_cost
    if not backend:
        # the default background turns (half as many) bring their recordings along
        per_connection = 2 * backend_cost + (0 if background else turn_files)
        backend = max(1, 2 * left // per_connection)
    background = background or max(1, backend // 2)
    per_client = per_client or max(1, background // PER_CLIENT_SHARE)
    return FdBudget(
        nofile, reserve, clients, backend, background, per_client, backend_fds, turn_files
    )


def for_settings(settings: Settings, nofile: int) -> FdBudget:
    """The budget of a process with `nofile` descriptors, under these settings."""
    for flag, value in (
        ("--max-client-connections", settings.max_client_connections),
        ("--upstream-max-open-connections", settings.upstream_max_open_connections),
        ("--background-max-turns", settings.background_max_turns),
        ("--background-max-per-client", settings.background_max_per_client),
    ):
        if value < 0:
            raise ValueError(f"{flag} must be 0 (from the open-file limit) or more")
    embedded = not settings.upstream and not settings.config  # both ends in this process
    return split(
        nofile,
        clients=settings.max_client_connections,
        backend=settings.upstream_max_open_connections,
        background=settings.background_max_turns,
        per_client=settings.background_max_per_client,
        backend_fds=2 if embedded else 1,
        turn_files=1 if settings.tap_dir else 0,
    )
