"""What the real controllers refuse or stop, ported into the test executor, each shown on a small
template that breaks the rule (and passes when it keeps it), plus the properties of the generated
templates that keep them clear of each rule.

Ported: Argo's recursion limit (maxAllowedStackDepth), retry backoff maxDuration as a deadline,
synchronization locks held by a Retry node across attempts, container memory limits enforced by
the kernel on the whole process tree.
"""

from __future__ import annotations

import threading
import time

import pytest

from tests.fixtures.argo_cluster import REPO, container, wft
from tests.fixtures.argo_exec.controller import MAX_STACK_DEPTH

pytestmark = pytest.mark.argo_exec

VOL = [{"name": "tmp", "emptyDir": {}}]


# ---------------------------------------------------------------- recursion depth


def recursion(levels: int, retried_leaf: bool | None = None) -> dict:
    """main -> rec(levels) -> ... -> rec(0): rec(k) sits at depth levels - k + 2; rec(0) may call a leaf pod."""
    leaf_step = (
        [[{"name": "leaf", "template": "leaf", "when": "{{inputs.parameters.k}} == 0"}]]
        if retried_leaf is not None
        else []
    )
    leaf = {"name": "leaf", "container": container("true"), "volumes": VOL}
    if retried_leaf:
        leaf["retryStrategy"] = {"limit": "1"}
    return wft(
        "deep",
        [
            {
                "name": "main",
                "steps": [
                    [
                        {
                            "name": "rec",
                            "template": "rec",
                            "arguments": {"parameters": [{"name": "k", "value": str(levels)}]},
                        }
                    ]
                ],
            },
            {
                "name": "rec",
                "inputs": {"parameters": [{"name": "k"}]},
                "steps": [
                    [
                        {
                            "name": "again",
                            "template": "rec",
                            "when": "{{inputs.parameters.k}} > 0",
                            "arguments": {
                                "parameters": [{"name": "k", "value": "{{=asInt(inputs.parameters.k) - 1}}"}]
                            },
                        }
                    ],
                    *leaf_step,
                ],
            },
            leaf,
        ],
    )


def test_recursion_past_argos_stack_limit_errors_the_workflow(executor_for):
    ok = executor_for(recursion(MAX_STACK_DEPTH - 3)).submit("deep", {})
    assert ok.phase == "Succeeded", ok.summary()
    assert ok.max_depth == MAX_STACK_DEPTH - 1  # the deepest template Argo still runs
    deep = executor_for(recursion(MAX_STACK_DEPTH - 2)).submit("deep", {})
    assert deep.phase == "Error"
    assert deep.message.startswith("error in entry template execution: Maximum recursion depth exceeded")
    assert [n.phase for n in deep.nodes if "Maximum recursion" in n.message] == ["Error"]


def test_a_retried_template_needs_one_level_more(executor_for):
    # the leaf pod sits at depth 99: plain it runs, retried its finished child re-enters one level deeper
    plain = executor_for(recursion(MAX_STACK_DEPTH - 4, retried_leaf=False)).submit("deep", {})
    assert plain.phase == "Succeeded" and plain.max_depth == MAX_STACK_DEPTH - 1, plain.summary()
    # (the recursion's own steps are not retried: 99 is the leaf, and no re-entry goes deeper)
    retried = executor_for(recursion(MAX_STACK_DEPTH - 4, retried_leaf=True)).submit("deep", {})
    assert retried.phase == "Error" and "Maximum recursion depth exceeded" in retried.message


# ---------------------------------------------------------------- retry maxDuration


