"""A workflow's nodes as the Argo controller (v4.1) writes them in `status.nodes`: each node's id,
its NodeStatus fields and pod name, and the JSON and deflated sizes the controller measures."""

from __future__ import annotations

import base64
import gzip
import json
import math

HOST = "ip-10-0-128-200.ec2.internal"  # a node name of typical length (pods' hostNodeName)
START = 1_767_225_600  # 2026-01-01: the run's first second; node times follow from each id


def _time(seconds: int) -> str:
    import time

    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def node_id(workflow: str, name: str) -> str:
    """Argo's node id: the workflow name and the FNV-1a (32-bit) hash of the node's name."""
    h = 0x811C9DC5
    for b in name.encode():
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return f"{workflow}-{h}"


def node_status(
    workflow: str,
    name: str,
    kind: str,
    template: str,
    *,
    display: str = "",
    phase: str = "Succeeded",
    inputs: dict | None = None,
    outputs: dict | None = None,
    artifacts: list | None = None,
    boundary: str = "",
    children: list[str] = (),
    message: str = "",
    retried: bool = False,
    exit_code: str | None = None,
) -> dict:
    """One entry of `status.nodes` as the controller writes it: the fields it sets for a finished node
    of this kind, in NodeStatus's field order (Go marshals a struct's fields in declaration order).
    A Pod node, and a Retry node (which takes its last attempt's outputs), carries `outputs`;
    an attempt under a Retry node is flagged `retried`."""
    nid = node_id(workflow, name)
    # times as distinct as a real run's (they compress as poorly): spread over a week by the id's hash
    h = int(nid.rsplit("-", 1)[1])
    started, took = START + h % 604_800, 5 + h % 3_600
    node = {
        "id": nid,
        "name": name,
        "displayName": display or name.rsplit(".", 1)[-1],
        "type": kind,
        "templateName": template,
        "templateScope": "local/",
        "phase": phase,
    }
    if boundary:
        node["boundaryID"] = boundary
    if message:
        node["message"] = message
    node |= {"startedAt": _time(started), "finishedAt": _time(started + took), "progress": "1/1"}
    if kind == "Pod":
        node["resourcesDuration"] = {"cpu": took, "memory": 4 * took}
    if retried:
        node["nodeFlag"] = {"retried": True}
    if inputs:
        node["inputs"] = {"parameters": [{"name": k, "value": str(v)} for k, v in inputs.items()]}
    if kind in ("Pod", "Retry") and (outputs or artifacts or exit_code is not None or kind == "Pod"):
        out = {}  # Outputs' field order: parameters, artifacts, result, exitCode
        if outputs:
            out["parameters"] = [{"name": k, "value": str(v)} for k, v in outputs.items()]
        if artifacts:
            out["artifacts"] = list(artifacts)
        out["exitCode"] = "0" if exit_code is None else exit_code
        node["outputs"] = out
    if children:
        node["children"] = list(children)
    if kind == "Pod":
        node["hostNodeName"] = HOST
    return node


def pod_name(workflow: str, template: str, node_name: str) -> str:
    """The pod's name (POD_NAMES=v2, the controller's default): workflow-template-hash of the node's name."""
    return f"{workflow}-{template}-{node_id(workflow, node_name).rsplit('-', 1)[1]}"


def log_artifact(key_format: str, workflow: str, pod: str) -> dict:
    """The `main-logs` artifact the executor saves for each pod when the repository archives logs."""
    folder = key_format.replace("{{workflow.name}}", workflow).replace("{{pod.name}}", pod)
    return {"name": "main-logs", "s3": {"key": f"{folder}/main.log"}}


def nodes_json(nodes: dict) -> bytes:
    """`json.Marshal(status.nodes)` as Go writes it: the map's keys (node ids) sorted, each struct's
    fields in their order, `<`, `>` and `&` escaped, UTF-8 as is."""
    return _go_json({k: nodes[k] for k in sorted(nodes)})


# The controller's gzip is Go's (compress/flate, or klauspost's pgzip) at the default level, not
# zlib's: the two differ by a few percent on the same bytes, so the estimate adds this much.
DEFLATE_MARGIN = 1.05


def compressed_size(nodes: dict) -> int:
    """Bytes of `status.compressedNodes` for these nodes (the controller's CompressEncodeString: gzip
    of their JSON, then base64), with DEFLATE_MARGIN for the compressor's implementation. Children
    lists (node ids: hashes, which hardly compress) are counted at their full size: the bound errs high."""
    bare = {i: {k: v for k, v in n.items() if k != "children"} for i, n in nodes.items()}
    ids = sum(json_size(n["children"]) + len('"children":,') for n in nodes.values() if "children" in n)
    return math.ceil(len(base64.b64encode(gzip.compress(nodes_json(bare), compresslevel=6))) * DEFLATE_MARGIN) + ids


def json_size(obj) -> int:
    """Bytes of `obj` as Go's json.Marshal writes it (the object's own key order)."""
    return len(_go_json(obj))


def _go_json(obj) -> bytes:
    text = json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026").encode()
