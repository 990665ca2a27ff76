"""Evaluate generation G: bare-prompt rollouts, the judge panel and the self-evaluator.

    mass evaluate --spec S --gen G

1. Rollouts: every task (train AND test) is run `evaluation.rollouts_per_task` times on its BARE
   prompt (no workflow, no directive) by L_G and by each baseline (L_0 and L_{G-1}). Replicate r of a
   task uses the same seed in every generation, so pairs are matched. A generation's rollouts live
   at `<run>/eval/gen-<h>/<task>/rep-<r>/`, each behind its own Step manifest: they are made once and
   reused by every later comparison (L_1's rollouts serve "L_2 vs L_1" too).
2. Panel: every judge of `spec.judges` x each of its seeds gives a blind verdict on every pair
   (L_G rep r vs baseline rep r), stored one object per verdict under `<run>/eval/verdicts/`.
3. Self-evaluator: the generation's own model judges the same pairs once (L_0 too when G = 1), so
   the report can show its agreement with the panel majority.

Locally the rollouts run in this process (shell commands sandboxed) against a server started per
generation. On the cluster they run in agent pods against one InferenceService at a time, in rounds
(`round_work`): `--phase plan` names them and what each does; each round serves L_h; where it
rolls out, `--phase prepare --served-gen h` writes its missing rollouts' pod inputs and `--phase
ingest` stores each pod's output (episodes/rollouts.py); where it judges, `--phase finish
--served-gen h` gives L_h's self-verdicts (every pair is stored by then); then L_h is released. A
last `--phase finish` runs the panel (judges are external endpoints there). One predictor at a
time: a GPU quota that fits one serves the whole run, and no predictor holds its GPU while another
waits for admission.

Evaluation is reporting only: nothing here is read by search, ranking, rendering, training or
checkpoint selection, and test tasks appear only here.
"""

from __future__ import annotations

import contextlib
import hashlib
import tempfile
from collections.abc import Callable
from pathlib import Path

from mass_jobs.config.task_spec import Task
from mass_jobs.episodes import rollouts
from mass_jobs.episodes.audit import audit_episode
from mass_jobs.episodes.driver import Driver, Rollout
from mass_jobs.episodes.episode import EpisodeRequest, status_text
from mass_jobs.judging.judges import PanelMember, run_panel
from mass_jobs.judging.metrics import outcome, win_share
from mass_jobs.run.context import RunContext
from mass_jobs.run.generation_model import model_ref, model_uri
from mass_jobs.serving.model_dirs import has_stored_model
from mass_jobs.serving.roles import client_for
from mass_jobs.serving.servers import ServeJudge, ServeModel
from mass_jobs.steps.evaluate_pairs import (
    BundleCache,
    all_stored,
    baselines,
    endpoint_unless_stored,
    pair_jobs,
    rollout_prefix,
    self_evaluators,
    self_verdicts,
    verdict_keys,
    verdict_prefix,
)
from mass_jobs.store import Step, Waiting, formed, read_manifest

AUDITED_FILES = ("audit.json", *rollouts.RECORD)  # an evaluate rollout: its audit first

Progress = Callable[[str, dict], None]


def evaluate_step(ctx: RunContext, gen: int):
    """Evaluate's Step: it pins its rollouts' manifests and owns its verdicts."""

    if gen > 0 and not has_stored_model(ctx.store, ctx.model(gen)):
        return Waiting(
            f"generation {gen}: no merged model at {ctx.model(gen)} (run `mass merge --gen {gen - 1}` first)"
        )
    return Step(
        ctx.store, ctx.eval(gen), evaluate_inputs(ctx, gen), name=f"evaluate gen-{gen}", owns=(ctx.eval_verdicts(gen),)
    )


def rollout_seed(task: str, rep: int) -> int:
    """Independent of the generation, so replicate r of a task is matched across generations."""
    return int.from_bytes(hashlib.sha256(f"eval/{task}/{rep}".encode()).digest()[:4], "big") % (2**31)


# ---------------------------------------------------------------- rollouts


def rollout_inputs(ctx: RunContext, g: int, task: Task, rep: int) -> dict:
    spec = ctx.spec
    return {
        "model": model_ref(ctx, g),
        "task": task.model_dump(mode="json", include={"id", "prompt", "files", *(["network"] if task.network else [])}),
        "replicate": rep,
        "seed": rollout_seed(task.id, rep),
        "harness": spec.execution.harness,
        "limits": spec.execution.limits.as_input(),
        "sampling": spec.model.sampling.model_dump(mode="json"),
    }


