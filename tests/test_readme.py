"""The README stays true: its settings table is the one the CLI is built from."""

from __future__ import annotations

from pathlib import Path

from streamer.config import settings_table

README = Path(__file__).parent.parent / "README.md"


def test_readme_settings_table_matches_the_cli() -> None:
    text = README.read_text()
    start = text.index("<!-- settings-table:start -->") + len("<!-- settings-table:start -->")
    end = text.index("<!-- settings-table:end -->")
    assert text[start:end].strip() == settings_table()


def test_readme_names_the_two_commands() -> None:
    text = README.read_text()
    assert "make run" in text and "make test" in text
