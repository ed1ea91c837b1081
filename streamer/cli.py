"""The `streamer` command: serve | codex | tap | replay."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence

from streamer import __version__
from streamer.config import add_arguments, settings_from

DISTRIBUTION = "streamer-gateway"  # the name on PyPI; the import name stays `streamer`


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; with `command` "serve", just that one (the others' modules,
    the tap's client among them, are not imported by a gateway)."""
    parser = argparse.ArgumentParser(
        prog="streamer",
        description="An OpenAI Responses gateway with namespace tools.",
        allow_abbrev=False,  # `--upstream-api` must never be read as `--upstream-api-key`
    )
    version = f"{DISTRIBUTION} {__version__}"
    parser.add_argument("--version", action="version", version=version)
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the gateway", allow_abbrev=False)
    serve.add_argument("--version", action="version", version=version)
    add_arguments(serve)
    if command == "serve":  # the others by name only, for the same usage line
        for name in ("codex", "tap", "replay"):
            commands.add_parser(name)
        return parser
    from streamer.codex_launch import add_codex_parser
    from streamer.tap.command import add_tap_parser
    from streamer.tap.replay import add_replay_parser

    add_codex_parser(commands)
    add_tap_parser(commands)
    add_replay_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["serve"]:
        passthrough: list[str] = []
        parser = build_parser("serve")
    else:
        from streamer.codex_launch import split_passthrough

        argv, passthrough = split_passthrough(argv)
        parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "codex":
        return _codex(parser, args, argv, passthrough)
    if args.command == "serve":
        from streamer.app import check_settings, serve

        settings = settings_from(args)
        try:
            check_settings(settings)
        except ValueError as exc:
            parser.error(str(exc))  # exits 2, with the usage line
        if settings.workers > 1:
            from streamer.supervisor import supervise

            return supervise(settings)
        serve(settings)
        return 0
    if args.command == "tap":
        from streamer.tap.command import run_tap

        return asyncio.run(run_tap(args))
    if args.command == "replay":
        from streamer.tap.replay import run_replay

        return asyncio.run(run_replay(args))
    return 2


def _codex(
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    argv: Sequence[str],
    passthrough: Sequence[str],
) -> int:
    from streamer.app import check_settings
    from streamer.codex_launch import run_codex

    try:
        check_settings(settings_from(args))
    except ValueError as exc:
        parser.error(str(exc))
    return run_codex(args, argv, passthrough)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
