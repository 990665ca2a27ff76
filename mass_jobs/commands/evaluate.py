"""`mass evaluate SPEC --gen G`: bare-prompt rollouts of L_G and its baselines, the judge panel
and the self-evaluator (see mass_jobs.steps.evaluate). Models are served here by the embedded
server; judges with `endpoint: local` too. Prints the step manifest's summary as JSON.

On the cluster, around agent pods (`--generation-endpoint G URL NAME` per generation it may call:
L_0, L_G-1 and L_G's InferenceServices): `--phase plan --outputs DIR` writes DIR/models (the
generations whose InferenceServices must serve: rollouts or self-verdicts missing); once they are
up, `--phase prepare --outputs DIR` writes the rollouts' agent inputs and DIR/rollouts (the agent
fan-out); `--phase ingest --rollout KEY [--agent-status PHASE]` stores one pod's output;
`--phase finish` runs the panel and the self-evaluators against the InferenceServices and external
judges, refusing a missing rollout."""

from __future__ import annotations

import json
import sys

from mass_jobs.commands.common import add_rollout_phases, add_spec, agent_ended, open_run, work_dir_default
from mass_jobs.episodes import rollouts
from mass_jobs.run.generation_model import generation_servers
from mass_jobs.serving.llm import Endpoint
from mass_jobs.serving.servers import remote_servers
from mass_jobs.steps import evaluate as ev


def add_arguments(parser) -> None:
    add_spec(parser, gen="generation G >= 1 (L_G vs L_0 and L_{G-1})")
    parser.add_argument("--work-dir", default=work_dir_default(),
                        help="(default: $MASS_WORK_DIR or .mass-work) local cache for model dirs and server logs")
    parser.add_argument("--generation-endpoint", nargs=3, action="append", default=[], metavar=("G", "URL", "NAME"),
                        help="with --phase prepare / finish: L_G's OpenAI base URL and model name (repeat)")
    parser.add_argument("--judge-endpoint", nargs=3, action="append", default=[], metavar=("NAME", "URL", "MODEL"),
                        help="with --phase finish: where the executor serves the judge NAME of `endpoint: local` "
                             "(repeat; the cluster has none: its judges are external)")
    add_rollout_phases(parser, phases=("plan", "prepare", "ingest", "finish"),
                       phase="plan: the models to serve; prepare the missing rollouts; ingest one (--rollout); "
                             "finish: the rollouts ran in agent pods, judge against the endpoints, never run one here",
                       outputs="DIR/rollouts and DIR/models", lost="stores an infra_error rollout")


def main(args) -> int:


    ctx = open_run(args.spec)
    spec = ctx.spec
    if not 1 <= args.gen <= spec.generations:
        print(f"--gen: expected 1..{spec.generations} (generations), got {args.gen}", file=sys.stderr)
        return 2
    if args.phase == "ingest" and not args.rollout:
        print("--phase ingest needs --rollout (a key the prepare phase listed)", file=sys.stderr)
        return 2
    try:
        endpoints = {int(g): Endpoint(base_url=url, model=name) for g, url, name in args.generation_endpoint}
    except ValueError:
        print(f"--generation-endpoint: expected G URL NAME with G a generation, got {args.generation_endpoint}",
              file=sys.stderr)
        return 2

    def endpoint_of(g: int) -> Endpoint:
        if g not in endpoints:
            raise ValueError(f"--generation-endpoint: L_{g} is called but has no endpoint (given: {sorted(endpoints)})")
        return endpoints[g]

    try:
        if args.phase in ("plan", "prepare", "ingest"):
            out = (ev.plan(ctx, args.gen) if args.phase == "plan" else ev.prepare(ctx, args.gen, endpoint_of)
                   if args.phase == "prepare" else ev.ingest(ctx, args.gen, args.rollout, agent_ended=agent_ended(args)))
            rollouts.write_phase_outputs(args.outputs, args.phase, out)
            print(json.dumps(out, sort_keys=True))
            return 0
        if args.phase == "finish":
            local = {name: Endpoint(base_url=url, model=model) for name, url, model in args.judge_endpoint}
            unknown = sorted(set(local) - {j.name for j in spec.judges if j.endpoint == "local"})
            if unknown:
                print(f"--judge-endpoint: {unknown} are no judges of endpoint 'local' in the spec", file=sys.stderr)
                return 2
            serve_model, serve_judge = remote_servers(endpoint_of, local)
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
