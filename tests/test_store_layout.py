"""RunContext is the only place that spells store keys: the step modules it owns ask its methods and
never join a key from a context value and a literal path piece themselves."""

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit  # no process, no server, no sandbox (tests/fixtures/unit.py)

ROOT = Path(__file__).resolve().parents[1] / "mass_jobs"
# every module but the owner itself
MODULES = sorted(
    str(p.relative_to(ROOT)) for p in ROOT.rglob("*.py") if p.relative_to(ROOT).as_posix() != "run/context.py"
)
# an s3:// URI built from a key, or a key quoted in an error message, is not a key being spelled
NOT_A_KEY = re.compile(r"s3://|raise \w+\(")
# an f-string that starts from a context key or the run name and appends a path piece
INLINE_KEY = re.compile(r"""f["'][^"']*\{(ctx|self\.ctx)\.[a-z_]+(\([^)]*\))?\}/|\{ctx\.run\}""")
# a layout piece (gen-<g>/, rep-<r>/, ...) or a passed-in prefix joined to a path: a key spelled
# from values outside the context (a verdict pair, a verdict under a prefix)
LAYOUT_PIECE = re.compile(r"""f["'][^"']*((gen|rep|ep|iter|step|seed)-\{[^}]*\}/|\{(prefix|key|root)\}/)""")
# the stores themselves join their own prefix and the key they are given
STORE_OWN = {"store/s3.py", "store/local.py", "store/manifest.py", "store/archive.py", "serving/model_dirs.py"}


def test_no_module_formats_store_keys_inline():
    found = {
        m: [
            n + 1
            for n, line in enumerate((ROOT / m).read_text().splitlines())
            if INLINE_KEY.search(line) and not NOT_A_KEY.search(line)
        ]
        for m in MODULES
    }
    assert {m: lines for m, lines in found.items() if lines} == {}


def test_no_module_joins_layout_pieces_into_keys():
    found = {
        m: [
            n + 1
            for n, line in enumerate((ROOT / m).read_text().splitlines())
            if LAYOUT_PIECE.search(line) and not NOT_A_KEY.search(line)
        ]
        for m in MODULES
        if m not in STORE_OWN
    }
    assert {m: lines for m, lines in found.items() if lines} == {}


def test_the_layout_pattern_catches_keys_spelled_from_other_values():
    # the shapes the verdict keys once had outside the context
    assert LAYOUT_PIECE.search('return f"gen-{self.candidate}-vs-gen-{self.baseline}/{self.task}/rep-{self.replicate}"')
    assert LAYOUT_PIECE.search('return f"{prefix}/{job.name}/{member.kind}-{member.name}-seed-{seed}.json"')
    assert LAYOUT_PIECE.search("f'step-{s}/adapter'")
    assert not LAYOUT_PIECE.search('name=f"eval-rollout gen-{g} {task.id} rep-{rep}"')  # a label, not a key


def test_verdict_keys_are_the_contexts():
    from mass_jobs.judging.judges import PairJob, PanelMember, verdict_key
    from mass_jobs.run.context import RunContext
    from mass_jobs.steps.select_panel import CheckpointPair

    ctx = RunContext.template("run")
    job = PairJob(
        task="t", replicate=1, candidate=2, baseline=0, task_prompt="", candidate_bundle="", baseline_bundle=""
    )
    member = PanelMember(name="j", model="m", seeds=(3,), client=None)
    key = verdict_key(ctx.verdicts(), job, member, 3)
    assert key == "run/eval/verdicts/gen-2-vs-gen-0/t/rep-1/panel-j-seed-3.json"
    assert key.startswith(ctx.eval_verdicts(2))
    pair = CheckpointPair(
        task="t", replicate=0, candidate=40, baseline=1, task_prompt="", candidate_bundle="", baseline_bundle=""
    )
    assert (
        verdict_key(ctx.select_verdicts(1), pair, member, 3)
        == "run/gen-1/select-panel/verdicts/step-40-vs-gen-1/t/rep-0/panel-j-seed-3.json"
    )


def test_the_pattern_catches_inline_keys():
    assert INLINE_KEY.search('key = f"{ctx.sft(g)}/stats.json"')
    assert INLINE_KEY.search('load(store, f"{ctx.run}/eval/verdicts")')
    assert INLINE_KEY.search("f'{self.ctx.train(g)}/log.jsonl'")
    assert not INLINE_KEY.search('key = ctx.sft_file(g, "stats")')


def test_every_module_is_scanned():
    assert {"steps/search.py", "steps/evaluate.py", "steps/collect.py", "pipeline/runner.py", "k8s/argo.py"} <= set(
        MODULES
    )


def test_context_keys_of_the_migrated_layout():
    from mass_jobs.run.context import RunContext

    ctx = RunContext.template("run")
    assert ctx.rank_verdict(0, "t", 3, "ep-1", "ep-2", 0) == "run/gen-0/rank/t/verdicts/0003-ep-1-ep-2-0.json"
    assert ctx.rank_step(1, "t") + ".json" == ctx.rank(1, "t")
    assert ctx.search_file(0, "t", 2, "proposal.json") == "run/gen-0/search/t/iter-2/proposal.json"
    assert ctx.sft_file(0, "stats") == "run/gen-0/sft/stats.json" and ctx.report_file("a.png") == "run/report/a.png"
    assert ctx.eval_rollout_of("run/eval/gen-2/t1/rep-0/audit.json") == (2, "t1")
    assert ctx.eval_rollout_of("run/eval/verdicts/gen-1-vs-gen-0/t1/rep-0/x.json") is None
    assert ctx.verdicts() + "/gen-1-vs-" == ctx.eval_verdicts(1)
    assert RunContext.is_pod_copy("run/gen-0/collect/t/ep-3/output/status.json")
    assert not RunContext.is_pod_copy("run/gen-0/collect/t/ep-3/status.json")
    assert ctx.select_rollout(0, "step-4", "h", 1, "trace.jsonl") == "run/gen-0/select-panel/step-4/h/rep-1/trace.jsonl"
