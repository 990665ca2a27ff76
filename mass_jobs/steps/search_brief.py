"""What the workflow search shows its optimizer: the stored versions, their verdicts and outcomes,
the evidence of the current one, gathered into `judging.optimizer_brief`'s input."""

from __future__ import annotations

from mass_jobs.episodes.trace_shape import last_tool_calls
from mass_jobs.judging import optimizer_brief
from mass_jobs.judging.compare import Verdict, task_views
from mass_jobs.spec.upstream_design import DesignTemplate
from mass_jobs.steps.search_state import IterationRecord, SearchState, won


def stored_json(store, key: str):
    return store.get_json(key) if store.exists(key) else None


def brief_input(s, state: SearchState, history: list[IterationRecord]) -> optimizer_brief.BriefInput:
    """What the optimizer is shown, gathered from the stored search `s` (a `search.Search`)."""
    tried = [r for r in history if r.workflow is not None and r.outcome is not None]
    current = tried[-1]
    designs = {r.k: r.workflow for r in tried}
    against_reference = s.cfg.selection == "champion"
    rows = []
    for r in tried:
        if r.reference_verdict is not None:
            rows.append(_row(r.k, "the bare reference", r.reference_verdict))
        if not against_reference and r.verdict is not None:
            rows.append(_row(r.k, "v" + _other(r.verdict, r.k), r.verdict))
    best, case, why = None, "preferred", ""
    if state.elite != current.k and state.elite in designs and (state.beats_reference or not against_reference):
        best = state.elite
        won_reference = won(current.reference_verdict, current.k)
        if against_reference and not won_reference:
            case, why = "best_only_won", (current.reference_verdict.rationale if current.reference_verdict else "")
        else:
            case, why = (
                ("both_won" if against_reference else "preferred"),
                (current.verdict.rationale if current.verdict else ""),
            )
    status = stored_json(s.store, s.rollout_file(current.k, "status.json"))
    failed = status is not None and status.get("outcome") != "success"
    prior = [
        {
            "version": r.k,
            "outcome": r.outcome,
            "reason": str((stored_json(s.store, s.rollout_file(r.k, "status.json")) or {}).get("reason", ""))[:300],
        }
        for r in tried[:-1]
        if r.outcome != "success"
    ]
    main, results = task_views(s.store, s.iter_dir(current.k), s.spec, s.task, results=True)
    upstream = s.cfg.workflow_format == "upstream"
    template = DesignTemplate.of_task(s.task) if upstream else None
    return optimizer_brief.BriefInput(
        task=template.task_text if template else s.task.prompt,
        current=current.k,
        designs=designs,
        rows=rows,
        evidence=main,
        results=results,
        status=status,
        last_calls=last_tool_calls(s.store, s.rollout_file(current.k, "trace.jsonl")) if failed else [],
        prior_failures=prior,
        best=best,
        best_case=case,
        best_rationale=why,
        against_reference=against_reference,
        champion=state.elite if state.beats_reference else None,
        workflow_format=s.cfg.workflow_format,
        rules=template.after.strip() if template else "",
    )


def _other(v: Verdict, k: int) -> str:
    """The number of the version that `v` judged version k against."""
    other = v.second if v.first == f"iter-{k}" else v.first
    return other.removeprefix("iter-")


def _row(k: int, against: str, v: Verdict) -> optimizer_brief.Row:
    outcome = "invalid" if not v.valid else "tie" if v.winner == "tie" else "win" if v.winner == f"iter-{k}" else "loss"
    return optimizer_brief.Row(version=k, against=against, outcome=outcome, rationale=v.rationale, model=v.model)
