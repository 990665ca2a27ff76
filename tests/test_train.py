"""LoRA SFT: schedule, token accounting, every trainable parameter moves, 2-rank DDP, kill and resume,
2-rank FSDP against DDP (losses, adapter, optimizer state, select/merge, resume)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import jsonschema
import pytest
import torch
import yaml

from mass_jobs.config.run_spec import LoraSpec, OptimizerSpec, SftSpec
from mass_jobs.training.checkpoint import MANIFEST, adapter_digest, latest_checkpoint, read_checkpoint
from mass_jobs.training.loop import Trainer, finite
from mass_jobs.training.sampler import WindowSampler
from mass_jobs.training.schedule import lr_at
from tests.fixtures.training_data import synthetic_windows

ROOT = Path(__file__).parents[1]
SCHEMA = json.loads((ROOT / "schemas" / "checkpoint-manifest.schema.json").read_text())
TORCHRUN = ROOT / ".venv" / "bin" / "torchrun"


def small_sft(**kw) -> SftSpec:
    base = dict(
        window=256,
        context=0,
        steps=4,
        val_every=2,
        save_every=2,
        gradient_checkpointing=True,
        lora=LoraSpec(r=4, alpha=8, dropout=0.05, target_modules=["q_proj", "v_proj", "down_proj"]),
        optimizer=OptimizerSpec(lr=2e-3, warmup_steps=1),
    )
    return SftSpec(**{**base, **kw})


def test_schedule_warmup_cosine_floor():
    opt = OptimizerSpec(lr=3e-5, warmup_steps=5, min_lr_ratio=0.1)
    lrs = [lr_at(s, 100, opt) for s in range(1, 101)]
    assert lrs[0] == pytest.approx(6e-6) and lrs[4] == pytest.approx(3e-5)  # linear warmup to the peak
    assert all(a >= b for a, b in zip(lrs[4:], lrs[5:]))  # then monotone cosine decay
    assert lrs[-1] == pytest.approx(3e-6)  # ... to lr * min_lr_ratio at the last step
    assert lr_at(55, 105, opt) == pytest.approx(3e-5 * (0.1 + 0.9 * 0.5))  # halfway: midpoint of peak and floor


def test_single_process_training_accounts_tokens_and_moves_every_parameter(tiny_model_dir, tmp_path):
    train, val = synthetic_windows(6, 0), synthetic_windows(2, 1)
    sft = small_sft()
    trainer = Trainer(tiny_model_dir, train, val, sft, tmp_path, progress=False)
    trainer.setup()
    before = {n: p.detach().clone() for n, p in trainer.peft_model.named_parameters() if p.requires_grad}
    frozen = {n: p.detach().clone() for n, p in trainer.peft_model.named_parameters() if not p.requires_grad}
    assert len(before) == 2 * 3 * 2  # A and B for 3 target modules x 2 layers
    result = trainer.train()
    after = dict(trainer.peft_model.named_parameters())
    unchanged = [n for n, p in before.items() if torch.equal(p, after[n].detach())]
    assert unchanged == []
    assert all(torch.equal(p, after[n].detach()) for n, p in frozen.items())  # the parent stays frozen
    # processed = sum of the sampled windows' supervised tokens, recomputed from the sampler alone
    sampler = WindowSampler(train, sft.orchestrator_share, sft.seed)
    expected = sum(train[sampler.draw(s, 0)]["n_supervised"] for s in range(1, 5))
    assert result.processed_tokens == expected
    log = [json.loads(x) for x in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if r["kind"] == "val"] == [0, 2, 4]
    assert [r["processed_tokens"] for r in log if r["kind"] == "train"][-1] == expected
    first_val = [r for r in log if r["kind"] == "val"][0]
    assert set(first_val["val_by_task"]) == {"a", "b"}
    assert first_val["val_tokens"] == sum(w["n_supervised"] for w in val)
    for step in (2, 4):
        meta = read_checkpoint(tmp_path / f"step-{step}")
        jsonschema.validate(meta, SCHEMA)
    assert read_checkpoint(tmp_path / "step-4")["adapter_sha256_by_rank"] == [
        adapter_digest(__import__("peft").get_peft_model_state_dict(trainer.peft_model))
    ]
    # the optimizer state's layout depends on --parallel, so a resume must use the checkpoint's
    other = Trainer(tiny_model_dir, train, val, sft, tmp_path, parallel="fsdp", progress=False)
    other.setup()
    with pytest.raises(ValueError, match="written with sft.parallel ddp, this run uses fsdp"):
        other.resume()


# ---------------------------------------------------------------- torchrun, 2 ranks, via `mass train`


def make_run(
    tmp_path: Path, model_dir: Path, name: str, steps: int, save_every: int, n_val: int = 2, **sft: object
) -> Path:
    from mass_jobs.store import Step, open_store

    tmp_path.mkdir(parents=True, exist_ok=True)
    store_root = tmp_path / "store"
    spec = {
        "name": name,
        "model": {"base": str(model_dir), "dtype": "float32"},
        "tasks": [{"id": "a", "split": "train", "prompt": "task a"}, {"id": "b", "split": "train", "prompt": "task b"}],
        "collection": {"episodes": 3, "train_ranks": 1, "validation_rank": 2},
        "ranking": {"comparisons_per_episode": 1},
        "sft": {
            "window": 256,
            "context": 0,
            "steps": steps,
            "val_every": 2,
            "save_every": save_every,
            "lora": {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]},
            "optimizer": {"lr": 2e-3, "warmup_steps": 1},
            "gradient_checkpointing": False,
            **sft,
        },
        "store": {"uri": f"file://{store_root}"},
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    store = open_store(f"file://{store_root}")
    prefix = f"{name}/gen-0/sft"
    store.put_bytes(f"{prefix}/train.jsonl", "".join(json.dumps(w) + "\n" for w in synthetic_windows(8, 0)).encode())
    store.put_bytes(f"{prefix}/val.jsonl", "".join(json.dumps(w) + "\n" for w in synthetic_windows(n_val, 1)).encode())
    Step(store, prefix, inputs={"test": name}).finish(
        [f"{prefix}/train.jsonl", f"{prefix}/val.jsonl"], extra={"stored_supervised_tokens": 1}
    )
    return path


def torchrun(spec: Path, work: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    cmd = [
        str(TORCHRUN),
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",
        "mass_jobs.commands.cli",
        "train",
        "--spec",
        str(spec),
        "--gen",
        "0",
        "--work-dir",
        str(work),
        "--quiet",
        *extra,
    ]
    return subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )


def finish(proc: subprocess.Popen, timeout: float = 300) -> str:
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out.decode()[-3000:]
    return out.decode()


def local_work(work_root: Path, name: str) -> Path:
    """The run's local scratch under a --work-dir: `<name>-<digest of store and spec>`."""
    [found] = Path(work_root).glob(f"{name}-*")
    return found


