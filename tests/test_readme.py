"""The README and docs/ stay true: the settings table in docs/settings.md is the one the CLI
is built from, the README stays a ten-minute read, and every relative link resolves."""

from __future__ import annotations

import re
from pathlib import Path

from streamer.config import settings_table

REPO = Path(__file__).parent.parent
README = REPO / "README.md"
DOCS = REPO / "docs"
SETTINGS_PAGE = DOCS / "settings.md"
START, END = "<!-- settings-table:start -->", "<!-- settings-table:end -->"
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def _pages() -> list[Path]:
    return [README, REPO / "bench" / "README.md", *sorted(DOCS.glob("*.md"))]


def _anchors(page: Path) -> set[str]:
    """GitHub's heading ids: lower case, punctuation but `-` and `_` dropped, spaces to `-`."""
    text = FENCE.sub("", page.read_text())
    headings = re.findall(r"^#+ (.+)$", text, re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_the_settings_table_matches_the_cli() -> None:
    text = SETTINGS_PAGE.read_text()
    assert text.count(START) == 1 and text.count(END) == 1
    start = text.index(START) + len(START)
    assert text[start : text.index(END)].strip() == settings_table()


def test_readme_names_the_two_commands_and_stays_short() -> None:
    text = README.read_text()
    assert "make run" in text and "make test" in text
    lines = text.count("\n")
    assert lines <= 250, f"README.md has {lines} lines: reference material goes to docs/"


def test_the_readme_links_every_page_of_docs() -> None:
    text = README.read_text()
    for page in DOCS.glob("*.md"):
        assert f"](docs/{page.name})" in text, page.name


def test_every_relative_link_resolves() -> None:
    broken = []
    for page in _pages():
        for target in LINK.findall(FENCE.sub("", page.read_text())):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            resolved = (page.parent / path).resolve() if path else page
            if not resolved.exists():
                broken.append(f"{page.relative_to(REPO)}: {target}")
            elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
                broken.append(f"{page.relative_to(REPO)}: {target} (no such heading)")
    assert not broken, broken
