"""`mass validate` catches what would fail later: every model location (base, tokenizer, local
judges) is an existing directory, an s3:// URI or a hub id said to be one; relative paths resolve
against the spec's folder, from any working directory; errors of every stage come in one list."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from mass_jobs.spec.load import load_spec, validate_document
from mass_jobs.spec.locations import absolute_paths, store_in_folder

ROOT = Path(__file__).resolve().parent.parent


def write(folder: Path, **model) -> Path:
    doc = {
        "name": "loc",
        "model": model,
        "tasks": [{"id": "t", "split": "train", "prompt": "Write a.py."}],
        "store": {"uri": "file://runs"},
    }
    (folder / "spec.yaml").write_text(yaml.safe_dump(doc))
    return folder / "spec.yaml"


def validate(spec: Path, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mass_jobs.commands.cli", "validate", str(spec)], cwd=cwd, capture_output=True, text=True
    )


def test_mistyped_model_dir_is_an_error_naming_field_and_path(tmp_path):
    (tmp_path / "build" / "tiny-warm").mkdir(parents=True)
    spec = write(tmp_path, base="build/tiny-wram")
    proc = validate(spec, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.splitlines() == [
        f"{spec}: invalid run spec, 1 error(s):",
        f"  $.model.base: expected a model directory, found none at '{tmp_path / 'build/tiny-wram'}' "
        f"('{tmp_path / 'build'}' exists, so this is a path, not a hub id)",
    ]


def test_dot_paths_tokenizer_and_local_judges_are_checked(tmp_path):
    (tmp_path / "model").mkdir()
    doc = {
        "name": "loc",
        "model": {"base": "./model", "tokenizer": "./tok"},
        "tasks": [{"id": "t", "split": "train", "prompt": "Write a.py."}],
        "store": {"uri": "file://runs"},
        "judges": [
            {"name": "here", "endpoint": "local", "model": "/nowhere/judge"},
            {"name": "there", "endpoint": "http://127.0.0.1:1/v1", "model": "/not/checked"},
        ],
    }
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(doc))
    proc = validate(tmp_path / "spec.yaml", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-3000:]
    expected = "expected a model directory, an s3:// URI or a hub id 'org/name', found nothing at"
    assert proc.stderr.splitlines()[1:] == [
        f"  $.judges[0].model: {expected} '/nowhere/judge'",
        f"  $.model.tokenizer: {expected} '{tmp_path / 'tok'}'",
    ]


def test_hub_ids_and_s3_are_named_as_such(tmp_path):
    spec = write(tmp_path, base="Qwen/Qwen3-0.6B", tokenizer="s3://bucket/tok")
    proc = validate(spec, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[:2] == [
        "note: $.model.base: 'Qwen/Qwen3-0.6B' is not a directory; would be fetched from the Hub",
        "note: $.model.tokenizer: s3://bucket/tok: fetched from S3 (not checked here)",
    ]
    bad = write(tmp_path, base="s3://bucket-only")
    assert "$.model.base: expected s3://bucket/key, found 's3://bucket-only'" in validate(bad, cwd=tmp_path).stderr


def test_relative_paths_resolve_against_the_spec_folder_from_any_directory(tmp_path):
    folder = tmp_path / "project"
    (folder / "models" / "m").mkdir(parents=True)
    spec = write(folder, base="models/m")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    ran = validate(spec, cwd=elsewhere)
    assert ran.returncode == 0, ran.stderr[-3000:]
    loaded = load_spec(spec)
    assert loaded.model.base == str(folder / "models" / "m")
    assert loaded.store.uri == f"file://{folder / 'runs'}"


def test_the_examples_point_at_the_repository_model_dirs():
    doc = yaml.safe_load((ROOT / "examples" / "tiny.yaml").read_text())
    resolved = absolute_paths(doc, ROOT / "examples")
    assert resolved["model"]["base"] == str(ROOT / "models" / "tiny-warm")
    assert resolved["judges"][0]["model"] == str(ROOT / "models" / "tiny-warm")
    spec = validate_document({**doc, "model": {"base": "Qwen/Qwen3-0.6B"}, "judges": []})
    assert store_in_folder(spec, ROOT / "examples").store.uri == f"file://{ROOT / 'runs'}"


def test_errors_of_every_stage_come_in_one_list(tmp_path):
    """A type error, an unknown key, a model path and a cross-field rule: all four reported."""
    doc = {
        "name": "all",
        "model": {"base": "./missing"},
        "generations": "two",
        "colour": 1,
        "tasks": [{"id": "t", "split": "train", "prompt": "Write a.py."}],
        "sft": {"window": 128, "context": 256},
        "store": {"uri": "file://runs"},
    }
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(doc))
    proc = validate(tmp_path / "spec.yaml", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert [line.split(":")[0].strip() for line in proc.stderr.splitlines()[1:]] == [
        "$.colour",
        "$.generations",
        "$.model.base",
        "$.sft.context",
    ]
    assert "  $.sft.context: expected < window (128), found 256" in proc.stderr.splitlines()


def test_a_cross_field_issue_in_an_object_with_a_bad_value_is_not_made_up(tmp_path):
    """collection.episodes is invalid: its default (18) must not produce a cross-field complaint."""
    doc = {
        "name": "x",
        "model": {"base": "Qwen/Qwen3-0.6B"},
        "tasks": [{"id": "t", "split": "train", "prompt": "p"}],
        "collection": {"episodes": "many", "train_ranks": 4, "validation_rank": 5},
        "store": {"uri": "file://r"},
    }
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(doc))
    lines = validate(tmp_path / "spec.yaml", cwd=tmp_path).stderr.splitlines()
    assert [line.split(":")[0].strip() for line in lines[1:]] == ["$.collection.episodes"]


def test_a_path_taken_for_a_hub_id_fails_naming_the_location(tmp_path):
    """At run time (here `mass serve`, offline as in tests), a missing dir that looks like a hub id
    fails in one line naming the location and the directory looked for, exit 2."""
    import os

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    proc = subprocess.run(
        [sys.executable, "-m", "mass_jobs.commands.cli", "serve", "--model", "build/tiny-wram"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    [line] = proc.stderr.splitlines()
    assert line.startswith(
        f"mass serve --model: model location 'build/tiny-wram': no such directory "
        f"({tmp_path / 'build/tiny-wram'}), so it was taken for a hub id, and fetching it from "
        "the Hugging Face Hub failed: "
    )


def test_an_s3_spec_whose_task_file_was_not_uploaded_names_it(s3_server, s3_env, monkeypatch, capsys):
    """A spec uploaded without its tasks: exit 2 naming the task file, no traceback."""
    import boto3

    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server["endpoint_url"])
    client = boto3.client("s3", endpoint_url=s3_server["endpoint_url"], region_name=s3_server["region"])
    bucket = s3_server["bucket"]
    client.put_object(
        Bucket=bucket,
        Key="specs/up.yaml",
        Body=yaml.safe_dump(
            {
                "name": "up",
                "model": {"base": "org/model"},
                "tasks": [{"file": "tasks/a.yaml"}],
                "store": {"uri": f"s3://{bucket}/runs"},
            }
        ).encode(),
    )
    from mass_jobs.commands.cli import main

    assert main(["validate", f"s3://{bucket}/specs/up.yaml"]) == 2
    err = capsys.readouterr().err
    assert "$.tasks[0].file: expected a readable task file, found 'tasks/a.yaml' (MissingKey)" in err
