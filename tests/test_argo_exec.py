"""The generated Argo templates executed end to end by the test executor (tests/fixtures/argo_exec/).

Fast tests first: the executor's own semantics (expressions, `when`, substitution, conditions,
the artifact archive layout, steps with withParam / retries / continueOn / recursion / onExit,
readOnlyRootFilesystem, the PyTorchJob and KServe storage stand-ins) on small synthetic
WorkflowTemplates. Then the slow ones on the generated templates as `helm install` puts them in a
cluster (the chart rendered with this test's S3 as values; argo/ is the same chart rendered with
its defaults, checked here): mass-run for two generations of a CI-sized spec against moto's S3
server compared with a local `mass run` of the same spec, and the agent-crash, skipped-task and
stop/resubmit paths of one mass-cycle.

    .venv/bin/python -m pytest -q tests/test_argo_exec.py            # all (slow ones: minutes)
    .venv/bin/python -m pytest -q -m "argo_exec and not slow" tests/test_argo_exec.py
"""

from __future__ import annotations

import gzip
import io
import json
import math
import os
import re
import signal
import subprocess
import sys
import tarfile
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml

from mass_jobs.config.run_spec import StoreSpec
from mass_jobs.run.context import RunContext
from mass_jobs.store import open_store
from tests.fixtures.argo_cluster import (
    JOBS_IMAGE,
    JUDGE_KEY,
    JUDGE_KEY_ENV,
    NODE_POOL,
    S3_SECRET,
    LocalRun,
    archive_difference,
    chart_docs,
    ci_spec,
    container,
    manifests,
    one_generation,
    put_spec,
    pytorchjob,
    run_store,
    timeless,
    wft,
)
from tests.fixtures.argo_exec import load_documents
from tests.fixtures.argo_exec.artifacts import Repository, load_input, save_output
from tests.fixtures.argo_exec.conditions import check, matches
from tests.fixtures.argo_exec.expr import ExprError, evaluate, evaluate_when, nest
from tests.fixtures.argo_exec.template import TemplateError, replace

pytestmark = pytest.mark.argo_exec

REPO = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- expressions and substitution


def test_expr_subset_the_templates_use():
    env = nest({"inputs.parameters.gen": "1", "inputs.parameters.generations": "2", "workflow.parameters.run": "r"})
    assert evaluate("asInt(inputs.parameters.gen) + 1", env) == 2
    assert evaluate("asInt(inputs.parameters.gen) + 1 < asInt(inputs.parameters.generations)", env) is False
    assert evaluate("workflow.parameters.run", env) == "r"
    retry = {"lastRetry": {"status": "Failed", "exitCode": "2"}}
    expr = 'lastRetry.status == "Error" or (lastRetry.status == "Failed" and asInt(lastRetry.exitCode) != 2)'
    assert evaluate(expr, retry) is False
    assert evaluate(expr, {"lastRetry": {"status": "Failed", "exitCode": "1"}}) is True
    assert evaluate(expr, {"lastRetry": {"status": "Error", "exitCode": "-1"}}) is True
    assert evaluate("inputs.parameters['gen'] == '1' ? 'a' : 'b'", env) == "a"
    for bad in ("sprig.trim(x)", "unknownName + 1", "asInt('1.5')", "inputs.parameters.gen + 1", "x |"):
        with pytest.raises(ExprError):
            evaluate(bad, env)


def test_when_is_govaluate_after_substitution():
    assert evaluate_when("2 > 0") and not evaluate_when("0 > 0")
    assert evaluate_when("1 < 3") and not evaluate_when("3 < 3")
    assert evaluate_when("Succeeded == Succeeded") and evaluate_when("foo != bar")
    assert evaluate_when("true && !(1 > 2)")
    with pytest.raises(ExprError):
        evaluate_when("1 +")


def test_substitution_resolves_or_fails_loudly():
    scope = {"inputs.parameters.gen": "0", "item.task": "fib", "retries": "2"}
    assert replace("g{{inputs.parameters.gen}}-{{ item.task }}-r{{retries}}", scope) == "g0-fib-r2"
    assert replace("{{=asInt(inputs.parameters.gen) + 1}}", scope) == "1"
    with pytest.raises(TemplateError, match=r"failed to resolve \{\{steps.x.outputs.parameters.y\}\}"):
        replace("{{steps.x.outputs.parameters.y}}", scope)


def test_conditions_are_label_selectors_over_gjson_paths():
    isvc = {"status": {"modelStatus": {"transitionStatus": "InProgress", "states": {"targetModelState": "Loading"}}}}
    ok = "status.modelStatus.states.targetModelState == Loaded"
    bad = "status.modelStatus.transitionStatus in (BlockedByFailedLoad, InvalidSpec)"
    assert check(isvc, ok, bad) is None
    isvc["status"]["modelStatus"]["states"]["targetModelState"] = "Loaded"
    assert check(isvc, ok, bad) == "succeeded"
    isvc["status"]["modelStatus"]["transitionStatus"] = "BlockedByFailedLoad"
    assert check(isvc, ok, bad).startswith("failed")
    job = {
        "status": {
            "conditions": [{"type": "Created"}, {"type": "Running"}, {"type": "Failed"}],
            "replicaStatuses": {"Master": {"succeeded": 1}},
        }
    }
    # failure requirements are ORed (any match fails), success ones ANDed
    assert check(
        job,
        "status.replicaStatuses.Master.succeeded > 0",
        "status.conditions.1.type == Failed,status.conditions.2.type == Failed",
    ).startswith("failed")
    assert matches(job, "status.replicaStatuses.Master.succeeded > 0")
    assert not matches(job, "status.replicaStatuses.Master.failed > 0")  # missing never compares


@pytest.mark.parametrize(
    "before",
    [
        [],
        ["Created"],
        ["Created", "Running"],
        ["Created", "Suspended", "Running"],
        ["Created", "Suspended", "Running", "Restarting", "Succeeded"],
    ],
    ids=lambda b: "-".join(b) or "first",
)
def test_the_trainers_failure_condition_holds_wherever_failed_stands(before):
    """Kueue's Suspended condition shifts Failed to index 3: the generated condition reads every index."""
    from mass_jobs.k8s.training import FAILED, SUCCEEDED

    job = {"status": {"conditions": [{"type": t, "status": "True"} for t in [*before, "Failed"]]}}
    assert check(job, SUCCEEDED, FAILED).startswith("failed")
    running = {"status": {"conditions": [{"type": t, "status": "True"} for t in before]}}
    assert check(running, SUCCEEDED, FAILED) is None


# ---------------------------------------------------------------- artifacts against moto


@pytest.fixture
def repo(s3_env):
    host = s3_env["endpoint_url"].removeprefix("http://")
    cm = {
        "metadata": {"name": "artifact-repositories"},
        "data": {
            "default-v1": yaml.safe_dump(
                {
                    "s3": {
                        "bucket": s3_env["bucket"],
                        "endpoint": host,
                        "insecure": True,
                        "region": s3_env["region"],
                        "keyFormat": "argo-artifacts/{{workflow.name}}/{{pod.name}}",
                        "accessKeySecret": {"name": S3_SECRET, "key": "AWS_ACCESS_KEY_ID"},
                        "secretKeySecret": {"name": S3_SECRET, "key": "AWS_SECRET_ACCESS_KEY"},
                    }
                }
            )
        },
    }
    return Repository.from_configmap(
        cm, "default-v1", {S3_SECRET: {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}}
    )


def tar_members(data: bytes) -> list[str]:
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(data))) as tar:
        return sorted(tar.getnames())


def test_output_directory_is_tarred_under_its_base_name(repo, tmp_path):
    ws = tmp_path / "out" / "workspace"
    (ws / "src").mkdir(parents=True)
    (ws / "a.py").write_text("a")
    (ws / "src" / "b.py").write_text("b")
    save_output(repo, {"name": "ws", "path": "/out/workspace", "s3": {"key": "t/ws.tar.gz"}}, ws, "unused")
    body = repo.client().get_object(Bucket=repo.bucket, Key="t/ws.tar.gz")["Body"].read()
    assert tar_members(body) == ["workspace", "workspace/a.py", "workspace/src", "workspace/src/b.py"]
    save_output(
        repo,
        {"name": "st", "path": "/out/s.json", "archive": {"none": {}}, "s3": {"key": "t/s.json"}},
        _write(tmp_path / "s.json", "{}"),
        "unused",
    )
    assert repo.client().get_object(Bucket=repo.bucket, Key="t/s.json")["Body"].read() == b"{}"


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _put_tar(repo, key: str, files: dict[str, str]) -> None:
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb") as gz, tarfile.open(fileobj=gz, mode="w") as tar:
        for name, text in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(text.encode())
            tar.addfile(info, io.BytesIO(text.encode()))
    repo.client().put_object(Bucket=repo.bucket, Key=key, Body=buf.getvalue())


def test_input_single_entry_is_renamed_onto_the_path(repo, tmp_path):
    _put_tar(repo, "in/one.tar.gz", {"fib.py": "print(1)"})
    load_input(
        repo, {"name": "w", "path": "/in/workspace", "s3": {"key": "in/one.tar.gz"}}, tmp_path / "a" / "workspace"
    )
    assert (tmp_path / "a" / "workspace").is_file()  # the one file became the workspace "directory"
    _put_tar(repo, "in/two.tar.gz", {"fib.py": "1", "data/n.txt": "2"})
    load_input(
        repo, {"name": "w", "path": "/in/workspace", "s3": {"key": "in/two.tar.gz"}}, tmp_path / "b" / "workspace"
    )
    assert sorted(
        p.relative_to(tmp_path / "b" / "workspace").as_posix() for p in (tmp_path / "b" / "workspace").rglob("*")
    ) == ["data", "data/n.txt", "fib.py"]
    _put_tar(repo, "in/dir.tar.gz", {"workspace/x.py": "x"})
    load_input(
        repo, {"name": "w", "path": "/in/workspace", "s3": {"key": "in/dir.tar.gz"}}, tmp_path / "c" / "workspace"
    )
    assert (tmp_path / "c" / "workspace" / "x.py").read_text() == "x"
    load_input(
        repo,
        {"name": "w", "path": "/in/t.tgz", "archive": {"none": {}}, "s3": {"key": "in/dir.tar.gz"}},
        tmp_path / "d" / "t.tgz",
    )
    assert (tmp_path / "d" / "t.tgz").read_bytes()[:2] == b"\x1f\x8b"  # archive: none keeps the bytes


# ---------------------------------------------------------------- controller semantics on synthetic templates


