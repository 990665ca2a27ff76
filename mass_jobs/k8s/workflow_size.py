"""How large a run's Workflow object grows, as the Argo controller measures it, before `argo submit`.

Argo (v4.1) keeps a workflow in one Kubernetes object: its spec, `status.storedTemplates` (every
template of a WorkflowTemplate it ran, here all of mass-cycle's and mass-run's) and `status.nodes`,
one entry per node. Before each update it measures the JSON of the whole object; past
`MAX_WORKFLOW_SIZE` (the controller's environment, 1 MiB by default, under etcd's request limit) it
replaces `status.nodes` by `status.compressedNodes` (gzip, then base64) and, still past it, fails
the workflow "workflow is longer than maximum allowed size", unless node status offloading is on
(`persistence.nodeStatusOffLoad: true` with a Postgres or MySQL database in the
workflow-controller-configmap), which moves the nodes into the database.

`mass-run` holds every generation's nodes in one Workflow. `estimate` walks the generated templates
as the controller expands them (a Steps node per steps template, a StepGroup per group, a node per
fanned-out item named with its item, a Retry node above each retried attempt, a Skipped node for a
false `when`), with the fan-outs `mass plan` counts (their upper bounds where the data decides) and
every step succeeding at its first attempt, and sizes the nodes in Argo's NodeStatus shape.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass

from mass_jobs.config.run_spec import RunSpec
from mass_jobs.episodes import rollouts
from mass_jobs.k8s import argo
from mass_jobs.k8s.manifests import ARTIFACT_KEY_FORMAT
from mass_jobs.k8s.settings import ClusterSettings
from mass_jobs.k8s.workflow_nodes import (
    compressed_size,
    json_size,
    log_artifact,
    node_id,
    node_status,
    nodes_json,
    pod_name,
)
from mass_jobs.pipeline.table import argo_outputs
from mass_jobs.run.context import RunContext
from mass_jobs.steps import evaluate

MAX_WORKFLOW_SIZE = 1024 * 1024  # the controller's MAX_WORKFLOW_SIZE default


_REF = re.compile(r"\{\{\s*(=?[^}]+?)\s*\}\}")
_PLUS = re.compile(r"^=asInt\(([\w.\-]+)\)\s*\+\s*(\d+)$")


def _sub(text: str, scope: dict) -> str:
    def one(m):
        expr = m.group(1)
        if (p := _PLUS.match(expr)) and p.group(1) in scope:
            return str(int(scope[p.group(1)]) + int(p.group(2)))
        return str(scope.get(expr, m.group(0)))

    return _REF.sub(one, str(text))


class _Walk:
    """The controller's expansion of the templates into nodes, on the success path."""

    def __init__(self, spec, workflow: str, docs: dict[str, dict]):

        self.spec, self.workflow, self.docs = spec, workflow, docs
        self.ctx = RunContext(spec, None)
        self.nodes: dict[str, dict] = {}
        self.generation: dict[str, int] = {}  # node id -> the generation whose cycle made it
        self.gen = 0

    def template(self, wft: str, name: str) -> dict:
        return next(t for t in self.docs[wft]["spec"]["templates"] if t["name"] == name)

    def add(self, name: str, kind: str, template: str, boundary: str, **kw) -> str:
        node = node_status(self.workflow, name, kind, template, boundary=boundary, **kw)
        self.nodes[node["id"]] = node
        self.generation[node["id"]] = self.gen
        return node["id"]

    def run(
        self, wft: str, tmpl_name: str, inputs: dict, name: str, boundary: str, display: str = ""
    ) -> tuple[str, dict]:
        """A template invoked as node `name`: (its node id, its output parameters)."""
        tmpl = self.template(wft, tmpl_name)
        if tmpl_name == "chain":
            self.gen = int(inputs["gen"])
        if "retryStrategy" in tmpl:
            child, outputs = self.once(wft, tmpl, inputs, f"{name}(0)", boundary, retried=True)
            done = self.nodes[child].get("outputs") or {}  # the Retry node takes its last attempt's outputs
            return self.add(
                name,
                "Retry",
                tmpl_name,
                boundary,
                display=display,
                inputs=inputs,
                children=[child],
                outputs=outputs,
                artifacts=done.get("artifacts"),
                exit_code=done.get("exitCode"),
            ), outputs
        return self.once(wft, tmpl, inputs, name, boundary, display)

    def once(
        self, wft: str, tmpl: dict, inputs: dict, name: str, boundary: str, display: str = "", retried: bool = False
    ) -> tuple[str, dict]:
        if "steps" in tmpl:
            return self.steps(wft, tmpl, inputs, name, boundary, display)
        scope = {f"inputs.parameters.{k}": v for k, v in inputs.items()}
        outputs = self.outputs(tmpl["name"], inputs) if "container" in tmpl else {}
        artifacts = [
            {"name": a["name"], "path": a["path"], "s3": {"key": _sub(a["s3"]["key"], scope)}}
            for a in (tmpl.get("outputs") or {}).get("artifacts", [])
            if "s3" in a
        ]
        if "container" in tmpl:  # the artifact repository archives every container's log
            artifacts.append(
                log_artifact(ARTIFACT_KEY_FORMAT, self.workflow, pod_name(self.workflow, tmpl["name"], name))
            )
        return self.add(
            name,
            "Pod",
            tmpl["name"],
            boundary,
            display=display,
            inputs=inputs,
            outputs=outputs,
            artifacts=artifacts,
            retried=retried,
        ), outputs

    def steps(self, wft: str, tmpl: dict, inputs: dict, name: str, boundary: str, display: str) -> tuple[str, dict]:
        me = node_id(self.workflow, name)
        scope = {f"inputs.parameters.{k}": v for k, v in inputs.items()}
        groups = []
        for gi, group in enumerate(tmpl["steps"]):
            gname, children = f"{name}[{gi}]", []
            for step in group:
                target_wft = (step.get("templateRef") or {}).get("name", wft)
                target = (step.get("templateRef") or {}).get("template") or step["template"]
                items = [None]
                if "withParam" in step:
                    items = json.loads(_sub(step["withParam"], scope))
                for i, item in enumerate(items):
                    item_scope = dict(scope, **self.item_scope(item))
                    child = f"{gname}.{step['name']}" + ("" if item is None else f"({i}:{self.item_text(item)})")
                    args = {
                        p["name"]: _sub(p.get("value", ""), item_scope)
                        for p in (step.get("arguments") or {}).get("parameters", [])
                    }
                    if "when" in step and not self.when(tmpl["name"], step["name"], args, item_scope):
                        children.append(self.add(child, "Skipped", target, me, message="when evaluated false"))
                        continue
                    cid, outputs = self.run(target_wft, target, args, child, me)
                    children.append(cid)
                    for k, v in outputs.items():
                        scope[f"steps.{step['name']}.outputs.parameters.{k}"] = v
                    if (hook := (step.get("hooks") or {}).get("exit")) is not None:
                        hargs = {
                            p["name"]: _sub(p.get("value", ""), item_scope)
                            for p in (hook.get("arguments") or {}).get("parameters", [])
                        }
                        ref = hook.get("templateRef") or {}
                        children.append(
                            self.run(
                                ref.get("name", wft),
                                ref.get("template") or hook["template"],
                                hargs,
                                f"{child}.onExit",
                                me,
                            )[0]
                        )
            groups.append(self.add(gname, "StepGroup", tmpl["name"], me, display=f"[{gi}]", children=children))
        self.add(name, "Steps", tmpl["name"], boundary, display=display, inputs=inputs, children=groups)
        return me, {}

    @staticmethod
    def item_scope(item) -> dict:
        if item is None:
            return {}
        if isinstance(item, dict):
            return {f"item.{k}": v for k, v in item.items()} | {"item": json.dumps(item)}
        return {"item": str(item)}

    @staticmethod
    def item_text(item) -> str:
        # a map item is its sorted key:value pairs (the controller's node name for it)
        return ",".join(f"{k}:{v}" for k, v in sorted(item.items())) if isinstance(item, dict) else str(item)

    # -- what the pods answer, on the success path with the counts of `mass plan`
    def when(self, template: str, step: str, args: dict, scope: dict) -> bool:
        if (template, step) == ("search-task", "iteration"):
            return int(args.get("iteration", scope.get("inputs.parameters.iteration", 0))) < int(
                scope["inputs.parameters.iterations"]
            )
        if (template, step) == ("search-task", "next"):
            return int(scope["inputs.parameters.iteration"]) + 1 < int(scope["inputs.parameters.iterations"])
        if (template, step) == ("chain", "next"):
            return int(scope["inputs.parameters.gen"]) + 1 < int(scope["inputs.parameters.generations"])
        if (template, step) == ("cycle", "search"):
            return self.spec.search.iterations + 1 > 0
        if template == "evaluate-serving" and step in ("rollouts", "self-verdicts"):
            return scope["inputs.parameters.judges" if step == "self-verdicts" else "inputs.parameters.rolls"] == "true"
        if template == "train":
            workers = int(scope["inputs.parameters.trainer-workers"])
            return workers > 0 if step == "job" else workers == 0
        return True  # validate's flags on a run with nothing stored: every step runs

    def outputs(self, template: str, inputs: dict) -> dict:
        """A step's output parameters as its pod would write them (the fan-outs at their bounds)."""
        spec, ctx = self.spec, self.ctx
        g = int(inputs.get("gen", 0))

        def fan(items: list[tuple]) -> dict:
            return {"rollouts": json.dumps([rollouts.fanout_item(ctx, *item) for item in items])}

        if template == "validate":
            return validate_outputs(spec, g)
        if template == "search-prepare":
            task, k = inputs["task"], int(inputs["iteration"])
            ks = ["reference", 0] if k == 0 else [k]
            return fan(
                [
                    (ctx.search_rollout(g, task, r), task, "reference" if r == "reference" else f"iter-{r}", g)
                    for r in ks
                ]
            )
        if template == "collect-prepare":
            episode = ctx.collect_episode(g, inputs["task"], inputs["episode"])
            return {"agent": "true", "rollout": ctx.relative(episode)}
        if template == "guard-prepare":
            task = inputs["task"]
            n = spec.collection.episodes if spec.task(task).guards.checks else 0
            return fan([(ctx.guard_checks(g, task, f"ep-{i}"), task, f"ep-{i}", g) for i in range(n)])
        if template == "evaluate-plan":
            new = g + 1
            o = argo_outputs(spec, new)
            # what the plan names, the earlier evaluations stored
            return {
                "rounds": json.dumps(
                    [
                        evaluate.round_item(
                            h, rolls, judges, o["model-uri"].replace(f"gen-{new}", f"gen-{h}"), o["dtype"]
                        )
                        for h, rolls, judges in evaluate.planned_work(new)
                    ]
                )
            }
        if template == "evaluate-prepare":
            h = int(inputs["served-gen"])  # a round that rolls out: its generation's every rollout
            reps = range(spec.evaluation.rollouts_per_task)
            return fan(
                [
                    (evaluate.rollout_prefix(ctx, h, t.id, r), t.id, f"rep-{r}", h)
                    for t in spec.resolved_tasks()
                    for r in reps
                ]
            )
        return {}