def train_losses(path: Path) -> list[tuple[int, float]]:
    return [(r["step"], r.get("loss", r.get("val_loss"))) for r in map(json.loads, path.read_text().splitlines())]


@pytest.mark.slow
def test_two_rank_ddp_identical_adapters_and_exact_resume_after_kill(tiny_model_dir, tmp_path):
    steps = 8
    spec = make_run(tmp_path, tiny_model_dir, "ddp-run", steps=steps, save_every=2)
    finish(torchrun(spec, tmp_path / "work-a"))
    store = tmp_path / "store" / "ddp-run" / "gen-0" / "train"
    ref = train_losses(store / "log.jsonl")
    local = local_work(tmp_path / "work-a", "ddp-run") / "gen-0" / "train"
    for n in (2, 4, 6, 8):
        meta = read_checkpoint(local / f"step-{n}")
        jsonschema.validate(meta, SCHEMA)
        digests = meta["adapter_sha256_by_rank"]
        assert len(digests) == 2 and digests[0] == digests[1]  # both ranks hold the same adapter
    manifest = json.loads((store / "_manifest.json").read_text())
    assert manifest["extra"]["checkpoints"] == [2, 4, 6, 8] and manifest["extra"]["world_size"] == 2
    log = [json.loads(x) for x in (store / "log.jsonl").read_text().splitlines()]
    train_tokens = [r["tokens"] for r in log if r["kind"] == "train"]
    assert manifest["extra"]["processed_supervised_tokens"] == sum(train_tokens)

    # select + merge over the same store, through the CLI entries
    from mass_jobs.commands.cli import main as mass

    assert mass(["select", "--spec", str(spec), "--gen", "0"]) == 0
    chosen = json.loads((store.parent / "select.json").read_text())
    vals = {r["step"]: r["val_loss"] for r in log if r["kind"] == "val" and r["step"] in (2, 4, 6, 8)}
    assert chosen["step"] == min(vals, key=lambda s: (vals[s], s))
    assert chosen["processed_supervised_tokens"] == sum(train_tokens[: chosen["step"]])
    assert chosen["processed_supervised_tokens_total"] == sum(train_tokens)
    assert mass(["merge", "--spec", str(spec), "--gen", "0", "--work-dir", str(tmp_path / "work-a")]) == 0
    from transformers import AutoModelForCausalLM

    next_gen = tmp_path / "store" / "ddp-run" / "gen-1" / "model"  # plain objects: a loadable model dir
    assert AutoModelForCausalLM.from_pretrained(next_gen).config.num_hidden_layers == 2

    # Same run, killed (SIGKILL to torchrun and both workers) once a checkpoint reached the store.
    spec_b = make_run(tmp_path / "b", tiny_model_dir, "ddp-run", steps=steps, save_every=2)
    store_b = tmp_path / "b" / "store" / "ddp-run" / "gen-0" / "train"
    proc = torchrun(spec_b, tmp_path / "work-b")
    deadline = time.time() + 240
    while not (store_b / "step-2").exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (store_b / "_manifest.json").exists()  # it really died before finishing
    killed_at = max(int(p.name[5:]) for p in store_b.glob("step-*"))
    assert killed_at < steps
    out = finish(torchrun(spec_b, tmp_path / "work-b", "--resume"))
    resumed = train_losses(store_b / "log.jsonl")
    assert [s for s, _ in resumed] == [s for s, _ in ref]
    assert [v for _, v in resumed] == pytest.approx([v for _, v in ref], rel=1e-6, abs=1e-7)
    assert "trained 8 steps" in out


