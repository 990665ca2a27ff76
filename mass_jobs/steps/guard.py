"""Guards (beyond the paper): deterministic checks that veto teacher episodes from ranking and SFT.

    mass guard --spec S --gen G --task T

Per task the spec may declare required outputs (must exist), protected paths (byte-identical after
the episode: the collect step hashes them in the seeded workspace before the episode starts),
metrics (numbers in named JSON files: finite and within declared bounds) and check commands (run
sandboxed in the workspace, must exit 0). An episode that fails any guard is vetoed whatever the
self-evaluator would say; episodes whose outcome was not `success` are ineligible (their checks are
not run: they could not be used either way). Both, with every reason, are written to
`gen-<g>/guard/<task>.json`.

Check commands run code the model wrote. Locally they run sandboxed in this process's machine; on
the cluster the step pod (which holds the store's credentials) never runs them: `--phase prepare`
writes one checks job per eligible episode (`RunContext.guard_checks`, mass_jobs/sandbox/check_job.py) and
lists them, an agent pod runs each (`mass episode`), `--phase ingest` stores its checks.json, and
`--phase finish` judges with the stored results; a lost check pod fails the episode's checks.
"""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import Field

from mass_jobs.config.shared import Closed
from mass_jobs.config.task_spec import CheckCommand, Guards
from mass_jobs.episodes import proof, rollouts
from mass_jobs.episodes.driver import Driver
from mass_jobs.judging import claims, directives
from mass_jobs.run.context import RunContext
from mass_jobs.run.sandboxing import apply_sandbox
from mass_jobs.sandbox.check_job import ChecksFile, checks_digest, fresh_copy, run_check, validate_results
from mass_jobs.steps.workspace_reads import (
    METRICS_FILE_BYTES,
    Unreadable,
    hash_protected,
    lookup,
    metrics_document,
    output_issue,
    regular_text,
    strict_json,
)
from mass_jobs.store import Step, UnsafeArchive, Waiting, formed

FLAGGED = "flagged for review, not trained"  # the reason of an episode left out for a contradicted claim
# run_check(command, workspace) -> (exit code, short description when it failed)
RunCheck = Callable[[CheckCommand, Path], tuple[int, str]]


class EpisodeGuard(Closed):
    outcome: str | None
    eligible: bool = Field(
        description="The episode ended with outcome 'success' (or 'no_work' under collection.keep_no_work)."
    )
    passed: bool = Field(description="Every guard passed.")
    reasons: list[str] = Field(default_factory=list, description="Why it is ineligible or vetoed.")
    review: list[str] = Field(
        default_factory=list,
        description="Claims no guard can verify, for a person to read: "
        "numbers a deliverable states that its metrics file contradicts (mass_jobs/judging/claims.py).",
    )
    held: bool = Field(
        default=False,
        description="Eligible, passed, and flagged for review: so left out of ranking "
        "and SFT (the task's guards.train_flagged is false).",
    )

    @property
    def usable(self) -> bool:
        return self.eligible and self.passed and not self.held


class GuardReport(Closed):
    task: str
    gen: int
    skipped: bool = False
    episodes: dict[str, EpisodeGuard] = Field(default_factory=dict)
    vetoed: list[str] = Field(default_factory=list, description="Episodes that failed a guard.")
    usable: list[str] = Field(default_factory=list, description="Eligible episodes that passed every guard.")


# ---------------------------------------------------------------- hashing protected paths


# ---------------------------------------------------------------- the checks


GUARD_CLASSES = {  # reason prefix -> the guard that vetoed (the report counts episodes per class)
    "workspace archive refused": "archive",
    "required output": "required output",
    "protected path": "protected path",
    "metric ": "metric",
    "text aimed at the judge": "judge directive",
    "check ": "check",
}


def guard_class(reason: str) -> str:
    """The guard behind a veto reason (`check tampering` for a check that changed protected paths)."""
    if reason.startswith("check ") and " changed what it checks: " in reason:
        return "check tampering"
    return next((c for prefix, c in GUARD_CLASSES.items() if reason.startswith(prefix)), "other")


