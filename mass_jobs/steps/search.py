"""Workflow search per task (the inner loop, weights frozen, one best version held).

    mass search --spec S --gen G --task T [--iteration K]

Iteration 0 runs two rollouts: the bare task prompt (the *reference*, stored under
`search/<task>/reference/`) and the initial workflow (the task's, or DEFAULT_WORKFLOW), whose
workspace is the first best version; it is judged against the reference.
Iterations k = 1..K: the optimizer (current model) sees the task, the current, best and initial
workflows, the judged history (verdicts, rationales, what changed between versions) and evidence
from the last workspace, and proposes W_k as JSON (malformed: retried `search.proposal_retries`
times, then a failed iteration; the loop goes on). W_k is rolled out and judged under blind labels
in a seeded random order, by `search.selection`:

- `champion` (the paper's code, judged against the baseline): W_k against the bare reference. The
  first version to beat it becomes the champion; once a champion holds such a win, a later version
  that beats the reference too replaces it only by winning a direct champion-vs-W_k verdict. A
  search whose versions never beat the reference keeps v0, without a win.
- `elite` (the paper's Algorithm 1): W_k against the elite's workspace; W_k becomes the elite when
  preferred, and a new elite is then judged against the reference, once.

Either way `elite` names the best version, `beats_reference` whether its own verdict against the
reference was a win, and `beat_reference` every version that won one; a tie or an invalid verdict
wins nothing. Which decides collection is `collection.collect_when` (see `mass collect`).

Every piece is persisted as soon as it exists (proposal, rollout, verdicts), and an iteration is
done when its step manifest is written, so a killed search resumes inside the iteration it was in
without asking the model again for what is stored.
"""

from __future__ import annotations

import random
from typing import Any

from mass_jobs.config.errors import StepFailed
from mass_jobs.episodes import rollouts
from mass_jobs.episodes.driver import Driver, Rollout
from mass_jobs.episodes.episode import EpisodeRequest
from mass_jobs.episodes.rollouts import EpisodeRunner, Phase, agent_ended, derived_seed, rollout_outputs
from mass_jobs.judging import optimizer_brief
from mass_jobs.judging.compare import Verdict, blind_judge, judge, task_bundle
from mass_jobs.judging.evidence import prompt_budget
from mass_jobs.run.context import RunContext
from mass_jobs.serving.roles import role_client, role_label, roles_input
from mass_jobs.spec import workflow_docs
from mass_jobs.spec.workflow import WorkflowError, workflow_prompt_parts
from mass_jobs.steps.search_brief import brief_input, stored_json
from mass_jobs.steps.search_state import IterationRecord, SearchState, fold, judge_version
from mass_jobs.store import Step

OPTIMIZER_ROLE = "optimizer"


# ---------------------------------------------------------------- the search


class SearchError(StepFailed):
    pass


def iteration_step(ctx: RunContext, gen: int, task_id: str, k: int):
    """Iteration k's Step: the task, k and the search settings (not how many iterations follow)."""

    task, search = ctx.spec.task(task_id), ctx.spec.search
    # fields at their defaults that earlier versions lacked stay out, so a stored search keeps its identity
    inputs = {
        "task": task.model_dump(
            mode="json",
            exclude={
                k
                for k, unset in (("upstream_text", task.upstream_text is None), ("network", not task.network))
                if unset
            },
        ),
        "k": k,
        "search": search.model_dump(
            mode="json",
            exclude={"iterations"}
            | {
                k
                for k, default in (("workflow_format", "structured"), ("judge_order", "seeded"))
                if getattr(search, k) == default
            },
        ),
        **({"roles": roles_input(ctx.spec)} if roles_input(ctx.spec) else {}),
    }
    # iteration 0 also runs the bare reference rollout
    return Step(
        ctx.store,
        ctx.search_rollout(gen, task_id, k),
        inputs,
        name=f"search/{task_id}/iter-{k}",
        owns=(ctx.search_rollout(gen, task_id, "reference") + "/",) if k == 0 else (),
    )


def search_steps(ctx: RunContext, gen: int, task_id: str) -> list:
    """Every iteration's Step: the search is stored when iterations 0..search.iterations all are
    (the last one wrote the finished state)."""
    return [iteration_step(ctx, gen, task_id, k) for k in range(ctx.spec.search.iterations + 1)]


