"""The Workflow object's size as the Argo controller measures it (mass_jobs.k8s.workflow_size).

The controller marshals `status.nodes` with Go's encoding/json: a map's keys sorted, a struct's
fields in their declaration order, `<`, `>` and `&` escaped. The transcription below follows
those rules from the NodeStatus and Outputs structs of argo-workflows' workflow_types.go, written
out independently of the product's node builder, so a change of either shows here.
"""

from __future__ import annotations

import base64
import gzip
import json
import random

import pytest

from mass_jobs.k8s import workflow_nodes as WN
from mass_jobs.k8s import workflow_size as W

# NodeStatus's fields in declaration order (json names), and Outputs' and NodeFlag's.
NODE_STATUS_FIELDS = [
    "id",
    "name",
    "displayName",
    "type",
    "templateName",
    "templateRef",
    "templateScope",
    "phase",
    "boundaryID",
    "message",
    "startedAt",
    "finishedAt",
    "estimatedDuration",
    "progress",
    "resourcesDuration",
    "podIP",
    "daemoned",
    "nodeFlag",
    "inputs",
    "outputs",
    "children",
    "outboundNodes",
    "hostNodeName",
    "memoizationStatus",
    "synchronizationStatus",
]
OUTPUTS_FIELDS = ["parameters", "artifacts", "result", "exitCode"]
NODE_FLAG_FIELDS = ["hooked", "retried"]


def _go_string(s: str) -> str:
    out = json.dumps(s, ensure_ascii=False)
    for ch, esc in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026")):
        out = out.replace(ch, esc)
    return out


def _struct(obj: dict, order: list[str], nested: dict) -> str:
    assert set(obj) <= set(order), set(obj) - set(order)  # no field the struct lacks
    parts = [f'"{k}":' + nested.get(k, _value)(obj[k]) for k in order if k in obj]
    return "{" + ",".join(parts) + "}"


def _value(v) -> str:
    if isinstance(v, dict):  # a Go map (resourcesDuration) or a struct whose order is alphabetical here
        return "{" + ",".join(f"{_go_string(k)}:{_value(v[k])}" for k in sorted(v)) + "}"
    if isinstance(v, list):
        return "[" + ",".join(_value(x) for x in v) + "]"
    if isinstance(v, str):
        return _go_string(v)
    return json.dumps(v)


def _param(p: dict) -> str:  # Parameter: name, default, value, ...
    return _struct(p, ["name", "default", "value"], {})


def _artifact(a: dict) -> str:  # Artifact: name, path, ..., then the inline ArtifactLocation (s3)
    return _struct(a, ["name", "path", "s3"], {"s3": lambda s: _struct(s, ["key"], {})})


def go_marshal_nodes(nodes: dict) -> bytes:
    """json.Marshal(map[string]NodeStatus), transcribed."""
    nested = {
        "inputs": lambda i: _struct(
            i, ["parameters", "artifacts"], {"parameters": lambda ps: "[" + ",".join(map(_param, ps)) + "]"}
        ),
        "outputs": lambda o: _struct(
            o,
            OUTPUTS_FIELDS,
            {
                "parameters": lambda ps: "[" + ",".join(map(_param, ps)) + "]",
                "artifacts": lambda arts: "[" + ",".join(map(_artifact, arts)) + "]",
            },
        ),
        "nodeFlag": lambda f: _struct(f, NODE_FLAG_FIELDS, {}),
    }
    body = ",".join(f"{_go_string(k)}:{_struct(nodes[k], NODE_STATUS_FIELDS, nested)}" for k in sorted(nodes))
    return ("{" + body + "}").encode()


