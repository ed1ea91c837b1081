"""tool_choice resolution: the client's choice mapped onto one request's flat names (pure).

Works over plain `Entry` rows (flat name + identity) so it needs nothing from
`streamer.tools`, which builds the index and wraps the result in a `ResolvedChoice`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal, NamedTuple

from streamer.core.errors import invalid
from streamer.core.tool_decls import FIXED_NAME_KINDS

ChoiceMode = Literal["auto", "none", "required"]
Resolution = tuple[ChoiceMode, tuple[str, ...] | None]

_AUTO: Resolution = ("auto", None)


class Entry(NamedTuple):
    """One declared flat tool as tool_choice sees it."""

    flat: str
    namespace: str | None
    name: str
    kind: str


class ChoiceIndex:
    """Name lookups for tool_choice over one request's declared tools."""

    __slots__ = ("by_ns", "default_namespace", "flats", "members", "top")

    def __init__(self, entries: Iterable[Entry], default_namespace: str) -> None:
        self.default_namespace = default_namespace
        self.flats: set[str] = set()
        self.top: dict[str, list[Entry]] = {}
        self.by_ns: dict[str, dict[str, list[Entry]]] = {}
        self.members: dict[str, list[Entry]] = {}
        for e in entries:
            self.flats.add(e.flat)
            if e.namespace is None:
                self.top.setdefault(e.name, []).append(e)
            else:
                self.by_ns.setdefault(e.namespace, {}).setdefault(e.name, []).append(e)
                self.members.setdefault(e.name, []).append(e)


def resolve_choice(tool_choice: Any, index: Callable[[], ChoiceIndex]) -> Resolution:
    """Map the client's tool_choice onto flat names (rule 6). Forcing a tool the gateway
    cannot call (hosted, or not declared) is a 400; allowed_tools skips hosted entries.

    `index` builds (or returns a cached) index; plain modes never call it.
    """
    if tool_choice is None or tool_choice == "auto":
        return _AUTO
    if tool_choice == "none":
        return ("none", None)
    if tool_choice == "required":
        if not index().flats:
            raise invalid("tool_choice 'required' needs at least one callable tool.", "tool_choice")
        return ("required", None)
    if not isinstance(tool_choice, Mapping):
        raise invalid("tool_choice must be 'auto', 'none', 'required' or an object.", "tool_choice")
    kind = tool_choice.get("type")
    if not isinstance(kind, str):
        raise invalid("tool_choice needs a string 'type'.", "tool_choice.type")
    if kind == "allowed_tools":
        return _resolve_allowed(tool_choice, index())
    flats = _resolve_entry(tool_choice, "tool_choice", index())
    if not flats:  # forcing a tool nothing here can call would be silently ignored
        raise invalid(_uncallable(kind), "tool_choice.type")
    return ("required", flats)


def _uncallable(kind: str) -> str:
    if kind in FIXED_NAME_KINDS:
        return (
            f"tool_choice forces {kind!r}, but the request has no {kind} tool this gateway "
            "can call (a hosted one, e.g. tool_search with execution 'server' or a shell in a "
            "hosted container, is not run here)."
        )
    return (
        f"tool_choice forces the hosted tool {kind!r}, which this gateway does not run: "
        "hosted tools are echoed but never sent to the backend."
    )


def _resolve_allowed(choice: Mapping[str, Any], idx: ChoiceIndex) -> Resolution:
    mode = choice.get("mode", "auto")
    if mode not in ("auto", "required"):
        raise invalid("allowed_tools mode must be 'auto' or 'required'.", "tool_choice.mode")
    entries = choice.get("tools")
    if not isinstance(entries, list) or not entries:
        raise invalid("allowed_tools needs a non-empty 'tools' array.", "tool_choice.tools")
    allowed: dict[str, None] = {}
    for i, entry in enumerate(entries):
        base = f"tool_choice.tools[{i}]"
        if not isinstance(entry, Mapping):
            raise invalid("An allowed_tools entry must be an object.", base)
        if not isinstance(entry.get("type"), str):
            raise invalid("An allowed_tools entry needs a string 'type'.", f"{base}.type")
        allowed.update(dict.fromkeys(_resolve_entry(entry, base, idx)))
    if not allowed:  # only hosted tools: nothing the backend can be restricted to
        if mode == "required":
            raise invalid(
                "allowed_tools mode 'required' lists only tools this gateway does not run "
                "(hosted tools are echoed but never sent to the backend).",
                "tool_choice.tools",
            )
        return _AUTO
    return (mode, tuple(allowed))


