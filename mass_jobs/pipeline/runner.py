"""`mass run SPEC`: the local chain L0 -> L_N, resumable anywhere, derived from `mass_jobs.pipeline.table`.

Per generation g the steps of `PIPELINE` run in order (search -> collect -> guard -> rank -> render
-> train (torchrun subprocess) -> select -> merge (-> L_{g+1}) -> evaluate L_{g+1}), then the run's
steps (report). A step whose done-check (its core's input hash) holds is skipped, so killing the
run at any point and rerunning redoes only unfinished work (training resumes from its newest
checkpoint). Steps that call the generation's model share one lazily started server, stopped after
the last of them. A step without an in-process adapter here runs its CLI entry as a subprocess (a
`trainer` pod under torchrun), exactly as an Argo container would. A small run-state record at
`<run>/run-state.json` says what is running or failed; `mass status SPEC` reads it with the store.

Test tasks never reach search, collection, ranking, rendering, training or selection: the runner
hands only `train_tasks(spec)` to those steps, and the train core checks the stored rank files and
SFT windows (`split_guard.check_no_test_leak`) before it trains, whatever runs it. The one opt-in exception is checkpoint selection by
the judge panel (`sft.panel.tasks`, docs/composition.md), which runs the held-out tasks it names.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from mass_jobs.config.errors import StepFailed
from mass_jobs.config.run_spec import RunSpec
from mass_jobs.config.task_spec import Task
from mass_jobs.pipeline import handlers
from mass_jobs.pipeline import nodes as N
from mass_jobs.pipeline import table as P
from mass_jobs.pipeline.progress import Display, estimate, untimed
from mass_jobs.pipeline.run_lease import RunLease
from mass_jobs.run.base_model import local_fitness_issues
from mass_jobs.run.context import RunContext
from mass_jobs.run.generation_model import generation_servers
from mass_jobs.run.sandboxing import apply_sandbox, sandbox_issues
from mass_jobs.spec.load import SpecError, load_spec
from mass_jobs.spec.overrides import SpecSource, spec_words
from mass_jobs.steps.split_guard import SplitLeak, check_no_test_leak  # noqa: F401 (the runner's API too)
from mass_jobs.store import open_store, read_manifest
from mass_jobs.store.lease import pid_alive


class RunError(StepFailed):
    def __init__(self, message: str, log: Path | None = None):
        super().__init__(message)
        self.log = log  # the subprocess log holding the failure's whole output


def train_tasks(spec: RunSpec) -> list[Task]:
    """The only tasks that may feed search, collection, ranking, SFT and checkpoint selection."""
    return spec.train_tasks()


# ---------------------------------------------------------------- run state


@dataclass
class RunState:
    """`<run>/run-state.json`: what the runner is doing now, and the last failure."""

    ctx: RunContext
    doc: dict = field(default_factory=dict)

    @property
    def key(self) -> str:
        return self.ctx.run_state()

    def load(self) -> dict:
        self.doc = self.ctx.store.get_json(self.key) if self.ctx.store.exists(self.key) else {}
        return self.doc

    def set(self, **kw) -> None:
        self.doc.update(kw, updated_at=time.time(), pid=os.getpid())
        self.ctx.store.put_json(self.key, self.doc)


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


# ---------------------------------------------------------------- the runner


class Runner:
    def __init__(
        self,
        spec_path: str,
        spec: RunSpec,
        store,
        *,
        work_dir: Path,
        progress: bool = True,
        python: str = sys.executable,
        on_step: Callable[[str], None] | None = None,
        pipeline=None,
        handler: str = "in-process",
        until: str | None = None,
    ):
        self.spec_path, self.spec = spec_path if isinstance(spec_path, str | SpecSource) else str(spec_path), spec
        self.ctx = RunContext(spec, store)
        self.pipeline = P.steps(pipeline)
        self.work_root = Path(work_dir).resolve()
        self.work = self.ctx.work_dir(self.work_root)
        self.work.mkdir(parents=True, exist_ok=True)
        self.state = RunState(self.ctx)
        self.compiled = N.compile_plan(self.spec_path, spec, self.pipeline)
        self.display = Display([p.step.name for p in self.plan()], enabled=progress)
        self.python = python
        self.on_step = on_step  # test hook: called before each step starts
        self.lazy: LazyServer | None = None
        self.handler = handlers.handler(handler)
        self.until = (
            stop_after(until, [x for g in range(spec.generations) for x in self.compiled.generation(g)])
            if until
            else None
        )

    def plan(self) -> list[N.Group]:
        """The steps of every generation, then the run's, in the order this runner executes them
        (each with its nodes: one per training task for a per-task step)."""
        return self.compiled.groups()

    # ------------------------------------------------------------ helpers
    def env(self) -> dict:
        # One writable work dir for every entry (their --work-dir defaults read it).
        return {**os.environ, "PYTHONUNBUFFERED": "1", "MASS_WORK_DIR": str(self.work_root)}

    def mass(self, *args: str, env: dict | None = None, check: bool = True, label: str | None = None) -> bool:
        """One CLI entry as a subprocess (the same entries Argo containers call); False when it failed
        and `check` is off."""
        cmd = [self.python, "-m", "mass_jobs.commands.cli", *args]
        return self._subprocess(cmd, label=label or args[0], env=env, check=check)

    def torchrun(self, argv) -> None:
        """A trainer node: its CLI entry under torchrun, one process per replica this machine holds."""
        nproc = max(1, min(self.spec.sft.replicas, os.cpu_count() or 1))
        self._subprocess(
            [
                self.python,
                "-m",
                "torch.distributed.run",
                "--standalone",
                f"--nproc_per_node={nproc}",
                "-m",
                "mass_jobs.commands.cli",
                *argv,
                "--quiet",
            ],
            label=argv[0],
        )

    def _subprocess(self, cmd: list[str], label: str, env: dict | None = None, check: bool = True) -> bool:
        self.work.mkdir(parents=True, exist_ok=True)
        log = self.work / f"{label}.log"
        with open(log, "ab") as f:
            proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env if env is not None else self.env())
        if proc.returncode != 0 and check:
            tail = log.read_bytes()[-3000:].decode("utf-8", errors="replace")
            raise RunError(f"`{' '.join(cmd[2:])}` exited {proc.returncode}; log {log}:\n{tail}", log=log)
        return proc.returncode == 0

    def services(self) -> handlers.Services:
        """What a handler gets of this run (pipeline/handlers.py): the current generation's lazily
        served model, servers, subprocesses, the work dir and the progress display."""
        return handlers.Services(
            ctx=self.ctx,
            endpoint=self.lazy.endpoint if self.lazy else _no_model,
            servers=self.servers,
            mass=self.mass,
            torchrun=self.torchrun,
            env=self.env,
            work=self.work,
            note=self.display.note,
        )

    def servers(self):
        """(serve_generation, serve_judge): the spec's serving backend per use, logs in the work dir."""
        return generation_servers(self.ctx, cache_root=self.work / "models", log_dir=self.work)

    def _run_step(self, g: int, name: str, fn: Callable[[], bool]) -> None:
        """fn() does the step and returns True when it was already done (skipped)."""
        label = f"L{g} {name}"
        if self.on_step:
            self.on_step(f"{g}:{name}")
        self.display.step(label)
        self.state.set(status="running", current={"gen": g, "step": name, "started_at": time.time()}, failed=None)
        started = time.monotonic()
        try:
            skipped = fn()
        except KeyboardInterrupt:
            # Ctrl-C stopped the step; nothing in it failed: `mass status` says interrupted, as after a kill
            self.state.set(status="interrupted")
            raise
        except BaseException as e:
            self.state.set(
                status="failed",
                current=None,
                failed={
                    "gen": g,
                    "step": name,
                    "error": f"{type(e).__name__}: {e}"[:2000],
                    "logs": self.logs_of(g, e),
                    "at": time.time(),
                },
            )
            raise
        seconds = time.monotonic() - started
        self.display.done(label, skipped, seconds)
        # the run's own timings: `mass status` shows them and its ETA from them
        timings = self.state.doc.setdefault("timings", {})
        timings[f"{g}:{name}"] = {"seconds": round(seconds, 3), "skipped": skipped}
        self.state.set()

    def logs_of(self, g: int, err: BaseException) -> list[str]:
        """Where a failed step's output is: its subprocess log, else the generation's model-server log
        and the work dir (in-process steps write their errors to the run's own output)."""
        if isinstance(err, RunError) and err.log:
            return [str(err.log)]
        serve_log = self.work / f"serve-gen-{g}.log"
        return [str(p) for p in (serve_log, self.work) if p.exists()]

    @contextlib.contextmanager
    def serve(self, g: int):
        """L_g's endpoint for the inner loop, under the name the cluster's InferenceService has, served
        by execution.serving's backend. `external` serves nothing: every role has its own endpoint."""

        if self.spec.execution.serving == "external":
            raise RuntimeError(
                "execution.serving is 'external': the inner loop uses roles.<role> endpoints and starts no model server"
            )
        serve_generation, _ = self.servers()
        with serve_generation(g) as endpoint:
            yield endpoint

    def execute_step(self, s: P.StepDef, g: int) -> bool:
        """Run one step of one generation, its plan nodes through the handler, unless its done-check
        holds; True when it was skipped."""
        group = next((x for x in self.compiled.groups() if x.step is s and x.gen == g), None)
        if group is None:
            raise ValueError(f"step {s.name}: no nodes at generation {g} in the plan")
        if all(node.done(self.ctx) for node in group.nodes):
            return True
        self.handler.run(group, self.services())
        return False

    # ------------------------------------------------------------ the whole run
    def run(self) -> dict:

        self.ctx.claim_spec()  # a changed spec on an existing run is refused (SpecError, exit 2)
        with RunLease(self.ctx):  # one local writer per run: a second one exits 2 naming this one
            return self._run_all()

    def _run_all(self) -> dict:
        self.state.load()
        self.state.set(status="running", spec=spec_words(self.spec_path), failed=None)
        with self.display:
            for g in range(self.spec.generations):
                groups = self.compiled.generation(g)
                last_model = max((i for i, x in enumerate(groups) if x.step.model), default=-1)
                with LazyServer(lambda g=g: self.serve(g)) as self.lazy:
                    for i, x in enumerate(groups):
                        self._run_step(g, x.step.name, lambda x=x: self.execute_step(x.step, x.gen))
                        if (g, x.step.name) == self.until:
                            return self._stopped()
                        if i == last_model:
                            self.lazy.__exit__(None, None, None)  # rank is its last user: free it for training
            for x in self.compiled.run_groups():
                self._run_step(x.gen, x.step.name, lambda x=x: self.execute_step(x.step, x.gen))
        self.state.set(status="done", current=None, failed=None)
        return read_manifest(self.ctx.store, self.ctx.report())

    def _stopped(self) -> dict:
        """--until's step is done: the run stops there, resumable (`mass status` shows the rest pending)."""
        g, name = self.until
        self.state.set(status="stopped", current=None, failed=None, stopped_after={"gen": g, "step": name})
        return {"stopped_after": {"gen": g, "step": name}}


