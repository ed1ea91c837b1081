"""Rewrite the README's settings table from streamer/config.py (the one place settings live)."""

from pathlib import Path

from streamer.config import settings_table

readme = Path(__file__).resolve().parent.parent / "README.md"
text = readme.read_text()
start, end = "<!-- settings-table:start -->", "<!-- settings-table:end -->"
head, rest = text.split(start, 1)
_, tail = rest.split(end, 1)
readme.write_text(f"{head}{start}\n{settings_table()}\n{end}{tail}")
