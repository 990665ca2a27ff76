"""`mass validate SPEC --values VALUES.yaml`: the spec against the chart's values before `argo
submit`, one table of checks, exit 2 naming each failure; the cluster examples pass with the values
they document; every scenario's cron spec passes with that scenario's values; the validate step of
`mass-cycle` (cluster_issues) runs the same checks."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from mass_jobs import preflight
from mass_jobs.cli import main as mass
from mass_jobs.commands.validate import cluster_issues
from mass_jobs.spec import load_spec, validate_document

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "mass-jobs"


@pytest.mark.parametrize("spec,values", [("examples/k8s-small.yaml", "charts/mass-jobs/values.yaml"),
                                         ("examples/paper.yaml", "charts/mass-jobs/ci/paper-values.yaml")])
def test_the_cluster_examples_pass_with_the_values_they_document(spec, values, capsys):
    assert mass(["validate", str(ROOT / spec), "--values", str(ROOT / values)]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["check", "value", "limit", "verdict"]
    rows = [line for line in out.splitlines()[2:] if line.rstrip().endswith((" ok", " FAIL"))]
    assert len(rows) >= 12 and all(r.rstrip().endswith(" ok") for r in rows)


def test_the_paper_with_the_chart_defaults_names_each_value_to_set(capsys):
    assert mass(["validate", str(ROOT / "examples/paper.yaml"), "--values", str(CHART / "values.yaml")]) == 2
    captured = capsys.readouterr()
    assert "invalid run spec for this cluster, 4 error(s)" in captured.err
    for needle in ("$.model.sampling.context_length: expected at most the server's max model length 32768",
                   "$.model.sampling.max_output_tokens: expected less than the server's max model length 32768",
                   "$.judges[0].api_key_env: expected a key of the judge Secret (chart value judges.keys "
                   "['JUDGE_API_KEY']), found 'JUDGE_A_API_KEY'", "$.judges[1].api_key_env"):
        assert needle in captured.err
    fails = [line.split("  ")[0] for line in captured.out.splitlines() if line.rstrip().endswith("FAIL")]
    assert fails == ["context length", "max output tokens", "judge judge-a key", "judge judge-b key"]


def _cron_scenarios() -> list[str]:
    """The ci/ scenarios whose values schedule a spec of their own (a CronWorkflow with a spec)."""
    out = []
    for p in sorted((CHART / "ci").glob("*-values.yaml")):
        cron = (yaml.safe_load(p.read_text()) or {}).get("cron") or {}
        if cron.get("enabled", True) and "spec" in cron:
            out.append(p.name)
    return out


def test_some_scenario_schedules_a_spec():
    assert _cron_scenarios() == ["gpu-cluster-values.yaml"]


@pytest.mark.parametrize("scenario", _cron_scenarios())
def test_a_scenario_cron_runs_a_spec_its_values_accept(scenario, capsys):
    cron = yaml.safe_load((CHART / "ci" / scenario).read_text())["cron"]
    spec = ROOT / "examples" / Path(cron["spec"]).name
    assert spec.is_file(), f"{scenario}: cron spec {cron['spec']} is no example"
    assert mass(["validate", str(spec), "--values", str(CHART / "ci" / scenario)]) == 0, capsys.readouterr().err


def small(**changes) -> object:
    doc = yaml.safe_load((ROOT / "examples" / "k8s-small.yaml").read_text())
    doc["tasks"] = [{"id": "a", "split": "train", "prompt": "do a"}, {"id": "b", "split": "test", "prompt": "do b"}]
    for dotted, value in changes.items():
        node = doc
        *head, last = dotted.split("__")
        for k in head:
            node = node.setdefault(k, {})
        node[last] = value
    return validate_document(doc)


@pytest.mark.parametrize("changes,values,path,needle", [
    ({"generations": 40, "search__iterations": 60}, {}, "$.search.iterations",
     "(generations - 1) + 8 + search.iterations <= 100 (Argo's maxAllowedStackDepth), found 107"),
    ({"execution__limits__wall_s": 4000}, {}, "$.execution.limits.wall_s",
     "at least 300 s below the agent pods' deadline 4200 s (chart value agent.activeDeadlineSeconds), found 4000"),
    ({"sft__checkpoint_selection": "panel", "sft__panel": {"tasks": ["b"]}}, {}, "$.sft.checkpoint_selection",
     "panel selection serves every checkpoint"),
    ({"roles__executor": {"endpoint": "https://other.example.com/v1", "model": "m"}}, {}, "$.roles.executor",
     "agent pods reach only DNS, the predictor, the apiserver and S3"),
    ({"execution__vllm__tool_call_parser": "qwen3_coder"}, {}, "$.execution.vllm.tool_call_parser",
     "expected the chart's vLLM tool-call parser 'hermes'"),
    ({}, {"s3": {"endpoint": "https://minio.lab:9000"}}, "values s3.endpoint", "as host[:port]"),
    ({"store__endpoint_url": "http://minio.lab:9000"}, {}, "$.store.endpoint_url",
     "expected the chart's S3 endpoint 'https://s3.amazonaws.com'"),
    ({"store__uri": "s3://other-bucket/run"}, {}, "$.store.uri", "bucket 'other-bucket'"),
])
def test_each_check_fails_naming_the_field(changes, values, path, needle):
    found = preflight.checks(small(**changes), preflight.merge(preflight.load_values([]), values))
    failing = [c for c in found if not c.ok]
    assert [c.path for c in failing] == [path], [(c.path, c.why) for c in failing]
    assert needle in failing[0].why


def test_an_in_cluster_minio_passes_when_the_spec_names_its_endpoint():
    values = preflight.merge(preflight.load_values([]), {"s3": {"endpoint": "minio.minio:9000", "insecure": True}})
    spec = small(store__endpoint_url="http://minio.minio:9000")
    assert [c.name for c in preflight.checks(spec, values) if not c.ok] == []


def test_the_validate_step_of_a_cycle_runs_the_same_checks():
    """mass-cycle's validate step passes the chart's bucket and max model length: the same rules."""
    deep = small(generations=40, search__iterations=60, sft__checkpoint_selection="panel",
                 sft__panel={"tasks": ["b"]})
    paths = {i.path for i in cluster_issues(deep, "mass-jobs", 32768)}
    assert {"$.search.iterations", "$.sft.checkpoint_selection"} <= paths
    assert cluster_issues(small(), "mass-jobs", 32768) == []


def test_values_files_merge_over_the_chart_defaults_and_bad_files_are_named(tmp_path, capsys):
    over = tmp_path / "mine.yaml"
    over.write_text("model: {maxModelLen: 8192}\n")
    values = preflight.load_values([str(over)])
    assert values["model"] == {**yaml.safe_load((CHART / "values.yaml").read_text())["model"], "maxModelLen": 8192}
    spec = ROOT / "examples" / "k8s-small.yaml"
    assert mass(["validate", str(spec), "--values", str(over)]) == 2
    assert "$.model.sampling.context_length: expected at most the server's max model length 8192" in capsys.readouterr().err
    over.write_text("- a list\n")
    assert mass(["validate", str(spec), "--values", str(over)]) == 2
    assert f"--values: --values {over}: expected a mapping of chart values, found list" in capsys.readouterr().err
    assert load_spec(spec).name == "k8s-small"