def check_workspace(
    guards: Guards,
    workspace: Path,
    protected_before: dict[str, dict[str, str]],
    run_check: RunCheck | None = None,
    checks: bool = True,
    seeded: dict[str, str] | None = None,
) -> list[str]:
    """Every guard violation of a finished workspace (empty list: all passed); the check commands
    only with `checks`, each on a fresh copy of the workspace, after which the protected paths are
    verified again (a check that imports the episode's code must not be able to change them for the
    next one). `seeded` is the task's seed files (a required output equal to its stub is no output)."""

    reasons = [why for rel in guards.required_outputs if (why := output_issue(workspace, rel, seeded or {}))]
    reasons += _protected_issues(guards, workspace, protected_before)
    reasons += [f"text aimed at the judge: {hit}" for hit in directives.scan(workspace, seeded)]
    docs: dict[str, Any] = {}
    for m in guards.metrics:
        where = f"metric {m.file}:{m.key}"
        if m.file not in docs:
            try:
                text = regular_text(workspace / m.file, METRICS_FILE_BYTES)
                docs[m.file] = None if text is None else strict_json(text)
            except Unreadable as e:
                docs[m.file] = e
        doc = docs[m.file]
        if doc is None:
            reasons.append(f"{where}: file missing")
            continue
        if isinstance(doc, Exception):
            reasons.append(
                f"{where}: {doc}" if str(doc).startswith("file is not JSON") else f"{where}: file refused: {doc}"
            )
            continue
        try:
            value = lookup(doc, m.key)
        except KeyError:
            reasons.append(f"{where}: key missing")
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            reasons.append(f"{where}: expected a number, found {json.dumps(value)[:60]}")
        elif not math.isfinite(value):
            reasons.append(f"{where}: not finite ({value})")
        elif m.min is not None and value < m.min:
            reasons.append(f"{where}: {value} is below the minimum {m.min}")
        elif m.max is not None and value > m.max:
            reasons.append(f"{where}: {value} is above the maximum {m.max}")
    for check in guards.checks if checks else []:
        if run_check is None:
            raise ValueError("check commands are declared but no check runner was given")
        with fresh_copy(workspace) as copy:
            code, detail = run_check(check, copy)
            changed = _protected_issues(guards, copy, protected_before)
        if code != 0:
            reasons.append(f"check {check.name} failed (exit {code}){': ' + detail if detail else ''}")
        reasons += [f"check {check.name} changed what it checks: {why}" for why in changed if why not in reasons]
    return reasons


def _protected_issues(guards: Guards, workspace: Path, protected_before: dict[str, dict[str, str]]) -> list[str]:
    after = hash_protected(workspace, guards.protected_paths)
    reasons = []
    for rel in guards.protected_paths:
        before = protected_before.get(rel)
        if before is None:
            reasons.append(f"protected path {rel}: no hash recorded before the episode")
        elif after[rel] != before:
            changed = sorted(k for k in set(before) | set(after[rel]) if before.get(k) != after[rel].get(k))
            reasons.append(f"protected path modified: {', '.join(changed)}")
    return reasons


def sandbox_checker(limits, protected=()) -> RunCheck:
    """Run check commands with the sandbox of agent shell calls (scrubbed env, rlimits, no network),
    the task's `protected` paths read-only."""

    return lambda check, workspace: run_check(check, workspace, limits, protected)


def stored_checker(ctx: RunContext, gen: int, task_id: str, ep: str) -> RunCheck:
    """The results an agent pod stored for the episode's checks (`--phase finish`): a check with no
    valid result for the task's current checks fails, never passes."""

    checks = ctx.spec.task(task_id).guards.checks
    key = ctx.rollout_file(ctx.guard_checks(gen, task_id, ep), "checks.json")
    doc = ctx.store.get_json(key) if ctx.store.exists(key) else None
    results, why = None, "not run (no checks pod result stored)"
    if isinstance(doc, dict) and "lost" in doc:
        why = str(doc["lost"])
    elif doc is not None:
        try:
            results = validate_results(doc, checks)
        except ValueError as exc:
            why = str(exc)
    return lambda check, _workspace: results[check.name] if results is not None else (1, why)


def _needs_checks(ctx: RunContext, task_id: str, ep: dict) -> bool:
    return bool(ctx.spec.task(task_id).guards.checks) and ctx.spec.collection.rankable(ep.get("outcome"))


def prepare_checks(ctx: RunContext, gen: int, task_id: str) -> list[dict]:
    """Argo: one checks job per eligible episode whose results are not stored for the current
    checks; returns the agent fan-out items."""

    store = ctx.store
    if formed(guard_step(ctx, gen, task_id)).done:
        return []
    guards = ctx.spec.task(task_id).guards
    checks = guards.checks
    items = []
    for ep in store.get_json(ctx.collect_summary(gen, task_id)).get("episodes", []):
        if not _needs_checks(ctx, task_id, ep):
            continue
        prefix = ctx.guard_checks(gen, task_id, ep["id"])
        stored = ctx.rollout_file(prefix, "checks.json")
        if store.exists(stored) and store.get_json(stored).get("digest") == checks_digest(checks):
            continue
        job = ChecksFile(checks=checks, limits=ctx.spec.execution.limits, protected=guards.protected_paths)
        archive = store.get_bytes(ctx.rollout_file(ctx.collect_episode(gen, task_id, ep["id"]), "workspace.tar.gz"))
        items.append(
            Driver(ctx).prepare_job(
                prefix, task_id, ep["id"], gen, job.model_dump(mode="json"), archive, proof.CHECK_OUTPUTS
            )
        )
    return items


