"""Chat Completions payloads -> model deltas (pure).

`ChatChunkDecoder` takes the `data:` payload of one SSE event of a streamed completion;
`decode_completion` takes a whole non-streamed completion, for backends that ignore
`stream: true` (`stream.ChatDecoder` frames the body; `http_errors` reads a non-2xx one).
Both are lenient: a shape they do not know is skipped, never raised on,
because every backend (vLLM, llama.cpp, Ollama, SGLang, LM Studio) adds its own fields.

Order of deltas from one chunk: reasoning, text, refusal, tool calls, finish, usage.
"""

from __future__ import annotations

from typing import Any

import orjson

from streamer.core import speed
from streamer.core.deltas import (
    Annotation,
    Delta,
    Finish,
    LoggedText,
    ReasoningDelta,
    RefusalDelta,
    ServiceTier,
    TextDelta,
    TextRun,
    ToolCallDelta,
    ToolCallRun,
    UpstreamError,
    Usage,
)
from streamer.core.json_bounds import MAX_ITEM_DEPTH, too_deep
from streamer.core.scrub import excerpt, scrub
from streamer.upstream.chat.chunk_shapes import NO_SHAPE, learn_arguments, learn_text
from streamer.upstream.chat.error_shapes import CONTEXT_OVERFLOW, is_context_overflow
from streamer.upstream.chat.logprobs import choice_logprobs
from streamer.upstream.chat.runs import RunKeys, contents, fits, run_keys, strings

INVALID_CHUNK = "invalid_upstream_chunk"
_SNIPPET = 120


_TEXT, _ARGS = 1, 2  # the kinds of per-token chunk whose shapes are learnt
_LESSONS = 4  # shapes learnt per stream at most: a backend whose chunks all differ costs little
_loads = orjson.loads
_JSONDecodeError = orjson.JSONDecodeError


class CallIndexes:
    """A backend's tool-call indexes -> the stream's own, one per call.

    Most backends number calls 0, 1, ...; Ollama (and others) send every call at index 0,
    or with no index at all, `id` only on a call's first chunk. A call is new when its
    index is new, when an `id` differs from the one its index had, or (no `id` at all)
    when a name comes with arguments that are a whole JSON object after that index's
    call already had arguments: a whole call in one chunk.
    """

    __slots__ = ("_at", "_next", "_used")

    def __init__(self) -> None:
        self._at: dict[int, list[Any]] = {}  # backend index -> [own index, id, had arguments]
        self._used: set[int] = set()
        self._next = 0

    def index(self, delta: ToolCallDelta) -> tuple[ToolCallDelta, bool]:
        """The delta under the stream's own index, and whether that opened a new call at
        an index already used (a learnt argument shape is then stale)."""
        state = self._at.get(delta.index)
        renumbered = state is not None and self._new_call(state, delta)
        if state is None or renumbered:
            own = delta.index if delta.index not in self._used else self._next
            self._used.add(own)
            self._next = max(self._next, own + 1)
            state = self._at[delta.index] = [own, delta.id, False]
        elif delta.id and state[1] is None:
            state[1] = delta.id
        if delta.arguments:
            state[2] = True
        if state[0] != delta.index:
            delta = ToolCallDelta(state[0], delta.id, delta.name, delta.arguments)
        return delta, renumbered

    @staticmethod
    def _new_call(state: list[Any], delta: ToolCallDelta) -> bool:
        if delta.id:
            return state[1] is not None and delta.id != state[1]
        if not (delta.name and state[2] and delta.arguments.startswith("{")):
            return False
        try:
            return isinstance(_loads(delta.arguments), dict)
        except _JSONDecodeError:
            return False


