"""A newcomer's environment mistakes are one line naming what to fix, with exit 2 (bad input) or
1 (a step could not reach something), from every command: against moto's S3 server and a closed
loopback port, through the real `mass` entry in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from tests.fixtures.s3 import FAKE_CREDENTIALS, free_port

NO_CREDENTIALS = (
    "mass {cmd}: S3: no credentials found; set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
    "(or AWS_PROFILE) in the environment of this command"
)
UNREACHABLE = (
    "mass {cmd}: S3: cannot reach the endpoint {url}; check store.endpoint_url (or AWS_ENDPOINT_URL) "
    "and that the server is up"
)
NO_BUCKET = "mass {cmd}: S3: the bucket 'no-such-bucket' does not exist at this endpoint; create it or fix store.uri"


def clean_env(tmp_path, credentials: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        AWS_CONFIG_FILE=str(tmp_path / "none"),
        AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
        AWS_EC2_METADATA_DISABLED="true",
    )
    if credentials:
        env.update(FAKE_CREDENTIALS)
    return env


def write_spec(tmp_path, bucket: str, endpoint_url: str):
    (tmp_path / "model").mkdir(exist_ok=True)
    doc = {
        "name": "env",
        "model": {"base": str(tmp_path / "model")},
        "tasks": [{"id": "t", "split": "train", "prompt": "Write a.py."}],
        "store": {"uri": f"s3://{bucket}/runs", "endpoint_url": endpoint_url, "region": "us-east-1"},
    }
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def mass(env, *args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mass_jobs.commands.cli", *args], capture_output=True, text=True, env=env, timeout=300
    )


COMMANDS = {  # how each command is given the spec
    "status": lambda spec: ["status", spec],
    "run": lambda spec: ["run", spec, "--no-progress"],
    "report": lambda spec: ["report", "--spec", spec],
    "guard": lambda spec: ["guard", "--spec", spec, "--gen", "0", "--task", "t"],
}


def assert_one_line(proc, code: int, expected: str):
    assert (proc.returncode, proc.stderr.splitlines()) == (code, [expected]), proc.stderr[-3000:]


@pytest.mark.parametrize("cmd", sorted(COMMANDS))
def test_missing_credentials(cmd, s3_server, tmp_path):
    spec = write_spec(tmp_path, s3_server["bucket"], s3_server["endpoint_url"])
    proc = mass(clean_env(tmp_path, credentials=False), *COMMANDS[cmd](str(spec)))
    assert_one_line(proc, 2, NO_CREDENTIALS.format(cmd=cmd))


@pytest.mark.parametrize("cmd", sorted(COMMANDS))
def test_missing_bucket(cmd, s3_server, tmp_path):
    spec = write_spec(tmp_path, "no-such-bucket", s3_server["endpoint_url"])
    proc = mass(clean_env(tmp_path, credentials=True), *COMMANDS[cmd](str(spec)))
    assert_one_line(proc, 2, NO_BUCKET.format(cmd=cmd))


@pytest.mark.parametrize("cmd", ["status", "run"])
def test_unreachable_endpoint(cmd, tmp_path):
    url = f"http://127.0.0.1:{free_port()}"  # bound and released: nothing listens there
    spec = write_spec(tmp_path, "mass-test", url)
    proc = mass(clean_env(tmp_path, credentials=True), *COMMANDS[cmd](str(spec)))
    assert_one_line(proc, 1, UNREACHABLE.format(cmd=cmd, url=url))


def test_spec_on_s3_without_credentials(s3_server, tmp_path):
    proc = mass(clean_env(tmp_path, credentials=False), "validate", f"s3://{s3_server['bucket']}/specs/spec.yaml")
    assert_one_line(proc, 2, NO_CREDENTIALS.format(cmd="validate"))


def test_a_real_bug_keeps_its_traceback():
    from mass_jobs.commands.cli import environment_error

    assert environment_error(KeyError("x")) is None
    assert environment_error(FileNotFoundError(2, "No such file or directory", "/nowhere/x")) == (
        2,
        "No such file or directory: /nowhere/x",
    )
