"""No import cycles in mass_jobs/, counting the imports inside functions: every module sits on a layer
below the modules that import it, so each can be read (and tested) from the bottom up."""

from pathlib import Path

import pytest

from tests.fixtures.import_graph import imported, modules

pytestmark = pytest.mark.unit  # no process, no server, no sandbox (tests/fixtures/unit.py)

ROOT = Path(__file__).resolve().parents[1] / "mass_jobs"


def cycles(root: Path) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan), each sorted."""
    known = modules(root)
    graph = {m: imported(m, p, known) for m, p in known.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def test_mass_jobs_has_no_import_cycle():
    assert len(modules(ROOT)) > 100
    assert cycles(ROOT) == []


def test_a_cycle_through_a_function_level_import_is_found(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from ..c import g\n    return g\n")
    (pkg / "c.py").write_text("import pkg.a\n")
    (pkg / "d.py").write_text("from pkg import a\n")  # imports into the cycle, is not part of it
    assert cycles(pkg) == [["pkg.a", "pkg.c", "pkg.sub.b"]]
