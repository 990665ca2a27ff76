"""Per-role models: roles.optimizer / roles.evaluator / roles.executor send each role's calls to its
own endpoint, every proposal and verdict records who played the role, and the report says so. One
test puts a real served model (the tiny model behind the embedded server) in the evaluator's seat."""

import pytest

from mass_jobs.episodes.rollouts import episode_runner
from mass_jobs.run.context import RunContext
from mass_jobs.serving.llm import ModelClient
from mass_jobs.steps import report as rp
from mass_jobs.steps.collect import run_collect
from mass_jobs.steps.guard import run_guard
from mass_jobs.steps.rank import run_rank
from mass_jobs.steps.search import run_search
from mass_jobs.tools.testing.scripted_endpoint import Reply
from tests.fixtures.inner_loop import add_episodes, episode, proposal

RUN = "inner"


def roles_of(requests):
    return sorted({r["headers"].get("x-mass-role", "") for r in requests})


def role(ep, name="strong"):
    return {"endpoint": ep.base_url, "model": name}


@pytest.fixture
def setup(make_store, inner_spec, judging_endpoint):
    def make(iterations=1, **roles):
        store = make_store("file")
        spec = inner_spec(
            store, search={"iterations": iterations}, roles={k: role(v, k + "-model") for k, v in roles.items()}
        )
        return RunContext(spec, store)

    return make


def test_optimizer_and_evaluator_on_a_second_endpoint_are_recorded_everywhere(setup, judging_endpoint):
    gen, strong = judging_endpoint(), judging_endpoint(model="strong")
    ctx = setup(optimizer=strong, evaluator=strong)
    label = f"optimizer-model @ {strong.base_url}"
    judge_label = f"evaluator-model @ {strong.base_url}"
    add_episodes(gen, episode(1), episode(5), episode(7))  # reference, initial workflow, iteration 1
    strong.add("optimizer", Reply.text(proposal("v1")))
    client = ModelClient(gen.endpoint, ctx.spec.model.sampling, timeout_s=10, retries=0)
    run_search(ctx, 0, "t1", client, episode_runner(ctx.spec, gen.endpoint))
    # the generation's endpoint executed only; the second endpoint proposed and judged only
    assert roles_of(gen.requests) == ["orchestrator", "worker"]
    assert roles_of(strong.requests) == ["evaluator", "optimizer"]
    assert len(strong.verdicts) == 3  # initial vs reference, W_1 vs elite, the new elite vs reference
    store, base = ctx.store, f"{RUN}/gen-0/search/t1"
    assert store.get_json(f"{base}/iter-1/proposal.json")["model"] == label
    assert store.get_json(f"{base}/iter-1/verdict.json")["model"] == judge_label
    for k in (0, 1):
        assert store.get_json(f"{base}/iter-{k}/reference_verdict.json")["model"] == judge_label
    state = store.get_json(f"{base}/state.json")
    assert state["iterations"][1]["preferred"] and state["iterations"][1]["verdict"]["model"] == judge_label

    # teacher episodes on the generation, ranked by the second endpoint
    add_episodes(gen, *[episode(s) for s in (3, 9, 4, 8)])
    run_collect(ctx, 0, "t1", episode_runner(ctx.spec, gen.endpoint))
    run_guard(ctx, 0, "t1")
    n = len(strong.requests)
    ranking = run_rank(ctx, 0, "t1", client)
    assert len(strong.requests) - n == len(ranking.verdicts) > 0
    assert {v.model for v in ranking.verdicts} == {judge_label}
    assert roles_of(gen.requests) == ["orchestrator", "worker"]  # still no judging on the generation

    doc = rp.write_report(ctx)
    players = {r["role"]: r for r in doc["roles"]}
    assert players["optimizer"] == {"role": "optimizer", "configured": label, "recorded": [label]}
    assert players["evaluator"]["recorded"] == [judge_label]
    assert players["executor"] == {"role": "executor", "configured": "current generation (L_g)", "recorded": ["gen-0"]}
    md = store.get_bytes(f"{RUN}/report/report.md").decode()
    assert f"| evaluator | {judge_label} | {judge_label} |" in md


