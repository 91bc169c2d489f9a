"""The README and docs/ stand alone: every link resolves to a file (and heading) in this
repository, and nothing points outside it, so a fresh clone with no sibling folders reads whole.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
LINK = re.compile(r"!?\[(?P<text>[^\]]*)\]\((?P<target>[^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
CODE_SPAN = re.compile(r"`[^`\n]*`")


def prose(path: Path) -> str:
    """The text a reader follows links in: no fenced code blocks, no inline code."""
    return CODE_SPAN.sub("", FENCE.sub("", path.read_text()))


def anchors(path: Path) -> set[str]:
    """The heading anchors a Markdown renderer makes (lowercase, punctuation dropped, dashes)."""
    found = set()
    for line in FENCE.sub("", path.read_text()).splitlines():
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if match:
            title = match.group(1).replace("`", "").strip().lower()
            found.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return found


def links(path: Path) -> list[str]:
    return [m.group("target") for m in LINK.finditer(prose(path))]


def test_there_are_documents_to_check() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in DOCUMENTS}
    assert {"README.md", "docs/architecture.md", "docs/api.md", "docs/operations.md"} <= names
    assert sum(len(links(p)) for p in DOCUMENTS) > 20


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_link_resolves_inside_the_repository(path: Path) -> None:
    broken = []
    for target in links(path):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:, file: ...
            broken.append(f"{target}: points outside the repository")
            continue
        file_part, _, fragment = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        if not resolved.is_relative_to(ROOT):
            broken.append(f"{target}: leaves the repository")
        elif not resolved.exists():
            broken.append(f"{target}: no such file")
        elif fragment and resolved.suffix == ".md" and fragment not in anchors(resolved):
            broken.append(f"{target}: no heading #{fragment} in {resolved.name}")
    assert broken == []


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_nothing_refers_to_files_outside_the_repository(path: Path) -> None:
    text = path.read_text()
    # The specification these docs replace lived outside the repository: no mention of it.
    assert not re.search(r"design\.md", text, re.IGNORECASE)
    assert not re.search(r"\.\./(shared|\.\.)", text), "a path above the repository"


def test_the_anchor_rule_matches_headings_with_code_and_punctuation(tmp_path: Path) -> None:
    doc = tmp_path / "x.md"
    doc.write_text("# The device-plugin namespace and its Role\n## Scale (`make x`, fast)\n")
    assert anchors(doc) == {"the-device-plugin-namespace-and-its-role", "scale-make-x-fast"}
