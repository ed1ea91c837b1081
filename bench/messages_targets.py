"""The Anthropic Messages-upstream group of a benchmark run (issue 29).

Against the load backend's `/v1/messages` (a stream of Messages events, load_messages.py):
the raw relay of that stream, and the gateway in `--upstream-api anthropic`, whose ratio is
to that relay. The gateway row is "not available", with the reason, for a checkout whose
`streamer serve --help` does not name the kind.
"""

from __future__ import annotations

from pathlib import Path

import responses_targets
import targets as tg

GATEWAY_NAME = "streamer (anthropic)"


def start_gateway(
    upstream: str, cpus: set[int] | None, logs: Path, extra: list[str], root: Path
) -> tg.Target:
    """`streamer serve --upstream-api anthropic`, or a "not available" row saying why not."""
    why = responses_targets.gateway_flag_missing(root, "anthropic")
    if why:
        t = tg.Target(GATEWAY_NAME, "gateway", status="not available", reason=why)
    else:
        args = ["--upstream-api", "anthropic", *extra]
        t = tg.start_gateway(upstream, cpus, logs, args, root, GATEWAY_NAME)
    t.relay = tg.MESSAGES_RELAY
    return t


def start_group(
    upstream: str,
    cpus: set[int] | None,
    logs: Path,
    extra: list[str],
    root: Path,
    only_n: list[int] | None,
    out: list[tg.Target],
) -> None:
    """The relay and the gateway, appended to `out` as each exists."""
    group = [tg.start_relay(upstream, cpus, logs, api="messages")]
    out.append(group[0])
    group.append(start_gateway(upstream, cpus, logs, extra, root))
    out.append(group[-1])
    for t in group:
        t.only_n = only_n
