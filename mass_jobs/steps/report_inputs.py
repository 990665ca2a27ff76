"""What the report reads of a run's store, each piece in the shape report.json gives it: statuses,
selections, guard vetoes and reviews, loss curves, the composition and who played each role, and
the rollouts' grades."""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from pathlib import Path

from mass_jobs.config.composition import composition_of
from mass_jobs.judging.grade import grade_workspace
from mass_jobs.run.context import RunContext
from mass_jobs.serving.roles import ROLES, recorded_players, role_label
from mass_jobs.steps.guard import guard_class
from mass_jobs.steps.report_document import (
    GuardCount,
    Review,
    RolePlayer,
    Veto,
)
from mass_jobs.store import read_manifest


def json_or_none(store, key: str):
    return store.get_json(key) if store.exists(key) else None


def jsonl_records(store, key: str) -> list[dict]:
    if not store.exists(key):
        return []
    out = []
    for line in store.get_bytes(key).decode("utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a torn last line of a killed writer
    return out


def stored_statuses(store, prefix: str) -> list[dict]:
    """Episode statuses under prefix (`PREFIX/<task>/...`), each with its task as `_task`; an agent
    pod's input/ and output/ copies (collect episodes, search and evaluate rollouts) are not episodes
    (ingest promotes output/ to the rollout's own files, which are counted)."""
    return [
        {**store.get_json(k), "_task": k[len(prefix) + 1 :].split("/", 1)[0]}
        for k in store.list(prefix + "/")
        if k.endswith("/status.json") and not RunContext.is_pod_copy(k)
    ]


def evaluated_generations(ctx: RunContext) -> list[int]:

    return [g for g in range(1, ctx.spec.generations + 1) if read_manifest(ctx.store, ctx.eval(g)) is not None]


def elite_beats_by_iteration(state: dict) -> list[bool]:
    """Replays a search state: after iteration k, did the elite held then beat the bare reference?"""
    beats, out = False, []
    for i, rec in enumerate(state.get("iterations", [])):
        ref = rec.get("reference_verdict") or {}
        if i == 0 or rec.get("preferred"):
            beats = ref.get("valid", False) and ref.get("winner") == f"iter-{rec['k']}"
        out.append(bool(beats))
    return out


def selected_step(doc: dict | None) -> int | None:
    if not doc:
        return None
    for key in ("step", "selected_step"):
        if isinstance(doc.get(key), int):
            return doc[key]
    return None


def guard_vetoes(doc: dict, g: int, task: str) -> list[Veto]:
    """Vetoed episodes of one guard report (`vetoed` ids; reasons from `episodes[id]`)."""

    episodes = doc.get("episodes") or {}
    out = []
    for ep in doc.get("vetoed", []):
        reasons = [str(r) for r in episodes.get(ep, {}).get("reasons", [])]
        classes = sorted({guard_class(r) for r in reasons if not r.startswith("episode outcome ")})
        out.append(Veto(generation=g, task=task, episode=str(ep), reasons=reasons, classes=classes))
    return out


def guard_counts(vetoes: list[Veto], reviews: list[Review] = ()) -> list[GuardCount]:
    tally = Counter((v.generation, c) for v in vetoes for c in v.classes)
    tally.update((r.generation, "flagged for review") for r in reviews if r.held)
    return [GuardCount(generation=g, guard=c, episodes=n) for (g, c), n in sorted(tally.items())]


def guard_reviews(doc: dict, g: int, task: str) -> list[Review]:
    vetoed = set(doc.get("vetoed", []))
    return [
        Review(
            generation=g,
            task=task,
            episode=str(ep),
            vetoed=ep in vetoed,
            claims=list(e["review"]),
            held=bool(e.get("held")),
            trained=ep not in vetoed and bool(e.get("eligible")) and not e.get("held"),
        )
        for ep, e in sorted((doc.get("episodes") or {}).items())
        if e.get("review")
    ]


def stored_supervised(stats: dict | None) -> int | None:
    """Supervised tokens of the training windows (the render step's `summary`)."""
    if not stats:
        return None
    for doc in (stats.get("summary"), stats.get("train"), stats):
        if isinstance(doc, dict) and isinstance(doc.get("stored_supervised_tokens"), int):
            return doc["stored_supervised_tokens"]
    return None


def loss_curves(log: list[dict]) -> tuple[list[list[float]], list[list[float]]]:
    """(train, val) [step, loss] pairs; after a resume the later line of a step wins."""
    train: dict[int, float] = {}
    val: dict[int, float] = {}
    for line in log:
        if line.get("kind") == "val" or ("val_loss" in line and "loss" not in line):
            if line.get("val_loss") is not None:
                val[int(line["step"])] = float(line["val_loss"])
        elif line.get("loss") is not None:
            train[int(line["step"])] = float(line["loss"])
    return [[s, train[s]] for s in sorted(train)], [[s, val[s]] for s in sorted(val)]


def run_composition(spec) -> dict:

    comp = composition_of(spec.sft)
    return {
        "preset": comp.preset,
        "teacher": spec.collection.teacher,
        "window_roles": list(comp.roles),
        "training_episodes": comp.episodes,
        "orchestrator_share": round(comp.orchestrator_share, 6),
        "checkpoint_selection": comp.checkpoint,
    }


def role_players(ctx: RunContext) -> list[RolePlayer]:

    recorded = recorded_players(ctx)
    return [
        RolePlayer(
            role=r,
            configured=role_label(ctx.spec, r, 0).replace("gen-0", "current generation (L_g)"),
            recorded=recorded[r],
        )
        for r in ROLES
    ]


def rollout_grades(store, audit_keys: list[tuple[str, str]], tasks: dict) -> list[tuple[str, object]]:
    """(task, Grade) of each bare-prompt rollout whose task has deliverables, from its stored workspace."""

    out = []
    for task_id, key in audit_keys:  # (task, key of the rollout's audit.json)
        task = tasks.get(task_id)
        ws_key = key.removesuffix("audit.json") + "workspace.tar.gz"
        if task is None or not task.deliverables or not store.exists(ws_key):
            continue
        with tempfile.TemporaryDirectory(prefix="mass-grade-") as tmp:
            out.append((task.id, grade_workspace(task, store.get_dir(ws_key, Path(tmp) / "ws"))))
    return out


def task_scores(grades: list) -> dict:
    scores = [g.score for g in grades if g.score is not None]
    return {
        "graded": len(scores),
        "task_score": sum(scores) / len(scores) if scores else None,
        "solved": sum(g.solved for g in grades),
    }