def test_fsdp_precision_matches_the_ddp_path():
    from mass_jobs.training.dist import fsdp_mixed_precision

    gpu = fsdp_mixed_precision(torch.device("cuda", 0))  # a policy object only: no GPU needed to build it
    assert (gpu.param_dtype, gpu.reduce_dtype) == (torch.bfloat16, torch.float32)  # autocast bf16, fp32 grads
    cpu = fsdp_mixed_precision(torch.device("cpu"))
    assert (cpu.param_dtype, cpu.reduce_dtype) == (None, None)  # CPU keeps the fp32 parameters as they are


@pytest.mark.slow
def test_two_rank_fsdp_trains_like_ddp_saves_a_full_adapter_and_resumes(tiny_model_dir, tmp_path):
    from peft import get_peft_model_state_dict
    from safetensors.torch import load_file

    from mass_jobs.commands.cli import main as mass
    from mass_jobs.spec.load import load_spec
    from mass_jobs.steps.merge import merge_lora

    # Same windows, seed and sampler for both; activation checkpointing and 2 micro-steps on; 3 val
    # windows, so FSDP's validation has one rank short of a window (it must still join every gather).
    run = dict(steps=4, save_every=2, n_val=3, grad_accum=2, gradient_checkpointing=True)
    trained = {}
    for par in ("ddp", "fsdp"):
        spec = make_run(tmp_path / par, tiny_model_dir, "run", **run)
        finish(torchrun(spec, tmp_path / par / "work", "--set", f"sft.parallel={par}"))
        trained[par] = tmp_path / par / "store" / "run" / "gen-0" / "train"
    logs = {par: train_losses(d / "log.jsonl") for par, d in trained.items()}
    share = {par: json.loads((d / "_manifest.json").read_text())["extra"]["param_share"] for par, d in trained.items()}
    assert share["ddp"] == 1.0 and share["fsdp"] == pytest.approx(0.5, abs=0.01)  # FSDP really sharded the model
    diffs = [abs(a - b) for (_, a), (_, b) in zip(logs["ddp"], logs["fsdp"])]
    print(f"fsdp vs ddp: max |loss diff| {max(diffs):.3e} over {len(diffs)} train+val losses")
    # (2) the same math, sharded: per-step train and val losses equal DDP's. With 2 ranks they agree
    # to the bit: each rank runs the full gathered weights, and a reduce-scatter adds the same two
    # gradients an all-reduce adds, halved exactly; only the clip norm is summed in another order.
    assert [s for s, _ in logs["fsdp"]] == [s for s, _ in logs["ddp"]] == [0, 1, 2, 2, 3, 4, 4]
    assert all(finite(v) for _, v in logs["fsdp"])
    assert max(diffs) <= 1e-6

    # (3) a full (unsharded) peft adapter, the same tensors as DDP's, equal on both ranks
    local = {par: local_work(tmp_path / par / "work", "run") / "gen-0" / "train" for par in trained}
    meta = read_checkpoint(local["fsdp"] / "step-4")
    jsonschema.validate(meta, SCHEMA)
    assert meta["parallel"] == "fsdp" and len(set(meta["adapter_sha256_by_rank"])) == 1
    adapters = {par: load_file(local[par] / "step-4" / "adapter_model.safetensors") for par in local}
    assert adapters["fsdp"].keys() == adapters["ddp"].keys() and len(adapters["fsdp"]) == 2 * 2 * 2
    for k, t in adapters["fsdp"].items():
        assert t.shape == adapters["ddp"][k].shape
        assert torch.allclose(t, adapters["ddp"][k], rtol=1e-4, atol=1e-6), k
    # (1) every LoRA tensor moved from its initial value (the same init the ranks start from)
    init = Trainer(
        tiny_model_dir,
        synthetic_windows(8, 0),
        [],
        load_spec(tmp_path / "fsdp" / "run.yaml").sft,
        tmp_path / "init",
        progress=False,
    )
    init.setup()
    start = get_peft_model_state_dict(init.peft_model, save_embedding_layers=False)
    assert start.keys() == adapters["fsdp"].keys()
    assert [k for k, t in start.items() if torch.equal(t, adapters["fsdp"][k])] == []
    # full AdamW state keyed by parameter name, the same moments as DDP's (keyed by position)
    opt = {par: torch.load(local[par] / "step-4" / "optimizer.pt", weights_only=False) for par in local}
    names, ids = opt["fsdp"]["param_groups"][0]["params"], opt["ddp"]["param_groups"][0]["params"]
    assert len(names) == len(ids) == len(start) and all(".lora_" in n for n in names)
    for name, i in zip(names, ids):
        for moment in ("exp_avg", "exp_avg_sq"):
            a, b = opt["fsdp"]["state"][name][moment], opt["ddp"]["state"][i][moment]
            assert a.shape == b.shape and torch.allclose(a, b, rtol=1e-3, atol=1e-9), (name, moment)

    # select and merge read the FSDP checkpoint exactly as DDP's: same chosen step, same merged weights
    spec = tmp_path / "fsdp" / "run.yaml"
    assert mass(["select", "--spec", str(spec), "--gen", "0"]) == 0
    chosen = json.loads((trained["fsdp"].parent / "select.json").read_text())
    assert mass(["merge", "--spec", str(spec), "--gen", "0", "--work-dir", str(tmp_path / "fsdp" / "work")]) == 0
    merged = load_file(tmp_path / "fsdp" / "store" / "run" / "gen-1" / "model" / "model.safetensors")
    merge_lora(tiny_model_dir, local["ddp"] / f"step-{chosen['step']}", tmp_path / "ddp-merged")
    ddp_merged = load_file(tmp_path / "ddp-merged" / "model.safetensors")
    assert merged.keys() == ddp_merged.keys()
    assert max(float((merged[k] - ddp_merged[k]).abs().max()) for k in merged) < 1e-5

    # --resume from the stored FSDP step-2 checkpoint (a fresh pod: empty work dir) logs the same losses
    spec_r = make_run(tmp_path / "resume", tiny_model_dir, "run", **run)
    stored_r = tmp_path / "resume" / "store" / "run" / "gen-0" / "train"
    stored_r.mkdir(parents=True)
    for name in ("step-2", "log.jsonl"):
        (stored_r / name).write_bytes((trained["fsdp"] / name).read_bytes())
    out = finish(torchrun(spec_r, tmp_path / "resume" / "work", "--set", "sft.parallel=fsdp", "--resume"))
    resumed = train_losses(stored_r / "log.jsonl")
    assert [s for s, _ in resumed] == [s for s, _ in logs["fsdp"]]
    assert [v for _, v in resumed] == pytest.approx([v for _, v in logs["fsdp"]], rel=1e-6, abs=1e-7)
    assert (
        read_checkpoint(local_work(tmp_path / "resume" / "work", "run") / "gen-0" / "train" / "step-4")[
            "adapter_sha256_by_rank"
        ]
        == meta["adapter_sha256_by_rank"]
    )
    assert "trained 4 steps" in out


