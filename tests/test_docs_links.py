"""The docs a newcomer reads (issue 38, item 2): a README short enough to read in minutes, whose
every relative link, like every one in docs/*.md, leads to a file that exists and, with a `#`, to
a heading of that file; and docs/behaviour.md opening on a table of contents of all its sections."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

from tests.conftest import PROJECT

README = PROJECT / "README.md"
PAGES = sorted([README, *(PROJECT / "docs").glob("*.md")])
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")


def prose(text: str) -> list[str]:
    """The lines outside fenced code blocks (CommonMark: a fence closes on a line of at least as
    many of the same character), inline code spans blanked: links and headings live only there."""
    lines, fence = [], ""
    for line in text.splitlines():
        opened = FENCE.match(line)
        if fence:
            if opened and opened.group(1)[0] == fence[0] and len(opened.group(1)) >= len(fence) \
                    and not line.strip().strip(fence[0]):
                fence = ""
        elif opened:
            fence = opened.group(1)
        else:
            lines.append(re.sub(r"(`+).*?\1", "``", line))
    return lines


def headings(path: Path) -> list[tuple[int, str]]:
    """(level, text) of every ATX heading outside code."""
    found = []
    for line in prose(path.read_text(encoding="utf-8")):
        heading = re.match(r"^(#{1,6}) +(.*?)\s*#*\s*$", line)
        if heading:
            found.append((len(heading.group(1)), heading.group(2)))
    return found


def slug(text: str) -> str:
    """GitHub's anchor for a heading: markup and punctuation dropped, lowercase, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for _, text in headings(path):
        base = slug(text)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(path: Path) -> list[str]:
    return [target for line in prose(path.read_text(encoding="utf-8")) for target in LINK.findall(line)
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target)]  # http:, https:, mailto: are not ours


def test_the_readme_is_at_most_150_lines():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines: move the details into a page under docs/"


def test_the_readme_keeps_the_test_command_ci_runs():
    assert 'pip install -e ".[test]" && pytest -n 4' in README.read_text(encoding="utf-8")  # .ci/run


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(PROJECT)))
def test_every_relative_link_leads_to_a_file_and_a_heading(page):
    broken = []
    for target in links(page):
        file, _, anchor = target.partition("#")
        goal = (page.parent / unquote(file)).resolve() if file else page
        if not goal.exists():
            broken.append(f"{target}: no file {goal.relative_to(PROJECT) if goal.is_relative_to(PROJECT) else goal}")
        elif anchor and goal.suffix == ".md" and anchor not in anchors(goal):
            broken.append(f"{target}: no heading #{anchor} in {goal.relative_to(PROJECT)}")
    assert not broken, f"{page.relative_to(PROJECT)}: " + "; ".join(broken)


def test_the_readme_links_every_page_under_docs():
    linked = {(README.parent / target.partition("#")[0]).resolve() for target in links(README)}
    unlinked = [page.name for page in PAGES if page != README and page.resolve() not in linked]
    assert not unlinked, f"README.md's map of the docs lacks {unlinked}"


def test_behaviour_md_opens_on_a_contents_list_of_every_section():
    page = PROJECT / "docs" / "behaviour.md"
    sections = [text for level, text in headings(page) if level in (2, 3) and text != "Contents"]
    text = page.read_text(encoding="utf-8")
    contents = text[text.index("## Contents"):text.index(f"## {sections[0]}")]
    listed = re.findall(r"^ *- \[(.*)\]\(#([^)]*)\)$", contents, flags=re.M)
    assert [title for title, _ in listed] == sections
    assert all(anchor == slug(title) for title, anchor in listed)
