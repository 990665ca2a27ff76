"""`mass run SPEC`: the local chain L0 -> L_N, resumable anywhere.

Per generation g: serve L_g -> search (each train task) -> collect -> guard -> rank -> stop serving
-> render -> train (torchrun subprocess) -> select -> merge (-> L_{g+1}) -> evaluate L_{g+1} -> report.
Every step sits behind its Step manifest, so killing the run at any point and rerunning redoes
only unfinished work (training resumes from its newest checkpoint). A small run-state record at
`<run>/run-state.json` says what is running or failed; `mass status SPEC` reads it with the manifests.

Test tasks never reach search, collection, ranking, rendering, training or selection: the runner
hands only `train_tasks(spec)` to those steps and checks the stored rank files and SFT windows
(`check_no_test_leak`) before training starts.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from mass_jobs.context import RunContext
from mass_jobs.errors import StepFailed
from mass_jobs.models import RunSpec, Task

STEPS = ("search", "collect", "guard", "rank", "render", "train", "select", "merge", "evaluate")


class RunError(StepFailed):
    pass


class SplitLeak(RunError):
    """A test task reached a training input (never allowed)."""


def train_tasks(spec: RunSpec) -> list[Task]:
    """The only tasks that may feed search, collection, ranking, SFT and checkpoint selection."""
    tasks = [t for t in spec.resolved_tasks() if t.split == "train"]
    assert all(t.split == "train" for t in tasks)
    return tasks


def check_no_test_leak(ctx: RunContext, gen: int) -> dict:
    """Raise SplitLeak when a test task appears in a rank file, a collection or an SFT window."""
    test_ids = {t.id for t in ctx.spec.resolved_tasks() if t.split == "test"}
    store = ctx.store
    found = []
    for t in sorted(test_ids):
        for key in (ctx.rank(gen, t), ctx.guard(gen, t)):
            if store.exists(key):
                found.append(key)
        if store.list(ctx.collect(gen, t) + "/"):
            found.append(ctx.collect(gen, t) + "/")
    windows = 0
    for split in ("train", "val"):
        key = f"{ctx.sft(gen)}/{split}.jsonl"
        if not store.exists(key):
            continue
        for n, line in enumerate(store.get_bytes(key).decode("utf-8").splitlines()):
            if not line.strip():
                continue
            windows += 1
            task = json.loads(line).get("task")
            if task in test_ids or task is None:
                found.append(f"{key} line {n + 1}: task {task!r}")
    if found:
        raise SplitLeak(f"generation {gen}: test tasks reached training inputs: {found[:10]}")
    return {"windows_checked": windows, "test_tasks": sorted(test_ids)}


def merged(ctx: RunContext, g: int) -> bool:
    """L_{g+1} is complete: the merge manifest, written after every model object, exists."""
    from mass_jobs.store import read_manifest

    return read_manifest(ctx.store, f"{ctx.gen(g)}/merge") is not None


# ---------------------------------------------------------------- run state


@dataclass
class RunState:
    """`<run>/run-state.json`: what the runner is doing now, and the last failure."""

    ctx: RunContext
    doc: dict = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.ctx.run}/run-state.json"

    def load(self) -> dict:
        self.doc = self.ctx.store.get_json(self.key) if self.ctx.store.exists(self.key) else {}
        return self.doc

    def set(self, **kw) -> None:
        self.doc.update(kw, updated_at=time.time(), pid=os.getpid())
        self.ctx.store.put_json(self.key, self.doc)


# ---------------------------------------------------------------- progress


class Display:
    """Rich progress: one bar over the run's steps, one line for the current step's tasks/episodes."""

    def __init__(self, total: int, enabled: bool = True):
        self.enabled = enabled
        self.console = None
        if enabled:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.console = Console(stderr=True)
            self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                     TimeElapsedColumn(), console=self.console, transient=False)
            self.steps = self.progress.add_task("steps", total=total)
            self.detail = self.progress.add_task("", total=None)

    def __enter__(self):
        if self.enabled:
            self.progress.start()
        return self

    def __exit__(self, *exc):
        if self.enabled:
            self.progress.update(self.detail, visible=False)  # no stale task/episode line at the end
            self.progress.stop()

    def step(self, label: str) -> None:
        if self.enabled:
            self.progress.update(self.steps, description=f"[bold]{label}")
            self.progress.update(self.detail, description="", completed=0, total=None)

    def done(self, label: str, skipped: bool, seconds: float) -> None:
        if self.enabled:
            self.progress.advance(self.steps)
            self.console.print(f"{'skip' if skipped else 'done'} {label} ({seconds:.1f}s)")

    def note(self, text: str, completed: int | None = None, total: int | None = None) -> None:
        if self.enabled:
            self.progress.update(self.detail, description=text, completed=completed or 0, total=total)


# ---------------------------------------------------------------- lazy serving


class LazyServer:
    """Starts the model server on first use (thread-safe) and stops it on exit, if it ever started."""

    def __init__(self, make):
        import threading

        self._make, self._lock = make, threading.Lock()
        self._stack = contextlib.ExitStack()
        self._endpoint = None
        self.started = 0

    def endpoint(self):
        with self._lock:
            if self._endpoint is None:
                self._endpoint = self._stack.enter_context(self._make())
                self.started += 1
            return self._endpoint

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._stack.close()


class LazyClient:
    """A chat client made on the first call, so a fully stored step never serves a model."""

    def __init__(self, make):
        self._make, self._client = make, None

    def chat(self, *args, **kwargs):
        if self._client is None:
            self._client = self._make()
        return self._client.chat(*args, **kwargs)


# ---------------------------------------------------------------- the runner


class Runner:
    def __init__(self, spec_path: str, spec: RunSpec, store, *, work_dir: Path, progress: bool = True,
                 python: str = sys.executable, on_step: Callable[[str], None] | None = None):
        self.spec_path, self.spec = str(spec_path), spec
        self.ctx = RunContext(spec, store)
        self.work = Path(work_dir).resolve() / spec.name
        self.work.mkdir(parents=True, exist_ok=True)
        self.state = RunState(self.ctx)
        self.display = Display(total=len(STEPS) * spec.generations + 1, enabled=progress)
        self.python = python
        self.on_step = on_step  # test hook: called before each step starts

    # ------------------------------------------------------------ helpers
    def _mass(self, *args: str) -> None:
        """One CLI entry as a subprocess (the same entries Argo containers call)."""
        cmd = [self.python, "-m", "mass_jobs.cli", *args]
        self._subprocess(cmd, label=args[0])

    def _subprocess(self, cmd: list[str], label: str) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        log = self.work / f"{label}.log"
        with open(log, "ab") as f:
            proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        if proc.returncode != 0:
            tail = log.read_bytes()[-3000:].decode("utf-8", errors="replace")
            raise RunError(f"`{' '.join(cmd[2:])}` exited {proc.returncode}; log {log}:\n{tail}")

    def _run_step(self, g: int, name: str, fn: Callable[[], bool]) -> None:
        """fn() does the step and returns True when it was already done (skipped)."""
        label = f"L{g} {name}"
        if self.on_step:
            self.on_step(f"{g}:{name}")
        self.display.step(label)
        self.state.set(status="running", current={"gen": g, "step": name}, failed=None)
        started = time.monotonic()
        try:
            skipped = fn()
        except BaseException as e:
            self.state.set(status="failed", current=None, failed={"gen": g, "step": name,
                                                                  "error": f"{type(e).__name__}: {e}"[:2000]})
            raise
        self.display.done(label, skipped, time.monotonic() - started)

    def serve(self, g: int):
        from mass_jobs.steps.evaluate import default_servers

        serve_model, _ = default_servers(self.ctx, cache_root=self.work / "models", log_dir=self.work)
        return serve_model(g)

    # ------------------------------------------------------------ the steps of one generation
    def inner_loop(self, g: int) -> None:
        """search -> collect -> guard -> rank on train tasks. The step cores skip what their manifests
        say is done; L_g is served lazily, on the first model call, and once for all four steps."""
        from mass_jobs.steps.collect import run_collect
        from mass_jobs.steps.evaluate import client_for
        from mass_jobs.steps.guard import run_guard
        from mass_jobs.steps.rank import run_rank
        from mass_jobs.steps.search import episode_executor, run_search

        ctx, spec, tasks = self.ctx, self.spec, train_tasks(self.spec)
        with LazyServer(lambda: self.serve(g)) as lazy:
            client = LazyClient(lambda: client_for(spec, lazy.endpoint()))

            import threading

            lock, now = threading.Lock(), {"label": "", "episodes": 0, "of": None}

            def execute(*args):
                status = episode_executor(spec, lazy.endpoint())(*args)
                with lock:  # collect runs episodes concurrently
                    now["episodes"] += 1
                    self.display.note(f"{now['label']}: episode {now['episodes']}", now["episodes"], now["of"])
                return status

            # episodes a task may still run: search = reference + initial elite + one per iteration
            episodes_per_task = {"search": spec.search.iterations + 2, "collect": spec.collection.episodes}

            def each(name: str, fn) -> Callable[[], bool]:
                def go() -> bool:
                    stored = all(inner_done(ctx, g, name, t.id) for t in tasks)
                    for i, t in enumerate(tasks):
                        now.update(label=f"{name} task {i + 1}/{len(tasks)} {t.id}", episodes=0,
                                   of=episodes_per_task.get(name))
                        self.display.note(now["label"], i, len(tasks))
                        fn(t.id)
                    return stored
                return go

            self._run_step(g, "search", each("search", lambda t: run_search(ctx, g, t, client, execute)))
            self._run_step(g, "collect", each("collect", lambda t: run_collect(ctx, g, t, execute)))
            self._run_step(g, "guard", each("guard", lambda t: run_guard(ctx, g, t)))
            self._run_step(g, "rank", each("rank", lambda t: run_rank(ctx, g, t, client)))

    def render(self, g: int) -> bool:
        from mass_jobs.store import read_manifest

        if read_manifest(self.ctx.store, self.ctx.sft(g)) is not None:
            return True
        self._mass("render", "sft", "--spec", self.spec_path, "--gen", str(g), "--work-dir", str(self.work / "cache"))
        return False

    def train(self, g: int) -> bool:
        from mass_jobs.store import read_manifest

        check_no_test_leak(self.ctx, g)
        if read_manifest(self.ctx.store, self.ctx.train(g)) is not None:
            return True
        nproc = max(1, min(self.spec.sft.replicas, os.cpu_count() or 1))
        cmd = [self.python, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
               "-m", "mass_jobs.cli", "train", "--spec", self.spec_path, "--gen", str(g), "--resume", "--quiet",
               "--work-dir", str(self.work / "train")]
        self._subprocess(cmd, label="train")
        return False

    def select(self, g: int) -> bool:
        if self.ctx.store.exists(self.ctx.select(g)):
            return True
        self._mass("select", "--spec", self.spec_path, "--gen", str(g))
        return False

    def merge(self, g: int) -> bool:
        if merged(self.ctx, g):
            return True
        self._mass("merge", "--spec", self.spec_path, "--gen", str(g))
        return False

    def evaluate(self, g: int) -> bool:
        from mass_jobs.steps.evaluate import default_servers, evaluate
        from mass_jobs.store import read_manifest

        gen = g + 1
        counts = {"rollout": 0, "verdict": 0}
        total_rollouts = len(self.spec.resolved_tasks()) * self.spec.evaluation.rollouts_per_task

        def progress(kind: str, rec: dict) -> None:
            counts[kind] += 1
            if kind == "rollout":
                self.display.note(f"bare-prompt rollouts L{rec['gen']} {rec['task']} rep {rec['replicate']}",
                                  counts["rollout"], total_rollouts)
            else:
                self.display.note(f"verdicts: {counts['verdict']} ({rec['judge']})")

        serve_model, serve_judge = default_servers(self.ctx, cache_root=self.work / "models", log_dir=self.work)
        before = read_manifest(self.ctx.store, self.ctx.eval(gen))
        with contextlib.ExitStack() as servers:
            started: dict[int, object] = {}

            @contextlib.contextmanager
            def serve_once(h: int):
                # rollouts and self-verdicts of one generation share a server (each start costs seconds)
                if h not in started:
                    started[h] = servers.enter_context(serve_model(h))
                yield started[h]

            after = evaluate(self.ctx, gen, serve_once, serve_judge, progress=progress)
        return before is not None and before == after

    def report(self) -> bool:
        from mass_jobs.steps.report import write_report

        write_report(self.ctx)
        return False

    # ------------------------------------------------------------ the whole run
    def run(self) -> dict:
        from mass_jobs.store import read_manifest

        self.ctx.store.put_json(self.ctx.spec_key(), self.spec.model_dump(mode="json"))
        self.state.load()
        self.state.set(status="running", spec=self.spec_path, failed=None)
        with self.display:
            for g in range(self.spec.generations):
                self.inner_loop(g)
                for name in ("render", "train", "select", "merge", "evaluate"):
                    self._run_step(g, name, lambda name=name: getattr(self, name)(g))
            self._run_step(self.spec.generations, "report", self.report)
        self.state.set(status="done", current=None, failed=None)
        return read_manifest(self.ctx.store, self.ctx.report())


def run(spec_path: str, *, work_dir: Path | None = None, progress: bool = True, on_step=None) -> dict:
    """Load the spec, open its store and run L0 -> L_N (resuming whatever is stored)."""
    from mass_jobs.spec import load_spec
    from mass_jobs.store import open_store

    spec = load_spec(spec_path)
    store = open_store(spec.store)
    return Runner(spec_path, spec, store, work_dir=Path(work_dir or ".mass-work"), progress=progress,
                  on_step=on_step).run()


# ---------------------------------------------------------------- status


def inner_done(ctx: RunContext, g: int, step: str, task: str) -> bool:
    """The inner-loop step `step` of generation g is stored for `task` (search, collect, guard, rank)."""
    store = ctx.store
    if step == "search":
        key = ctx.search_state(g, task)
        return store.exists(key) and bool(store.get_json(key).get("done"))
    key = {"collect": ctx.collect_summary, "guard": ctx.guard, "rank": ctx.rank}[step](g, task)
    return store.exists(key)


def step_status(ctx: RunContext) -> list[dict]:
    """One row per (generation, step): done / running / failed / pending, from outputs and run-state."""
    from mass_jobs.store import read_manifest

    store, spec = ctx.store, ctx.spec
    state = RunState(ctx).load()
    tasks = [t.id for t in train_tasks(spec)]
    rows = []

    def task_count(pred) -> str:
        return f"{sum(1 for t in tasks if pred(t))}/{len(tasks)} tasks"

    for g in range(spec.generations):
        checks = {name: (all(inner_done(ctx, g, name, t) for t in tasks),
                         task_count(lambda t, name=name: inner_done(ctx, g, name, t)))
                  for name in ("search", "collect", "guard", "rank")}
        checks.update({
            "render": (read_manifest(store, ctx.sft(g)) is not None, ""),
            "train": (read_manifest(store, ctx.train(g)) is not None,
                      f"{len([k for k in store.list(ctx.train(g) + '/step-') if k.count('/') == 3])} checkpoints"),
            "select": (store.exists(ctx.select(g)), ""),
            "merge": (merged(ctx, g), ""),
            "evaluate": (read_manifest(store, ctx.eval(g + 1)) is not None,
                         f"{len(store.list(f'{ctx.run}/eval/verdicts/gen-{g + 1}-vs-'))} verdicts"),
        })
        for name in STEPS:
            done, detail = checks[name]
            rows.append({"gen": g, "step": name, "status": _status(state, g, name, done), "detail": detail})
    rows.append({"gen": spec.generations, "step": "report",
                 "status": _status(state, spec.generations, "report", read_manifest(store, ctx.report()) is not None),
                 "detail": ""})
    return rows


def _status(state: dict, g: int, name: str, done: bool) -> str:
    failed, current = state.get("failed") or {}, state.get("current") or {}
    if failed.get("gen") == g and failed.get("step") == name:
        return "failed"
    if state.get("status") == "running" and current.get("gen") == g and current.get("step") == name:
        return "running" if _alive(state.get("pid")) else "interrupted"
    return "done" if done else "pending"


def _alive(pid) -> bool:
    if not isinstance(pid, int) or pid <= 0:  # 0 / -1 would address process groups, not the runner
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
