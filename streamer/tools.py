"""The naming core: namespace tools <-> backend-legal flat function names (pure, no I/O).

Callable tools come from the request's `tools` and from `additional_tools` and
`tool_search_output` input items. Each identity gets exactly one flat name, built by
`_preferred` and `_alias` only; `decode` maps back through the request-local dict and
never splits strings (namespace names contain `__` themselves).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import count
from typing import Any, Literal, get_args

import orjson

from streamer.errors import invalid

ToolKind = Literal["function", "custom", "tool_search"]
NameStyle = Literal["codex", "double-underscore", "llamacpp", "dotted"]

DEFAULT_NAMESPACE = "functions"  # Codex's default namespace: same routing as no namespace
_KINDS = frozenset(get_args(ToolKind))
_STYLES = frozenset(get_args(NameStyle))
_HASH_LEN = 8
_CALL_KINDS: tuple[ToolKind, ...] = ("function", "custom")
_OBJECT = (dict, Mapping)  # dict first: an exact check, far cheaper than the ABC's
_SOURCE_ITEMS = frozenset({"additional_tools", "tool_search_output"})


@dataclass(frozen=True, slots=True)
class ToolIdentity:
    """The client's identity of a callable tool: what a call must carry on the way back."""

    namespace: str | None
    name: str
    kind: ToolKind = "function"


@dataclass(frozen=True, slots=True)
class NamingConfig:
    style: NameStyle = "codex"
    max_name_length: int = 64
    max_tools: int = 4096
    max_tool_bytes: int = 2 * 1024 * 1024

    def __post_init__(self) -> None:
        if self.style not in _STYLES:
            raise ValueError(f"unknown naming style {self.style!r}")
        # Room for a readable prefix, "_" and the hash.
        if self.max_name_length < 16:
            raise ValueError("max_name_length must be at least 16")
        if self.max_tools < 0 or self.max_tool_bytes < 0:
            raise ValueError("tool budgets must not be negative")


DEFAULT_CONFIG = NamingConfig()


@dataclass(frozen=True, slots=True)
class FlatTool:
    """One backend function tool: a flat name plus what the model needs to call it."""

    name: str
    identity: ToolIdentity
    description: str | None
    parameters: dict[str, Any] | None
    strict: bool | None


@dataclass(frozen=True, slots=True)
class ResolvedChoice:
    """A backend-neutral tool_choice: a mode plus, optionally, the flat names allowed."""

    mode: Literal["auto", "none", "required"]
    allowed: tuple[str, ...] | None = None


_Decl = tuple[ToolIdentity, str | None, dict[str, Any] | None, bool | None]