def _audit(r: Rollout, status: dict, trace: bytes) -> tuple[dict, dict]:
    """How evaluate reads a rollout: its audit stored first, its delegation in the manifest."""
    with tempfile.TemporaryDirectory(prefix="mass-eval-audit-") as tmp:  # the audit reads an episode's out dir
        (Path(tmp) / "trace.jsonl").write_bytes(trace)
        (Path(tmp) / "status.json").write_text(status_text(status))
        audit = audit_episode(Path(tmp)).to_dict()
    audit["episode"] = r.prefix  # a store key, not a temp path
    return {"audit.json": audit}, {
        "outcome": status.get("outcome"),
        "delegation": audit["delegation"],
        "code_handoff": audit["code_handoff"],
    }


def driver(ctx: RunContext) -> Driver:
    """L_g itself plays its rollouts: roles.executor never stands in for the generation measured."""
    return Driver(ctx, executor_role=False, reading=_audit)


def rollout(ctx: RunContext, g: int, task: Task, rep: int) -> Rollout:
    """Replicate `rep` of the bare task by L_g: the same prompt, files and seed for every generation."""
    prefix = rollout_prefix(ctx, g, task.id, rep)
    manifest = Step(
        ctx.store, prefix, rollout_inputs(ctx, g, task, rep), name=f"eval-rollout gen-{g} {task.id} rep-{rep}"
    )
    return Rollout(prefix, episode_request(task, rep), task.id, f"rep-{rep}", g, manifest=manifest)


def rollout_done(ctx: RunContext, g: int, task: Task, rep: int) -> bool:
    return rollout(ctx, g, task, rep).manifest.done


def episode_request(task: Task, rep: int) -> EpisodeRequest:
    return EpisodeRequest(
        prompt=task.prompt, files=dict(task.files), seed=rollout_seed(task.id, rep), network=tuple(task.network)
    )


def rollout_generations(gen: int) -> list[int]:
    return sorted({gen, *baselines(gen)})


def new_rollout_generations(gen: int) -> list[int]:
    """The generations whose rollouts evaluate of `gen` adds to the store after the earlier evaluates:
    L_gen's, and L_0's at generation 1; a baseline's are reused (same prompt, files and seed)."""
    earlier = {h for g in range(1, gen) for h in rollout_generations(g)}
    return [h for h in rollout_generations(gen) if h not in earlier]


def serve_order(rolling: set[int], judging: set[int]) -> list[int]:
    """The rounds of an evaluation, one model served in each: every generation with rollouts to run,
    the self-evaluators among them last, so the last round also gives its model's self-verdicts (every
    pair is stored by then); then a round for each other self-evaluator. Generation 1, nothing
    stored: [0, 1, 0]."""
    first = sorted(rolling, key=lambda h: (h in judging, h))
    judged_there = {first[-1]} & judging if first else set()
    return first + sorted(judging - judged_there)


def round_work(rolling: set[int], judging: set[int]) -> list[tuple[int, bool, bool]]:
    """serve_order's rounds with what each does: (generation, rolls out, gives self-verdicts). At
    generation 1 L_0's first round only rolls out and its second only judges, so neither runs the
    pods of the other part."""
    order, n = serve_order(rolling, judging), len(rolling)
    return [(h, i < n, h in judging and i >= n - 1) for i, h in enumerate(order)]


def planned_work(gen: int) -> list[tuple[int, bool, bool]]:
    """The rounds of evaluate of `gen` once the earlier evaluations are stored (the cycles' order),
    with what each does (`round_work`)."""
    return round_work(set(new_rollout_generations(gen)), set(self_evaluators(gen)))


def planned_rounds(gen: int) -> list[int]:
    """The generations served, in order: [0, 1, 0] at generation 1, [gen] after."""
    return [h for h, _, _ in planned_work(gen)]


def all_rollouts(ctx: RunContext, gen: int) -> list[Rollout]:
    """Every rollout this step reads: L_gen's and its baselines', each task, each replicate."""
    return [
        rollout(ctx, h, t, r)
        for h in rollout_generations(gen)
        for t in ctx.spec.resolved_tasks()
        for r in range(ctx.spec.evaluation.rollouts_per_task)
    ]


def rounds(ctx: RunContext, gen: int) -> list[tuple[int, bool, bool]]:
    """The rounds this step still needs, from what is stored: the generations with rollouts missing,
    and the self-evaluators with verdicts missing (`round_work`)."""

    if formed(evaluate_step(ctx, gen)).done:
        return []
    rolling = {r.gen for r in all_rollouts(ctx, gen) if not r.manifest.done}
    return round_work(rolling, {h for h in self_evaluators(gen) if not self_judged(ctx, gen, h)})


