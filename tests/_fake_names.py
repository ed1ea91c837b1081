"""TEMPORARY stand-in for ResponsesToolNames (codex join style only); deleted once tools.py lands."""

from __future__ import annotations

from typing import Any

from streamer.errors import invalid
from streamer.tools import FlatTool, ResolvedChoice, ToolIdentity


def flat(ns: str | None, name: str) -> str:
    if ns in (None, "functions"):
        return name
    if ns.endswith("_") or name.startswith("_"):
        return ns + name
    return f"{ns}__{name}"


class FakeNames:
    def __init__(self) -> None:
        self.tools: list[FlatTool] = []

    @classmethod
    def convert(cls, tools: Any, items: Any) -> FakeNames:
        self = cls()
        sources = list(tools or [])
        for item in items:
            if isinstance(item, dict) and item.get("type") in ("additional_tools", "tool_search_output"):
                if isinstance(item.get("tools"), list):
                    sources.extend(t for t in item["tools"] if isinstance(t, dict))
        for t in sources:
            if not isinstance(t, dict):
                raise invalid("bad tool", "tools")
            self.add(None, t)
        return self

    def add(self, ns: str | None, t: dict[str, Any]) -> None:
        kind = t.get("type")
        if kind == "namespace":
            for m in t.get("tools") or []:
                if isinstance(m, dict):
                    self.add(str(t.get("name")), m)
        elif kind == "tool_search" and t.get("execution") == "client":
            ident = ToolIdentity(None, "tool_search", "tool_search")
            self.tools.append(FlatTool("tool_search", ident, t.get("description"), t.get("parameters"), None))
        elif kind in ("function", "custom") and isinstance(t.get("name"), str):
            ident = ToolIdentity(ns, t["name"], kind)
            if any(x.identity == ident for x in self.tools):
                return
            params = t.get("parameters") if kind == "function" else {
                "type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"]}
            self.tools.append(FlatTool(flat(ns, t["name"]), ident, t.get("description"), params, t.get("strict")))

    def encode(self, namespace: str | None, name: str, kind: str = "function") -> str:
        return "tool_search" if kind == "tool_search" else flat(namespace, name)

    def resolve_choice(self, choice: Any) -> ResolvedChoice:
        if choice is None:
            return ResolvedChoice("auto")
        if isinstance(choice, str):
            return ResolvedChoice(choice)  # type: ignore[arg-type]
        if choice.get("type") == "allowed_tools":
            return ResolvedChoice(choice["mode"], tuple(self.find(e) for e in choice["tools"]))
        return ResolvedChoice("required", (self.find(choice),))

    def find(self, c: dict[str, Any]) -> str:
        for t in self.tools:
            if t.identity.name == c["name"] and ("namespace" not in c or c["namespace"] == t.identity.namespace):
                return t.name
        raise invalid("unknown tool", "tool_choice")