def validate_outputs(spec, g: int) -> dict:
    """The validate step's outputs at generation g, nothing stored yet (every step to run)."""
    o = argo_outputs(spec, g)
    return {
        "tasks": o["train-tasks.json"],
        "episodes": o["episodes.json"],
        "iterations": o["search-iterations"],
        "model-uri": o["model-uri"],
        "dtype": o["dtype"],
        "generations": o["generations"],
        "store-prefix": o["store-prefix"],
        "trainer-workers": o["trainer-workers"],
        "trainer-nproc": o["trainer-nproc"],
        "trainer-gpus": o["trainer-gpus"],
        "needs-model": "true",
        "run-done": "false",
        **{
            f"done-{s}": "false"
            for s in ("search", "collect", "guard", "rank", "render", "train", "select", "merge", "evaluate")
        },
    }


@dataclass
class Size:
    generation: int  # generations 0..g done
    nodes: int  # status.nodes entries so far
    nodes_bytes: int  # their JSON
    compressed_bytes: int  # status.compressedNodes of them
    fixed_bytes: int  # the rest of the object: spec and stored templates
    stored_bytes: int  # what Argo measures: fixed + nodes, or fixed + compressed past the limit

    def fits(self, limit: int = MAX_WORKFLOW_SIZE) -> bool:
        return self.stored_bytes <= limit


