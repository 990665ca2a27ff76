"""Pod Security "restricted" for every container of every pod the project defines.

argo/, manifests/, examples/k8s/ and the chart rendered under each ci/*-values.yaml. Containers
that controllers add carry what the shipped controller settings give them, the prerequisites the
docs/kubernetes.md documents: Argo's init and wait containers (and the main container of resource templates)
the controller's `executor.securityContext` (examples/k8s/argo-controller-values.yaml), the
training operator's Worker init container its template file
(examples/k8s/training-operator-init-container.yaml), KServe's storage initializer the patched
ClusterStorageContainer (examples/k8s/kserve-storage-initializer-patch.yaml).
"""

from __future__ import annotations

import copy

import pytest
import yaml

from mass_jobs.k8s import pod_security as ps
from mass_jobs.k8s import schemas
from tests.fixtures.k8s import REPO, ci_values_files, load_docs, render_chart

EXAMPLES = REPO / "examples" / "k8s"


def _executor_sc() -> dict:
    return yaml.safe_load((EXAMPLES / "argo-controller-values.yaml").read_text())["executor"]["securityContext"]


def _shipped() -> ps.Injected:
    """The injected containers as the shipped controller settings define them."""
    operator = (EXAMPLES / "training-operator-init-container.yaml").read_text()
    operator = operator.replace("{{.InitContainerImage}}", "alpine:3.10").replace("{{.MasterAddr}}", "job-master-0")
    patch = yaml.safe_load((EXAMPLES / "kserve-storage-initializer-patch.yaml").read_text())
    return ps.Injected(
        argo_executor=_executor_sc(),
        pytorch_worker_init=yaml.safe_load(operator),
        storage_initializer=patch["spec"]["container"],
    )


def _pods(sources: dict[str, list[dict]], injected: ps.Injected) -> list[ps.PodDef]:
    """sources: {where: objects}; WorkflowTemplates of one source resolve each other's refs."""
    out = []
    for where, objs in sources.items():
        templates = {o["metadata"]["name"]: o for o in objs if o.get("kind") == "WorkflowTemplate"}
        for o in objs:
            out += ps.object_pods(where, o, injected, templates)
            if o.get("kind") in ps.ARGO_KINDS:
                out += [
                    p
                    for inner in schemas.embedded_manifests(o)
                    if "spec" in inner
                    for p in ps.object_pods(f"{where} {o['kind']}/{o['metadata']['name']} creates", inner, injected)
                ]
    return out


def _checked_in() -> dict[str, list[dict]]:
    files = (
        sorted((REPO / "argo").glob("*.yaml"))
        + sorted((REPO / "manifests").glob("*.yaml"))
        + sorted((REPO / "examples" / "k8s").glob("*.yaml"))
    )
    return {"checked-in": [d for p in files for d in load_docs(p.read_text()) if isinstance(d, dict) and "kind" in d]}


def _rendered() -> dict[str, list[dict]]:
    return {
        f"chart[{p.name}]": [
            d
            for name, text in sorted(render_chart(yaml.safe_load(p.read_text()) or {}).items())
            if name.endswith(".yaml")
            for d in load_docs(text)
        ]
        for p in ci_values_files()
    }


def test_every_container_meets_the_restricted_profile():
    pods = _pods({**_checked_in(), **_rendered()}, _shipped())
    violations = [v for p in pods for v in ps.restricted_violations(p)]
    assert violations == [], "\n".join(violations)
    roles = [role.split(" ")[0] for p in pods for role, _ in p.containers]
    # what was checked: Argo step and agent pods (init, wait, main), resource-template pods,
    # the InferenceService predictor and PyTorchJob replicas, from argo/, examples/ and 4 chart renders
    assert roles.count("init") == roles.count("wait") >= 5 * 14
    assert {
        "initContainers/storage-initializer",
        "initContainers/init-pytorch",
        "containers/pytorch",
        "containers/kserve-container",
        "init",
        "wait",
    } <= set(roles)
    where = " ".join(p.where for p in pods)
    for piece in (
        "template agent-episode",
        "InferenceService/",
        "PyTorchJob/",
        "via templateRef mass-cycle",
        "chart[cilium-values.yaml]",
        "PyTorchJob/mass-demo-g0-train Master",
    ):
        assert piece in where, piece


