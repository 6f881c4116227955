"""The product's docs stay inside the repository (issue 13): every relative link in README.md and
docs/*.md names a file or directory that exists, and none leads outside the repository (users never
see the team's internal documents)."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

# Inline links and images ``[text](target "title")`` and reference definitions ``[id]: target``.
_INLINE = re.compile(r"!?\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE = re.compile(r"^\s{0,3}\[[^\]\n]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.MULTILINE)
_FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.MULTILINE | re.DOTALL)
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.DOTALL)
_EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # http:, https:, mailto:, ...
# Names of documents that live outside the repository and must never be pointed to.
_OUTSIDE_NAMES = ("DESIGN.md", "../shared", "/work/shared")


def _prose(text: str) -> str:
    """``text`` without fenced code blocks and code spans (a ``](`` there is code, not a link)."""
    return _CODE_SPAN.sub("", _FENCE.sub("", text))


def links(text: str) -> list[str]:
    prose = _prose(text)
    return [m.group(1) for m in _INLINE.finditer(prose)] + [m.group(1) for m in _REFERENCE.finditer(prose)]


def bad_links(doc: Path) -> list[str]:
    bad = []
    for target in links(doc.read_text()):
        if _EXTERNAL.match(target) or target.startswith("#"):
            continue
        path = unquote(target.split("#", 1)[0].split("?", 1)[0])
        if not path:
            continue
        resolved = (REPO / path.lstrip("/")) if path.startswith("/") else (doc.parent / path)
        resolved = resolved.resolve()
        if not resolved.is_relative_to(REPO):
            bad.append(f"{target} (outside the repository)")
        elif not resolved.exists():
            bad.append(f"{target} (no such file)")
    return bad


def test_the_link_finder_sees_links_and_skips_code() -> None:
    text = ("See [a](docs/a.md) and ![img](pics/x.png \"title\"), [web](https://example.com), [top](#top).\n"
            "`[not](a-link.md)` and a regex `[a-z]{0,3}](x)`\n"
            "```\n[inside](fenced.md)\n```\n"
            "[ref]: ../shared/DESIGN.md\n")
    assert links(text) == ["docs/a.md", "pics/x.png", "https://example.com", "#top", "../shared/DESIGN.md"]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_point_to_files_in_the_repository(doc: Path) -> None:
    assert not bad_links(doc), f"{doc.relative_to(REPO)}: {bad_links(doc)}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_no_link_names_a_document_outside_the_repository(doc: Path) -> None:
    outside = [t for t in links(doc.read_text()) if any(name in t for name in _OUTSIDE_NAMES)]
    assert not outside, f"{doc.relative_to(REPO)} links outside the repository: {outside}"


def test_readme_links_every_doc() -> None:
    readme = {t.split("#", 1)[0] for t in links((REPO / "README.md").read_text())}
    missing = [f"docs/{p.name}" for p in sorted((REPO / "docs").glob("*.md")) if f"docs/{p.name}" not in readme]
    assert not missing, f"README.md does not link {missing}"
