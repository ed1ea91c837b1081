"""Every `streamer serve` setting in one table: flag, environment variable, default.

The CLI builds its parser from `SETTINGS`, and the README's settings table is the
same list, so a setting exists in exactly one place.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any


@dataclass(frozen=True, slots=True)
class Setting:
    flag: str
    dest: str
    default: Any
    help: str
    kind: Callable[[str], Any] = str
    repeat: bool = False  # may be given several times (flag) / comma-separated (env)

    @property
    def env(self) -> str:
        return "STREAMER_" + self.dest.upper()


def _bool(text: str) -> bool:
    return text.strip().lower() in {"1", "true", "yes", "on"}


SETTINGS: tuple[Setting, ...] = (
    Setting(
        "--upstream",
        "upstream",
        None,
        "Chat Completions base URL, as given to the OpenAI SDK (http://host:8000/v1). "
        "Unset: the embedded scripted model.",
    ),
    Setting(
        "--config",
        "config",
        None,
        "TOML file of the models to serve: names, aliases, replicas, fallbacks, limits "
        "(see Several models). Instead of --upstream; SIGHUP reloads it.",
    ),
    Setting(
        "--route-queue-seconds",
        "route_queue_seconds",
        30.0,
        "Seconds a request waits for a slot of a model at its max_concurrency; then 429 "
        "with retry-after.",
        float,
    ),
    Setting(
        "--health-interval",
        "health_interval",
        10.0,
        "Seconds between health checks of each --config replica (0: off); a replica that "
        "failed is tried last for as long.",
        float,
    ),
    Setting(
        "--affinity-entries",
        "affinity_entries",
        100_000,
        "Responses whose replica affinity (their previous_response_id chain) is remembered.",
        int,
    ),
    Setting("--host", "host", "127.0.0.1", "Address to bind."),
    Setting("--port", "port", 8080, "Port to bind.", int),
    Setting("--upstream-api-key", "upstream_api_key", None, "Bearer key sent to the backend."),
    Setting(
        "--upstream-api",
        "upstream_api",
        "chat",
        "What the backend speaks: chat (POST /chat/completions) or responses (POST /responses, "
        "streamed, store: false; the gateway keeps the state). Tools per --backend-profile "
        "(streamer/upstream/responses/profiles.py).",
    ),
    Setting(
        "--upstream-proxy",
        "upstream_proxy",
        None,
        "http:// forward proxy to the backend (https backends through CONNECT). Unset: "
        "from http_proxy / https_proxy / all_proxy (either case); `none`: never. no_proxy "
        "applies either way. https:// and socks proxies are refused at startup.",
    ),
    Setting(
        "--upstream-connect-timeout",
        "upstream_connect_timeout",
        10.0,
        "Seconds to connect to the backend (proxy, CONNECT and TLS included; 502 beyond).",
        float,
    ),
    Setting(
        "--upstream-max-connections",
        "upstream_max_connections",
        0,
        "Most connections in use to the backend at once, across the gateway (0: no limit); "
        "more requests wait for one.",
        int,
    ),
    Setting(
        "--upstream-ca-file",
        "upstream_ca_file",
        None,
        "PEM bundle of the CAs that https backends are verified against, instead of the "
        "system's (e.g. a private CA).",
    ),
    Setting(
        "--forward-authorization",
        "forward_authorization",
        False,
        "Send the client's Authorization header to the backend instead.",
        _bool,
    ),
    Setting(
        "--upstream-keepalive",
        "upstream_keepalive",
        True,
        "Reuse backend connections, each only for the client (key) it was opened for; "
        "off: a new connection per request (`Connection: close`).",
        _bool,
    ),
    Setting(
        "--upstream-client-pools",
        "upstream_client_pools",
        256,
        "Most clients (keys, forwarded Authorization values) with backend connections "
        "kept at once; the least recently used are let go beyond.",
        int,
    ),
    Setting("--api-key", "api_keys", (), "Key clients must present (repeatable).", str, True),
    Setting("--api-key-file", "api_key_file", None, "File with one client key per line."),
    Setting(
        "--model", "model", None, "Backend model name; the client's model passes through if unset."
    ),
    Setting(
        "--model-metadata",
        "model_metadata",
        None,
        "TOML (or .json) file of model metadata for Codex, served on GET /v1/models: "
        '`[defaults]` and `[models."<name>"]` with context_window, auto_compact_token_limit, '
        "reasoning_levels, input_modalities, apply_patch_tool_type, "
        "supports_parallel_tool_calls, base_instructions (other keys pass through).",
    ),
    Setting(
        "--tool-name-style",
        "tool_name_style",
        "codex",
        "Flat name style: codex, double-underscore, llamacpp, dotted.",
    ),
    Setting("--max-tool-name-length", "max_tool_name_length", 64, "Longest flat tool name.", int),
    Setting("--max-tools", "max_tools", 4096, "Most callable tools in one request.", int),
    Setting(
        "--max-tool-bytes",
        "max_tool_bytes",
        2 * 1024 * 1024,
        "Largest total size of the tool definitions in one request.",
        int,
    ),
    Setting(
        "--max-input-items", "max_input_items", 10_000, "Most input items in one request.", int
    ),
    Setting(
        "--max-body-bytes",
        "max_body_bytes",
        32 * 1024 * 1024,
        "Largest request body on the wire, compressed or not (413 beyond; a larger "
        "Content-Length is refused from the head).",
        int,
    ),
    Setting(
        "--max-decoded-body-bytes",
        "max_decoded_body_bytes",
        32 * 1024 * 1024,
        "Largest request body once its Content-Encoding is decoded, counted while it is "
        "decoded (413 beyond): a small compressed body cannot become a large one.",
        int,
    ),
    Setting(
        "--client-header-timeout",
        "client_header_timeout",
        10.0,
        "Seconds a client connection may take to send a request head, from its accept or "
        "the end of its previous response (closed beyond; idle keep-alive ends here too).",
        float,
    ),
    Setting(
        "--client-body-timeout",
        "client_body_timeout",
        60.0,
        "Seconds a client may take to send a whole request body (408 and closed beyond).",
        float,
    ),
    Setting(
        "--max-client-connections",
        "max_client_connections",
        0,
        "Most open client connections; at the cap the one waiting longest for a request "
        "head is evicted, else the newcomer refused (0: 3/4 of the open-file limit).",
        int,
    ),
    Setting(
        "--readyz-cache-seconds",
        "readyz_cache_seconds",
        2.0,
        "Seconds /readyz keeps its backend and store probe (concurrent calls share one).",
        float,
    ),
    Setting(
        "--metrics-auth",
        "metrics_auth",
        False,
        "/metrics requires a client API key, as /v1 routes do.",
        _bool,
    ),
    Setting(
        "--max-header-bytes",
        "max_header_bytes",
        8190,
        "Longest request line or header field (400 beyond).",
        int,
    ),
    Setting(
        "--max-output-bytes",
        "max_output_bytes",
        16 * 1024 * 1024,
        "Largest answer a backend may produce in one turn (text, reasoning, tool calls), "
        "in characters (bytes for ASCII); beyond, the turn ends incomplete.",
        int,
    ),
    Setting(
        "--max-output-items",
        "max_output_items",
        2048,
        "Most output items (messages, reasoning, tool calls) in one response; beyond, "
        "the turn ends incomplete.",
        int,
    ),
    Setting(
        "--max-turn-seconds",
        "max_turn_seconds",
        3600.0,
        "Longest turn, backend request included; beyond, the turn fails (turn_timeout).",
        float,
    ),
    Setting(
        "--max-backend-json-bytes",
        "max_backend_json_bytes",
        256 * 1024 * 1024,
        "Memory for whole-JSON backend answers being read at once, all turns together "
        "(each one is also capped at 4x --max-output-bytes); beyond, 503.",
        int,
    ),
    Setting(
        "--backend-profile",
        "backend_profile",
        "generic",
        "What the Chat backend accepts: vllm, sglang, llamacpp, ollama, lmstudio, deepseek, "
        "kimi, glm, openrouter, openai or generic (safe for all); the flags below override "
        "single settings (streamer/upstream/chat/profiles.py).",
    ),
    Setting(
        "--fast-http",
        "fast_http",
        True,
        "Serve plain POST /v1/responses requests on the raw connection, without aiohttp's "
        "request machinery (same answers, less CPU per request); false: aiohttp serves all.",
        _bool,
    ),
    Setting(
        "--profile-probe",
        "profile_probe",
        True,
        "At startup, read the backend's GET /models (in the background, bounded by the "
        "connect timeout) and log which --backend-profile fits it, if not the configured one.",
        _bool,
    ),
    Setting(
        "--system-messages",
        "system_messages",
        None,
        "merge: one leading system message joining instructions and every system/developer "
        "message in order; keep: each where it is; user: later ones become user messages "
        "marked as instructions. Unset: the profile's (generic: merge).",
    ),
    Setting(
        "--tool-choice-object",
        "tool_choice_object",
        None,
        'Send a forced tool as a named tool_choice object; else "required" with the tools '
        "narrowed to it. Unset: the profile's (generic: false).",
        _bool,
    ),
    Setting(
        "--tool-choice-required",
        "tool_choice_required",
        None,
        'Send tool_choice "required" when calls are forced; off: "auto" over the narrowed '
        "tools (backends that refuse a forced choice: Kimi thinking, GLM). Unset: the "
        "profile's (generic: true).",
        _bool,
    ),
    Setting(
        "--reasoning-efforts",
        "reasoning_efforts",
        None,
        "Comma-separated reasoning efforts the backend takes (others map to the nearest, "
        "but `none` is sent only as itself; empty: never sent; `any`: passed through). Unset: the profile's (generic: "
        "low,medium,high).",
    ),
    Setting(
        "--max-tokens-field",
        "max_tokens_field",
        None,
        "max_tokens or max_completion_tokens for max_output_tokens. Unset: the profile's "
        "(generic: max_tokens).",
    ),
    Setting(
        "--drop-params",
        "drop_params",
        None,
        "Comma-separated Chat parameters never sent (user, parallel_tool_calls, "
        "stream_options, …). Unset: the profile's (generic: user).",
    ),
    Setting(
        "--file-parts",
        "file_parts",
        None,
        "Send input_file parts (in messages and tool outputs) as Chat file parts; off: such a "
        "part is a 400. Unset: the profile's (generic: true; llamacpp, vllm, ollama: false).",
        _bool,
    ),
    Setting(
        "--backend-accepts",
        "backend_accepts",
        None,
        "Comma-separated optional Chat parameters the backend takes: logprobs, verbosity, "
        "service_tier, metadata, and prompt_cache_key or cache_salt for the client's "
        "prompt_cache_key. Unset: the profile's (generic: logprobs).",
    ),
    Setting(
        "--replay-reasoning",
        "replay_reasoning",
        True,
        "Deprecated: off is --reasoning-replay off.",
        _bool,
    ),
    Setting(
        "--reasoning-replay",
        "reasoning_replay",
        None,
        "The assistant message field earlier turns' readable reasoning is replayed in: "
        "reasoning_content (DeepSeek, Kimi, GLM, SGLang, llama.cpp), reasoning (vLLM, "
        "Ollama, OpenRouter) or off. Unset: the profile's (generic: reasoning_content).",
    ),
    Setting(
        "--idle-timeout",
        "idle_timeout",
        300.0,
        "Seconds the backend may stay silent mid-stream, once its first byte came.",
        float,
    ),
    Setting(
        "--first-byte-timeout",
        "first_byte_timeout",
        0.0,
        "Seconds to wait for the backend's first byte of an answer (it may read a long "
        "prompt first); 0: the idle timeout.",
        float,
    ),
    Setting("--store", "store", "memory", "Response store: memory, or redis://host:port/db."),
    Setting("--store-ttl", "store_ttl", 3600, "Seconds a stored response is kept.", int),
    Setting(
        "--ws-max-message-bytes",
        "ws_max_message_bytes",
        16 * 1024 * 1024,
        "Largest WebSocket client message (close 1009 beyond).",
        int,
    ),
    Setting(
        "--ws-lifetime", "ws_lifetime", 3600.0, "WebSocket connection lifetime in seconds.", float
    ),
    Setting(
        "--ws-remembered",
        "ws_remembered",
        # each holds its whole history: 16 of them cost 12 MB at 64 sockets of 2,000-token
        # answers (bench fresh probes); Codex chains from its lane's latest only
        4,
        "Responses a WebSocket connection remembers for previous_response_id "
        "(each lane's latest kept longest).",
        int,
    ),
    Setting(
        "--ws-max-queued-bytes",
        "ws_max_queued_bytes",
        32 * 1024 * 1024,
        "Largest total size of the frames one WebSocket holds queued or running "
        "(beyond: an error event, the frame is dropped).",
        int,
    ),
    Setting(
        "--ws-max-queued-frames",
        "ws_max_queued_frames",
        64,
        "Most frames one WebSocket holds queued or running across its lanes.",
        int,
    ),
    Setting(
        "--ws-max-rejected-frames",
        "ws_max_rejected_frames",
        8,
        "Frames in a row a WebSocket may have rejected for a full queue; the next closes it 1008.",
        int,
    ),
    Setting(
        "--store-timeout",
        "store_timeout",
        2.0,
        "Seconds one response-store operation may take before the store counts as unavailable.",
        float,
    ),
    Setting(
        "--background-store-wait",
        "background_store_wait",
        10.0,
        "Seconds a background turn waits for a stalled store before it ends failed "
        "(store_unavailable).",
        float,
    ),
    Setting(
        "--background-cancel-wait",
        "background_cancel_wait",
        5.0,
        "Seconds a cancel waits for the instance running a background turn to end it, "
        "before ending it itself.",
        float,
    ),
    Setting(
        "--state-key-file",
        "state_key_file",
        None,
        "File holding the secret (32+ bytes) that seals encrypted_content (compaction, "
        "reasoning); instances that share it open each other's. Unset: a random key per "
        "process (a restart cannot open older items).",
    ),
    Setting("--tap-dir", "tap_dir", None, "Record every exchange as JSON lines in this folder."),
    Setting(
        "--shutdown-grace",
        "shutdown_grace",
        30.0,
        "Seconds in-flight streams get to finish on SIGTERM.",
        float,
    ),
    Setting(
        "--trim-after",
        "trim_after",
        2.0,
        "Seconds without a turn after which freed memory goes back to the OS (0: never).",
        float,
    ),
    Setting(
        "--workers",
        "workers",
        1,
        "Processes serving the one port (SO_REUSEPORT where the system has it, else one "
        "shared listening socket), supervised: one that dies is restarted, SIGTERM drains "
        "them all. Above 1 needs --store redis://… .",
        int,
    ),
    Setting(
        "--worker-restart-limit",
        "worker_restart_limit",
        5,
        "Restarts one worker may have in 60 s; beyond, its next start waits until the "
        "oldest of them is 60 s old (logged).",
        int,
    ),
    Setting("--log-level", "log_level", "warning", "debug, info, warning or error."),
)


@dataclass(frozen=True, slots=True)
class Settings:
    upstream: str | None = None
    config: str | None = None
    route_queue_seconds: float = 30.0
    health_interval: float = 10.0
    affinity_entries: int = 100_000
    host: str = "127.0.0.1"
    port: int = 8080
    upstream_api_key: str | None = None
    upstream_api: str = "chat"
    upstream_proxy: str | None = None
    upstream_connect_timeout: float = 10.0
    upstream_max_connections: int = 0
    upstream_ca_file: str | None = None
    forward_authorization: bool = False
    upstream_keepalive: bool = True
    upstream_client_pools: int = 256
    api_keys: tuple[str, ...] = ()
    api_key_file: str | None = None
    model: str | None = None
    model_metadata: str | None = None
    tool_name_style: str = "codex"
    max_tool_name_length: int = 64
    max_tools: int = 4096
    max_tool_bytes: int = 2 * 1024 * 1024
    max_input_items: int = 10_000
    max_body_bytes: int = 32 * 1024 * 1024
    max_decoded_body_bytes: int = 32 * 1024 * 1024
    client_header_timeout: float = 10.0
    client_body_timeout: float = 60.0
    max_client_connections: int = 0
    readyz_cache_seconds: float = 2.0
    metrics_auth: bool = False
    max_header_bytes: int = 8190
    max_output_bytes: int = 16 * 1024 * 1024
    max_output_items: int = 2048
    max_turn_seconds: float = 3600.0
    max_backend_json_bytes: int = 256 * 1024 * 1024
    backend_profile: str = "generic"
    fast_http: bool = True
    profile_probe: bool = True
    system_messages: str | None = None
    tool_choice_object: bool | None = None
    tool_choice_required: bool | None = None
    reasoning_efforts: str | None = None
    max_tokens_field: str | None = None
    drop_params: str | None = None
    file_parts: bool | None = None
    backend_accepts: str | None = None
    replay_reasoning: bool = True
    reasoning_replay: str | None = None
    idle_timeout: float = 300.0
    first_byte_timeout: float = 0.0
    store: str = "memory"
    store_ttl: int = 3600
    ws_max_message_bytes: int = 16 * 1024 * 1024
    ws_lifetime: float = 3600.0
    ws_remembered: int = 4
    ws_max_queued_bytes: int = 32 * 1024 * 1024
    ws_max_queued_frames: int = 64
    ws_max_rejected_frames: int = 8
    store_timeout: float = 2.0
    background_store_wait: float = 10.0
    background_cancel_wait: float = 5.0
    state_key_file: str | None = None
    tap_dir: str | None = None
    shutdown_grace: float = 30.0
    trim_after: float = 2.0
    workers: int = 1
    worker_restart_limit: int = 5
    log_level: str = "warning"
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
    values: dict[str, Any] = {}
    names = {f.name for f in fields(Settings)}
    for s in SETTINGS:
        value = getattr(args, s.dest, None)
        if s.repeat:
            value = tuple(value) if value else getattr(args, f"_{s.dest}_env", s.default)
        if s.dest in names:
            values[s.dest] = value
    return Settings(**values)


def settings_table(rows: Sequence[Setting] = SETTINGS) -> str:
    """The README's settings table (Markdown)."""
    lines = ["| flag | environment | default | meaning |", "|---|---|---|---|"]
    for s in rows:
        default = "" if s.default in (None, ()) else f"`{s.default}`"
        lines.append(f"| `{s.flag}` | `{s.env}` | {default} | {s.help} |")
    return "\n".join(lines)