def test_sft_parallel_comes_from_the_spec_and_enters_the_train_hash_only_when_not_ddp(tiny_model_dir, tmp_path):
    """`mass run` and the PyTorchJob run `mass train SPEC --gen G [--resume]`: the mode is the spec's,
    and a command-line change goes through the spec (`--set`), never a flag of train's own."""
    import mass_jobs.steps.train as train_step
    from mass_jobs.commands.cli import build_parser
    from mass_jobs.spec.load import load_spec
    from mass_jobs.spec.overrides import SpecSource

    assert "parallel" not in train_step.training_settings(SftSpec())  # DDP runs keep their hashes
    assert train_step.training_settings(SftSpec(parallel="fsdp"))["parallel"] == "fsdp"
    with pytest.raises(SystemExit):
        build_parser("train").parse_args(["train", "--spec", "s.yaml", "--gen", "0", "--parallel", "ddp"])
    spec_file = make_run(tmp_path, tiny_model_dir, "run", steps=2, save_every=2)
    plain = load_spec(spec_file)
    fsdp = load_spec(SpecSource(str(spec_file), sets=["sft.parallel=fsdp"]))
    assert plain.sft.parallel == "ddp" and fsdp.sft.parallel == "fsdp"
    assert train_step.training_settings(fsdp.sft) != train_step.training_settings(plain.sft)  # the hash sees it


