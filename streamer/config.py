"""Every `streamer serve` setting, declared once: a field of `Settings` (type, default, help).

From it come the flag and its environment variable (`SETTINGS`: the CLI's parser,
`settings_from`), the settings table in docs/settings.md (`settings_table`) and, for the
settings that override a backend profile's field, the profile (streamer/turns/options.py,
`PROFILE_SETTINGS`).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from dataclasses import Field, dataclass, field, fields
from typing import Any, TypeVar

T = TypeVar("T")


def _bool(text: str) -> bool:
    return text.strip().lower() in {"1", "true", "yes", "on"}


_KINDS: dict[str, Callable[[str], Any]] = {
    "str": str,
    "str | None": str,
    "int": int,
    "float": float,
    "bool": _bool,
    "bool | None": _bool,
    "tuple[str, ...]": str,
}


def setting(default: T, help: str, *, flag: str | None = None, profile: str | None = None) -> T:
    """A `Settings` field that is a setting: its default and help; its type is the field's.
    `flag`: when not `--` + the name in dashes; `profile`: the `BackendProfile` field it
    overrides (streamer/upstream/chat/profiles.py)."""
    return field(default=default, metadata={"help": help, "flag": flag, "profile": profile})


NO_RELOAD = "SIGHUP ignored: started without --config, there is nothing to reload"
"""The warning a SIGHUP gets without `--config` (a single gateway and a supervisor alike)."""


@dataclass(frozen=True, slots=True)
class Settings:
    """Every `streamer serve` setting, each declared once, as a field: its type, default and
    help; the flag is `--` + its name in dashes (unless given), the environment variable
    `STREAMER_` + its name in capitals."""

    upstream: str | None = setting(
        None,
        "Chat Completions base URL, as given to the OpenAI SDK (http://host:8000/v1). "
        "Unset: the embedded scripted model.",
    )
    config: str | None = setting(
        None,
        "TOML file of the models to serve: names, aliases, replicas, fallbacks, limits "
        "(see Several models). Instead of --upstream; SIGHUP reloads it.",
    )
    route_queue_seconds: float = setting(
        30.0,
        "Seconds a request waits for a slot of a model at its max_concurrency; then 429 "
        "with retry-after.",
    )
    health_interval: float = setting(
        10.0,
        "Seconds between health checks of each --config replica (0: off); a replica that "
        "failed is tried last for as long.",
    )
    affinity_entries: int = setting(
        100_000,
        "Responses whose replica affinity (their previous_response_id chain) is remembered.",
    )
    host: str = setting("127.0.0.1", "Address to bind.")
    port: int = setting(8080, "Port to bind.")
    upstream_api_key: str | None = setting(
        None, "Key sent to the backend (Bearer; x-api-key to an anthropic backend)."
    )
    upstream_api: str = setting(
        "chat",
        "What the backend speaks: chat (POST /chat/completions), responses (POST /responses, "
        "streamed, store: false; the gateway keeps the state) or anthropic (POST /messages, "
        "Anthropic Messages; the key in x-api-key). Tools per --backend-profile "
        "(streamer/upstream/responses/profiles.py, streamer/upstream/anthropic/profiles.py).",
    )
    upstream_proxy: str | None = setting(
        None,
        "http:// forward proxy to the backend (https backends through CONNECT). Unset: "
        "from http_proxy / https_proxy / all_proxy (either case); `none`: never. no_proxy "
        "applies either way. https:// and socks proxies are refused at startup.",
    )
    upstream_connect_timeout: float = setting(
        10.0, "Seconds to connect to the backend (proxy, CONNECT and TLS included; 502 beyond)."
    )
    upstream_max_connections: int = setting(
        0,
        "Most connections in use to the backend at once, across the gateway (0: no limit); "
        "more requests wait for one.",
    )
    upstream_max_open_connections: int = setting(
        0,
        "Most backend connections open at once in each process, every backend together, "
        "idle ones included; at the cap the one idle longest is closed, else a request "
        "waits for one (0: its share of the open-file limit, docs/security.md#open-files).",
    )
    upstream_ca_file: str | None = setting(
        None,
        "PEM bundle of the CAs that https backends are verified against, instead of the "
        "system's (e.g. a private CA).",
    )
    forward_authorization: bool = setting(
        False, "Send the client's Authorization header to the backend instead."
    )
    upstream_keepalive: bool = setting(
        True,
        "Reuse backend connections, each only for the client (key) it was opened for; "
        "off: a new connection per request (`Connection: close`).",
    )
    upstream_client_pools: int = setting(
        256,
        "Most clients (keys, forwarded Authorization values) with backend connections "
        "kept at once; the least recently used are let go beyond.",
    )
    api_keys: tuple[str, ...] = setting(
        (), "Key clients must present (repeatable).", flag="--api-key"
    )
    api_key_file: str | None = setting(None, "File with one client key per line.")
    model: str | None = setting(
        None, "Backend model name; the client's model passes through if unset."
    )
    model_metadata: str | None = setting(
        None,
        "TOML (or .json) file of model metadata for Codex, served on GET /v1/models: "
        '`[defaults]` and `[models."<name>"]` with context_window, auto_compact_token_limit, '
        "reasoning_levels, input_modalities, apply_patch_tool_type, "
        "supports_parallel_tool_calls, base_instructions (other keys pass through).",
    )
    tool_name_style: str = setting(
        "codex", "Flat name style: codex, double-underscore, llamacpp, dotted."
    )
    max_tool_name_length: int = setting(64, "Longest flat tool name.")
    max_tools: int = setting(4096, "Most callable tools in one request.")
    max_tool_bytes: int = setting(
        2 * 1024 * 1024, "Largest total size of the tool definitions in one request."
    )
    max_input_items: int = setting(10_000, "Most input items in one request.")
    history_cache_bytes: int = setting(
        64 * 1024 * 1024,
        "Memory for the lowering of recent long turns (16 items or more), kept so that a "
        "turn continuing one (previous_response_id, the WebSocket mode, a replayed "
        "history) lowers only its new items; least recently used dropped first; 0: none.",
    )
    max_body_bytes: int = setting(
        32 * 1024 * 1024,
        "Largest request body on the wire, compressed or not (413 beyond; a larger "
        "Content-Length is refused from the head).",
    )
    max_decoded_body_bytes: int = setting(
        32 * 1024 * 1024,
        "Largest request body once its Content-Encoding is decoded, counted while it is "
        "decoded (413 beyond): a small compressed body cannot become a large one.",
    )
    max_json_values: int = setting(
        1_000_000,
        "Most JSON values (arrays, objects, scalars; an empty array or object counts two) in "
        "one request body or WebSocket message, counted before it is parsed (400 beyond); "
        "bodies of up to 1.5 times as many bytes are never counted.",
    )
    client_header_timeout: float = setting(
        10.0,
        "Seconds a client connection may take to send a request head, from its accept or "
        "the end of its previous response (closed beyond; idle keep-alive ends here too).",
    )
    client_body_timeout: float = setting(
        60.0, "Seconds a client may take to send a whole request body (408 and closed beyond)."
    )
    max_client_connections: int = setting(
        0,
        "Most open client connections; at the cap the one waiting longest for a request "
        "head is evicted, else the newcomer refused (0: its share of the open-file limit, "
        "docs/security.md#open-files).",
    )
    readyz_cache_seconds: float = setting(
        2.0, "Seconds /readyz keeps its backend and store probe (concurrent calls share one)."
    )
    metrics_auth: bool = setting(False, "/metrics requires a client API key, as /v1 routes do.")
    max_header_bytes: int = setting(8190, "Longest request line or header field (400 beyond).")
    max_output_bytes: int = setting(
        16 * 1024 * 1024,
        "Largest answer a backend may produce in one turn (text, reasoning, tool calls), "
        "in characters (bytes for ASCII); beyond, the turn ends incomplete.",
    )
    max_output_items: int = setting(
        2048,
        "Most output items (messages, reasoning, tool calls) in one response; beyond, "
        "the turn ends incomplete.",
    )
    max_turn_seconds: float = setting(
        3600.0, "Longest turn, backend request included; beyond, the turn fails (turn_timeout)."
    )
    max_backend_json_bytes: int = setting(
        256 * 1024 * 1024,
        "Memory for whole-JSON backend answers being read at once, all turns together "
        "(each one is also capped at 4x --max-output-bytes); beyond, 503.",
    )
    backend_profile: str = setting(
        "generic",
        "What the Chat backend accepts: vllm, sglang, llamacpp, ollama, lmstudio, deepseek, "
        "kimi, glm, openrouter, openai or generic (safe for all); the flags below override "
        "single settings (streamer/upstream/chat/profiles.py).",
    )
    fast_http: bool = setting(
        True,
        "Serve plain POST /v1/responses requests on the raw connection, without aiohttp's "
        "request machinery (same answers, less CPU per request); false: aiohttp serves all.",
    )
    reference: str = setting(
        "",
        "Hot-path stages run on their plain equivalent instead of their speed trick: "
        "chunked, sse, shapes, runs, output, encode (comma-separated) or all; the same "
        "answers, more CPU (streamer/core/speed.py).",
    )
    profile_probe: bool = setting(
        True,
        "At startup, read the backend's GET /models (in the background, bounded by the "
        "connect timeout) and log which --backend-profile fits it, if not the configured one.",
    )
    system_messages: str | None = setting(
        None,
        "merge: one leading system message joining instructions and every system/developer "
        "message in order; keep: each where it is; user: later ones become user messages "
        "marked as instructions. Unset: the profile's (generic: merge).",
        profile="system_messages",
    )
    tool_choice_object: bool | None = setting(
        None,
        'Send a forced tool as a named tool_choice object; else "required" with the tools '
        "narrowed to it. Unset: the profile's (generic: false).",
        profile="tool_choice_object",
    )
    tool_choice_required: bool | None = setting(
        None,
        'Send tool_choice "required" when calls are forced; off: "auto" over the narrowed '
        "tools (backends that refuse a forced choice: Kimi thinking, GLM). Unset: the "
        "profile's (generic: true).",
        profile="required_choice",
    )
    reasoning_efforts: str | None = setting(
        None,
        "Comma-separated reasoning efforts the backend takes (others map to the nearest, "
        "but `none` is sent only as itself; empty: never sent; `any`: passed through). Unset: the profile's (generic: "
        "low,medium,high).",
        profile="efforts",
    )
    max_tokens_field: str | None = setting(
        None,
        "max_tokens or max_completion_tokens for max_output_tokens. Unset: the profile's "
        "(generic: max_tokens).",
        profile="max_tokens_field",
    )
    drop_params: str | None = setting(
        None,
        "Comma-separated Chat parameters never sent (user, parallel_tool_calls, "
        "stream_options, …). Unset: the profile's (generic: user).",
        profile="drop",
    )
    file_parts: bool | None = setting(
        None,
        "Send input_file parts (in messages and tool outputs) as Chat file parts; off: such a "
        "part is a 400. Unset: the profile's (generic: true; llamacpp, vllm, ollama: false).",
        profile="file_parts",
    )
    backend_accepts: str | None = setting(
        None,
        "Comma-separated optional Chat parameters the backend takes: logprobs, verbosity, "
        "service_tier, metadata, and prompt_cache_key or cache_salt for the client's "
        "prompt_cache_key. Unset: the profile's (generic: logprobs).",
        profile="accepts",
    )
    replay_reasoning: bool = setting(True, "Deprecated: off is --reasoning-replay off.")
    reasoning_replay: str | None = setting(
        None,
        "The assistant message field earlier turns' readable reasoning is replayed in: "
        "reasoning_content (DeepSeek, Kimi, GLM, SGLang, llama.cpp), reasoning (vLLM, "
        "Ollama, OpenRouter) or off. Unset: the profile's (generic: reasoning_content).",
        profile="reasoning_replay",
    )
    idle_timeout: float = setting(
        300.0, "Seconds the backend may stay silent mid-stream, once its first byte came."
    )
    first_byte_timeout: float = setting(
        0.0,
        "Seconds to wait for the backend's first byte of an answer (it may read a long "
        "prompt first); 0: the idle timeout.",
    )
    store: str = setting(
        "memory",
        "Response store: memory, sqlite:PATH (one process, kept across restarts), or a "
        "Redis shared by every instance: redis://host:port/db, rediss://… (TLS), "
        "redis+cluster://host:port[,host:port…], redis+sentinel://host:port[,…]/service[/db].",
    )
    store_ttl: int = setting(3600, "Seconds a stored response is kept.")
    store_max_bytes: int = setting(
        256 * 1024 * 1024,
        "Most bytes the memory or SQLite store holds (beyond: the oldest written are "
        "dropped); Redis is bounded by its own maxmemory.",
    )
    store_key_prefix: str = setting(
        "streamer:",
        "Prefix of every Redis key the store writes (gateways with different prefixes "
        "share one Redis apart; no { or }).",
    )
    store_tls_ca_file: str | None = setting(
        None, "PEM file of the CAs a rediss:// store's certificate is checked against."
    )
    store_tls_cert_file: str | None = setting(
        None, "PEM client certificate for a rediss:// store that asks for one."
    )
    store_tls_key_file: str | None = setting(None, "PEM key of --store-tls-cert-file.")
    ws_max_message_bytes: int = setting(
        16 * 1024 * 1024, "Largest WebSocket client message (close 1009 beyond)."
    )
    ws_lifetime: float = setting(3600.0, "WebSocket connection lifetime in seconds.")
    ws_compression: bool = setting(
        False,
        "Accept a WebSocket client's permessage-deflate offer (the OpenAI SDK makes one): "
        "frames are compressed, and each socket holds a compressor (about 170 KB) while open "
        "and until the next full garbage collection after it closes "
        "(docs/security.md#websocket-compression); off, the offer is declined and frames go "
        "uncompressed.",
    )
    # each holds its whole history: 16 of them cost 12 MB at 64 sockets of 2,000-token
    # answers (bench fresh probes); Codex chains from its lane's latest only
    ws_remembered: int = setting(
        4,
        "Responses a WebSocket connection remembers for previous_response_id "
        "(each lane's latest kept longest).",
    )
    ws_max_queued_bytes: int = setting(
        32 * 1024 * 1024,
        "Most memory the frames one WebSocket holds queued or running may take, each "
        "charged what it holds once parsed (worked out from its text before parsing; "
        "beyond: an error event, the frame is dropped unparsed).",
    )
    ws_max_queued_frames: int = setting(
        64, "Most frames one WebSocket holds queued or running across its lanes."
    )
    ws_max_rejected_frames: int = setting(
        8,
        "Frames in a row a WebSocket may have rejected for a full queue; the next closes it 1008.",
    )
    store_timeout: float = setting(
        2.0, "Seconds one response-store operation may take before the store counts as unavailable."
    )
    background_store_wait: float = setting(
        10.0,
        "Seconds a background turn waits for a stalled store before it ends failed "
        "(store_unavailable).",
    )
    background_cancel_wait: float = setting(
        5.0,
        "Seconds a cancel waits for the instance running a background turn to end it, "
        "before ending it itself.",
    )
    background_lease: float = setting(
        10.0,
        "Seconds the lease an instance holds on each background turn it runs lasts "
        "(renewed every third of it). An instance that stops renewing (killed, lost) has its "
        "turns ended failed once their lease lapses, by whichever instance sees it first: "
        "a poll, a follower, or the sweep each instance makes at startup and at this interval.",
    )
    background_max_turns: int = setting(
        0,
        "Most background turns running at once in each process; beyond, a create is a 429 "
        "with retry-after (0: half the backend connections, docs/security.md#open-files).",
    )
    background_max_per_client: int = setting(
        0,
        "Most background turns one client (API key) runs at once in each process; beyond, "
        "a 429 with retry-after (0: a quarter of --background-max-turns).",
    )
    state_key_file: str | None = setting(
        None,
        "File holding the secret (32+ bytes) that seals encrypted_content (compaction, "
        "reasoning); instances that share it open each other's. Unset: a random key per "
        "process (a restart cannot open older items).",
    )
    tap_dir: str | None = setting(None, "Record every exchange as JSON lines in this folder.")
    sse_keepalive: float = setting(
        15.0,
        "Seconds an SSE stream or a background follower may be quiet before a comment "
        "(`: keepalive`) goes out, so a proxy's idle timeout does not cut it (0: never).",
    )
    shutdown_grace: float = setting(
        30.0,
        "Seconds the turns in flight (HTTP, WebSocket and background alike) get to finish on "
        "SIGTERM; past it each ends failed.",
    )
    drain_seconds: float = setting(
        0.0,
        "Seconds between SIGTERM and the listener closing, in which /readyz answers 503 and "
        "answers close their connection while everything is served as before, so a load "
        "balancer moves the traffic first (set it above its health check's interval times "
        "its fall count); then --shutdown-grace. Not on SIGINT.",
    )
    trim_after: float = setting(
        2.0, "Seconds without a turn after which freed memory goes back to the OS (0: never)."
    )
    workers: int = setting(
        1,
        "Processes serving the one port (SO_REUSEPORT where the system has it, else one "
        "shared listening socket), supervised: one that dies is restarted, SIGTERM drains "
        "them all. Above 1 needs --store redis://… .",
    )
    worker_restart_limit: int = setting(
        5,
        "Restarts one worker may have in 60 s; beyond, its next start waits until the "
        "oldest of them is 60 s old (logged).",
    )
    mcp: str = setting(
        "on",
        'Remote MCP servers (`{"type": "mcp"}` tools) run by the gateway: on or off '
        "(then such a tool is a 400).",
    )
    mcp_allow: tuple[str, ...] = setting(
        (),
        "Host pattern an MCP server_url may reach (repeatable): a name, *.domain, an IP, a "
        "CIDR, public or *. Unset: public addresses only (no private, loopback, link-local).",
    )
    mcp_timeout: float = setting(30.0, "Seconds per MCP operation (list, call); then an error.")
    mcp_max_calls: int = setting(
        32, "MCP tool calls one response may run (max_tool_calls lowers it)."
    )
    mcp_max_tools: int = setting(128, "Tools one MCP server may list; more is a 424.")
    mcp_max_list_bytes: int = setting(
        1024 * 1024, "Bytes of one MCP server's tool list (its JSON); more is a 424."
    )
    mcp_max_output_bytes: int = setting(
        1024 * 1024, "Bytes of one MCP call's output; more is the call's error."
    )
    mcp_cache_seconds: float = setting(
        300.0, "Seconds a listed MCP tool list is reused (per server URL and headers)."
    )
    mcp_cache_entries: int = setting(256, "MCP tool lists kept cached at most (oldest out).")
    optional_hosted_tool: tuple[str, ...] = setting(
        ("web_search",),
        "Hosted tool types the gateway cannot run that are left out (logged) rather than "
        "a 400 (repeatable).",
    )
    log_level: str = setting("warning", "debug, info, warning or error.")
    access_log: bool = setting(
        True,
        "One access line per request (and per WebSocket or background turn), whatever "
        "--log-level: request and response ids, model, replica, status, tokens, times; "
        "off: none.",
    )
    extra: dict[str, Any] = field(default_factory=dict)
    # the state key a `--workers` supervisor made for its workers (no --state-key-file)
    shared_state_key: bytes | None = field(default=None, repr=False, compare=False)

    def client_keys(self) -> frozenset[str]:
        """Keys from `--api-key` and `--api-key-file` (blank and `#` lines skipped), read once."""
        keys = {k.strip() for k in self.api_keys if k.strip()}  # "" would admit everyone
        if self.api_key_file:
            with open(self.api_key_file, encoding="utf-8") as fh:
                lines = (line.strip() for line in fh)
                keys.update(line for line in lines if line and not line.startswith("#"))
        return frozenset(keys)


@dataclass(frozen=True, slots=True)
class Setting:
    """One setting as the command line, the environment and docs/settings.md see it."""

    flag: str
    dest: str
    default: Any
    help: str
    kind: Callable[[str], Any] = str
    repeat: bool = False  # may be given several times (flag) / comma-separated (env)
    profile: str | None = None  # the BackendProfile field it overrides

    @property
    def env(self) -> str:
        return "STREAMER_" + self.dest.upper()

    @property
    def boolean(self) -> bool:
        """A switch: `--flag`, `--flag false`, 1/true/yes/on."""
        return self.kind is _bool


def _setting(f: Field[Any]) -> Setting:
    kind = f.type if isinstance(f.type, str) else f.type.__name__
    if kind not in _KINDS:
        raise TypeError(f"setting {f.name}: no reader for a {kind}")
    return Setting(
        f.metadata["flag"] or "--" + f.name.replace("_", "-"),
        f.name,
        f.default,
        f.metadata["help"],
        _KINDS[kind],
        repeat=kind.startswith("tuple"),
        profile=f.metadata["profile"],
    )


SETTINGS: tuple[Setting, ...] = tuple(_setting(f) for f in fields(Settings) if "help" in f.metadata)
"""The settings in their order: the parser, `settings_from`, the table in docs/settings.md."""
PROFILE_SETTINGS: dict[str, str] = {s.dest: s.profile for s in SETTINGS if s.profile is not None}
"""The settings that override a field of the backend profile: setting -> field."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add every setting as a flag whose default comes from its environment variable."""
    for s in SETTINGS:
        raw = os.environ.get(s.env)
        if s.repeat:
            default = tuple(v for v in (raw or "").split(",") if v) or s.default
            parser.add_argument(
                s.flag,
                dest=s.dest,
                action="append",
                default=None,
                help=f"{s.help} [env {s.env}, comma-separated]",
            )
            parser.set_defaults(**{f"_{s.dest}_env": default})
            continue
        default = s.kind(raw) if raw is not None else s.default
        if s.kind is _bool:
            parser.add_argument(
                s.flag,
                dest=s.dest,
                nargs="?",
                const=True,
                default=default,
                type=_bool,
                help=f"{s.help} [env {s.env}]",
            )
        else:
            parser.add_argument(
                s.flag,
                dest=s.dest,
                type=s.kind,
                default=default,
                help=f"{s.help} [env {s.env}, default {s.default}]",
            )


def settings_from(args: argparse.Namespace) -> Settings:
    """The settings the parsed flags (and, under them, the environment) give."""
    values: dict[str, Any] = {}
    for s in SETTINGS:
        value = getattr(args, s.dest, None)
        if s.repeat:
            value = tuple(value) if value else getattr(args, f"_{s.dest}_env", s.default)
        values[s.dest] = value
    return Settings(**values)


def settings_table(rows: Sequence[Setting] = SETTINGS) -> str:
    """The settings table of docs/settings.md (Markdown)."""
    lines = ["| flag | environment | default | meaning |", "|---|---|---|---|"]
    for s in rows:
        default = "" if s.default in (None, ()) else f"`{s.default}`"
        lines.append(f"| `{s.flag}` | `{s.env}` | {default} | {s.help} |")
    return "\n".join(lines)