def test_steps_withparam_when_outputs_and_recursion(executor_for):
    templates = [
        {
            "name": "main",
            "steps": [
                [{"name": "list", "template": "emit"}],
                [
                    {
                        "name": "each",
                        "template": "echo",
                        "withParam": "{{steps.list.outputs.parameters.items}}",
                        "arguments": {"parameters": [{"name": "v", "value": "{{item.task}}-{{item.n}}"}]},
                        "when": "{{item.n}} > 0",
                    }
                ],
                [
                    {
                        "name": "count",
                        "template": "countdown",
                        "arguments": {"parameters": [{"name": "k", "value": "3"}]},
                    }
                ],
            ],
        },
        {
            "name": "emit",
            "container": container(
                'printf \'[{"task":"a","n":1},{"task":"b","n":0},{"task":"c","n":2}]\' > /tmp/items'
            ),
            "outputs": {"parameters": [{"name": "items", "valueFrom": {"path": "/tmp/items"}}]},
            "volumes": [{"name": "tmp", "emptyDir": {}}],
        },
        {
            "name": "echo",
            "inputs": {"parameters": [{"name": "v"}]},
            "container": container("printf '{{inputs.parameters.v}}' > /tmp/out"),
            "outputs": {"parameters": [{"name": "out", "valueFrom": {"path": "/tmp/out"}}]},
            "volumes": [{"name": "tmp", "emptyDir": {}}],
        },
        {
            "name": "countdown",
            "inputs": {"parameters": [{"name": "k"}]},
            "steps": [
                [
                    {
                        "name": "tick",
                        "template": "echo",
                        "arguments": {"parameters": [{"name": "v", "value": "{{inputs.parameters.k}}"}]},
                    }
                ],
                [
                    {
                        "name": "again",
                        "template": "countdown",
                        "when": "{{=asInt(inputs.parameters.k) > 1}} == true",
                        "arguments": {"parameters": [{"name": "k", "value": "{{=asInt(inputs.parameters.k) - 1}}"}]},
                    }
                ],
            ],
        },
    ]
    ex = executor_for(wft("t", templates))
    wf = ex.submit("t", {})
    assert wf.phase == "Succeeded", wf.summary()
    each = sorted((n.inputs["v"], n.phase) for n in wf.find(template="echo", type="Pod") if "each(" in n.name)
    assert each == [("a-1", "Succeeded"), ("c-2", "Succeeded")]
    assert [n.name.rsplit(".", 1)[-1] for n in wf.find(type="Skipped")] == [
        "each(1:task:b,n:0)",
        "again",
    ]  # the recursion ends on when
    assert sorted(n.outputs["out"] for n in wf.find(template="echo") if ".tick" in n.name) == ["1", "2", "3"]


def test_retries_policy_expression_and_continue_on(executor_for):
    attempts = []

    def faults(template, inputs, attempt):
        attempts.append((template, inputs.get("code"), attempt))
        return None

    templates = [
        {
            "name": "main",
            "steps": [
                [
                    {
                        "name": "exit2",
                        "template": "fail",
                        "arguments": {"parameters": [{"name": "code", "value": "2"}]},
                        "continueOn": {"failed": True},
                    },
                    {
                        "name": "exit1",
                        "template": "fail",
                        "arguments": {"parameters": [{"name": "code", "value": "1"}]},
                        "continueOn": {"failed": True},
                    },
                    {
                        "name": "onerror",
                        "template": "fail-onerror",
                        "arguments": {"parameters": [{"name": "code", "value": "1"}]},
                        "continueOn": {"failed": True},
                    },
                    {"name": "flaky", "template": "flaky"},
                ],
                [{"name": "after", "template": "fail", "arguments": {"parameters": [{"name": "code", "value": "0"}]}}],
            ],
        },
        {
            "name": "fail",
            "inputs": {"parameters": [{"name": "code"}]},
            "container": container("exit {{inputs.parameters.code}}"),
            "volumes": [{"name": "tmp", "emptyDir": {}}],
            "retryStrategy": {
                "limit": "2",
                "retryPolicy": "Always",
                "expression": 'lastRetry.status == "Error" or '
                '(lastRetry.status == "Failed" and asInt(lastRetry.exitCode) != 2)',
            },
        },
        {
            "name": "fail-onerror",
            "inputs": {"parameters": [{"name": "code"}]},
            "container": container("exit {{inputs.parameters.code}}"),
            "volumes": [{"name": "tmp", "emptyDir": {}}],
            "retryStrategy": {"limit": "3", "retryPolicy": "OnError"},
        },
        {
            "name": "flaky",
            "container": container("test {{retries}} -ge 1 || exit 7; printf '{{retries}}' > /tmp/r"),
            "outputs": {"parameters": [{"name": "r", "valueFrom": {"path": "/tmp/r"}}]},
            "volumes": [{"name": "tmp", "emptyDir": {}}],
            "retryStrategy": {"limit": 3},
        },
    ]
    ex = executor_for(wft("r", templates), faults=faults)
    wf = ex.submit("r", {})
    assert wf.phase == "Succeeded", wf.summary()
    by_step = {n.name.rsplit(".", 1)[-1]: n for n in wf.find(type="Retry")}
    assert by_step["exit2"].phase == "Failed" and len(wf.find(name=r"exit2\(\d\)$")) == 1  # expression: no retry on 2
    assert len(wf.find(name=r"exit1\(\d\)$")) == 3 and by_step["exit1"].exit_code == 1  # limit 2 -> 3 attempts
    assert len(wf.find(name=r"onerror\(\d\)$")) == 1  # OnError never retries a Failed pod
    assert by_step["flaky"].phase == "Succeeded" and by_step["flaky"].outputs == {"r": "1"}
    assert by_step["after"].phase == "Succeeded"  # continueOn.failed let the next group run


def test_failed_child_fails_group_and_onexit_sees_status(executor_for, s3_env):
    templates = [
        {"name": "main", "steps": [[{"name": "bad", "template": "bad"}], [{"name": "never", "template": "ok"}]]},
        {"name": "bad", "container": container("exit 3"), "volumes": [{"name": "tmp", "emptyDir": {}}]},
        {"name": "ok", "container": container("true"), "volumes": [{"name": "tmp", "emptyDir": {}}]},
        {
            "name": "exit",
            "container": container("printf '{{workflow.status}}' > /tmp/s"),
            "outputs": {"parameters": [{"name": "s", "valueFrom": {"path": "/tmp/s"}}]},
            "volumes": [{"name": "tmp", "emptyDir": {}}],
        },
    ]
    ex = executor_for(wft("f", templates, onExit="exit"))
    wf = ex.submit("f", {})
    assert wf.phase == "Failed" and "child" in wf.message and "bad" in wf.message
    assert not wf.find(template="ok")
    assert [n.outputs for n in wf.find(template="exit")] == [{"s": "Failed"}]


def test_read_only_root_env_secrets_and_artifacts(executor_for, s3_env):
    script = (
        "touch /opt/x 2>/dev/null && echo root-writable > /out/r || echo root-ro > /out/r; "
        'touch /tmp/ok && echo tmp-ok >> /out/r; printf "$TOKEN:$AWS_ACCESS_KEY_ID:$HOME" >> /out/r; '
        "mkdir -p /out/ws/sub && cat /in/ws/a.txt > /out/ws/sub/copy.txt"
    )
    templates = [
        {
            "name": "main",
            "container": container(
                script,
                mounts=("tmp", "out"),
                env=[{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "other", "key": "TOKEN"}}}],
                envFrom=[{"secretRef": {"name": S3_SECRET}}],
            ),
            "volumes": [{"name": "tmp", "emptyDir": {}}, {"name": "out", "emptyDir": {}}],
            "inputs": {"artifacts": [{"name": "ws", "path": "/in/ws", "s3": {"key": "syn/in.tar.gz"}}]},
            "outputs": {
                "parameters": [{"name": "r", "valueFrom": {"path": "/out/r"}}],
                "artifacts": [{"name": "ws", "path": "/out/ws", "s3": {"key": "syn/out.tar.gz"}}],
            },
        },
    ]
    ex = executor_for(wft("io", templates))
    _put_tar(ex._repository("artifact-repositories", "default-v1"), "syn/in.tar.gz", {"a.txt": "A", "b.txt": "B"})
    wf = ex.submit("io", {})
    assert wf.phase == "Succeeded", wf.summary()
    assert wf.find(type="Pod")[0].outputs["r"] == "root-ro\ntmp-ok\ns3cret:testing:/tmp"
    repo = ex._repository("artifact-repositories", "default-v1")
    body = repo.client().get_object(Bucket=repo.bucket, Key="syn/out.tar.gz")["Body"].read()
    assert tar_members(body) == ["ws", "ws/sub", "ws/sub/copy.txt"]
    logs = repo.client().list_objects_v2(Bucket=repo.bucket, Prefix=f"argo-artifacts/{wf.name}/")["Contents"]
    assert [o["Key"].rsplit("/", 1)[-1] for o in logs] == ["main.log"]


def test_unresolved_reference_and_unknown_feature_fail_loudly(executor_for):
    templates = [
        {
            "name": "main",
            "steps": [
                [
                    {
                        "name": "a",
                        "template": "x",
                        "arguments": {"parameters": [{"name": "v", "value": "{{steps.nope.outputs.parameters.v}}"}]},
                    }
                ]
            ],
        },
        {"name": "x", "inputs": {"parameters": [{"name": "v"}]}, "script": {"image": JOBS_IMAGE, "source": "true"}},
    ]
    from tests.fixtures.argo_exec import SubmitRefused

    with pytest.raises(SubmitRefused, match=re.escape("failed to resolve {{steps.nope.outputs.parameters.v}}")):
        executor_for(wft("u", templates)).submit("u", {})  # argo submit refuses it (validate.py)
    templates[0]["steps"][0][0]["arguments"]["parameters"][0]["value"] = "1"
    wf = executor_for(wft("u", templates)).submit("u", {})
    assert wf.phase == "Error" and "Unsupported" in wf.message and "script" in wf.message


def test_the_image_code_is_never_hidden_by_the_pods_tmp_volumes(executor_for):
    """Pods mount emptyDirs at /tmp (and a writable root gets tmpfs at /tmp and /var): the image's
    `mass` must run wherever this checkout lives, under /tmp too (test below)."""
    templates = [{"name": "main", "steps": [[{"name": "ro", "template": "ro"}, {"name": "rw", "template": "rw"}]]}]
    for name, ro in (("ro", True), ("rw", False)):
        c = container("mass --help > /tmp/v && head -c 11 /tmp/v > /out/v", mounts=("tmp", "out"), ro=ro)
        c["securityContext"].update({"runAsUser": 1000, "runAsGroup": 1000})
        templates.append(
            {
                "name": name,
                "container": c,
                "volumes": [{"name": "tmp", "emptyDir": {}}, {"name": "out", "emptyDir": {}}],
                "outputs": {"parameters": [{"name": "v", "valueFrom": {"path": "/out/v"}}]},
            }
        )
    wf = executor_for(wft("img", templates)).submit("img", {})
    assert wf.phase == "Succeeded", wf.summary()
    assert [n.outputs["v"] for n in wf.find(type="Pod")] == ["usage: mass"] * 2


def test_a_volume_inside_the_checkout_is_refused_by_name(executor_for):
    inside = str(REPO / "mass_jobs")
    c = container("true", mounts=())
    c["volumeMounts"] = [{"name": "v", "mountPath": inside}]
    wf = executor_for(wft("in", [{"name": "main", "container": c, "volumes": [{"name": "v", "emptyDir": {}}]}])).submit(
        "in", {}
    )
    assert wf.phase in ("Failed", "Error") and f"volumeMount {inside} lies inside" in wf.summary()


def _console_script(path: Path, python: Path) -> None:
    """A `mass` entry point as pip writes one when the interpreter's path has a space in it."""
    q = "'" * 3
    path.write_text(
        f'#!/bin/sh\n{q}exec\' "{python}" "$0" "$@"\n\' {q}\n'
        "import sys\nfrom mass_jobs.commands.cli import main\nsys.exit(main())\n"
    )
    path.chmod(0o755)


