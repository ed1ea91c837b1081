"""How many background turns one process runs at once, in all and per client (pure).

A background turn outlives its request, so nothing else bounds how many run: 2,000
creates in 7.7 s on 4 connections each held a backend connection, and at a 1,024
open-file limit the gateway ran out of descriptors and reset every new client (issue
25, row 4). `TurnCaps` admits a turn while both caps allow it, `--background-max-turns`
in all and `--background-max-per-client` per client (`Turn.client`, the key's digest),
both by default shares of the open-file budget (`streamer.fd_budget`). A turn beyond is
refused before anything is stored: a 429 in OpenAI's rate-limit shape with
`retry-after`, and, the first time a cap is hit since it last had room, a log line.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from streamer.core.errors import RequestError

RETRY_AFTER = 1  # seconds: a cap has room again as soon as one turn ends
ALL = None  # the cap in all, beside the per-client ones (`Refusal.client`)


@dataclass(frozen=True, slots=True)
class Refusal:
    """A turn a cap refused: whose cap (`ALL`: the one in all), and whether to log it."""

    client: str | None
    cap: int
    first: bool  # the cap just filled up: say so in the log (once, until it has room)

    def error(self) -> RequestError:
        if self.client is ALL:
            message = (
                f"Too many background responses are running on this server (at most"
                f" {self.cap} at once); retry after {RETRY_AFTER} s."
            )
        else:
            message = (
                f"Too many background responses are running for this API key (at most"
                f" {self.cap} at once); retry once one has finished."
            )
        return RequestError(
            message,
            param="background",
            status=429,
            type="requests",
            code="rate_limit_exceeded",
            headers={"retry-after": str(RETRY_AFTER)},
        )

    def log_line(self) -> str:
        who = "in all" if self.client is ALL else f"for client {self.client or '(anonymous)'}"
        return (
            f"background turns at their cap of {self.cap} {who}: more are refused (429)"
            " until one ends"
        )


@dataclass(slots=True)
class TurnCaps:
    """The background turns running, in all and per client, against their caps."""

    total_cap: int
    per_client_cap: int
    total: int = 0
    running: dict[str, int] = field(default_factory=dict)  # client -> its turns, if any
    _full: set[str | None] = field(default_factory=set)  # caps hit (and logged) since

    def __post_init__(self) -> None:
        if self.total_cap < 1 or self.per_client_cap < 1:
            raise ValueError("background turn caps are at least 1")

    def take(self, client: str) -> Refusal | None:
        """Count one more turn of `client` if both caps allow it (None), else why not."""
        mine = self.running.get(client, 0)
        if mine >= self.per_client_cap:
            return self._refuse(client, self.per_client_cap)
        if self.total >= self.total_cap:
            return self._refuse(ALL, self.total_cap)
        self.running[client] = mine + 1
        self.total += 1
        return None

    def give(self, client: str) -> None:
        """A turn of `client` that was taken has ended: its caps have room again."""
        mine = self.running.get(client, 0)
        if mine <= 0:
            return
        if mine == 1:
            del self.running[client]
        else:
            self.running[client] = mine - 1
        self.total -= 1
        self._full.discard(client)
        self._full.discard(ALL)

    def _refuse(self, client: str | None, cap: int) -> Refusal:
        first = client not in self._full
        self._full.add(client)
        return Refusal(client, cap, first)
