"""The request's top-level shape, checked with OpenAI's messages, codes and `param` paths
(pure).

One table names each field's JSON type; the pass that finds nothing wrong (nearly every
request) looks only at the fields the body has, and only a wrong body pays for the search
for the first wrong field in the table's order.
"""

from __future__ import annotations

from typing import Any

from streamer.core.errors import RequestError, invalid
from streamer.core.output_items import SUMMARIES
from streamer.core.request_fields import MAX_TOP_LOGPROBS, check_fields

_TYPES: tuple[tuple[str, type | tuple[type, ...], str], ...] = (
    ("model", str, "a string"),
    ("instructions", str, "a string"),
    ("tools", list, "an array"),
    ("tool_choice", (str, dict), "a string or an object"),
    ("stream", bool, "a boolean"),
    ("store", bool, "a boolean"),
    ("background", bool, "a boolean"),
    ("parallel_tool_calls", bool, "a boolean"),
    ("previous_response_id", str, "a string"),
    ("metadata", dict, "an object"),
    ("text", dict, "an object"),
    ("reasoning", dict, "an object"),
    ("max_output_tokens", int, "an integer"),
    ("temperature", (int, float), "a number"),
    ("top_p", (int, float), "a number"),
    ("presence_penalty", (int, float), "a number"),
    ("frequency_penalty", (int, float), "a number"),
    # echoed into the Response as sent: a wrong type would make the Response itself invalid
    ("truncation", str, "a string"),
    ("service_tier", str, "a string"),
    ("user", str, "a string"),
    ("safety_identifier", str, "a string"),
    ("prompt_cache_key", str, "a string"),
    ("prompt_cache_retention", str, "a string"),
    ("max_tool_calls", int, "an integer"),
    ("top_logprobs", int, "an integer"),
    ("prompt", dict, "an object"),
    ("include", list, "an array"),
    ("conversation", (str, dict), "a string or an object"),
    ("reasoning.effort", str, "a string"),
    ("reasoning.summary", str, "a string"),
    ("text.format", dict, "an object"),
    ("text.verbosity", str, "a string"),
)
_TRUNCATION = ("auto", "disabled")
# Numbers OpenAI bounds (its API reference, the openai SDK's types), with its bounds: a value
# outside is a 400 naming the field, with OpenAI's message and code (`decimal_*` for the
# number fields, `integer_*` for the integer ones). None: no bound on that side.
_RANGES: tuple[tuple[str, float | None, float | None], ...] = (
    ("temperature", 0, 2),
    ("top_p", 0, 1),
    ("presence_penalty", -2, 2),
    ("frequency_penalty", -2, 2),
    ("max_output_tokens", 16, None),
    ("max_tool_calls", 1, None),
    ("top_logprobs", 0, MAX_TOP_LOGPROBS),
)
_INTEGERS = frozenset(name for name, kind, _ in _TYPES if kind is int)
# Strings OpenAI bounds by length, in characters (`input` when it is one string).
_LENGTHS = (("input", 10_485_760), ("prompt_cache_key", 64), ("safety_identifier", 128))
# `metadata`: at most 16 pairs, keys of at most 64 characters, values of at most 512.
MAX_METADATA_PAIRS, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512
_FORMATS = ("text", "json_object", "json_schema")
# Parameters that need OpenAI-hosted state this gateway does not have.
_UNSUPPORTED = (
    ("prompt", "Stored prompt templates are not supported by this gateway; send 'instructions'."),
)


# The same table by field, for the pass that finds nothing wrong (nearly every request)
# looking only at the fields the body has.
_TOP = {name: kind for name, kind, _ in _TYPES if "." not in name}
_NESTED: dict[str, dict[str, type | tuple[type, ...]]] = {}
for _name, _kind, _ in _TYPES:
    if "." in _name:
        _parent, _, _child = _name.partition(".")
        _NESTED.setdefault(_parent, {})[_child] = _kind


def _all_typed(body: dict[str, Any]) -> bool:
    for name, value in body.items():
        kind = _TOP.get(name)
        if kind is None or value is None:
            continue
        if not _is(value, kind):
            return False
        nested = _NESTED.get(name)
        if nested is not None:
            for child, kind in nested.items():
                inner = value.get(child)
                if inner is not None and not _is(inner, kind):
                    return False
    return True


def _field(body: dict[str, Any], path: str) -> Any:
    """`a.b`: body["a"]["b"], None when absent (parents are type-checked first)."""
    head, _, tail = path.partition(".")
    value = body.get(head)
    return value.get(tail) if tail and isinstance(value, dict) else (None if tail else value)


def _is(value: Any, kind: type | tuple[type, ...]) -> bool:
    if isinstance(value, bool):  # JSON true is not a number
        return kind is bool or (isinstance(kind, tuple) and bool in kind)
    return isinstance(value, kind)


