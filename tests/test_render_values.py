"""`mass render argo --values`: plain YAML for clusters installed without Helm carries the values it
is given, object for object what the chart renders with the same values (Helm's own engine)."""

from __future__ import annotations

import pytest
import yaml

from mass_jobs.commands.cli import main as mass
from tests.fixtures.k8s import CHART, ci_values_files, load_docs, render_chart


def _parsed(value):
    """Embedded manifests and artifact-repository configs as data (quoting and key order aside)."""
    if isinstance(value, dict):
        return {k: _parsed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_parsed(v) for v in value]
    if isinstance(value, str) and "\n" in value:
        try:
            doc = yaml.safe_load(value.replace("{{", "<<").replace("}}", ">>"))
        except yaml.YAMLError:
            return value
        return _parsed(doc) if isinstance(doc, (dict, list)) else value
    return value


def _objects(files: dict[str, str]) -> dict:
    return {
        (d["kind"], d["metadata"]["name"]): d
        for name, text in files.items()
        if name.endswith(".yaml")
        for d in load_docs(text)
    }


@pytest.mark.parametrize("scenario", [p.name for p in ci_values_files()])
def test_plain_yaml_with_values_is_what_the_chart_renders_with_them(scenario, tmp_path):
    values = yaml.safe_load((CHART / "ci" / scenario).read_text()) or {}
    chart = _objects(render_chart(values, namespace=values.get("namespace") or "mass-jobs"))
    argo, manifests = tmp_path / "argo", tmp_path / "manifests"
    assert (
        mass(
            [
                "render",
                "argo",
                "--out",
                str(argo),
                "--manifests",
                str(manifests),
                "--values",
                str(CHART / "ci" / scenario),
            ]
        )
        == 0
    )
    plain = _objects({p.name: p.read_text() for d in (argo, manifests) for p in d.iterdir()})
    # every object the chart installs for these values, its network policies and Secret templates
    # included (Cilium's where the values say so): nothing left to copy from examples/k8s/ and edit
    assert set(plain) == set(chart), set(plain) ^ set(chart)
    assert len(plain) >= 11
    for key, obj in plain.items():
        theirs = chart[key]
        for part in ("spec", "data", "rules", "roleRef", "subjects"):
            assert _parsed(obj.get(part)) == _parsed(theirs.get(part)), (key, part)
        if values.get("namespace"):  # else the chart's is the release's, and plain YAML takes kubectl's -n
            assert obj["metadata"]["namespace"] == theirs["metadata"]["namespace"] == values["namespace"], key


def test_values_reach_the_plain_yaml_and_the_chart_flag_is_refused(tmp_path, capsys):
    minio = CHART / "ci" / "minio-gitops-values.yaml"
    assert (
        mass(
            ["render", "argo", "--out", str(tmp_path / "a"), "--manifests", str(tmp_path / "m"), "--values", str(minio)]
        )
        == 0
    )
    cycle = yaml.safe_load((tmp_path / "a" / "mass-cycle.yaml").read_text())
    assert cycle["metadata"]["namespace"] == "mass-lab"
    assert "http://minio.minio.svc.cluster.local:9000" in (tmp_path / "a" / "mass-cycle.yaml").read_text()
    repo = next(d for d in load_docs((tmp_path / "m" / "artifact-repositories.yaml").read_text()))
    assert yaml.safe_load(repo["data"]["default-v1"])["s3"]["bucket"] == "mass-lab"
    assert not (tmp_path / "a" / "mass-nightly.yaml").exists()  # cron.enabled: false, as the chart
    capsys.readouterr()
    assert (
        mass(["render", "argo", "--out", str(tmp_path / "b"), "--chart", str(tmp_path / "c"), "--values", str(minio)])
        == 2
    )
    assert "--values: expected no --chart with it" in capsys.readouterr().err


def test_the_policies_the_values_describe_are_written_ciliums_included(tmp_path):
    """network.cilium with network.s3.fqdns: the two CiliumNetworkPolicies and none of the plain
    ones; without --manifests they land beside the Argo YAML, their header naming the command."""
    values = CHART / "ci" / "paper-values.yaml"
    assert yaml.safe_load(values.read_text())["network"]["cilium"] is True
    assert mass(["render", "argo", "--out", str(tmp_path / "a"), "--values", str(values)]) == 0
    written = {p.name for p in (tmp_path / "a").iterdir()}
    assert {"ciliumnetworkpolicy-apiserver.yaml", "ciliumnetworkpolicy-s3.yaml"} <= written
    assert not written & {"networkpolicy-apiserver.yaml", "networkpolicy-s3.yaml"}
    s3 = (tmp_path / "a" / "ciliumnetworkpolicy-s3.yaml").read_text()
    assert f"mass render argo --out {tmp_path / 'a'} --values {values}" in s3
    [policy] = load_docs(s3)
    assert policy["spec"]["egress"][1]["toFQDNs"][0] == {"matchName": "s3.us-east-1.amazonaws.com"}
    assert policy["spec"]["egress"][1]["toPorts"] == [{"ports": [{"port": "443", "protocol": "TCP"}]}]
