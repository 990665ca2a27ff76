"""examples/paper-mini.yaml: the paper's configuration at toy size, end to end.

Fast: the spec differs from examples/paper.yaml exactly where its header says. Slow: `mass-run` of
it under the Argo test executor against moto's S3 server (qwen-code in agent pods, the tiny model in
the paper's checkpoint layout with its family's template, FSDP over two trainer replicas as a
PyTorchJob, FP8 export in its reference's layout, two scripted judges, L0 -> L1), and `mass run
--until 0:render` of the same spec locally: both store the same training data, manifest by manifest
(every qwen-code episode, verdict, rank and window), and the executor's report shows what the paper's
configuration must: orchestrator windows, no harness side-call windows, no workflow text in any
window, and how episodes ended, by outcome and cap. (Training, merging and evaluating alike on both
executors is the two-generation comparison's, tests/test_argo_exec.py: here the local run stopping
at the data halves the test's 28k-token model calls and trainer steps.)
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
PAPER, MINI = REPO / "examples" / "paper.yaml", REPO / "examples" / "paper-mini.yaml"


def leaves(node, path="$"):
    """(path, value) of every leaf; list items as [i]."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield from leaves(v, f"{path}.{k}")
    elif isinstance(node, list) and node and all(isinstance(x, dict) for x in node):
        for i, v in enumerate(node):
            yield from leaves(v, f"{path}[{i}]")
    else:
        yield path, node


def declared_differences(text: str) -> list[str]:
    """The header's `#   $.a.b / c / $.d` entries as path patterns (`*` any key or index)."""
    out = []
    for line in text.splitlines():
        m = re.match(r"#\s+(\$\.\S+(?: / \S+)*)\s", line + " ")
        if not m:
            continue
        first, *more = m.group(1).split(" / ")
        out.append(first)
        parent = first.rsplit(".", 1)[0]
        out += [x if x.startswith("$.") else f"{parent}.{x}" for x in more]
    return out


def covers(pattern: str, path: str) -> bool:
    rx = re.escape(pattern).replace(r"\[\*\]", r"\[\d+\]").replace(r"\*", r"[^.\[]+")
    return re.fullmatch(rx + r"(?:[.\[].*)?", path) is not None


def test_paper_mini_differs_from_the_paper_exactly_where_its_header_says():
    paper, mini = (dict(leaves(yaml.safe_load(p.read_text()))) for p in (PAPER, MINI))
    differing = sorted(p for p in set(paper) | set(mini) if paper.get(p, "<absent>") != mini.get(p, "<absent>"))
    declared = declared_differences(MINI.read_text())
    assert len(declared) > 20
    undeclared = [p for p in differing if not any(covers(d, p) for d in declared)]
    assert not undeclared, f"paper-mini differs from paper.yaml at undeclared fields: {undeclared}"
    unused = [d for d in declared if not any(covers(d, p) for p in differing)]
    assert not unused, f"the header declares differences that are not there: {unused}"
    # the paper's configuration itself is kept
    for path in (
        "$.execution.harness",
        "$.sft.parallel",
        "$.sft.fp8_export",
        "$.sft.orchestrator_share",
        "$.generations",
        "$.ranking.pairing",
        "$.sft.optimizer.lr",
        "$.model.sampling.temperature",
    ):
        assert mini[path] == paper[path], path
    assert [j for j in paper if j.startswith("$.judges[") and j.endswith(".name")] == [
        j for j in mini if j.startswith("$.judges[") and j.endswith(".name")
    ]
    assert mini["$.sft.replicas"] == 2


def test_the_hybrid_tiny_model_is_the_qwen35_text_layout_with_a_thinking_template(tmp_path):
    from mass_jobs.commands.cli import main

    assert main(["model", "tiny", "--hybrid", "--out", str(tmp_path / "m")]) == 0
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    assert config["architectures"] == ["Qwen3_5ForCausalLM"]
    assert config["layer_types"].count("linear_attention") == 3 and config["layer_types"][-1] == "full_attention"
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tmp_path / "m")
    chat = [
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "a1", "reasoning_content": "r1"},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "a2", "reasoning_content": "r2"},
    ]
    text = tok.apply_chat_template(chat, tokenize=False)
    assert "r1" not in text and "<think>\nr2\n</think>" in text  # earlier turns' reasoning dropped
    assert main(["model", "tiny", "--hybrid", "--warm", "--out", str(tmp_path / "w")]) == 2


