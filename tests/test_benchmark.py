"""The public-benchmark adapter on the shipped synthetic benchmark: two generations (scripted
endpoints standing in for two models) run bare-prompt episodes through the real built-in harness,
the benchmark's grader scores them sandboxed, the score table has the exact numbers, a rerun asks no
model again, and bad benchmark directories and grader output are reported clearly."""

import contextlib
import shutil
import tarfile
from pathlib import Path

import pytest

from mass_jobs.commands.cli import main as cli_main
from mass_jobs.run.context import RunContext
from mass_jobs.spec.load import validate_document
from mass_jobs.store import FileStore
from mass_jobs.tools import benchmark as bm
from mass_jobs.tools.testing.scripted_endpoint import Reply
from tests.fixtures.lora import random_adapter

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "examples" / "benchmarks" / "tiny-bench"


@pytest.fixture
def ctx(tmp_path):
    spec = validate_document(
        {
            "name": "bench-run",
            "model": {"base": "m"},
            "generations": 1,
            "tasks": [{"id": "a", "split": "train", "prompt": "do a"}],
            "execution": {"limits": {"wall_s": 60, "request_retries": 0}},
            "store": {"uri": f"file://{tmp_path}/s"},
        }
    )
    return RunContext(spec, FileStore(tmp_path / "s"))


def answer(text):  # the orchestrator has a worker write answer.txt, then finishes
    return {
        "orchestrator": [
            Reply.call("delegate", agent_id="worker-1", role="writer", assignment="write answer.txt"),
            Reply.call("finish", summary="done", status="success"),
        ],
        "worker-1": [Reply.call("write_file", path="answer.txt", content=text), Reply.text("written")],
    }


def script(*episodes):
    """Queues for episodes run one after another (an episode is answer(...) or a dict of queues)."""
    out: dict = {}
    for ep in episodes:
        for key, replies in ep.items():
            out.setdefault(key, []).extend(replies)
    return out


def test_load_shipped_benchmark():
    bench = bm.load_benchmark(TINY)
    assert bench.name == "tiny-bench" and [t.id for t in bench.tasks] == ["reverse", "sum"]
    assert bench.tasks[1].files == {"numbers.txt": "3\n4\n5\n"}  # reference.json is not a seed file
    assert "sum of the numbers" in bench.tasks[1].prompt


def test_two_generations_scored(ctx, scripted_endpoint):
    # tasks run in id order (reverse, sum). L0: a wrong answer, then none; L1: both right.
    gen0 = scripted_endpoint(
        script(answer("stressed"), {"orchestrator": [Reply.call("finish", summary="gave up", status="success")]})
    )
    gen1 = scripted_endpoint(script(answer("desserts"), answer("12")))
    served = []

    @contextlib.contextmanager
    def serve(g):
        served.append(g)
        yield (gen0, gen1)[g].endpoint

    table = bm.run_benchmark(ctx, bm.load_benchmark(TINY), [0, 1], serve)
    rows = {r["generation"]: r for r in table["generations"]}
    assert rows[0]["per_task"] == {"reverse": 0.5, "sum": 0.0} and rows[0]["mean_score"] == 0.25
    assert rows[1]["per_task"] == {"reverse": 1.0, "sum": 1.0} and rows[1]["mean_score"] == 1.0
    assert rows[0]["grader_errors"] == rows[1]["grader_errors"] == 0
    store, prefix = ctx.store, "bench-run/benchmark/tiny-bench"
    for g in (0, 1):
        tokens = sum(
            store.get_json(f"{prefix}/gen-{g}/{t}/rep-0/status.json")["tokens"]["completion"]
            for t in ("reverse", "sum")
        )
        assert tokens > 0 and rows[g]["output_tokens"] == tokens
        assert rows[g]["score_per_1k_output_tokens"] == pytest.approx(
            1000 * 2 * rows[g]["mean_score"] / tokens, abs=1e-5
        )
    assert rows[0]["efficiency_vs_first"] == 1.0
    assert rows[1]["efficiency_vs_first"] == pytest.approx(
        rows[1]["score_per_1k_output_tokens"] / rows[0]["score_per_1k_output_tokens"], abs=1e-5
    )
    # bare prompt sent; seeded files in the workspace, the grader's reference never
    assert store.get_bytes(f"{prefix}/gen-1/sum/rep-0/prompt.txt").decode() == bm.load_benchmark(TINY).tasks[1].prompt
    with tarfile.open(ctx.store.root / f"{prefix}/gen-1/sum/rep-0/workspace.tar.gz") as tar:
        names = {Path(n).name for n in tar.getnames()}
    assert "numbers.txt" in names and "answer.txt" in names and "reference.json" not in names
    assert store.get_json(f"{prefix}/scores.json") == table
    md = store.get_bytes(f"{prefix}/scores.md").decode()
    assert "| L1 | 2 | 1 |" in md and " | 1x | 0 |" in md
    # a rerun finds every rollout stored: no model is served and the table is the same
    served.clear()
    assert bm.run_benchmark(ctx, bm.load_benchmark(TINY), [0, 1], serve) == table and served == []


def test_grader_failures_score_zero_with_the_reason(ctx, scripted_endpoint, tmp_path):
    bench_dir = tmp_path / "b"
    shutil.copytree(TINY, bench_dir)
    (bench_dir / "benchmark.yaml").write_text("name: broken\ngrader:\n  command: echo 'no score here'\n")
    ep = scripted_endpoint(script(answer("x"), answer("y")))
    table = bm.run_benchmark(ctx, bm.load_benchmark(bench_dir), [0], lambda g: contextlib.nullcontext(ep.endpoint))
    assert table["generations"][0]["mean_score"] == 0.0 and table["generations"][0]["grader_errors"] == 2
    grade = ctx.store.get_json("bench-run/benchmark/broken/gen-0/sum/rep-0/grade.json")
    assert "neither a number nor JSON" in grade["error"]


