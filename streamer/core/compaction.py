"""Remote compaction and the sealed items it restores (pure).

A request whose last input item is `{"type": "compaction_trigger"}` (Codex's remote
compaction v2) and `POST /v1/responses/compact` are one turn like any other: the history
is lowered as usual, the tools are left out, and a handover prompt is appended as the
last user message. The backend's text becomes the summary; `Compactor` keeps it out of
the output and, at the end of the answer, hands the `OutputItemStreamer` exactly one
`compaction` item whose `encrypted_content` seals the summary (streamer/core/sealing.py). Usage
is the backend's, as for any turn.

On replay (`restore`), a `compaction` item becomes a user message with its summary, a
reasoning item whose readable content the client dropped gets it back from its sealed
`encrypted_content`, and what a compaction replaced (the items before the trigger it
answered, when a continuation still holds them) is left out of what the backend sees,
system and developer messages aside. Restoring keeps one item per input item, so
lowering's `param` paths stay the client's.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from streamer.core.backend_tools import BACKEND_BLOB
from streamer.core.batch import Batch
from streamer.core.deltas import Delta, Finish, TextDelta, UpstreamError, Usage, WholeItem
from streamer.core.errors import RequestError, invalid
from streamer.core.lowering import LoweringOptions, lower, normalize_input
from streamer.core.response import new_id
from streamer.core.sealing import Sealer
from streamer.core.tools import ResponsesToolNames

TRIGGER = "compaction_trigger"
COMPACTION_TYPES = ("compaction", "compaction_summary")  # the older name, still read by Codex
SUMMARY_FIELD = "summary"
REASONING_FIELD = "text"
BACKEND_FIELD = "backend"  # a Responses backend's own encrypted_content, sealed with the text

HANDOVER_PROMPT = """\
[Context compaction, from the gateway: no tools are available for this reply]
This conversation is about to be cut, and the work will go on in a fresh context that \
sees only what you write now (and the user's messages). Write a handover note for the \
engineer who takes the task over, in plain text with these headings:

Goal: what the user wants done overall, and any constraints or preferences they stated.
Progress: what has been done so far, step by step, with the results that matter \
(commands run and their outcomes, errors met and how they were solved).
Decisions: choices made and why, so they are not reopened.
Files touched: every file read, created or changed, with one line on each.
Current state: where the work stands right now, and what was being done at the cut.
Open questions: what is unresolved, uncertain, or waiting on the user.
Next step: the very next thing to do.

Be concrete: exact paths, names, identifiers, values and commands. Do not call tools, \
do not address the user, do not continue the task: write only the note."""

SUMMARY_HEADING = (
    "[Summary of the earlier part of this conversation, written to hand the task over to "
    "a fresh context; the messages it replaced are no longer shown]"
)
LAST_REQUEST_HEADING = "The user's last request, verbatim:"
_PLACEHOLDER = {"type": "compaction_replaced"}  # lowering skips item types it does not know
_CHAT_KEYS_DROPPED = ("tools", "tool_choice", "parallel_tool_calls", "response_format")


def is_compaction(items: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the turn is a compaction: its last input item is the trigger."""
    return bool(items) and items[-1].get("type") == TRIGGER


# -- replay ---------------------------------------------------------------------------


def restore(
    items: list[dict[str, Any]],
    sealer: Sealer,
    *,
    offset: int = 0,
    owner: str = "",
    start: int = 0,
) -> list[dict[str, Any]]:
    """What the backend is shown of `items`: sealed items opened (a 400 naming one that does
    not open, or was sealed for another `owner`), what a compaction replaced left out.
    `offset`: how many leading items of the turn's input are history (a failure there
    names `previous_response_id`); `start`: the index of `items[0]` in it (`items` is its
    tail, whose head is opened already: then it holds no compaction, which would reach
    back into the head)."""
    for item in items:  # (the scan of every history: a loop of lookups, no calls)
        if item.get("type") in _MAYBE_SEALED and _sealed(item):
            break
    else:
        return items
    view = list(items)
    for i, item in enumerate(items):
        kind, at = item.get("type"), start + i
        if kind in COMPACTION_TYPES:
            blob = item.get("encrypted_content")
            summary = sealer.open(
                "compaction", SUMMARY_FIELD, blob, _param(at, offset), owner=owner
            )
            view[i] = summary_message(summary)
            _drop_replaced(view, i)
        elif kind == "reasoning" and item.get("encrypted_content") is not None:
            opened = _open_reasoning(item, sealer, _param(at, offset), at < offset, owner)
            if opened is not None:
                view[i] = opened
    return view


def _open_reasoning(
    item: dict[str, Any], sealer: Sealer, param: str, stored: bool, owner: str
) -> dict[str, Any] | None:
    """A sealed reasoning item as the backend is shown it: its text (if it shows none),
    and a Responses backend's own blob sealed with it (`BACKEND_FIELD`); None: as it is.
    A stored item that keeps its text needs its blob only for the backend's: one that does
    not open (another key) is left as it is."""
    readable = _readable(item)
    try:
        blob = item["encrypted_content"]
        fields = sealer.open_fields("reasoning", REASONING_FIELD, blob, param, owner=owner)
    except RequestError:
        if stored and readable:
            return None
        raise
    text, backend = fields[REASONING_FIELD], fields.get(BACKEND_FIELD)
    if (readable or not text) and not isinstance(backend, str):
        return None
    out = dict(item)
    if not readable and text:
        out["content"] = [{"type": "reasoning_text", "text": text}]
    if isinstance(backend, str):
        out[BACKEND_BLOB] = backend
    return out


def summary_message(summary: str) -> dict[str, Any]:
    text = f"{SUMMARY_HEADING}\n\n{summary}"
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


_MAYBE_SEALED = frozenset((*COMPACTION_TYPES, "reasoning"))


def _sealed(item: Mapping[str, Any]) -> bool:
    kind = item.get("type")
    return kind in COMPACTION_TYPES or (
        kind == "reasoning" and item.get("encrypted_content") is not None
    )


def _param(index: int, offset: int) -> str:
    if index < offset:
        return "previous_response_id"  # a stored item: the client cannot name it otherwise
    return f"input[{index - offset}].encrypted_content"


def _readable(item: Mapping[str, Any]) -> bool:
    content = item.get("content")
    if not isinstance(content, list):  # a replayed item is tolerated as sent: no parts here
        return False
    for part in content:
        if isinstance(part, dict) and part.get("type") == "reasoning_text" and part.get("text"):
            return True
    return False


def _drop_replaced(view: list[dict[str, Any]], index: int) -> None:
    """The compaction at `index` answered the trigger just before it: what came before that
    trigger is what its summary replaced (system and developer messages stay)."""
    if index == 0 or view[index - 1].get("type") != TRIGGER:
        return
    for j in range(index - 1):
        item = view[j]
        if item.get("type") == "message" and item.get("role") in ("system", "developer"):
            continue
        view[j] = _PLACEHOLDER


# -- the compaction turn --------------------------------------------------------------


def compaction_request(
    request: Mapping[str, Any],
    view: list[dict[str, Any]],
    names: ResponsesToolNames,
    options: LoweringOptions,
) -> dict[str, Any]:
    """The Chat request of a compaction turn: the history (the trigger aside), no tools,
    then the handover prompt as the last user message."""
    chat = lower(request, view[:-1], names, options)
    for key in _CHAT_KEYS_DROPPED:
        chat.pop(key, None)
    chat["messages"].append({"role": "user", "content": HANDOVER_PROMPT})
    return chat


def last_user_request(items: Sequence[Mapping[str, Any]]) -> str:
    """The text of the last user message, as the user wrote it ("" if none)."""
    for item in reversed(items):
        if item.get("type") == "message" and item.get("role") == "user":
            content = item.get("content")
            if isinstance(content, str):
                return content
            texts = [
                p["text"]
                for p in content or ()
                if isinstance(p, dict) and isinstance(p.get("text"), str)
            ]
            return "\n".join(texts)
    return ""


class Compactor:
    """Between the backend's answer and the streamer: the text is kept as the summary
    (within `max_chars`, then `exceeded`), other output left out; `item()` is the one
    compaction item, made at the end."""

    __slots__ = ("_made", "_texts", "exceeded", "last_request", "left", "owner", "sealer")

    def __init__(self, sealer: Sealer, last_request: str, max_chars: int, owner: str = "") -> None:
        self.sealer = sealer
        self.owner = owner  # whose turn: the item opens for this client only
        self.last_request = last_request
        self.left = max_chars
        self.exceeded = False
        self._texts: list[str] = []
        self._made = False

    def __call__(self, batch: Batch) -> Batch:
        kept: list[Delta] = []
        for delta in batch:
            if isinstance(delta, TextDelta):
                self._keep(delta.text)
            elif isinstance(delta, Finish | Usage | UpstreamError):
                kept.append(delta)
            # reasoning, refusals and tool calls are not part of a compaction's output
        return Batch(kept, end=batch.end)

    def _keep(self, text: str) -> None:
        if len(text) > self.left:
            text, self.exceeded = text[: self.left], True
        self.left -= len(text)
        self._texts.append(text)

    def summary(self) -> str:
        summary = "".join(self._texts).strip() or "(The model wrote no summary.)"
        if self.last_request:
            summary += f"\n\n{LAST_REQUEST_HEADING}\n{self.last_request}"
        return summary

    def item(self) -> list[Delta]:
        """The compaction item, once (an empty list after)."""
        if self._made:
            return []
        self._made = True
        sealed = self.sealer.seal("compaction", SUMMARY_FIELD, self.summary(), owner=self.owner)
        return [WholeItem({"id": new_id("cmp"), "type": "compaction", "encrypted_content": sealed})]

    def wrap(
        self, next_batch: Callable[[], Awaitable[Batch]], first: Batch | None
    ) -> tuple[Callable[[], Awaitable[Batch]], Batch | None]:
        """A stream's reader and first batch, filtered."""

        async def filtered() -> Batch:
            return self(await next_batch())

        return filtered, (None if first is None else self(first))


# -- POST /v1/responses/compact ---------------------------------------------------------


_NOT_COMPACT = ("stream", "background", "tools", "tool_choice", "parallel_tool_calls")


def compaction_body(body: Any) -> dict[str, Any]:
    """A `/v1/responses/compact` body as the compaction turn it asks for (not stored)."""
    if not isinstance(body, dict):
        raise invalid("The request body must be a JSON object.")
    turn = {k: v for k, v in body.items() if k not in _NOT_COMPACT}
    turn["input"] = [*normalize_input(body.get("input")), {"type": TRIGGER}]
    turn["store"] = False
    return turn


def compacted(response: Mapping[str, Any], items: Sequence[Mapping[str, Any]]) -> Any:
    """The `response.compaction` object of a finished compaction turn: the user messages of
    its input, then its compaction item (what the next request starts from). A turn that
    made none is an error: the backend's, or a cut summary (502)."""
    made = [i for i in response.get("output") or () if i.get("type") == "compaction"]
    if not made:
        error = response.get("error") or {}
        message = error.get("message") or "The summary went past the gateway's output limit."
        code = error.get("code") or "compaction_incomplete"
        raise RequestError(
            f"The compaction did not finish: {message}", status=502, type="server_error", code=code
        )
    output: list[dict[str, Any]] = []
    for item in items:
        if item.get("type") == "message" and item.get("role") == "user":
            content = item["content"]
            if isinstance(content, str):
                content = [{"type": "input_text", "text": content}]
            output.append({"type": "message", "role": "user", "content": content})
    output.extend(made)
    return {
        "id": response["id"],
        "object": "response.compaction",
        "created_at": response["created_at"],
        "output": output,
        "usage": response.get("usage"),
    }
