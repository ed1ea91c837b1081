"""The docs stay true: the settings table in docs/settings.md is the one the CLI is built from."""

from __future__ import annotations

from pathlib import Path

from streamer.config import settings_table

REPO = Path(__file__).parent.parent
README = REPO / "README.md"
SETTINGS_PAGE = REPO / "docs" / "settings.md"


def test_the_settings_table_matches_the_cli() -> None:
    text = SETTINGS_PAGE.read_text()
    start = text.index("<!-- settings-table:start -->") + len("<!-- settings-table:start -->")
    end = text.index("<!-- settings-table:end -->")
    assert text[start:end].strip() == settings_table()


def test_readme_names_the_two_commands() -> None:
    text = README.read_text()
    assert "make run" in text and "make test" in text
