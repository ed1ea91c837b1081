"""Property tests for the naming core over random tool sets (hypothesis)."""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamer.core.tools import NamingConfig, ResolvedChoice, ResponsesToolNames, ToolIdentity

settings.register_profile(
    "tools",
    max_examples=120,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("tools-fuzz", max_examples=3000, deadline=None, database=None)
QUICK = settings.get_profile("tools")
FUZZ = settings.get_profile("tools-fuzz")

# Small alphabets make collisions (joins, sanitising, truncation) likely; the wide one
# brings unicode and punctuation. Lone surrogates are left out: orjson, which parses
# request bodies, rejects them, so they never reach a snapshot.
_small = st.text(alphabet="ab_", min_size=1, max_size=6)
_long = st.builds(lambda a, b: a * 12 + b, st.text("ab_", min_size=4, max_size=6), _small)
_odd = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=10)
names_st = st.one_of(_small, _small, _long, _odd, st.sampled_from(["functions", "a__b", "_x"]))

_member = st.tuples(st.sampled_from(["function", "custom"]), names_st)
_entry = st.one_of(
    _member,
    _member,
    st.tuples(st.just("namespace"), names_st, st.lists(_member, min_size=1, max_size=4)),
    st.just(("tool_search",)),
    st.just(("web_search",)),
)
_tool_list = st.lists(_entry, max_size=6)
config_st = st.builds(
    NamingConfig,
    style=st.sampled_from(["codex", "double-underscore", "llamacpp", "dotted"]),
    max_name_length=st.sampled_from([16, 24, 64]),
)