@pytest.mark.parametrize("text,expected", [("0.5", 0.5), ('log\n{"score": 2}\n', 2.0), ("1e-3\n\n", 0.001)])
def test_parse_score(text, expected):
    assert bm.parse_score(text) == expected


@pytest.mark.parametrize(
    "text,error",
    [("", "printed nothing"), ('{"score": "1"}', "finite number"), ("NaN", "finite number"), ("true", "finite number")],
)
def test_parse_score_rejects(text, error):
    with pytest.raises(ValueError, match=error):
        bm.parse_score(text)


def test_bad_benchmark_directories_name_every_problem(tmp_path):
    with pytest.raises(bm.BenchmarkError, match="benchmark.yaml: expected a file"):
        bm.load_benchmark(tmp_path)
    (tmp_path / "benchmark.yaml").write_text("name: Bad Name\ngrader: {}\n")
    with pytest.raises(bm.BenchmarkError) as err:
        bm.load_benchmark(tmp_path)
    assert {i.path for i in err.value.issues} == {"benchmark.yaml.name", "benchmark.yaml.grader.command"}
    (tmp_path / "benchmark.yaml").write_text("name: ok\ngrader: {command: 'true'}\n")
    (tmp_path / "tasks" / "Up").mkdir(parents=True)
    (tmp_path / "tasks" / "empty").mkdir()
    with pytest.raises(bm.BenchmarkError) as err:
        bm.load_benchmark(tmp_path)
    assert [i.path for i in err.value.issues] == ["tasks/Up", "tasks/empty/prompt.md"]


def test_cli_rejects_a_generation_out_of_range(tmp_path, capsys):
    spec = tmp_path / "s.yaml"
    (tmp_path / "m").mkdir()  # model locations are checked: the spec's model exists
    spec.write_text(
        f"name: r\nmodel: {{base: m}}\ngenerations: 1\ntasks: [{{id: a, split: train, prompt: p}}]\n"
        f"store: {{uri: 'file://{tmp_path}/st'}}\n"
    )
    assert cli_main(["benchmark", "--spec", str(spec), "--bench", str(TINY), "--gen", "3"]) == 2
    assert "--gen: expected 0..1, found [3]" in capsys.readouterr().err


@pytest.mark.slow(cost=18)  # serves two generations and runs their episodes: the slow tier
def test_cli_scores_two_served_generations(tmp_path, tiny_model_dir, capsys):
    """`mass benchmark` end to end on real weights: L0 is the tiny model, L1 the tiny model with a random
    LoRA merged in (stored as the run's generation-1 model); both are served by the embedded server, run
    the shipped benchmark's bare prompts through the harness, and are graded by its grader."""
    import json as _json

    from mass_jobs.serving.model_dirs import store_model_dir
    from mass_jobs.steps.merge import merge_lora

    random_adapter(tiny_model_dir, tmp_path / "adapter")
    merge_lora(tiny_model_dir, tmp_path / "adapter", tmp_path / "gen1")
    spec = tmp_path / "s.yaml"
    spec.write_text(
        _json.dumps(
            {
                "name": "bench-real",
                "model": {"base": str(tiny_model_dir), "dtype": "float32", "sampling": {"max_output_tokens": 12}},
                "generations": 1,
                "tasks": [{"id": "a", "split": "train", "prompt": "do a"}],
                "execution": {"limits": {"turns_per_agent": 2, "tool_calls": 4, "wall_s": 120, "request_retries": 0}},
                "store": {"uri": f"file://{tmp_path}/st"},
            }
        )
    )
    store = FileStore(tmp_path / "st")
    store_model_dir(store, "bench-real/gen-1/model", tmp_path / "gen1")
    assert (
        cli_main(
            [
                "benchmark",
                str(spec),
                "--bench",
                str(TINY),
                "--gen",
                "0",
                "--gen",
                "1",
                "--work-dir",
                str(tmp_path / "work"),
            ]
        )
        == 0
    )
    table = store.get_json("bench-real/benchmark/tiny-bench/scores.json")
    rows = {r["generation"]: r for r in table["generations"]}
    assert sorted(rows) == [0, 1]
    for g, row in rows.items():
        grades = [
            store.get_json(f"bench-real/benchmark/tiny-bench/gen-{g}/{t}/rep-0/grade.json") for t in ("reverse", "sum")
        ]
        tokens = sum(
            store.get_json(f"bench-real/benchmark/tiny-bench/gen-{g}/{t}/rep-0/status.json")["tokens"]["completion"]
            for t in ("reverse", "sum")
        )
        assert row["rollouts"] == 2 and row["output_tokens"] == tokens > 0
        assert row["mean_score"] == pytest.approx(sum(x["score"] for x in grades) / 2, abs=1e-6)

    # the two generations are different models: same prompt and seed, different first replies
    def first_reply(g):
        line = (
            store.get_bytes(f"bench-real/benchmark/tiny-bench/gen-{g}/reverse/rep-0/trace.jsonl")
            .decode()
            .splitlines()[0]
        )
        return _json.loads(line)["response"]["message"]

    assert first_reply(0) != first_reply(1)
    assert "| L0 |" in capsys.readouterr().out
