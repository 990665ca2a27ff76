"""Checkpoint selection by the external panel (sft.checkpoint_selection: panel). The parent and each
candidate checkpoint are TEST FIXTURE scripted endpoints that write `score: N` reports through the
real built-in harness; the panel judge is the JudgingEndpoint TEST FIXTURE (larger score wins, blind
to position). The panel's choice must be taken over the validation loss's and recorded."""

import contextlib
import json

import pytest

from mass_jobs.run.context import RunContext
from mass_jobs.spec.load import validate_document
from mass_jobs.steps.select import run_select
from mass_jobs.steps.select_panel import candidate_won, choose, panel_candidates, tally
from mass_jobs.store import FileStore, Step, read_manifest
from tests.fixtures.inner_loop import add_episodes, episode, spec_document
from tests.fixtures.lora import random_adapter

VAL = {2: 0.50, 4: 0.70, 6: 0.90}  # validation loss alone would pick step 2


def make_ctx(tmp_path, **sft):
    doc = spec_document(
        f"file://{tmp_path}/s",
        sft={"checkpoint_selection": "panel", "panel": {"tasks": ["h1"], "rollouts": 2, "checkpoints": 2}, **sft},
        judges=[{"name": "j1", "endpoint": "http://judge.invalid/v1", "model": "judge", "seeds": [1, 2]}],
    )
    doc["tasks"].append(
        {"id": "h1", "split": "test", "prompt": "Write report.md with a held-out score.", "deliverables": ["report.md"]}
    )
    ctx = RunContext(validate_document(doc), FileStore(tmp_path / "s"))
    log = [{"kind": "train", "step": s, "loss": 1.0, "processed_tokens": 100 * s} for s in range(1, 7)]
    log += [{"kind": "val", "step": s, "val_loss": v} for s, v in VAL.items()]
    ctx.store.put_bytes(ctx.train_log(0), "".join(json.dumps(r) + "\n" for r in log).encode())
    Step(ctx.store, ctx.train(0), inputs={}).finish([ctx.train_log(0)], extra={"checkpoints": sorted(VAL)})
    return ctx


def servers(judging_endpoint, scores: dict, rollouts: int = 2):
    """Scripted parent and checkpoint endpoints writing `score: N`, and the content-judging panel judge."""
    eps = {}
    for who, score in scores.items():
        eps[who] = judging_endpoint()
        add_episodes(eps[who], *[episode(score) for _ in range(rollouts)])
    judge = judging_endpoint()
    served = []

    @contextlib.contextmanager
    def serve(who):
        served.append(who)
        yield eps[who].endpoint

    return (lambda: serve("parent"), lambda s: serve(s), lambda j: serve_judge(judge, j)), served, judge


@contextlib.contextmanager
def serve_judge(judge, j):
    assert j.name == "j1"
    yield judge.endpoint


def test_the_panels_choice_is_taken_and_recorded(tmp_path, judging_endpoint):
    ctx = make_ctx(tmp_path)
    # the parent scores 3; step 2 (lowest val loss) scores 1, step 4 scores 9; step 6 is not a candidate
    trio, served, judge = servers(judging_endpoint, {"parent": 3, 2: 1, 4: 9})
    chosen = run_select(ctx, 0, servers=trio)
    assert served == ["parent", 2, 4]
    assert (chosen["step"], chosen["by"], chosen["val_loss"], chosen["val_loss_choice"]) == (4, "panel", 0.70, 2)
    assert chosen["checkpoint"] == ctx.checkpoint(0, 4) and chosen["processed_supervised_tokens"] == 400
    panel = chosen["panel"]
    # 1 task x 2 rollouts x 2 seeds = 4 verdicts per candidate, every one decided by content
    assert panel["candidates"] == {
        "2": {"val_loss": 0.5, "wins": 0, "losses": 4, "ties": 0, "invalid": 0, "win_share": 0.0},
        "4": {"val_loss": 0.7, "wins": 4, "losses": 0, "ties": 0, "invalid": 0, "win_share": 1.0},
    }
    assert panel["budget"] == {"episodes": 6, "verdicts": 8} and panel["verdicts"] == 8 == len(judge.verdicts)
    assert (panel["tasks"], panel["judges"], panel["fallback"]) == (["h1"], ["j1"], None)
    # both positions were shown (blind, balanced), and the judge saw only the held-out task
    orders = [ctx.store.get_json(k)["order"] for k in ctx.store.list(ctx.select_verdicts(0) + "/")]
    assert sorted(set(orders)) == ["baseline_first", "candidate_first"]
    assert {k.split("/")[-3] for k in ctx.store.list(ctx.select_verdicts(0) + "/")} == {"h1"}
    # recorded: select.json and the step manifest
    assert ctx.store.get_json(ctx.select(0)) == chosen
    extra = read_manifest(ctx.store, ctx.select_step(0))["extra"]
    assert (extra["step"], extra["by"]) == (4, "panel")
    # a rerun is done: nothing is served or judged again
    served.clear()
    n = len(judge.requests)
    assert run_select(ctx, 0, servers=trio) == chosen and served == [] and len(judge.requests) == n


