"""`mass verify`: a spec's run (with its --set overrides, as every command), a run's folder in its
store, or a whole store; an intact run is intact whichever form names it, a changed output is found."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from mass_jobs.commands.cli import main as mass
from mass_jobs.store import FileStore, Step

pytestmark = pytest.mark.unit
EXAMPLE = Path(__file__).parents[1] / "examples" / "tiny.yaml"


def stored_run(root: Path, run: str) -> None:
    store = FileStore(root)
    for step in ("gen-0/search/t1", "gen-0/collect/t1"):
        s = Step(store, f"{run}/{step}", {"step": step})
        s.start()
        store.put_json(f"{run}/{step}/result.json", {"ok": step})
        s.finish([f"{run}/{step}/result.json"])
    store.put_json(f"{run}/spec.json", {"name": run})


@pytest.fixture
def runs(tmp_path, tiny_model_dir):
    root = tmp_path / "runs"
    stored_run(root, "tiny")
    stored_run(root, "other")
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["store"] = {"uri": f"file://{root}"}
    doc["model"]["base"] = doc["judges"][0]["model"] = str(tiny_model_dir)
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(doc))
    return root, spec


def verify(capsys, *argv) -> tuple[int, str]:
    code = mass(["verify", *argv])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_every_form_of_a_run_verifies_the_same_intact_run(runs, capsys):
    root, spec = runs
    assert yaml.safe_load(spec.read_text())["name"] == "tiny"
    for form in ([str(spec)], [f"file://{root}/tiny"], [f"file://{root}/tiny/"]):
        code, out = verify(capsys, *form)
        assert code == 0 and out.strip().endswith("2 step manifest(s), 2 output(s) re-hashed: 0 broken"), (form, out)
    code, out = verify(capsys, f"file://{root}")  # the whole store: both runs
    assert code == 0 and "4 step manifest(s), 4 output(s) re-hashed: 0 broken" in out


def test_set_names_another_run_and_a_changed_output_is_broken(runs, capsys):
    root, spec = runs
    (root / "other" / "gen-0" / "collect" / "t1" / "result.json").write_text('{"ok": "forged"}')
    code, out = verify(capsys, str(spec), "--set", "name=other", "--quiet")
    assert code == 1 and "BROKEN other/gen-0/collect/t1" in out and "1 broken" in out
    assert verify(capsys, str(spec))[0] == 0  # the spec's own run is untouched
    code, out = verify(capsys, f"file://{root}/other", "--set", "name=x")
    assert code == 2 and "a store URI has none to change" in out