def build_list(raw: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
    """Turn raw entries into a valid tools list: duplicates within the list are dropped."""
    keys: set[tuple[str | None, str, bool]] = set()
    out: list[dict[str, Any]] = []

    def fresh(ns: str | None, kind: str, name: str) -> bool:
        key = (ns, name, kind == "tool_search")
        if key in keys:
            return False
        keys.add(key)
        return True

    for entry in raw:
        kind = entry[0]
        if kind in ("function", "custom"):
            if fresh(None, kind, entry[1]):
                out.append({"type": kind, "name": entry[1], "description": entry[1]})
        elif kind == "namespace":
            members = [
                {"type": k, "name": n, "parameters": {"type": "object"}}
                if k == "function"
                else {
                    "type": k,
                    "name": n,
                    "format": {"type": "grammar", "syntax": "lark", "definition": n},
                }
                for k, n in entry[2]
                if fresh(entry[1], k, n)
            ]
            if members:
                out.append(
                    {"type": "namespace", "name": entry[1], "description": "", "tools": members}
                )
        elif kind == "tool_search":
            if fresh(None, "tool_search", "tool_search"):
                out.append({"type": "tool_search", "execution": "client", "parameters": {}})
        else:
            out.append({"type": kind})
    return out


@st.composite
def requests(draw: st.DrawFn) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    raw = draw(_tool_list)
    # Top-level functions named like a member's joined name, declared after it: the
    # top-level one must keep its name and the member must move.
    joins = [
        ("function", sep.join((e[1], m[1])))
        for e in raw
        if e[0] == "namespace"
        for m in e[2]
        for sep in ("__", "")
    ]
    if joins:
        raw = raw + draw(st.lists(st.sampled_from(joins), max_size=3))
    tools = build_list(raw)
    items: list[dict[str, Any]] = []
    for _ in range(draw(st.integers(0, 2))):
        items.append({"type": "message", "role": "user", "content": "x"})
        kind = draw(st.sampled_from(["additional_tools", "tool_search_output"]))
        items.append({"type": kind, "tools": build_list(draw(_tool_list))})
    return tools, items


def expected_identities(tools: list[Any], items: list[Any]) -> list[ToolIdentity]:
    """What the request declares, first declaration wins, computed independently."""
    out: list[ToolIdentity] = []
    for lst in [tools, *(i["tools"] for i in items if "tools" in i)]:
        for t in lst:
            if t["type"] in ("function", "custom"):
                found = [ToolIdentity(None, t["name"], t["type"])]
            elif t["type"] == "namespace":
                found = [ToolIdentity(t["name"], m["name"], m["type"]) for m in t["tools"]]
            elif t["type"] == "tool_search":
                found = [ToolIdentity(None, "tool_search", "tool_search")]
            else:
                found = []
            out.extend(i for i in found if i not in out)
    return out


def legal(config: NamingConfig) -> re.Pattern[str]:
    chars = "A-Za-z0-9_.-" if config.style == "dotted" else "A-Za-z0-9_-"
    return re.compile(rf"[{chars}]{{1,{config.max_name_length}}}")


def check(tools: list[Any], items: list[Any], config: NamingConfig) -> ResponsesToolNames:
    names = ResponsesToolNames.convert(tools, items, config=config)
    flats = [t.name for t in names.tools]
    pattern = legal(config)
    # Unique, backend-legal, within the limit.
    assert len(set(flats)) == len(flats)
    assert all(pattern.fullmatch(f) for f in flats), flats
    # Every declared identity is offered exactly once, in request order, and maps back.
    assert [t.identity for t in names.tools] == expected_identities(tools, items)
    for t in names.tools:
        ident = t.identity
        assert names.decode(t.name) == ident
        assert names.encode(ident.namespace, ident.name, ident.kind) == t.name
    # Legal top-level names the client chose are kept exactly when nothing else claims them.
    top = [
        t for t in names.tools if t.identity.namespace is None and t.identity.kind != "tool_search"
    ]
    for t in top:
        alone = sum(u.identity.name == t.identity.name for u in top) == 1
        if alone and pattern.fullmatch(t.identity.name):
            assert t.name == t.identity.name
    return names


@QUICK
@given(requests(), config_st)
def test_names_are_unique_legal_and_reversible(req: Any, config: NamingConfig) -> None:
    check(*req, config)


@pytest.mark.slow
@FUZZ
@given(requests(), config_st)
def test_names_fuzz(req: Any, config: NamingConfig) -> None:
    check(*req, config)


@QUICK
@given(requests(), config_st)
def test_same_tools_twice_give_the_same_names(req: Any, config: NamingConfig) -> None:
    tools, items = req
    first = ResponsesToolNames.convert(tools, items, config=config)
    second = ResponsesToolNames.convert(copy.deepcopy(tools), copy.deepcopy(items), config=config)
    assert first.tools == second.tools
    assert first == second


def same_route(found: ToolIdentity, ns: str | None, name: str) -> bool:
    """Codex routes None, "" and "functions" alike, and namespace == name to the top level."""
    ns = ns or None
    if found.name != name:
        return False
    return (
        found.namespace == ns
        or {found.namespace, ns} <= {None, "functions"}
        or (found.namespace is None and ns == name)
        or (found.namespace == name and ns is None)  # a deferred top-level function
    )


@QUICK
@given(
    requests(),
    config_st,
    st.lists(
        st.tuples(st.one_of(st.none(), names_st), names_st, st.sampled_from(["function", "custom"]))
    ),
)
def test_history_encoding_stays_injective(
    req: Any, config: NamingConfig, history: list[Any]
) -> None:
    names = check(*req, config)
    pattern = legal(config)
    offered = {t.name: t.identity for t in names.tools}
    for ns, name, kind in history:
        flat = names.encode(ns, name, kind)
        assert pattern.fullmatch(flat)
        assert names.encode(ns, name, kind) == flat
        assert same_route(names.decode(flat), ns, name), (flat, ns, name)
    assert {t.name: t.identity for t in names.tools} == offered


@QUICK
@given(requests(), config_st)
def test_every_declared_tool_can_be_forced(req: Any, config: NamingConfig) -> None:
    names = ResponsesToolNames.convert(*req, config=config)
    for t in names.tools:
        ident = t.identity
        if ident.kind == "tool_search":
            continue
        choice = {"type": ident.kind, "name": ident.name, "namespace": ident.namespace}
        assert names.resolve_choice(choice) == ResolvedChoice("required", (t.name,))


def describe_namespaces(lst: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {**t, "description": f"About {t['name']}."} if t["type"] == "namespace" else t for t in lst
    ]


@QUICK
@given(requests(), config_st)
def test_namespace_descriptions_prefix_members_and_leave_names_alone(
    req: Any, config: NamingConfig
) -> None:
    tools, items = req
    plain = ResponsesToolNames.convert(tools, items, config=config)
    items2 = [{**i, "tools": describe_namespaces(i["tools"])} if "tools" in i else i for i in items]
    described = ResponsesToolNames.convert(describe_namespaces(tools), items2, config=config)
    assert [(t.name, t.identity) for t in described.tools] == [
        (t.name, t.identity) for t in plain.tools
    ]
    for old, new in zip(plain.tools, described.tools, strict=True):
        ns = old.identity.namespace
        if ns is None:
            assert new.description == old.description
        else:
            prefix = f"About {ns}.".strip()
            tail = f"\n\n{old.description}" if old.description else ""
            assert new.description == prefix + tail