class ChatChunkDecoder:
    """One per backend stream. `done` is set by `[DONE]`, `finished` by a finish reason."""

    __slots__ = (
        "_args",
        "_args_keys",
        "_calls",
        "_lessons",
        "_secrets",
        "_seen",
        "_text",
        "_text_keys",
        "_tier",
        "done",
        "finished",
        "runs",
    )

    def __init__(self, *, runs: bool = False, secrets: tuple[str, ...] = ()) -> None:
        self.runs = runs  # decode runs of per-token chunks together (TextRun, ToolCallRun)
        self._secrets = secrets  # taken out of the backend's error text (streamer/core/scrub.py)
        self._tier: str | None = None  # the service tier the stream reported last
        self.done = False
        self.finished = False
        self._calls = CallIndexes()
        self._text = NO_SHAPE  # the stream's text chunk, once seen (chunk_shapes)
        self._args = NO_SHAPE  # its argument-fragment chunk
        self._text_keys: RunKeys | None = None  # the shapes as runs need them (runs.py)
        self._args_keys: RunKeys | None = None
        self._lessons = _LESSONS if speed.fast("shapes") else 0  # 0: every chunk parsed whole
        self._seen = 0  # the kinds of per-token chunk met once (_TEXT, _ARGS): learnt the next time

    def decode(self, messages: list[bytes]) -> list[Delta]:
        """Decode a batch of events' payloads (core/sse.py); stop after an error.

        The per-token chunks are sliced through the stream's learnt shapes, runs of them
        decoded together (`runs`, with `self.runs`); any other payload goes through `feed`.
        """
        out: list[Delta] = []
        at, n = 0, len(messages)
        while at < n:
            if self.runs and (self._text_keys or self._args_keys):
                at = self._runs(messages, at, out)
            else:
                at = self._each(messages, at, n, out)
            if self.done or (out and out[-1].__class__ is UpstreamError):
                break
        return out

    def _runs(self, messages: list[bytes], at: int, out: list[Delta]) -> int:
        """Decode from `at` on, runs of per-token chunks together; returns where it stopped
        (the end, or after a chunk that taught a new shape: the runs are found again). A
        stream with named events has runs turned off (`ChatDecoder`): a name may change
        what a payload means (`event: error`), and a run reads none."""
        rest = messages[at:]
        n = len(rest)
        text_fits = fits(rest, self._text_keys)
        # The argument shape is tried only between text runs, one stretch at a time.
        args_fits, base, until = [False, True], 0, 0
        i = 0
        while i < n:
            if text_fits[i]:
                end = text_fits.index(False, i)
                deltas = self._text_run(rest[i:end]) if end - i > 1 else None
            else:
                if i >= until:
                    base, until = i, min(text_fits.index(True, i), n)
                    args_fits = fits(rest[i:until], self._args_keys)
                if args_fits[i - base]:
                    end = base + args_fits.index(False, i - base)
                    deltas = self._args_run(rest[i:end]) if end - i > 1 else None
                else:
                    end = min(base + args_fits.index(True, i - base), until)
                    deltas = None
            if deltas is None:  # the per-payload path, which may learn a shape
                text, args = self._text, self._args
                stop = self._each(rest, i, end, out)
                if (
                    stop < end
                    or self.done
                    or (out and out[-1].__class__ is UpstreamError)
                    or text is not self._text
                    or args is not self._args
                ):
                    return at + stop
            elif not self.done:
                out += deltas
            i = end
        return at + n

    def _text_run(self, run: list[bytes]) -> list[Delta] | None:
        """A run of text chunks as one `TextRun` (its empty pieces left out, as `_each`
        leaves them), or None: the run does not fit after all."""
        keys = self._text_keys
        assert keys is not None
        raw = contents(run, keys)
        values = strings(raw) if raw is not None else None
        if values is None:
            return None
        if not all(values):  # empty pieces make no delta
            kept = [(v, r) for v, r in zip(values, raw, strict=True) if v]  # type: ignore[arg-type]
            if len(kept) < 2:
                return [TextDelta(v) for v, _ in kept]
            values, raw = [v for v, _ in kept], [r for _, r in kept]
        return [TextRun("".join(values), values, raw)]  # type: ignore[arg-type]

    def _args_run(self, run: list[bytes]) -> list[Delta] | None:
        """A run of argument fragments of one call as one `ToolCallRun`, or None."""
        keys = self._args_keys
        assert keys is not None
        raw = contents(run, keys)
        values = strings(raw) if raw is not None else None
        if values is None or not all(values):  # an empty fragment: the per-payload path
            return None
        return [ToolCallRun(self._args.call, None, None, "".join(values), values, raw)]  # type: ignore[arg-type]

    def _each(self, messages: list[bytes], at: int, stop: int, out: list[Delta]) -> int:
        """Decode `messages[at:stop]` one by one; returns where it stopped: `stop`, or (with
        runs on) just after a payload that taught a shape, or after an error."""
        append = out.append
        # The shapes as locals, and a slice compared rather than a startswith call: this
        # is the per-token path. A payload too short for head and tail only fails to parse.
        text, args = self._text, self._args
        th, tt, _, ts, te = text
        ah, at_, index, as_, ae = args
        runs = self.runs
        while at < stop:
            message = messages[at]
            at += 1
            if message.__class__ is bytes:
                if th and message[:ts] == th and message[te:] == tt:
                    try:
                        value = _loads(message[ts:te])
                    except _JSONDecodeError:
                        value = None
                    if value.__class__ is str:
                        if value and not self.done:
                            append(TextDelta(value))
                        continue
                if ah and message[:as_] == ah and message[ae:] == at_:
                    try:
                        value = _loads(message[as_:ae])
                    except _JSONDecodeError:
                        value = None
                    if value.__class__ is str:
                        if not self.done:
                            append(ToolCallDelta(index, None, None, value))
                        continue
                deltas = self.feed(message)
                if text is not self._text or args is not self._args:  # it learnt a shape
                    if runs:
                        out += deltas
                        return at
                    text, args = self._text, self._args
                    th, tt, _, ts, te = text
                    ah, at_, index, as_, ae = args
            else:  # a NamedPayload (core/sse.py): plain bytes for orjson
                deltas = self.feed(bytes(message), message.event)  # type: ignore[attr-defined]
            if deltas:
                out += deltas
                if deltas[-1].__class__ is UpstreamError:
                    return at
        return at

    def feed(self, message_data: str | bytes, event: str | None = None) -> list[Delta]:
        """Decode one `data:` payload; `event` is the SSE event name, if the backend sent one."""
        if self.done:
            return []
        try:
            obj = _loads(message_data)
        except _JSONDecodeError:
            return self._not_json(message_data)
        if obj.__class__ is not dict:
            return []
        out = self._decode_object(obj, event)
        if len(out) == 1 and self._lessons and event is None and message_data.__class__ is bytes:
            self._learn(message_data, obj, out[0])
        return out

    def _not_json(self, message_data: str | bytes) -> list[Delta]:
        if message_data.strip() in ("[DONE]", b"[DONE]"):
            self.done = True
            return []
        text = message_data[: _SNIPPET * 4]  # as many characters whether bytes or text
        if isinstance(text, bytes):
            text = text.decode("utf-8", "replace")
        snippet = excerpt(text, _SNIPPET, self._secrets)
        message = f"The backend sent malformed JSON in its stream: {snippet!r}"
        return [UpstreamError(INVALID_CHUNK, message)]

    def _decode_object(self, obj: dict[str, Any], event: str | None) -> list[Delta]:
        error = payload_error(obj, self._secrets)
        if error is None and event == "error":
            said = _said(obj.get("message"), self._secrets)
            error = UpstreamError("server_error", said or "The backend reported an error.")
        if error is not None:
            return [error]
        out: list[Delta] = []
        choices = obj.get("choices")
        if choices and isinstance(choices, list):
            for choice in choices:
                # n > 1 streams interleave choices; only the first one is ours
                if isinstance(choice, dict) and choice.get("index", 0) in (0, None):
                    delta = choice.get("delta")
                    if isinstance(delta, dict):
                        _message_deltas(delta, out)
                        if "tool_calls" in delta:
                            self._renumber(out)
                        if choice.get("logprobs"):
                            _logged(out, choice)
                    reason = choice.get("finish_reason")
                    if reason and isinstance(reason, str):
                        self.finished = True
                        out.append(Finish(reason))
                    break
        usage = obj.get("usage")
        if usage and isinstance(usage, dict):
            out.append(decode_usage(usage))
        tier = obj.get("service_tier")
        if tier and isinstance(tier, str) and tier != self._tier:  # sent on every chunk
            self._tier = tier
            out.append(ServiceTier(tier))
        return out

    def _renumber(self, out: list[Delta]) -> None:
        for i, delta in enumerate(out):
            if delta.__class__ is ToolCallDelta:
                out[i], renumbered = self._calls.index(delta)
                if renumbered:
                    self._args, self._args_keys = NO_SHAPE, None

    def _learn(self, payload: bytes, obj: dict[str, Any], delta: Delta) -> None:
        """Learn the shape of a per-token chunk: one choice whose only output is one piece of
        text, or one fragment of one call's arguments (see chunk_shapes; the shape is proven
        there to differ from `obj` in that one string only, so the decoding above of any chunk
        of that shape is that one delta)."""
        cls = delta.__class__
        if cls is not TextDelta and cls is not ToolCallDelta:
            return
        choices = obj.get("choices")
        if choices.__class__ is not list or len(choices) != 1:  # the shape's slot is choices[0]
            return
        message = choices[0]["delta"]  # the delta came from it: a dict with a delta dict
        if cls is TextDelta:
            if message.get("content").__class__ is str and self._second(_TEXT):
                self._lessons -= 1
                self._text = learn_text(payload, obj) or self._text
                self._text_keys = run_keys(self._text)
        elif delta.id is None and delta.name is None:  # type: ignore[union-attr]
            calls = message["tool_calls"]
            function = calls[0].get("function") if len(calls) == 1 else None
            if (
                isinstance(function, dict)
                and function.get("arguments").__class__ is str
                and self._second(_ARGS)
            ):
                self._lessons -= 1
                shape = learn_arguments(payload, obj, delta.index)  # type: ignore[union-attr]
                self._args = shape or self._args
                self._args_keys = run_keys(self._args)

    def _second(self, kind: int) -> bool:
        """Whether a chunk of this kind came before: shapes are learnt from the second on,
        so a one-token answer (or a call in one piece) pays for no lesson it never uses
        (a third of decoding a short turn)."""
        if self._seen & kind:
            return True
        self._seen |= kind
        return False