def test_injected_containers_fail_without_the_controller_settings():
    pods = _pods(_checked_in(), ps.Injected())  # the controllers' own defaults: no securityContext
    violations = [v for p in pods for v in ps.restricted_violations(p)]
    wait = [v for v in violations if "template agent-episode container wait (argoexec)" in v]
    assert any("allowPrivilegeEscalation must be false" in v for v in wait)
    assert any("capabilities.drop must contain ALL" in v for v in wait)
    assert any("PyTorchJob/mass-demo-g0-train Worker container initContainers/init-pytorch" in v for v in violations)
    assert any("predictor container initContainers/storage-initializer" in v for v in violations)
    # containers of our own are hardened by the objects themselves: only injected ones break
    injected = ("(argoexec", "initContainers/init-pytorch", "initContainers/storage-initializer")
    assert violations and all(any(i in v for i in injected) for v in violations)


def _agent_pod():
    cycle = next(
        d
        for d in _checked_in()["checked-in"]
        if d["kind"] == "WorkflowTemplate" and d["metadata"]["name"] == "mass-cycle"
    )
    return cycle, next(t for t in cycle["spec"]["templates"] if t["name"] == "agent-episode")


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (
            lambda t: t["volumes"].append({"name": "host", "hostPath": {"path": "/"}}),
            "template agent-episode: volume 'host' is ['hostPath']",
        ),
        (
            lambda t: t.setdefault("sidecars", []).append(
                {"name": "helper", "securityContext": {**t["container"]["securityContext"], "privileged": True}}
            ),
            "template agent-episode container sidecars/helper: privileged must not be true",
        ),
        (
            lambda t: t["container"]["securityContext"]["capabilities"].update(add=["SYS_ADMIN"]),
            "template agent-episode container main/main: capabilities.add may only hold NET_BIND_SERVICE, has ['SYS_ADMIN']",
        ),
        (
            lambda t: t["container"]["securityContext"].update(allowPrivilegeEscalation=True),
            "template agent-episode container main/main: allowPrivilegeEscalation must be false, is True",
        ),
        (
            lambda t: t["container"]["securityContext"].update(runAsNonRoot=False),
            "template agent-episode container main/main: runAsNonRoot must be true",
        ),
        (
            lambda t: t["container"]["securityContext"].update(seccompProfile={"type": "Unconfined"}),
            "template agent-episode container main/main: seccompProfile.type must be RuntimeDefault or Localhost",
        ),
        (lambda t: t.update(hostNetwork=True), "template agent-episode: hostNetwork must not be true"),
        (lambda t: t.update(podSpecPatch='{"hostPID": true}'), "template agent-episode: podSpecPatch"),
    ],
)
def test_the_check_names_the_template_and_container_that_break_a_rule(mutate, expected):
    cycle, _ = _agent_pod()
    cycle = copy.deepcopy(cycle)
    mutate(next(t for t in cycle["spec"]["templates"] if t["name"] == "agent-episode"))
    violations = [
        v for p in ps.object_pods("argo/mass-cycle.yaml", cycle, _shipped(), {}) for v in ps.restricted_violations(p)
    ]
    assert len(violations) == 1 and expected in violations[0], violations
    assert violations[0].startswith("argo/mass-cycle.yaml WorkflowTemplate/mass-cycle")


def test_pod_level_settings_cover_containers_and_root_is_refused():
    pod = {
        "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "Localhost", "localhostProfile": "p.json"}}
    }
    ok = {"name": "c", "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}}
    assert ps.restricted_violations(ps.PodDef("pod", pod, [("containers/c", ok)])) == []
    root = copy.deepcopy(ok)
    root["securityContext"]["runAsUser"] = 0
    assert ps.restricted_violations(ps.PodDef("pod", pod, [("containers/c", root)])) == [
        "pod container containers/c: runAsUser must not be 0"
    ]
    assert ps.restricted_violations(ps.PodDef("pod", {}, [("containers/c", ok)])) == [
        "pod container containers/c: runAsNonRoot must be true (container or pod), is None",
        "pod container containers/c: seccompProfile.type must be RuntimeDefault or Localhost (container or pod), "
        "is None",
    ]


def test_the_kubernetes_guide_names_the_controller_setting_as_a_prerequisite():
    readme = (REPO / "docs" / "kubernetes.md").read_text()
    for name in (
        "argo-controller-values.yaml",
        "training-operator-init-container.yaml",
        "kserve-storage-initializer-patch.yaml",
    ):
        assert f"examples/k8s/{name}" in readme, name
    assert "executor.securityContext" in readme
    sc = _executor_sc()
    assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["runAsNonRoot"] is True and sc["seccompProfile"] == {"type": "RuntimeDefault"}
