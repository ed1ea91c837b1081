"""Tool identity in a tapped stream: who a call names, and whether that is a declared tool.

`identity()` and `label()` say which client tool a call means (for the timeline and the
summary); `ToolCheck` judges a call's (namespace, name) against the tools a request declared
(the grammar's `tool.*` rules). Both read the names through a `ResponsesToolNames`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from streamer.core.call_kinds import CALL_KINDS as ROWS

if TYPE_CHECKING:
    from streamer.core.tools import ResponsesToolNames

# the call items that name their tool, by type, and those whose type is the tool
CALL_KINDS = {row.call_type: row.kind for row in ROWS.values() if row.named and not row.hosted}
CALL_TYPES = tuple(CALL_KINDS)
_FIXED_CALLS = {row.call_type: row.kind for row in ROWS.values() if not row.named}
DEFAULT_NAMESPACES = (None, "", "functions")  # Codex routes these as "no namespace"


def default_ns(namespace: Any) -> Any:
    return None if namespace in DEFAULT_NAMESPACES else namespace


def identity(item_type: str, name: Any, namespace: Any, names: Any | None) -> dict[str, Any] | None:
    """A call's client identity: its own namespace, else its name decoded through the map."""
    fixed = _FIXED_CALLS.get(item_type)
    if fixed is not None:  # tools named by their type
        return {"namespace": None, "name": fixed, "kind": fixed}
    kind = CALL_KINDS.get(item_type)
    if kind is None or not isinstance(name, str):
        return None
    if namespace or names is None:
        return {"namespace": namespace or None, "name": name, "kind": kind}
    ident = names.decode(name)
    return {"namespace": ident.namespace, "name": ident.name, "kind": ident.kind}


def label(ident: dict[str, Any]) -> str:
    return f"{ident['namespace']}/{ident['name']}" if ident["namespace"] else ident["name"]


class ToolCheck:
    """A call's (namespace, name) against the tools a request declared (a ResponsesToolNames)."""

    def __init__(self, names: ResponsesToolNames) -> None:
        self.names = names
        self.declared: dict[tuple[Any, str], str] = {}
        for tool in names.tools:
            ident = tool.identity
            self.declared[(default_ns(ident.namespace), ident.name)] = ident.kind
        self.members = {name for ns, name in self.declared if ns is not None}

    def check(self, item_type: str, name: Any, namespace: Any) -> tuple[str, str] | None:
        """A (rule, message) pair when the call surface is wrong, else None."""
        if not isinstance(name, str):
            return None
        if namespace is not None and not isinstance(namespace, str):
            return "tool.undeclared", f"namespace {namespace!r} is not a declared namespace"
        ns = default_ns(namespace)
        kind = self.declared.get((ns, name))
        if kind is None:
            if ns is not None:
                return "tool.undeclared", f"{namespace}/{name} is not a declared tool"
            ident = self.names.decode(name)
            if default_ns(ident.namespace) is not None:
                return (
                    "tool.flat_name",
                    f"{name!r} is the flat name of {ident.namespace}/{ident.name}: the call "
                    "must carry namespace and the bare name",
                )
            if name in self.members:
                return "tool.namespace_missing", f"{name!r} is a namespace member: no namespace"
            return None  # an undeclared top-level name: passed through, not ours to judge
        if kind != CALL_KINDS.get(item_type):
            return "tool.kind", f"a {item_type} to a {kind} tool {name!r}"
        return None


__all__ = ["CALL_KINDS", "CALL_TYPES", "ToolCheck", "default_ns", "identity", "label"]
