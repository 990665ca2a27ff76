"""`mass plan`: the memory model against a measured training step, the counts against a stored run,
the schedule from the pipeline table, and the refusal when training will not fit."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from mass_jobs.pipeline.planning.counts import compare, plan_counts
from mass_jobs.pipeline.planning.memory import load_config, training_memory
from mass_jobs.pipeline.planning.schedule import DEFAULTS, simulate
from mass_jobs.spec.load import load_spec, validate_document

ROOT = Path(__file__).parent.parent
PAPER = ROOT / "examples" / "paper.yaml"
QWEN = ROOT / "examples" / "qwen3.5-27b-config.json"


def mass_plan(capsys, *args: str) -> SimpleNamespace:
    """`mass plan ARGS` in this process (its CLI entry, as a subprocess would run it, without the
    interpreter start): returncode, stdout and stderr."""
    from mass_jobs.commands.cli import main

    capsys.readouterr()
    code = main(["plan", *args])
    out = capsys.readouterr()
    return SimpleNamespace(returncode=code, stdout=out.out, stderr=out.err)


ATTENTION_MLP = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def tiny_spec(model_dir, window, checkpointing=False, adapt_head=False):
    """The CI spec on the tiny model; `adapt_head` puts the LM head under LoRA, which keeps
    whole-window logits (the chunked loss needs a frozen head)."""
    doc = yaml.safe_load((ROOT / "tests" / "specs" / "ci-e2e.yaml").read_text())
    doc["model"]["base"] = str(model_dir)
    doc["sft"].update(window=window, gradient_checkpointing=checkpointing, steps=1, val_every=100, save_every=100)
    if adapt_head:
        doc["sft"]["lora"]["target_modules"] = [*ATTENTION_MLP, "lm_head"]
    return validate_document(doc)


def measured_peak(spec, model_dir, out_dir) -> int:
    """Peak bytes of live CPU tensors during one real training step (`Trainer.train`, one step):
    the tensors alive before it (weights) plus the largest rise the profiler's allocation events show."""
    from torch.profiler import ProfilerActivity, profile

    from mass_jobs.training.loop import Trainer

    T = spec.sft.window
    ids = [(i * 7) % 400 + 20 for i in range(T)]
    train = [{"input_ids": ids, "labels": ids, "role": "orchestrator", "task": "fib"}]
    val = [{"input_ids": ids[:32], "labels": ids[:32], "role": "orchestrator", "task": "fib"}]
    trainer = Trainer(model_dir, train, val, spec.sft, out_dir, progress=False)
    trainer.setup()
    before = sum(t.numel() * t.element_size() for t in (*trainer.model.parameters(), *trainer.model.buffers()))
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        trainer.train()
    events = sorted(
        (e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"), key=lambda e: e.start_ns()
    )
    live = peak = 0
    for e in events:
        live += e.nbytes()
        peak = max(peak, live)
    assert len(events) > 100  # the profiler saw the step's allocations
    return before + peak


@pytest.mark.parametrize("window,adapt_head", [(512, False), (1024, False), (2048, False), (1024, True)])
def test_memory_model_within_10_percent_of_a_measured_training_step(tiny_model_dir, tmp_path, window, adapt_head):
    spec = tiny_spec(tiny_model_dir, window, adapt_head=adapt_head)
    mem = training_memory(spec, load_config(spec))
    assert mem.loss_chunk == (None if adapt_head else 512)
    planned = mem.total
    measured = measured_peak(spec, tiny_model_dir, tmp_path / "train")
    print(
        f"window {window} ({'whole-window' if adapt_head else 'chunked'} logits): planned {planned / 2**20:.1f} MiB, "
        f"measured {measured / 2**20:.1f} MiB"
    )
    assert abs(planned - measured) / measured < 0.10, (window, planned / 2**20, measured / 2**20)


def test_checkpointing_saves_what_the_model_says_it_saves(tiny_model_dir, tmp_path):
    """The layer activations alone: the drop gradient checkpointing brings, planned vs measured."""
    planned, measured = {}, {}
    for on in (False, True):
        spec = tiny_spec(tiny_model_dir, 2048, checkpointing=on)
        planned[on] = training_memory(spec, load_config(spec)).total
        measured[on] = measured_peak(spec, tiny_model_dir, tmp_path / f"train-{on}")
    print(f"checkpointing on: planned {planned[True] / 2**20:.1f} MiB, measured {measured[True] / 2**20:.1f} MiB")
    assert abs(planned[True] - measured[True]) / measured[True] < 0.10
    drop_planned, drop_measured = planned[False] - planned[True], measured[False] - measured[True]
    print(f"saved by checkpointing: planned {drop_planned / 2**20:.1f} MiB, measured {drop_measured / 2**20:.1f} MiB")
    assert drop_measured > 0 and abs(drop_planned - drop_measured) / drop_measured < 0.10


def test_memory_grows_with_the_window_and_the_chunk_caps_the_logits():
    spec = load_spec(PAPER)
    config = load_config(spec, str(QWEN))
    whole = training_memory(spec, config, parallel="fsdp", loss_chunk=None)
    chunked = training_memory(spec, config, parallel="fsdp", loss_chunk=512)
    assert whole.parameters == 26_895_998_464  # the text model of the config, counted on the meta device
    assert whole.logits == 49152 * 248320 * 14 and chunked.logits == 512 * 248320 * 6  # fp32 in place + a bf16 copy
    assert chunked.total < whole.total
    half = training_memory(spec, config, parallel="fsdp", window=24576, loss_chunk=512)
    assert half.activations < chunked.activations
    ddp = training_memory(spec, config, parallel="ddp", loss_chunk=512)
    assert ddp.weights == pytest.approx(26_895_998_464 * 2)  # every rank holds the bf16 weights
    assert chunked.weights < ddp.weights / 5  # FSDP: 1/6 of them plus one gathered layer


def test_plan_refuses_what_will_not_fit_and_names_the_numbers(tmp_path, capsys):
    run = [str(PAPER), "--config", str(QWEN)]
    small = mass_plan(capsys, *run, "--gpu-memory", "40", "--set", "sft.parallel=ddp")
    assert small.returncode == 2, small.stderr
    assert "will not fit" in small.stderr and "> the declared 40 GiB GPU" in small.stderr
    assert "weights 50.1" in small.stderr  # 26.9 B bf16 parameters on every DDP rank
    big = mass_plan(capsys, *run, "--gpu-memory", "100000", "--json", "--gantt", str(tmp_path / "g.png"))
    assert big.returncode == 0, big.stderr
    doc = json.loads(big.stdout)
    assert doc["fits"] and doc["counts"][0]["teacher_episodes"] == 2 * 18
    assert (tmp_path / "g.png").read_bytes()[:4] == b"\x89PNG"


def test_plan_of_the_papers_example_needs_no_flag_and_says_which_config_it_read(capsys):
    bare = mass_plan(capsys, str(PAPER), "--json")
    assert bare.returncode == 0, bare.stderr
    assert f"planning with the config shipped for it, {QWEN}" in bare.stderr
    given = mass_plan(capsys, str(PAPER), "--config", str(QWEN), "--json")
    assert json.loads(given.stdout) == json.loads(bare.stdout) and "shipped" not in given.stderr


def test_plan_without_a_config_for_another_hub_id_names_the_flag_and_a_value(capsys):
    proc = mass_plan(capsys, str(PAPER), "--set", "model.base=org/unknown-model")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "$.model.base" in proc.stderr and "'org/unknown-model'" in proc.stderr
    assert "pass --config PATH" in proc.stderr and "--config examples/qwen3.5-27b-config.json" in proc.stderr


def test_schedule_runs_episodes_side_by_side_and_sums_them_one_after_another():
    spec = load_spec(PAPER)
    counts = plan_counts(spec)
    t = dict(DEFAULTS, step_s=0.0, fixed_s=0.0, call_s=0.0)
    bars, dag, serial = simulate(spec, counts, t, parallelism=18)
    episodes = sum(c["teacher_episodes"] + c["search_rollouts"] + c["rollout_episodes"] for c in counts)
    assert serial == episodes * t["episode_s"]
    # per generation: one task's search (13 rollouts), 36 teacher episodes on 18 slots, the evaluation's
    # rollouts on 18 slots (60 at gen 0 with L0's, then 30)
    assert dag == (2 * 13 + 2 * 2 + 4 + 2) * t["episode_s"]
    assert {b.step for b in bars} >= {"search", "collect", "train", "evaluate", "report"}


def test_compare_flags_every_count_a_store_differs_in():
    """`compare` flags every exact count a store differs in (its use on a real run is in the e2e test)."""
    spec = load_spec(PAPER)
    planned = plan_counts(spec)[0]
    stored = dict(planned, ranking_calls=planned["ranking_calls"] - 1, processed_tokens_max=1)
    assert compare(planned, planned) == []
    assert compare(planned, stored) == [
        f"ranking_calls: planned {planned['ranking_calls']}, stored {planned['ranking_calls'] - 1}"
    ]


def test_the_papers_spec_fits_as_written_with_the_fsdp_it_declares(capsys):
    """examples/paper.yaml says sft.parallel: fsdp, which the plan, `mass run` and the PyTorchJob's
    `mass train` all take from the spec: the 27B model fits the declared 80 GiB GPU."""
    run = [str(PAPER), "--config", str(QWEN), "--json"]
    out = mass_plan(capsys, *run)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["memory"]["parallel"] == "fsdp" and doc["memory"]["world"] == 6
    assert doc["memory"]["total"] < 80 * 2**30 and doc["fits"] is True
    # mass-run's Workflow object: two generations of ~1,300 nodes, about 1 MB of nodes each, which
    # the controller stores compressed once the object passes 1 MiB
    sizes = doc["workflow_object"]["after_generation"]
    assert [s["generation"] for s in sizes] == [0, 1] and 1000 < sizes[0]["nodes"] < sizes[1]["nodes"] < 3000
    assert sizes[1]["nodes_bytes"] > doc["workflow_object"]["max_workflow_size"] > sizes[1]["stored_bytes"]
    assert sizes[1]["stored_bytes"] == sizes[1]["fixed_bytes"] + sizes[1]["compressed_bytes"]
    # the compiled plan's nodes: per generation, 4 per-task steps x the train tasks and 5 others; then the report
    nodes = doc["nodes"]
    n_train = sum(t.split == "train" for t in load_spec(PAPER).resolved_tasks())
    assert len(nodes) == 2 * (4 * n_train + 5) + 1 and nodes[-1]["argv"] == ["report", "--spec", str(PAPER)]
    train = next(n for n in nodes if n["step"] == "train" and n["gen"] == 1)
    assert (train["pod"], train["resources"], train["credentials"]) == ("trainer", "trainer", "store")
    assert train["argv"] == ["train", "--spec", str(PAPER), "--gen", "1", "--resume"]
    assert {n["agent_credentials"] for n in nodes if n["pod"] == "agent"} == {"none"}
    ddp = mass_plan(capsys, *run[:-1], "--set", "sft.parallel=ddp")
    assert ddp.returncode == 2 and "ddp over 6 ranks) > the declared 80 GiB GPU" in ddp.stderr


def test_uncapped_episodes_leave_the_window_count_unbounded_and_the_table_says_so(capsys):
    """examples/paper.yaml caps no turn or tool call (upstream): the windows a cycle can render have
    no bound, the table prints `unbounded`, and a stored count is never flagged against it."""
    spec = load_spec(PAPER)
    planned = plan_counts(spec)[0]
    assert planned["sft_windows_max"] is None
    assert compare(planned, dict(planned, sft_windows_max=10**9)) == []
    from mass_jobs.config.run_spec import EpisodeLimits

    limits = EpisodeLimits(turns_per_agent=40, tool_calls=200)
    capped = plan_counts(spec.model_copy(update={"execution": spec.execution.model_copy(update={"limits": limits})}))[0]
    n_train = sum(t.split == "train" for t in spec.resolved_tasks())
    assert capped["sft_windows_max"] == n_train * 16 * 201 * 40 and n_train > 0
    out = mass_plan(capsys, str(PAPER), "--config", str(QWEN))
    row = next(line for line in out.stdout.splitlines() if line.strip().startswith("sft_windows_max"))
    assert row.split()[1:] == ["unbounded", "unbounded"], row
