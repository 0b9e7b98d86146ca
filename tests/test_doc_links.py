"""Links between the docs land: a page another page links to exists, and a ``#section`` names one of its headings.

performance.md's tables link each number to the section of performance-history.md that holds its command; a
renamed heading there would silently break them.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [*sorted(ROOT.glob("docs/*.md")), ROOT / "README.md"]
#: Inline links ``[text](target)`` and reference definitions ``[name]: target`` whose target is a local page
#: or a section of one (``#section`` alone means the same page).
LINK = re.compile(r"\]\(([^)\s]*?\.md(?:#[^)\s]*)?|#[^)\s]+)\)|^\[[^\]]+\]:\s+(\S*?\.md(?:#\S*)?|#\S+)\s*$", re.M)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, each space a hyphen."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # a '#' comment in a code block is no heading
    return {slug(line.lstrip("#")) for line in text.splitlines() if re.match(r"#{1,6} ", line)}


def _links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return [a or b for a, b in LINK.findall(text)]


def test_the_slug_is_githubs() -> None:
    assert slug("AVX-512 BF16 + AMX class: a Xeon (2 cores), 2026-12-02 (stop 24)") == \
        "avx-512-bf16--amx-class-a-xeon-2-cores-2026-12-02-stop-24"
    assert slug("Final table (bfloat16, `ignore_eos`, 20:33 UTC)") == "final-table-bfloat16-ignore_eos-2033-utc"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_link_to_a_page_or_section_lands(page: Path) -> None:
    for link in _links(page):
        target, _, section = link.partition("#")
        path = (page.parent / target).resolve() if target else page
        assert path.is_file(), f"{page.name} links to {target}, which does not exist"
        if section:
            assert section in anchors(path), f"{page.name} links to {link}: {path.name} has no such heading"


def test_the_performance_tables_link_their_sources() -> None:
    links = _links(ROOT / "docs" / "performance.md")
    # Each row's source: a stop's section in the history, or a change's in performance-changes.md.
    assert sum(link.startswith(("performance-history.md#", "performance-changes.md#")) for link in links) >= 10