def test_the_executor_runs_from_a_checkout_under_tmp_with_a_space():
    """A copy of this checkout under /tmp, in a folder with a space, with a venv of its own whose
    `mass` imports the copy's code: the two pod tests above pass there too."""
    import shutil
    import sysconfig
    import tempfile

    top = Path(tempfile.mkdtemp(prefix="mass clone ", dir="/tmp"))
    root = top / "main"
    try:
        root.mkdir()
        for part in ("mass_jobs", "tests", "images", "schemas"):
            shutil.copytree(REPO / part, root / part, ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copy2(REPO / "pyproject.toml", root / "pyproject.toml")
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / ".venv")], check=True)
        python = root / ".venv" / "bin" / "python"
        site = Path(sysconfig.get_path("purelib", vars={"base": str(root / ".venv")}))
        # the copy's code first, then this venv's packages (whose editable finder is not read from there)
        (site / "clone.pth").write_text(f"{root}\n{sysconfig.get_path('purelib')}\n")
        _console_script(root / ".venv" / "bin" / "mass", python)
        where = subprocess.run(
            [
                str(python),
                "-c",
                "import mass_jobs, tests.fixtures.argo_exec.pods as p; print(mass_jobs.__file__); print(p.REPO)",
            ],
            cwd=root,
            capture_output=True,
            text=True,
        )
        assert where.returncode == 0, where.stderr
        assert where.stdout.split("\n")[:2] == [
            str(root / "mass_jobs" / "__init__.py"),
            str(root),
        ]  # the copy, not this checkout
        run = subprocess.run(
            [
                str(python),
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                "tests/test_argo_exec.py",
                "-k",
                "image_code_is_never_hidden or volume_inside_the_checkout",
            ],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert run.returncode == 0 and "2 passed" in run.stdout, run.stdout[-3000:] + run.stderr[-2000:]
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_pytorchjob_stand_in_env_status_and_create_collision(executor_for):
    # each replica says what the operator gave it, then they meet as torchrun's do: the Master ends once
    # every Worker reached it (ended first, the job's Success would leave a Worker never started)
    meet = (
        "import os, socket, time; port = int(os.environ['MASTER_PORT'])\n"
        "if os.environ['RANK'] == '0':\n"
        "    server = socket.create_server(('127.0.0.1', port))\n"
        "    for _ in range(int(os.environ['PET_NNODES']) - 1): server.accept()[0].close()\n"
        "else:\n"
        "    for _ in range(1200):\n"
        "        try: socket.create_connection((os.environ['MASTER_ADDR'], port), timeout=1).close(); break\n"
        "        except OSError: time.sleep(0.1)\n"
    )
    script = (
        "getent hosts $MASTER_ADDR > /tmp/h && echo $(cat /tmp/h | cut -d' ' -f1) $WORLD_SIZE $RANK "
        f'$PET_NNODES $PET_NPROC_PER_NODE $PET_NODE_RANK $PET_MASTER_PORT; python3 -c "{meet}"; test $RANK != 0'
    )
    templates = [
        {"name": "main", "steps": [[{"name": "ok", "template": "ok"}], [{"name": "again", "template": "ok"}]]},
        {**pytorchjob("j", 2, script.replace("; test $RANK != 0", "")), "name": "ok"},
        {**pytorchjob("bad", 2, script), "name": "bad"},
    ]
    templates.append({"name": "fail", "steps": [[{"name": "b", "template": "bad"}]]})
    ex = executor_for(wft("pt", templates))
    wf = ex.submit("pt", {})
    assert wf.phase == "Failed", wf.summary()
    first, second = wf.find(template="ok", type="Resource")
    assert first.phase == "Succeeded" and second.phase == "Failed"
    assert "AlreadyExists" in second.message and 'PyTorchJob "j" already exists' in second.message
    paths = [ex.workdir / "cluster" / "pods" / f"j-{r}" / "main.log" for r in ("master-0", "worker-0", "worker-1")]
    for _ in range(
        300
    ):  # the job succeeds with its Master: a worker may still be writing its line (30 s on a loaded machine)
        if all(p.exists() and p.read_text().strip() for p in paths):
            break
        time.sleep(0.1)
    logs = sorted(p.read_text().split() for p in paths)
    # operator env: WORLD_SIZE = 3 replicas x 2, RANK = replica index (workers after the master)
    port = logs[0][-1]
    assert logs == [["127.0.0.1", "6", str(rank), "3", "2", str(rank), port] for rank in range(3)]
    status = ex.cluster.get("PyTorchJob", "j")["status"]
    assert [c["type"] for c in status["conditions"]] == ["Created", "Running", "Succeeded"]
    ex.delete_workflow(wf)
    assert ex.cluster.get("PyTorchJob", "j") is None  # owned by the workflow
    wf2 = executor_for(wft("pf", templates, entrypoint="fail")).submit("pf", {})
    assert wf2.phase == "Failed" and "failure condition 'status.replicaStatuses.Master.failed > 0'" in wf2.summary()


def test_the_operator_webhook_refuses_what_the_real_one_refuses(executor_for):
    """training-operator v1.9's validating webhook (failurePolicy Fail): the create fails, nothing runs."""
    templates = [
        {"name": "main", "steps": [[{"name": "j", "template": "job"}]]},
        {**pytorchjob("w0", 0, "true"), "name": "job"},
    ]
    ex = executor_for(wft("wh", templates))
    wf = ex.submit("wh", {})
    assert wf.phase == "Failed" and "denied the request" in wf.summary()
    assert "Worker replicas must be at least 1, got 0" in wf.summary()
    assert ex.cluster.get("PyTorchJob", "w0") is None


def test_a_trainer_job_queued_in_kueue_waits_without_failing_and_fails_promptly_after_admission(executor_for):
    """Kueue suspends a labelled job until its queue has the GPUs: the step waits (its Argo deadline
    includes the queue's bound) and the job's own deadline counts from admission, so a job queued
    longer than that deadline still trains; one that fails once admitted, `Suspended` among its
    conditions (Failed at index 3), ends its step Failed within a minute, not at the deadline."""
    from mass_jobs.k8s import labels
    from mass_jobs.k8s.settings import ClusterSettings
    from mass_jobs.k8s.training import FAILED, SUCCEEDED

    s = ClusterSettings(kueue_queue="gpu-team", train_deadline_s="8", queue_wait_s="600")
    assert (s.job_deadline_s, s.train_step_deadline_s) == (8, "608")

    def job(name: str, script: str) -> dict:
        pod = {
            "containers": [container(script, name="pytorch", resources={"requests": {"nvidia.com/gpu": "1"}})],
            "volumes": [{"name": "tmp", "emptyDir": {}}],
        }
        manifest = {
            "apiVersion": "kubeflow.org/v1",
            "kind": "PyTorchJob",
            "metadata": {"name": name, "labels": labels.queue_labels(s)},
            "spec": {
                "runPolicy": {"activeDeadlineSeconds": s.job_deadline_s},
                "pytorchReplicaSpecs": {"Master": {"replicas": 1, "restartPolicy": "Never", "template": {"spec": pod}}},
            },
        }
        return {
            "name": name,
            "activeDeadlineSeconds": s.train_step_deadline_s,
            "resource": {
                "action": "create",
                "setOwnerReference": True,
                "manifest": yaml.safe_dump(manifest),
                "successCondition": SUCCEEDED,
                "failureCondition": FAILED,
            },
        }

    templates = [
        {"name": "main", "steps": [[{"name": "ok", "template": "ok"}, {"name": "bad", "template": "bad"}]]},
        job("ok", "true"),
        job("bad", "exit 3"),
    ]
    ex = executor_for(wft("kq", templates))
    queued_for = 2 * s.job_deadline_s

    def admin():  # both jobs sit suspended past their own deadline, then the queue gets one GPU
        while len(ex.cluster.kueue.pending()) < 2:
            time.sleep(0.1)
        time.sleep(queued_for)
        assert [ex.cluster.get("PyTorchJob", n)["status"]["conditions"][-1]["type"] for n in ("ok", "bad")] == [
            "Suspended",
            "Suspended",
        ]
        ex.cluster.kueue.set_quota("gpu-team", {**NODE_POOL, "nvidia.com/gpu": 1})

    helper = threading.Thread(target=admin, daemon=True)
    helper.start()
    wf = ex.submit("kq", {})
    helper.join()
    assert wf.phase == "Failed", wf.summary()
    (ok,), (bad,) = wf.find(template="ok", type="Resource"), wf.find(template="bad", type="Resource")
    assert ok.phase == "Succeeded" and bad.phase == "Failed", wf.summary()
    assert "failure condition 'status.conditions.3.type = Failed' evaluated true" in bad.message
    conditions = {
        n: [(c["type"], c["status"]) for c in ex.cluster.get("PyTorchJob", n)["status"]["conditions"]]
        for n in ("ok", "bad")
    }
    assert conditions == {
        n: [("Created", "True"), ("Suspended", "False"), ("Running", "True"), (end, "True")]
        for n, end in (("ok", "Succeeded"), ("bad", "Failed"))
    }
    assert sorted(ex.cluster.kueue.admissions) == [("PyTorchJob", "bad"), ("PyTorchJob", "ok")]  # one at a time
    assert ok.finished - ok.started > queued_for and bad.finished - bad.started > queued_for
    assert bad.finished - bad.started < queued_for + 60  # not the step's 608 s deadline


def test_a_tainted_gpu_pool_schedules_the_trainer_and_predictor_with_the_values_and_not_without(
    executor_for, s3_env, tmp_path
):
    """The chart's scheduling values on a cluster whose GPUs are on a tainted pool: without them the
    trainer's replica and the predictor stay Pending with the scheduler's message (the job has no
    Running condition, fails at its deadline; the predictor never loads); with the gpu-cluster
    values both are bound to the GPU node and run."""
    from dataclasses import replace as with_

    from mass_jobs.k8s import labels, preflight, serving, training
    from mass_jobs.k8s.settings import ClusterSettings, values_settings
    from tests.fixtures.argo_exec.scheduler import Node
    from tests.fixtures.k8s import ci_values_files

    taint = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    nodes = [
        Node("cpu-1", {"cpu": "64", "memory": "512Gi", "ephemeral-storage": "1Ti"}),
        Node(
            "gpu-1",
            {"cpu": "192", "memory": "2Ti", "ephemeral-storage": "4Ti", "nvidia.com/gpu": "8"},
            labels={"node.kubernetes.io/instance-type": "p5.48xlarge"},
            taints=[taint],
        ),
    ]
    (gpu_values,) = [str(p) for p in ci_values_files() if p.name == "gpu-cluster-values.yaml"]
    tuned = values_settings(preflight.load_values([gpu_values]))  # its job runs to the end: a day's deadline
    plain = with_(ClusterSettings(), train_deadline_s="4")  # Pending until its deadline fails it
    ex = executor_for(nodes=nodes)
    pending = "0/2 nodes are available: 1 Insufficient nvidia.com/gpu, 1 node(s) had untolerated taint {nvidia.com/gpu: present}."

    def job(s, name):
        obj = training.pytorch_job(s, name, ["--help"], {}, workers=None, nproc="1", gpus="1")
        ex.cluster.apply(obj, "create", None, [])
        for _ in range(1200):
            status = ex.cluster.get("PyTorchJob", name).get("status") or {}
            if any(c["type"] in ("Succeeded", "Failed") for c in status.get("conditions", [])):
                return [c["type"] for c in status["conditions"]], status["conditions"][-1]
            time.sleep(0.1)
        raise AssertionError(f"{name} did not end")

    types, last = job(plain, "untolerated")
    assert types == ["Created", "Failed"] and last["reason"] == "DeadlineExceeded", types  # never Running
    assert ex.cluster.scheduler.pending == {} and "untolerated-master-0" not in ex.cluster.scheduler.bound
    types, _ = job(tuned, "tolerated")
    assert types == ["Created", "Running", "Succeeded"], types
    # the predictor: the empty prefix makes KServe's load fail, which shows its pod was bound and ran
    uri = f"s3://{s3_env['bucket']}/nothing-here"
    run = {labels.RUN: "gpu-pool", labels.GENERATION: "1", labels.STEP: "model"}
    ex.cluster.apply(
        serving.inference_service(plain, "plain", uri, {**run, **labels.queue_labels(plain)}), "apply", None, []
    )
    ex.cluster.apply(
        serving.inference_service(tuned, "tuned", uri, {**run, **labels.queue_labels(tuned)}), "apply", None, []
    )
    for _ in range(300):
        if (
            ex.cluster.get("InferenceService", "tuned")["status"]["modelStatus"]["transitionStatus"]
            == "BlockedByFailedLoad"
        ):
            break
        time.sleep(0.1)
    assert ex.cluster.scheduler.bound["tuned-predictor-0"][0] == "gpu-1"
    assert ex.cluster.scheduler.pending == {"plain-predictor-0": pending}
    assert (
        ex.cluster.get("InferenceService", "plain")["status"]["modelStatus"]["states"]["targetModelState"] == "Loading"
    )
    # what an operator sees of it: `mass pods`'s view, through the API, of the pods this cluster holds
    from tests.fixtures.kube_api import operator_view

    ns = ex.cluster.namespace
    view = operator_view(tmp_path, "gpu-pool", pods=lambda: ex.cluster.scheduler.api_pods(ns), namespace=ns)
    rows = {p["name"]: p for p in view["pods"]}
    assert (rows["plain-predictor-0"]["phase"], rows["plain-predictor-0"]["reason"]) == (
        "Pending",
        f"Unschedulable: {pending}",
    )
    assert rows["plain-predictor-0"]["step"] == "model" and rows["plain-predictor-0"]["node"] == ""
    ex.cluster.delete("InferenceService", "plain")


def test_a_predictor_no_node_takes_fails_the_serve_step_at_the_pending_bound_naming_why(executor_for, s3_env):
    """The generated serve-model step on a cluster without GPUs: KServe reports the model as loading
    whether or not its pod ever schedules, so the step's wait pod reads the predictor's pods with its
    own account's token (the chart's Role, through the API server over TLS) and fails at
    scheduling.pendingTimeoutSeconds, not at model.readyDeadlineSeconds, with the scheduler's message
    as the node's message; the wait is not retried (waiting again would end the same way)."""
    from mass_jobs.k8s import argo, manifests, preflight
    from mass_jobs.k8s.settings import values_settings
    from tests.fixtures.argo_exec.scheduler import Node

    values = preflight.merge(preflight.load_values([]), {"scheduling": {"pendingTimeoutSeconds": 3}})
    s = values_settings(values)
    cycle = argo.mass_cycle(s)
    templates = [
        t for t in cycle["spec"]["templates"] if t["name"] in ("serve-model", "serve-model-apply", "serve-model-wait")
    ]
    wait = next(t for t in templates if t["name"] == "serve-model-wait")
    assert "--pending-timeout=3" in wait["container"]["args"] and "--ready-timeout=3600" in wait["container"]["args"]
    main = {
        "name": "main",
        "steps": [
            [
                {
                    "name": "serve",
                    "template": "serve-model",
                    "arguments": {
                        "parameters": [
                            {"name": "gen", "value": "1"},
                            {"name": "model-uri", "value": f"s3://{s3_env['bucket']}/runs/r/gen-1/model"},
                            {"name": "dtype", "value": "bfloat16"},
                        ]
                    },
                }
            ]
        ],
    }
    workflow = {
        k: cycle["spec"][k]
        for k in ("serviceAccountName", "automountServiceAccountToken", "executor", "securityContext")
    }
    nodes = [Node("cpu-1", {"cpu": "64", "memory": "512Gi", "ephemeral-storage": "1Ti"})]
    ex = executor_for(
        wft("serve", [main, *templates], params=("spec", "run"), **workflow),
        *manifests.service_accounts(s),
        *manifests.rbac(s),
        nodes=nodes,
    )
    wf = ex.submit("serve", {"spec": "s3://b/spec.yaml", "run": "demo"})
    assert wf.phase == "Failed", wf.summary()
    why = "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."
    (pod,) = wf.find(type="Pod")  # one attempt
    assert pod.template == "serve-model-wait" and pod.message.startswith("main: Error (exit code 2): ")
    last = pod.message.splitlines()[-1]  # held from its first reading: at least the bound, within a poll of it
    assert re.fullmatch(
        r"mass serve-wait: predictor pod mass-demo-g1-predictor-0 held for ([3-9]|1[0-5]) s "
        r"\(the pending bound is 3 s\): Unschedulable: " + re.escape(why),
        last,
    ), last
    assert pod.finished - pod.started < 60  # the bound and a reading's interval, not the ready deadline's hour
    assert ex.cluster.scheduler.pending == {"mass-demo-g1-predictor-0": why}
    # it read as its own account: the InferenceService and the pods, nothing else
    reads = {(user, path.split("?")[0]) for user, _, path in ex.accounts.api.requests}
    ns = ex.cluster.namespace
    user = f"system:serviceaccount:{ns}:mass-serve-wait"
    assert reads == {
        (user, f"/apis/serving.kserve.io/v1beta1/namespaces/{ns}/inferenceservices/mass-demo-g1"),
        (user, f"/api/v1/namespaces/{ns}/pods"),
    }


def test_a_pod_naming_a_service_account_the_cluster_lacks_is_never_created(executor_for):
    """The ServiceAccount admission plugin refuses a pod whose account does not exist: the node
    errors with the API server's message and nothing runs (a chart that forgot an account fails at
    its first pod, not later)."""
    from mass_jobs.k8s import manifests
    from mass_jobs.k8s.settings import ClusterSettings

    step = {"name": "step", "container": container("echo ran > /tmp/ran"), "volumes": [{"name": "tmp", "emptyDir": {}}]}
    main = {"name": "main", "steps": [[{"name": "a", "template": "step"}]]}
    ex = executor_for(
        wft("lacking", [main, {**step, "serviceAccountName": "mass-nobody"}]),
        wft("present", [main, {**step, "serviceAccountName": manifests.SERVE_WAIT_SA}]),
        *manifests.service_accounts(ClusterSettings()),
    )
    wf = ex.submit("lacking", {})
    (pod,) = wf.find(type="Pod")
    assert (wf.phase, pod.phase) == ("Failed", "Error"), wf.summary()
    assert pod.message == (
        "pods is forbidden: error looking up service account mass-jobs/mass-nobody: "
        'serviceaccount "mass-nobody" not found'
    )
    assert ex.submit("present", {}).phase == "Succeeded"


def failed_pending(ex, name: str):
    """Submit `name`, whose one pod no node takes under a 3 s pendingTimeout: (that pod, the messages
    it was Pending with). It fails "timeout" within the bound, once (a pending timeout is not retried)."""
    seen = []
    wf = ex.submit(name, {}, background=True)
    while not wf.done.wait(0.2):
        seen += [n.message for n in wf.find(type="Pod") if n.phase == "Pending"]
    assert wf.phase == "Failed", wf.summary()
    (pod,) = wf.find(type="Pod")
    assert (pod.phase, pod.message) == ("Failed", "timeout") and 3 <= pod.finished - pod.started < 10
    return pod, seen


def test_a_merge_asking_more_disk_than_any_node_has_fails_at_its_pending_bound_and_fits_on_a_scratch_volume(
    executor_for,
):
    """The chart's merge pod (160Gi of ephemeral storage) on nodes of 100Gi disk: it stays Pending with
    the scheduler's message and fails "timeout" at scheduling.pendingTimeoutSeconds, not retried (the
    cluster would not fit it again). With scratch.merge on a volume and a small ephemeral request it
    is bound, and its /tmp is the claim's volume."""
    import copy

    from mass_jobs.k8s import argo, preflight
    from mass_jobs.k8s.settings import values_settings
    from tests.fixtures.argo_exec.scheduler import Node

    def merge_template(over: dict) -> dict:
        values = preflight.merge(preflight.load_values([]), {"scheduling": {"pendingTimeoutSeconds": 3}, **over})
        (t,) = [
            copy.deepcopy(t)
            for t in argo.mass_cycle(values_settings(values))["spec"]["templates"]
            if t["name"] == "merge"
        ]
        # its pod as rendered (resources, volumes, placement, deadlines, retry), running a script instead
        t["container"] = container("echo merged > /tmp/out && cat /tmp/out", resources=t["container"]["resources"])
        for key in ("inputs", "outputs", "metrics", "metadata"):  # what reads the workflow's parameters
            t.pop(key, None)
        return t

    disks = [Node(f"cpu-{i}", {"cpu": "64", "memory": "512Gi", "ephemeral-storage": "100Gi"}) for i in (1, 2)]
    plain = merge_template({})
    assert plain["pendingTimeout"] == "3" and plain["volumes"] == [{"name": "tmp", "emptyDir": {}}]
    on_volume = merge_template(
        {
            "scratch": {"merge": {"size": "200Gi", "storageClass": "fast-ssd"}},
            "resources": {"merge": {"ephemeralStorage": "8Gi"}},
        }
    )
    assert on_volume["volumes"] == [
        {
            "name": "tmp",
            "ephemeral": {
                "volumeClaimTemplate": {
                    "spec": {
                        "accessModes": ["ReadWriteOnce"],
                        "storageClassName": "fast-ssd",
                        "resources": {"requests": {"storage": "200Gi"}},
                    }
                }
            },
        }
    ]
    main = {"name": "main", "steps": [[{"name": "merge", "template": "merge"}]]}
    ex = executor_for(wft("disk", [main, plain]), wft("volume", [main, {**on_volume}]), nodes=disks)
    pod, seen = failed_pending(ex, "disk")
    assert set(seen) == {"Unschedulable: 0/2 nodes are available: 2 Insufficient ephemeral-storage."}
    assert ex.cluster.scheduler.pending == {} and ex.cluster.scheduler.bound == {}
    wf = ex.submit("volume", {})
    assert wf.phase == "Succeeded", wf.summary()
    (pod,) = wf.find(type="Pod")
    assert "merged" in pod.log.read_text()


def test_a_trainer_job_whose_pods_never_schedule_fails_its_step_at_the_pending_bound_and_goes(executor_for):
    """The generated train step on a cluster whose only GPUs are on a tainted pool, without the
    tolerations: the job is created and its Master stays Pending (the scheduler's message), so the
    step's start fails at scheduling.pendingTimeoutSeconds, each of its four attempts, instead of
    waiting out the training deadline (two days). Each failed start reads the Master's scheduling
    message into the workflow and deletes the job: after the last attempt nothing is left Pending to
    start training unobserved once a node frees. A job whose Master ran and failed is kept (its pod
    holds the logs)."""
    import copy

    from mass_jobs.k8s import argo, preflight
    from mass_jobs.k8s.settings import values_settings
    from tests.fixtures.argo_exec.scheduler import Node

    values = preflight.merge(preflight.load_values([]), {"scheduling": {"pendingTimeoutSeconds": 1}})
    cycle = argo.mass_cycle(values_settings(values))
    templates = [copy.deepcopy(t) for t in cycle["spec"]["templates"] if t["name"].startswith("train")]
    assert int(next(t for t in templates if t["name"] == "train-job-single")["activeDeadlineSeconds"]) == 1
    params = {"gen": "0", "trainer-workers": "0", "trainer-nproc": "1", "trainer-gpus": "1"}
    main = {
        "name": "main",
        "steps": [
            [
                {
                    "name": "train",
                    "template": "train",
                    "arguments": {"parameters": [{"name": k, "value": v} for k, v in params.items()]},
                }
            ]
        ],
    }
    taint = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    nodes = [
        Node("cpu-1", {"cpu": "64", "memory": "512Gi", "ephemeral-storage": "1Ti"}),
        Node(
            "gpu-1", {"cpu": "192", "memory": "2Ti", "ephemeral-storage": "4Ti", "nvidia.com/gpu": "8"}, taints=[taint]
        ),
    ]
    ex = executor_for(
        wft("train", [main, *templates], params=("spec", "run")),
        *load_documents([REPO / "manifests" / "semaphores.yaml"]),
        nodes=nodes,
    )
    wf = ex.submit("train", {"spec": "s3://mass-jobs/specs/t.yaml", "run": "t"})
    assert wf.phase == "Failed", wf.summary()
    starts = wf.find(template="train-job-single", type="Resource")
    assert len(starts) == 4 and all(n.phase == "Failed" and "deadline" in n.message for n in starts), wf.summary()
    assert all(1 <= n.finished - n.started < 15 for n in starts)
    assert not wf.find(template="train-wait")  # never reached the two days' wait
    reads = wf.find(template="train-scheduling", type="Resource")
    assert len(reads) == 4 and all(n.phase == "Succeeded" for n in reads), wf.summary()
    assert all("untolerated taint {nvidia.com/gpu: present}" in n.outputs["scheduler"] for n in reads)
    assert (
        len(wf.find(template="train-delete-job", type="Resource")) == 4 + 4
    )  # each attempt's first step, and its hook
    assert ex.cluster.get("PyTorchJob", "mass-t-g0-train") is None and ex.cluster.scheduler.pending == {}

    # under Kueue, a job its queue never admits (no quota): no pod to read, the job goes all the same
    queued = preflight.merge(
        preflight.load_values([]),
        {"scheduling": {"pendingTimeoutSeconds": 1}, "kueue": {"queueName": "gpu-team", "maxQueueSeconds": 1}},
    )
    in_queue = [
        copy.deepcopy(t)
        for t in argo.mass_cycle(values_settings(queued))["spec"]["templates"]
        if t["name"].startswith("train")
    ]
    ex = executor_for(
        wft("queued", [main, *in_queue], params=("spec", "run")),
        *load_documents([REPO / "manifests" / "semaphores.yaml"]),
        nodes=nodes,
    )
    wf = ex.submit("queued", {"spec": "s3://mass-jobs/specs/t.yaml", "run": "t"})
    assert wf.phase == "Failed", wf.summary()
    assert len(wf.find(template="train-job-single", type="Resource")) == 4
    reads = wf.find(template="train-scheduling", type="Resource")
    assert len(reads) == 4 and all(n.phase == "Failed" and "NotFound" in n.message for n in reads), wf.summary()
    assert len(wf.find(template="train-delete-job", type="Resource")) == 4 + 4
    assert ex.cluster.get("PyTorchJob", "mass-t-g0-train") is None and not ex.cluster.kueue.pending()

    # the hook's template after a job that started (its Master bound, then failing): the job is kept
    for t in templates:
        if t["name"] == "train-job-single":
            job = yaml.safe_load(t["resource"]["manifest"])
            pod = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
            pod["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
            pod["containers"][0]["command"] = ["sh", "-c", "echo no GPU here >&2; exit 3"]
            t["resource"]["manifest"] = yaml.safe_dump(job)
    started = {
        "name": "main",
        "steps": [
            [
                {
                    "name": "start",
                    "template": "train-job-single",
                    "arguments": {
                        "parameters": [{"name": k, "value": v} for k, v in params.items() if k != "trainer-workers"]
                    },
                }
            ],
            [
                {
                    "name": "unstarted",
                    "template": "train-unstarted",
                    "arguments": {"parameters": [{"name": "gen", "value": "0"}]},
                }
            ],
        ],
    }
    ex = executor_for(wft("crash", [started, *templates], params=("spec", "run")), nodes=nodes)
    wf = ex.submit("crash", {"spec": "s3://mass-jobs/specs/t.yaml", "run": "t"})
    assert wf.phase == "Succeeded", wf.summary()
    (check,) = wf.find(template="train-unstarted-job", type="Resource")
    assert check.phase == "Failed" and "failure condition 'status.conditions.1.type" in check.message
    assert not wf.find(template="train-scheduling", type="Resource") and not wf.find(
        template="train-delete-job", type="Resource"
    )
    assert ex.cluster.get("PyTorchJob", "mass-t-g0-train") is not None


def test_the_executor_refuses_a_deployment_the_api_server_refuses(executor_for):
    """The generated egress proxy's Deployment is accepted; one whose selector misses its pod's
    labels, or whose pod has a deadline (a ReplicaSet's pods cannot), is refused as the API server
    refuses it, before any pod runs."""
    import copy

    from mass_jobs.k8s import egress_proxy, schemas
    from mass_jobs.k8s.settings import ClusterSettings
    from tests.fixtures.argo_exec.resources import ResourceError, _deployment_errors

    good = yaml.safe_load(schemas.substitute_examples(yaml.safe_dump(egress_proxy.deployment(ClusterSettings(), []))))
    assert _deployment_errors(good) == []
    stray = copy.deepcopy(good)
    stray["spec"]["selector"]["matchLabels"]["mass-jobs.io/egress-proxy"] = "another"
    deadline = copy.deepcopy(good)
    deadline["spec"]["template"]["spec"]["activeDeadlineSeconds"] = 60
    ex = executor_for()
    for bad, why in ((stray, "`selector` does not match template `labels`"), (deadline, "activeDeadlineSeconds")):
        with pytest.raises(ResourceError, match=why):
            ex.cluster.apply(bad, "apply", None, [])
    assert ex.cluster.objects == {}


def test_a_queued_predictor_loads_only_once_kueue_admits_it(executor_for, s3_env):
    """The InferenceService the cycle renders with a queue: its pods wait behind Kueue's gate (no
    download, no failure; listed SchedulingGated, which the serve step's wait counts against its
    bound) until the queue covers every resource it requests and has its GPU; then
    KServe loads it (here: an empty prefix, so BlockedByFailedLoad, which shows the storage
    initializer ran)."""
    from mass_jobs.k8s import labels, serving
    from mass_jobs.k8s.settings import ClusterSettings

    s = ClusterSettings(kueue_queue="gpu-team")
    isvc = serving.inference_service(s, "m", f"s3://{s3_env['bucket']}/nothing-here", labels.queue_labels(s))
    assert isvc["metadata"]["labels"][labels.QUEUE] == "gpu-team"
    ex = executor_for()
    ex.cluster.apply(isvc, "apply", None, [])
    for _ in range(20):  # a second and more: nothing is downloaded while it is queued
        assert (
            ex.cluster.get("InferenceService", "m")["status"]["modelStatus"]["states"]["targetModelState"] == "Loading"
        )
        time.sleep(0.1)
    assert ex.cluster.kueue.pending() == [("InferenceService", "m")]
    # its pod exists, gated: the serve step's wait counts it as held (the queue's bound is in its bound)
    from mass_jobs.cluster.model_wait import look

    (pod,) = [
        p
        for p in ex.cluster.scheduler.api_pods(ex.cluster.namespace)
        if p["metadata"]["labels"].get("serving.kserve.io/inferenceservice") == "m"
    ]
    since: dict = {}
    gated = "SchedulingGated: Scheduling is blocked due to non-empty scheduling gates"
    assert (
        look("m", ex.cluster.get("InferenceService", "m"), [pod], since, 0.0, 60).waiting
        == f"pod m-predictor-0: {gated}"
    )
    assert look("m", ex.cluster.get("InferenceService", "m"), [pod], since, 60.0, 60).failure.endswith(gated)
    # a queue of CPU, memory and GPUs, as a cluster's first ClusterQueue often is: the predictor asks
    # for ephemeral-storage too, which the queue does not list, so Kueue never admits it
    ex.cluster.kueue.set_quota("gpu-team", {"cpu": "256", "memory": "4Ti", "nvidia.com/gpu": 8})
    time.sleep(1)
    (workload,) = ex.cluster.kueue.workloads
    assert ex.cluster.kueue.pending() == [("InferenceService", "m")]
    assert workload.events == ["resource ephemeral-storage unavailable in ClusterQueue"]
    ex.cluster.kueue.set_quota("gpu-team", {**NODE_POOL, "nvidia.com/gpu": 1})
    for _ in range(300):
        status = ex.cluster.get("InferenceService", "m")["status"]["modelStatus"]
        if status["transitionStatus"] == "BlockedByFailedLoad":
            break
        time.sleep(0.1)
    assert "no objects under" in status["lastFailureInfo"]["message"]
    ex.cluster.delete("InferenceService", "m")
    assert ex.cluster.kueue.pending() == [] and ex.cluster.kueue.workloads == []


def test_an_oversized_workflow_is_compressed_then_refused_as_argo_does_unless_offloaded(executor_for):
    """The controller measures the whole object's JSON: past MAX_WORKFLOW_SIZE its nodes are stored
    gzip+base64; still past it, the workflow errors "workflow is longer than maximum allowed size"
    unless nodeStatusOffLoad moves the nodes into a database."""
    templates = [
        {
            "name": "main",
            "steps": [
                [
                    {
                        "name": "fan",
                        "template": "echo",
                        "withParam": json.dumps(
                            [{"task": f"task-{i}", "rollout": f"gen-0/search/task-{i}/iter-0"} for i in range(12)]
                        ),
                        "arguments": {"parameters": [{"name": "r", "value": "{{item.rollout}}"}]},
                    }
                ]
            ],
        },
        {
            "name": "echo",
            "inputs": {"parameters": [{"name": "r"}]},
            "retryStrategy": {"limit": "1"},
            "container": container("echo {{inputs.parameters.r}}"),
            "volumes": [{"name": "tmp", "emptyDir": {}}],
        },
    ]

    def run(**kw):
        ex = executor_for(wft("big", templates), **kw)
        wf = ex.submit("big", {})
        return wf, ex

    wf, _ = run()
    raw, packed, stored = wf.size()
    assert wf.phase == "Succeeded" and stored == wf.fixed_bytes + raw and packed < raw / 3, wf.summary()
    assert len([n for n in wf.nodes if n.type == "Pod"]) == 12 and [n.type for n in wf.nodes][:2] == [
        "Steps",
        "StepGroup",
    ]
    # the nodes as the controller writes them: each pod's archived log is an artifact of its node
    # (and of its Retry node, which takes its attempt's outputs); attempts are flagged retried
    nodes = wf.argo_nodes()
    pods = [n for n in nodes.values() if n["type"] == "Pod"]
    retries = [n for n in nodes.values() if n["type"] == "Retry"]
    assert len(retries) == 12 and all(p["nodeFlag"] == {"retried": True} for p in pods)
    for p in pods:
        (log,) = [a for a in p["outputs"]["artifacts"] if a["name"] == "main-logs"]
        body = wf.repo.client().get_object(Bucket=wf.repo.bucket, Key=log["s3"]["key"])["Body"].read().decode()
        assert body.startswith("gen-0/search/task-"), body
    assert sorted(r["outputs"]["artifacts"][0]["s3"]["key"] for r in retries) == sorted(
        p["outputs"]["artifacts"][0]["s3"]["key"] for p in pods
    )
    squeezed, _ = run(max_workflow_size=wf.fixed_bytes + 2 * packed)  # fits once compressed
    assert squeezed.phase == "Succeeded" and squeezed.size()[2] < squeezed.fixed_bytes + raw
    over, _ = run(max_workflow_size=wf.fixed_bytes + packed // 2)
    assert over.phase == "Error" and over.message.startswith(
        "workflow is longer than maximum allowed size. compressed size "
    ), over.message
    assert "offload node status is not supported" in over.message
    offloaded, _ = run(max_workflow_size=wf.fixed_bytes + packed // 2, offload=True)
    assert offloaded.phase == "Succeeded"


def test_template_metrics_are_emitted_when_their_node_is_fulfilled(executor_for):
    """The shapes the generated templates use (mass_jobs.k8s.prometheus): a duration histogram by
    status, a counter labelled by an output parameter, a gauge set from one; a retried template
    counts once, for its Retry node, in its last attempt's status; the counter and the gauge only for
    a node that succeeded (a failed ingest stored no episode); each series labelled by its run, so
    two runs on one controller keep theirs apart."""
    from mass_jobs.k8s import prometheus as PM
    from mass_jobs.k8s.yamlio import dump_docs

    def metrics(step):
        built = PM.metrics(PM.step_duration(step), PM.episode_outcomes(step), PM.generation_gauge("render"))
        return yaml.safe_load(dump_docs([built.model_dump(by_alias=True, exclude_none=True)]))

    ingest = {
        "name": "ingest",
        "inputs": {"parameters": [{"name": "gen"}, {"name": "rc"}, {"name": "o"}]},
        "container": container(
            "mkdir -p /tmp/o && printf {{inputs.parameters.o}} > /tmp/o/outcome && "
            "printf 42 > /tmp/o/supervised-tokens && exit {{inputs.parameters.rc}}"
        ),
        "volumes": [{"name": "tmp", "emptyDir": {}}],
        "retryStrategy": {"limit": "1"},
        "outputs": {
            "parameters": [
                {"name": "outcome", "valueFrom": {"path": "/tmp/o/outcome", "default": "unknown"}},
                {"name": "supervised-tokens", "valueFrom": {"path": "/tmp/o/supervised-tokens"}},
            ]
        },
        "metrics": metrics("collect"),
    }
    fan = [
        {"gen": "0", "rc": "0", "o": "success"},
        {"gen": "0", "rc": "0", "o": "turn_limit"},
        {"gen": "1", "rc": "0", "o": "success"},
        {"gen": "1", "rc": "3", "o": "failed"},
    ]
    templates = [
        {
            "name": "main",
            "steps": [
                [
                    {
                        "name": "i",
                        "template": "ingest",
                        "withParam": json.dumps(fan),
                        "continueOn": {"failed": True},
                        "arguments": {
                            "parameters": [{"name": k, "value": "{{item.%s}}" % k} for k in ("gen", "rc", "o")]
                        },
                    }
                ]
            ],
        },
        ingest,
    ]
    ex = executor_for(wft("metrics", templates, params=("run",)))
    wf = ex.submit("metrics", {"run": "first"})
    assert wf.phase == "Succeeded", wf.summary()
    reg = ex.metrics
    outcomes = {lab["outcome"]: s["value"] for lab, s in reg.get("mass_episodes_total", step="collect", run="first")}
    assert outcomes == {"success": 2.0, "turn_limit": 1.0}  # the failed ingest (outcome "failed" written) is not one
    durations = {lab["status"]: s for lab, s in reg.get("mass_step_duration_seconds", step="collect")}
    assert sorted(durations) == ["Failed", "Succeeded"] and durations["Succeeded"]["count"] == 3
    assert durations["Failed"]["count"] == 1  # two attempts, one Retry node: counted once
    assert durations["Succeeded"]["buckets"][float("inf")] == 3 and durations["Succeeded"]["sum"] > 0
    gauges = {lab["generation"]: s["value"] for lab, s in reg.get("mass_supervised_tokens")}
    assert gauges == {"0": 42.0, "1": 42.0}
    assert reg.errors == []  # the failed node's gauge was not read: no MetricsError
    # a second run on the same controller: its series are its own, the first run's stay as they were
    assert ex.submit("metrics", {"run": "second"}).phase == "Succeeded"
    for run in ("first", "second"):
        assert {lab["outcome"]: s["value"] for lab, s in reg.get("mass_episodes_total", run=run)} == outcomes
        assert {lab["generation"]: s["value"] for lab, s in reg.get("mass_supervised_tokens", run=run)} == gauges
    assert {lab["run"] for name in PM.NAMES[:3] for lab, _ in reg.get(name)} == {"first", "second"}
    # a value that is no number is dropped with an error, as the controller logs and skips it
    reg.emit(
        [{"name": "mass_win_share", "gauge": {"value": "{{outputs.parameters.w}}"}}], {"outputs.parameters.w": "n/a"}
    )
    assert reg.get("mass_win_share") == [] and len(reg.errors) == 1


def test_generated_trainer_jobs_pass_the_webhook_for_one_replica_and_several():
    """One replica renders the Master alone (job-single), more a Master and Workers (job): each passes
    the webhook; the Worker manifest with 0 workers would not, so the steps choose by `when`."""
    from mass_jobs.k8s.schemas import webhook_errors

    cycle = next(
        d for d in load_documents([REPO / "argo" / "mass-cycle.yaml"]) if d["metadata"]["name"] == "mass-cycle"
    )
    t = {x["name"]: x for x in cycle["spec"]["templates"]}
    scope = {
        "workflow.parameters.run": "demo",
        "inputs.parameters.gen": "0",
        "inputs.parameters.trainer-nproc": "2",
        "inputs.parameters.trainer-gpus": "1",
        "workflow.parameters.spec": "s3://b/s.yaml",
    }

    def job(template: str, workers: str | None) -> dict:
        values = {**scope, **({"inputs.parameters.trainer-workers": workers} if workers is not None else {})}
        text = re.sub(
            r"\{\{\s*([^}]+?)\s*\}\}", lambda m: values.get(m.group(1), "x"), t[template]["resource"]["manifest"]
        )
        return yaml.safe_load(text)

    assert "Worker" not in job("train-job-single", None)["spec"]["pytorchReplicaSpecs"]
    assert webhook_errors(job("train-job-single", None)) == []
    assert webhook_errors(job("train-job", "1")) == [] and webhook_errors(job("train-job", "2")) == []
    assert webhook_errors(job("train-job", "0")) == [
        "PyTorchJob/mass-demo-g0-train: Worker replicas must be at least 1, got 0 (leave Worker out for one replica)"
    ]
    steps = {s["name"]: s.get("when") for group in t["train"]["steps"] for s in group}
    assert steps == {
        "delete-job": None,
        "job": "{{inputs.parameters.trainer-workers}} > 0",
        "job-single": "{{inputs.parameters.trainer-workers}} == 0",
        "wait": None,
    }


def test_inferenceservice_storage_download_is_a_plain_prefix(cluster, tmp_path):
    """KServe storage.py: `s3://b/run/gen-1/model` also takes `run/gen-1/model-fp8/...` (as `-fp8/...`)."""
    import boto3

    s3 = cluster["s3"]
    client = boto3.client("s3", endpoint_url=s3["endpoint_url"], region_name=s3["region"])
    for key in (
        "r/gen-1/model/config.json",
        "r/gen-1/model/sub/w.bin",
        "r/gen-1/model-fp8/config.json",
        "r/gen-1/model/empty",
    ):
        client.put_object(Bucket=s3["bucket"], Key=key, Body=b"" if key.endswith("empty") else b"x")
    ex = cluster["make"]()
    ex.cluster._download(f"s3://{s3['bucket']}/r/gen-1/model", tmp_path / "a")
    assert sorted(p.relative_to(tmp_path / "a").as_posix() for p in (tmp_path / "a").rglob("*") if p.is_file()) == [
        "-fp8/config.json",
        "config.json",
        "sub/w.bin",
    ]
    ex.cluster._download(f"s3://{s3['bucket']}/r/gen-1/model/", tmp_path / "b")
    assert sorted(p.relative_to(tmp_path / "b").as_posix() for p in (tmp_path / "b").rglob("*") if p.is_file()) == [
        "config.json",
        "sub/w.bin",
    ]


# ---------------------------------------------------------------- the generated templates, end to end


def test_argo_files_are_the_chart_rendered_with_defaults():
    """The executor runs the chart's rendering; argo/ holds the same templates for the default values."""
    files = {d["metadata"]["name"]: d for d in load_documents(sorted((REPO / "argo").glob("*.yaml")))}
    chart = {d["metadata"]["name"]: d for d in chart_docs() if d["kind"] in ("WorkflowTemplate", "CronWorkflow")}
    assert sorted(files) == sorted(chart)

    def normal(spec: dict) -> dict:  # resource manifests are YAML text: compare them parsed
        spec = json.loads(json.dumps(spec))
        for t in spec.get("templates", []):
            if "resource" in t:
                t["resource"]["manifest"] = yaml.safe_load(re.sub(r"\{\{(.*?)\}\}", r"<\1>", t["resource"]["manifest"]))
        return spec

    for name, doc in files.items():
        assert normal(doc["spec"]) == normal(chart[name]["spec"]), name


def _runs_mass_episode(template: dict) -> bool:
    c = template.get("container") or {}
    argv = [*(c.get("command") or []), *(c.get("args") or [])]
    return (
        any(a == "mass" or a.endswith("/mass") for a in argv[:1])
        and "episode" in argv[1:2]
        or any("mass episode" in a for a in argv)
    )


def test_every_pod_running_mass_episode_holds_no_credential_and_is_an_agent_pod():
    """Property over the generated argo/*.yaml: a template whose container runs `mass episode`
    (model-written code) has no secret (env valueFrom secretKeyRef, envFrom), no ServiceAccount
    token, and pod labels the agent NetworkPolicy selects; search, collect and evaluate each reach
    such a template, and no other template runs `mass episode`."""
    from mass_jobs.k8s.manifests import agent_network_policy
    from mass_jobs.k8s.settings import ClusterSettings

    docs = {d["metadata"]["name"]: d for d in load_documents(sorted((REPO / "argo").glob("*.yaml")))}
    selector = agent_network_policy(ClusterSettings())["spec"]["podSelector"]["matchLabels"]
    episodes = []
    for doc in docs.values():
        spec = doc["spec"].get("workflowSpec", doc["spec"])
        for t in spec.get("templates", []):
            if not _runs_mass_episode(t):
                continue
            episodes.append(t["name"])
            c = t["container"]
            text = json.dumps(t)
            assert "secretKeyRef" not in text and "secretRef" not in text and "envFrom" not in c, t["name"]
            assert all("valueFrom" not in e for e in c.get("env", [])), t["name"]
            # the pod's token: off for the template and for the workflow; no other ServiceAccount
            assert t["automountServiceAccountToken"] is False and spec["automountServiceAccountToken"] is False
            assert "serviceAccountName" not in t and "volumes" in t
            assert not [v for v in t["volumes"] if set(v) - {"name", "emptyDir"}], t[
                "name"
            ]  # no secret/projected volume
            labels = t["metadata"]["labels"]
            assert all(labels.get(k) == v for k, v in selector.items()), (t["name"], labels, selector)
            assert int(t["activeDeadlineSeconds"]) > 0
            # model-written code runs in the sandbox sidecar, qwen-code in the qwen one: other uids
            # than the harness's and each other's, each sharing with the harness only its socket's volume
            pod_uid = spec["securityContext"]["runAsUser"]
            sidecars = {s["name"]: s for s in t["sidecars"]}
            assert set(sidecars) == {"sandbox", "qwen"}
            uids = {n: s["securityContext"]["runAsUser"] for n, s in sidecars.items()}
            assert len({pod_uid, c["securityContext"].get("runAsUser", pod_uid), *uids.values()}) == 3, uids
            for flag, side in (("--sandbox", sidecars["sandbox"]), ("--qwen", sidecars["qwen"])):
                assert side["command"] + side["args"][:1] == ["mass", "sandbox-serve"] and flag in c["args"]
                assert side["securityContext"]["runAsGroup"] != spec["securityContext"]["runAsGroup"]
                socket = c["args"][c["args"].index(flag) + 1]
                mine = {m["name"] for m in side["volumeMounts"] if socket.startswith(m["mountPath"] + "/")}
                assert len(mine) == 1 and mine <= {m["name"] for m in c["volumeMounts"]}
                assert not [m for m in side["volumeMounts"] if m["mountPath"] in ("/out", "/in")]
            assert not [m for m in sidecars["sandbox"]["volumeMounts"] if m["mountPath"] == "/qwen"]
            assert not [
                a
                for a in (t["outputs"]["artifacts"] + t["inputs"]["artifacts"])
                if not a["path"].startswith(("/out/", "/in/"))
            ]  # Argo's wait reads only the main container's
    assert episodes == ["agent-episode"]

    cycle = {t["name"]: t for t in docs["mass-cycle"]["spec"]["templates"]}

    def reach(name, seen=None):
        seen = set() if seen is None else seen
        if name in seen:
            return seen
        seen.add(name)
        for group in cycle[name].get("steps", []):
            for step in group:
                for ref in (step, *(step.get("hooks") or {}).values()):
                    reach(ref["template"], seen)
        return seen

    # search (every iteration), collect (every episode) and evaluate (every rollout) run their
    # episodes in the agent pod, and their own step pods never run one
    for step, entry in (("search", "search-task"), ("collect", "collect"), ("evaluate", "evaluate")):
        reached = reach(entry)
        assert "agent-episode" in reached, step
        for name in reached - {"agent-episode"}:
            t = cycle[name]
            if "container" in t:
                # the step's own command, or the wait of a model it serves (evaluate's rounds)
                assert t["container"]["args"][0] in (step, "serve-wait") and not _runs_mass_episode(t), name
                # model-written code never runs where the store credentials are
                assert t["metadata"]["labels"]["mass-jobs.io/step"] != selector["mass-jobs.io/step"]
    # evaluate's pods are CPU pods: its models are InferenceServices it creates and deletes
    for name in reach("evaluate"):
        limits = (cycle[name].get("container") or {}).get("resources", {}).get("limits", {})
        assert "nvidia.com/gpu" not in limits, name
    assert {"serve-model", "delete-model"} <= reach("evaluate")


@pytest.mark.slow(cost=250)
def test_mass_run_two_generations_equals_local_run(cluster, tmp_path):
    from mass_jobs.tools.testing.scripted_judges import HashVerdictJudge

    s3 = cluster["s3"]
    with HashVerdictJudge() as judge:
        argo_doc = ci_spec(s3, cluster["model_uri"], "argo-run", judge.base_url)
        spec_uri = put_spec(s3, argo_doc, "specs/ci-argo.yaml")
        # the local run beside the executor's; the model base and the judge model are s3:// on moto:
        # the standard AWS chain points at it, as the pods' env does
        local_doc = ci_spec(s3, cluster["model_uri"], "local-run", judge.base_url)
        local = LocalRun(local_doc, tmp_path, env={"AWS_ENDPOINT_URL": s3["endpoint_url"], JUDGE_KEY_ENV: JUDGE_KEY})
        ex = cluster["make"]()
        try:
            wf = ex.submit("mass-run", {"spec": spec_uri, "run": argo_doc["name"]})
        finally:
            local.wait()
        assert wf.phase == "Succeeded", wf.summary()
        from mass_jobs.config.run_spec import RunSpec
        from mass_jobs.k8s import preflight

        # the preflight's bound on Argo's stack depth holds for the depth this run reached
        bound = preflight.recursion_depth(RunSpec.model_validate(argo_doc))
        print(f"template stack depth reached {wf.max_depth}, preflight bound {bound}")
        assert wf.max_depth == bound
        # `mass plan`'s size of the Workflow object against this run's nodes measured in Argo's shape:
        # the estimate walks the same templates on the success path with the spec's fan-outs at their
        # bounds (every episode checked): measured 614 vs 595 nodes, 395 vs 351 kB, 61 vs 52 kB
        # compressed; it may not fall below what a run holds
        from mass_jobs.k8s import workflow_size

        est = workflow_size.estimate(RunSpec.model_validate(argo_doc), wf.name)[-1]
        raw, packed, _ = wf.size()
        print(
            f"workflow object: {len(wf.nodes)} nodes, {raw} B ({packed} B compressed); estimated {est.nodes} "
            f"nodes, {est.nodes_bytes} B ({est.compressed_bytes} B)"
        )
        assert abs(est.nodes - len(wf.nodes)) <= 0.1 * len(wf.nodes)
        assert 0.95 * raw <= est.nodes_bytes <= 1.25 * raw and packed <= est.compressed_bytes <= 1.4 * packed
        # the panel was asked the same questions by both runs (each as often by one as by the other)
        asked = Counter(judge.asked)
        odd = {d: judge.senders[d] for d, n in asked.items() if n % 2}
        assert asked and not odd, f"asked by one run more often than by the other: {odd}"
        # each verdict request carried the judge's key: from the Secret on the cluster, the env locally
        assert {r["headers"].get("authorization") for r in judge.requests} == {f"Bearer {JUDGE_KEY}"}

    run = argo_doc["name"]
    argo_store, local_store = (open_store(StoreSpec(**d["store"])) for d in (argo_doc, local_doc))
    got, want = manifests(argo_store, run), manifests(local_store, run)
    assert sorted(got) == sorted(want)
    assert len(got) > 40  # every step of both generations, per task, iteration and episode
    differ = []
    for prefix in want:
        # the report's Step hashes the other manifests, whose pinned traces hold wall-clock fields:
        # its input differs between any two runs; its content (report.json) is what must not
        if got[prefix]["input_hash"] != want[prefix]["input_hash"] and prefix != f"{run}/report":
            differ.append(f"{prefix}: input hash")
        if sorted(got[prefix]["outputs"]) != sorted(want[prefix]["outputs"]):
            differ.append(f"{prefix}: output keys")
            continue
        for key, digest in want[prefix]["outputs"].items():
            if got[prefix]["outputs"][key] != digest and timeless(argo_store, key) != timeless(local_store, key):
                differ.append(f"{key}: content{archive_difference(argo_store, local_store, key)}")
    if differ:  # keep what differs for the failure report
        dump = Path(os.environ.get("ARGO_EXEC_DIFF_DIR", tmp_path / "diff"))
        for name, st in (("argo", argo_store), ("local", local_store)):
            for key in [d.split(":")[0] for d in differ if d.endswith("content")]:
                if not key.endswith(".png") and "/step-" not in key:
                    (dump / name / key).parent.mkdir(parents=True, exist_ok=True)
                    (dump / name / key).write_bytes(st.get_bytes(key))
            for prefix in [d.split(":")[0] for d in differ if d.endswith("input hash")]:
                (dump / name / prefix).mkdir(parents=True, exist_ok=True)
                (dump / name / prefix / "_manifest.json").write_text(
                    json.dumps(st.get_json(f"{prefix}/_manifest.json"), indent=1)
                )
    assert not differ, "\n".join(differ)
    report = f"{run}/report/report.json"
    assert argo_store.get_json(report) == local_store.get_json(report)
    # the templates' Prometheus metrics, as Argo's metrics server holds them, agree with the store
    from mass_jobs.store import read_manifest

    reg, ctx = ex.metrics, RunContext(RunSpec.model_validate(argo_doc), argo_store)
    assert reg.errors == []
    timed = {lab["step"] for lab, _ in reg.get("mass_step_duration_seconds", status="Succeeded")}
    assert {
        "validate",
        "search-ingest",
        "collect-prepare",
        "collect-ingest",
        "episode",
        "serve-model",
        "render",
        "evaluate-finish",
        "report",
    } <= timed and timed & {"train-job", "train-job-single"}, timed
    episodes = Counter(
        argo_store.get_json(k)["outcome"]
        for k in argo_store.list(f"{run}/")
        if "/collect/" in k and k.endswith("/status.json") and "/output/" not in k and "/input/" not in k
    )
    counted = {lab["outcome"]: int(s["value"]) for lab, s in reg.get("mass_episodes_total", step="collect")}
    assert counted == dict(episodes) and sum(counted.values()) == 2 * 2 * 3, counted  # 2 gens x 2 tasks x 3 episodes
    tokens = {lab["generation"]: s["value"] for lab, s in reg.get("mass_supervised_tokens")}
    assert tokens == {
        str(g): read_manifest(argo_store, ctx.sft(g))["extra"]["stored_supervised_tokens"] for g in (0, 1)
    }
    shares = {lab["generation"]: s["value"] for lab, s in reg.get("mass_win_share")}
    want = {str(g): read_manifest(argo_store, ctx.eval(g))["extra"]["panel_win_share"] for g in (1, 2)}  # L_G's
    assert shares.keys() == want.keys() and all(
        (math.isnan(shares[g]) and want[g] is None) or shares[g] == want[g] for g in want
    ), (shares, want)
    # every episode (search reference and iterations, collect episodes, evaluate rollouts) ran in an
    # agent pod: the rollouts the agent pods ran are exactly the stored ones, and each stored status
    # is the one its pod uploaded
    pods = [n for n in wf.find(template="agent-episode", type="Pod") if n.phase == "Succeeded"]
    ran = sorted(n.inputs["rollout"] for n in pods if "/guard-checks/" not in n.inputs["rollout"])
    # the guard's check commands ran in agent pods too: one per eligible episode of a task with checks
    checked = sorted(n.inputs["rollout"] for n in pods if "/guard-checks/" in n.inputs["rollout"])
    eligible = sorted(
        f"gen-{g}/guard-checks/fib/{e}"
        for g in range(2)
        for e in argo_store.get_json(f"{run}/gen-{g}/collect/fib/summary.json")["eligible"]
    )
    assert checked == eligible, (checked, eligible)
    for r in checked:
        doc = argo_store.get_json(f"{run}/{r}/checks.json")
        assert [(c["name"], c["exit_code"]) for c in doc["checks"]] == [("workspace-lists", 0)], doc
    stored = sorted(
        k.removeprefix(f"{run}/").removesuffix("/status.json")
        for k in argo_store.list(f"{run}/")
        if k.endswith("/status.json") and "/output/" not in k
    )
    assert ran == stored
    kinds = {kind: sum(1 for r in ran if f"/{kind}/" in f"/{r}") for kind in ("search", "collect", "eval")}
    train, gens = 2, 2
    # search: the reference and W_0, then one per valid proposal (a failed one runs no episode)
    assert train * gens * 2 <= kinds["search"] <= train * gens * (doc_iterations(argo_doc) + 2), kinds
    assert kinds["collect"] == gens * train * argo_doc["collection"]["episodes"], kinds
    # L0, L1 and L2: every task (train and test) x replicates, each once
    assert kinds["eval"] == 3 * len(argo_doc["tasks"]) * argo_doc["evaluation"]["rollouts_per_task"], kinds
    for r in ran:
        assert argo_store.get_bytes(f"{run}/{r}/status.json") == argo_store.get_bytes(f"{run}/{r}/output/status.json")
    local_statuses = sorted(
        k.removeprefix(f"{run}/").removesuffix("/status.json")
        for k in local_store.list(f"{run}/")
        if k.endswith("/status.json")
    )
    assert local_statuses == stored  # the local runner ran the same episodes (in-process, sandboxed)
    # the cluster path: the generation's InferenceService for its inner loop, released before
    # training; evaluate's one at a time, for what is not stored yet (at g = 0: L0's rollouts, L1's
    # rollouts and self-verdicts, L0's self-verdicts; at g = 1: L2), each released after its round;
    # one trainer per generation, owned by the workflow
    events = ex.cluster.events
    isvc = f"InferenceService/mass-{run}-g"
    assert [e for e in events if "InferenceService" in e] == [
        f"{verb} {isvc}{g}" for g in (0, 0, 1, 0, 1, 2) for verb in ("apply", "delete")
    ], events
    assert [e for e in events if "PyTorchJob" in e] == [f"create PyTorchJob/mass-{run}-g{g}-train" for g in range(2)]
    ex.delete_workflow(wf)
    assert not ex.cluster.objects


def doc_iterations(doc: dict) -> int:
    return doc["search"]["iterations"]


@pytest.mark.slow(cost=15)
def test_a_judge_key_missing_from_its_secret_stops_the_cycle_at_validate(cluster):
    """The judge Secret is optional to the pods (a run without keyed judges needs none): validate
    mounts it as evaluate's finish does and refuses a key it lacks, before any model is served."""
    doc, spec_uri = one_generation(cluster, "no-key")
    ex = cluster["make"](judge_keys={"ANOTHER_KEY": "x"})
    wf = ex.submit("mass-cycle", {"spec": spec_uri, "run": doc["name"], "gen": "0"})
    assert wf.phase == "Failed" and {n.template for n in wf.failures()} == {"validate"}, wf.summary()
    log = "".join(n.log.read_text() for n in wf.failures())
    assert f"$.judges[0].api_key_env: expected {JUDGE_KEY_ENV} in the judge Secret" in log, log[-2000:]
    assert not [e for e in ex.cluster.events if "InferenceService" in e or "PyTorchJob" in e]


@pytest.mark.slow(cost=100)
def test_task_that_did_not_beat_its_reference_is_skipped_without_failing(cluster):
    # the random tiny model never wins a comparison: no task beats its bare reference
    doc, spec_uri = one_generation(cluster, "skip", **{"collection.require_beats_reference": True})
    ex = cluster["make"]()
    wf = ex.submit("mass-cycle", {"spec": spec_uri, "run": doc["name"], "gen": "0"})
    steps = re.compile(r"\.(collect|guard|rank)\(")
    assert not [n.name for n in wf.failures() if steps.search(n.name)], wf.summary()
    store, run = run_store(doc), doc["name"]
    for task in ("fib", "primes"):
        assert not store.get_json(f"{run}/gen-0/search/{task}/state.json")["beats_reference"]
        summary = store.get_json(f"{run}/gen-0/collect/{task}/summary.json")
        assert summary["skipped"] and not summary["eligible"]
        assert store.get_json(f"{run}/gen-0/rank/{task}.json")["skipped"]
    # no agent pod ran for a skipped task; with EVERY task skipped there is nothing to train on, and
    # the generation stops at render with the local runner's message, not in collect/guard/rank
    agents = [n.inputs["rollout"] for n in wf.find(template="agent-episode", type="Pod")]
    assert agents and not [r for r in agents if "/collect/" in r]  # search's ran, none for collect
    assert wf.phase == "Failed" and {n.template for n in wf.failures()} == {"render"}, wf.summary()
    assert all("no training windows" in n.log.read_text() for n in wf.failures())


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@pytest.mark.slow(cost=150)
def test_dying_agent_pods_and_a_stopped_training_one_cycle_recovers_from_both(cluster):
    """One cycle, two failures a cluster has (one run, where each once had its own):
    agent pods that always die (OOM, node loss) are retried, then stored as infra_error episodes,
    alike for collect, search and evaluate; and a workflow stopped mid-training, its PyTorchJob
    (two replicas: Master + Worker through the webhook) still training, resubmitted, resumes from
    the stored checkpoint after deleting the old job."""
    # enough steps after the first checkpoint that the stop lands mid-training on an idle machine too
    doc, spec_uri = one_generation(
        cluster, "crash-resume", **{"sft.replicas": 2, "sft.steps": 16, "sft.save_every": 2, "sft.val_every": 4}
    )
    # a collect episode, a search rollout and an evaluate rollout whose agent pods always die
    lost = ("gen-0/collect/fib/ep-0", "gen-0/search/primes/reference", "eval/gen-1/sort/rep-0")
    crashed = {r: [] for r in lost}

    def crash(template, inputs, attempt):
        if template == "agent-episode" and inputs.get("rollout") in crashed:
            crashed[inputs["rollout"]].append(attempt)
            return 1  # the container dies on every attempt
        return None

    store, run = run_store(doc), doc["name"]
    ex = cluster["make"](faults=crash)
    first = ex.submit("mass-cycle", {"spec": spec_uri, "run": run, "gen": "0"}, background=True)
    while not first.done.is_set() and not store.list(f"{run}/gen-0/train/step-"):
        first.done.wait(0.5)
    assert not first.done.is_set(), first.summary()  # it reached a stored checkpoint while training
    ex.stop(first)  # argo stop: the waiter ends, the exit handler deletes the InferenceService
    first.done.wait()
    assert first.phase == "Failed" and first.find(template="delete-model")
    # the stopped workflow is not deleted: its PyTorchJob trains on, as on a cluster. Frozen here
    # (every process of its containers' cgroups), so it is still mid-training when the run is
    # resubmitted, as a long training would be
    job = f"mass-{run}-g0-train"
    assert list(ex.cluster.objects) == [("PyTorchJob", job)]
    frozen = [pid for h in ex.cluster.procs[("PyTorchJob", job)] for pid in h.pod.cgroup.pids()]
    for pid in frozen:
        os.kill(pid, signal.SIGSTOP)
    import boto3

    s3 = cluster["s3"]
    client = boto3.client("s3", endpoint_url=s3["endpoint_url"], region_name=s3["region"])
    prefix = f"{doc['store']['uri'].split('/', 3)[3]}/{run}/gen-0/train/step-"
    stored = {
        o["Key"]: (o["ETag"], o["LastModified"])
        for o in client.list_objects_v2(Bucket=s3["bucket"], Prefix=prefix)["Contents"]
    }
    assert stored and not store.exists(f"{run}/gen-0/train/_manifest.json")  # stopped mid-training

    second = ex.submit("mass-cycle", {"spec": spec_uri, "run": run, "gen": "0"})
    assert second.phase == "Succeeded", second.summary()
    # one writer: the resubmitted run's train step deleted the old job (its pods gone) before its own
    jobs = [e for e in ex.cluster.events if e.endswith(f"PyTorchJob/{job}")]
    assert jobs == [f"create PyTorchJob/{job}", f"delete PyTorchJob/{job}", f"create PyTorchJob/{job}"], jobs
    assert frozen and not [pid for pid in frozen if _alive(pid)]  # the old job's processes are gone
    after = {
        o["Key"]: (o["ETag"], o["LastModified"])
        for o in client.list_objects_v2(Bucket=s3["bucket"], Prefix=prefix)["Contents"]
    }
    assert {k: after[k] for k in stored} == stored  # resumed: what was stored before the stop is untouched
    assert store.exists(f"{run}/gen-0/train/_manifest.json") and store.exists(f"{run}/gen-1/model/config.json")
    train = store.get_json(f"{run}/gen-0/train/_manifest.json")["extra"]
    assert train["world_size"] == 2 and train["steps"] == doc["sft"]["steps"]
    assert [n.template for n in second.find(type="Resource") if "train-job" in n.template] == ["train-job"]

    # the dying pods: retried within a submission (search and collect in the first, evaluate in the
    # second; what the first stored is not asked again), then recorded alike
    for attempts in crashed.values():
        assert len(attempts) > 1 and attempts == list(range(len(attempts)))
    for r in lost:
        assert store.get_json(f"{run}/{r}/status.json")["outcome"] == "infra_error", r
    statuses = [store.get_json(f"{run}/{r}/status.json") for r in lost]
    assert all(st == statuses[0] for st in statuses) and statuses[0]["harness"] == doc.get("execution", {}).get(
        "harness", "builtin"
    )
    assert store.get_json(f"{run}/gen-0/search/primes/state.json")["reference_outcome"] == "infra_error"
    summary = store.get_json(f"{run}/gen-0/collect/fib/summary.json")
    outcomes = {e["id"]: e["outcome"] for e in summary["episodes"]}
    assert outcomes["ep-0"] == "infra_error" and "ep-0" not in summary["eligible"]
    assert set(outcomes) == {f"ep-{i}" for i in range(doc["collection"]["episodes"])}


def test_an_agent_pod_asking_a_gpu_no_node_has_fails_at_its_pending_bound(executor_for):
    """The chart's agent pod with resources.agent.gpu on CPU-only nodes: Pending with the scheduler's
    message, it fails "timeout" at scheduling.pendingTimeoutSeconds (its steps hold the agent-pods
    semaphore, so the wait for it does not count), not after the agent pods' day-long deadline."""
    import copy

    from mass_jobs.k8s import argo, preflight
    from mass_jobs.k8s.settings import values_settings
    from tests.fixtures.argo_exec.scheduler import Node

    values = preflight.merge(
        preflight.load_values([]), {"scheduling": {"pendingTimeoutSeconds": 3}, "resources": {"agent": {"gpu": 1}}}
    )
    templates = {t["name"]: t for t in argo.mass_cycle(values_settings(values))["spec"]["templates"]}
    t = copy.deepcopy(templates["agent-episode"])
    assert t["pendingTimeout"] == "3" and "synchronization" not in t
    gpu = next(c for c in t["sidecars"] if c["name"] == "sandbox")["resources"]
    assert gpu["limits"]["nvidia.com/gpu"] == "1"
    # its pod as rendered (the sandbox container's GPU, deadlines, retry), running a script instead
    t["container"] = container("echo ran", resources=gpu)
    for key in ("inputs", "outputs", "metrics", "metadata", "sidecars", "volumes", "volumeMounts"):
        t.pop(key, None)
    main = {"name": "main", "steps": [[{"name": "agent", "template": "agent-episode"}]]}
    cpus = [Node(f"cpu-{i}", {"cpu": "64", "memory": "512Gi", "ephemeral-storage": "100Gi"}) for i in (1, 2)]
    ex = executor_for(wft("gpu-agent", [main, t]), nodes=cpus)
    _, seen = failed_pending(ex, "gpu-agent")
    assert set(seen) == {"Unschedulable: 0/2 nodes are available: 2 Insufficient nvidia.com/gpu."}