def test_a_killed_panel_selection_resumes_from_stored_rollouts_and_verdicts(tmp_path, judging_endpoint):
    ctx = make_ctx(tmp_path)
    trio, served, judge = servers(judging_endpoint, {"parent": 5, 2: 7, 4: 2})

    @contextlib.contextmanager
    def judge_down(j):
        raise RuntimeError("judge endpoint killed")
        yield

    with pytest.raises(RuntimeError, match="killed"):
        run_select(ctx, 0, servers=(trio[0], trio[1], judge_down))
    served.clear()
    chosen = run_select(ctx, 0, servers=trio)
    assert served == ["parent", 2, 4]  # served again, but every rollout was stored: no episode asked twice
    assert chosen["step"] == 2 and chosen["panel"]["candidates"]["2"]["win_share"] == 1.0


def test_validation_loss_selection_is_unchanged_and_says_so(tmp_path):
    ctx = make_ctx(tmp_path)
    plain = RunContext(
        validate_document(
            {**ctx.spec.model_dump(mode="json"), "sft": {"checkpoint_selection": "val_loss"}, "judges": []}
        ),
        ctx.store,
    )
    chosen = run_select(plain, 0, servers=("unused",))
    assert (chosen["step"], chosen["by"], chosen["val_loss"]) == (2, "val_loss", 0.5) and "panel" not in chosen


def test_pure_rules():
    assert panel_candidates({6: 0.9, 2: 0.5, 4: 0.5, 8: 0.4}, 3) == [8, 2, 4]
    assert candidate_won({"valid": True, "winner": "A", "order": "candidate_first"}) is True
    assert candidate_won({"valid": True, "winner": "A", "order": "baseline_first"}) is False
    assert candidate_won({"valid": True, "winner": "tie", "order": "baseline_first"}) is None
    t = tally(
        [
            {"valid": True, "winner": "B", "order": "baseline_first"},
            {"valid": False, "winner": None},
            {"valid": True, "winner": "tie", "order": "candidate_first"},
        ]
    )
    assert t == {"wins": 1, "losses": 0, "ties": 1, "invalid": 1, "win_share": 1.0}
    # equal win shares: the lower validation loss; no decisive verdict: the lowest validation loss, recorded
    assert choose({2: {"win_share": 0.5, "val_loss": 0.6}, 4: {"win_share": 0.5, "val_loss": 0.4}}) == (4, None)
    step, why = choose({2: {"win_share": None, "val_loss": 0.6}, 4: {"win_share": None, "val_loss": 0.4}})
    assert step == 4 and "no decisive panel verdict" in why


@pytest.mark.slow(cost=20)  # merges a checkpoint and starts two model servers: the slow tier
def test_default_servers_merge_a_stored_checkpoint_and_serve_it(tmp_path, tiny_model_dir):
    """The embedded-server path `mass select` takes: a stored LoRA checkpoint is merged into the parent
    once and served under its own name; the parent is served as L_g."""
    import torch
    from transformers import AutoModelForCausalLM

    from mass_jobs.serving.llm import ModelClient
    from mass_jobs.steps.select_panel import default_servers

    doc = spec_document(
        f"file://{tmp_path}/s",
        model={"base": str(tiny_model_dir), "dtype": "float32", "sampling": {"max_output_tokens": 4}},
    )
    ctx = RunContext(validate_document(doc), FileStore(tmp_path / "s"))
    random_adapter(tiny_model_dir, tmp_path / "adapter")
    ctx.store.put_dir(ctx.checkpoint(0, 2), tmp_path / "adapter")
    serve_parent, serve_checkpoint, _ = default_servers(ctx, 0, tmp_path / "work")
    for serve, name in ((lambda: serve_checkpoint(2), "gen-0-step-2"), (serve_parent, ctx.served_model(0))):
        with serve() as endpoint:
            assert endpoint.model == name
            reply = ModelClient(endpoint, ctx.spec.model.sampling, timeout_s=60, retries=0).chat(
                [{"role": "user", "content": "hi"}], seed=1
            )
            assert isinstance(reply.get("content"), str)
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "work" / "merged-2")
    parent = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(merged.state_dict()[q], parent.state_dict()[q])  # the checkpoint was merged in
