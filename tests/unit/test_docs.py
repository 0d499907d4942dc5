"""The README and docs/ hold together: docs/architecture.md names every package and module of app/, every relative
link reaches its file (and heading), every page starts with a title and a summary, and the README stays short enough
for a newcomer and leads to every page."""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
APP = ROOT / "app"
README_MAX_LINES = 150

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
INLINE_CODE = re.compile(r"`[^`\n]*`")


def pages() -> list[Path]:
    return [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted(DOCS.glob("*.md"))]


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped (markup included), spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@lru_cache
def anchors(path: Path) -> frozenset[str]:
    seen: dict[str, int] = {}
    found = set()
    for line in prose_lines(path.read_text(encoding="utf-8")):
        match = re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return frozenset(found)


def links(path: Path) -> list[str]:
    targets = []
    for line in prose_lines(path.read_text(encoding="utf-8")):
        targets += LINK.findall(INLINE_CODE.sub("", line))
    return targets


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_reach_their_file_and_heading(page: Path):
    broken = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        destination = (page.parent / file_part).resolve() if file_part else page
        if not destination.exists():
            broken.append(f"{target}: no such file")
        elif anchor and destination.suffix == ".md" and anchor not in anchors(destination):
            broken.append(f"{target}: no heading #{anchor} in {destination.relative_to(ROOT)}")
    assert broken == [], f"{page.relative_to(ROOT)}: broken links"


def test_architecture_names_every_package_and_module_of_app():
    text = (DOCS / "architecture.md").read_text(encoding="utf-8")
    packages = sorted(p.name for p in APP.iterdir() if p.is_dir() and p.name != "__pycache__" and any(p.rglob("*.py")))
    modules = sorted(p.name for p in APP.glob("*.py") if p.name != "__init__.py")
    assert packages and modules
    missing = [f"app/{name}/" for name in packages if f"app/{name}/" not in text]
    missing += [name for name in modules if not re.search(rf"(?<![\w/.]){re.escape(name)}", text)]
    assert missing == [], "docs/architecture.md's Layout should say what these own"


@pytest.mark.parametrize("page", sorted(DOCS.glob("*.md")), ids=lambda p: p.name)
def test_each_page_starts_with_a_title_and_a_summary(page: Path):
    lines = page.read_text(encoding="utf-8").splitlines()
    assert lines and lines[0].startswith("# "), "the first line is the page's title"
    rest = [line for line in lines[1:] if line.strip()]
    assert rest and re.match(r"[A-Za-z`*\[(]", rest[0]) and not rest[0].startswith(("#", "|", "```")), (
        "a paragraph saying what the page is about comes before the first section"
    )


def test_readme_is_short_enough_to_read_in_five_minutes():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, "reference belongs in docs/: keep the README a newcomer's page"


def test_readme_leads_to_every_page():
    linked = {Path(target.partition("#")[0]).name for target in links(ROOT / "README.md") if target.startswith("docs/")}
    assert sorted(p.name for p in DOCS.glob("*.md") if p.name not in linked) == []
