"""RunContext is the only place that spells store keys: the step modules it owns ask its methods and
never join a key from a context value and a literal path piece themselves."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "mass_jobs"
# every module but the owner itself
MODULES = sorted(str(p.relative_to(ROOT)) for p in ROOT.rglob("*.py") if p.name != "context.py")
# an s3:// URI built from a key, or a key quoted in an error message, is not a key being spelled
NOT_A_KEY = re.compile(r"s3://|raise \w+\(")
# an f-string that starts from a context key or the run name and appends a path piece
INLINE_KEY = re.compile(r"""f["'][^"']*\{(ctx|self\.ctx)\.[a-z_]+(\([^)]*\))?\}/|\{ctx\.run\}""")


def test_no_module_formats_store_keys_inline():
    found = {m: [n + 1 for n, line in enumerate((ROOT / m).read_text().splitlines())
                 if INLINE_KEY.search(line) and not NOT_A_KEY.search(line)]
             for m in MODULES}
    assert {m: lines for m, lines in found.items() if lines} == {}


def test_the_pattern_catches_inline_keys():
    assert INLINE_KEY.search('key = f"{ctx.sft(g)}/stats.json"')
    assert INLINE_KEY.search('load(store, f"{ctx.run}/eval/verdicts")')
    assert INLINE_KEY.search("f'{self.ctx.train(g)}/log.jsonl'")
    assert not INLINE_KEY.search('key = ctx.sft_file(g, "stats")')


def test_every_module_is_scanned():
    assert {"steps/search.py", "steps/evaluate.py", "steps/collect.py", "runner.py", "k8s/argo.py"} <= set(MODULES)


def test_context_keys_of_the_migrated_layout():
    from mass_jobs.context import RunContext

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
