"""Store keys of one run: the single place that spells the layout of docs/architecture.md.

Steps never format keys themselves; they ask a `RunContext`, so a layout change is one edit here.
The Argo compiler asks the same methods with template placeholders for arguments
(`RunContext.template("{{inputs.parameters.store-prefix}}")`), so artifact keys of agent pods
follow the same layout.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mass_jobs.config.run_spec import RunSpec
from mass_jobs.spec.load import SpecError, SpecIssue


@dataclass(frozen=True)
class RunContext:
    spec: RunSpec | None
    store: Any  # mass_jobs.store.Store (file:// or s3://)
    prefix: str | None = None  # the run's key prefix when not the spec's name (Argo placeholders)

    @classmethod
    def template(cls, run_prefix: str) -> RunContext:
        """Keys only, for a run whose prefix (and arguments) are placeholders filled in later."""
        return cls(None, None, prefix=run_prefix)

    @property
    def run(self) -> str:
        return self.prefix if self.prefix is not None else self.spec.name

    def spec_key(self) -> str:
        return f"{self.run}/spec.json"

    def writer(self) -> str:
        """The run's writer lease (mass_jobs/pipeline/run_lease.py): who runs it locally now."""
        return f"{self.run}/_writer.json"

    def run_state(self) -> str:
        """What the local runner is doing now and its last failure (`mass status` reads it)."""
        return f"{self.run}/run-state.json"

    def gen(self, g: int | str) -> str:
        if isinstance(g, int) and g < 0:
            raise ValueError(f"generation must be >= 0, got {g}")
        return f"{self.run}/gen-{g}"

    def model(self, g: int) -> str:
        return f"{self.gen(g)}/model"

    def model_fp8(self, g: int) -> str:
        return f"{self.gen(g)}/model-fp8"

    def serving(self, g: int) -> str:
        """Which weights served generation g and why (mass_jobs.serving.precision)."""
        return f"{self.gen(g)}/serving.json"

    def served_model(self, g) -> str:
        """The name L_g is served under while the inner loop calls it (traces record it)."""
        return served_model_name(self.spec.name if self.spec is not None else self.run, g)

    # ------------------------------------------------------------ search
    def search_root(self, g: int) -> str:
        """Every task's search of generation g (list prefix without the trailing slash)."""
        return f"{self.gen(g)}/search"

    def search(self, g: int, task: str) -> str:
        return f"{self.search_root(g)}/{task}"

    def search_reference(self, g: int, task: str) -> str:
        """The bare-prompt reference run (no workflow) that `beats_reference` is judged against."""
        return f"{self.search(g, task)}/reference"

    def search_iter(self, g: int, task: str, k: int) -> str:
        return f"{self.search(g, task)}/iter-{k}"

    def search_state(self, g: int, task: str) -> str:
        return f"{self.search(g, task)}/state.json"

    def search_rollout(self, g: int, task: str, k) -> str:
        """A search rollout's dir: `k` is an iteration or "reference" (the bare-prompt run)."""
        return self.search_reference(g, task) if k == "reference" else self.search_iter(g, task, k)

    def search_file(self, g: int, task: str, k, name: str) -> str:
        """One stored file of a search rollout or iteration: PROMPTED_FILES of episodes/rollouts.py,
        `workflow.json`, `proposal.json`, `verdict.json` (vs the elite), `reference_verdict.json`."""
        return f"{self.search_rollout(g, task, k)}/{name}"

    # ------------------------------------------------------------ agent episodes (any step)
    @staticmethod
    def rollout_file(rollout: str, name: str) -> str:
        """One stored file of a rollout dir (search, evaluate): prompt.txt, workspace.tar.gz, ..."""
        return f"{rollout}/{name}"

    def agent_input(self, rollout: str, name: str = "") -> str:
        """What the agent pod of the rollout at `rollout` reads (the step's `--phase prepare` writes it)."""
        return f"{rollout}/input" + (f"/{name}" if name else "")

    def agent_output(self, rollout: str, name: str = "") -> str:
        """What that agent pod writes (Argo uploads it; the step's `--phase ingest` promotes it)."""
        return f"{rollout}/output" + (f"/{name}" if name else "")

    def relative(self, key: str) -> str:
        """A key of this run without the run's prefix (what prepare hands the agent fan-out)."""
        if not key.startswith(self.run + "/"):
            raise ValueError(f"{key!r} is not a key of run {self.run!r}")
        return key[len(self.run) + 1 :]

    def under_run(self, rel: str) -> str:
        """The inverse of `relative` (Argo: `{{store-prefix}}/<relative key>`)."""
        return f"{self.run}/{rel}"

    # ------------------------------------------------------------ collect / guard / rank
    def collect_root(self, g: int) -> str:
        """Every task's teacher episodes of generation g (list prefix without the trailing slash)."""
        return f"{self.gen(g)}/collect"

    def collect(self, g: int, task: str) -> str:
        return f"{self.collect_root(g)}/{task}"

    def collect_episode(self, g: int, task: str, i) -> str:
        """Episode i's dir; `i` may be the index or the id `ep-<i>` that summaries and rankings hold."""
        return f"{self.collect(g, task)}/{i if str(i).startswith('ep-') else f'ep-{i}'}"

    def episode_file(self, g, task, i, name: str) -> str:
        """One stored file of an episode (EPISODE_FILES of steps/collect.py)."""
        return f"{self.collect_episode(g, task, i)}/{name}"

    def episode_input(self, g, task, i, name: str = "") -> str:
        """What an agent pod reads (`mass collect --phase prepare` writes it)."""
        return self.agent_input(self.collect_episode(g, task, i), name)

    def episode_output(self, g, task, i, name: str = "") -> str:
        """What an agent pod writes (Argo uploads it; `mass collect --phase ingest` promotes it)."""
        return self.agent_output(self.collect_episode(g, task, i), name)

    @staticmethod
    def is_pod_copy(key: str) -> bool:
        """An agent pod's input/ or output/ copy of a rollout (collect episode, search or evaluate rollout);
        ingest promotes output/ to the rollout's own files."""
        return re.search(r"/(ep-\d+|rep-\d+|iter-\d+|reference)/(input|output)/", key) is not None

    def collect_summary(self, g: int, task: str) -> str:
        return f"{self.collect(g, task)}/summary.json"

    def guard(self, g: int, task: str) -> str:
        return f"{self.gen(g)}/guard/{task}.json"

    def guard_checks(self, g: int, task: str, episode: str) -> str:
        """The checks job of one collected episode (Argo: an agent pod runs the guard's checks)."""
        return f"{self.gen(g)}/guard-checks/{task}/{episode}"

    def rank(self, g: int, task: str) -> str:
        return f"{self.gen(g)}/rank/{task}.json"

    def rank_step(self, g: int, task: str) -> str:
        """Manifest prefix of a task's ranking (rank/<task>.json sits next to it)."""
        return f"{self.gen(g)}/rank/{task}"

    def rank_verdicts(self, g: int, task: str) -> str:
        """Per-comparison verdict cache, so a killed ranking resumes without asking again."""
        return f"{self.rank_step(g, task)}/verdicts"

    def rank_verdict(self, g: int, task: str, n: int, first: str, second: str, repeat: int) -> str:
        """Comparison n of the pairing schedule (first shown as A)."""
        return f"{self.rank_verdicts(g, task)}/{n:04d}-{first}-{second}-{repeat}.json"

    # ------------------------------------------------------------ later steps
    def sft(self, g: int) -> str:
        return f"{self.gen(g)}/sft"

    def sft_file(self, g: int, split: str) -> str:
        """`train` / `val` windows, or `stats` (stats.json)."""
        return f"{self.sft(g)}/stats.json" if split == "stats" else f"{self.sft(g)}/{split}.jsonl"

    def train(self, g: int) -> str:
        return f"{self.gen(g)}/train"

    def train_log(self, g: int) -> str:
        return f"{self.train(g)}/log.jsonl"

    def train_timing(self, g: int) -> str:
        """Wall-clock seconds per training step: kept apart from log.jsonl, whose hash later steps'
        inputs carry, so two executors of one spec store byte-identical training outputs."""
        return f"{self.train(g)}/timing.jsonl"

    def checkpoint(self, g: int, step) -> str:
        return f"{self.train(g)}/step-{step}"

    def train_checkpoints(self, g: int) -> str:
        """List prefix of the stored checkpoints (`train/step-<n>`)."""
        return f"{self.train(g)}/step-"

    def select(self, g: int) -> str:
        return f"{self.gen(g)}/select.json"

    def select_step(self, g: int) -> str:
        """Manifest prefix of checkpoint selection (select.json sits next to it)."""
        return f"{self.gen(g)}/select"

    def select_panel(self, g: int) -> str:
        """Checkpoint selection by the judge panel (sft.checkpoint_selection: panel): its rollouts and verdicts."""
        return f"{self.gen(g)}/select-panel"

    def select_rollout(self, g: int, who: str, task: str, rep: int, name: str = "") -> str:
        """A bare-prompt rollout for panel selection (or one of its files); `who` is `parent` or
        `step-<n>` (a candidate)."""
        return f"{self.select_panel(g)}/{who}/{task}/rep-{rep}" + (f"/{name}" if name else "")

    def select_verdicts(self, g: int) -> str:
        return f"{self.select_panel(g)}/verdicts"

    def merge_step(self, g: int) -> str:
        """Manifest prefix of the merge that writes model(g + 1)."""
        return f"{self.gen(g)}/merge"

    def eval_root(self) -> str:
        return f"{self.run}/eval"

    def eval(self, g: int) -> str:
        return f"{self.eval_root()}/gen-{g}"

    def eval_rollout_of(self, key: str) -> tuple[int, str] | None:
        """(generation, task) of a key inside an evaluation rollout, None for any other key."""
        parts = key.removeprefix(self.eval_root() + "/").split("/")
        if len(parts) < 3 or not re.fullmatch(r"gen-\d+", parts[0]):
            return None
        return int(parts[0].removeprefix("gen-")), parts[1]

    def verdicts(self) -> str:
        """Every stored evaluation verdict (panel and self), one object per (pair, judge, seed)
        (`verdict_file`)."""
        return f"{self.eval_root()}/verdicts"

    @staticmethod
    def verdict_pair(candidate: str, baseline: str, task: str, rep: int) -> str:
        """A compared pair under a verdict prefix: `gen-2-vs-gen-0/<task>/rep-1` (a checkpoint
        candidate is `step-<n>`). Its bytes also seed the pair's position balance."""
        return f"{candidate}-vs-{baseline}/{task}/rep-{rep}"

    @staticmethod
    def verdict_file(prefix: str, pair: str, judge: str, seed: int) -> str:
        """One judge's verdict with one seed on a pair under `verdicts()` or `select_verdicts(g)`."""
        return f"{prefix}/{pair}/{judge}-seed-{seed}.json"

    def eval_rollout(self, g: int, task: str, rep: int) -> str:
        """Replicate `rep` of L_g's bare-prompt rollout of a task (reused by later comparisons)."""
        return f"{self.eval(g)}/{task}/rep-{rep}"

    def eval_verdicts(self, g: int) -> str:
        """List prefix of the panel verdicts comparing L_g with its baselines."""
        return f"{self.verdicts()}/gen-{g}-vs-"

    def benchmark(self, name: str, file: str = "") -> str:
        """Rollouts, grades and the score table (`scores.json`, `scores.md`) of an external benchmark."""
        return f"{self.run}/benchmark/{name}" + (f"/{file}" if file else "")

    def benchmark_rollout(self, name: str, g: int, task: str, rep: int, file: str = "") -> str:
        """One bare-prompt rollout of L_g on a benchmark task (or one of its files, e.g. `grade.json`)."""
        return f"{self.benchmark(name)}/gen-{g}/{task}/rep-{rep}" + (f"/{file}" if file else "")

    def report(self) -> str:
        return f"{self.run}/report"

    def report_file(self, name: str) -> str:
        return f"{self.report()}/{name}"

    def store_options(self) -> dict:
        """The spec's S3 endpoint and region, for opening other s3:// locations (model dirs) alike."""
        st = self.spec.store
        return {k: v for k, v in {"endpoint_url": st.endpoint_url, "region": st.region}.items() if v}

    # ------------------------------------------------------------ local scratch
    def work_dir(self, root) -> Path:
        """This run's local scratch under `root` (models, checkpoints, logs): `<name>-<12 hex>`, the
        digest over the store's location and every spec field a step's output depends on. Another
        spec of the same name, or the same name in another store, never reads this one's state."""
        import hashlib
        import json

        doc = self.spec.model_dump(mode="json")
        for path in UNCHECKED_SPEC_FIELDS:
            parent = doc
            *head, last = path.removeprefix("$.").split(".")
            for k in head:
                parent = parent.get(k, {})
            parent.pop(last, None)
        ident = json.dumps({"store": self.store.uri, "spec": doc}, sort_keys=True)
        return Path(root) / f"{self.spec.name}-{hashlib.sha256(ident.encode()).hexdigest()[:12]}"

    # ------------------------------------------------------------ the run's spec
    def claim_spec(self, record: bool = True) -> None:
        """Record the spec of a new run; on an existing run refuse a spec that differs from the
        stored one (SpecError, exit 2, naming every changed field). Stored steps were computed
        from the stored spec, so a silent change would mix two runs in one store. Only
        `generations` may change: it extends (or shortens) the chain without touching any step.
        `record=False` only checks (every step entry does; the runner and `mass validate --outputs`,
        the first step of every Argo cycle, record)."""

        current = self.spec.model_dump(mode="json")
        key = self.spec_key()
        if record and self.store.create_json(key, current):  # atomic: of two new claimants one wins
            return
        changed = self.spec_differences()
        if changed:
            raise SpecError(f"{self.store.uri.rstrip('/')}/{key}", changed)
        if record:
            self.store.put_json(key, current)

    def spec_differences(self) -> list:
        """The one decision every command shares (`mass run`, `mass validate`, `mass status`): the
        SpecIssues of each field where this spec differs from the run's stored one; [] for a new run."""

        key = self.spec_key()
        if not self.store.exists(key):
            return []
        stored = self.store.get_json(key)
        try:  # a field added since the run began counts at its default, not as a change
            stored = RunSpec.model_validate(stored).model_dump(mode="json")
        except ValueError:
            pass
        return [
            SpecIssue(
                path,
                f"stored run has {old!r}, this spec has {new!r} (a changed spec needs a new `name` or an empty store)",
            )
            for path, old, new in spec_changes(stored, self.spec.model_dump(mode="json"))
        ]

    def stored_spec(self):
        """The spec the run's store holds (validated), or None for a run never started."""

        key = self.spec_key()
        return RunSpec.model_validate(self.store.get_json(key)) if self.store.exists(key) else None


