"""`mass plan SPEC`: counts, training memory per GPU and a simulated schedule, before a run.

Reads the spec and the model's config only (no weights, no store unless --timings names a
previous run). Exit 2 when training will not fit the declared GPU, naming the numbers.
See `mass_jobs.pipeline.planning` for where each number comes from.
"""

from __future__ import annotations

import json
import sys

from mass_jobs.k8s.workflow_size import MAX_WORKFLOW_SIZE, estimate
from mass_jobs.pipeline.nodes import compile_plan
from mass_jobs.pipeline.planning.counts import plan_counts
from mass_jobs.pipeline.planning.memory import EXAMPLES, GIB, config_source, fits, load_config, refusal, training_memory
from mass_jobs.pipeline.planning.schedule import DEFAULTS, gantt, simulate, stored_timings
from mass_jobs.spec.load import SpecError, SpecIssue, load_spec


def add_arguments(parser) -> None:
    parser.add_argument("spec", help="run spec: a path or an s3:// URI")
    parser.add_argument("--config", help="the model's config.json (or a model dir); default: model.base when local")
    parser.add_argument("--gpu-memory", type=float, default=80.0, help="GiB of one training GPU (default 80)")
    parser.add_argument("--timings", help="a previous run's spec: episode and step times from its store")
    parser.add_argument("--gantt", help="write the simulated schedule as a PNG here")
    parser.add_argument(
        "--nodes",
        action="store_true",
        help="also list the compiled plan's nodes: step x generation x task, each with its pod, pod "
        "size, credentials and container command (always in --json)",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object instead of tables")


def main(args) -> int:
    import dataclasses

    spec = load_spec(args.spec)
    try:
        source = config_source(spec, args.config)
        if args.config is None and source.parent == EXAMPLES:
            print(
                f"mass plan: model.base {spec.model.base} is a hub id: planning with the config shipped for it, "
                f"{source} (--config names another)",
                file=sys.stderr,
            )
        config = load_config(spec, args.config)
    except ValueError as err:
        raise SpecError(args.spec, [SpecIssue("$.model.base", str(err))]) from err
    counts = plan_counts(spec)
    mem = training_memory(spec, config, parallel=spec.sft.parallel)
    timings = dict(DEFAULTS, source="defaults")
    if args.timings:
        from mass_jobs.commands.common import open_run

        timings = stored_timings(open_run(args.timings, check_spec=False))
    bars, makespan, serial = simulate(spec, counts, timings, spec.execution.concurrency)
    if args.gantt:
        gantt(bars, makespan, serial, args.gantt)
    sizes = [dataclasses.asdict(s) for s in estimate(spec)]
    doc = {
        "run": spec.name,
        "counts": counts,
        "memory": mem.as_dict(),
        "gpu_memory_gib": args.gpu_memory,
        "fits": fits(mem, args.gpu_memory),
        "timings": timings,
        "schedule": {"dag_s": makespan, "one_after_another_s": serial},
        "workflow_object": {"max_workflow_size": MAX_WORKFLOW_SIZE, "after_generation": sizes},
        "nodes": [n.as_dict() for n in compile_plan(args.spec, spec).nodes],
    }
    if args.json:
        print(json.dumps(doc, sort_keys=True))
    else:
        keys = [k for k in counts[0] if k != "gen"]
        print(
            "counts per generation (exact, or *_max: the bound when every episode is kept; unbounded: "
            "execution.limits has no cap on turns or tool calls)"
        )
        print(f"  {'':24}" + "".join(f"{'gen ' + str(c['gen']):>16}" for c in counts))
        for k in keys:
            print(f"  {k:24}" + "".join(f"{'unbounded' if c[k] is None else format(c[k], ','):>16}" for c in counts))
        print(
            f"training memory per rank ({mem.device}, {mem.parallel} over {mem.world}, window {mem.window}, "
            f"loss chunk {mem.loss_chunk or 'none (whole window)'}, gradient checkpointing "
            f"{'on' if mem.gradient_checkpointing else 'off'})"
        )
        print(
            f"  parameters {mem.parameters:,}; LoRA r={spec.sft.lora.r} on {mem.adapted_modules} modules "
            f"({', '.join(mem.target_kinds)}): {mem.lora_parameters:,} parameters"
        )
        for k in (
            "weights",
            "adapter",
            "gradients",
            "optimizer",
            "activations",
            "recompute",
            "logits",
            "runtime",
            "total",
        ):
            print(f"  {k:12} {getattr(mem, k) / GIB:10.2f} GiB")
        print(
            f"schedule ({timings['source']}: episode {timings['episode_s']:.0f} s, call {timings['call_s']:.0f} s, "
            f"step {timings['step_s']:.1f} s): Argo DAG {makespan / 3600:.1f} h, every episode one after another "
            f"{serial / 3600:.1f} h"
        )
        print(
            f"Argo Workflow object of mass-run after each generation (the controller's MAX_WORKFLOW_SIZE "
            f"{MAX_WORKFLOW_SIZE / 1024:,.0f} KiB by default; past it the nodes are stored compressed)"
        )
        for s in sizes:
            print(
                f"  gen {s['generation']:<3} {s['nodes']:>8,} nodes  {s['nodes_bytes'] / 1024:>10,.0f} KiB  "
                f"compressed {s['compressed_bytes'] / 1024:>8,.0f} KiB  object {s['stored_bytes'] / 1024:>8,.0f} KiB"
                + ("" if s["stored_bytes"] <= MAX_WORKFLOW_SIZE else "  over: needs nodeStatusOffLoad")
            )
        print(
            f"nodes: {len(doc['nodes'])} (step x generation x training task)"
            + ("" if args.nodes else "; --nodes lists them")
        )
        for n in doc["nodes"] if args.nodes else []:
            pods = {"trainer": "PyTorchJob", "agent": "step pods + agent pods"}.get(n["pod"], "step pod")
            print(
                f"  L{n['gen']} {n['step']:9} {n['task'] or '-':18} {pods:23} size {n['resources']:8} "
                f"credentials {n['credentials']}{'/' + n['agent_credentials'] if n['agent_credentials'] else '':6} "
                f"mass {' '.join(n['argv'])}"
            )
    if not doc["fits"]:
        print(f"mass plan: {refusal(mem, args.gpu_memory)}", file=sys.stderr)
        return 2
    return 0
