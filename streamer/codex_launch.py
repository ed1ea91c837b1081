"""`streamer codex [serve flags…] [-- codex args…]`: the Codex CLI through the gateway.

It reuses a gateway that answers on `--host`/`--port`, or starts one (`streamer serve` with the
same flags, its log in `<codex home>/gateway.log`) for as long as Codex runs, then runs Codex
with an isolated `CODEX_HOME` whose `config.toml` points at the gateway, passes the args
through and returns Codex's exit code. `--print-config` prints that block and exits.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from streamer.codex_config import KEY_ENV, codex_config
from streamer.config import Settings, add_arguments, settings_from

READY_SECONDS = 30.0  # for a gateway we start to answer /healthz
STOP_SECONDS = 10.0  # for it to exit on SIGTERM (no turn is in flight by then)
EMBEDDED_MODEL = "scripted"  # what the embedded scripted model lists


def _codex_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--print-config",
        action="store_true",
        help="print the Codex config.toml block for this gateway and exit",
    )
    parser.add_argument(
        "--codex-bin",
        default=os.environ.get("CODEX_BIN"),
        help="the Codex CLI to run [env CODEX_BIN; default: codex on PATH]",
    )
    parser.add_argument(
        "--codex-home",
        default=None,
        help="CODEX_HOME to run Codex with [default: $XDG_STATE_HOME/streamer/codex]",
    )
    parser.add_argument(
        "--codex-model",
        default=None,
        help="model Codex asks for [default: --model, else the first model the gateway lists]",
    )
    parser.add_argument(
        "--codex-remote-compaction",
        action="store_true",
        help="Codex asks the gateway to compact (its provider is named OpenAI); default: "
        "Codex compacts itself",
    )
    parser.add_argument(
        "--codex-sse",
        action="store_true",
        help="Codex talks SSE over HTTP (default: the WebSocket mode)",
    )


def add_codex_parser(commands: Any) -> None:
    codex = commands.add_parser(
        "codex",
        help="run the Codex CLI through the gateway: streamer codex [flags] [-- codex args]",
        description="Run the Codex CLI through a gateway on --host/--port (started with these "
        "flags if none answers there). Arguments after `--` go to Codex.",
        allow_abbrev=False,
    )
    add_arguments(codex)
    _codex_options(codex)


def split_passthrough(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """`streamer codex … -- args` -> (the streamer part, Codex's args)."""
    argv = list(argv)
    if argv[:1] == ["codex"] and "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1 :]
    return argv, []


def serve_flags(argv: Sequence[str]) -> list[str]:
    """The `streamer serve` flags among `streamer codex`'s (every one but Codex's own)."""
    own = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    _codex_options(own)
    _, rest = own.parse_known_args(list(argv))
    return rest


def origin_of(settings: Settings) -> str:
    host = settings.host
    host = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{settings.port}"


def _get_json(url: str, key: str | None, timeout: float) -> Any:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: no proxy
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {key or 'unused'}"})
    with opener.open(request, timeout=timeout) as reply:
        return json.loads(reply.read())


def answers(origin: str) -> bool:
    """Whether a streamer gateway answers at `origin` (its /healthz, with turn counters)."""
    try:
        body = _get_json(origin + "/healthz", None, 1.0)
    except (OSError, ValueError):
        return False
    return isinstance(body, dict) and body.get("status") == "ok" and "stats" in body


def listed_models(origin: str, key: str | None) -> list[str]:
    """The slugs the gateway describes for Codex, or [] if it does not answer."""
    try:
        body = _get_json(origin + "/v1/models", key, 5.0)
    except (OSError, ValueError):
        return []
    models = body.get("models") if isinstance(body, dict) else None
    return [
        m["slug"] for m in models or [] if isinstance(m, dict) and isinstance(m.get("slug"), str)
    ]


def pick_model(args: argparse.Namespace, settings: Settings, origin: str, key: str | None) -> str:
    """--codex-model, --model, the metadata file's first model, the gateway's first, or the
    embedded model's name; SystemExit(2) when none is known."""
    from streamer.core.model_metadata import load_model_catalog

    if args.codex_model or settings.model:
        return str(args.codex_model or settings.model)
    named = list(load_model_catalog(settings.model_metadata).models)
    listed = named or listed_models(origin, key)
    if listed:
        return listed[0]
    if not settings.upstream:
        return EMBEDDED_MODEL
    raise SystemExit(f"streamer codex: no model known: give --codex-model or --model ({origin})")


def find_codex(explicit: str | None) -> str:
    found = shutil.which(explicit or "codex")
    if found is None:
        what = explicit or "codex on PATH"
        raise SystemExit(f"streamer codex: Codex CLI not found ({what}): npm i -g @openai/codex")
    return found


def default_home() -> Path:
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(Path.home(), ".local", "state")
    return Path(state) / "streamer" / "codex"


@contextlib.contextmanager
def gateway_at(origin: str, flags: Sequence[str], log_path: Path) -> Iterator[None]:
    """A gateway answering at `origin`: the one already there, or `streamer serve *flags`
    until the block ends."""
    if answers(origin):
        print(f"streamer codex: using the gateway at {origin}", file=sys.stderr)
        yield
        return
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "streamer", "serve", *flags],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
        )
    try:
        _until_ready(proc, origin, log_path)
        yield
    finally:
        _stop(proc)


