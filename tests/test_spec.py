"""Run spec validation: every invalid spec gives exit 2 and exactly its expected messages;
defaults are the paper's numbers; the checked-in schemas match the models."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mass_jobs.commands.cli import main as cli_main
from mass_jobs.spec.issues import generated_schema
from mass_jobs.spec.load import SpecError, load_spec, validate_document

ROOT = Path(__file__).resolve().parent.parent
INVALID = sorted((ROOT / "tests/specs/invalid").glob("*.yaml"))
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


def expected_messages(path: Path) -> list[str]:
    """The file's `# expect:` lines; `{here}` stands for the spec's folder (resolved paths)."""
    return [
        line.removeprefix("# expect: ").rstrip("\n").replace("{here}", str(path.parent))
        for line in path.read_text().splitlines(True)
        if line.startswith("# expect: ")
    ]


def test_invalid_folder_is_not_empty():
    assert len(INVALID) >= 10


@pytest.mark.parametrize("path", INVALID, ids=[p.stem for p in INVALID])
def test_invalid_spec_exits_2_with_exactly_its_messages(path, capsys):
    expected = expected_messages(path)
    assert expected, f"{path.name} declares no '# expect:' line"
    assert cli_main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    reported = [line.strip() for line in err.splitlines()[1:]]
    assert sorted(reported) == sorted(expected)
    assert f"{len(expected)} error(s)" in err.splitlines()[0]


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_examples_validate(path, capsys, tmp_path):
    # a copy next to the model dirs they name (../build/..., relative to the spec), which `make demo` builds
    shutil.copytree(path.parent, tmp_path / "examples")
    for name in ("models/tiny-warm", "build/smollm2"):  # the shipped warm model, and mass model smollm2's
        (tmp_path / name).mkdir(parents=True)
    for name in ("tiny-paper", "tiny-paper-fp8"):  # paper-mini's (mass model tiny --paper-layout --fp8-reference)
        (tmp_path / "build" / name).mkdir(parents=True)
    assert cli_main(["validate", str(tmp_path / "examples" / path.name)]) == 0
    assert "valid run spec" in capsys.readouterr().out


def test_validate_cli_as_a_process_reports_every_error_at_once(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "name: Bad_Name\nmodel: {base: x, sampling: {temperature: 3, top_kk: 2}}\n"
        "tasks: [{id: a, split: train, prompt: hi}]\ncollection: {episodes: '18'}\nstore: {uri: 'gs://x'}\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "mass_jobs.commands.cli", "validate", str(bad)], capture_output=True, text=True
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    for fragment in (
        "$.name:",
        "$.model.sampling.temperature: expected a number <= 2, found 3",
        "$.model.sampling.top_kk: unknown key",
        "$.collection.episodes: expected integer",
        "$.store.uri: expected a string matching",
        "$.model.base: expected a model directory, an s3:// URI or a hub id 'org/name', found nothing at",
    ):
        assert fragment in proc.stderr
    assert "6 error(s)" in proc.stderr


def test_paper_defaults():
    spec = validate_document(
        {
            "name": "p",
            "model": {"base": "Qwen/Qwen3.6-27B"},
            "tasks": [{"id": "t", "split": "train", "prompt": "p"}],
            "store": {"uri": "s3://b/p"},
        }
    )
    s = spec.model.sampling
    assert (s.temperature, s.top_p, s.top_k, s.max_output_tokens, s.context_length) == (0.6, 0.95, 20, 32768, 262144)
    c = spec.collection
    assert (c.episodes, c.train_ranks, c.validation_rank, c.collect_when) == (18, 15, 16, "elite")
    assert spec.search.selection == "champion"  # upstream's, judged against the baseline
    assert spec.ranking.comparisons_per_episode == 6 and spec.ranking.verdicts_per_pair == 1
    assert (spec.ranking.estimator, spec.ranking.prior) == ("virtual_wins", None)  # None: the estimator's 0.5
    f = spec.sft
    assert (f.window, f.context) == (49152, 8192)
    assert f.orchestrator_share == pytest.approx(1 / 3)
    assert (f.lora.r, f.lora.alpha, f.lora.dropout) == (64, 128, 0.05)
    assert f.lora.target_modules is None  # resolved from the model: every linear layer of the language model
    assert (f.val_every, f.save_every, f.loss_chunk) == (150, 50, 512)
    o = f.optimizer
    assert (o.lr, o.betas, o.warmup_steps, o.min_lr_ratio, o.grad_clip) == (3e-5, (0.9, 0.95), 5, 0.1, 1.0)
    assert (f.steps, f.replicas, f.gpus_per_replica) == (1624, 3, 2)
    assert spec.search.iterations == 11
    assert spec.evaluation.rollouts_per_task == 10
    assert spec.generations == 2


def test_task_files_resolve_relative_to_spec():
    spec = load_spec(ROOT / "examples/paper.yaml")
    assert (spec.sft.val_every, spec.sft.save_every) == (150, 50)  # the paper's cadence
    tasks = {t.id: t for t in spec.resolved_tasks()}
    assert set(tasks) == {"finance-momentum", "robotics-push", "pharmacy-dose"}
    assert tasks["pharmacy-dose"].split == "test"
    assert tasks["robotics-push"].guards.protected_paths == ["sim", "checks"]
    assert len(spec.judges) == 2 and sum(len(j.seeds) for j in spec.judges) == 6


def test_spec_error_lists_issues_programmatically():
    with pytest.raises(SpecError) as info:
        validate_document({"name": "x", "model": {"base": "b"}, "tasks": [], "store": {"uri": "file://r"}, "extra": 1})
    paths = [i.path for i in info.value.issues]
    assert paths == ["$.extra", "$.tasks"]


@pytest.mark.parametrize("name", ["run-spec", "task", "workflow"])
def test_checked_in_schemas_match_models(name):
    checked_in = json.loads((ROOT / "schemas" / f"{name}.schema.json").read_text())
    assert checked_in == generated_schema(name), "schemas drifted: run `mass schema --write schemas/`"


@pytest.mark.parametrize("name", ["run-spec", "task", "workflow"])
def test_schemas_are_closed(name):
    schema = json.loads((ROOT / "schemas" / f"{name}.schema.json").read_text())
    objects = [schema] + list(schema.get("$defs", {}).values())
    for obj in objects:
        if obj.get("type") == "object" and "properties" in obj:
            assert obj.get("additionalProperties") is False, obj.get("title")


def test_validate_writes_argo_outputs(tmp_path, s3_env, monkeypatch):
    """The paper's spec, its store moved to the test S3 server (validate --outputs records the spec there)."""
    import shutil

    # the validate pod holds the judges' keys from the judge Secret (without them it refuses the spec)
    monkeypatch.setenv("JUDGE_A_API_KEY", "a")
    monkeypatch.setenv("JUDGE_B_API_KEY", "b")

    shutil.copytree(ROOT / "examples" / "tasks", tmp_path / "tasks")
    doc = yaml.safe_load((ROOT / "examples/paper.yaml").read_text())
    doc["store"] = {"uri": f"s3://{s3_env['bucket']}/paper", "endpoint_url": s3_env["endpoint_url"]}
    spec = tmp_path / "paper.yaml"
    spec.write_text(yaml.safe_dump(doc))
    out = tmp_path / "outputs"
    assert cli_main(["validate", str(spec), "--gen", "1", "--outputs", str(out), "--quiet"]) == 0
    assert json.loads((out / "train-tasks.json").read_text()) == ["finance-momentum", "robotics-push"]
    episodes = json.loads((out / "episodes.json").read_text())
    assert len(episodes) == 2 * 18 and episodes[0] == {"task": "finance-momentum", "episode": 0}
    assert (out / "search-iterations").read_text() == "12"  # iteration 0 + 11 proposals
    assert (out / "store-prefix").read_text() == "paper/paper"
    # L1 is served from the block-FP8 export on the predictor's GPUs, as the paper does, and the run says so
    assert (out / "model-uri").read_text() == f"s3://{s3_env['bucket']}/paper/paper/gen-1/model-fp8/"
    from mass_jobs.store import open_store

    served = open_store(doc["store"]["uri"], endpoint_url=s3_env["endpoint_url"]).get_json("paper/gen-1/serving.json")
    assert served["weights"] == "fp8" and served["backend"] == "kserve-vllm"
    assert (out / "generations").read_text() == "2"
    cli_main(["validate", str(spec), "--gen", "0", "--outputs", str(out), "--quiet"])
    # L0 from the official FP8 checkpoint (model.serve), as the paper serves it
    assert (out / "model-uri").read_text() == "hf://Qwen/Qwen3.6-27B-FP8"
    assert (
        open_store(doc["store"]["uri"], endpoint_url=s3_env["endpoint_url"]).get_json("paper/gen-0/serving.json")[
            "weights"
        ]
        == "serve"
    )


def test_validate_outputs_refuse_a_local_store(tmp_path, capsys):
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    for name in ("models/tiny-warm", "build/smollm2"):  # the shipped warm model, and mass model smollm2's
        (tmp_path / name).mkdir(parents=True)
    out = tmp_path / "out"
    out.mkdir()
    assert cli_main(["validate", str(tmp_path / "examples/tiny.yaml"), "--outputs", str(out)]) == 2
    assert "$.store.uri: expected an s3:// URI" in capsys.readouterr().err
    assert not any(out.iterdir())


@pytest.mark.parametrize("command", ["run", "validate"])
def test_nothing_is_written_to_the_store_before_a_spec_passes(tmp_path, command, capsys):
    store_dir = tmp_path / "store"
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "name: nothing-written\nmodel: {base: build/tiny-model}\n"
        "tasks: [{id: t1, split: train, prompt: do it}]\n"
        "collection: {episodes: 4, train_ranks: 2, validation_rank: 9}\n"
        f"store: {{uri: 'file://{store_dir}'}}\n"
    )
    assert cli_main([command, str(bad)]) == 2
    assert "$.collection.validation_rank: expected train_ranks + 1 = 3, found 9" in capsys.readouterr().err
    assert not store_dir.exists()
