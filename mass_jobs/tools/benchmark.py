"""Public-benchmark adapter: a directory of task prompts + a grader command -> bare-prompt rollouts of
any generation and a score table per generation, with score per output token.

    mass benchmark SPEC --bench DIR --gen 0 --gen 2 [--replicates R]

A benchmark directory:

    DIR/benchmark.yaml          name (an id), grader: {command, timeout_s}, optional replicates
    DIR/tasks/<id>/prompt.md    the task prompt, sent BARE (no workflow, no directive)
    DIR/tasks/<id>/files/...    seed files copied into the episode's workspace (the agent sees them)
    DIR/tasks/<id>/...          anything else (reference answers, per-task eval scripts): grader only
    DIR/...                     shared grader files (outside tasks/): grader only

Each rollout is one episode of the generation's model through the run's harness (`episode_runner`:
the same sandboxed shell, limits and sampling as every other episode). The grader then runs
sandboxed (`run_sandboxed`, no network) in a scratch directory holding `workspace/` (a copy of the
finished workspace), `task/` (the task's directory) and `bench/` (the shared files), with cwd the
scratch directory and MASS_BENCH_WORKSPACE, MASS_BENCH_TASK, MASS_BENCH_DIR set to those paths. Its
score is the last stdout line: a number or a JSON object with a numeric "score". A grader that exits
non-zero, times out or prints no score gives score 0 and the error is kept in grade.json.

Store: `<run>/benchmark/<name>/gen-<g>/<task>/rep-<r>/{prompt.txt,workspace.tar.gz,trace.jsonl,
status.json,grade.json}` behind a Step manifest per rollout (a rerun does only what is missing), then
`<run>/benchmark/<name>/scores.{json,md}`. Replicate r of a task has the same seed in every
generation, so generations are compared on matched rollouts.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError

from mass_jobs.config.shared import ID_PATTERN, Closed
from mass_jobs.episodes.driver import Driver, Rollout
from mass_jobs.episodes.episode import EpisodeRequest
from mass_jobs.episodes.rollouts import episode_runner, rollout_outputs
from mass_jobs.run.generation_model import model_ref
from mass_jobs.sandbox.run import SandboxLimits, run_sandboxed
from mass_jobs.spec.load import SpecError, SpecIssue
from mass_jobs.store import Step, read_manifest

ServeModel = Callable[[int], AbstractContextManager[Any]]  # gen -> context manager yielding that generation's Endpoint


class BenchmarkError(SpecError):
    """A benchmark directory that cannot be used; `issues` names every problem (exit 2)."""

    def __init__(self, source: str, issues: list[SpecIssue]):
        self.source, self.issues = source, issues
        ValueError.__init__(
            self, f"{source}: invalid benchmark, {len(issues)} error(s):\n" + "\n".join(f"  {i}" for i in issues)
        )


class Grader(Closed):
    command: str = Field(min_length=1, description="Shell command run sandboxed after each rollout; prints the score.")
    timeout_s: float = Field(default=300, gt=0)
    network: bool = Field(
        default=False,
        description="Let the grader reach the network (an LLM-judged benchmark "
        "calling its judge endpoint); the rest of the sandbox stays.",
    )
    pass_env: list[str] = Field(
        default_factory=list,
        description="Host environment variables handed to the "
        "grader (e.g. a judge's API key); the sandbox passes none otherwise.",
    )


class BenchmarkFile(Closed):
    """benchmark.yaml"""

    name: str = Field(pattern=ID_PATTERN, max_length=40)
    grader: Grader
    replicates: int = Field(default=1, ge=1, description="Rollouts per task and generation.")
    description: str = ""


@dataclass
class BenchTask:
    id: str
    prompt: str
    files: dict[str, str]
    dir: Path


@dataclass
class Benchmark:
    name: str
    grader: Grader
    replicates: int
    root: Path
    tasks: list[BenchTask] = field(default_factory=list)

    def digest(self) -> str:
        """Content hash of everything a score depends on (prompts, seed files, grader files)."""
        h = hashlib.sha256()
        for p in sorted(self.root.rglob("*")):
            if p.is_file():
                h.update(p.relative_to(self.root).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
        return h.hexdigest()


def load_benchmark(root: str | Path) -> Benchmark:
    root = Path(root)
    issues: list[SpecIssue] = []
    meta_path = root / "benchmark.yaml"
    if not meta_path.is_file():
        raise BenchmarkError(str(root), [SpecIssue("benchmark.yaml", "expected a file, found none")])
    try:
        meta = BenchmarkFile.model_validate(yaml.safe_load(meta_path.read_text()) or {})
    except ValidationError as err:
        raise BenchmarkError(
            str(root), [SpecIssue("benchmark.yaml." + ".".join(map(str, e["loc"])), e["msg"]) for e in err.errors()]
        ) from None
    tasks = []
    task_dirs = sorted(p for p in (root / "tasks").iterdir() if p.is_dir()) if (root / "tasks").is_dir() else []
    if not task_dirs:
        issues.append(SpecIssue("tasks/", "expected at least one task directory tasks/<id>/prompt.md"))
    import re

    for d in task_dirs:
        where = f"tasks/{d.name}"
        if not re.fullmatch(ID_PATTERN, d.name):
            issues.append(SpecIssue(where, "expected a task id of lowercase letters, digits and dashes"))
            continue
        prompt = d / "prompt.md"
        if not prompt.is_file() or not prompt.read_text().strip():
            issues.append(SpecIssue(f"{where}/prompt.md", "expected a non-empty task prompt"))
            continue
        files = {}
        if (d / "files").is_dir():
            for f in sorted(p for p in (d / "files").rglob("*") if p.is_file()):
                try:
                    files[f.relative_to(d / "files").as_posix()] = f.read_text()
                except UnicodeDecodeError:
                    issues.append(SpecIssue(f"{where}/files/{f.relative_to(d / 'files')}", "expected a text file"))
        tasks.append(BenchTask(id=d.name, prompt=prompt.read_text().strip(), files=files, dir=d))
    if issues:
        raise BenchmarkError(str(root), issues)
    return Benchmark(name=meta.name, grader=meta.grader, replicates=meta.replicates, root=root, tasks=tasks)


# ---------------------------------------------------------------- grading


def parse_score(stdout: str) -> float:
    """The last non-empty stdout line: a number, or a JSON object with a numeric 'score'."""
    lines = [x.strip() for x in stdout.splitlines() if x.strip()]
    if not lines:
        raise ValueError("the grader printed nothing (expected a score on its last line)")
    last = lines[-1]
    try:
        value = json.loads(last)
    except json.JSONDecodeError:
        raise ValueError(f"last line {last[:80]!r} is neither a number nor JSON") from None
    if isinstance(value, dict):
        value = value.get("score")
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        raise ValueError(f"expected a finite number as the score, found {value!r}")
    return float(value)


def grade(bench: Benchmark, task: BenchTask, workspace: Path, limits) -> dict:
    """Run the grader sandboxed against a copy of the workspace; {"score", "error", "exit_code"}."""

    with tempfile.TemporaryDirectory(prefix="mass-grade-") as tmp:
        scratch = Path(tmp)
        shutil.copytree(workspace, scratch / "workspace", symlinks=True)
        shutil.copytree(task.dir, scratch / "task")
        shutil.copytree(
            bench.root, scratch / "bench", ignore=lambda d, names: ["tasks"] if Path(d) == bench.root else []
        )
        env = {
            "MASS_BENCH_WORKSPACE": str(scratch / "workspace"),
            "MASS_BENCH_TASK": str(scratch / "task"),
            "MASS_BENCH_DIR": str(scratch / "bench"),
            **{k: os.environ[k] for k in bench.grader.pass_env if k in os.environ},
        }
        sandbox = SandboxLimits.from_episode_limits(
            limits,
            timeout_s=bench.grader.timeout_s,
            cpu_s=max(1, int(bench.grader.timeout_s)),
            extra_env=env,
            isolate_network=not bench.grader.network,
        )
        res = run_sandboxed(bench.grader.command, scratch, sandbox)
    out = {"score": 0.0, "error": None, "exit_code": res.exit_code, "stderr_tail": res.stderr[-2000:]}
    if res.exit_code != 0 or res.timed_out:
        out["error"] = f"grader exited {res.exit_code}" + (f" ({res.killed_reason})" if res.killed_reason else "")
        return out
    try:
        out["score"] = parse_score(res.stdout)
    except ValueError as err:
        out["error"] = str(err)
    return out


# ---------------------------------------------------------------- rollouts and the table


def rollout_seed(bench: str, task: str, rep: int) -> int:
    """Independent of the generation: replicate r of a task is matched across generations."""
    return int.from_bytes(hashlib.sha256(f"bench/{bench}/{task}/{rep}".encode()).digest()[:4], "big") % (2**31)


def _step(ctx, bench: Benchmark, g: int, task: BenchTask, rep: int, digest: str):

    spec = ctx.spec
    inputs = {
        "model": model_ref(ctx, g),
        "benchmark": digest,
        "task": task.id,
        "replicate": rep,
        "harness": spec.execution.harness,
        "limits": spec.execution.limits.as_input(),
        "sampling": spec.model.sampling.model_dump(mode="json"),
    }
    prefix = ctx.benchmark_rollout(bench.name, g, task.id, rep)
    return prefix, Step(ctx.store, prefix, inputs, name=f"benchmark {bench.name} gen-{g} {task.id} rep-{rep}")


def run_one(ctx, bench: Benchmark, g: int, task: BenchTask, rep: int, run_episode, digest: str) -> dict:
    """One bare-prompt rollout of L_g + its grade, stored; skipped when already stored."""

    spec = ctx.spec
    prefix, step = _step(ctx, bench, g, task, rep, digest)
    if step.done:
        return read_manifest(ctx.store, prefix)["extra"]
    step.start()
    request = EpisodeRequest(prompt=task.prompt, files=dict(task.files), seed=rollout_seed(bench.name, task.id, rep))
    status = Driver(ctx).run(
        Rollout(prefix, request, task.id, f"rep-{rep}", g, first={"prompt.txt": task.prompt}), run_episode
    )
    with tempfile.TemporaryDirectory(prefix="mass-bench-ws-") as tmp:
        ctx.store.get_dir(ctx.benchmark_rollout(bench.name, g, task.id, rep, "workspace.tar.gz"), tmp)
        result = grade(bench, task, Path(tmp), spec.execution.limits)
    ctx.store.put_json(ctx.benchmark_rollout(bench.name, g, task.id, rep, "grade.json"), result)
    extra = {
        "score": result["score"],
        "grade_error": result["error"],
        "outcome": status.get("outcome"),
        "output_tokens": int((status.get("tokens") or {}).get("completion", 0)),
    }
    step.finish(
        rollout_outputs(ctx, prefix) + [ctx.benchmark_rollout(bench.name, g, task.id, rep, "grade.json")], extra=extra
    )
    return extra


def score_table(bench: Benchmark, results: dict[int, list[dict]]) -> dict:
    """Per generation: mean score, per-task means, output tokens, score per 1k output tokens and its
    ratio to the first generation listed (the paper's "score per output token" comparison)."""
    rows = []
    for g in sorted(results):
        rs = results[g]
        total, tokens = sum(r["score"] for r in rs), sum(r["output_tokens"] for r in rs)
        per_task: dict[str, list[float]] = {}
        for r in rs:
            per_task.setdefault(r["task"], []).append(r["score"])
        rows.append(
            {
                "generation": g,
                "rollouts": len(rs),
                "mean_score": round(total / len(rs), 6) if rs else None,
                "per_task": {t: round(sum(v) / len(v), 6) for t, v in sorted(per_task.items())},
                "output_tokens": tokens,
                "grader_errors": sum(1 for r in rs if r["grade_error"]),
                "score_per_1k_output_tokens": round(1000 * total / tokens, 6) if tokens else None,
            }
        )
    first = rows[0]["score_per_1k_output_tokens"] if rows else None
    for row in rows:
        x = row["score_per_1k_output_tokens"]
        row["efficiency_vs_first"] = round(x / first, 6) if x is not None and first else None
    return {
        "benchmark": bench.name,
        "tasks": [t.id for t in bench.tasks],
        "replicates": bench.replicates,
        "generations": rows,
    }


def render_table(table: dict) -> str:
    fmt = lambda x: "–" if x is None else (f"{x:,}" if isinstance(x, int) else f"{x:.4g}")  # noqa: E731
    ratio = lambda x: "–" if x is None else f"{x:.3g}x"  # noqa: E731
    lines = [
        f"# Benchmark `{table['benchmark']}`",
        "",
        f"{len(table['tasks'])} tasks x {table['replicates']} bare-prompt rollouts per generation.",
        "",
        "| generation | rollouts | mean score | output tokens | score / 1k output tokens | vs first | grader errors |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in table["generations"]:
        lines.append(
            f"| L{r['generation']} | {r['rollouts']} | {fmt(r['mean_score'])} | {fmt(r['output_tokens'])} "
            f"| {fmt(r['score_per_1k_output_tokens'])} | {ratio(r['efficiency_vs_first'])} | {r['grader_errors']} |"
        )
    lines += [
        "",
        "| task | " + " | ".join(f"L{r['generation']}" for r in table["generations"]) + " |",
        "|---|" + "---:|" * len(table["generations"]),
    ]
    for t in table["tasks"]:
        lines.append(f"| {t} | " + " | ".join(fmt(r["per_task"].get(t)) for r in table["generations"]) + " |")
    return "\n".join(lines) + "\n"


def run_benchmark(
    ctx, bench: Benchmark, generations: list[int], serve_model: ServeModel, replicates: int | None = None
) -> dict:
    """Roll out and grade every task for each generation (serving a generation only when some of its
    rollouts are missing); store and return the score table."""

    reps = replicates or bench.replicates
    bench.replicates = reps
    digest = bench.digest()
    results: dict[int, list[dict]] = {}
    for g in generations:
        jobs = [(t, r) for t in bench.tasks for r in range(reps)]
        with contextlib.ExitStack() as stack:
            run_episode = None
            results[g] = []
            for t, r in jobs:
                if run_episode is None and not _step(ctx, bench, g, t, r, digest)[1].done:
                    # L_g itself: roles.executor never stands in for the generation being measured
                    run_episode = episode_runner(ctx.spec, stack.enter_context(serve_model(g)), executor_role=False)
                results[g].append({"task": t.id, **run_one(ctx, bench, g, t, r, run_episode, digest)})
    table = score_table(bench, results)
    ctx.store.put_json(ctx.benchmark(bench.name, "scores.json"), table)
    ctx.store.put_bytes(ctx.benchmark(bench.name, "scores.md"), render_table(table).encode())
    return table