class ResponsesToolNames:
    """Request-local two-way map between flat names and identities, plus the flat tool list."""

    __slots__ = ("_by_flat", "_by_identity", "_config", "_declared", "_index", "_legal", "tools")

    tools: list[FlatTool]

    def __init__(self, config: NamingConfig = DEFAULT_CONFIG) -> None:
        self._config = config
        charset = "A-Za-z0-9_.-" if config.style == "dotted" else "A-Za-z0-9_-"
        self._legal = (re.compile(f"[{charset}]+"), re.compile(f"[^{charset}]"))
        self._by_flat: dict[str, ToolIdentity] = {}
        self._by_identity: dict[ToolIdentity, str] = {}
        self._declared: dict[str, FlatTool] = {}
        self._index: _ChoiceIndex | None = None
        self.tools = []

    # -- building -----------------------------------------------------------------------

    @classmethod
    def convert(
        cls,
        tools: Sequence[Mapping[str, Any]] | None,
        input_items: Iterable[Any] = (),
        *,
        config: NamingConfig = DEFAULT_CONFIG,
    ) -> ResponsesToolNames:
        """Validate and flatten every callable tool of one request (400 `RequestError`s)."""
        sources = _sources(tools, input_items)
        _check_budget(sources, config)
        decls: list[_Decl] = []
        seen: set[ToolIdentity] = set()
        for lst, base in sources:
            _collect(lst, base, decls, seen)
        self = cls(config)
        flats: list[str | None] = [None] * len(decls)
        # Legal top-level names first, kept exactly: the client chose them.
        for k, (ident, *_) in enumerate(decls):
            name = ident.name
            if (
                ident.namespace is None
                and ident.kind != "tool_search"
                and name not in self._by_flat
                and self._is_legal(name)
            ):
                self._claim(ident, name)
                flats[k] = name
        for k, (ident, *_) in enumerate(decls):
            if flats[k] is None:
                flats[k] = self._assign(ident)
        self.tools = [
            FlatTool(flat, ident, desc, params, strict)
            for flat, (ident, desc, params, strict) in zip(flats, decls, strict=True)
            if flat is not None
        ]
        self._declared = {t.name: t for t in self.tools}
        return self

    def _is_legal(self, flat: str) -> bool:
        return 0 < len(flat) <= self._config.max_name_length and bool(
            self._legal[0].fullmatch(flat)
        )

    def _preferred(self, ident: ToolIdentity) -> str:
        ns, name = ident.namespace, ident.name
        if ns is None:
            return name
        style = self._config.style
        if style == "codex":
            if ns == DEFAULT_NAMESPACE:
                return name
            # Codex's own join: direct when either side already carries the separator.
            return ns + name if ns.endswith("_") or name.startswith("_") else f"{ns}__{name}"
        if style == "double-underscore":
            return f"{ns}__{name}"
        if style == "llamacpp":
            return f"ns_{ns}___{name}"
        return f"{ns}.{name}"

    def _alias(self, ident: ToolIdentity, preferred: str) -> str:
        """Readable prefix + "_" + stable hash of the identity; salted again if taken."""
        room = self._config.max_name_length - _HASH_LEN - 1
        prefix = self._legal[1].sub("_", preferred)[:room] or "tool"
        for salt in count():
            key = repr((ident.namespace, ident.name, ident.kind, salt)).encode()
            flat = f"{prefix}_{hashlib.blake2b(key, digest_size=_HASH_LEN // 2).hexdigest()}"
            if flat not in self._by_flat:
                return flat
        raise AssertionError("unreachable")  # pragma: no cover

    def _assign(self, ident: ToolIdentity) -> str:
        preferred = self._preferred(ident)
        if preferred in self._by_flat or not self._is_legal(preferred):
            preferred = self._alias(ident, preferred)
        self._claim(ident, preferred)
        return preferred

    def _claim(self, ident: ToolIdentity, flat: str) -> None:
        self._by_flat[flat] = ident
        self._by_identity[ident] = flat

    # -- lookups ------------------------------------------------------------------------

    def decode(self, flat_name: str) -> ToolIdentity:
        """The identity behind a backend name; unknown names come back unchanged, top-level."""
        ident = self._by_flat.get(flat_name)
        return ident if ident is not None else ToolIdentity(None, flat_name, "function")

    def encode(self, namespace: str | None, name: str, kind: ToolKind = "function") -> str:
        """The flat name for a replayed call; undeclared identities get one too (registered)."""
        if not isinstance(name, str):
            name = "" if name is None else str(name)
        if namespace is not None and not isinstance(namespace, str):
            namespace = str(namespace)
        ns = namespace or None
        if kind not in _KINDS:
            kind = "function"
        ident = ToolIdentity(ns, name, kind)
        flat = self._by_identity.get(ident)
        if flat is not None:
            return flat
        namespaces = [ns]
        if ns is not None and ns == name:  # deferred top-level function loaded by search
            namespaces.append(None)
        if ns is None:
            namespaces.append(DEFAULT_NAMESPACE)
        elif ns == DEFAULT_NAMESPACE:
            namespaces.append(None)
        kinds: list[ToolKind] = [kind, *(k for k in _CALL_KINDS if k != kind)]
        for k in kinds:
            for n in namespaces:
                flat = self._by_identity.get(ToolIdentity(n, name, k))
                if flat is not None:
                    return flat
        return self._assign(ident)

    @property
    def identities(self) -> tuple[ToolIdentity, ...]:
        """The declared identities, in request order."""
        return tuple(t.identity for t in self.tools)

    def is_namespaced(self, flat_name: str) -> bool:
        return self.decode(flat_name).namespace is not None

    def __len__(self) -> int:
        return len(self.tools)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ResponsesToolNames):
            return NotImplemented
        return (self._config, self.tools, self._by_flat) == (
            other._config,
            other.tools,
            other._by_flat,
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"ResponsesToolNames({len(self.tools)} tools, style={self._config.style!r})"

    # -- tool_choice --------------------------------------------------------------------

    def resolve_choice(self, tool_choice: Any) -> ResolvedChoice:
        """Map the client's tool_choice onto flat names (rule 6); hosted choices become auto."""
        if tool_choice is None or tool_choice == "auto":
            return ResolvedChoice("auto")
        if tool_choice == "none":
            return ResolvedChoice("none")
        if tool_choice == "required":
            if not self.tools:
                raise invalid(
                    "tool_choice 'required' needs at least one callable tool.", "tool_choice"
                )
            return ResolvedChoice("required")
        if not isinstance(tool_choice, Mapping):
            raise invalid(
                "tool_choice must be 'auto', 'none', 'required' or an object.", "tool_choice"
            )
        kind = tool_choice.get("type")
        if not isinstance(kind, str):
            raise invalid("tool_choice needs a string 'type'.", "tool_choice.type")
        if kind == "allowed_tools":
            return self._resolve_allowed(tool_choice)
        flats = self._resolve_entry(tool_choice, "tool_choice")
        return ResolvedChoice("required", flats) if flats else ResolvedChoice("auto")

    def _resolve_allowed(self, choice: Mapping[str, Any]) -> ResolvedChoice:
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
            allowed.update(dict.fromkeys(self._resolve_entry(entry, base)))
        if not allowed:  # only hosted tools: nothing the backend can be restricted to
            return ResolvedChoice("auto")
        return ResolvedChoice(mode, tuple(allowed))

    def _resolve_entry(self, entry: Mapping[str, Any], base: str) -> tuple[str, ...]:
        """Flat names one choice object designates; () for hosted tools."""
        kind = entry["type"]
        if kind in ("function", "custom"):
            return (self._resolve_name(entry, kind, base),)
        idx = self._choice_index()
        if kind == "tool_search":
            found = idx.top.get("tool_search", [])
            return tuple(t.name for t in found if t.identity.kind == "tool_search")[:1]
        if kind == "namespace":
            ns = entry.get("name")
            members = idx.by_ns.get(ns) if isinstance(ns, str) else None
            if not members:
                raise invalid(f"Unknown namespace {ns!r} in tool_choice.", f"{base}.name")
            return tuple(dict.fromkeys(t.name for ts in members.values() for t in ts))
        return ()

    def _resolve_name(self, entry: Mapping[str, Any], kind: str, base: str) -> str:
        name = entry.get("name")
        if not isinstance(name, str) or not name:
            raise invalid(f"A {kind} tool_choice needs a non-empty 'name'.", f"{base}.name")
        ns = entry.get("namespace")
        if ns is not None and not isinstance(ns, str):
            raise invalid("tool_choice namespace must be a string.", f"{base}.namespace")
        idx = self._choice_index()
        if ns:
            alternatives = [ns]
            if ns in (name, DEFAULT_NAMESPACE):
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
        if name in self._declared:
            return name
        owners = idx.members.get(name)
        if owners:
            spaces = list(dict.fromkeys(t.identity.namespace for t in owners))
            if len(spaces) == 1:
                return _pick(owners, kind)
            listed = ", ".join(repr(s) for s in spaces)
            raise invalid(
                f"tool_choice name {name!r} is ambiguous: it is defined in namespaces {listed}. "
                "Add a 'namespace' field or use the flat name.",
                f"{base}.name",
            )
        raise invalid(f"tool_choice names an unknown tool {name!r}.", f"{base}.name")

    def _choice_index(self) -> _ChoiceIndex:
        if self._index is None:
            self._index = _ChoiceIndex(self.tools)
        return self._index

    # -- persistence --------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        """A JSON-able snapshot (orjson) of the config, flat tools and the whole map."""
        c = self._config
        return {
            "version": 1,
            "config": {
                "style": c.style,
                "max_name_length": c.max_name_length,
                "max_tools": c.max_tools,
                "max_tool_bytes": c.max_tool_bytes,
            },
            "tools": [
                {
                    "flat": t.name,
                    "namespace": t.identity.namespace,
                    "name": t.identity.name,
                    "kind": t.identity.kind,
                    "description": t.description,
                    "parameters": t.parameters,
                    "strict": t.strict,
                }
                for t in self.tools
            ],
            # Identities registered by `encode` for history that was never declared.
            "undeclared": [
                {"flat": f, "namespace": i.namespace, "name": i.name, "kind": i.kind}
                for f, i in self._by_flat.items()
                if f not in self._declared
            ],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ResponsesToolNames:
        """Rebuild a map saved by `to_json`; ValueError when the snapshot is malformed."""
        try:
            if data["version"] != 1:
                raise ValueError(f"unsupported tool-name snapshot version {data['version']!r}")
            self = cls(NamingConfig(**data["config"]))
            for t in data["tools"]:
                ident = _identity(t)
                tool = FlatTool(t["flat"], ident, t["description"], t["parameters"], t["strict"])
                self.tools.append(tool)
                self._claim(ident, tool.name)
            for u in data["undeclared"]:
                self._claim(_identity(u), u["flat"])
        except (KeyError, TypeError) as exc:
            raise ValueError(f"malformed tool-name snapshot: {exc!r}") from exc
        self._declared = {t.name: t for t in self.tools}
        return self


class _ChoiceIndex:
    """Name lookups for tool_choice, built once per request on first use."""

    __slots__ = ("by_ns", "members", "top")

    def __init__(self, tools: list[FlatTool]) -> None:
        self.top: dict[str, list[FlatTool]] = {}
        self.by_ns: dict[str, dict[str, list[FlatTool]]] = {}
        self.members: dict[str, list[FlatTool]] = {}
        for t in tools:
            ns, name = t.identity.namespace, t.identity.name
            if ns is None:
                self.top.setdefault(name, []).append(t)
            else:
                self.by_ns.setdefault(ns, {}).setdefault(name, []).append(t)
                self.members.setdefault(name, []).append(t)


def _pick(found: list[FlatTool], kind: str) -> str:
    """Prefer the tool of the kind the choice named; any kind is accepted."""
    return next((t.name for t in found if t.identity.kind == kind), found[0].name)


def _identity(d: Mapping[str, Any]) -> ToolIdentity:
    if d["kind"] not in _KINDS or not isinstance(d["name"], str):
        raise ValueError(f"malformed identity in tool-name snapshot: {d!r}")
    return ToolIdentity(d["namespace"], d["name"], d["kind"])


# -- request walking ----------------------------------------------------------------------


def _sources(tools: Any, input_items: Any) -> list[tuple[Sequence[Any], str]]:
    """Every tools list of the request with its param path, in request order."""
    out: list[tuple[Sequence[Any], str]] = []
    if tools is not None:
        if not isinstance(tools, list | tuple):
            raise invalid("'tools' must be an array.", "tools")
        out.append((tools, "tools"))
    if input_items is None or isinstance(input_items, str | bytes | Mapping):
        return out  # a string `input` carries no tools
    for i, item in enumerate(input_items):
        if isinstance(item, _OBJECT) and item.get("type") in _SOURCE_ITEMS:
            lst = item.get("tools")
            if lst is None:
                continue
            if not isinstance(lst, list | tuple):
                raise invalid(f"'{item['type']}' tools must be an array.", f"input[{i}].tools")
            out.append((lst, f"input[{i}].tools"))
    return out


def _check_budget(sources: list[tuple[Sequence[Any], str]], config: NamingConfig) -> None:
    """Rule 8: refuse oversized tool sets before doing work proportional to them."""
    n = 0
    for lst, base in sources:
        for tool in lst:
            is_ns = isinstance(tool, _OBJECT) and tool.get("type") == "namespace"
            members = tool.get("tools") if is_ns else None
            # Every entry counts at least once, so this loop stops after max_tools + 1 steps.
            n += max(1, len(members)) if isinstance(members, list) else 1
            if n > config.max_tools:
                raise invalid(
                    f"Too many tools: more than {config.max_tools} callable tools in one request.",
                    base,
                    code="array_above_max_length",
                )
    size = 0
    for lst, base in sources:
        try:
            size += len(orjson.dumps(lst))
        except TypeError:  # integers beyond 64 bits from a stdlib JSON parser
            size += len(json.dumps(lst, default=str))
        if size > config.max_tool_bytes:
            raise invalid(
                f"Tool definitions are too large: more than {config.max_tool_bytes} bytes.", base
            )


def _collect(lst: Sequence[Any], base: str, out: list[_Decl], seen: set[ToolIdentity]) -> None:
    """Validate one tools list and append its new callable declarations to `out`."""
    local: set[tuple[str | None, str, bool]] = set()
    for i, tool in enumerate(lst):
        p = f"{base}[{i}]"
        if not isinstance(tool, _OBJECT):
            raise invalid("A tool must be an object.", p)
        kind = tool.get("type")
        if kind in ("function", "custom"):
            _member(tool, None, p, local, out, seen)
        elif kind == "namespace":
            ns = tool.get("name")
            if not isinstance(ns, str) or not ns:
                raise invalid("A namespace tool needs a non-empty 'name'.", f"{p}.name")
            members = tool.get("tools")
            if not isinstance(members, list) or not members:
                raise invalid(f"Namespace {ns!r} needs a non-empty 'tools' array.", f"{p}.tools")
            for j, m in enumerate(members):
                mp = f"{p}.tools[{j}]"
                if not isinstance(m, _OBJECT):
                    raise invalid("A namespace member must be an object.", mp)
                mkind = m.get("type")
                if mkind == "namespace":
                    raise invalid(f"Namespace {ns!r} contains a nested namespace.", f"{mp}.type")
                if mkind not in ("function", "custom"):
                    raise invalid(
                        f"Namespace {ns!r} may contain only function and custom tools, "
                        f"not {mkind!r}.",
                        f"{mp}.type",
                    )
                _member(m, ns, mp, local, out, seen)
        elif kind == "tool_search":
            if tool.get("execution") == "client":  # server or missing: hosted, not ours
                _add(ToolIdentity(None, "tool_search", "tool_search"), tool, p, local, out, seen)
        elif not isinstance(kind, str):
            raise invalid("A tool needs a string 'type'.", f"{p}.type")
        # Any other type is a hosted tool: echoed to the client, never sent to the backend.


def _member(
    tool: Mapping[str, Any],
    ns: str | None,
    p: str,
    local: set[tuple[str | None, str, bool]],
    out: list[_Decl],
    seen: set[ToolIdentity],
) -> None:
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise invalid(f"A {tool['type']} tool needs a non-empty 'name'.", f"{p}.name")
    _add(ToolIdentity(ns, name, tool["type"]), tool, p, local, out, seen)


def _add(
    ident: ToolIdentity,
    tool: Mapping[str, Any],
    p: str,
    local: set[tuple[str | None, str, bool]],
    out: list[_Decl],
    seen: set[ToolIdentity],
) -> None:
    # Function and custom share a name space; only a duplicate within one list is an error.
    key = (ident.namespace, ident.name, ident.kind == "tool_search")
    if key in local:
        where = f" in namespace {ident.namespace!r}" if ident.namespace else ""
        raise invalid(
            f"Duplicate tool {ident.name!r}{where}.",
            p if ident.kind == "tool_search" else f"{p}.name",
        )
    local.add(key)
    description = tool.get("description")
    if description is not None and not isinstance(description, str):
        raise invalid("A tool description must be a string.", f"{p}.description")
    if ident.kind == "custom":
        params: dict[str, Any] | None = {
            "type": "object",
            "properties": {"input": {"type": "string"}},
            "required": ["input"],
            "additionalProperties": False,
        }
        description = _custom_description(description, tool.get("format"), p)
        strict = None
    else:
        raw = tool.get("parameters")
        if raw is not None and not isinstance(raw, _OBJECT):
            raise invalid("Tool parameters must be a JSON Schema object.", f"{p}.parameters")
        params = raw if raw is None or isinstance(raw, dict) else dict(raw)
        strict = tool.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise invalid("A tool's 'strict' must be a boolean.", f"{p}.strict")
    before = len(seen)
    seen.add(ident)
    if len(seen) == before:  # declared by an earlier source (tools, then input items)
        return
    out.append((ident, description, params, strict))


def _custom_description(description: str | None, fmt: Any, p: str) -> str | None:
    """The custom tool's description plus its input format, so the model can follow it."""
    if fmt is None:
        return description
    if not isinstance(fmt, Mapping):
        raise invalid("A custom tool's 'format' must be an object.", f"{p}.format")
    kind = fmt.get("type")
    if kind in (None, "text"):
        return description
    if kind == "grammar":
        definition = fmt.get("definition")
        if not isinstance(definition, str):
            raise invalid("A grammar format needs a string 'definition'.", f"{p}.format.definition")
        syntax = fmt.get("syntax")
        note = f"The `input` string must match this {syntax} grammar:\n{definition}"
    else:
        note = f"The `input` string must follow this format: {json.dumps(fmt, default=str)}"
    return f"{description}\n\n{note}" if description else note