def decode_completion(body: Any, secrets: tuple[str, ...] = ()) -> list[Delta]:
    """A whole (non-streamed) `chat.completion` as the deltas its stream would have carried
    (`secrets`: taken out of an error it reports)."""
    if not isinstance(body, dict):
        return [
            UpstreamError(
                INVALID_CHUNK, "The backend answered with JSON that is not a chat completion."
            )
        ]
    error = payload_error(body, secrets)
    if error is not None:
        return [error]
    out: list[Delta] = []
    choices = body.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        choice = choices[0]
        message = choice.get("message")
        if not isinstance(message, dict):
            message = choice.get("delta")  # some servers reuse the chunk shape
        if isinstance(message, dict):
            _message_deltas(message, out)
            if choice.get("logprobs"):
                _logged(out, choice)
        reason = choice.get("finish_reason")
        if reason and isinstance(reason, str):
            out.append(Finish(reason))
    usage = body.get("usage")
    if usage and isinstance(usage, dict):
        out.append(decode_usage(usage))
    tier = body.get("service_tier")
    if tier and isinstance(tier, str):
        out.append(ServiceTier(tier))
    return out


def payload_error(obj: dict[str, Any], secrets: tuple[str, ...] = ()) -> UpstreamError | None:
    """`{"error": {...}}`, `{"error": "text"}` or vLLM's `{"object": "error", ...}`; the
    backend's words scrubbed of `secrets` (whole ones), the gateway's defaults as they are."""
    err = obj.get("error")
    if err is None and obj.get("object") == "error":
        err = obj
    if err is None:
        return None
    if isinstance(err, str):
        kind = CONTEXT_OVERFLOW if is_context_overflow(None, err) else "server_error"
        return UpstreamError(kind, _said(err, secrets) or "The backend reported an error.")
    if not isinstance(err, dict):
        return UpstreamError("server_error", "The backend reported an error.")
    error_type = _text(err.get("type"))
    code = _text(err.get("code")) or error_type
    message = _text(err.get("message"))
    if is_context_overflow(code, message) or is_context_overflow(error_type, ""):
        code = CONTEXT_OVERFLOW
    else:
        code = _said(code, secrets) or "server_error"
    said = _said(message, secrets) or "The backend reported an error."
    error_type = _said(error_type, secrets)
    return UpstreamError(code, said, error_type if error_type not in ("", code) else None)


