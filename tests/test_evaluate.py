"""The evaluate step on the real tiny model: matched bare-prompt rollouts stored once and reused,
self-evaluator and panel verdicts (judges answering through the test-only ScriptedEndpoint, one
sound and one answering garbage), and resume that asks only for what is missing."""

import contextlib
import json

import pytest

from mass_jobs.run.context import RunContext
from mass_jobs.run.generation_model import generation_servers
from mass_jobs.serving.servers import remote_servers
from mass_jobs.spec.load import validate_document
from mass_jobs.steps import evaluate as ev
from mass_jobs.store import FileStore, read_manifest
from mass_jobs.tools.testing.scripted_endpoint import Reply

pytestmark = pytest.mark.slow


def make_spec(store_dir, judges):
    return validate_document(
        {
            "name": "evaltest",
            "model": {"base": "unused-here", "dtype": "float32", "sampling": {"max_output_tokens": 24}},
            "generations": 2,
            "tasks": [
                {
                    "id": "fib",
                    "split": "train",
                    "prompt": "Write fib.py printing 10 Fibonacci numbers.",
                    "deliverables": ["fib.py"],
                },
                {
                    "id": "sort",
                    "split": "test",
                    "prompt": "Sort data/nums.txt into results/sorted.txt.",
                    "files": {"data/nums.txt": "3\n1\n2\n"},
                },
            ],
            "evaluation": {"rollouts_per_task": 2, "verdict_retries": 1},
            "judges": judges,
            "store": {"uri": f"file://{store_dir}"},
            "execution": {
                "concurrency": 2,
                "limits": {
                    "turns_per_agent": 2,
                    "tool_calls": 4,
                    "wall_s": 60,
                    "request_timeout_s": 30,
                    "request_retries": 0,
                },
            },
        }
    )


@pytest.fixture
def judged_run(tmp_path, tiny_model_dir, scripted_endpoint):
    sound = scripted_endpoint(
        {"*": [Reply.text(json.dumps({"winner": "A", "rationale": "A has fib.py"}))]}, repeat_last=True
    )
    garbage = scripted_endpoint({"*": [Reply.text("no idea")]}, repeat_last=True)
    spec = make_spec(
        tmp_path / "store",
        [
            {"name": "sound", "endpoint": sound.base_url, "model": "judge-a", "seeds": [1, 2]},
            {"name": "garbage", "endpoint": garbage.base_url, "model": "judge-b", "seeds": [5]},
        ],
    )
    store = FileStore(tmp_path / "store")
    ctx = RunContext(spec, store)
    # L1 and L2 are real model dirs in the store, where the merge step puts them
    store.put_dir(ctx.model(1), tiny_model_dir)
    store.put_dir(ctx.model(2), tiny_model_dir)
    served: list[str] = []
    serve_model, serve_judge = generation_servers(ctx, cache_root=tmp_path / "models")

    @contextlib.contextmanager
    def counting_model(g):
        served.append(f"gen-{g}")
        if g == 0:  # L0 is the base model dir (the spec's model.base)
            from mass_jobs.serving.serve import ModelServer

            with ModelServer(tiny_model_dir, served_name="gen-0", dtype="float32") as srv:
                yield srv.endpoint
            return
        with serve_model(g) as endpoint:
            yield endpoint

    @contextlib.contextmanager
    def counting_judge(judge):
        served.append(judge.name)
        with serve_judge(judge) as endpoint:
            yield endpoint

    return ctx, counting_model, counting_judge, served, sound, garbage