def stored_bytes(fixed: int, nodes_bytes: int, compressed: int, limit: int = MAX_WORKFLOW_SIZE) -> int:
    """What the controller compares with its limit: the object as it is, or with the nodes compressed
    once that is past the limit."""
    return fixed + nodes_bytes if fixed + nodes_bytes <= limit else fixed + compressed


def estimate(spec, workflow: str = "mass-run-x7k2p") -> list[Size]:
    """The Workflow object of `argo submit --from workflowtemplate/mass-run` for this spec after each
    generation."""
    return [Size(**s) for s in _estimate(spec.model_dump_json(), workflow)]


@functools.lru_cache(maxsize=8)
def _estimate(spec_json: str, workflow: str) -> tuple[dict, ...]:
    """Once per spec and name: `mass validate` and `mass plan` of one spec walk the templates once."""

    spec = RunSpec.model_validate_json(spec_json)

    s = ClusterSettings()
    docs = {"mass-run": argo.mass_run(s), "mass-cycle": argo.mass_cycle(s)}
    fixed = json_size(
        {
            "metadata": {"name": workflow, "namespace": "mass-jobs", "labels": {}},
            "spec": {
                "workflowTemplateRef": {"name": "mass-run"},
                "arguments": {
                    "parameters": [
                        {"name": "spec", "value": f"{spec.store.uri}/spec.yaml"},
                        {"name": "run", "value": spec.name},
                    ]
                },
            },
            "status": {
                "storedTemplates": {
                    f"namespaced/{w}/{t['name']}": t for w, d in docs.items() for t in d["spec"]["templates"]
                },
                "storedWorkflowTemplateSpec": docs["mass-run"]["spec"],
            },
        }
    )
    walk = _Walk(spec, workflow, docs)
    walk.run("mass-run", "main", {}, workflow, "")
    per_gen: dict[int, dict] = {}
    for nid, node in walk.nodes.items():
        per_gen.setdefault(walk.generation[nid], {})[nid] = node
    # the controller marshals and compresses the whole node map at each update: after generation g,
    # every node of generations 0..g, in id order (so one generation's nodes interleave with the others')
    out, so_far = [], {}
    for g in range(spec.generations):
        so_far |= per_gen.get(g, {})
        raw, packed = len(nodes_json(so_far)), compressed_size(so_far)
        out.append(
            dict(
                generation=g,
                nodes=len(so_far),
                nodes_bytes=raw,
                compressed_bytes=packed,
                fixed_bytes=fixed,
                stored_bytes=stored_bytes(fixed, raw, packed),
            )
        )
    return tuple(out)