def test_max_duration_is_a_deadline_from_the_first_attempt(executor_for):
    templates = [
        {
            "name": "main",
            "steps": [
                [
                    {"name": "slow", "template": "slow", "continueOn": {"failed": True}},
                    {"name": "quick", "template": "quick"},
                ]
            ],
        },
        # runs 30 s on its first attempt: the 3 s maxDuration kills it there and allows no retry
        {
            "name": "slow",
            "container": container("sleep 30"),
            "volumes": VOL,
            "retryStrategy": {
                "limit": "3",
                "retryPolicy": "Always",
                "backoff": {"duration": "1s", "maxDuration": "3s"},
            },
        },
        # fails fast twice within its maxDuration: retried as usual
        {
            "name": "quick",
            "container": container("test {{retries}} -ge 2"),
            "volumes": VOL,
            "retryStrategy": {
                "limit": "3",
                "retryPolicy": "Always",
                "backoff": {"duration": "1s", "maxDuration": "60s"},
            },
        },
    ]
    wf = executor_for(wft("md", templates)).submit("md", {})
    assert wf.phase == "Succeeded", wf.summary()
    slow = next(n for n in wf.find(type="Retry") if n.name.endswith(".slow"))
    attempts = wf.find(template="slow", type="Pod")
    assert slow.phase == "Failed" and slow.message == "Max duration limit exceeded"
    assert len(attempts) == 1 and "deadline" in attempts[0].message
    assert attempts[0].finished - attempts[0].started < 15  # killed at the deadline, not after its 30 s
    quick = next(n for n in wf.find(type="Retry") if n.name.endswith(".quick"))
    assert quick.phase == "Succeeded" and len(wf.find(template="quick", type="Pod")) == 3