def _nodes(n: int, seed: int = 0) -> dict:
    """Nodes of every kind the estimate writes, added in a shuffled order."""
    rng = random.Random(seed)
    wf, out = "mass-run-x7k2p", {}
    for i in range(n):
        name = f"{wf}[0].cycle(0:gen:{i % 3})[{i % 5}].search-task(task:t-{i}&<x>)"
        kind = rng.choice(["Pod", "Retry", "Steps", "StepGroup", "Skipped"])
        node = WN.node_status(
            wf,
            name,
            kind,
            "search-prepare",
            boundary=f"{wf}-{i}",
            message="m" if i % 4 == 0 else "",
            inputs={"task": f"t-{i}", "json": '{"a": "<b>"}'},
            outputs={"rollouts": "[]"},
            artifacts=[
                WN.log_artifact(
                    "argo-artifacts/{{workflow.name}}/{{pod.name}}", wf, WN.pod_name(wf, "search-prepare", name)
                )
            ],
            children=[WN.node_id(wf, name + "(0)")] if kind in ("Retry", "Steps") else (),
            retried=kind == "Pod" and i % 2 == 0,
        )
        out[node["id"]] = node
    keys = list(out)
    rng.shuffle(keys)
    return {k: out[k] for k in keys}


@pytest.mark.unit
def test_the_node_map_is_marshalled_as_go_does():
    nodes = _nodes(200)
    assert WN.nodes_json(nodes) == go_marshal_nodes(nodes)
    assert b"\\u003cx\\u003e" in WN.nodes_json(nodes) and b"<" not in WN.nodes_json(nodes)


@pytest.mark.unit
def test_each_node_carries_what_the_controller_writes_for_its_kind():
    wf = "mass-run-x7k2p"
    pod = WN.node_status(
        wf,
        "a(0)",
        "Pod",
        "collect",
        outputs={"rollout": "r"},
        retried=True,
        artifacts=[
            WN.log_artifact("argo-artifacts/{{workflow.name}}/{{pod.name}}", wf, WN.pod_name(wf, "collect", "a(0)"))
        ],
    )
    assert pod["nodeFlag"] == {"retried": True} and pod["hostNodeName"] and pod["resourcesDuration"]
    assert list(pod["outputs"]) == ["parameters", "artifacts", "exitCode"]
    (log,) = pod["outputs"]["artifacts"]
    assert log == {
        "name": "main-logs",
        "s3": {"key": f"argo-artifacts/{wf}/{wf}-collect-{pod['id'].rsplit('-', 1)[1]}/main.log"},
    }
    retry = WN.node_status(wf, "a", "Retry", "collect", outputs={"rollout": "r"}, artifacts=[log], children=[pod["id"]])
    assert retry["outputs"] == pod["outputs"] and "hostNodeName" not in retry and "nodeFlag" not in retry
    group = WN.node_status(wf, "a[0]", "StepGroup", "cycle", children=[retry["id"]])
    assert "outputs" not in group and "resourcesDuration" not in group


@pytest.mark.unit
def test_compressed_size_errs_high_of_the_exact_gzip_in_id_order():
    """Against the exact bytes the controller compresses (the transcription above), the estimate is
    never below them and within DEFLATE_MARGIN plus the uncompressed child lists above."""
    nodes = _nodes(600, seed=3)
    exact = len(base64.b64encode(gzip.compress(go_marshal_nodes(nodes), compresslevel=6)))
    children = sum(
        len(json.dumps(n["children"], separators=(",", ":"))) + len('"children":,')
        for n in nodes.values()
        if "children" in n
    )
    est = WN.compressed_size(nodes)
    assert exact <= est <= exact * WN.DEFLATE_MARGIN + children + 1


def test_the_papers_spec_fits_five_generations_and_not_six():
    """docs/kubernetes.md's numbers: about 1,300 nodes a generation, the 6th past 1 MiB compressed
    (the controller's own order, logs and Retry outputs; the estimate before them said 7 fit)."""
    from mass_jobs.spec.load import load_spec

    sizes = W.estimate(load_spec("examples/paper.yaml").model_copy(update={"generations": 6}))
    assert 1250 <= sizes[0].nodes <= 1350
    assert [s.fits() for s in sizes] == [True] * 5 + [False]
    assert all(s.stored_bytes == s.fixed_bytes + s.compressed_bytes for s in sizes)
