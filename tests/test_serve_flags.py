"""`streamer serve` flags are an interface others script against: every flag, its
environment variable and its default stay as they were (tests/fixtures/serve_flags.txt,
taken from `streamer serve --help` before the settings were declared once, issue 26).
New flags may come; none may go, be renamed or change its variable or default."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

FIXTURE = Path(__file__).parent / "fixtures" / "serve_flags.txt"
_ENTRY = re.compile(r"^  (-\S.*?)(?:  +(.*))?$")
_ENV = re.compile(r"\[env (STREAMER_[A-Z_]+)(?:, (default .*|comma-separated))?\]$")


def serve_flags(help_text: str) -> list[str]:
    """One line per option of `serve --help`: its usage form, then its env bracket."""
    entries: list[list[str]] = []
    for line in help_text.split("\n\noptions:\n", 1)[1].splitlines():
        found = _ENTRY.match(line)
        if found:
            entries.append([found[1], found[2] or ""])
        elif entries and line.strip():
            entries[-1][1] += " " + line.strip()
    rows = []
    for usage, text in entries:
        env = _ENV.search(text.strip())
        rows.append(f"{usage}\t{env[0] if env else ''}")
    return rows


def current_help() -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMER_")}
    env["COLUMNS"] = "2000"  # one line per option: nothing wrapped
    done = subprocess.run(
        [sys.executable, "-m", "streamer", "serve", "--help"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return done.stdout


def test_serve_keeps_every_flag_its_variable_and_its_default() -> None:
    now = serve_flags(current_help())
    pinned = FIXTURE.read_text().splitlines()
    assert len(pinned) > 60 and all("\t[env STREAMER_" in row for row in pinned[1:])
    missing = [row for row in pinned if row not in now]
    assert not missing, "flags gone or changed:\n" + "\n".join(missing)


# what `--help` does not show of the switches: their default with neither flag nor variable
SWITCHES = {
    "forward_authorization": False,
    "upstream_keepalive": True,
    "metrics_auth": False,
    "fast_http": True,
    "profile_probe": True,
    "tool_choice_object": None,
    "tool_choice_required": None,
    "file_parts": None,
    "replay_reasoning": True,
}


def test_switches_keep_their_defaults_and_take_a_bare_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    from streamer.cli import build_parser

    for name in os.environ:
        if name.startswith("STREAMER_"):
            monkeypatch.delenv(name)
    parser = build_parser("serve")
    args = parser.parse_args(["serve"])
    assert {k: getattr(args, k) for k in SWITCHES} == SWITCHES
    bare = parser.parse_args(["serve", *("--" + k.replace("_", "-") for k in SWITCHES)])
    assert all(getattr(bare, k) is True for k in SWITCHES)