def ingest_checks(ctx: RunContext, gen: int, task_id: str, rel: str, agent_ended: bool = False) -> dict:
    """Store the checks pod's result for the episode at `rel`; a pod that left none (Failed,
    Error) is stored as lost, which fails the episode's checks."""

    summary = ctx.store.get_json(ctx.collect_summary(gen, task_id))
    where = {ctx.guard_checks(gen, task_id, ep["id"]): ep["id"] for ep in summary.get("episodes", [])}
    prefix = rollouts.find_rollout(ctx, rel, list(where))
    checks = ctx.spec.task(task_id).guards.checks
    files, refused = rollouts.signed_outputs(ctx, prefix, proof.CHECK_OUTPUTS)
    if refused:  # results its harness did not sign are no results: the episode's checks fail
        doc = {"lost": f"the checks pod's output was refused: {refused}"}
    elif files["checks.json"] is not None:
        doc = json.loads(files["checks.json"])
        validate_results(doc, checks)  # a malformed result is an error of this step, not a pass
    elif agent_ended:
        doc = {"lost": "not run: the checks pod failed (retries spent, past its deadline or its upload cut short)"}
    else:
        raise rollouts.RolloutError(
            f"{prefix}: cannot ingest, the checks pod's output is missing (run the agent pod after --phase prepare)"
        )
    ctx.store.put_json(ctx.rollout_file(prefix, "checks.json"), doc)
    # a checks job has no episode outcome: whether its results came back (the ingest metric's label)
    return {
        "episode": where[prefix],
        "outcome": "lost" if "lost" in doc else "checked",
        **({"lost": doc["lost"]} if "lost" in doc else {"checks": doc["checks"]}),
    }


# ---------------------------------------------------------------- the step


def guard_step(ctx: RunContext, gen: int, task_id: str):
    """The guard's Step: its inputs are the task's guards and the stored collection summary."""

    summary_key = ctx.collect_summary(gen, task_id)
    if not ctx.store.exists(summary_key):
        return Waiting(f"task {task_id}: no collection summary at {summary_key}; run `mass collect` first")
    return Step(
        ctx.store,
        ctx.guard(gen, task_id).removesuffix(".json"),
        {"guards": ctx.spec.task(task_id).guards.model_dump(mode="json"), "collect": ctx.store.sha256(summary_key)},
        name=f"guard/{task_id}",
    )


def run_guard(
    ctx: RunContext, gen: int, task_id: str, run_check: RunCheck | None = None, agent_pods: bool = False
) -> GuardReport:
    """Guard every collected episode of a task; write guard/<task>.json (skipped when done). With
    `agent_pods` (the cluster) the checks ran in agent pods and their stored results are used."""

    task = ctx.spec.task(task_id)
    store = ctx.store
    step = formed(guard_step(ctx, gen, task_id))
    summary = store.get_json(ctx.collect_summary(gen, task_id))
    key = ctx.guard(gen, task_id)
    if step.done:
        return GuardReport.model_validate(store.get_json(key))
    step.start()
    if run_check is None and task.guards.checks and not agent_pods:
        apply_sandbox(ctx.spec)  # SandboxUnavailable: the step fails, no episode is vetoed for it
        run_check = sandbox_checker(ctx.spec.execution.limits, task.guards.protected_paths)
    report = GuardReport(task=task_id, gen=gen, skipped=summary.get("skipped", False))
    for ep in summary.get("episodes", []):
        prefix = ctx.collect_episode(gen, task_id, ep["id"])
        outcome = ep.get("outcome")
        eligible = ctx.spec.collection.rankable(outcome)
        reasons = [] if eligible else [f"episode outcome {outcome}: {ep.get('reason', '')}".strip()]
        checker = stored_checker(ctx, gen, task_id, ep["id"]) if agent_pods else run_check
        with tempfile.TemporaryDirectory(prefix="mass-guard-") as tmp:
            try:
                store.get_dir(ctx.rollout_file(prefix, "workspace.tar.gz"), tmp)
            except UnsafeArchive as err:  # an agent-written archive: vetoed, never extracted
                violations, review = [f"workspace archive refused: {err}"], []
            else:
                violations = check_workspace(
                    task.guards,
                    Path(tmp),
                    store.get_json(ctx.rollout_file(prefix, "protected.json")),
                    checker,
                    checks=_needs_checks(ctx, task_id, ep),
                    seeded=task.files,
                )
                review = claims.contradictions(task.guards, Path(tmp), metrics_document)
        held = bool(review) and eligible and not violations and not task.guards.train_flagged
        if held:  # why rank leaves it out
            reasons.append(f"{FLAGGED} (guards.train_flagged is false): {'; '.join(review)}")
        report.episodes[ep["id"]] = EpisodeGuard(
            outcome=outcome,
            eligible=eligible,
            passed=not violations,
            reasons=reasons + violations,
            review=review,
            held=held,
        )
    report.vetoed = [e for e, g in report.episodes.items() if not g.passed]
    report.usable = [e for e, g in report.episodes.items() if g.usable]
    store.put_json(key, report.model_dump(mode="json"))
    step.finish([key], extra={"vetoed": len(report.vetoed), "usable": len(report.usable)})
    return report
