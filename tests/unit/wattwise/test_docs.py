"""The docs stay readable and linked (issue 70 item 1): every relative link and anchor in
README.md and docs/ resolves, no hand-written page passes 15 KB (the README 8 KB), and every
dated result file says where, when, at which commit and by which command it was measured."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
DOCS = ROOT / "docs"
GENERATED = {DOCS / "configuration.md"}  # `wattwise config-docs` writes it (test_config_docs.py)
PAGE_LIMIT = 15 * 1024
README_LIMIT = 8 * 1024

# [text](target) and [text]: target; images too. Code spans and fenced blocks are skipped.
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~)")
CODE_SPAN = re.compile(r"`[^`]*`")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
RESULT_NAME = re.compile(r"^\d{4}-\d{2}-\d{2}-[a-z0-9-]+\.md$")
RESULT_FIELDS = ("**Hardware:**", "**Date:**", "**Commit:**", "**Command:**")


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for line in prose_lines(path.read_text(encoding="utf-8")):
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(path: Path) -> list[str]:
    out = []
    for line in prose_lines(path.read_text(encoding="utf-8")):
        out.extend(LINK.findall(CODE_SPAN.sub("", line)))
    return out


def broken_links(path: Path) -> list[str]:
    broken = []
    for target in links(path):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        dest = path if not file_part else (path.parent / file_part).resolve()
        if not dest.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target} (no such heading)")
    return broken


def test_slug_follows_github() -> None:
    assert slug("Splitwise's phases and Chiron's batch replicas") == "splitwises-phases-and-chirons-batch-replicas"
    assert slug("§V-B baselines (`policy: dynamollm`)") == "v-b-baselines-policy-dynamollm"
    assert slug("Serve's fast path: HAProxy in front") == "serves-fast-path-haproxy-in-front"


@pytest.mark.parametrize("path", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path: Path) -> None:
    assert not broken_links(path), broken_links(path)


def test_pages_stay_short() -> None:
    over = [f"{p.relative_to(ROOT)}: {p.stat().st_size} B" for p in DOCS.rglob("*.md")
            if p not in GENERATED and p.stat().st_size > PAGE_LIMIT]
    assert not over, f"split these pages (at most {PAGE_LIMIT} B each): {over}"
    readme = (ROOT / "README.md").stat().st_size
    assert readme <= README_LIMIT, f"README.md is {readme} B: keep it a landing page (<= {README_LIMIT} B)"


def test_result_files_say_where_when_and_how() -> None:
    files = sorted((DOCS / "results").glob("*.md"))
    assert files
    for path in files:
        assert RESULT_NAME.match(path.name), f"{path.name}: name it YYYY-MM-DD-what-was-measured.md"
        text = path.read_text(encoding="utf-8")
        missing = [field for field in RESULT_FIELDS if field not in text]
        assert not missing, f"{path.name} lacks {missing}"