def test_generated_retries_set_no_deadline_shorter_than_their_pods():
    """A maxDuration is a deadline on every attempt: on a step pod without its own deadline it
    would cut a long step (rank, merge, evaluate at paper scale) and forbid its retry."""
    import yaml

    from tests.fixtures.argo_exec.controller import _duration

    found = []
    for path in sorted((REPO / "argo").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            for t in (doc or {}).get("spec", {}).get("templates", []):
                backoff = (t.get("retryStrategy") or {}).get("backoff") or {}
                own = t.get("activeDeadlineSeconds")
                if backoff.get("maxDuration") and (own is None or _duration(backoff["maxDuration"]) < float(own)):
                    found.append((path.name, t["name"], backoff["maxDuration"], t.get("activeDeadlineSeconds")))
    assert found == []


# ---------------------------------------------------------------- locks across retries


def test_a_retried_templates_mutex_is_held_across_its_attempts(executor_for):
    templates = [
        {"name": "main", "steps": [[{"name": "a", "template": "locked"}, {"name": "b", "template": "locked"}]]},
        {
            "name": "locked",
            "container": container("sleep 0.3; test {{retries}} -ge 1"),
            "volumes": VOL,
            "synchronization": {"mutexes": [{"name": "one-writer"}]},
            "retryStrategy": {"limit": "2", "retryPolicy": "Always", "backoff": {"duration": "1s"}},
        },
    ]
    wf = executor_for(wft("mx", templates), backoff_scale=1.0).submit("mx", {})
    assert wf.phase == "Succeeded", wf.summary()
    pods = sorted(wf.find(template="locked", type="Pod"), key=lambda n: n.started)
    owners = [p.name.split(".")[-1].split("(")[0] for p in pods]
    assert len(pods) == 4 and owners in (["a", "a", "b", "b"], ["b", "b", "a", "a"])  # never a0 b0 a1 b1
    assert all(x.finished <= y.started for x, y in zip(pods, pods[1:]))


# ---------------------------------------------------------------- memory limits

ALLOC = "python3 -c 'import sys; b = bytearray(int(sys.argv[1]) << 20); b[::4096] = b\"x\" * len(b[::4096]); import time; time.sleep(2)'"


def test_memory_limit_holds_the_whole_process_tree(executor_for):
    templates = [
        {
            "name": "main",
            "steps": [
                [
                    {
                        "name": "under",
                        "template": "alloc",
                        "continueOn": {"failed": True},
                        "arguments": {"parameters": [{"name": "mb", "value": "16"}, {"name": "n", "value": "1"}]},
                    },
                    {
                        "name": "one-over",
                        "template": "alloc",
                        "continueOn": {"failed": True},
                        "arguments": {"parameters": [{"name": "mb", "value": "200"}, {"name": "n", "value": "1"}]},
                    },
                    # three processes each under the limit, together over it: only a tree-wide limit sees it
                    {
                        "name": "tree-over",
                        "template": "alloc",
                        "continueOn": {"failed": True},
                        "arguments": {"parameters": [{"name": "mb", "value": "45"}, {"name": "n", "value": "3"}]},
                    },
                ]
            ],
        },
        {
            "name": "alloc",
            "inputs": {"parameters": [{"name": "mb"}, {"name": "n"}]},
            "volumes": VOL,
            "container": container(
                f"pids=; for i in $(seq {{{{inputs.parameters.n}}}}); do {ALLOC} "
                '{{inputs.parameters.mb}} & pids="$pids $!"; sleep 0.5; done; '
                "for p in $pids; do wait $p || exit $?; done",
                resources={"limits": {"memory": "96Mi", "cpu": "1"}},
            ),
        },
    ]
    wf = executor_for(wft("mem", templates)).submit("mem", {})
    assert wf.phase == "Succeeded", wf.summary()
    by = {n.name.rsplit(".", 1)[-1]: n for n in wf.find(template="alloc", type="Pod")}
    assert by["under"].phase == "Succeeded", by["under"].message
    for name in ("one-over", "tree-over"):
        assert by[name].phase == "Failed" and by[name].message.startswith("main: OOMKilled"), (name, by[name].message)


def test_a_memory_limit_that_cannot_be_enforced_fails_the_pod(executor_for):
    templates = [
        {"name": "main", "volumes": VOL, "container": container("true", resources={"limits": {"memory": "lots"}})}
    ]
    wf = executor_for(wft("bad", templates)).submit("bad", {})
    assert wf.phase in ("Error", "Failed")
    assert "resources.limits.memory 'lots'" in wf.find(type="Pod")[0].message


# ---------------------------------------------------------------- what argo submit refuses


def _echo(name="echo", **extra) -> dict:
    return {"name": name, "container": container("true"), "volumes": VOL, **extra}


LINT_CASES = {
    "unknown template": (
        [{"name": "main", "steps": [[{"name": "a", "template": "nope"}]]}],
        "templates.main.steps[0].a: template name 'nope' undefined",
    ),
    "step output of a later group": (
        [
            {
                "name": "main",
                "steps": [
                    [
                        {
                            "name": "a",
                            "template": "echo",
                            "arguments": {"parameters": [{"name": "v", "value": "{{steps.b.outputs.parameters.out}}"}]},
                        }
                    ],
                    [{"name": "b", "template": "echo"}],
                ],
            },
            _echo(
                inputs={"parameters": [{"name": "v", "value": ""}]},
                outputs={"parameters": [{"name": "out", "valueFrom": {"path": "/tmp/o", "default": ""}}]},
            ),
        ],
        "templates.main.steps[0].a failed to resolve {{steps.b.outputs.parameters.out}}",
    ),
    "undeclared input": (
        [{"name": "main", "container": container("echo {{inputs.parameters.x}}"), "volumes": VOL}],
        "templates.main failed to resolve {{inputs.parameters.x}}",
    ),
    "item outside a loop": (
        [{"name": "main", "steps": [[{"name": "a", "template": "echo", "when": "{{item}} == 1"}]]}, _echo()],
        "templates.main.steps[0].a failed to resolve {{item}}",
    ),
    "missing argument": (
        [
            {"name": "main", "steps": [[{"name": "a", "template": "echo"}]]},
            _echo(inputs={"parameters": [{"name": "v"}]}),
        ],
        "templates.main.steps[0].a inputs.parameters.v was not supplied",
    ),
    "two types": (
        [{"name": "main", "container": container("true"), "steps": [], "volumes": VOL}],
        "templates.main multiple template types specified",
    ),
    "duplicate step": (
        [{"name": "main", "steps": [[{"name": "a", "template": "echo"}, {"name": "a", "template": "echo"}]]}, _echo()],
        "templates.main.steps[0] steps name 'a' is not unique",
    ),
    "bad template name": (
        [{"name": "main", "steps": [[{"name": "a", "template": "b_c"}]]}, _echo("b_c")],
        "spec.templates templates name 'b_c' is invalid",
    ),
    "output without source": (
        [_echo("main", outputs={"parameters": [{"name": "o"}]})],
        "templates.main.outputs.parameters.o does not have valueFrom or value specified",
    ),
    "bad backoff": (
        [_echo("main", retryStrategy={"limit": 1, "backoff": {"duration": "thirty"}})],
        "templates.main.retryStrategy.backoff.duration 'thirty' is not a duration",
    ),
    "bad resource action": (
        [{"name": "main", "resource": {"action": "upsert", "manifest": "kind: X"}}],
        "templates.main.resource.action should be one of",
    ),
}


@pytest.mark.parametrize("case", sorted(LINT_CASES))
def test_argo_submit_refuses_what_validate_refuses(executor_for, case):
    from tests.fixtures.argo_exec import SubmitRefused

    templates, expected = LINT_CASES[case]
    ex = executor_for(wft("lint", templates))
    with pytest.raises(SubmitRefused) as err:
        ex.submit("lint", {})
    assert expected in str(err.value)
    assert not list((ex.workdir).glob("lint-*"))  # nothing ran


def test_the_generated_templates_pass_argo_lint():
    import yaml

    from tests.fixtures.argo_exec.validate import lint, lint_cron

    docs = [d for f in sorted((REPO / "argo").glob("*.yaml")) for d in yaml.safe_load_all(f.read_text()) if d]
    wfts = {d["metadata"]["name"]: d for d in docs if d["kind"] == "WorkflowTemplate"}
    crons = [d for d in docs if d["kind"] == "CronWorkflow"]
    assert sorted(wfts) == ["mass-cycle", "mass-run"] and len(crons) == 1
    assert {n: lint(wfts, n) for n in wfts} == {"mass-cycle": [], "mass-run": []}
    assert lint_cron(crons[0], wfts) == []
    # a new required input on a template the cycle calls: submitting mass-run (which reaches the
    # cycle by templateRef) is refused, naming the caller that does not pass it
    broken = yaml.safe_load(yaml.safe_dump(wfts["mass-cycle"]))
    ingest = next(t for t in broken["spec"]["templates"] if t["name"] == "search-ingest")
    ingest["inputs"]["parameters"].append({"name": "never-given"})
    assert lint({**wfts, "mass-cycle": broken}, "mass-run") == [
        "templates.search-rollout.steps[1].ingest inputs.parameters.never-given was not supplied"
    ]


# ---------------------------------------------------------------- deleting a job: cascade


def _job_and_delete(name: str, cascade: str | None) -> list[dict]:
    from tests.fixtures.argo_cluster import pytorchjob

    job = pytorchjob(name, 1, "sleep 60")
    job["resource"] = {k: v for k, v in job["resource"].items() if not k.endswith("Condition")}  # created, not awaited
    delete = pytorchjob(name, 1, "true", action="delete")
    delete["resource"] = {
        "action": "delete",
        "manifest": delete["resource"]["manifest"],
        "flags": ["--ignore-not-found", *([f"--cascade={cascade}"] if cascade else [])],
    }
    return [
        {"name": "create", "steps": [[{"name": "job", "template": "job"}]]},
        job,
        {"name": "delete", "steps": [[{"name": "job", "template": "del"}]]},
        {**delete, "name": "del"},
    ]


@pytest.mark.parametrize("cascade", [None, "foreground"])
def test_a_background_delete_returns_while_the_jobs_pods_still_run(executor_for, cascade):
    """kubectl delete --wait waits for the object; its pods go with it only in foreground."""
    from tests.fixtures.argo_exec.resources import GC_DELAY_S

    ex = executor_for(wft("jd", _job_and_delete("old", cascade), entrypoint="create"))
    assert ex.submit("jd", {}).phase == "Succeeded"
    pods = [h.pod for h in ex.cluster.procs[("PyTorchJob", "old")]]
    for _ in range(100):
        if all(p is not None for p in pods):
            break
        time.sleep(0.05)
    ex.templates["jd"]["spec"]["entrypoint"] = "delete"
    assert ex.submit("jd", {}).phase == "Succeeded" and ex.cluster.get("PyTorchJob", "old") is None
    alive = [p.proc.poll() is None for p in pods]
    if cascade == "foreground":
        assert alive == [False, False]  # the delete returned after the pods were gone
    else:
        assert alive == [True, True]  # background: the object is gone, its Master still runs
        time.sleep(GC_DELAY_S + 2)
        assert [p.proc.poll() is None for p in pods] == [False, False]


# ---------------------------------------------------------------- NetworkPolicy


def test_a_network_policy_holds_the_pods_it_selects(executor_for):
    """An agent-like pod (selected) reaches the allowed service and nothing else, the host's own
    loopback servers included; a pod no policy selects reaches both."""
    import http.server

    class Ok(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *a):
            pass

    servers = [http.server.ThreadingHTTPServer(("127.0.0.1", 0), Ok) for _ in range(2)]
    for srv in servers:
        threading.Thread(target=srv.serve_forever, daemon=True).start()
    model, other = (srv.server_address[1] for srv in servers)
    policy = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "agent-egress"},
        "spec": {
            "podSelector": {"matchLabels": {"role": "agent"}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [],
            "egress": [
                {
                    "to": [{"podSelector": {"matchLabels": {"role": "model"}}}],
                    "ports": [{"port": 8080, "protocol": "TCP"}],
                }
            ],
        },
    }
    probe = (
        "for url in http://model-predictor.mass-jobs.svc.cluster.local/ http://127.0.0.1:%d/; do "
        "python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=5)' $url "
        "&& echo reached >> /tmp/r || echo failed >> /tmp/r; done" % other
    )
    pod = {
        "container": container(probe),
        "volumes": VOL,
        "outputs": {"parameters": [{"name": "r", "valueFrom": {"path": "/tmp/r"}}]},
    }
    templates = [
        {"name": "main", "steps": [[{"name": "agent", "template": "agent"}, {"name": "step", "template": "step"}]]},
        {"name": "agent", "metadata": {"labels": {"role": "agent"}}, **pod},
        {"name": "step", "metadata": {"labels": {"role": "step"}}, **pod},
    ]
    host = "model-predictor.mass-jobs.svc.cluster.local"

    def run(policy_doc) -> dict[str, list[str]]:
        ex = executor_for(wft("np", templates), policy_doc)
        ex.cluster.services[host] = model
        ex.cluster.service_pods[host] = ({"role": "model"}, 8080)
        wf = ex.submit("np", {})
        assert wf.phase == "Succeeded", wf.summary()
        return {n.template: n.outputs["r"].split() for n in wf.find(type="Pod")}

    try:
        assert run(policy) == {"agent": ["reached", "failed"], "step": ["reached", "reached"]}
        # with the model's port left out of the policy the agent pod reaches nothing
        policy["spec"]["egress"][0]["ports"] = [{"port": 9999, "protocol": "TCP"}]
        assert run(policy) == {"agent": ["failed", "failed"], "step": ["reached", "reached"]}
    finally:
        for srv in servers:
            srv.shutdown()
            srv.server_close()


