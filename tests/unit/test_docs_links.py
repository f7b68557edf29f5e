"""Every relative link in README.md, docs/ and bench/README.md reaches a file that exists and, when
it names a section, a heading of that file (GitHub's anchors: lower case, punctuation dropped,
spaces as hyphens, a repeated heading numbered)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", ROOT / "bench" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s#]*)(#[^)\s]+)?\)")


def anchors(text: str) -> set[str]:
    """The anchors GitHub gives the headings of a Markdown page (fenced code left out)."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        heading = None if fenced else re.match(r"^#+ (.*)", line)
        if heading:
            anchor = re.sub(r"[^\w\- ]", "", heading[1].lower()).replace(" ", "-")
            count = seen.get(anchor, 0)
            seen[anchor] = count + 1
            found.add(anchor if count == 0 else f"{anchor}-{count}")
    return found


def test_every_relative_link_reaches_its_file_and_section():
    broken = []
    for page in PAGES:
        for target, section in LINK.findall(page.read_text()):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            path = (page.parent / target).resolve() if target else page
            if not path.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
            elif section and path.suffix == ".md" and section[1:] not in anchors(path.read_text()):
                broken.append(f"{page.relative_to(ROOT)}: {target}{section}")
    assert broken == []
