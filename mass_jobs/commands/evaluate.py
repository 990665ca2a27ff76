"""`mass evaluate SPEC --gen G`: bare-prompt rollouts of L_G and its baselines, the judge panel
and the self-evaluator (see mass_jobs.steps.evaluate). Models are served here by the embedded
server; judges with `endpoint: local` too. Prints the step manifest's summary as JSON.

On the cluster, around agent pods, one model served at a time: `--phase plan --outputs DIR` writes
DIR/rounds (the generations to serve, in order; a model may come twice). In a round, with L_h's
InferenceService up (`--served-gen h --endpoint URL --served-model NAME`), `--phase prepare
--outputs DIR` writes L_h's missing rollouts' agent inputs and DIR/rollouts (the agent fan-out),
`--phase ingest --rollout KEY [--agent-status PHASE]` stores one pod's output, and `--phase finish`
gives L_h's self-verdicts once every pair is stored. The last `--phase finish`, without
`--served-gen`, runs the panel against the external judges, refusing a missing rollout or
self-verdict."""

from __future__ import annotations

import json
import sys

from mass_jobs.commands.common import add_model, add_rollout_phases, add_spec, agent_ended, open_run, work_dir_default
from mass_jobs.episodes import rollouts
from mass_jobs.run.generation_model import generation_servers
from mass_jobs.serving.llm import Endpoint
from mass_jobs.serving.servers import remote_servers
from mass_jobs.steps import evaluate as ev


def add_arguments(parser) -> None:
    add_spec(parser, gen="generation G >= 1 (L_G vs L_0 and L_{G-1})")
    parser.add_argument(
        "--work-dir",
        default=work_dir_default(),
        help="(default: $MASS_WORK_DIR or .mass-work) local cache for model dirs and server logs",
    )
    parser.add_argument(
        "--served-gen",
        type=int,
        metavar="H",
        help="with --phase prepare / finish: the round of L_H, served at --endpoint",
    )
    add_model(parser)
    parser.add_argument(
        "--judge-endpoint",
        nargs=3,
        action="append",
        default=[],
        metavar=("NAME", "URL", "MODEL"),
        help="with --phase finish: where the executor serves the judge NAME of `endpoint: local` "
        "(repeat; the cluster has none: its judges are external)",
    )
    add_rollout_phases(
        parser,
        phases=("plan", "prepare", "ingest", "finish"),
        phase="plan: the rounds (models served one at a time); prepare a round's missing rollouts; "
        "ingest one (--rollout); finish a round (--served-gen: its self-verdicts) or the step "
        "(the panel), never running a rollout here",
        outputs="DIR/rollouts and DIR/rounds",
        lost="stores an infra_error rollout",
    )


def _refused(args) -> str | None:
    if args.phase == "ingest" and not args.rollout:
        return "--phase ingest needs --rollout (a key the prepare phase listed)"
    if args.phase == "prepare" and args.served_gen is None:
        return "--phase prepare needs --served-gen (the generation whose round it is)"
    if args.served_gen is not None and (args.phase not in ("prepare", "finish") or not args.endpoint):
        return "--served-gen: expected with --phase prepare or finish and --endpoint (L_H's served model)"
    return None


def main(args) -> int:
    ctx = open_run(args.spec)
    spec = ctx.spec
    if not 1 <= args.gen <= spec.generations:
        print(f"--gen: expected 1..{spec.generations} (generations), got {args.gen}", file=sys.stderr)
        return 2
    if why := _refused(args):
        print(why, file=sys.stderr)
        return 2
    served = Endpoint(args.endpoint, args.served_model, args.api_key_env) if args.endpoint else None
    try:
        if args.phase == "plan":
            out = ev.plan(ctx, args.gen)
        elif args.phase == "prepare":
            out = ev.prepare(ctx, args.gen, args.served_gen, served)
        elif args.phase == "ingest":
            out = ev.ingest(ctx, args.gen, args.rollout, agent_ended=agent_ended(args))
        elif args.phase == "finish" and args.served_gen is not None:
            out = ev.judge_round(ctx, args.gen, args.served_gen, served)
        else:
            out = None
        if out is not None:
            rollouts.write_phase_outputs(args.outputs, args.phase, out)
            print(json.dumps(out, sort_keys=True))
            return 0
        if args.phase == "finish":
            local = {name: Endpoint(base_url=url, model=model) for name, url, model in args.judge_endpoint}
            unknown = sorted(set(local) - {j.name for j in spec.judges if j.endpoint == "local"})
            if unknown:
                print(f"--judge-endpoint: {unknown} are no judges of endpoint 'local' in the spec", file=sys.stderr)
                return 2
            serve_model, serve_judge = remote_servers(local)
        else:
            work = ctx.work_dir(args.work_dir)
            work.mkdir(parents=True, exist_ok=True)
            serve_model, serve_judge = generation_servers(ctx, cache_root=work / "models", log_dir=work)
        manifest = ev.evaluate(ctx, args.gen, serve_model, serve_judge, agent_pods=args.phase == "finish")
    except (RuntimeError, FileNotFoundError, ValueError) as err:
        print(f"evaluate: {err}", file=sys.stderr)
        return 1
    rollouts.write_value(args.outputs, "win-share", manifest["extra"].get("panel_win_share"))
    print(json.dumps(manifest["extra"], sort_keys=True))
    return 0