class Search:
    """The inner loop for one task of one generation; `run()` or `iteration(k)`.

    With an `run_episode` the rollouts run here; without one (the cluster) `prepare(k)` writes the
    agent pods' inputs, `ingest(rollout)` stores each pod's output, and `iteration(k)` then only
    judges and saves (it refuses a rollout that is not stored)."""

    def __init__(self, ctx: RunContext, gen: int, task_id: str, client: Any, run_episode: EpisodeRunner | None):

        self.ctx, self.gen, self.run_episode = ctx, gen, run_episode
        self.driver = Driver(ctx)
        self.store = ctx.store
        self.spec = ctx.spec
        self.optimizer, self.evaluator = (role_client(ctx.spec, r, client) for r in ("optimizer", "evaluator"))
        self.labels = {r: role_label(ctx.spec, r, gen) for r in ("optimizer", "evaluator")}
        self.task = ctx.spec.task(task_id)
        self.cfg = ctx.spec.search

    # ------------------------------------------------------------ keys and state
    def iter_dir(self, k) -> str:
        """The dir of iteration k (or of the bare "reference" rollout)."""
        return self.ctx.search_rollout(self.gen, self.task.id, k)

    def rollout_file(self, k, name: str) -> str:
        return self.ctx.search_file(self.gen, self.task.id, k, name)

    def _step(self, k: int):
        return iteration_step(self.ctx, self.gen, self.task.id, k)

    def state(self) -> SearchState | None:
        doc = stored_json(self.store, self.ctx.search_state(self.gen, self.task.id))
        return SearchState.model_validate(doc) if doc else None

    def done_through(self) -> int:
        """Highest k such that iterations 0..k are all finished (-1 when none)."""
        k = -1
        while k + 1 <= self.cfg.iterations and self._step(k + 1).done:
            k += 1
        return k

    # ------------------------------------------------------------ entry points
    def run(self) -> SearchState:
        for k in range(self.cfg.iterations + 1):
            self.iteration(k)
        state = self.state()
        assert state is not None
        return state

    def _check_k(self, k: int) -> None:
        if not 0 <= k <= self.cfg.iterations:
            raise SearchError(f"--iteration must be in 0..{self.cfg.iterations} (search.iterations), got {k}")
        # k - 1 alone: it was started only once k - 2 was done, and checking every earlier
        # iteration re-hashed all their outputs before each iteration (quadratic in iterations)
        if k > 0 and not self._step(k - 1).done:
            raise SearchError(f"task {self.task.id}: iteration {k - 1} is not finished; run it first")

    def iteration(self, k: int) -> bool:
        """Run iteration k (skipped when done); return whether another iteration follows."""
        if not 0 <= k <= self.cfg.iterations:
            self._check_k(k)
        if self._step(k).done:
            return k < self.cfg.iterations
        self._check_k(k)
        self._step(k).start()
        record, outputs = self._initial() if k == 0 else self._propose_and_try(k)
        self._save(k, record, outputs)
        return k < self.cfg.iterations

    # ------------------------------------------------------------ rollouts, by the rollout driver
    def _rollout(self, r) -> Rollout:
        """The reference's rollout (the bare task), or version r's (its stored workflow.json)."""
        if r == "reference":
            prompt = workflow_prompt_parts(self.task.prompt, None).text
        elif self.store.exists(self.rollout_file(r, "workflow.json")):
            prompt = workflow_docs.prompt(self.task, self.store.get_json(self.rollout_file(r, "workflow.json")))
        else:
            raise SearchError(f"task {self.task.id}: rollout {self.iter_dir(r)} is not prepared (no workflow.json)")
        request = EpisodeRequest(
            prompt=prompt,
            files=dict(self.task.files),
            seed=derived_seed(self.cfg.seed, self.task.id, r),
            network=tuple(self.task.network),
        )
        label = "reference" if r == "reference" else f"iter-{r}"
        return Rollout(self.iter_dir(r), request, self.task.id, label, self.gen, first={"prompt.txt": prompt})

    def _rollouts(self, k: int) -> list[Rollout]:
        """Iteration k's rollouts: the reference and W_0 at k = 0, else W_k (the proposal is made
        and stored here when missing: the optimizer is a model call); none without a proposal."""
        if k == 0:
            wf = self._initial_doc()
        else:
            state = self.state()
            if state is None:
                raise SearchError(f"task {self.task.id}: no search state; run iteration 0 first")
            wf = self._proposal(k, state)["workflow"]
            if wf is None:
                return []
        self.store.put_json(self.rollout_file(k, "workflow.json"), wf)
        return [*([self._rollout("reference")] if k == 0 else []), self._rollout(k)]

    def prepare(self, k: int, endpoint) -> list[dict]:
        """Write the agent pods' inputs of iteration k; the fan-out items (none when stored)."""
        self._check_k(k)
        if self._step(k).done:
            return []
        return [item for r in self._rollouts(k) if (item := self.driver.prepare(r, endpoint)) is not None]

    def ingest(self, rel: str, agent_ended: bool = False) -> dict:
        """Store the agent pod's output of the rollout `rel` (a key relative to the run)."""
        names = ["reference", *range(self.cfg.iterations + 1)]
        return self.driver.ingest_named(
            rel, {self.iter_dir(r): lambda r=r: self._rollout(r) for r in names}, agent_ended
        )

    def _run_rollout(self, r) -> dict:
        rollout = self._rollout(r)
        if self.run_episode is None and self.driver.stored(rollout) is None:
            raise SearchError(
                f"task {self.task.id}: rollout {self.iter_dir(r)} is not stored "
                f"(run --phase prepare, its agent pod and --phase ingest first)"
            )
        return self.driver.run(rollout, self.run_episode)

    # ------------------------------------------------------------ iteration 0
    def _initial(self) -> tuple[IterationRecord, list[str]]:
        ref = self.iter_dir("reference")
        self._run_rollout("reference")
        wf = self._initial_doc()
        status = self._rollout_once(0, wf)
        record = IterationRecord(
            k=0,
            workflow=wf,
            outcome=status.get("outcome"),
            preferred=True,
            elite_after=0,
            reference_verdict=self._versus_reference(0),
        )
        return record, rollout_outputs(self.ctx, ref) + rollout_outputs(self.ctx, self.iter_dir(0)) + [
            self.rollout_file(0, "workflow.json"),
            self.rollout_file(0, "reference_verdict.json"),
        ]

    def _initial_doc(self) -> dict:
        return workflow_docs.initial(self.task, self.cfg.workflow_format)

    def _rollout_once(self, k: int, wf: dict) -> dict:
        self.store.put_json(self.rollout_file(k, "workflow.json"), wf)
        return self._run_rollout(k)

    def _bundle(self, k) -> str:
        """The evidence of rollout k's stored workspace (with its run notice)."""
        return task_bundle(self.store, self.iter_dir(k), self.spec, self.task)

    def _judge(self, key: str, k: int, x: tuple[str, str], y: tuple[str, str], salt: str) -> Verdict:
        """Version k (`x`) against the reference or the best version (`y`), stored once."""
        stored = stored_json(self.store, key)
        if stored:
            return Verdict.model_validate(stored)
        kw = {
            "retries": self.spec.ranking.verdict_retries,
            "seed": derived_seed(self.cfg.seed, self.task.id, k, salt),
            "budget_tokens": prompt_budget(self.spec),
        }
        if self.cfg.judge_order == "fixed":  # the paper's code: the baseline (or the champion) is A
            v = judge(self.evaluator, self.task.judged_text, y, x, **kw)
        else:
            rng = random.Random(derived_seed(self.cfg.seed, self.task.id, k, salt, "order"))
            v = blind_judge(self.evaluator, self.task.judged_text, x, y, rng, **kw)
        v = v.model_copy(update={"model": self.labels["evaluator"]})
        self.store.put_json(key, v.model_dump(mode="json"))
        return v

    def _versus_reference(self, k: int) -> Verdict:
        elite = (f"iter-{k}", self._bundle(k))
        reference = ("reference", self._bundle("reference"))
        return self._judge(self.rollout_file(k, "reference_verdict.json"), k, elite, reference, "reference")

    # ------------------------------------------------------------ iterations 1..K
    def _proposal(self, k: int, state: SearchState) -> dict:
        """W_k's proposal: stored, or asked of the optimizer and stored at once."""
        history = [r for r in state.iterations if r.k < k]
        proposal = stored_json(self.store, self.rollout_file(k, "proposal.json")) or self._propose(k, state, history)
        self.store.put_json(self.rollout_file(k, "proposal.json"), proposal)
        return proposal

    def _propose_and_try(self, k: int) -> tuple[IterationRecord, list[str]]:
        state = self.state()
        if state is None:
            raise SearchError(f"task {self.task.id}: no search state; run iteration 0 first")
        prefix = self.iter_dir(k)
        proposal = self._proposal(k, state)
        outputs = [self.rollout_file(k, "proposal.json")]
        if proposal["workflow"] is None:
            record = IterationRecord(
                k=k,
                workflow=None,
                proposal_attempts=proposal["attempts"],
                proposal_errors=proposal["errors"],
                elite_after=state.elite,
            )
            return record, outputs
        status = self._rollout_once(k, proposal["workflow"])
        outputs += rollout_outputs(self.ctx, prefix) + [self.rollout_file(k, "workflow.json")]
        candidate = (f"iter-{k}", self._bundle(k))
        best = (f"iter-{state.elite}", self._bundle(state.elite))

        def ask(against: str) -> Verdict:
            if against == "reference":
                outputs.append(self.rollout_file(k, "reference_verdict.json"))
                return self._versus_reference(k)
            outputs.append(self.rollout_file(k, "verdict.json"))
            return self._judge(self.rollout_file(k, "verdict.json"), k, candidate, best, self.cfg.selection)

        verdict, ref_verdict, preferred = judge_version(self.cfg.selection, k, state.beats_reference, ask)
        record = IterationRecord(
            k=k,
            workflow=proposal["workflow"],
            proposal_attempts=proposal["attempts"],
            proposal_errors=proposal["errors"],
            outcome=status.get("outcome"),
            verdict=verdict,
            preferred=preferred,
            elite_after=k if preferred else state.elite,
            reference_verdict=ref_verdict,
        )
        return record, outputs

    def _propose(self, k: int, state: SearchState, history: list[IterationRecord]) -> dict:
        try:
            messages, brief = optimizer_brief.build(brief_input(self, state, history), prompt_budget(self.spec))
        except optimizer_brief.BriefTooLong as e:
            raise SearchError(f"task {self.task.id}: iteration {k}: {e}") from None
        errors: list[str] = []
        fmt = self.cfg.workflow_format
        for attempt in range(self.cfg.proposal_retries + 1):
            reply = self.optimizer.chat(
                messages,
                seed=derived_seed(self.cfg.seed, self.task.id, k, "proposal", attempt),
                headers={"X-Mass-Role": OPTIMIZER_ROLE, "X-Mass-Agent": OPTIMIZER_ROLE},
            )
            content = reply.get("content") or ""
            try:
                wf, explanation = workflow_docs.parse_reply(self.task, fmt, content)
            except WorkflowError as e:
                errors.append(f"attempt {attempt + 1}: " + "; ".join(e.errors))
                messages = messages[:2] + [
                    {"role": "assistant", "content": content},
                    {
                        "role": "user",
                        "content": "That proposal could not be used:\n"
                        + "\n".join(e.errors)
                        + "\n"
                        + workflow_docs.RETRY[fmt],
                    },
                ]
                continue
            return {
                "workflow": wf,
                "attempts": attempt + 1,
                "errors": errors,
                "model": self.labels["optimizer"],
                "brief": brief,
                **({"explanation": explanation} if explanation else {}),
            }
        return {
            "workflow": None,
            "attempts": self.cfg.proposal_retries + 1,
            "errors": errors,
            "model": self.labels["optimizer"],
            "brief": brief,
        }

    # ------------------------------------------------------------ state
    def _save(self, k: int, record: IterationRecord, outputs: list[str]) -> None:
        prev = self.state() if k > 0 else None
        records = ([r for r in prev.iterations if r.k < k] if prev else []) + [record]
        state = fold(
            self.task.id,
            self.gen,
            self.cfg.iterations,
            records,
            reference_outcome=stored_json(self.store, self.rollout_file("reference", "status.json")),
            selection=self.cfg.selection,
        )
        key = self.ctx.search_state(self.gen, self.task.id)
        self.store.put_json(key, state.model_dump(mode="json"))
        self._step(k).finish(outputs, extra={"elite": state.elite, "beats_reference": state.beats_reference})