def _check_round(gen: int, served: int) -> None:
    """A round serves a generation evaluate of `gen` rolls out (its self-evaluators are among them)."""
    if served not in rollout_generations(gen):
        raise ValueError(f"--served-gen: evaluate of gen {gen} rolls out {rollout_generations(gen)}, got {served}")


def self_judged(ctx: RunContext, gen: int, h: int) -> bool:
    return all_stored(
        ctx.store, verdict_prefix(ctx), pair_jobs(ctx, gen, None), f"gen-{h}", "self", (ctx.spec.search.seed,)
    )


def plan(ctx: RunContext, gen: int) -> dict:
    """{"rounds": one per model served, in order, each with the storageUri the cycle's own model gets
    and what it does: "rolls" (its prepare and agent pods run) and "judges" (its self-verdicts)}."""
    spec = ctx.spec
    bucket, _, prefix = spec.store.uri.removeprefix("s3://").partition("/")
    run_prefix = "/".join(p for p in (prefix.strip("/"), spec.name) if p)
    return {
        "rounds": [
            round_item(h, rolls, judges, model_uri(spec, h, bucket, run_prefix), spec.model.dtype)
            for h, rolls, judges in rounds(ctx, gen)
        ]
    }


def round_item(h: int, rolls: bool, judges: bool, uri: str, dtype: str) -> dict:
    """A round as the plan lists it for the cluster's fan-out (Argo's `when` reads "true"/"false")."""
    return {"gen": str(h), "model-uri": uri, "dtype": dtype, "rolls": str(rolls).lower(), "judges": str(judges).lower()}


def prepare(ctx: RunContext, gen: int, served: int, endpoint) -> dict:
    """The agent pods' inputs of L_served's missing rollouts, against `endpoint`; {"rollouts": the
    fan-out items}."""

    _check_round(gen, served)
    d = driver(ctx)
    return {
        "rollouts": [d.prepare(r, endpoint) for r in all_rollouts(ctx, gen) if r.gen == served and not r.manifest.done]
    }


def ingest(ctx: RunContext, gen: int, rel: str, agent_ended: bool = False) -> dict:
    """Store the agent pod's output of the rollout `rel` (a key relative to the run), with its audit."""
    declared = {r.prefix: lambda r=r: r for r in all_rollouts(ctx, gen)}
    driver(ctx).ingest_named(rel, declared, agent_ended)
    return read_manifest(ctx.store, ctx.under_run(rel.strip("/")))["extra"]  # its outcome and audit


def run_rollouts(ctx: RunContext, g: int, endpoint, progress: Progress | None = None) -> None:
    """L_g's rollouts of every task run here, sandboxed (stored ones skipped)."""

    def done(r: Rollout, _status: dict) -> None:
        if progress:
            rep = int(r.label.removeprefix("rep-"))
            progress(
                "rollout", {"gen": g, "task": r.task, "replicate": rep, **read_manifest(ctx.store, r.prefix)["extra"]}
            )

    rs = [
        rollout(ctx, g, t, r) for t in ctx.spec.resolved_tasks() for r in range(ctx.spec.evaluation.rollouts_per_task)
    ]
    driver(ctx).run_all(rs, rollouts.episode_runner(ctx.spec, endpoint, executor_role=False), on_done=done)


# ---------------------------------------------------------------- pairs and verdicts


# ---------------------------------------------------------------- the step


def evaluate_inputs(ctx: RunContext, gen: int) -> dict:
    spec = ctx.spec
    return {
        "gen": gen,
        "models": {str(h): model_ref(ctx, h) for h in sorted({gen, *baselines(gen), *self_evaluators(gen)})},
        "tasks": [t.id for t in spec.resolved_tasks()],
        # the panel's order rule only when not the default, so earlier runs keep their hashes
        "evaluation": spec.evaluation.model_dump(
            mode="json", exclude={"panel_order"} if spec.evaluation.panel_order == "balanced" else None
        ),
        "judges": [j.model_dump(mode="json") for j in spec.judges],
    }


def _rollouts_of_every_generation(ctx: RunContext, gen: int, serve_model, progress, agent_pods: bool) -> None:
    """1. rollouts: serve each generation only when some of its rollouts are missing (on the cluster
    the rounds stored them: a missing one is an error)."""
    tasks = ctx.spec.resolved_tasks()
    reps = range(ctx.spec.evaluation.rollouts_per_task)
    for h in sorted({gen, *baselines(gen)}):
        if all(rollout_done(ctx, h, t, r) for t in tasks for r in reps):
            continue
        if agent_pods:
            missing = [rollout_prefix(ctx, h, t.id, r) for t in tasks for r in reps if not rollout_done(ctx, h, t, r)]
            raise RuntimeError(
                f"evaluate gen-{gen}: rollouts not stored {missing[:4]} (run --phase prepare, "
                f"their agent pods and --phase ingest first)"
            )
        with serve_model(h) as endpoint:
            run_rollouts(ctx, h, endpoint, progress)


