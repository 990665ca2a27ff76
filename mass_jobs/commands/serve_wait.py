"""`mass serve-wait NAME`: the serve step's second part, after the InferenceService is applied: wait
until KServe serves the model, or fail naming why it cannot (mass_jobs/cluster/model_wait.py). Run in
a pod whose account may read the InferenceService and list pods; from a workstation it reads the
kubeconfig's context, as `mass pods` does."""

from __future__ import annotations

import sys


def add_arguments(parser) -> None:
    parser.add_argument("name", help="the InferenceService's name")
    parser.add_argument(
        "--pending-timeout",
        type=float,
        default=900.0,
        metavar="SECONDS",
        help="fail once a predictor pod is held this long: unscheduled, queued or its image not "
        "pulling (scheduling.pendingTimeoutSeconds, plus the queue's bound; 0: no bound)",
    )
    parser.add_argument(
        "--ready-timeout",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="fail once the model is not served after this long (model.readyDeadlineSeconds; 0: no deadline)",
    )
    parser.add_argument("--poll", type=float, default=5.0, metavar="SECONDS", help="seconds between readings")
    parser.add_argument("--kubeconfig", metavar="PATH", help="the kubeconfig (default: the pod's account)")
    parser.add_argument("--namespace", metavar="NS", help="the namespace (default: the pod's, or the context's)")


def main(args) -> int:
    from mass_jobs.cluster.api import Cluster, Unreachable
    from mass_jobs.cluster.model_wait import ModelNotServed, wait

    try:
        cluster = Cluster.connect(args.kubeconfig, namespace=args.namespace)
        wait(cluster, args.name, args.pending_timeout, args.ready_timeout, args.poll)
    except (ModelNotServed, Unreachable) as err:
        # the last line of the log: the pod's termination message (FallbackToLogsOnError), so
        # Argo's node message names it. 2: waiting again would end the same way (the step's retry
        # leaves it), where a pod lost with its node is retried
        print(f"mass serve-wait: {err}", file=sys.stderr, flush=True)
        return 2
    return 0
