"""The Steps templates that order a cycle: one cycle step per pipeline step (by its shape), bounded
recursion over search iterations, the episode fan-out, an agent rollout fan-out,
and the exit handler that deletes the run's InferenceServices."""

from __future__ import annotations

from hera.workflows import Parameter, Step, Steps
from hera.workflows import models as m

from mass_jobs.k8s.argo_vocab import (
    AGENT_TEMPLATE,
    EGRESS_IN,
    EPISODE,
    GEN,
    NEXT_GEN,
    ROLLOUT,
    TASK,
    V,
    agent_semaphore,
    input_params,
    step_args,
)
from mass_jobs.pipeline import table as P


def cycle_step(sd: P.StepDef, egress: str) -> None:
    """`egress`: the host of the cycle's egress proxy (its Service), the agent pods' way out."""
    done = f"{V % P.done_output(sd.name)} == false"
    agent = {
        "store_prefix": V % "store-prefix",
        "egress": egress,
    }  # where the agent pods' artifacts live, their way out
    match sd.shape:
        case P.Recursion():
            Step(
                name=sd.name,
                template=f"{sd.name}-task",
                with_param=V % "tasks",
                when=f"{V % 'iterations'} > 0",
                arguments=step_args(
                    gen=GEN,
                    task="{{item}}",
                    iteration="0",
                    iterations=V % "iterations",
                    **(agent if sd.shape.agent else {}),
                ),
            )
        case P.EpisodeFanout():
            Step(name=sd.name, template=sd.name, arguments=step_args(gen=GEN, episodes=V % "episodes", **agent))
            Step(
                name=f"{sd.name}-summary",
                template=f"{sd.name}-summary",
                with_param=V % "tasks",
                arguments=step_args(gen=GEN, task="{{item}}"),
            )
        case P.TaskFanout() | P.TaskRollouts():
            Step(
                name=sd.name,
                template=sd.name,
                with_param=V % "tasks",
                arguments=step_args(
                    gen=GEN, task="{{item}}", **(agent if isinstance(sd.shape, P.TaskRollouts) else {})
                ),
            )
        case P.Container(once_per_run=True):
            Step(name=sd.name, template=sd.name)
        case P.Trainer():
            # GPU pods start only when the step is not stored yet (a finished run costs no GPU)
            sizes = {k.replace("-", "_"): V % k for k in ("trainer-workers", "trainer-nproc", "trainer-gpus")}
            Step(name=sd.name, template=sd.name, when=done, arguments=step_args(gen=_gen(sd), **sizes))
        case P.GenerationRollouts():  # and InferenceServices only when it is not stored yet
            Step(name=sd.name, template=sd.name, when=done, arguments=step_args(gen=_gen(sd), **agent))
        case P.Container():
            Step(name=sd.name, template=sd.name, arguments=step_args(gen=_gen(sd)))


def _gen(sd: P.StepDef) -> str:
    return NEXT_GEN if sd.gen_offset else GEN


def recursion(name: str, agent: bool = True) -> Steps:
    """Bounded recursion: one iteration K per call (`mass <step> --iteration K`, or its prepare ->
    agent pods -> finish), then K+1 while K+1 < n."""
    nxt = "{{=asInt(inputs.parameters.iteration) + 1}}"
    sp = {"store_prefix": "{{inputs.parameters.store-prefix}}", "egress": EGRESS_IN} if agent else {}
    with Steps(
        name=f"{name}-task",
        inputs=input_params("gen", "task", "iteration", "iterations", *(["store-prefix", "egress"] if agent else [])),
    ) as loop:
        Step(
            name="iteration",
            template=name,
            when="{{inputs.parameters.iteration}} < {{inputs.parameters.iterations}}",
            arguments=step_args(gen=GEN, task=TASK, iteration="{{inputs.parameters.iteration}}", **sp),
        )
        Step(
            name="next",
            template=f"{name}-task",
            when="{{=asInt(inputs.parameters.iteration) + 1 < asInt(inputs.parameters.iterations)}}",
            arguments=step_args(gen=GEN, task=TASK, iteration=nxt, iterations="{{inputs.parameters.iterations}}", **sp),
        )
    return loop