def test_evaluate_rollouts_verdicts_and_resume(judged_run):
    ctx, serve_model, serve_judge, served, sound, garbage = judged_run
    store = ctx.store
    events = []
    # the cluster's rounds (the plan phase), one model served in each: L_0 rolls out, L_1 rolls out and
    # judges itself, L_0 comes back to judge the pairs L_1's rollouts completed
    assert [int(m["gen"]) for m in ev.plan(ctx, 1)["rounds"]] == ev.planned_rounds(1) == [0, 1, 0]
    manifest = ev.evaluate(ctx, 1, serve_model, serve_judge, progress=lambda kind, rec: events.append(kind))

    # rollouts: 2 tasks x 2 replicates for L0 and for L1, each behind its own manifest
    for g in (0, 1):
        for task in ("fib", "sort"):
            for r in (0, 1):
                prefix = f"evaltest/eval/gen-{g}/{task}/rep-{r}"
                m = read_manifest(store, prefix)
                assert set(m["outputs"]) == {f"{prefix}/{n}" for n in ev.AUDITED_FILES}
                audit = store.get_json(f"{prefix}/audit.json")
                assert audit["episode"] == prefix and isinstance(audit["delegation"], bool)
    assert events.count("rollout") == 8

    # matched seeds: replicate r of a task sent the same seed in both generations, different across r
    def seeds(g, task, r):
        lines = store.get_bytes(f"evaltest/eval/gen-{g}/{task}/rep-{r}/trace.jsonl").decode().splitlines()
        return {json.loads(x)["request"]["sampling"]["seed"] for x in lines}

    assert seeds(0, "fib", 1) == seeds(1, "fib", 1) and seeds(0, "fib", 0) != seeds(0, "fib", 1)
    # bare prompt: the first request of every rollout carries the task prompt and no workflow
    first = json.loads(store.get_bytes("evaltest/eval/gen-1/fib/rep-0/trace.jsonl").decode().splitlines()[0])
    user = [m for m in first["request"]["messages"] if m["role"] == "user"][0]["content"]
    assert "Write fib.py printing 10 Fibonacci numbers." in user and "workflow" not in user.lower()

    # verdicts: 4 pairs (L1 vs L0) x (self L0 + self L1 + sound x 2 seeds + garbage x 1 seed)
    records = [store.get_json(k) for k in store.list("evaltest/eval/verdicts/")]
    assert len(records) == 4 * 5 == manifest["extra"]["verdicts"]
    by = lambda name: [r for r in records if r["judge"] == name]  # noqa: E731
    assert len(by("gen-0")) == len(by("gen-1")) == 4 and {r["kind"] for r in by("gen-0")} == {"self"}
    assert all(r["valid"] and r["winner"] == "A" for r in by("sound"))
    assert {r["order"] for r in by("sound")} == {"candidate_first", "baseline_first"}
    assert all(not r["valid"] and r["winner"] is None and len(r["errors"]) == 2 for r in by("garbage"))
    assert manifest["extra"]["invalid"] >= 4
    assert served == ["gen-0", "gen-1", "gen-0", "gen-1", "sound", "garbage"]

    # rerun: done, nothing served, nothing asked
    asked = len(sound.requests) + len(garbage.requests)
    assert ev.evaluate(ctx, 1, serve_model, serve_judge) == manifest
    assert len(served) == 6 and len(sound.requests) + len(garbage.requests) == asked

    # lose one verdict and the step manifest: only that verdict is asked again, no model is served
    lost = "evaltest/eval/verdicts/gen-1-vs-gen-0/sort/rep-1/panel-sound-seed-2.json"
    store.delete(lost)
    store.delete("evaltest/eval/gen-1/_manifest.json")
    ev.evaluate(ctx, 1, serve_model, serve_judge)
    assert store.exists(lost) and len(sound.requests) == asked - len(garbage.requests) + 1
    assert served[6:] == ["sound"]

    # the cluster's last finish gives no self-verdict: a lost one is refused, naming its round, whose
    # finish (L_0 served again) gives it back
    lost_self = next(k for k in sorted(store.list("evaltest/eval/verdicts/gen-1-vs-gen-0/fib/")) if "/self-gen-0-" in k)
    store.delete(lost_self)
    store.delete("evaltest/eval/gen-1/_manifest.json")
    no_model, _ = remote_servers()
    with pytest.raises(
        RuntimeError,
        match=r"L_0's self-verdicts not stored \(its round ends with --phase finish "
        r"--served-gen 0\)",
    ):
        ev.evaluate(ctx, 1, no_model, serve_judge, agent_pods=True)
    assert ev.plan(ctx, 1)["rounds"] == [
        {
            "gen": "0",
            "model-uri": ev.plan(ctx, 1)["rounds"][0]["model-uri"],
            "dtype": ctx.spec.model.dtype,
            "rolls": "false",
            "judges": "true",
        }
    ]
    assert ev.judge_round(ctx, 1, 1, None) == {"self_verdicts": 0}  # L_1's are all stored: nothing to call
    with serve_model(0) as endpoint:
        assert ev.judge_round(ctx, 1, 0, endpoint) == {"self_verdicts": 4}  # 3 read back, 1 given
    assert store.exists(lost_self) and ev.plan(ctx, 1)["rounds"] == []
    assert ev.evaluate(ctx, 1, no_model, serve_judge, agent_pods=True)["extra"]["verdicts"] == 20

    # before L_2's rollouts: its round lists only its own, and its self-verdicts wait for them
    assert ev.prepare(ctx, 2, 0, None) == {"rollouts": []}  # L_0's are stored
    assert ev.judge_round(ctx, 2, 2, None) == {"self_verdicts": 0}
    with pytest.raises(ValueError, match=r"--served-gen: evaluate of gen 2 rolls out \[0, 1, 2\], got 3"):
        ev.prepare(ctx, 2, 3, None)

    # L2: compared with L0 and L1, whose rollouts are reused (only L2 is served, twice)
    served.clear()
    assert [int(m["gen"]) for m in ev.plan(ctx, 2)["rounds"]] == ev.planned_rounds(2) == [2]
    m2 = ev.evaluate(ctx, 2, serve_model, serve_judge)
    assert served == ["gen-2", "gen-2", "sound", "garbage"]
    pairs = {k.split("/")[3] for k in store.list("evaltest/eval/verdicts/") if "gen-2-vs" in k}
    assert pairs == {"gen-2-vs-gen-0", "gen-2-vs-gen-1"}
    # per pair: self L2 + sound x 2 + garbage = 4 verdicts; 2 baselines x 2 tasks x 2 reps = 8 pairs
    assert m2["extra"]["verdicts"] == 8 * 4