def _said(value: Any, secrets: tuple[str, ...]) -> str:
    """A string the backend chose, whole secrets out ("" for anything else)."""
    return scrub(value, secrets) if value.__class__ is str and secrets else _text(value)


def decode_usage(usage: dict[str, Any]) -> Usage:
    prompt = _dict(usage.get("prompt_tokens_details"))
    completion = _dict(usage.get("completion_tokens_details"))
    return Usage(
        input_tokens=_int(usage.get("prompt_tokens")),
        output_tokens=_int(usage.get("completion_tokens")),
        cached_tokens=_int(prompt.get("cached_tokens"))
        or _int(usage.get("prompt_cache_hit_tokens")),
        cache_write_tokens=(
            _int(prompt.get("cache_write_tokens"))
            or _int(prompt.get("cache_creation_tokens"))
            or _int(usage.get("cache_creation_input_tokens"))
            or _int(usage.get("cache_write_tokens"))
        ),
        reasoning_tokens=_int(completion.get("reasoning_tokens"))
        or _int(usage.get("reasoning_tokens")),
    )


def _message_deltas(delta: dict[str, Any], out: list[Delta]) -> None:
    reasoning = delta.get("reasoning_content")  # DeepSeek, Kimi, llama.cpp, SGLang
    if not (reasoning and isinstance(reasoning, str)):
        reasoning = delta.get("reasoning")  # vLLM >= 0.10, Ollama, OpenRouter
    if not (reasoning and isinstance(reasoning, str)):
        reasoning = _details_text(delta.get("reasoning_details"))  # OpenRouter, Kimi
    if reasoning and isinstance(reasoning, str):
        out.append(ReasoningDelta(reasoning))
    content = delta.get("content")
    if content:
        text = content if isinstance(content, str) else _parts_text(content)
        if text:
            out.append(TextDelta(text))
    annotations = delta.get("annotations")  # OpenAI's search models, OpenRouter's :online
    if annotations and isinstance(annotations, list):
        out += [Annotation(chat_annotation(a)) for a in annotations if isinstance(a, dict)]
    refusal = delta.get("refusal")
    if refusal and isinstance(refusal, str):
        out.append(RefusalDelta(refusal))
    tool_calls = delta.get("tool_calls")
    if tool_calls and isinstance(tool_calls, list):
        for position, call in enumerate(tool_calls):
            if isinstance(call, dict):
                out.append(_tool_call(call, position))