def test_the_agent_pods_of_the_chart_are_held_by_its_policies():
    """The policies the chart renders select the agent pods (and only them) and allow the
    predictor's pods on 8080: the executor enforces exactly these on every agent pod of a run."""
    import yaml

    from tests.fixtures.argo_cluster import chart_docs
    from tests.fixtures.argo_exec.network import Policies

    docs = chart_docs()
    policies = Policies(docs, "mass-jobs")
    cycle = next(d for d in docs if d["kind"] == "WorkflowTemplate" and d["metadata"]["name"] == "mass-cycle")
    held = sorted(
        t["name"]
        for t in cycle["spec"]["templates"]
        if policies.egress((t.get("metadata") or {}).get("labels") or {}) is not None
    )
    assert held == ["agent-episode"]
    agent = next(t for t in cycle["spec"]["templates"] if t["name"] == "agent-episode")
    rules = policies.egress(agent["metadata"]["labels"])
    serve = next(t for t in cycle["spec"]["templates"] if t["name"] == "serve-model-apply")
    predictor = yaml.safe_load(serve["resource"]["manifest"])["spec"]["predictor"]["labels"]
    assert policies.allows(rules, predictor, 8080) and not policies.allows(rules, predictor, 9000)
    step = next(t for t in cycle["spec"]["templates"] if t["name"] == "validate")
    assert not policies.allows(rules, step["metadata"]["labels"], 8080)  # no other pod of the cycle


