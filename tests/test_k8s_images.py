"""images/*.Dockerfile: pinned bases, the project installed from pyproject, non-root users; `make images`.

No docker engine here, so the Dockerfiles are linted rather than built.
"""

from __future__ import annotations

import re
import tomllib

import pytest
import yaml

from tests.fixtures.k8s import CHART, REPO

DOCKERFILES = {p.name.removesuffix(".Dockerfile"): p for p in sorted((REPO / "images").glob("*.Dockerfile"))}
TORCH = next(
    d
    for d in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    if d.startswith("torch==")
)


def _instructions(text: str) -> list[tuple[str, str]]:
    joined = re.sub(r"\\\n", " ", text)
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line.strip() else "")
        for line in joined.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]


def test_the_three_images_exist():
    assert set(DOCKERFILES) == {"jobs", "sandbox", "trainer"}


@pytest.mark.parametrize("name", sorted(DOCKERFILES))
def test_bases_are_pinned_to_exact_versions(name):
    froms = [arg.split()[0] for op, arg in _instructions(DOCKERFILES[name].read_text()) if op == "FROM"]
    assert froms
    for image in froms:
        assert re.fullmatch(r"[a-z0-9./-]+:\d+\.\d+\.\d+[-a-z0-9.]*(@sha256:[0-9a-f]{64})?", image), image


@pytest.mark.parametrize("name", sorted(DOCKERFILES))
def test_installs_the_project_from_pyproject_and_runs_as_non_root(name):
    ins = _instructions(DOCKERFILES[name].read_text())
    runs = " ".join(arg for op, arg in ins if op == "RUN")
    copies = [arg for op, arg in ins if op == "COPY"]
    assert any(c.startswith("pyproject.toml") for c in copies)
    assert re.search(r"pip install (\S+ )*\.( |$)", runs), "the project is installed from its pyproject"
    assert TORCH in runs, f"torch must match the pyproject pin {TORCH}"
    users = [arg for op, arg in ins if op == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")


def test_sandbox_has_python_node_and_qwen_code():
    text = DOCKERFILES["sandbox"].read_text()
    makefile = (REPO / "Makefile").read_text()
    qwen = re.search(r"QWEN_VERSION := (\S+)", makefile).group(1)
    assert f"@qwen-code/qwen-code@{qwen}" in text and "/usr/local/bin/node" in text
    assert "mass episode --help" in text and "mass sandbox-serve --help" in text
    # every uid of an agent pod has a passwd entry (qwen-code asks for its user's)
    from mass_jobs.k8s.pods import QWEN_UID, SANDBOX_UID, UID

    for uid in (UID, SANDBOX_UID, QWEN_UID):
        assert re.search(rf"useradd --uid {uid}\b", text), uid


def test_make_images_builds_every_dockerfile_with_the_chart_tags():
    """`make -n images`: what it would run, by default with the chart's image names, and with
    REGISTRY/IMAGE_TAG/PUSH where a cluster pulls from."""
    import subprocess

    def planned(*args: str) -> str:
        return subprocess.run(
            ["make", "-n", "images", *args], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout

    values = yaml.safe_load((CHART / "values.yaml").read_text())["images"]
    default = planned()
    for name in DOCKERFILES:
        assert values[name] == f"ghcr.io/mass-jobs/{name}:0.1.0"
    assert "docker build -f images/$i.Dockerfile -t ghcr.io/mass-jobs/$i:0.1.0 ." in default
    assert set(re.search(r"for i in ([a-z ]+);", default).group(1).split()) == set(DOCKERFILES)
    assert 'if [ -n "" ]' in default  # no push unless asked
    mine = planned("REGISTRY=registry.example.com/mass", "IMAGE_TAG=7", "PUSH=1")
    assert "-t registry.example.com/mass/$i:7 ." in mine and "docker push registry.example.com/mass/$i:7" in mine
    assert 'if [ -n "1" ]' in mine
