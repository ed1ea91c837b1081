"""`streamer tap SOURCE`: the command line around sources, checker and renderer.

Exit status: 0 when the stream is clean, 1 on grammar violations, 2 when the source cannot
be read (missing file, refused connection, bad URL, HTTP error status, unknown format).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Any, TextIO

import orjson

from streamer.core.errors import RequestError
from streamer.core.tools import ResponsesToolNames
from streamer.tap.grammar import GrammarChecker
from streamer.tap.render import Renderer
from streamer.tap.sources import DELTA_FORMATS, Source, SourceError

EXIT_CLEAN, EXIT_VIOLATIONS, EXIT_UNREADABLE = 0, 1, 2

DESCRIPTION = """\
Read a Responses stream (SSE, a WebSocket frame log or a `serve --tap-dir` recording) or a
Chat Completions stream, check the Responses event grammar and show it as a timeline.
SOURCE is a file, - for stdin, an http(s):// URL (POSTs --data, else GETs) or a ws(s):// URL
(sends --data as response.create). Exit 0 clean, 1 violations, 2 unreadable."""


def add_tap_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add `tap` to a `streamer` subcommand parser (argparse `add_subparsers()` result)."""
    parser = subparsers.add_parser(
        "tap", help="see and check a Responses stream", description=DESCRIPTION, allow_abbrev=False
    )
    configure(parser)
    return parser


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", metavar="SOURCE", help="file, -, http(s)://… or ws(s)://…")
    parser.add_argument("--data", metavar="FILE", help="JSON request body to POST or send")
    parser.add_argument(
        "--tools", metavar="FILE", help="JSON request body whose tools (and input) name the calls"
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per event")
    parser.add_argument("--follow", action="store_true", help="print each event as it arrives")
    parser.add_argument("--color", choices=("auto", "always", "never"), default="auto")
    parser.add_argument(
        "--header",
        action="append",
        default=[],
        metavar="K:V",
        help="request header, e.g. 'Authorization: Bearer KEY' (repeatable)",
    )
    parser.add_argument(
        "--timeout", type=float, default=10.0, help="seconds to connect (default 10)"
    )


def load_json(path: str, what: str) -> Any:
    try:
        with open(path, "rb") as f:
            return orjson.loads(f.read())
    except OSError as err:
        raise SourceError(f"{what} {path}: {err.strerror or err}") from err
    except orjson.JSONDecodeError as err:
        raise SourceError(f"{what} {path}: not JSON ({err})") from err


def tool_names(body: Any) -> ResponsesToolNames | None:
    """The gateway's tool map for a request body (or a bare list of tools)."""
    if body is None:
        return None
    if isinstance(body, list):
        body = {"tools": body}
    if not isinstance(body, dict):
        raise SourceError("the tools file is neither a request body nor a list of tools")
    items = body.get("input")
    try:
        return ResponsesToolNames.convert(
            body.get("tools"), items if isinstance(items, list) else ()
        )
    except RequestError as err:
        raise SourceError(f"the request's tools are invalid: {err.message} ({err.param})") from err


def parse_headers(values: list[str]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for value in values:
        key, colon, rest = value.partition(":")
        if not colon or not key.strip():
            raise SourceError(f"--header {value!r} is not K:V")
        headers[key.strip()] = rest.strip()
    return headers


def use_color(choice: str, out: TextIO) -> bool:
    if choice != "auto":
        return choice == "always"
    return out.isatty() and not os.environ.get("NO_COLOR")


async def run_tap(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Run one tap; returns the exit status."""
    out = out or sys.stdout
    err = sys.stderr
    try:
        data = load_json(args.data, "--data") if args.data else None
        if data is not None and not isinstance(data, dict):
            raise SourceError("--data must hold a JSON object (a request body)")
        names = tool_names(load_json(args.tools, "--tools") if args.tools else data)
        source = Source(
            args.source,
            data=data,
            headers=parse_headers(args.header),
            connect_timeout=args.timeout,
        )
    except SourceError as e:
        print(f"streamer tap: {e}", file=err)
        return EXIT_UNREADABLE
    mode = "json" if args.json else "follow" if args.follow else "timeline"
    renderer = Renderer(out, mode=mode, color=use_color(args.color, out), names=names)
    checker: GrammarChecker | None = None
    position = -1
    try:
        async for arrival in source.arrivals():
            position += 1
            renderer.timed = source.timed
            if source.format in DELTA_FORMATS:
                renderer.chat(position, arrival.t, arrival.event)
            else:
                if checker is None:
                    checker = GrammarChecker(names, session=source.session)
                if names is None and source.request is not None:
                    names = checker.names = renderer.names = tool_names(source.request)
                renderer.event(position, arrival.t, arrival.event, checker.feed(arrival.event))
            if mode != "timeline":
                out.flush()
    except SourceError as e:
        out.flush()
        print(f"streamer tap: {e}", file=err)
        return EXIT_UNREADABLE
    if checker is None and source.format not in DELTA_FORMATS:
        checker = GrammarChecker(names)  # an empty stream: still one without a terminal
    end = checker.finish() if checker is not None else []
    if source.abandoned:  # no terminal event was owed: nobody was there to receive it
        end = [v for v in end if v.rule != "terminal.missing"]
    renderer.end(end, source_format=source.format, note=source.note)
    out.flush()
    return EXIT_VIOLATIONS if renderer.summary.violations else EXIT_CLEAN


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="streamer tap", description=DESCRIPTION, allow_abbrev=False
    )
    configure(parser)
    args = parser.parse_args(argv)
    try:
        return asyncio.run(run_tap(args))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `streamer tap … | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_CLEAN


if __name__ == "__main__":
    sys.exit(main())