@pytest.mark.unit
def test_rounds_serve_one_model_at_a_time_and_judge_once_every_pair_is_stored():
    """The last rollout round is a self-evaluator's where one rolls out, so it judges there; each other
    self-evaluator comes back once every rollout is stored."""
    assert ev.serve_order({0, 1}, {0, 1}) == [0, 1, 0]  # generation 1, nothing stored
    assert ev.serve_order({1}, {0, 1}) == [1, 0]  # L_0's rollouts stored by an earlier attempt
    assert ev.serve_order(set(), {0, 1}) == [0, 1]  # only verdicts missing
    assert ev.serve_order({0, 1}, set()) == [0, 1]
    assert ev.serve_order({0, 1}, {0}) == [1, 0]  # L_0 last: its round is after every rollout
    assert ev.serve_order({1, 2}, {2}) == [1, 2] and ev.serve_order({3}, {3}) == [3]
    assert ev.serve_order(set(), set()) == []
    assert [ev.planned_rounds(g) for g in (1, 2, 5)] == [[0, 1, 0], [2], [5]]
    # what each round does: L_0 first only rolls out (no pair is whole yet), then only judges
    assert ev.round_work({0, 1}, {0, 1}) == [(0, True, False), (1, True, True), (0, False, True)]
    assert ev.round_work({1}, {0, 1}) == [(1, True, True), (0, False, True)]
    assert ev.round_work(set(), {0, 1}) == [(0, False, True), (1, False, True)]
    assert ev.round_work({0, 1}, set()) == [(0, True, False), (1, True, False)]
    assert ev.round_work({0, 1}, {0}) == [(1, True, False), (0, True, True)]
    assert ev.planned_work(2) == [(2, True, True)]


def test_evaluate_needs_a_later_generation():
    with pytest.raises(ValueError, match="generation >= 1"):
        ev.baselines(0)
    assert ev.baselines(1) == [0] and ev.baselines(3) == [0, 2] and ev.self_evaluators(1) == [0, 1]
