"""Packages by job, stacked: a package imports only from the packages below it (anywhere in its modules,
function bodies included), so each layer can be read and tested with only the layers under it."""

from pathlib import Path

import pytest

from tests.fixtures.import_graph import LAYERS, imported, modules

pytestmark = pytest.mark.unit  # no process, no server, no sandbox (tests/fixtures/unit.py)

ROOT = Path(__file__).resolve().parents[1] / "mass_jobs"


def upward_imports(root: Path, layers: tuple[str, ...]) -> list[tuple[str, str]]:
    """(importer, imported) pairs whose imported module sits in a higher package than its importer."""
    known = modules(root)
    top = root.name
    rank = {p: i for i, p in enumerate(layers)}
    out = []
    for name, path in known.items():
        for dep in imported(name, path, known):
            a, b = name.split(".")[1:2], dep.split(".")[1:2]
            if a and b and a != b and rank[b[0]] > rank[a[0]]:
                out.append((name, dep))
    assert all(n.split(".")[0] == top for n in known)
    return sorted(out)


def test_top_level_is_packages_by_job():
    entries = sorted(p.name for p in ROOT.iterdir() if p.name != "__pycache__" and not p.name.startswith("."))
    assert entries == sorted(["__init__.py", *LAYERS])
    for pkg in LAYERS:
        doc = (ROOT / pkg / "__init__.py").read_text()
        assert doc.startswith('"""') and len(doc.split('"""')[1].split()) >= 20, f"{pkg}/__init__.py: one paragraph"


def test_no_package_imports_one_above_it():
    assert upward_imports(ROOT, LAYERS) == []


def test_an_upward_import_in_a_function_is_found(tmp_path):
    pkg = tmp_path / "pkg"
    for sub in ("low", "high"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "high" / "a.py").write_text("from pkg.low import b\n")
    (pkg / "low" / "b.py").write_text("def f():\n    from pkg.high.a import g\n    return g\n")
    assert upward_imports(pkg, ("low", "high")) == [("pkg.low.b", "pkg.high.a")]