def _until_ready(proc: subprocess.Popen[bytes], origin: str, log_path: Path) -> None:
    deadline = time.monotonic() + READY_SECONDS
    while not answers(origin):
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = log_path.read_text(errors="replace")[-2000:]
            why = f"exited with {proc.returncode}" if proc.poll() is not None else "not ready"
            raise SystemExit(f"streamer codex: the gateway {why} ({log_path}):\n{tail}")
        time.sleep(0.1)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(STOP_SECONDS)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run_child(argv: Sequence[str], env: dict[str, str]) -> int:
    """Run Codex in the foreground: Ctrl-C is Codex's to handle, a SIGTERM is passed on to it.
    Its exit code (128+N for a signal N, as shells report it)."""
    child = subprocess.Popen(list(argv), env=env)  # the terminal stays Codex's
    previous_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
    previous_term = signal.signal(signal.SIGTERM, lambda *_: child.terminate())
    try:
        code = child.wait()
    finally:
        signal.signal(signal.SIGINT, previous_int)
        signal.signal(signal.SIGTERM, previous_term)
    return 128 - code if code < 0 else code


def run_codex(args: argparse.Namespace, argv: Sequence[str], passthrough: Sequence[str]) -> int:
    """`streamer codex`: print the config, or launch Codex through a gateway."""
    settings = settings_from(args)
    origin = origin_of(settings)
    keys = sorted(settings.client_keys())
    key = keys[0] if keys else None
    key_env = KEY_ENV if key else None
    websockets = not args.codex_sse
    if args.print_config:
        model = pick_model(args, settings, origin, key)
        print(
            codex_config(
                origin + "/v1",
                model,
                websockets=websockets,
                key_env=key_env,
                remote_compaction=args.codex_remote_compaction,
            ),
            end="",
        )
        return 0
    binary = find_codex(args.codex_bin)
    home = Path(args.codex_home) if args.codex_home else default_home()
    home.mkdir(parents=True, exist_ok=True)
    with gateway_at(origin, serve_flags(argv[1:]), home / "gateway.log"):
        model = pick_model(args, settings, origin, key)
        config = codex_config(
            origin + "/v1",
            model,
            websockets=websockets,
            key_env=key_env,
            remote_compaction=args.codex_remote_compaction,
        )
        (home / "config.toml").write_text(config, encoding="utf-8")
        env = {**os.environ, "CODEX_HOME": str(home)}
        if key:
            env[KEY_ENV] = key
        return run_child([binary, *passthrough], env)
