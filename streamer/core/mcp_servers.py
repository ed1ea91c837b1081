"""The request's remote MCP servers: `{"type": "mcp"}` tools read and checked (pure).

`servers(tools)` reads each `mcp` tool into an `McpServer`: its `server_label` (one namespace
of the naming core), its URL, the headers that go to it and nowhere else (`headers`, and
`authorization` as a Bearer token), which of its tools the model may call (`allowed_tools`:
names or a `{tool_names, read_only}` filter) and which need the client's approval first
(`require_approval`: "always" (OpenAI's default), "never", or `{always: filter, never:
filter}`). Every malformed field is a 400 naming it. `public(tool)` is the tool as the
Response echoes it and as the gateway keeps it: headers null, `authorization` left out and
the URL's path hidden, as OpenAI shows it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from streamer.core.errors import RequestError, invalid

APPROVALS = ("always", "never")
_HIDDEN_PATH = "/<redacted>"
_UNSUPPORTED = ("connector_id", "tunnel_id")  # OpenAI's own connectors and tunnels
_MAX_LABEL = 64


@dataclass(frozen=True, slots=True)
class ToolFilter:
    """`{tool_names, read_only}`: a tool matches if it is named (when names are given)
    and its `readOnlyHint` is `read_only` (when that is given)."""

    names: frozenset[str] | None = None
    read_only: bool | None = None

    def matches(self, name: str, read_only: bool) -> bool:
        if self.names is not None and name not in self.names:
            return False
        return self.read_only is None or self.read_only is read_only


@dataclass(frozen=True, slots=True)
class McpServer:
    """One `mcp` tool of a request: where it is, what goes to it, what the model may do."""

    label: str
    url: str
    headers: tuple[tuple[str, str], ...] = ()  # only ever sent to `url`: never echoed or kept
    allowed: ToolFilter | None = None  # None: every listed tool
    # "always", "never", or (always, never) filters: what neither matches waits too
    approval: str | tuple[ToolFilter | None, ToolFilter | None] = "always"
    description: str | None = None
    param: str = "tools"  # where it is in the request, for errors

    @property
    def key(self) -> str:
        """The tool-list cache key: the URL and the headers (a digest: never the values)."""
        h = hashlib.blake2b(self.url.encode(), digest_size=16)
        for name, value in sorted(self.headers):
            h.update(b"\0" + name.lower().encode() + b"\0" + value.encode())
        return h.hexdigest()

    def allows(self, name: str, read_only: bool) -> bool:
        return self.allowed is None or self.allowed.matches(name, read_only)

    def needs_approval(self, name: str, read_only: bool) -> bool:
        """Whether a call of tool `name` waits for the client's approval: a tool matching
        `never` runs, one matching `always` waits, any other waits (OpenAI's default)."""
        if isinstance(self.approval, str):
            return self.approval == "always"
        never = self.approval[1]
        return never is None or not never.matches(name, read_only)


def is_mcp(tool: Any) -> bool:
    return isinstance(tool, Mapping) and tool.get("type") == "mcp"


def wanted(request: Any) -> bool:
    """Whether a request has an `mcp` tool (cheap: the tools' types only)."""
    tools = request.get("tools") if isinstance(request, Mapping) else None
    return isinstance(tools, list) and any(is_mcp(t) for t in tools)


def servers(tools: Sequence[Any], *, enabled: bool = True) -> list[McpServer]:
    """Every `mcp` tool of `tools` read and checked (400s naming the field); a second tool
    with the same label is a 400. `enabled=False` (`--mcp off`): any `mcp` tool is a 400."""
    out: list[McpServer] = []
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        if not is_mcp(tool):
            continue
        p = f"tools[{i}]"
        if not enabled:
            raise invalid(
                "Remote MCP servers are turned off on this gateway (--mcp off): "
                "remove the 'mcp' tool.",
                f"{p}.type",
                "unsupported_tool",
            )
        server = _server(tool, p)
        if server.label in seen:
            raise invalid(f"Duplicate MCP server_label {server.label!r}.", f"{p}.server_label")
        seen.add(server.label)
        out.append(server)
    return out


def _server(tool: Mapping[str, Any], p: str) -> McpServer:
    label = tool.get("server_label")
    if not isinstance(label, str) or not label:
        raise invalid("An mcp tool needs a non-empty string 'server_label'.", f"{p}.server_label")
    if len(label) > _MAX_LABEL:
        raise invalid(
            f"'server_label' is longer than {_MAX_LABEL} characters.", f"{p}.server_label"
        )
    for key in _UNSUPPORTED:
        if tool.get(key) is not None:
            raise invalid(
                f"'{key}' names an OpenAI-hosted connection, which this gateway cannot reach: "
                "give the MCP server's 'server_url'.",
                f"{p}.{key}",
                "unsupported_parameter",
            )
    description = tool.get("server_description")
    if description is not None and not isinstance(description, str):
        raise invalid("'server_description' must be a string.", f"{p}.server_description")
    return McpServer(
        label,
        _url(tool.get("server_url"), f"{p}.server_url"),
        _headers(tool, p),
        _allowed(tool.get("allowed_tools"), f"{p}.allowed_tools"),
        _approval(tool.get("require_approval"), f"{p}.require_approval"),
        description or None,
        p,
    )


def _url(url: Any, p: str) -> str:
    if not isinstance(url, str) or not url:
        raise invalid("An mcp tool needs a 'server_url'.", p)
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise invalid(f"Invalid 'server_url': {url[:200]!r}.", p) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise invalid("'server_url' must be an http:// or https:// URL with a host.", p)
    if parts.username is not None or parts.password is not None:
        raise invalid("'server_url' must not carry credentials: send them in 'headers'.", p)
    if port == 0:
        raise invalid("'server_url' has no usable port.", p)
    return url


def _headers(tool: Mapping[str, Any], p: str) -> tuple[tuple[str, str], ...]:
    headers = tool.get("headers")
    if headers is None:
        headers = {}
    if not isinstance(headers, Mapping):
        raise invalid("'headers' must be an object of strings.", f"{p}.headers")
    out: dict[str, tuple[str, str]] = {}
    for name, value in headers.items():
        if not isinstance(value, str) or not _token(name) or not _field_value(value):
            raise invalid(f"Invalid header {str(name)[:64]!r} in 'headers'.", f"{p}.headers")
        out[name.lower()] = (name, value)
    token = tool.get("authorization")
    if token is not None:
        if not isinstance(token, str) or not token or not _field_value(token):
            raise invalid("'authorization' must be a token string.", f"{p}.authorization")
        out["authorization"] = ("Authorization", f"Bearer {token}")
    return tuple(out.values())


def _token(name: Any) -> bool:
    """An HTTP field name (RFC 9110 token)."""
    return (
        isinstance(name, str)
        and 0 < len(name) <= 256
        and all(c.isascii() and (c.isalnum() or c in "!#$%&'*+-.^_`|~") for c in name)
    )


def _field_value(value: str) -> bool:
    return len(value) <= 8192 and all(c == "\t" or (c >= " " and c != "\x7f") for c in value)


def _filter(value: Any, p: str) -> ToolFilter:
    """A `{tool_names, read_only}` object (a list: names only)."""
    if isinstance(value, list):
        value = {"tool_names": value}
    if not isinstance(value, Mapping):
        raise invalid("Expected a list of tool names or a {tool_names, read_only} object.", p)
    names = value.get("tool_names")
    if names is not None and (
        not isinstance(names, list) or not all(isinstance(n, str) for n in names)
    ):
        raise invalid("'tool_names' must be an array of strings.", f"{p}.tool_names")
    read_only = value.get("read_only")
    if read_only is not None and not isinstance(read_only, bool):
        raise invalid("'read_only' must be a boolean.", f"{p}.read_only")
    return ToolFilter(frozenset(names) if names is not None else None, read_only)


def _allowed(value: Any, p: str) -> ToolFilter | None:
    return None if value is None else _filter(value, p)


def _approval(value: Any, p: str) -> str | tuple[ToolFilter | None, ToolFilter | None]:
    if value is None:
        return "always"
    if isinstance(value, str):
        if value not in APPROVALS:
            raise invalid(
                f"Invalid value for '{p}': {value!r}. Supported values are: 'always', 'never'"
                " and a {always, never} filter object.",
                p,
            )
        return value
    if not isinstance(value, Mapping):
        raise invalid("'require_approval' must be 'always', 'never' or an object.", p)
    always, never = value.get("always"), value.get("never")
    return (
        None if always is None else _filter(always, f"{p}.always"),
        None if never is None else _filter(never, f"{p}.never"),
    )


def public(tool: Mapping[str, Any]) -> dict[str, Any]:
    """An `mcp` tool as the Response echoes it (and the gateway records and keeps it):
    OpenAI's fields, `headers` null, no `authorization`, the URL's path hidden."""
    url = tool.get("server_url")
    return {
        "type": "mcp",
        "allowed_tools": tool.get("allowed_tools"),
        "headers": None,
        "require_approval": tool.get("require_approval") or "always",
        "server_description": tool.get("server_description"),
        "server_label": tool.get("server_label"),
        "server_url": hidden_path(url) if isinstance(url, str) else url,
    }


def hidden_path(url: str) -> str:
    """`https://host/any/path?q` -> `https://host/<redacted>` (some servers' URLs carry
    credentials in their path): OpenAI's echo of `server_url`."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return _HIDDEN_PATH.lstrip("/")
    if not parts.scheme or not parts.netloc:
        return _HIDDEN_PATH.lstrip("/")
    host = parts.netloc.rpartition("@")[2]
    return f"{parts.scheme}://{host}{_HIDDEN_PATH}"


def public_tools(tools: Iterable[Any]) -> list[Any]:
    """A request's `tools` with every `mcp` tool in its public form."""
    return [public(t) if is_mcp(t) else t for t in tools]


def refusal(server: McpServer, why: str) -> RequestError:
    """The 424 of a server whose tools could not be listed (OpenAI's answer), naming it."""
    return RequestError(
        f"Error retrieving tool list from MCP server: '{server.label}'. {why}",
        status=424,
        type="external_connector_error",
        param=server.param,
        code="http_error",
    )