def test_a_deleted_store_run_again_trains_and_selects_with_the_same_or_another_spec(tiny_model_dir, tmp_path):
    """The local work dir is keyed by run and store: another spec under the same name never resumes
    the first one's checkpoints; the same spec again stores the checkpoints it finds finished
    locally instead of recording none. Both then select a checkpoint (`mass run` passes --resume)."""
    import shutil

    from mass_jobs.commands.cli import main as mass

    work = tmp_path / "work"
    chosen = {}
    for label, lr in (("first", 2e-3), ("same spec again", 2e-3), ("another spec", 5e-3)):
        shutil.rmtree(tmp_path / "store", ignore_errors=True)  # "an empty store", as the refusal advises
        spec = make_run(
            tmp_path, tiny_model_dir, "again", steps=4, save_every=2, optimizer={"lr": lr, "warmup_steps": 1}
        )
        assert mass(["train", "--spec", str(spec), "--gen", "0", "--work-dir", str(work), "--quiet", "--resume"]) == 0
        manifest = json.loads((tmp_path / "store" / "again" / "gen-0" / "train" / "_manifest.json").read_text())
        assert manifest["extra"]["checkpoints"] == [2, 4], label
        assert mass(["select", "--spec", str(spec), "--gen", "0"]) == 0, label
        chosen[label] = json.loads((tmp_path / "store" / "again" / "gen-0" / "select.json").read_text())
    assert len(list(work.glob("again-*"))) == 2  # one scratch per distinct spec
    assert chosen["same spec again"] == chosen["first"]
    log = train_losses(tmp_path / "store" / "again" / "gen-0" / "train" / "log.jsonl")
    assert len(log) == 4 + 2 + 1 and log[0][0] == 0  # trained from step 0, not resumed from the first spec's


