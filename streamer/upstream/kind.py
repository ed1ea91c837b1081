"""A backend kind as one record: everything the gateway does per API a backend speaks.

`--upstream-api` and a `--config` model's `api` name a kind (streamer/upstream/kinds.py has
the rows). Each table the gateway keeps per kind reads its row: the lowering of a turn and
of a compaction turn and the request fields that are the prompt (the pipeline, the router's
fallbacks), the tool forms it takes per `--backend-profile` (the per-model options), its
wire (path, the body as sent, headers and key, the stream and whole-body decoders, its
error reading: the shared client), how a recording of it is recognised (`streamer replay`)
and how `tap` reads its stream, and whether the embedded scripted model speaks it. A kind
is one package under `streamer/upstream/` with its row; nothing else names it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from streamer.core.backend_tools import BackendTools
from streamer.core.deltas import Delta
from streamer.core.errors import RequestError
from streamer.core.lowering import LoweringOptions
from streamer.core.tools import ResponsesToolNames
from streamer.upstream.chat.http_errors import http_error
from streamer.upstream.chat.profiles import BackendProfile
from streamer.upstream.chat.rejected_params import rejected_params
from streamer.upstream.chat.stream import EndCause

Lower = Callable[
    [Mapping[str, Any], list[dict[str, Any]], ResponsesToolNames, LoweringOptions], dict[str, Any]
]
"""(request, effective input items, the tool map, the model's lowering options) -> body."""


class ResumingLower(Protocol):
    """A kind's lowering that can resume where an earlier turn's left off (`lower`'s
    `resume` and `keep`: core/lowering.py; streamer/turns/history_reuse.py decides)."""

    def __call__(
        self,
        request: Mapping[str, Any],
        items: list[dict[str, Any]],
        names: ResponsesToolNames,
        options: LoweringOptions,
        *,
        resume: Any = None,
        keep: bool = False,
    ) -> dict[str, Any]: ...


Body = Callable[[dict[str, Any]], dict[str, Any]]
HttpError = Callable[[int, bytes, Mapping[str, str], tuple[str, ...]], RequestError]
"""A kind's reading of a non-2xx answer: status, body, headers, secrets to scrub."""
RejectedParams = Callable[[int, bytes, Mapping[str, Any]], tuple[str, ...]]
"""A kind's reading of a 400: which optional parameters of the sent body it names."""
STREAM_HEADERS = (
    ("Content-Type", "application/json"),
    ("Accept", "text/event-stream"),
    ("Accept-Encoding", "identity"),
)


Decoder = Callable[[float, float | None, tuple[str, ...]], "StreamDecoder"]
"""(idle, first byte timeouts, secrets) -> a stream's decoder, which scrubs the backend's
error words of those secrets where they enter (streamer/core/scrub.py)."""
DecodeWhole = Callable[[bytes | bytearray, tuple[str, ...]], list[Delta]]
"""(a whole 2xx JSON body, secrets) -> its deltas."""


def bearer(api_key: str) -> tuple[str, str]:
    """OpenAI's key header (Chat Completions, Responses)."""
    return "Authorization", f"Bearer {api_key}"


class StreamDecoder(Protocol):
    """A kind's body decoder (`ChatDecoder`, `ResponsesDecoder`): bytes in, deltas out.
    `pending`: deltas wait for `take()`; `ended`: no more will come; `failed`: that was an
    error (the connection must be cut)."""

    ended: bool
    failed: bool

    @property
    def pending(self) -> bool: ...
    def feed(self, data: bytes) -> list[Delta]: ...
    def take(self) -> list[Delta]: ...
    def end(self, cause: EndCause, detail: str = "") -> list[Delta]: ...


@dataclass(frozen=True, slots=True)
class Wire:
    """What one backend kind's turns are on HTTP (the shared client,
    streamer/upstream/backend_client.py, does the rest)."""

    path: str  # POST {base}{path}, e.g. "/chat/completions"
    body: Body  # the lowered request as sent (streamed, ...)
    decoder: Decoder  # (idle, first byte) timeouts, the secrets it scrubs from errors
    decode_whole: DecodeWhole  # a whole 2xx JSON body (and those secrets)
    headers: tuple[tuple[str, str], ...] = STREAM_HEADERS  # every turn's, and the kind's own
    auth: Callable[[str], tuple[str, str]] = bearer  # the key's header
    http_error: HttpError = http_error  # a non-2xx answer -> RequestError
    rejected_params: RejectedParams = rejected_params  # a 400 naming optional parameters


class TapDecoder(Protocol):
    """`tap`'s reading of one data payload of a backend stream (`ChatChunkDecoder`)."""

    done: bool

    def feed(self, data: str, event: str | None = None) -> Iterable[Delta]: ...


@dataclass(frozen=True, slots=True)
class TapReading:
    """How `tap` reads an SSE stream of this kind, as the gateway would (model deltas)."""

    format: str  # the source format's name ("chat-sse")
    looks_like: Callable[[str], bool]  # the stream's first data payload is of this kind
    decoder: Callable[[], TapDecoder]


@dataclass(frozen=True, slots=True)
class BackendKind:
    name: str  # `--upstream-api`, a model's `api`
    path: str  # POST {base}{path}
    lower: Lower
    compaction: Lower  # the history, no tools, the handover prompt last (compaction.py)
    prompt_keys: tuple[str, ...]  # the lowered request's fields that are the prompt (usage)
    tools: Callable[[str], BackendTools]  # the tool forms it takes, by --backend-profile
    body: Callable[[BackendProfile], Body]  # a model's request as sent (streamed, ...)
    decoder: Decoder  # body bytes -> deltas
    decode_whole: DecodeWhole  # a whole 2xx JSON body
    recorded: Callable[[Mapping[str, Any]], bool]  # a recorded backend request is of it
    tap: TapReading | None = None  # None: its stream is Responses events, checked as they are
    embedded: bool = False  # the embedded scripted model speaks it (no --upstream needed)
    # its stream says which reasoning is a summary and which the raw text (Responses); else
    # the reasoning it sends is the one text there is, the summary when one was asked for
    names_reasoning_parts: bool = False
    headers: tuple[tuple[str, str], ...] = STREAM_HEADERS
    auth: Callable[[str], tuple[str, str]] = bearer  # the backend key's header
    http_error: HttpError = http_error  # a non-2xx answer -> RequestError
    rejected_params: RejectedParams = rejected_params  # a 400 naming optional parameters
    resuming: ResumingLower | None = None  # `lower` resumable (None: every turn in full)
    # an input item as the store lists it (message text as parts) lowers as the item sent
    # did: a continuation of a stored response resumes its kept turn (Chat: text is text;
    # Responses passes items as they are, so a history read as stored is lowered in full)
    resumes_stored: bool = True

    def wire(self, profile: BackendProfile) -> Wire:
        """What the shared client sends and reads for a model of this kind on `profile`."""
        return Wire(
            self.path,
            self.body(profile),
            self.decoder,
            self.decode_whole,
            self.headers,
            self.auth,
            self.http_error,
            self.rejected_params,
        )
