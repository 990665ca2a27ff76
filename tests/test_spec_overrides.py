"""`--set PATH=VALUE` and `--overlay FILE` change the spec itself: validation, the run's claimed spec
and a subprocess step all see the changed document, and bad overrides are named like bad specs."""

from __future__ import annotations

from pathlib import Path

import pytest

from mass_jobs.commands.cli import main as cli_main
from mass_jobs.commands.common import open_run
from mass_jobs.pipeline.table import PIPELINE
from mass_jobs.spec.load import SpecError, load_spec
from mass_jobs.spec.overrides import SpecSource, merge, set_value, spec_flags, spec_location

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "examples" / "tiny.yaml"


def test_set_reads_values_as_yaml_and_indexes_lists():
    doc = {"sft": {"parallel": "ddp"}, "tasks": [{"id": "a", "split": "train"}]}
    out = set_value(doc, "sft.parallel=fsdp", "s")
    out = set_value(out, "tasks.0.split=test", "s")
    out = set_value(out, "collection.episodes=3", "s")
    out = set_value(out, "judges=[]", "s")
    assert out == {
        "sft": {"parallel": "fsdp"},
        "tasks": [{"id": "a", "split": "test"}],
        "collection": {"episodes": 3},
        "judges": [],
    }
    assert doc["sft"]["parallel"] == "ddp"  # the loaded document is never edited in place


@pytest.mark.parametrize(
    "assignment, message",
    [
        ("sft.parallel", "expected PATH=VALUE"),
        ("=fsdp", "expected PATH=VALUE"),
        ("sft..parallel=x", "expected PATH=VALUE"),
        ("tasks.5.split=test", "expected an index below 1 at tasks.5"),
        ("tasks.x.split=test", "expected an index below 1 at tasks.x"),
        ("sft.parallel.mode=x", "expected a mapping or a list at sft.parallel, found str"),
    ],
)
def test_a_bad_set_names_itself_and_what_was_expected(assignment, message):
    doc = {"sft": {"parallel": "ddp"}, "tasks": [{"id": "a"}]}
    with pytest.raises(SpecError, match="invalid arguments") as exc:
        set_value(doc, assignment, "spec.yaml")
    assert message in str(exc.value)


def test_overlays_merge_mappings_and_replace_the_rest():
    base = {"sft": {"parallel": "ddp", "lora": {"rank": 8, "alpha": 16}}, "judges": [{"name": "a"}]}
    assert merge(base, {"sft": {"lora": {"rank": 32}}, "judges": []}) == {
        "sft": {"parallel": "ddp", "lora": {"rank": 32, "alpha": 16}},
        "judges": [],
    }


def test_validate_sees_overrides_and_names_a_bad_value_by_its_field(tmp_path, capsys):
    assert cli_main(["validate", str(TINY), "--set", "sft.parallel=fsdp"]) == 0
    capsys.readouterr()
    assert cli_main(["validate", str(TINY), "--set", "sft.parallel=zero3"]) == 2
    err = capsys.readouterr().err
    assert "$.sft.parallel" in err and "zero3" in err
    overlay = tmp_path / "o.yaml"
    overlay.write_text("sft:\n  parallel: fsdp\n")
    spec = load_spec(SpecSource(str(TINY), overlays=[str(overlay)], sets=["sft.parallel=ddp"]))
    assert spec.sft.parallel == "ddp"  # sets come after overlays
    assert load_spec(SpecSource(str(TINY), overlays=[str(overlay)])).sft.parallel == "fsdp"
    assert cli_main(["validate", str(TINY), "--overlay", str(tmp_path / "none.yaml")]) == 2
    assert "--overlay: expected a YAML file" in capsys.readouterr().err


def test_the_claimed_spec_holds_the_override_and_a_plain_rerun_is_refused(tmp_path):
    store = tmp_path / "store"
    sets = [f"store.uri=file://{store}", "sft.parallel=fsdp"]
    ctx = open_run(SpecSource(str(TINY), sets=sets), check_spec=False)
    ctx.claim_spec()
    assert ctx.store.get_json(ctx.spec_key())["sft"]["parallel"] == "fsdp"
    open_run(SpecSource(str(TINY), sets=sets))  # the same overrides: the same run
    with pytest.raises(SpecError, match=r"sft\.parallel.*stored run has 'fsdp', this spec has 'ddp'"):
        open_run(SpecSource(str(TINY), sets=sets[:1]))


def test_a_subprocess_step_is_handed_the_overrides():
    train = next(s for s in PIPELINE if s.name == "train")
    src = SpecSource("run.yaml", overlays=["o.yaml"], sets=["sft.parallel=fsdp"])
    argv = train.argv(src, 0)
    assert argv[:6] == ["train", "--spec", "run.yaml", "--overlay", "o.yaml", "--set"] and "sft.parallel=fsdp" in argv
    assert train.argv("run.yaml", 0)[:4] == ["train", "--spec", "run.yaml", "--gen"]  # a plain spec: none


def test_a_spec_with_overrides_cannot_lose_them_as_a_string_or_a_path():
    src = SpecSource("my run.yaml", overlays=["o.yaml"], sets=["sft.parallel=fsdp"])
    assert not isinstance(src, str)
    assert f"{src}" == "'my run.yaml' --overlay o.yaml --set sft.parallel=fsdp"  # what a person would type
    with pytest.raises(TypeError):
        Path(src)  # a path operation fails loudly instead of reading the file without its overrides
    assert spec_location(src) == "my run.yaml" and spec_flags(src)[:2] == ["--spec", "my run.yaml"]
    assert spec_flags("{{workflow.parameters.spec}}") == ["--spec", "{{workflow.parameters.spec}}"]