# ---------------------------------------------------------------- unresolved at run time


def test_a_skipped_steps_output_is_a_hang_not_an_error(executor_for):
    """argo lint accepts it (the step is earlier); at run time the skipped step has no outputs and
    the controller requeues forever. The executor reports the hang; a default resolves it."""

    def templates(default: bool):
        out = {"name": "out", "valueFrom": {"path": "/tmp/o", **({"default": "none"} if default else {})}}
        return [
            {
                "name": "main",
                "steps": [
                    [{"name": "maybe", "template": "emit", "when": "1 == 2"}],
                    [
                        {
                            "name": "use",
                            "template": "echo",
                            "arguments": {
                                "parameters": [{"name": "v", "value": "{{steps.maybe.outputs.parameters.out}}"}]
                            },
                        }
                    ],
                ],
            },
            {
                "name": "emit",
                "container": container("echo x > /tmp/o"),
                "volumes": VOL,
                "outputs": {"parameters": [out]},
            },
            {"name": "echo", "inputs": {"parameters": [{"name": "v"}]}, "container": container("true"), "volumes": VOL},
        ]

    wf = executor_for(wft("hang", templates(False))).submit("hang", {})
    assert wf.phase == "Hung" and "{{steps.maybe.outputs.parameters.out}}" in wf.message and "skipped" in wf.message
    assert not wf.find(template="echo")
    wf = executor_for(wft("hang", templates(True))).submit("hang", {})
    assert wf.phase == "Succeeded", wf.summary()
    assert [n.inputs for n in wf.find(template="echo")] == [{"v": "none"}]


