"""A Responses request -> the Messages request body (pure).

The messages are lowering.py's; around them:
- `max_tokens` (required): the request's `max_output_tokens`, else the model's
  (`max_output_tokens` of its `--config` entry, or of its `--model-metadata` entry, or of
  that file's defaults), else the profile's default;
- tools: `{name, description, input_schema}` with the naming core's flat names (namespaces
  flattened, restored by the decoder's deltas through the same map); `tool_choice` auto /
  required / none / one tool -> `auto` / `any` / `none` / `{type: tool, name}`, an allowed
  list as the narrowed tool list; `parallel_tool_calls: false` -> `disable_parallel_tool_use`;
  a request without tools whose history calls some declares those (the API refuses
  tool_use blocks otherwise) with `tool_choice: none`;
- `reasoning.effort` -> `thinking` with the profile's budget for it (capped to leave a
  quarter of `max_tokens` for the answer; off when under the API's least), or adaptive
  thinking with `output_config.effort` for the models the profile says take only that.
  Budgeted thinking cannot be combined with a forced tool (the API's rule): a forced tool
  wins, and so does a tool loop whose last call was made without thinking (the API wants a
  thinking block first in it). With thinking on, `temperature` and `top_p` are not sent
  (the API takes neither with thinking);
- `temperature` (capped at the API's 1), `top_p`, `stop` (a string or a list, as Chat's) ->
  `stop_sequences`, `safety_identifier` (or `user`) -> `metadata.user_id`;
- `text.format` json_schema -> `output_config.format` where the profile takes it (else a
  400), json_object a 400 (the API has no JSON mode); logprobs a 400;
- `cache_control` breakpoints where the profile honours them, when the request has a
  `prompt_cache_key` or its prefix is long enough to be cached: the last tool, the system
  prompt, and the last block of the last two user messages (the conversation so far, and
  what the next turn will find).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from streamer.core.compaction import HANDOVER_PROMPT
from streamer.core.errors import invalid
from streamer.core.lowering import LoweringOptions, nearest_effort
from streamer.core.request_fields import LOGPROBS, wants_logprobs
from streamer.core.tools import FlatTool, ResponsesToolNames
from streamer.upstream.anthropic.lowering import Message, messages
from streamer.upstream.anthropic.profiles import ADAPTIVE_EFFORTS, MessagesProfile, messages_profile

EPHEMERAL = {"type": "ephemeral"}
CACHE_MIN_CHARS = 4096  # ~1024 tokens, the shortest prefix the API caches
_NOT_CACHED = ("thinking", "redacted_thinking")
PROMPT_KEYS = ("system", "messages", "tools")
DEFAULT_OPTIONS = LoweringOptions()


def lower_messages(
    request: Mapping[str, Any],
    items: list[dict[str, Any]],
    names: ResponsesToolNames,
    options: LoweringOptions = DEFAULT_OPTIONS,
) -> dict[str, Any]:
    """The Messages request for `request`, whose effective input is `items`."""
    profile = messages_profile(options.profile)
    if wants_logprobs(request):
        param = "include" if LOGPROBS in (request.get("include") or ()) else "top_logprobs"
        raise invalid(
            "Logprobs are not supported by an Anthropic Messages backend.",
            param,
            "unsupported_parameter",
        )
    system, turns = messages(items, names, profile, request.get("instructions"))
    model = options.model or request.get("model")
    body: dict[str, Any] = {"model": model} if model else {}
    body["max_tokens"] = _max_tokens(request, options, profile)
    if system:
        body["system"] = [{"type": "text", "text": "\n\n".join(system)}]
    body["messages"] = turns
    tools, forced = _tools(request, names)
    body.update(tools or _history_tools(turns))
    thinking = _thinking(request, profile, model, body["max_tokens"], forced, turns)
    body.update(thinking)
    body.update(_sampling(request, thinking_on=bool(thinking)))
    _output_format(request, profile, body)
    if profile.cache_control and (request.get("prompt_cache_key") or _long(body)):
        _breakpoints(body)
    return body


def compaction_request(
    request: Mapping[str, Any],
    view: list[dict[str, Any]],
    names: ResponsesToolNames,
    options: LoweringOptions = DEFAULT_OPTIONS,
) -> dict[str, Any]:
    """A compaction turn: the history (the trigger aside), then the handover prompt as the
    last user message; the tools stay declared (the history's tool_use blocks need them)
    with `tool_choice: none`, and no format."""
    asked = {k: v for k, v in request.items() if k not in ("text", "parallel_tool_calls")}
    asked["tool_choice"] = "none"
    prompt = {"type": "input_text", "text": HANDOVER_PROMPT}
    handover = {"type": "message", "role": "user", "content": [prompt]}
    return lower_messages(asked, [*view[:-1], handover], names, options)


def _max_tokens(
    request: Mapping[str, Any], options: LoweringOptions, profile: MessagesProfile
) -> int:
    given = request.get("max_output_tokens")  # its range is request_checks.py's
    if given is not None:
        return int(given)
    model = request.get("model")
    for slug, limit in options.output_limits:
        if slug == model:
            return limit
    return options.max_output_tokens or profile.max_tokens


# -- tools --------------------------------------------------------------------------------


def _tools(request: Mapping[str, Any], names: ResponsesToolNames) -> tuple[dict[str, Any], bool]:
    """`tools` and `tool_choice`, and whether a call is forced."""
    choice = names.resolve_choice(request.get("tool_choice"))  # 400s even with no tools
    tools = names.tools
    tool_choice: dict[str, Any] = {"type": {"required": "any"}.get(choice.mode, choice.mode)}
    if choice.allowed is not None:
        if len(choice.allowed) == 1 and choice.mode == "required":
            tool_choice = {"type": "tool", "name": choice.allowed[0]}
        allowed = set(choice.allowed)
        tools = [t for t in tools if t.name in allowed]
    if not tools:
        return {}, False
    if request.get("parallel_tool_calls") is False and tool_choice["type"] != "none":
        tool_choice["disable_parallel_tool_use"] = True
    out = {"tools": [_tool(t) for t in tools], "tool_choice": tool_choice}
    return out, tool_choice["type"] in ("any", "tool")


def _history_tools(turns: list[Message]) -> dict[str, Any]:
    """A request that declares no tools but replays calls: the API refuses tool_use blocks
    without tools, so the names the history calls are declared, and none may be called."""
    used = {
        b["name"]: None
        for message in turns
        for b in message["content"]
        if b.get("type") == "tool_use"
    }
    if not used:
        return {}
    declared = [{"name": name, "input_schema": {"type": "object"}} for name in used]
    return {"tools": declared, "tool_choice": {"type": "none"}}


def _tool(tool: FlatTool) -> dict[str, Any]:
    out: dict[str, Any] = {"name": tool.name}
    if tool.description:
        out["description"] = tool.description
    schema = tool.parameters if isinstance(tool.parameters, dict) else {}
    out["input_schema"] = {"type": "object", **schema} if "type" not in schema else schema
    return out


# -- thinking and sampling ----------------------------------------------------------------


def _thinking(
    request: Mapping[str, Any],
    profile: MessagesProfile,
    model: Any,
    max_tokens: int,
    forced: bool,
    turns: list[Message],
) -> dict[str, Any]:
    reasoning = request.get("reasoning")
    effort = reasoning.get("effort") if isinstance(reasoning, Mapping) else None
    if not isinstance(effort, str) or effort == "none" or profile.thinking == "none":
        return {}
    if profile.adaptive(model):
        adaptive = nearest_effort(effort, ADAPTIVE_EFFORTS) or "high"
        return {"thinking": {"type": "adaptive"}, "output_config": {"effort": adaptive}}
    if forced or _unthought_loop(turns):
        return {}
    budgets = dict(profile.budgets)
    level = nearest_effort(effort, tuple(budgets))
    if level is None:
        return {}
    budget = min(budgets[level], max_tokens - max(1, max_tokens // 4))
    if budget < profile.min_budget:
        return {}
    return {"thinking": {"type": "enabled", "budget_tokens": budget}}


def _unthought_loop(turns: list[Message]) -> bool:
    """The request continues a tool loop whose last assistant message called tools without
    a thinking block first (the API refuses thinking then)."""
    if len(turns) < 2 or turns[-2]["role"] != "assistant":
        return False
    content = turns[-2]["content"]
    if not any(b.get("type") == "tool_use" for b in content):
        return False
    return not content or content[0].get("type") not in _NOT_CACHED


def _sampling(request: Mapping[str, Any], *, thinking_on: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if not thinking_on:
        if request.get("temperature") is not None:
            out["temperature"] = min(float(request["temperature"]), 1.0)
        if request.get("top_p") is not None:
            out["top_p"] = request["top_p"]
    stop = request.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None:
        if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
            raise invalid(
                "Invalid type for 'stop': expected a string or an array of strings.",
                "stop",
                "invalid_type",
            )
        out["stop_sequences"] = stop
    user = request.get("safety_identifier") or request.get("user")
    if isinstance(user, str) and user:
        out["metadata"] = {"user_id": user}
    return out


def _output_format(
    request: Mapping[str, Any], profile: MessagesProfile, body: dict[str, Any]
) -> None:
    text = request.get("text")
    fmt = text.get("format") if isinstance(text, Mapping) else None
    kind = fmt.get("type") if isinstance(fmt, Mapping) else None
    if kind in (None, "text"):
        return
    assert isinstance(fmt, Mapping)
    if kind == "json_schema" and profile.json_schema:
        schema = fmt.get("schema")
        if not isinstance(schema, Mapping):
            raise invalid(
                "Missing required parameter: 'text.format.schema' (an object).",
                "text.format.schema",
            )
        config = body.setdefault("output_config", {})
        config["format"] = {"type": "json_schema", "schema": dict(schema)}
        return
    raise invalid(
        f"text.format {kind!r} is not supported by this Anthropic Messages backend "
        f"(--backend-profile {profile.name}).",
        "text.format.type",
        "unsupported_parameter",
    )


# -- prompt caching -----------------------------------------------------------------------


def _long(body: Mapping[str, Any]) -> bool:
    """The prefix is long enough to be worth a cache write (an estimate, in characters)."""
    size = 0
    for key in PROMPT_KEYS:
        if key in body:
            size += len(orjson.dumps(body[key]))
            if size >= CACHE_MIN_CHARS:
                return True
    return False


def _breakpoints(body: dict[str, Any]) -> None:
    """At most 4 breakpoints (the API's limit): tools, system, two user messages."""
    if body.get("tools"):
        body["tools"][-1] = {**body["tools"][-1], "cache_control": EPHEMERAL}
    if body.get("system"):
        body["system"][-1] = {**body["system"][-1], "cache_control": EPHEMERAL}
    users = [m for m in body["messages"] if m["role"] == "user"][-2:]
    for message in users:
        content = message["content"]
        for i in range(len(content) - 1, -1, -1):
            if content[i].get("type") not in _NOT_CACHED and content[i].get("text") != "":
                content[i] = {**content[i], "cache_control": EPHEMERAL}
                break
