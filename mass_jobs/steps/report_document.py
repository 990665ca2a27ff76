"""The run report's document: the typed models `schemas/report.schema.json` is generated from,
and its validation (`mass report` refuses to store a report its schema rejects)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from mass_jobs.config.shared import Closed
from mass_jobs.judging.information import InformationProxy

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "schemas" / "report.schema.json"
Split = Literal["train", "test", "all"]


class TaskShare(Closed):
    wins: int
    losses: int
    ties: int
    invalid: int
    win_share: float | None
    ci: list[float] | None = Field(description="Wilson score interval [lo, hi]; null without decisive verdicts.")


class WinShare(Closed):
    candidate: int = Field(description="Generation g of L_g.")
    baseline: int = Field(description="The generation it is compared with (0 or g-1).")
    split: Split
    wins: int
    losses: int
    ties: int
    invalid: int
    win_share: float | None = Field(description="wins / (wins + losses), ties and invalid verdicts excluded.")
    ci: list[float] | None = Field(description="Bootstrap-over-tasks percentile interval [lo, hi].")
    per_task: dict[str, TaskShare]
    positions: dict[str, int] = Field(
        description="Decisive verdicts by the blind label chosen ('A', 'B') and by the order shown "
        "('candidate_first', 'baseline_first')."
    )
    note: str | None = Field(description="Position-bias note when every decisive verdict chose one label.")


class Agreement(Closed):
    evaluator: int = Field(description="Generation whose own model gave the self verdicts.")
    agree: int
    pairs: int = Field(description="Pairs with a valid self verdict and a panel majority.")
    no_majority: int = Field(
        description="Pairs with a valid self verdict whose panel has no majority: neither agreement nor disagreement."
    )
    rate: float | None


class Audit(Closed):
    generation: int
    split: Split
    episodes: int
    delegation: int
    code_handoff: int
    delegation_rate: float | None
    code_handoff_rate: float | None
    graded: int = Field(default=0, description="Episodes with a deterministic task score (tasks with deliverables).")
    task_score: float | None = Field(
        default=None, description="Mean task score (mass_jobs.judging.grade: deliverables exist and are correct), 0..1."
    )
    solved: int = Field(default=0, description="Episodes whose every grader check passed.")


class Tokens(Closed):
    generation: int
    generated_search: int
    generated_collect: int
    generated_eval: int
    generated_total: int
    generated_episodes: int = Field(description="Episode status records whose completion tokens are summed.")
    stored_supervised: int | None = Field(description="Supervised tokens in the rendered SFT windows.")
    processed_to_selected: int | None = Field(description="Supervised tokens processed up to the selected step.")
    processed_to_end: int | None


class NetworkCounts(Closed):
    episodes: int = Field(description="Episodes whose shell commands had the egress proxy.")
    requests: int
    allowed: int
    denied: int = Field(
        description="Requests the allow-list refused (each one recorded in its episode's network.jsonl)."
    )
    bytes_down: int = Field(description="Bytes the allowed requests brought in.")
    hosts: list[str] = Field(description="Hosts reached, over all these episodes.")


class Outcomes(Closed):
    generation: int
    stage: Literal["search", "collect", "evaluate"]
    episodes: int
    by_outcome: dict[str, int] = Field(
        description="Episodes per outcome (mass_jobs.episodes.harness.OUTCOMES; turn_limit: an "
        "agent used its turns, e.g. qwen-code's --max-session-turns)."
    )
    by_cap: dict[str, int] = Field(
        default_factory=dict,
        description="Episodes ended by each cap of execution.limits "
        "(mass_jobs.episodes.harness.CAPS), zeros included: a cap ending many episodes selects for brevity.",
    )
    tool_calls: int = Field(default=0, description="Tool calls of these episodes, all agents together.")
    tool_calls_per_episode: float | None = Field(default=None, description="tool_calls / episodes.")
    network: NetworkCounts | None = Field(
        default=None,
        description="What these episodes' shell commands reached "
        "through their egress proxies (execution.network); null when it was off.",
    )
    ended_by_pod: dict[str, int] = Field(
        default_factory=dict,
        description="Task -> episodes whose agent pod, not "
        "their harness, ended the record (status ended_by: pod): outputs uploaded "
        "unsigned, after a signal or exit-code file written in the pod (Argo's "
        "emissary obeys them from any container) or an upload cut short.",
    )
    unsandboxed: int = Field(
        default=0,
        description="Episodes whose model-written code ran without a sandbox "
        "(execution.sandbox: none, their status's sandbox.boundary).",
    )


class SftData(Closed):
    generation: int
    episodes: int = Field(description="Ranked episodes the render step read (train and val).")
    episode_errors: int = Field(
        description="Errors found in them: teacher prompt not stripped, thread not renderable, reply too long."
    )
    episodes_dropped: int = Field(description="Episodes left out of the SFT data for those errors (sft.strict).")
    orchestrator_windows: int = Field(description="Training windows of orchestrator threads.")
    windows_by_role: dict[str, int] = Field(
        default_factory=dict,
        description="Training windows per thread role (orchestrator, worker, auxiliary: a harness's side calls).",
    )
    supervised_by_role: dict[str, int] = Field(
        default_factory=dict, description="Supervised tokens of the training windows per thread role."
    )


def sft_data(stats: dict | None, g: int) -> SftData | None:
    """What the render step of generation g kept and dropped (sft/stats.json), or None before it ran."""
    splits = [stats.get(s) for s in ("train", "val")] if stats else []
    splits = [x for x in splits if isinstance(x, dict) and "episodes" in x]
    if not splits:
        return None
    return SftData(
        generation=g,
        episodes=sum(x["episodes"] for x in splits),
        episode_errors=sum(len(x.get("episode_errors", [])) for x in splits),
        episodes_dropped=sum(len(x.get("episodes_dropped", [])) for x in splits),
        orchestrator_windows=(stats["train"].get("windows_by_role") or {}).get("orchestrator", 0),
        windows_by_role=dict(stats["train"].get("windows_by_role") or {}),
        supervised_by_role=dict(stats["train"].get("supervised_tokens_by_role") or {}),
    )


class SearchCurve(Closed):
    generation: int
    iterations: int
    tasks: int
    coverage: list[int] = Field(description="Tasks whose elite beat the bare reference after iteration k.")
    beats_reference: dict[str, bool] = Field(description="Per task, the final elite vs the reference.")


class Veto(Closed):
    generation: int
    task: str
    episode: str
    reasons: list[str]
    classes: list[str] = Field(
        default_factory=list, description="The guards that vetoed it (steps/guard.py guard_class)."
    )


class GuardCount(Closed):
    generation: int
    guard: str = Field(
        description="A guard class: archive, required output, protected path, metric, check, "
        "check tampering, judge directive."
    )
    episodes: int = Field(
        description="Episodes of the generation this guard vetoed (one may count under several); "
        "for 'flagged for review', those left out of ranking and SFT for a contradicted claim."
    )


class Review(Closed):
    """An episode whose deliverables claim what no guard can verify, for a person to read."""

    generation: int
    task: str
    episode: str
    vetoed: bool
    held: bool = Field(
        default=False, description="Left out of ranking and SFT for its claims (the guard report's held)."
    )
    trained: bool = Field(
        default=False,
        description="Ranked and trained on all the same (eligible, neither vetoed nor "
        "held: the task's guards.train_flagged).",
    )
    claims: list[str]


class Training(Closed):
    generation: int
    selected_step: int | None
    selected_by: Literal["val_loss", "panel"] | None = Field(default=None, description="How the step was selected.")
    train_loss: list[list[float]] = Field(description="[step, loss] pairs.")
    val_loss: list[list[float]] = Field(description="[step, validation loss] pairs.")


class VerdictCounts(Closed):
    total: int
    valid: int
    invalid: int


class InvalidVerdict(Closed):
    candidate: int
    baseline: int
    task: str
    replicate: int
    judge: str
    seed: int
    errors: list[str]


class JudgeInfo(Closed):
    name: str
    model: str
    seeds: list[int]


class RolePlayer(Closed):
    role: str = Field(description="optimizer | evaluator | executor")
    configured: str = Field(description="roles.<role> of the spec: `<model> @ <endpoint>`, or the current generation.")
    recorded: list[str] = Field(description="Models recorded as playing it in stored proposals, verdicts and episodes.")


class Report(Closed):
    """report.json of one run."""

    run: str
    how_to_read: list[str] = Field(description="What the numbers are and which of them, at this scale, are noise.")
    warnings: list[str] = Field(
        default_factory=list,
        description="What makes the run unusable as evidence or as "
        "training data: most episodes of a stage did no work, most verdicts were invalid.",
    )
    generations: int = Field(description="N of the spec.")
    evaluated: list[int] = Field(description="Generations with a finished evaluate step.")
    tasks: dict[str, list[str]] = Field(description="Task ids by split ('train', 'test').")
    confidence: float
    intervals: dict[str, str]
    judges: list[JudgeInfo]
    verdicts: dict[str, VerdictCounts] = Field(
        description="'panel' and 'self' verdict counts, and 'rank': the "
        "self-judged pairs of the rank steps that chose the training data."
    )
    win_share: list[WinShare]
    agreement: list[Agreement]
    audit: list[Audit]
    tokens: list[Tokens]
    outcomes: list[Outcomes] = Field(default_factory=list, description="Per generation and stage: how episodes ended.")
    sft: list[SftData] = Field(description="Per generation: episodes rendered, their errors and those dropped.")
    search: list[SearchCurve]
    guard_vetoes: list[Veto]
    guard_counts: list[GuardCount] = Field(
        default_factory=list, description="Per generation and guard, episodes vetoed."
    )
    review: list[Review] = Field(default_factory=list, description="Episodes flagged for review.")
    training: list[Training]
    invalid_verdicts: list[InvalidVerdict]
    roles: list[RolePlayer] = Field(default_factory=list, description="Which model played which role.")
    composition: dict[str, Any] = Field(
        default_factory=dict,
        description="The teacher and its SFT composition (sft.preset or the spec's own fields; docs/composition.md).",
    )
    information: list[InformationProxy] = Field(
        default_factory=list, description="Per generation, Gaussian MI/TC proxies between workflow text and results."
    )
    files: list[str] = Field(description="Files of the report directory.")


def report_schema() -> dict:
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://mass-jobs.dev/schemas/report.schema.json",
        **Report.model_json_schema(mode="validation"),
    }


def validate_report(doc: dict) -> None:
    """Raise ValueError naming every field of `doc` that breaks the checked-in report schema."""
    from jsonschema import Draft202012Validator

    validator = Draft202012Validator(json.loads(SCHEMA_PATH.read_text()))
    errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path))
    if errors:
        lines = [f"$.{'.'.join(str(p) for p in e.absolute_path)}: {e.message}" for e in errors]
        raise ValueError("report.json does not match report.schema.json:\n" + "\n".join(lines))