def test_a_fanned_out_steps_status_is_its_groups(executor_for):
    """After withParam, `steps.X.status` is the StepGroup's (Succeeded once the group passed, a
    failed child under continueOn included): a template must not read it as a child's."""
    templates = [
        {
            "name": "main",
            "steps": [
                [
                    {
                        "name": "each",
                        "template": "code",
                        "withItems": ["0", "1"],
                        "continueOn": {"failed": True},
                        "arguments": {"parameters": [{"name": "c", "value": "{{item}}"}]},
                    }
                ],
                [
                    {
                        "name": "after",
                        "template": "echo",
                        "arguments": {"parameters": [{"name": "v", "value": "{{steps.each.status}}"}]},
                    }
                ],
            ],
        },
        {
            "name": "code",
            "inputs": {"parameters": [{"name": "c"}]},
            "container": container("exit {{inputs.parameters.c}}"),
            "volumes": VOL,
        },
        {"name": "echo", "inputs": {"parameters": [{"name": "v"}]}, "container": container("true"), "volumes": VOL},
    ]
    wf = executor_for(wft("fan", templates)).submit("fan", {})
    assert wf.phase == "Succeeded", wf.summary()
    assert sorted(n.phase for n in wf.find(template="code")) == ["Failed", "Succeeded"]
    assert [n.inputs for n in wf.find(template="echo")] == [{"v": "Succeeded"}]


