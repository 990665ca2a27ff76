"""Every relative link in the docs (README, docs/, the chart's and examples' pages) names a file of
the repository, and so does every path in backquotes that starts at one of its top folders
(`examples/tiny.yaml`, `mass_jobs/tiny/warm.py`): a moved or renamed file breaks a test, not a
reader's click or copy."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit
ROOT = Path(__file__).parents[1]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"```.*?```", re.S)


def pages() -> list[Path]:
    found = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    found += [
        p
        for p in sorted(ROOT.glob("*/**/*.md"))
        if not any(part.startswith(".") for part in p.relative_to(ROOT).parts)
        and p.parts[len(ROOT.parts)] not in ("docs", "build", "runs", "tests")
    ]
    return [p for p in found if p.is_file()]


def relative_links(page: Path) -> list[str]:
    text = FENCE.sub("", page.read_text())
    return [t for t in LINK.findall(text) if not re.match(r"[a-z][a-z0-9+.-]*:", t) and not t.startswith("#")]


TOP = ("docs", "examples", "mass_jobs", "tests", "charts", "bench", "schemas", "argo", "manifests", "images", ".ci")
CODE = re.compile(r"`([^`\s]+)`")


def repo_paths(page: Path) -> list[str]:
    """Paths in backquotes that start at a top folder, without placeholders, globs or line numbers."""
    out = []
    for text in CODE.findall(page.read_text()):
        text = re.sub(r":\d+(-\d+)?$", "", text.rstrip(".,;:"))
        if text.split("/", 1)[0] in TOP and "/" in text and not re.search(r"[<>*{}$]|\.\.\.|\bN\b|\bG\b", text):
            out.append(text)
    return out


def test_the_pages_are_found_and_have_links():
    names = {p.relative_to(ROOT).as_posix() for p in pages()}
    assert {"README.md", "docs/running.md", "docs/demo.md", "docs/kubernetes.md"} <= names
    assert sum(len(repo_paths(p)) for p in pages()) > 100


@pytest.mark.parametrize("page", pages(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_names_a_file_of_the_repository(page):
    broken = [t for t in relative_links(page) if not (page.parent / t.split("#", 1)[0]).exists()]
    assert broken == [], f"{page.relative_to(ROOT)}: links to nothing: {broken}"
    missing = sorted({t for t in repo_paths(page) if not (ROOT / t).exists()})
    assert missing == [], f"{page.relative_to(ROOT)}: names paths the repository does not have: {missing}"


def test_the_charts_notes_point_to_the_install_page_and_name_files_that_exist():
    import yaml

    notes = (ROOT / "charts" / "mass-jobs" / "templates" / "NOTES.txt").read_text()
    named = set(re.findall(r"\b((?:docs|examples)/[\w./-]+\w)", notes))
    assert "docs/install.md" in named and "examples/k8s-small.yaml" in named
    assert [p for p in named if not (ROOT / p).exists()] == []
    # the run it submits is the example's own name (`run` labels every pod)
    name = yaml.safe_load((ROOT / "examples" / "k8s-small.yaml").read_text())["name"]
    assert notes.count(f"-p run={name}") == 2 and "specs/demo.yaml" not in notes