def _no_model():
    raise RuntimeError("the run's steps of no generation call a generation's model")


def stop_after(until: str, groups) -> tuple[int, str]:
    """`G:STEP` (e.g. 0:render) as (generation, step), one of `groups` (the plan's generation steps)."""
    valid = [f"{x.gen}:{x.step.name}" for x in groups]
    gen, _, name = until.partition(":")
    if not gen.isdigit() or f"{int(gen)}:{name}" not in valid:
        from mass_jobs.spec.issues import SpecError, SpecIssue

        raise SpecError(
            "mass run",
            [SpecIssue("--until", f"expected GEN:STEP, one of {', '.join(valid)}; found {until!r}")],
            what="command-line arguments",
        )
    return int(gen), name


def run(
    spec_path: str,
    *,
    work_dir: Path | None = None,
    progress: bool = True,
    on_step=None,
    handler: str = "in-process",
    until: str | None = None,
    ctx: RunContext | None = None,
    pipeline=None,
) -> dict:
    """Run L0 -> L_N (resuming whatever is stored), or only up to `until` (`G:STEP`): then the
    manifest-like {"stopped_after": {"gen", "step"}}. The spec is loaded and its store opened here,
    unless the caller did (`ctx`); the runner claims it once, recording it for a new run."""

    spec = ctx.spec if ctx is not None else load_spec(spec_path)
    # a template without tools would train on one-turn episodes; without bwrap nothing model-written may run
    unfit = local_fitness_issues(spec) + sandbox_issues(spec)
    if unfit:
        raise SpecError(spec_path, unfit)
    apply_sandbox(spec)  # execution.sandbox for this process and the episodes it starts
    store = ctx.store if ctx is not None else open_store(spec.store)
    return Runner(
        spec_path,
        spec,
        store,
        work_dir=Path(work_dir or os.environ.get("MASS_WORK_DIR", ".mass-work")),
        progress=progress,
        on_step=on_step,
        handler=handler,
        until=until,
        pipeline=pipeline,
    ).run()