# ---------------------------------------------------------------- end to end


def mini_doc(model: str, store: dict, judges: list[str], mode: str = "local", fp8_reference: str | None = None) -> dict:
    """examples/paper-mini.yaml with the model, store and judges of this test, for one generation:
    L0 -> L1 (trained, merged, FP8-exported, served and judged) shows every path of the paper's
    configuration; chaining generations is the two-generation executor comparison's
    (tests/test_argo_exec.py), and a second cycle here doubled the suite's longest test."""
    doc = yaml.safe_load(MINI.read_text())
    doc["generations"] = 1
    # one train task (primes: its guard protects a seeded file) and the test task, two teacher
    # episodes each: every path still runs, at half the 28k-token model calls of the example
    doc["tasks"] = [t for t in doc["tasks"] if t["id"] != "fib"]
    doc["collection"]["episodes"] = 2
    # one FSDP step (its validation and checkpoint included): the example's second 28k-token step and
    # its validation cost each of the two runs about 35 s; choosing among checkpoints by validation
    # loss is tests/test_train.py's
    doc["sft"]["steps"] = 1
    doc["model"]["base"] = model
    doc["sft"]["fp8_reference"] = doc["model"]["serve"] = fp8_reference
    doc["store"] = store
    doc["execution"]["mode"] = mode
    for judge, url in zip(doc["judges"], judges, strict=True):
        judge["endpoint"] = url
    return doc


def window_texts(store, ctx, gen: int, tokenizer) -> list[tuple[str, str, str]]:
    """(role, decoded text, decoded supervised text) of every stored window of generation `gen`."""
    from mass_jobs.steps.sft_tokens import IGNORE

    out = []
    for split in ("train", "val"):
        for line in store.get_bytes(ctx.sft_file(gen, split)).decode().splitlines():
            if line.strip():
                w = json.loads(line)
                out.append(
                    (
                        w["role"],
                        tokenizer.decode(w["input_ids"]),
                        tokenizer.decode([x for x in w["labels"] if x != IGNORE]),
                    )
                )
    return out


def only_harness_text(supervised: str) -> bool:
    """A window whose supervised text is only qwen-code's canned replies: boilerplate, not the model's."""
    from tests.fixtures.scripted import HARNESS_TEXT

    for canned in HARNESS_TEXT:
        supervised = supervised.replace(canned, "")
    return not supervised.replace("<|im_end|>", "").strip()


def teacher_texts(store, ctx, gen: int) -> set[str]:
    """The workflow and directive text of every teacher episode of generation `gen`."""
    texts = set()
    for key in store.list(ctx.collect_root(gen) + "/"):
        if key.endswith("/episode.json") and "/input/" not in key:
            parts = store.get_json(key)["prompt_parts"]
            texts |= {parts[k].strip() for k in ("workflow", "directive") if (parts.get(k) or "").strip()}
    return texts


def figures(store, ctx, spec, tokenizer) -> dict:
    """What the test prints and checks, per generation, from the stored run."""
    from mass_jobs.episodes.harness import episode_cap

    report = store.get_json(ctx.report_file("report.json"))
    out = {}
    for g in range(spec.generations):
        stats = store.get_json(ctx.sft_file(g, "stats"))
        windows = window_texts(store, ctx, g, tokenizer)
        teacher = teacher_texts(store, ctx, g)
        statuses = [
            store.get_json(k)
            for k in store.list(ctx.collect_root(g) + "/")
            if k.endswith("/status.json") and "/output/" not in k
        ]
        training = next(t for t in report["training"] if t["generation"] == g)
        train_manifest = store.get_json(f"{ctx.train(g)}/_manifest.json")
        out[g] = {
            "windows_by_role": stats["train"]["windows_by_role"],
            "supervised_tokens_by_role": stats["train"]["supervised_tokens_by_role"],
            "teacher_episodes_by_outcome": dict(sorted(Counter(s["outcome"] for s in statuses).items())),
            "teacher_episodes_by_cap": dict(sorted(Counter(str(episode_cap(s)) for s in statuses).items())),
            "train_steps": train_manifest["extra"]["steps"],
            "world_size": train_manifest["extra"]["world_size"],
            "parallel": train_manifest["extra"]["parallel"],
            "selected_step": training["selected_step"],
            "windows_with_teacher_text": sum(1 for _, text, _ in windows for t in teacher if t in text),
            "boilerplate_windows": sum(only_harness_text(sup) for _, _, sup in windows),
            "teacher_texts": len(teacher),
            "windows": len(windows),
        }
    out["outcomes"] = report["outcomes"]
    return out