_CITATION_FIELDS = {"url": "", "title": "", "start_index": 0, "end_index": 0}


def chat_annotation(annotation: dict[str, Any]) -> dict[str, Any]:
    """A Chat annotation in the Responses shape: Chat nests its fields under its type
    (`{"type": "url_citation", "url_citation": {url, title, start_index, end_index}}`),
    Responses has them flat. A citation missing one of its fields gets it empty (the
    Responses one requires all four); other fields and types are kept as they are."""
    kind = annotation.get("type")
    inner = annotation.get(kind) if isinstance(kind, str) else None
    flat = {"type": kind, **inner} if isinstance(inner, dict) else dict(annotation)
    if kind == "url_citation":
        for key, empty in _CITATION_FIELDS.items():
            if not isinstance(flat.get(key), type(empty)) or isinstance(flat.get(key), bool):
                flat[key] = empty
    return flat


def _logged(out: list[Delta], choice: dict[str, Any]) -> None:
    """The choice's text delta (the last one in `out`, if any) with its tokens' logprobs."""
    logprobs = choice_logprobs(choice)
    if not logprobs:
        return
    for i in range(len(out) - 1, -1, -1):
        delta = out[i]
        if delta.__class__ is TextDelta:
            out[i] = LoggedText(delta.text, logprobs)
            return


def _tool_call(call: dict[str, Any], position: int) -> ToolCallDelta | UpstreamError:
    index = call.get("index")
    if not isinstance(index, int) or isinstance(index, bool):
        index = position
    function = _dict(call.get("function"))
    arguments = function.get("arguments")
    if arguments is None:
        arguments = ""
    elif not isinstance(arguments, str):  # Ollama sends an object, not a string
        if too_deep(arguments, MAX_ITEM_DEPTH):
            message = f"The backend sent a call's arguments nested more than {MAX_ITEM_DEPTH} levels deep."
            return UpstreamError(INVALID_CHUNK, message)
        arguments = orjson.dumps(arguments).decode()
    call_id = call.get("id")
    name = function.get("name")
    return ToolCallDelta(
        index=index,
        id=call_id if isinstance(call_id, str) and call_id else None,
        name=name if isinstance(name, str) and name else None,
        arguments=arguments,
    )


_DETAIL_TEXT = {"reasoning.text": "text", "reasoning.summary": "summary"}


def _details_text(details: Any) -> str:
    """The readable text of `reasoning_details` (encrypted entries carry none)."""
    if not isinstance(details, list):
        return ""
    out = []
    for detail in details:
        if isinstance(detail, dict):
            key = _DETAIL_TEXT.get(detail.get("type"), "text")  # type: ignore[arg-type]
            if isinstance(detail.get(key), str):
                out.append(detail[key])
    return "".join(out)


def _parts_text(content: Any) -> str:
    """Content given as a list of `{"type": "text", "text": ...}` parts."""
    if not isinstance(content, list):
        return ""
    return "".join(
        part["text"]
        for part in content
        if isinstance(part, dict) and isinstance(part.get("text"), str)
    )


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0