# ---------------------------------------------------------------- status


def step_status(ctx: RunContext, pipeline=None) -> list[dict]:
    """One row per (generation, step): the store's done / pending (`pipeline.table`, the same for
    any executor), with the local runner's running / interrupted / failed and its step timings
    (`seconds`, None when this runner did not time it) from its run-state."""
    state = RunState(ctx).load()
    timings = state.get("timings") or {}
    rows = N.table(ctx, pipeline)
    for r in rows:
        r["status"] = _status(state, r["gen"], r["step"], r["status"] == "done")
        t = timings.get(f"{r['gen']}:{r['step']}") or {}
        r["seconds"] = t.get("seconds") if r["status"] == "done" else None
    return rows


def progress_summary(rows: list[dict], state: dict, now: float | None = None) -> dict:
    """Steps done / total and an ETA from the run's own timings (`progress.estimate`: each step left
    at the mean of the same step's timings, skipped ones costing nothing; None while a step left has
    none), less the running step's elapsed time. `overrun`: the running step is past its mean, so
    the ETA is a floor."""

    done = sum(r["status"] == "done" for r in rows)
    timed: dict[str, list[float]] = {}
    for key, t in (state.get("timings") or {}).items():
        if not t.get("skipped"):
            timed.setdefault(key.split(":", 1)[-1], []).append(t["seconds"])
    left = [r.get("step", "") for r in rows if r["status"] != "done"]
    eta, overrun = (0.0 if not left else estimate(left, timed)), False
    current = state.get("current") or {}
    if eta and state.get("status") == "running" and current.get("started_at") and current.get("step") in timed:
        mean = sum(timed[current["step"]]) / len(timed[current["step"]])
        elapsed = (now or time.time()) - current["started_at"]
        overrun = elapsed > mean
        eta -= min(elapsed, mean)
    return {
        "done": done,
        "total": len(rows),
        "eta_s": eta,
        "timed_steps": sum(map(len, timed.values())),
        "untimed_left": untimed(left, timed),
        "overrun": overrun,
    }


def _status(state: dict, g: int, name: str, done: bool) -> str:
    failed, current = state.get("failed") or {}, state.get("current") or {}
    if failed.get("gen") == g and failed.get("step") == name:
        return "failed"
    if state.get("status") in ("running", "interrupted") and current.get("gen") == g and current.get("step") == name:
        return "running" if state["status"] == "running" and _alive(state.get("pid")) else "interrupted"
    return "done" if done else "pending"


def _alive(pid) -> bool:

    return pid_alive(pid)