def test_a_train_step_that_stored_no_checkpoint_is_not_done(tiny_model_dir, tmp_path, monkeypatch):
    import mass_jobs.steps.train as train_step
    from mass_jobs.commands.cli import main as mass

    spec = make_run(tmp_path, tiny_model_dir, "none", steps=2, save_every=2)
    monkeypatch.setattr(train_step, "stored_steps", lambda ctx, gen: [])  # as if every upload was lost
    monkeypatch.setattr(train_step, "_upload_local_checkpoints", lambda *a: None)
    assert mass(["train", "--spec", str(spec), "--gen", "0", "--work-dir", str(tmp_path / "w"), "--quiet"]) == 1
    assert not (tmp_path / "store" / "none" / "gen-0" / "train" / "_manifest.json").exists()


# ---------------------------------------------------------------- golden numbers
# Losses of the tiny model (tests/conftest.py's tiny_model_dir: fixed seed, the paper's architecture in
# small) trained for 6 steps on fixed patterned windows, recorded from this trainer at torch 2.13 on
# CPU. The equivalence tests above compare two of this project's paths with each other; these pin
# the numbers themselves, so a drift both paths share (the loss's masking or normalisation, the LR
# schedule, the LoRA scaling, the sampler) fails here. Tolerance: 1e-3 relative, far above the float
# noise between CPUs and far below what any such change moves.
GOLDEN_TRAIN = [(1, 8.768654), (2, 8.424189), (3, 8.075231), (4, 7.930012), (5, 7.861781), (6, 7.825335)]
GOLDEN_VAL = [(0, 8.768654), (3, 7.930012), (6, 7.798321)]


def patterned_windows(n: int, seed: int, length: int = 128) -> list[dict]:
    """Windows that repeat a short token cycle after a masked header: learnable in a few steps, so the
    losses move far more than the tolerance and a changed rule moves them out of it."""
    rng = random.Random(seed)
    cycle = [rng.randrange(20, 5900) for _ in range(5)]
    out = []
    for i in range(n):
        start = rng.randrange(5)
        ids = [cycle[(start + j) % 5] for j in range(length)]
        header = 32
        out.append(
            {
                "task": "ab"[i % 2],
                "role": ("orchestrator", "worker", "auxiliary")[i % 3],
                "input_ids": ids,
                "labels": [-100] * header + ids[header:],
                "n_supervised": length - header,
            }
        )
    return out


def golden_run(model_dir: Path, work: Path, **lora) -> tuple[list, list]:
    sft = small_sft(
        steps=6,
        val_every=3,
        save_every=6,
        optimizer=OptimizerSpec(lr=1e-2, warmup_steps=1),
        lora=LoraSpec(
            **{"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj", "v_proj", "down_proj"], **lora}
        ),
    )
    trainer = Trainer(model_dir, patterned_windows(6, 0), patterned_windows(2, 0), sft, work, progress=False)
    trainer.setup()
    trainer.train()
    log = [json.loads(x) for x in (work / "log.jsonl").read_text().splitlines()]
    return (
        [(r["step"], r["loss"]) for r in log if r["kind"] == "train"],
        [(r["step"], r["val_loss"]) for r in log if r["kind"] == "val"],
    )