def _panel(ctx: RunContext, vprefix: str, jobs: list, serve_judge, note) -> list[dict]:
    """The external panel's verdicts, judge by judge in the spec's order (positions alternate
    across judges); a judge whose verdicts are all stored is not served."""
    spec, store, records = ctx.spec, ctx.store, []
    for ji, judge in enumerate(spec.judges):
        with endpoint_unless_stored(
            store, vprefix, jobs, judge.name, "panel", judge.seeds, lambda judge=judge: serve_judge(judge)
        ) as endpoint:
            member = PanelMember(
                name=judge.name,
                model=judge.model,
                seeds=tuple(judge.seeds),
                client=client_for(spec, endpoint) if endpoint else None,
            )
            records += run_panel(
                store,
                vprefix,
                jobs,
                [member],
                spec.evaluation.verdict_retries,
                on_verdict=note,
                first_index=ji,
                order=spec.evaluation.panel_order,
            )
    return records


def evaluate(
    ctx: RunContext,
    gen: int,
    serve_model: ServeModel,
    serve_judge: ServeJudge,
    progress: Progress | None = None,
    agent_pods: bool = False,
) -> dict:
    """The whole step for L_gen; returns its manifest. Resumes from whatever is already stored.
    With `agent_pods` (the cluster) the rounds stored the rollouts (agent pods) and the self-verdicts:
    a missing one is an error, and only the panel runs here."""

    spec, store = ctx.spec, ctx.store
    step = formed(evaluate_step(ctx, gen))
    if step.done:
        return read_manifest(store, ctx.eval(gen))
    step.start()
    tasks = spec.resolved_tasks()
    reps = range(spec.evaluation.rollouts_per_task)

    _rollouts_of_every_generation(ctx, gen, serve_model, progress, agent_pods)

    vprefix = verdict_prefix(ctx)
    with tempfile.TemporaryDirectory(prefix="mass-eval-bundles-") as tmp:
        jobs = pair_jobs(ctx, gen, BundleCache(ctx, Path(tmp)))

        def note(record: dict) -> None:
            if progress:
                progress("verdict", record)

        # 2. self-evaluator(s): one verdict per pair by the generation's own model
        records = []
        for h in self_evaluators(gen):
            if agent_pods and not self_judged(ctx, gen, h):
                raise RuntimeError(
                    f"evaluate gen-{gen}: L_{h}'s self-verdicts not stored (its round ends with "
                    f"--phase finish --served-gen {h})"
                )
            records += self_verdicts(ctx, jobs, h, lambda h=h: serve_model(h), note)

        # 3. the external panel
        selves = len(records)
        records += _panel(ctx, vprefix, jobs, serve_judge, note)

    outputs = [
        rollout_prefix(ctx, h, t.id, r) + "/_manifest.json"
        for h in sorted({gen, *baselines(gen)})
        for t in tasks
        for r in reps
    ]
    outputs += sorted(verdict_keys(vprefix, jobs, gen, spec))
    invalid = sum(not r["valid"] for r in records)
    results = [outcome(r) for r in records[selves:]]  # the external panel's: what measures progress
    share = win_share(results.count("win"), results.count("loss"))
    return step.finish(outputs, extra={"verdicts": len(records), "invalid": invalid, "panel_win_share": share})


def judge_round(ctx: RunContext, gen: int, served: int, endpoint, progress: Progress | None = None) -> dict:
    """The end of L_served's round: its self-verdicts against `endpoint`, once every pair's rollouts
    are stored (the last rollout round). {"self_verdicts": how many it read or gave; 0 where it had
    none to give: no self-evaluator, all stored, or a pair's rollouts still missing}."""

    _check_round(gen, served)
    if (
        served not in self_evaluators(gen)
        or self_judged(ctx, gen, served)
        or not all(r.manifest.done for r in all_rollouts(ctx, gen))
    ):
        return {"self_verdicts": 0}
    with tempfile.TemporaryDirectory(prefix="mass-eval-bundles-") as tmp:
        jobs = pair_jobs(ctx, gen, BundleCache(ctx, Path(tmp)))
        records = self_verdicts(
            ctx,
            jobs,
            served,
            lambda: contextlib.nullcontext(endpoint),
            (lambda rec: progress("verdict", rec)) if progress else None,
        )
    return {"self_verdicts": len(records)}
