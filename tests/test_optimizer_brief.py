"""The optimizer's request: the sections the paper's code shows its optimizer, in order, with its
bounds (rationale excerpts, diffs, action items), and the fit to the served context."""

import pytest

from mass_jobs.judging import optimizer_brief as ob
from mass_jobs.judging.evidence import count_tokens


def wf(*workers: str) -> dict:
    agents = [{"id": "orchestrator", "role": "lead", "instruction": "Lead.", "contract": "report"}]
    agents += [{"id": w, "role": w, "instruction": f"Do the {w} part.", "contract": f"{w}.md"} for w in workers]
    return {"agents": agents, "hops": [{"caller": "orchestrator", "callee": w, "returns": f"{w}.md"} for w in workers]}


DESIGNS = {0: wf("coder"), 1: wf("coder", "checker"), 2: wf("coder", "checker", "plotter"), 3: wf("coder", "tester")}


def rows(outcomes):
    return [
        ob.Row(
            k, "the bare reference", o, f"Version {k}: the report is missing results/out.json. Layout is fine.", "gen-0"
        )
        for k, o in enumerate(outcomes)
    ]


def brief(**kw):
    base = dict(
        task="Write the report.",
        current=3,
        designs=DESIGNS,
        rows=rows(["loss", "win", "loss", "loss"]),
        evidence="FILE TREE (representative):\nworkspace/\n  report.md",
        status={"outcome": "success"},
        best=1,
        best_case="best_only_won",
        best_rationale="The reference has the metrics file.",
        champion=1,
    )
    base.update(kw)
    messages, info = ob.build(ob.BriefInput(**base))
    return messages[1]["content"], info


def test_sections_come_in_the_paper_codes_order():
    text, info = brief()
    heads = [
        "1. THE TASK AND ITS WORKFLOWS",
        "TASK:\nWrite the report.",
        "CURRENT WORKFLOW (v3):",
        "PREVIOUS BEST WORKFLOW (v1):",
        "ORIGINAL WORKFLOW (v0",
        "2. EVIDENCE: THE CURRENT VERSION'S WORKSPACE (v3)",
        "2b. EXECUTION METADATA",
        "3. VERDICTS AGAINST THE BARE REFERENCE",
        "3b. RECURRING ISSUES",
        "4. INSTRUCTIONS",
    ]
    at = [text.index(h) for h in heads]
    assert at == sorted(at)
    assert "v1 beat the bare reference and the current v3 did not" in text
    assert "The judge's reasons for the reference's win over v3: The reference has the metrics file." in text
    assert "Record against the bare reference: v0 L . v1 W* . v2 L . v3 L" in text
    assert "Write workflow v4 combining the strengths of the previous best v1 and the current v3." in text
    assert info == {"tokens": count_tokens(ob.SYSTEM) + count_tokens(text), "budget_tokens": None, "cut": []}


def test_best_and_root_are_shown_only_when_they_add_a_design():
    text, _ = brief(best=None, champion=None)
    assert "PREVIOUS BEST" not in text and "ORIGINAL WORKFLOW (v0" in text
    assert "Improve the workflow from v3 to v4" in text and "v1 W*" not in text
    text, _ = brief(best=0, champion=0)
    assert "PREVIOUS BEST WORKFLOW (v0):" in text and "ORIGINAL WORKFLOW" not in text  # not twice
    text, _ = brief(current=0, designs={0: DESIGNS[0]}, rows=rows(["loss"]), best=None, champion=None)
    assert "ORIGINAL WORKFLOW" not in text and "CURRENT WORKFLOW (v0):" in text
    text, _ = brief(best_case="both_won", best_rationale="v1 had the plots.")
    assert "Both v1 and the current v3 beat the bare reference" in text and "v1 had the plots." in text


def test_history_carries_rationale_action_items_and_bounded_diffs():
    long_rows = [
        ob.Row(k, "the bare reference", "loss", "x " * 3000 + ". The metrics are inconsistent with the report.")
        for k in range(4)
    ]
    designs = {
        k: {
            "agents": [{"id": "orchestrator", "role": "lead", "instruction": f"{k}-" + "i" * 3000, "contract": "c"}],
            "hops": [],
        }
        for k in range(4)
    }
    text, _ = brief(rows=long_rows, designs=designs, best=None, champion=None)
    excerpts = [line.split(": ", 1)[1] for line in text.splitlines() if line.startswith("  - Rationale (excerpt): ")]
    assert len(excerpts) == 4 and all(len(e) <= ob.RATIONALE_CHARS and e.endswith("...") for e in excerpts)
    diffs = {}
    for k in (1, 2, 3):
        block = text.split(f"- v{k} against the bare reference: loss")[1].split("  - Keep what won")[0]
        diffs[k] = block.split("('-' removed, '+' added):\n", 1)[1]
        assert "\n    --- v" in "\n" + diffs[k] or diffs[k].startswith("    --- v")
    # three recent entries get the full diff bound; v1 is the fourth most recent only with v0..v3 and 3 diffs
    assert all(len(d) <= ob.DIFF_RECENT_CHARS + 200 for d in diffs.values())
    items = ob.action_items("All good. The plot is missing. Results fail to load! Nice layout. Values are NaN.")
    assert items == ["The plot is missing.", "Results fail to load!", "Values are NaN."]