def _resolve_entry(entry: Mapping[str, Any], base: str, idx: ChoiceIndex) -> tuple[str, ...]:
    """Flat names one choice object designates; () for hosted or undeclared fixed tools."""
    kind = entry["type"]
    if kind in ("function", "custom"):
        return (_resolve_name(entry, kind, base, idx),)
    if kind in FIXED_NAME_KINDS:  # tools named by their type
        found = idx.top.get(kind, [])
        return tuple(e.flat for e in found if e.kind == kind)[:1]
    if kind == "namespace":
        ns = entry.get("name")
        members = idx.by_ns.get(ns) if isinstance(ns, str) else None
        if not members:
            raise invalid(f"Unknown namespace {ns!r} in tool_choice.", f"{base}.name")
        return tuple(dict.fromkeys(e.flat for es in members.values() for e in es))
    if kind == "mcp":  # {server_label, name?}: that server's tool, or any of its tools
        return _resolve_mcp(entry, base, idx)
    return ()


def _resolve_mcp(entry: Mapping[str, Any], base: str, idx: ChoiceIndex) -> tuple[str, ...]:
    label, name = entry.get("server_label"), entry.get("name")
    members = idx.by_ns.get(label) if isinstance(label, str) else None
    found = [e for es in (members or {}).values() for e in es if e.kind == "mcp"]
    if not found:  # no server the gateway runs by that label: a hosted tool, as OpenAI's
        return ()
    if name is None:
        return tuple(dict.fromkeys(e.flat for e in found))
    named = tuple(e.flat for e in found if e.name == name)
    if not named:
        raise invalid(f"The MCP server {label!r} has no tool {name!r}.", f"{base}.name")
    return named[:1]


def _resolve_name(entry: Mapping[str, Any], kind: str, base: str, idx: ChoiceIndex) -> str:
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise invalid(f"A {kind} tool_choice needs a non-empty 'name'.", f"{base}.name")
    ns = entry.get("namespace")
    if ns is not None and not isinstance(ns, str):
        raise invalid("tool_choice namespace must be a string.", f"{base}.namespace")
    if ns:
        alternatives: list[str | None] = [ns]
        if ns in (name, idx.default_namespace):
            alternatives.append(None)
        for n in alternatives:
            found = idx.top.get(name) if n is None else idx.by_ns.get(n, {}).get(name)
            if found:
                return _pick(found, kind)
        if ns not in idx.by_ns:
            raise invalid(f"Unknown namespace {ns!r} in tool_choice.", f"{base}.namespace")
        raise invalid(f"No tool named {name!r} in namespace {ns!r}.", f"{base}.name")
    found = idx.top.get(name)
    if found:
        return _pick(found, kind)
    if name in idx.flats:
        return name
    owners = idx.members.get(name)
    if owners:
        spaces = list(dict.fromkeys(e.namespace for e in owners))
        if len(spaces) == 1:
            return _pick(owners, kind)
        listed = ", ".join(repr(s) for s in spaces)
        raise invalid(
            f"tool_choice name {name!r} is ambiguous: it is defined in namespaces {listed}. "
            "Add a 'namespace' field or use the flat name.",
            f"{base}.name",
        )
    raise invalid(f"tool_choice names an unknown tool {name!r}.", f"{base}.name")


def _pick(found: list[Entry], kind: str) -> str:
    """Prefer the tool of the kind the choice named; any kind is accepted."""
    return next((e.flat for e in found if e.kind == kind), found[0].flat)
