"""The naming core: namespace tools <-> backend-legal flat function names (pure, no I/O).

`ResponsesToolNames` is the request-local map. Each identity gets exactly one flat name,
built by `_preferred` and `_alias` only; `decode` maps back through the map and never
splits strings (namespace names contain `__` themselves). Declaration walking lives in
`streamer.tool_decls`, tool_choice resolution in `streamer.tool_choice`; every public
name is importable from here.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import count
from typing import Any, Literal, get_args

from streamer.core.tool_choice import ChoiceIndex, Entry, resolve_choice
from streamer.core.tool_decls import FIXED_NAME_KINDS, Decl, ToolKind, declarations
from streamer.core.tool_templates import ToolTemplates

__all__ = [
    "DEFAULT_CONFIG",
    "DEFAULT_NAMESPACE",
    "FlatTool",
    "NameStyle",
    "NamingConfig",
    "ResolvedChoice",
    "ResponsesToolNames",
    "ToolIdentity",
    "ToolKind",
]

NameStyle = Literal["codex", "double-underscore", "llamacpp", "dotted"]

DEFAULT_NAMESPACE = "functions"  # Codex's default namespace: same routing as no namespace
_KINDS = frozenset(get_args(ToolKind))
_STYLES = frozenset(get_args(NameStyle))
_HASH_LEN = 8
_CALL_KINDS: tuple[ToolKind, ...] = ("function", "custom")


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


class ResponsesToolNames:
    """Request-local two-way map between flat names and identities, plus the flat tool list."""

    __slots__ = (
        "_by_flat", "_by_identity", "_config", "_declared", "_index", "_legal", "_memo", "tools",
    )  # fmt: skip

    tools: list[FlatTool]

    def __init__(self, config: NamingConfig = DEFAULT_CONFIG) -> None:
        self._config = config
        charset = "A-Za-z0-9_.-" if config.style == "dotted" else "A-Za-z0-9_-"
        self._legal = (re.compile(f"[{charset}]+"), re.compile(f"[^{charset}]"))
        self._by_flat: dict[str, ToolIdentity] = {}
        self._by_identity: dict[ToolIdentity, str] = {}
        self._declared: dict[str, FlatTool] = {}
        self._index: ChoiceIndex | None = None
        # encode's answers by its arguments as given: a history replays the same few tools
        # hundreds of times (an answer never changes once given: names are only added)
        self._memo: dict[tuple[str | None, str, str], str] = {}
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
        """Validate and flatten every callable tool of one request (400 `RequestError`s).

        A client sends the same tools turn after turn (Codex: ~20 tools, ~90 µs to
        convert): a tools list seen lately is copied from the map it made then.
        """
        key = _TEMPLATES.key(tools, input_items, config)
        if key is not None:
            template = _TEMPLATES.get(key)
            if template is not None:
                return template.copy()
        self = cls._build(tools, input_items, config)
        if key is not None:
            _TEMPLATES.put(key, self.copy())
        return self

    @classmethod
    def _build(
        cls,
        tools: Sequence[Mapping[str, Any]] | None,
        input_items: Iterable[Any],
        config: NamingConfig,
    ) -> ResponsesToolNames:
        decls = declarations(
            tools,
            input_items,
            max_tools=config.max_tools,
            max_tool_bytes=config.max_tool_bytes,
        )
        self = cls(config)
        idents = [ToolIdentity(d.namespace, d.name, d.kind) for d in decls]
        flats: list[str | None] = [None] * len(decls)
        # Legal top-level names first, kept exactly: the client chose them.
        for k, ident in enumerate(idents):
            name = ident.name
            if (
                ident.namespace is None
                and ident.kind not in FIXED_NAME_KINDS
                and name not in self._by_flat
                and self._is_legal(name)
            ):
                self._claim(ident, name)
                flats[k] = name
        for k, ident in enumerate(idents):
            if flats[k] is None:
                flats[k] = self._assign(ident)
        self.tools = [
            FlatTool(flat, ident, d.description, d.parameters, d.strict)
            for flat, ident, d in zip(flats, idents, decls, strict=True)
            if flat is not None
        ]
        self._declared = {t.name: t for t in self.tools}
        return self

    def declare(self, decls: Iterable[Decl]) -> None:
        """More callable tools, after the request's own (an MCP server's listed tools, kind
        `mcp`, one namespace per server): each gets a flat name by the same builder, so a
        name the client's tools hold already is aliased, never shared."""
        for d in decls:
            ident = ToolIdentity(d.namespace, d.name, d.kind)
            if ident in self._by_identity:
                continue
            tool = FlatTool(self._assign(ident), ident, d.description, d.parameters, d.strict)
            self.tools.append(tool)
            self._declared[tool.name] = tool
        self._index = None

    def copy(self) -> ResponsesToolNames:
        """An independent map with the same names (a request registers its own later)."""
        other = ResponsesToolNames.__new__(ResponsesToolNames)
        other._config, other._legal, other._index = self._config, self._legal, None
        other._by_flat = dict(self._by_flat)
        other._by_identity = dict(self._by_identity)
        other._memo = dict(self._memo)
        other._declared = dict(self._declared)
        other.tools = list(self.tools)
        return other

    def _is_legal(self, flat: str) -> bool:
        return 0 < len(flat) <= self._config.max_name_length and bool(
            self._legal[0].fullmatch(flat)
        )

    def _preferred(self, ident: ToolIdentity) -> str:
        ns, name = ident.namespace, ident.name
        if ns is None or ns == name:  # ns == name: a deferred top-level function
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
        if name.__class__ is str and (namespace is None or namespace.__class__ is str):
            key = (namespace, name, kind)
            flat = self._memo.get(key)
            if flat is None:
                flat = self._memo[key] = self._encode(namespace, name, kind)
            return flat
        return self._encode(namespace, name, kind)

    def _encode(self, namespace: str | None, name: str, kind: ToolKind) -> str:
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
        if kind == "mcp":  # an MCP server's tool is that server's, or new (never a client's)
            return self._assign(ident)
        namespaces = [ns]
        if ns is not None and ns == name:  # deferred top-level function loaded by search
            namespaces.append(None)
        if ns is None:
            namespaces.extend((DEFAULT_NAMESPACE, name))  # name: a deferred top-level function
        elif ns == DEFAULT_NAMESPACE:
            namespaces.append(None)
        kinds: list[ToolKind] = [kind, *(k for k in _CALL_KINDS if k != kind)]
        for k in kinds:
            for n in namespaces:
                flat = self._by_identity.get(ToolIdentity(n, name, k))
                if flat is not None:
                    return flat
        return self._assign(ident)

    def alias(self, spelling: str, flat: str) -> None:
        """Another spelling a backend answers `flat` with (Ollama's `ns.name`, a split
        name joined back): decoded as `flat` is, unless the spelling is a name already."""
        ident = self._by_flat.get(flat)
        if ident is not None and spelling not in self._by_flat:
            self._by_flat[spelling] = ident

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
        """Map the client's tool_choice onto flat names (rule 6); forcing a hosted tool is a 400."""
        mode, allowed = resolve_choice(tool_choice, self._choice_index)
        return ResolvedChoice(mode, allowed)

    def _choice_index(self) -> ChoiceIndex:
        if self._index is None:
            entries = (
                Entry(t.name, t.identity.namespace, t.identity.name, t.identity.kind)
                for t in self.tools
            )
            self._index = ChoiceIndex(entries, DEFAULT_NAMESPACE)
        return self._index


# The maps of tools lists seen lately (bounded: see ToolTemplates).
_TEMPLATES: ToolTemplates[ResponsesToolNames] = ToolTemplates()