def episode_steps(name: str) -> Steps:
    """prepare (step pod, store access) -> agent pod (artifacts only) -> ingest (step pod).

    The agent runs only when prepare says so (not for a skipped task or a stored episode); a failed
    agent (retries spent, deadline) does not fail the generation: ingest, told the agent step's
    phase, records infra_error."""
    a = step_args(gen=GEN, task=TASK, episode=EPISODE)
    agent = "{{steps.prepare.outputs.parameters.agent}} == true"
    with Steps(
        name=f"{name}-episode",
        inputs=input_params("gen", "task", "episode", "store-prefix", "egress"),
        synchronization=agent_semaphore(),
    ) as st:
        Step(name="prepare", template=f"{name}-prepare", arguments=a)
        Step(
            name="agent",
            template=AGENT_TEMPLATE,
            when=agent,
            continue_on=m.ContinueOn(failed=True, error=True),
            arguments=step_args(
                gen=GEN,
                task=TASK,
                label=EPISODE,
                rollout="{{steps.prepare.outputs.parameters.rollout}}",
                store_prefix="{{inputs.parameters.store-prefix}}",
                egress=EGRESS_IN,
            ),
        )
        Step(
            name="ingest",
            template=f"{name}-ingest",
            when=agent,
            arguments=[*a, Parameter(name="agent-status", value="{{steps.agent.status}}")],
        )
    return st


def rollout_steps(name: str, inputs: tuple[str, ...]) -> Steps:
    """One listed rollout: its agent pod (a failed one, retries spent, does not fail the step), then
    `<step>-ingest`, told the agent's phase (no output after Failed/Error: an infra_error episode)."""
    own = {n: "{{inputs.parameters.%s}}" % n for n in inputs}
    # a fan-out's parallelism bounds one task's rollouts; the semaphore bounds them all (agent.parallelism)
    with Steps(
        name=f"{name}-rollout",
        inputs=input_params(*inputs, "rollout", "model-gen", "item-task", "label", "store-prefix", "egress"),
        synchronization=agent_semaphore(),
    ) as st:
        Step(
            name="agent",
            template=AGENT_TEMPLATE,
            continue_on=m.ContinueOn(failed=True, error=True),
            arguments=step_args(
                gen="{{inputs.parameters.model-gen}}",
                task="{{inputs.parameters.item-task}}",
                label="{{inputs.parameters.label}}",
                rollout=ROLLOUT,
                store_prefix="{{inputs.parameters.store-prefix}}",
                egress=EGRESS_IN,
            ),
        )
        Step(
            name="ingest",
            template=f"{name}-ingest",
            arguments=[
                *(Parameter(name=n, value=v) for n, v in own.items()),
                *step_args(rollout=ROLLOUT, agent_status="{{steps.agent.status}}"),
            ],
        )
    return st


def episode_fanout(name: str, parallelism) -> Steps:
    """All episodes of the generation, at most `parallelism` at once (one predictor serves them).

    A steps template's `parallelism` counts its active children of type Pod, Steps or DAG, so each
    collect-episode (a Steps node: prepare, agent, ingest) takes one slot (argo-workflows v4.1.2
    workflow/controller/operator.go, checkParallelism and countActiveChildren). It is an integer
    field, not a parameter, hence a chart value rather than the spec's execution.concurrency."""
    with Steps(name=name, inputs=input_params("gen", "episodes", "store-prefix", "egress")) as st:
        Step(
            name="episode",
            template=f"{name}-episode",
            with_param="{{inputs.parameters.episodes}}",
            arguments=step_args(
                gen=GEN,
                task="{{item.task}}",
                episode="{{item.episode}}",
                store_prefix="{{inputs.parameters.store-prefix}}",
                egress=EGRESS_IN,
            ),
        )
    return st


def delete_models_steps() -> Steps:
    """Every InferenceService a cycle of generation g may have made: L_g (the inner loop), and
    L_0 and L_g+1 (evaluate), and its egress proxy; absent ones are no error. The exit handler's,
    success or not."""
    with Steps(name="delete-models", inputs=input_params("gen")) as st:
        with st.parallel():
            for name, gen in (("gen", GEN), ("next", NEXT_GEN), ("base", "0")):
                Step(name=name, template="delete-model", arguments=step_args(gen=gen))
            Step(name="egress", template="delete-egress", arguments=step_args(gen=GEN))
    return st
