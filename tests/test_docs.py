"""The documentation's links work: every relative link and image in README.md, docs/*.md and
configs/README.md names a file of the repository, and every #anchor names a heading of its page; the README
stays a front page."""

import re
from pathlib import Path

import pytest

from tests._tools import REPO as _REPO

REPO = Path(_REPO)
PAGES = sorted([REPO / "README.md", REPO / "configs" / "README.md", *(REPO / "docs").glob("*.md")])
# [text](target) and ![alt](target); the target ends at the first space (a title may follow) or ")".
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)[^)]*\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)
INLINE_CODE = re.compile(r"`[^`\n]*`")


def anchors(page: Path) -> set[str]:
    """GitHub's heading ids: lower case, punctuation other than '-' and '_' dropped, spaces as '-'."""
    text = FENCE.sub("", page.read_text())
    heads = re.findall(r"^#{1,6}\s+(.*?)\s*#*\s*$", text, flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in heads}


def links(page: Path) -> list[str]:
    text = INLINE_CODE.sub("", FENCE.sub("", page.read_text()))
    return LINK.findall(text)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_and_anchors_resolve(page):
    broken = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: ...
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: {dest} does not exist")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading '#{anchor}' in {dest.relative_to(REPO)}")
    assert not broken, f"broken links in {page.relative_to(REPO)}:\n" + "\n".join(broken)


def test_link_checker_sees_links_and_anchors():
    """The parser finds the README's links to every docs page (so an empty match cannot pass the test above)."""
    found = {t.partition("#")[0] for t in links(REPO / "README.md")}
    pages = {f"docs/{p.name}" for p in (REPO / "docs").glob("*.md")}
    assert pages <= found, f"docs pages the README does not link: {sorted(pages - found)}"
    assert "the-demo-and-the-test-suite" in anchors(REPO / "docs" / "performance.md")


def test_readme_is_a_front_page():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) < 250, f"README.md has {len(lines)} lines: move details into a docs/ page"
    # .ci/run runs exactly the README's test command
    command = "bash tools/setup_env.sh && .venv/bin/python -m pytest -q -n 2"
    assert command in lines
    assert command in (REPO / ".ci" / "run").read_text().splitlines()