def check_figures(fig: dict, spec) -> None:
    for g in range(spec.generations):
        f = fig[g]
        assert f["windows_by_role"]["orchestrator"] > 0, f  # the orchestrator is trained, workflow stripped
        assert f["windows_by_role"]["auxiliary"] == 0, f  # no harness side call became a window
        assert f["boilerplate_windows"] == 0, f  # nor a window of qwen-code's canned replies
        assert f["teacher_texts"] > 0 and f["windows_with_teacher_text"] == 0, f
        assert f["world_size"] == spec.sft.replicas == 2 and f["parallel"] == "fsdp", f
        assert f["train_steps"] == spec.sft.steps and f["selected_step"] in range(1, spec.sft.steps + 1), f
        train_tasks = sum(t.split == "train" for t in spec.resolved_tasks())
        assert sum(f["teacher_episodes_by_outcome"].values()) == train_tasks * spec.collection.episodes, f
    from mass_jobs.episodes.harness import CAPS

    for row in fig["outcomes"]:  # every stage of every generation counts episodes by each cap
        assert set(row["by_cap"]) == set(CAPS) and sum(row["by_cap"].values()) <= row["episodes"], row


@pytest.mark.slow(cost=500)
@pytest.mark.argo_exec
def test_paper_mini_locally_and_under_the_executor_store_the_same_run(s3_env, paper_layout_dirs, tmp_path):
    from mass_jobs.config.run_spec import RunSpec, StoreSpec
    from mass_jobs.run.context import RunContext
    from mass_jobs.store import open_store
    from mass_jobs.tools.testing.scripted_judges import HashVerdictJudge
    from tests.fixtures.argo_cluster import (
        S3_SECRET,
        LocalRun,
        archive_difference,
        cluster_docs,
        manifests,
        put_spec,
        timeless,
        upload_dir,
    )
    from tests.fixtures.argo_exec import ArgoExecutor

    s3 = s3_env
    model_uri = upload_dir(s3, paper_layout_dirs[0], "models/tiny-paper")
    reference_uri = upload_dir(s3, paper_layout_dirs[1], "models/tiny-paper-fp8")

    def store(prefix: str) -> dict:
        return {"uri": f"s3://{s3['bucket']}/{prefix}", "endpoint_url": s3["endpoint_url"], "region": s3["region"]}

    with HashVerdictJudge() as judge_a, HashVerdictJudge() as judge_b:
        judges = [judge_a.base_url, judge_b.base_url]
        argo_doc = mini_doc(model_uri, store("paper-mini-argo"), judges, mode="argo", fp8_reference=reference_uri)
        local_doc = mini_doc(model_uri, store("paper-mini-local"), judges, fp8_reference=reference_uri)
        secrets = {S3_SECRET: {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}}
        # the chart serves the model with its XML tool-call parser, as the spec asks (paper-values.yaml)
        ex = ArgoExecutor(cluster_docs(s3, {"model": {"toolCallParser": "qwen3_coder"}}), secrets, tmp_path / "cluster")
        try:
            wf = ex.submit(
                "mass-run", {"spec": put_spec(s3, argo_doc, "specs/paper-mini.yaml"), "run": argo_doc["name"]}
            )
            assert wf.phase == "Succeeded", wf.summary()
            assert [e for e in ex.cluster.events if "PyTorchJob" in e] == [
                f"create PyTorchJob/mass-paper-mini-g{g}-train" for g in range(argo_doc["generations"])
            ]
        finally:
            ex.close()
        # after the executor's run (same judges: their endpoints are part of the spec both runs hash):
        # side by side, their 28k-token requests on two cores made each several times slower
        asked = [len(j.asked) for j in (judge_a, judge_b)]
        out = LocalRun(
            local_doc, tmp_path, env={"AWS_ENDPOINT_URL": s3["endpoint_url"]}, args=("--until", "0:render")
        ).wait()
        assert "stopped after L0 render (--until)" in out
        assert [len(j.asked) for j in (judge_a, judge_b)] == asked and all(asked)  # only evaluation asks the panel

    run = argo_doc["name"]
    argo_store, local_store = (open_store(StoreSpec(**d["store"])) for d in (argo_doc, local_doc))
    got, want = manifests(argo_store, run), manifests(local_store, run)
    print(f"paper-mini manifests: {len(want)} local, {len(got)} under the executor")
    # the local run stopped at render: every manifest of the steps up to it (per task, search iteration
    # and episode), nothing after; the executor's run is whole, L0 -> L1
    data = {
        p for p in got if p.split("/")[1:3] in (["gen-0", s] for s in ("search", "collect", "guard", "rank", "sft"))
    }
    assert sorted(want) == sorted(data) and len(want) >= 8 and f"{run}/gen-0/sft" in want
    assert len(got) >= 17 and argo_store.exists(f"{run}/report/report.json")
    differ = [f"{p}: input hash" for p in want if got[p]["input_hash"] != want[p]["input_hash"]]
    for prefix in want:
        for key, digest in want[prefix]["outputs"].items():
            if got[prefix]["outputs"].get(key) != digest and timeless(argo_store, key) != timeless(local_store, key):
                differ.append(f"{key}: content{archive_difference(argo_store, local_store, key)}")
    dump = os.environ.get("PAPER_MINI_DIFF_DIR")
    for line in differ:
        print(f"paper-mini differs: {line}")
        key = line.split(":")[0]
        if dump and line.endswith(": content") and key.endswith(".jsonl"):
            for name, st in (("argo", argo_store), ("local", local_store)):
                (Path(dump) / name / key).parent.mkdir(parents=True, exist_ok=True)
                (Path(dump) / name / key).write_bytes(st.get_bytes(key))
    assert not differ, f"{len(differ)} differences between the executor's and the local run (printed above)"

    from transformers import AutoTokenizer

    spec = RunSpec.model_validate(argo_doc)
    ctx = RunContext(spec, argo_store)
    fig = figures(argo_store, ctx, spec, AutoTokenizer.from_pretrained(paper_layout_dirs[0]))
    for g in range(spec.generations):
        print(f"paper-mini L{g}: {json.dumps(fig[g], sort_keys=True)}")
    for row in fig["outcomes"]:
        print(
            f"paper-mini episodes L{row['generation']} {row['stage']}: {row['episodes']} by outcome "
            f"{ {k: v for k, v in row['by_outcome'].items() if v} } by cap {row['by_cap']}"
        )
    check_figures(fig, spec)
    # L1 as stored: every tensor of L0 (vision tower and MTP weights included), and its FP8 copy in the
    # reference's layout, name by name (dtype and shape)
    from mass_jobs.serving.model_dirs import fetch_stored_model
    from mass_jobs.serving.shards import TensorReader

    l1 = fetch_stored_model(argo_store, ctx.model(1), tmp_path / "l1")
    l1_fp8 = fetch_stored_model(argo_store, ctx.model_fp8(1), tmp_path / "l1-fp8")
    assert TensorReader(l1).meta() == TensorReader(paper_layout_dirs[0]).meta()
    assert TensorReader(l1_fp8).meta() == TensorReader(paper_layout_dirs[1]).meta()
    # what `mass plan` computes for this spec is what the executor's run stored (exact counts; bounds held)
    from mass_jobs.pipeline.planning.counts import compare, plan_counts, stored_counts

    for planned in plan_counts(spec):
        assert compare(planned, stored_counts(RunContext(spec, argo_store), planned["gen"])) == [], planned
        print(f"paper-mini plan = stored, L{planned['gen']}: {json.dumps(planned, sort_keys=True)}")