def served_model_name(run: str, g) -> str:
    """`mass-<run>-g<g>`: the generation's InferenceService on Kubernetes and the local server's
    model name alike, so the traces (and their hashes) of both executors agree."""
    return f"mass-{run}-g{g}"


# generations extends the chain; the serving backend is how a model is served, not what a step
# computes, so a run started on one backend may resume on another; the embedder decides only the
# report, whose Step hashes the spec (a changed one redoes the report alone).
UNCHECKED_SPEC_FIELDS = (
    "$.generations",
    "$.execution.serving",
    "$.execution.continuous_batching",
    "$.execution.prefix_cache_gib",
    "$.execution.vllm",
    "$.evaluation.embedder",
)


def spec_changes(stored, current, path: str = "$") -> list[tuple[str, object, object]]:
    """(JSON path, stored, current) of every leaf that differs, outside UNCHECKED_SPEC_FIELDS."""
    if isinstance(stored, dict) and isinstance(current, dict):
        out = []
        for k in sorted(set(stored) | set(current)):
            if f"{path}.{k}" in UNCHECKED_SPEC_FIELDS:
                continue
            out += spec_changes(stored.get(k), current.get(k), f"{path}.{k}")
        return out
    if isinstance(stored, list) and isinstance(current, list) and len(stored) == len(current):
        return [c for i, (a, b) in enumerate(zip(stored, current)) for c in spec_changes(a, b, f"{path}[{i}]")]
    return [] if stored == current else [(path, stored, current)]
