"""Rewrite the settings table of docs/settings.md from streamer/config.py (the one place
settings live). The name is kept from when the table was in the README."""

from pathlib import Path

from streamer.config import settings_table

page = Path(__file__).resolve().parent.parent / "docs" / "settings.md"
text = page.read_text()
start, end = "<!-- settings-table:start -->", "<!-- settings-table:end -->"
head, rest = text.split(start, 1)
_, tail = rest.split(end, 1)
page.write_text(f"{head}{start}\n{settings_table()}\n{end}{tail}")
