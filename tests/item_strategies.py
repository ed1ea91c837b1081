"""Hypothesis strategies for Responses input items: the tool loop's two items in plain and
odd shapes, messages, reasoning, and the rest, so that the plain paths of validation and
lowering meet every shape they must leave to the general path (tests/test_plain_paths.py,
tests/test_history_reuse.py)."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

TEXT = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=8)
CALL_IDS = st.sampled_from(["c1", "c2", "call_3"])
NAMESPACES = st.sampled_from([None, "mcp__a", "mcp__b", "functions", "run"])
NAMES = st.sampled_from(["run", "exec", "mcp__a__run", "search"])
ARGUMENTS = st.sampled_from(['{"q":1}', "{}", "", "  ", '{"q":', "[1,2]", '"s"', '{"a":{"b":[]}}'])

TOOLS: list[dict[str, Any]] = [
    {"type": "function", "name": "search", "parameters": {"type": "object"}},
    {
        "type": "namespace",
        "name": "mcp__a",
        "description": "A.",
        "tools": [{"type": "function", "name": "run", "parameters": {"type": "object"}}],
    },
    {"type": "custom", "name": "apply"},
]


def _maybe(key: str, value: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """`{key: value}` or nothing."""
    return st.one_of(st.just({}), value.map(lambda v: {key: v}))


def _item(kind: str, **fields: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    parts = [_maybe(k, v) for k, v in fields.items()]
    return st.tuples(*parts).map(
        lambda ds: {"type": kind, **{k: v for d in ds for k, v in d.items()}}
    )


def _plain_call() -> st.SearchStrategy[dict[str, Any]]:
    return st.builds(
        lambda call_id, name, ns, args: {
            "type": "function_call", "call_id": call_id, "name": name,
            **({"namespace": ns} if ns is not None else {}), "arguments": args,
        },
        CALL_IDS, NAMES, NAMESPACES, ARGUMENTS,
    )  # fmt: skip


def _plain_output() -> st.SearchStrategy[dict[str, Any]]:
    return st.builds(
        lambda call_id, output: {
            "type": "function_call_output",
            "call_id": call_id,
            "output": output,
        },
        CALL_IDS,
        TEXT,
    )


_PART = st.one_of(
    st.builds(lambda t: {"type": "input_text", "text": t}, TEXT),
    st.builds(lambda t: {"type": "output_text", "text": t}, TEXT),
    st.just({"type": "input_image", "image_url": "data:image/png;base64,AAAA"}),
    st.just({"type": "input_image", "image_url": "https://x/y.png", "detail": "low"}),
    st.just({"type": "input_file", "file_data": "AAAA", "filename": "a.txt"}),
    st.just({"type": "input_text"}),
    st.just({"type": "nope", "text": "x"}),
)
_ODD = st.one_of(st.none(), st.integers(-1, 2), st.just(""), st.just([]), st.just({}))


def odd_items() -> st.SearchStrategy[dict[str, Any]]:
    """The general path's shapes: fields missing or of the wrong type, parts, other kinds."""
    return st.one_of(
        _item(
            "function_call", call_id=st.one_of(CALL_IDS, _ODD), name=st.one_of(NAMES, _ODD),
            namespace=st.one_of(NAMESPACES, _ODD), arguments=st.one_of(ARGUMENTS, _ODD),
        ),
        _item("function_call_output", call_id=st.one_of(CALL_IDS, _ODD),
              output=st.one_of(TEXT, st.lists(_PART, max_size=3), _ODD)),
        _item("message", role=st.sampled_from(["user", "assistant", "system", "developer", "x"]),
              content=st.one_of(TEXT, st.lists(_PART, max_size=3), _ODD)),
        st.builds(lambda r, c: {"role": r, "content": c},
                  st.sampled_from(["user", "assistant", "system"]), TEXT),
        _item("reasoning", summary=st.just([{"type": "summary_text", "text": "thinking"}]),
              content=st.just([{"type": "reasoning_text", "text": "deep"}])),
        _item("custom_tool_call", call_id=CALL_IDS, name=st.sampled_from(["apply", "x"]),
              input=st.one_of(TEXT, _ODD)),
        _item("custom_tool_call_output", call_id=CALL_IDS, output=st.one_of(TEXT, _ODD)),
        _item("tool_search_call", call_id=st.one_of(CALL_IDS, st.none()),
              arguments=st.just({"query": "q"})),
        st.just({"type": "unknown_kind", "x": 1}),
    )  # fmt: skip


def items(
    odd: bool = True, max_size: int = 24, min_size: int = 0
) -> st.SearchStrategy[list[dict[str, Any]]]:
    """Histories: mostly the plain tool loop, with messages and (if `odd`) odd shapes."""
    message = st.builds(
        lambda role, text: {"type": "message", "role": role, "content": text},
        st.sampled_from(["user", "assistant", "system", "developer"]),
        TEXT,
    )
    reasoning = st.builds(
        lambda text: {"type": "reasoning", "summary": [{"type": "summary_text", "text": text}]},
        st.sampled_from(["", "thinking"]),
    )
    kinds = [_plain_call(), _plain_output(), _plain_output(), message, reasoning]
    if odd:
        kinds.append(odd_items())
    return st.lists(st.one_of(*kinds), min_size=min_size, max_size=max_size)