def test_executor_role_runs_the_rollouts_and_teacher_episodes(setup, judging_endpoint):
    gen, worker_model = judging_endpoint(), judging_endpoint(model="exec")
    ctx = setup(iterations=0, executor=worker_model)
    add_episodes(worker_model, episode(1), episode(5))
    client = ModelClient(gen.endpoint, ctx.spec.model.sampling, timeout_s=10, retries=0)
    run_search(ctx, 0, "t1", client, episode_runner(ctx.spec, gen.endpoint))
    assert roles_of(worker_model.requests) == ["orchestrator", "worker"] and roles_of(gen.requests) == ["evaluator"]
    assert ctx.store.get_json(f"{RUN}/gen-0/search/t1/iter-0/reference_verdict.json")["model"] == "gen-0"
    add_episodes(worker_model, *[episode(s) for s in (3, 9, 4, 8)])
    run_collect(ctx, 0, "t1", episode_runner(ctx.spec, gen.endpoint))
    doc = ctx.store.get_json(f"{RUN}/gen-0/collect/t1/ep-0/episode.json")
    assert doc["executor"] == {"endpoint": worker_model.base_url, "model": "executor-model", "api_key_env": None}
    assert {r["role"]: r["recorded"] for r in rp.build_report(ctx)["roles"]}["executor"] == [
        f"executor-model @ {worker_model.base_url}"
    ]


@pytest.mark.slow(cost=10)  # a second model server: the slow tier
def test_a_second_served_model_as_optimizer_and_evaluator(make_store, inner_spec, judging_endpoint, tiny_model_dir):
    """A tiny run whose optimizer and evaluator are a second, really served model: its proposals and
    verdicts record that model, the generation's endpoint is asked nothing but rollouts, and the report
    says which model played which role."""
    from mass_jobs.serving.serve import ModelServer

    gen = judging_endpoint()
    with ModelServer(tiny_model_dir, served_name="strong-tiny", dtype="float32") as srv:
        store = make_store("file")
        strong = {"endpoint": srv.endpoint.base_url, "model": "strong-tiny"}
        spec = inner_spec(
            store,
            search={"iterations": 1, "proposal_retries": 0},
            ranking={"verdict_retries": 0},
            model={"base": "tiny", "sampling": {"max_output_tokens": 16}},
            roles={"evaluator": strong, "optimizer": strong},
        )
        ctx = RunContext(spec, store)
        add_episodes(gen, episode(1), episode(5), episode(7))
        client = ModelClient(gen.endpoint, spec.model.sampling, timeout_s=10, retries=0)
        run_search(ctx, 0, "t1", client, episode_runner(spec, gen.endpoint))
    label = f"strong-tiny @ {srv.endpoint.base_url}"
    verdict = store.get_json(f"{RUN}/gen-0/search/t1/iter-0/reference_verdict.json")
    assert verdict["model"] == label
    assert verdict["attempts"] == 1  # the served model answered: an unreachable endpoint raises instead
    proposal = store.get_json(f"{RUN}/gen-0/search/t1/iter-1/proposal.json")
    assert proposal["model"] == label and proposal["attempts"] == 1
    assert roles_of(gen.requests) == ["orchestrator", "worker"] and gen.verdicts == []
    doc = rp.write_report(ctx)
    players = {r["role"]: r for r in doc["roles"]}
    assert players["optimizer"] == {"role": "optimizer", "configured": label, "recorded": [label]}
    assert players["evaluator"] == {"role": "evaluator", "configured": label, "recorded": [label]}
    assert players["executor"]["recorded"] == ["gen-0"]
    md = store.get_bytes(f"{RUN}/report/report.md").decode()
    assert f"| optimizer | {label} | {label} |" in md and f"| evaluator | {label} | {label} |" in md


def test_role_endpoints_are_validated(tmp_path):
    from mass_jobs.spec.load import SpecError, validate_document
    from tests.fixtures.inner_loop import spec_document

    doc = spec_document(
        f"file://{tmp_path}",
        roles={"evaluator": {"endpoint": "ftp://x", "model": ""}, "judge": {"endpoint": "http://x/v1", "model": "m"}},
    )
    with pytest.raises(SpecError) as err:
        validate_document(doc)
    paths = {i.path for i in err.value.issues}
    assert {"$.roles.evaluator.endpoint", "$.roles.evaluator.model", "$.roles.judge"} <= paths
