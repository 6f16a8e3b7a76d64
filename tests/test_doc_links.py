"""Every link between the project's Markdown files, and every anchor it names, leads somewhere.

A heading renamed, a page moved, a section that never existed: GitHub renders the link all the
same, and the reader lands at the top of a page, or on a 404. Anchors are computed as GitHub
computes them (the heading's text, lowercase, without punctuation but ``-`` and ``_``, spaces as
``-``, a ``-1``, ``-2``… suffix for a repeated heading); links out of the repository (``http``,
``mailto``) are not followed.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")
HTML_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")


def markdown_files() -> list[Path]:
    out = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        check=True,
    ).stdout.decode()
    return sorted(ROOT / p for p in out.split("\0") if p.endswith(".md") and (ROOT / p).exists())


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's Markdown text."""
    text = INLINE_CODE.sub(lambda m: m.group(2), heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link: its text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def lines_outside_code(text: str) -> list[tuple[int, str]]:
    lines, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append((number, line))
    return lines


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    for _, line in lines_outside_code(path.read_text()):
        found.update(HTML_ANCHOR.findall(line))
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(path: Path) -> list[tuple[int, str]]:
    found = []
    for number, line in lines_outside_code(path.read_text()):
        for target in LINK.findall(INLINE_CODE.sub("", line)):
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                found.append((number, target))
    return found


def broken_links(path: Path) -> list[str]:
    problems = []
    for number, target in links(path):
        where = f"{path.relative_to(ROOT)}:{number}: {target}"
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / unquote(file_part)).resolve() if file_part else path
        if not linked.exists():
            problems.append(f"{where}: {linked.relative_to(ROOT)} does not exist")
        elif ROOT not in linked.parents and linked != ROOT:
            problems.append(f"{where}: outside the repository")
        elif anchor and linked.suffix == ".md" and unquote(anchor) not in anchors(linked):
            problems.append(f"{where}: no heading with anchor #{anchor} there")
    return problems


def test_the_slugs_are_githubs():
    assert slug("The demo: `./dev demo`") == "the-demo-dev-demo"
    assert slug("6. Steer it with a node selector") == "6-steer-it-with-a-node-selector"
    assert slug("Failover: a target that stays away") == "failover-a-target-that-stays-away"
    assert slug("Draining a target: cordon and taints") == "draining-a-target-cordon-and-taints"
    assert slug("`multicluster-scheduler status`") == "multicluster-scheduler-status"
    assert slug("Install from the image you build") == "install-from-the-image-you-build"


def test_a_repeated_heading_is_numbered(tmp_path: Path):
    page = tmp_path / "page.md"
    page.write_text("# A\n## Notes\n```\n## Not a heading\n```\n## Notes\n")
    assert anchors(page) == {"a", "notes", "notes-1"}


def test_a_broken_link_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    (tmp_path / "a.md").write_text(
        "# Top\n[ok](b.md#there) [missing anchor](b.md#nowhere) [gone](c.md) "
        "[here](#top) `[in code](d.md)` [out](https://example.com)\n"
    )
    (tmp_path / "b.md").write_text("## There\n")
    problems = broken_links(tmp_path / "a.md")
    assert len(problems) == 2, problems
    assert "#nowhere" in problems[0]
    assert "c.md does not exist" in problems[1]


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_and_anchor_leads_somewhere(path: Path):
    assert broken_links(path) == []


def test_the_readme_opens_with_the_architecture_picture():
    """A Mermaid block (GitHub renders it; its text is its source) before anything else of the
    README's, and the picture of each controller in docs/architecture.md."""
    readme = (ROOT / "README.md").read_text()
    first_block = readme.index("```")
    assert readme[first_block:].startswith("```mermaid\nflowchart")
    assert first_block < readme.index("\n## ")
    picture = readme[first_block : readme.index("```\n", first_block + 3)]
    for step in ("webhook", "proxy pod", "scheduler", "delegate", "status and events"):
        assert step in picture, step
    assert "```mermaid\nflowchart" in (ROOT / "docs" / "architecture.md").read_text()
