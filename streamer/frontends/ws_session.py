"""The rules of one Responses WebSocket session, without the socket (pure).

What a frame must be to run (`check`), the lanes (`stream_id`) and their FIFO backlog
(`enqueue`, `lane_idle`), the budget of what the socket holds (`QueueBudget`), and the
responses it remembers for `previous_response_id` (least recently used first, each
lane's latest pinned). `websocket.py` is the shell: it reads frames, runs the turns and
writes the events, asking this module what to do at each step.
"""

from __future__ import annotations

import re
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Any

import orjson

from streamer.core import json_bounds
from streamer.core.errors import RequestError, invalid, shutting_down
from streamer.frontends.ws_queue import Admission, QueueBudget, frame_cost

MAX_LANES = 32  # distinct named lanes per connection; the default lane does not count
_STREAM_ID = re.compile(r"[A-Za-z0-9_.-]{1,256}")

Lane = str | None
History = tuple[dict[str, Any], ...]
Queued = tuple[dict[str, Any], int]  # a frame and what it is charged in the budget


@dataclass(frozen=True, slots=True)
class Refused:
    """A frame that will not run: the error to send, and the lane to send it on."""

    error: RequestError
    lane: Lane = None


def parse_frame(
    raw: str | bytes, max_values: int = json_bounds.MAX_VALUES
) -> dict[str, Any] | Refused:
    """A client frame as a `response.create` event, or why it is not one (not JSON, JSON
    beyond the bounds of `json_bounds`, not a create)."""
    try:
        frame = json_bounds.loads(raw, max_values)
    except orjson.JSONDecodeError:
        return Refused(invalid("The message is not valid JSON.", code="invalid_json"))
    except RequestError as exc:
        return Refused(exc)
    if not isinstance(frame, dict):
        return Refused(invalid("Each message must be a JSON object.", code="invalid_event"))
    kind = frame.get("type")
    if kind != "response.create":
        message = (
            f"Unsupported event type {kind!r}: this server accepts 'response.create'."
            if kind is not None
            else "Missing required parameter: 'type'."
        )
        lane = frame.get("stream_id")
        return Refused(
            invalid(message, "type", "unsupported_event_type"),
            lane if isinstance(lane, str) else None,
        )
    return frame


class SessionRules:
    """One socket's state: lanes with work, named lanes, budget, remembered responses."""

    __slots__ = (
        "budget", "closing", "max_values", "named", "queues", "remember_limit", "remembered",
    )  # fmt: skip

    def __init__(
        self, budget: QueueBudget, remember_limit: int, max_values: int = json_bounds.MAX_VALUES
    ) -> None:
        self.budget = budget
        self.max_values = max_values  # --max-json-values, per frame
        self.remember_limit = max(remember_limit, 0)
        # response id -> (lane that produced it, its continuation history), oldest first
        self.remembered: OrderedDict[str, tuple[Lane, History]] = OrderedDict()
        self.queues: dict[Lane, deque[Queued]] = {}  # lanes with work, and their backlog
        self.named: set[str] = set()  # every named lane this socket has used
        self.closing = False  # the server is shutting down: no new turns

    # -- frames -------------------------------------------------------------------

    def offer(self, raw: str | bytes) -> tuple[Admission, int]:
        """Whether the budget takes a frame (charged now if ACCEPT), and its charge: what
        it may hold once parsed (`frame_cost`), known before it is parsed."""
        cost = frame_cost(raw)
        return self.budget.offer(cost), cost

    def check(self, raw: str | bytes) -> dict[str, Any] | Refused:
        """The frame if it is a valid create this socket may run now, else why not.

        A frame that is accepted names its lane: the lane counts from now on.
        """
        frame = parse_frame(raw, self.max_values)
        if isinstance(frame, Refused):
            return frame
        lane = frame.get("stream_id")
        error = self.lane_error(lane)
        if error is not None:
            return Refused(error, lane if error.code != "invalid_stream_id" else None)
        if lane is not None:
            self.named.add(lane)
        return frame

    def lane_error(self, lane: Any) -> RequestError | None:
        """Why a create on `lane` cannot run here now, if it cannot."""
        if self.closing:
            return shutting_down("reconnect to continue")
        if lane is not None and (not isinstance(lane, str) or not _STREAM_ID.fullmatch(lane)):
            return invalid(
                "Invalid 'stream_id': 1-256 characters of [A-Za-z0-9_.-].",
                "stream_id",
                "invalid_stream_id",
            )
        if lane is not None and lane not in self.named and len(self.named) >= MAX_LANES:
            return invalid(
                f"At most {MAX_LANES} stream lanes per connection.",
                "stream_id",
                "websocket_stream_limit_reached",
            )
        return None

    # -- lanes --------------------------------------------------------------------

    def enqueue(self, frame: dict[str, Any], size: int) -> deque[Queued] | None:
        """Queue a checked frame on its lane; the lane's new queue when it needs a worker
        (None: its worker is running and will get to it)."""
        lane = frame.get("stream_id")
        queue = self.queues.get(lane)
        if queue is not None:
            queue.append((frame, size))
            return None
        queue = self.queues[lane] = deque(((frame, size),))
        return queue

    def lane_idle(self, lane: Lane, queue: deque[Queued]) -> None:
        """The lane's worker exits (its queue is empty): a later frame starts a new one."""
        if self.queues.get(lane) is queue:
            del self.queues[lane]

    # -- remembered responses -----------------------------------------------------

    def recall(self, previous: str) -> History | None:
        """A response this socket produced, as a continuation history (now most recent)."""
        state = self.remembered.get(previous)
        if state is None:
            return None
        self.remembered.move_to_end(previous)
        return state[1]

    def remember(self, response_id: str, lane: Lane, history: History) -> None:
        """Keep a finished response; past the limit, forget the least recently used, but
        each lane's latest last of all: its chain goes on from there, while clients that
        never chain only leave dead weight."""
        remembered = self.remembered
        remembered[response_id] = (lane, history)
        over = len(remembered) - self.remember_limit
        if over <= 0:
            return
        oldest = next(iter(remembered))
        if over == 1 and oldest != response_id and remembered[oldest][0] == lane:
            # the steady state, in O(1): the oldest is its lane's and this one is later, so
            # it is the first that is not its lane's latest (what the scan below would find)
            del remembered[oldest]
            return
        latest = {owner: rid for rid, (owner, _) in remembered.items()}
        spare = set(latest.values())
        for rid in [r for r in remembered if r not in spare][:over]:
            del remembered[rid]
            over -= 1
        while over > 0:
            remembered.popitem(last=False)
            over -= 1

    def evict(self, previous: Any, lane: Lane) -> None:
        """A failed continuation forgets its parent, unless it forked from another lane."""
        if isinstance(previous, str):
            state = self.remembered.get(previous)
            if state is not None and state[0] == lane:
                del self.remembered[previous]

    def clear(self) -> None:
        """The socket is gone: drop everything it held."""
        self.remembered.clear()
        self.queues.clear()
        self.named.clear()
        self.budget.clear()