def run_search(
    ctx: RunContext,
    gen: int,
    task_id: str,
    client: Any,
    run_episode: EpisodeRunner | None,
    iteration: int | None = None,
    *,
    phase: str | Phase | None = None,
    endpoint=None,
    rollout_key: str | None = None,
    agent_status: str | None = None,
) -> dict:
    """Library core used by `mass search` and the local runner: the whole loop, or one iteration.

    Phases (the cluster, around agent pods): `prepare` (needs `iteration` and `endpoint`) returns
    {"rollouts": [fan-out items]}; `ingest` (needs `rollout_key`) stores one agent pod's output;
    `finish` (or no phase) then judges and saves the iteration from the stored rollouts."""
    search = Search(ctx, gen, task_id, client, run_episode)
    phase = rollouts.phase_of(phase, step="search")
    if phase in (Phase.PREPARE, Phase.INGEST):
        if phase is Phase.PREPARE:
            if iteration is None or endpoint is None:
                raise SearchError(
                    "--phase prepare needs --iteration and the model endpoint the agent pods call (--endpoint)"
                )
            return {"rollouts": search.prepare(iteration, endpoint)}
        if not rollout_key:
            raise SearchError("--phase ingest needs --rollout (a key the prepare phase listed)")
        status = search.ingest(rollout_key, agent_ended=agent_ended(agent_status))
        return {"rollout": rollout_key, "outcome": status.get("outcome")}
    if iteration is None:
        state = search.run()
        return {"continue": False, "elite": state.elite, "beats_reference": state.beats_reference}
    more = search.iteration(iteration)
    state = search.state()
    return {
        "continue": more,
        "next": iteration + 1 if more else None,
        "elite": state.elite if state else None,
        "beats_reference": state.beats_reference if state else False,
    }
