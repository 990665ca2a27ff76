"""The search's persisted state and its rules, pure: `search/<task>/state.json` and how it folds.

`judge_version` says which verdicts a new version is judged by and whether it becomes the best
version (search.selection champion or elite); `fold` rebuilds the state from the iteration records,
so a rerun of any iteration reproduces it exactly. `mass search` (steps/search.py) runs the loop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from pydantic import Field

from mass_jobs.config.shared import Closed
from mass_jobs.judging.compare import Verdict
from mass_jobs.spec.workflow_docs import changes as version_changes


class Feedback(Closed):
    iteration: int
    result: Literal["initial", "new_elite", "elite_kept", "invalid_verdict", "proposal_failed"] = Field(
        description="new_elite: this version became the best (elite or champion); elite_kept: it did not."
    )
    changes: list[str] = Field(default_factory=list, description="What changed against the previous workflow.")
    rationale: str = ""
    outcome: str | None = Field(default=None, description="Episode outcome of the rollout.")


class IterationRecord(Closed):
    k: int = Field(ge=0)
    workflow: dict | None = Field(description="The workflow rolled out; null when the proposal failed.")
    proposal_attempts: int = 0
    proposal_errors: list[str] = Field(default_factory=list)
    outcome: str | None = None
    verdict: Verdict | None = Field(
        default=None,
        description="This rollout against the best version it challenged "
        "(the elite; under selection champion, the champion, only when both beat the reference).",
    )
    preferred: bool = Field(default=False, description="This version became the best version.")
    elite_after: int = Field(description="Iteration whose workflow is the best version after this one.")
    reference_verdict: Verdict | None = Field(
        default=None,
        description="This version against the bare reference "
        "(every version under selection champion; a new elite under elite).",
    )


class SearchState(Closed):
    """`search/<task>/state.json`: elite, feedback history, beats_reference."""

    task: str
    gen: int
    selection: Literal["champion", "elite"] = Field(default="champion", description="search.selection of the run.")
    iterations_planned: int = Field(description="K of the spec when the state was written.")
    reference_outcome: str | None = None
    elite: int = Field(description="Iteration whose workflow and workspace are the best version (elite or champion).")
    elite_workflow: dict
    beats_reference: bool = Field(description="The best version's own verdict against the bare reference was a win.")
    beat_reference: list[int] = Field(
        default_factory=list,
        description="Iterations whose version was preferred over the bare reference.",
    )
    feedback: list[Feedback]
    iterations: list[IterationRecord]
    done: bool = Field(description="True when iteration K is finished.")


def won(v: Verdict | None, k: int) -> bool:
    return bool(v is not None and v.valid and v.winner == f"iter-{k}")


def judge_version(
    selection: str, k: int, best_beats_reference: bool, ask: Callable[[str], Verdict]
) -> tuple[Verdict | None, Verdict | None, bool]:
    """The verdicts version k is judged by and whether it becomes the best version:
    (against the best, against the reference, preferred). `ask("reference")` / `ask("best")` get one.

    champion: against the reference; a winner takes over outright while the best holds no win of its
    own, else only by also winning against the best. elite: against the elite; a new elite is then
    judged against the reference (what `beats_reference` reports)."""
    if selection == "champion":
        versus_reference = ask("reference")
        versus_best = ask("best") if won(versus_reference, k) and best_beats_reference else None
        preferred = won(versus_reference, k) and (not best_beats_reference or won(versus_best, k))
        return versus_best, versus_reference, preferred
    versus_best = ask("best")
    preferred = won(versus_best, k)
    return versus_best, (ask("reference") if preferred else None), preferred


def fold(
    task: str,
    gen: int,
    planned: int,
    records: list[IterationRecord],
    reference_outcome: dict | None,
    selection: str = "champion",
) -> SearchState:
    """The search state as a pure function of the iteration records (so a rerun rebuilds it exactly)."""
    elite = records[0]
    beats = won(elite.reference_verdict, 0)
    beat = [0] if beats else []
    feedback = [
        Feedback(
            iteration=0,
            result="initial",
            changes=["initial version"],
            outcome=elite.outcome,
            rationale=elite.reference_verdict.rationale if elite.reference_verdict else "",
        )
    ]
    last_wf = elite.workflow
    for r in records[1:]:
        if r.workflow is None:
            feedback.append(Feedback(iteration=r.k, result="proposal_failed", rationale="; ".join(r.proposal_errors)))
            continue
        changes = version_changes(last_wf, r.workflow)
        last_wf = r.workflow
        # the verdict that decided: against the reference (champion), against the elite (elite)
        decisive = r.reference_verdict if selection == "champion" else r.verdict
        assert decisive is not None
        result = "new_elite" if r.preferred else ("elite_kept" if decisive.valid else "invalid_verdict")
        rationale = decisive.rationale
        if selection == "champion" and r.verdict is not None:
            rationale += f" | against the champion iter-{elite.k}: {r.verdict.rationale}"
        feedback.append(Feedback(iteration=r.k, result=result, changes=changes, rationale=rationale, outcome=r.outcome))
        if won(r.reference_verdict, r.k):
            beat.append(r.k)
        if r.preferred:
            elite = r
            beats = won(r.reference_verdict, r.k)
    assert elite.workflow is not None
    return SearchState(
        task=task,
        gen=gen,
        selection=selection,
        iterations_planned=planned,
        reference_outcome=(reference_outcome or {}).get("outcome"),
        elite=elite.k,
        elite_workflow=elite.workflow,
        beats_reference=beats,
        beat_reference=beat,
        feedback=feedback,
        iterations=records,
        done=records[-1].k >= planned,
    )
