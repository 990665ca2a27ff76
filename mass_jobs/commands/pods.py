"""`mass pods RUN`: the run's Workflow, pods and GPU objects on the cluster, read-only
(mass_jobs/cluster/pods.py): where each episode runs, why a pod is Pending or ended, where its logs are."""

from __future__ import annotations

import json
import sys
import time


def add_arguments(parser) -> None:
    parser.add_argument(
        "run",
        help="the run's name (the spec's `name`, argo submit -p run=...) or its spec "
        "(a YAML/JSON path or an s3:// URI)",
    )
    parser.add_argument("--kubeconfig", metavar="PATH", help="the kubeconfig (default: KUBECONFIG, ~/.kube/config)")
    parser.add_argument("--context", metavar="NAME", help="the kubeconfig context (default: its current one)")
    parser.add_argument("--namespace", metavar="NS", help="the run's namespace (default: the context's)")
    parser.add_argument("--json", action="store_true", help="one JSON object instead of tables")
    parser.add_argument(
        "--watch",
        type=float,
        nargs="?",
        const=5.0,
        metavar="SECONDS",
        help="redraw every SECONDS (default 5) until interrupted",
    )


def run_name(target: str) -> str:
    if target.startswith("s3://") or target.endswith((".yaml", ".yml", ".json")):
        from mass_jobs.spec.load import load_spec

        return load_spec(target).name
    return target


def main(args) -> int:
    from mass_jobs.cluster.api import Cluster, Unreachable
    from mass_jobs.cluster.pods import render, view
    from mass_jobs.spec.load import SpecError, SpecIssue

    run = run_name(args.run)
    try:
        cluster = Cluster.connect(args.kubeconfig, args.context, args.namespace)
        while True:
            found = view(cluster, run)
            if args.json:
                print(json.dumps(found, sort_keys=True))
            else:
                if args.watch and sys.stdout.isatty():
                    print("\033[2J\033[H", end="")  # clear the terminal, cursor home
                print(render(found), flush=True)
            if not args.watch:
                return 0
            time.sleep(args.watch)
    except KeyboardInterrupt:  # how a watch ends
        return 0
    except Unreachable as err:
        raise SpecError(args.run, [SpecIssue("--kubeconfig", str(err))], what="arguments") from None