def _check_format(fmt: dict[str, Any]) -> None:
    """`text.format`: one of the three Responses formats (echoed in the Response as sent)."""
    kind = fmt.get("type")
    if kind not in _FORMATS:
        raise invalid(
            f"Invalid value for 'text.format.type': {kind!r}. "
            "Supported values are: 'text', 'json_object' and 'json_schema'.",
            "text.format.type",
            "invalid_value",
        )
    if kind == "json_schema" and not isinstance(fmt.get("name"), str):
        raise invalid(
            "Missing required parameter: 'text.format.name'.",
            "text.format.name",
            "missing_required_parameter",
        )


def _check_ranges(body: dict[str, Any]) -> None:
    """Numbers within OpenAI's bounds and strings within its lengths, with its messages and
    codes (types are checked first)."""
    for name, low, high in _RANGES:
        value = body.get(name)
        if value is None:
            continue
        kind = "integer" if name in _INTEGERS else "decimal"
        if low is not None and value < low:
            what, bound, code = "below minimum", f">= {low:g}", f"{kind}_below_min_value"
        elif high is not None and value > high:
            what, bound, code = "above maximum", f"<= {high:g}", f"{kind}_above_max_value"
        else:
            continue
        raise invalid(
            f"Invalid '{name}': {kind} {what} value. "
            f"Expected a value {bound}, but got {value} instead.",
            name,
            code,
        )
    for name, longest in _LENGTHS:
        value = body.get(name)
        if isinstance(value, str) and len(value) > longest:
            raise _too_long(name, value, longest)


def _too_long(param: str, value: str, longest: int) -> RequestError:
    return invalid(
        f"Invalid '{param}': string too long. Expected a string with maximum length "
        f"{longest}, but got a string with length {len(value)} instead.",
        param,
        "string_above_max_length",
    )


def check_metadata(metadata: dict[str, Any]) -> None:
    """`metadata` as OpenAI bounds it (a Response's, a conversation's): at most 16 pairs of
    strings, keys of at most 64 characters, values of at most 512."""
    if len(metadata) > MAX_METADATA_PAIRS:
        raise invalid(
            f"Invalid 'metadata': too many properties. Expected an object with at most "
            f"{MAX_METADATA_PAIRS} properties, but got an object with {len(metadata)} "
            "properties instead.",
            "metadata",
            "object_above_max_properties",
        )
    for key, value in metadata.items():
        if not isinstance(value, str):
            raise invalid(
                f"Invalid type for 'metadata.{key}': expected a string.",
                f"metadata.{key}",
                "invalid_type",
            )
        if len(key) > MAX_METADATA_KEY:
            raise invalid(
                f"Invalid property name in 'metadata': '{key}' is too long. Expected a string "
                f"with maximum length {MAX_METADATA_KEY}, but got a string with length "
                f"{len(key)} instead.",
                f"metadata.{key}",
                "property_name_above_max_length",
            )
        if len(value) > MAX_METADATA_VALUE:
            raise _too_long(f"metadata.{key}", value, MAX_METADATA_VALUE)


def validate_request(body: Any, *, model_required: bool = True) -> dict[str, Any]:
    """Top-level shape checks with OpenAI's messages and `param` names."""
    if not isinstance(body, dict):
        raise invalid("The request body must be a JSON object.")
    if not _all_typed(body):  # then the first wrong field, in the table's order
        for name, kind, what in _TYPES:
            value = _field(body, name)
            if value is not None and not _is(value, kind):
                raise invalid(f"Invalid type for '{name}': expected {what}.", name, "invalid_type")
    if body.get("truncation") not in (None, *_TRUNCATION):
        raise invalid(
            f"Invalid value for 'truncation': {body['truncation']!r}. "
            "Supported values are: 'auto' and 'disabled'.",
            "truncation",
            "invalid_value",
        )
    summary = _field(body, "reasoning.summary")
    if summary is not None and summary not in SUMMARIES:
        raise invalid(
            f"Invalid value for 'reasoning.summary': {summary!r}. "
            "Supported values are: 'auto', 'concise' and 'detailed'.",
            "reasoning.summary",
            "invalid_value",
        )
    _check_ranges(body)
    fmt = _field(body, "text.format")
    if fmt is not None:
        _check_format(fmt)
    check_metadata(body.get("metadata") or {})
    if model_required and not body.get("model"):
        raise invalid("Missing required parameter: 'model'.", "model", "missing_required_parameter")
    if body.get("previous_response_id") and body.get("conversation"):
        raise invalid(
            "'previous_response_id' cannot be used together with 'conversation'.",
            "previous_response_id",
        )
    for name, message in _UNSUPPORTED:
        if body.get(name) is not None:  # ignoring these would silently change the answer
            raise invalid(message, name, "unsupported_parameter")
    check_fields(body)
    return body