def test_tiny_training_reproduces_its_golden_losses(tiny_model_dir, tmp_path):
    losses, vals = golden_run(tiny_model_dir, tmp_path / "run")
    assert [s for s, _ in losses] == [s for s, _ in GOLDEN_TRAIN] and [s for s, _ in vals] == [s for s, _ in GOLDEN_VAL]
    assert [v for _, v in losses] == pytest.approx([v for _, v in GOLDEN_TRAIN], rel=1e-3)
    assert [v for _, v in vals] == pytest.approx([v for _, v in GOLDEN_VAL], rel=1e-3)
    assert vals[-1][1] < 0.9 * vals[0][1]  # it learns: the pinned numbers are not the untrained model's
    # the tolerance catches a change of one rule: LoRA's scaling (alpha/r) halved
    _, halved = golden_run(tiny_model_dir, tmp_path / "halved", alpha=4)
    assert halved[-1][1] != pytest.approx(GOLDEN_VAL[-1][1], rel=1e-3)


@pytest.mark.slow
@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_only_rank_0_reads_the_weights_and_every_rank_holds_them(tiny_model_dir, tmp_path, parallel):
    """A pod of n ranks holds one copy of the model in host memory: rank 0 reads the parent, the others
    build it on the meta device and receive its weights, LoRA init and buffers from rank 0; each then
    holds exactly what one process that read the weights itself holds."""
    from mass_jobs.spec.load import load_spec
    from tests.dist_probe.trainer_setup import digest, state_digest

    spec = make_run(tmp_path, tiny_model_dir, "probe", steps=1, save_every=1)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [
            str(TORCHRUN),
            "--standalone",
            "--nproc_per_node",
            "2",
            str(ROOT / "tests" / "dist_probe" / "trainer_setup.py"),
            str(spec),
            parallel,
            str(tmp_path),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in (0, 1)]
    assert [r["read_weights"] for r in ranks] == [True, False]
    alone = Trainer(
        tiny_model_dir,
        synthetic_windows(1, 0),
        [],
        load_spec(spec).sft,
        tmp_path / "alone",
        parallel=parallel,
        progress=False,
    )
    alone.setup()
    params, buffers = state_digest(alone)
    expected = {"params": params, "buffers": buffers, "head": digest([("head", alone.head_weight)])}
    for rank in ranks:
        assert {k: rank[k] for k in expected} == expected


def test_every_rank_resumes_from_the_newest_stored_checkpoint(tiny_model_dir, tmp_path):
    """Rank 0 saved step-4 locally and was restarted before its upload; the worker holds an older
    copy or none. Both resume from the store's newest (step-2): a local checkpoint the store lacks is
    dropped, an older or missing one is fetched. Ranks on different steps would wait on each other's
    collectives for ever."""
    from mass_jobs.run.context import RunContext
    from mass_jobs.spec.load import load_spec
    from mass_jobs.steps.train import _fetch_inputs
    from mass_jobs.store import open_store

    spec = load_spec(make_run(tmp_path, tiny_model_dir, "resume", steps=4, save_every=2))
    ctx = RunContext(spec, open_store(spec.store))

    def checkpoint(root: Path, step: int) -> Path:
        (root / f"step-{step}").mkdir(parents=True)
        (root / f"step-{step}" / MANIFEST).write_text(json.dumps({"step": step}))
        return root / f"step-{step}"

    ctx.store.put_dir(ctx.checkpoint(0, 2), checkpoint(tmp_path / "stored", 2))
    master, worker, fresh = tmp_path / "master", tmp_path / "worker", tmp_path / "fresh"
    checkpoint(master / "train", 2), checkpoint(master / "train", 4)
    checkpoint(worker / "train", 0)
    for work in (master, worker, fresh):
        _fetch_inputs(ctx, 0, work, resume=True)
        assert sorted(p.name for p in (work / "train").glob("step-*") if p.name != "step-0") == ["step-2"]
        assert latest_checkpoint(work / "train").name == "step-2"