def test_older_diffs_get_the_short_bound():
    designs = {
        k: {
            "agents": [{"id": "orchestrator", "role": "lead", "instruction": f"{k}" * 4000, "contract": "c"}],
            "hops": [],
        }
        for k in range(6)
    }
    text, _ = brief(current=5, designs=designs, rows=rows(["loss"] * 6), best=None, champion=None)

    def diff_of(k):
        block = text.split(f"- v{k} against the bare reference: loss")[1].split("  - Keep what won")[0]
        return block.split("('-' removed, '+' added):\n", 1)[1]

    assert all(len(diff_of(k)) > ob.DIFF_OLD_CHARS + 50 for k in (3, 4, 5))
    assert all(len(diff_of(k)) <= ob.DIFF_OLD_CHARS + 50 for k in (1, 2))


def test_recurring_issues_are_counted_over_rationales():
    text = ob.recurring_issues(
        [
            "The report is inconsistent with metrics.json.",
            "metrics.json is missing.",
            "Numbers mismatch; the test is missing.",
            "Fine.",
        ]
    )
    assert "- [2x] report and metrics disagree: e.g. The report is inconsistent with metrics.json." in text
    assert "- [2x] missing deliverables or sections" in text and "- [1x] validation or test weakness" in text
    assert ob.recurring_issues(["Fine."]) == "- No issue recurs in the verdicts yet."


def test_failure_metadata_and_notices():
    calls = [{"agent": "worker-1", "tool": "shell", "args": '{"command": "python train.py"}'}]
    text, _ = brief(
        status={"outcome": "timeout", "reason": "wall_s reached", "timings": {"wall_s": 12.5}},
        last_calls=calls,
        prior_failures=[{"version": 2, "outcome": "failed", "reason": "worker crashed"}],
    )
    assert '"last_tool_calls_most_recent_first": [' in text and "python train.py" in text
    assert "FAILURE NOTICE" in text and "RECURRING FAILURE" in text and "RESOLVED" not in text
    assert 'wall_s": 12.5' not in text  # wall time differs between executors and reruns: never in the request
    text, _ = brief(prior_failures=[{"version": 2, "outcome": "failed", "reason": "worker crashed"}])
    assert "RESOLVED FAILURES" in text and "FAILURE NOTICE" not in text
    text, _ = brief()
    assert "FAILURE" not in text


def test_the_request_is_fitted_to_the_served_context():
    evidence, results = "E-head " + "e" * 200_000 + " E-tail", "R-head " + "r" * 400_000 + " R-tail"
    fixed = count_tokens(ob.SYSTEM) + count_tokens(brief(evidence="", results="")[0])
    # results cut first
    text, info = brief(evidence=evidence, results=results)
    assert info["cut"] == [] and "R-tail" in text
    budget = fixed + count_tokens(evidence) + 20_000
    text, info = brief(evidence=evidence, results=results)
    messages, info = ob.build(
        ob.BriefInput(
            task="Write the report.",
            current=3,
            designs=DESIGNS,
            rows=rows(["loss", "win", "loss", "loss"]),
            evidence=evidence,
            results=results,
            status={"outcome": "success"},
        ),
        budget,
    )
    assert info["cut"] == ["results"] and info["tokens"] <= budget
    assert "E-tail" in messages[1]["content"] and "results appendix cut to fit" in messages[1]["content"]
    # then the workspace view
    messages, info = ob.build(
        ob.BriefInput(
            task="Write the report.", current=3, designs=DESIGNS, rows=[], evidence=evidence, results=results
        ),
        fixed + 5_000,
    )
    assert info["cut"] == ["results", "evidence"] and info["tokens"] <= fixed + 5_000 + 8
    assert "R-head" not in messages[1]["content"] and "E-head" in messages[1]["content"]
    with pytest.raises(ob.BriefTooLong, match="model.sampling.context_length"):
        ob.build(ob.BriefInput(task="t" * 100_000, current=0, designs={0: DESIGNS[0]}, rows=[], evidence="e"), 10_000)


def test_last_tool_calls_read_only_the_end_of_a_long_trace(store, monkeypatch):
    """The failure metadata's calls come from the trace's tail, most recent first, on file and S3 stores."""
    import json

    from mass_jobs.episodes import trace_shape

    def record(i, calls):
        msg = {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": f"c{i}-{j}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
                for j, (name, args) in enumerate(calls)
            ],
        }
        return {
            "seq": i,
            "agent": {"id": f"worker-{i % 2}"},
            "request": {"messages": [{"role": "user", "content": "x" * 5000}]},
            "response": {"message": msg},
        }

    lines = [record(i, [("shell", {"command": f"step {i}"})]) for i in range(400)]
    lines.append(record(400, [("read_file", {"path": "a" * 500}), ("shell", {"command": "last"})]))
    store.put_bytes("p/trace.jsonl", ("\n".join(json.dumps(r) for r in lines) + "\n").encode())
    monkeypatch.setattr(trace_shape, "TRACE_TAIL", 64 << 10)  # ~12 records of the 401
    tail = trace_shape.tail_lines(store, "p/trace.jsonl")
    assert 0 < len(tail.encode()) <= 64 << 10 and tail.startswith('{"seq": ') and tail.count("\n") < 15
    calls = trace_shape.last_tool_calls(store, "p/trace.jsonl")
    assert [c["args"] for c in calls[:2]] == ['{"command": "last"}', json.dumps({"path": "a" * 500})[:200]]
    assert [c["tool"] for c in calls] == ["shell", "read_file", "shell", "shell", "shell"]
    assert calls[2]["args"] == '{"command": "step 399"}' and calls[2]["agent"] == "worker-1"
    assert trace_shape.last_tool_calls(store, "none/trace.jsonl") == []