def test_parallelism_one_runs_a_fan_outs_items_one_by_one_in_their_order(executor_for):
    """A steps template's `parallelism` counts its active children (a steps template among them), and
    executeStepGroup starts a group's items in order: evaluate's rounds rely on both (one model
    served at a time, L_0's self-verdicts after L_1's rollouts)."""
    templates = [
        {
            "name": "main",
            "parallelism": 1,
            "steps": [
                [
                    {
                        "name": "round",
                        "template": "round",
                        "withItems": ["3", "0", "2", "1"],
                        "arguments": {"parameters": [{"name": "k", "value": "{{item}}"}]},
                    }
                ]
            ],
        },
        {
            "name": "round",
            "inputs": {"parameters": [{"name": "k"}]},
            "steps": [
                [
                    {
                        "name": "a",
                        "template": "nap",
                        "arguments": {"parameters": [{"name": "k", "value": "{{inputs.parameters.k}}"}]},
                    },
                    {
                        "name": "b",
                        "template": "nap",
                        "arguments": {"parameters": [{"name": "k", "value": "{{inputs.parameters.k}}"}]},
                    },
                ]
            ],
        },
        {
            "name": "nap",
            "inputs": {"parameters": [{"name": "k"}]},
            "volumes": VOL,
            "container": container("sleep 0.{{inputs.parameters.k}}"),
        },
    ]
    wf = executor_for(wft("rounds", templates)).submit("rounds", {})
    assert wf.phase == "Succeeded", wf.summary()
    rounds = sorted(wf.find(template="round", type="Steps"), key=lambda n: n.started)
    assert [n.inputs["k"] for n in rounds] == ["3", "0", "2", "1"]
    assert all(b.started >= a.finished for a, b in zip(rounds, rounds[1:]))  # one at a time
    assert len(wf.find(template="nap", type="Pod")) == 8  # the pods inside a round are not counted: all ran


# ---------------------------------------------------------------- ephemeral storage


def test_a_pod_past_its_ephemeral_storage_is_evicted(executor_for):
    """The kubelet's eviction manager: disk use of the pod's emptyDirs past its containers' limits."""
    templates = [
        {
            "name": "main",
            "steps": [
                [
                    {
                        "name": "small",
                        "template": "write",
                        "continueOn": {"failed": True},
                        "arguments": {"parameters": [{"name": "mb", "value": "2"}]},
                    },
                    {
                        "name": "big",
                        "template": "write",
                        "continueOn": {"failed": True},
                        "arguments": {"parameters": [{"name": "mb", "value": "64"}]},
                    },
                ]
            ],
        },
        {
            "name": "write",
            "inputs": {"parameters": [{"name": "mb"}]},
            "volumes": VOL,
            "container": container(
                "head -c {{inputs.parameters.mb}}M /dev/urandom > /tmp/blob; sleep 4",
                resources={"limits": {"ephemeral-storage": "16Mi"}},
            ),
        },
    ]
    wf = executor_for(wft("eph", templates)).submit("eph", {})
    assert wf.phase == "Succeeded", wf.summary()
    by = {n.name.rsplit(".", 1)[-1]: n for n in wf.find(template="write", type="Pod")}
    assert by["small"].phase == "Succeeded", by["small"].message
    assert by["big"].phase == "Failed"
    assert by["big"].message == "Pod ephemeral local storage usage exceeds the total limit of containers 16Mi."
