"""Attacks on spec input: `mass validate` on hostile specs and task files.

Every input must end in exit 0 or 2 (never a traceback, never a hang) with each problem's JSON
path named; dangerous values (paths leaving the workspace, endpoints that are not URLs, absurd
budgets) are refused. The heaviest inputs (alias bombs, 50 MB, deep nesting) also run as a real
`mass validate` process, bounded by a timeout and an address-space limit.

    .venv/bin/python -m pytest -q tests/attack/test_spec_input.py
"""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mass_jobs.commands.cli import main as cli_main

mass = cli_main

REPO = Path(__file__).resolve().parents[2]
TASK = "{id: t, split: train, prompt: do it}"


def spec(
    *extra: str, name: str = "name: hostile\n", tasks: str = f"tasks: [{TASK}]\n", model: str = "model: {base: m}\n"
) -> str:
    return name + model + tasks + "store: {uri: 'file://runs'}\n" + "".join(extra)


def task_with(field: str) -> str:
    return f"tasks: [{{id: t, split: train, prompt: do it, {field}}}]\n"


def bomb_spec(fanout: int, levels: int) -> str:
    lines, prev = ["  - &a0 [x, x, x]"], "a0"
    for i in range(1, levels + 1):
        lines.append(f"  - &a{i} [{', '.join([f'*{prev}'] * fanout)}]")
        prev = f"a{i}"
    return spec("search:\n  seed: 1\n  bomb:\n" + "\n".join("  " + line for line in lines) + "\n")


def validate(tmp_path: Path, content: str | bytes, capsys) -> tuple[int, list[str], str]:
    path = tmp_path / "spec.yaml"
    (tmp_path / "m").mkdir(exist_ok=True)  # model locations are checked: the specs' model exists
    path.write_bytes(content.encode("utf-8", "surrogatepass") if isinstance(content, str) else content)
    rc = cli_main(["validate", str(path)])
    err = capsys.readouterr().err
    return rc, [line.strip() for line in err.splitlines()[1:]], err


def assert_refused(tmp_path, content, capsys, *expected: str):
    """Exit 2 and, for every expected fragment 'PATH: text', an error line starting with it."""
    rc, lines, err = validate(tmp_path, content, capsys)
    assert rc == 2, err
    assert "Traceback" not in err and "invalid run spec" in err.splitlines()[0]
    for fragment in expected:
        assert any(line.startswith(fragment) for line in lines), (fragment, lines)
    return lines


# ---------------------------------------------------------------- numbers

NUMBERS = {
    "nan-float": (
        "model: {base: m, sampling: {temperature: .nan}}",
        "$.model.sampling.temperature: expected a finite number, found nan",
    ),
    "inf-float": (
        "model: {base: m, sampling: {top_p: .inf}}",
        "$.model.sampling.top_p: expected a finite number, found inf",
    ),
    "minus-inf": ("ranking: {prior: -.inf}", "$.ranking.prior: expected a finite number, found -inf"),
    "nan-int-field": ("generations: .nan", "$.generations: expected a finite number, found nan"),
    "overflowing-float": (
        "sft: {optimizer: {lr: 1.0e+400}}",
        "$.sft.optimizer.lr: expected a finite number, found inf",
    ),
    "nan-in-list": (
        "judges: [{name: j, endpoint: local, model: m, seeds: [.nan]}]",
        "$.judges[0].seeds[0]: expected a finite number",
    ),
    "huge-int-35-digits": (
        "search: {seed: 99999999999999999999999999999999999}",
        "$.search.seed: expected an integer of at most 30 digits, found 35",
    ),
    "huge-int-5000-digits": (
        "search: {seed: " + "9" * 5000 + "}",
        "$.search.seed: expected an integer of at most 30 digits, found 5000",
    ),
    "huge-hex-int": ("search: {seed: 0x" + "f" * 4000 + "}", "$.search.seed: expected an integer of at most 30 digits"),
    "huge-int-in-bounded-field": ("generations: 100000000000000000000", "$.generations: expected a number <= 50"),
    "float-for-int-huge": ("search: {seed: 1.0e+30}", "$.search.seed: expected a number <= 4294967295"),
    "fraction-for-int": ("generations: 1.5", "$.generations: expected integer"),
    "negative-seed": ("sft: {seed: -1}", "$.sft.seed: expected a number >= 0"),
    "seed-over-32-bits": ("search: {seed: 18446744073709551616}", "$.search.seed: expected a number <= 4294967295"),
    "judge-seed-over-32-bits": (
        "judges: [{name: j, endpoint: local, model: m, seeds: [1099511627776]}]",
        "$.judges[0].seeds[0]: expected a number <= 4294967295",
    ),
}


@pytest.mark.parametrize("case", NUMBERS.values(), ids=NUMBERS.keys())
def test_numbers_the_schema_or_pydantic_cannot_take_exit_2_naming_the_path(tmp_path, capsys, case):
    extra, expected = case
    text = spec(model=extra + "\n") if extra.startswith("model:") else spec(extra + "\n")
    assert_refused(tmp_path, text, capsys, expected)


# ---------------------------------------------------------------- budgets

BUDGETS = {
    "billion-episodes": ("collection: {episodes: 1000000000}", "$.collection.episodes: expected a number <= 10000"),
    "concurrency-100000": ("execution: {concurrency: 100000}", "$.execution.concurrency: expected a number <= 1024"),
    "billion-rollouts": (
        "evaluation: {rollouts_per_task: 1000000000}",
        "$.evaluation.rollouts_per_task: expected a number <= 10000",
    ),
    "trillion-steps": ("sft: {steps: 1000000000000}", "$.sft.steps: expected a number <= 10000000"),
    "million-replicas": ("sft: {replicas: 1000000}", "$.sft.replicas: expected a number <= 1024"),
    "terabyte-memory": (
        "execution: {limits: {memory_mb: 1000000000}}",
        "$.execution.limits.memory_mb: expected a number <= 1048576",
    ),
    "century-wall": ("execution: {limits: {wall_s: 3.0e+9}}", "$.execution.limits.wall_s: expected a number <= 604800"),
    "million-tool-calls": (
        "execution: {limits: {tool_calls: 1000000}}",
        "$.execution.limits.tool_calls: expected a number <= 100000",
    ),
    "billion-retries": (
        "ranking: {verdict_retries: 1000000000}",
        "$.ranking.verdict_retries: expected a number <= 100",
    ),
    "huge-window": ("sft: {window: 100000000000}", "$.sft.window: expected a number <= 16777216"),
    "huge-bootstrap": ("evaluation: {bootstrap: 10000000000}", "$.evaluation.bootstrap: expected a number <= 1000000"),
    "thousand-gpus": (
        "execution: {resources: {trainer: {gpu: 1000}}}",
        "$.execution.resources.trainer.gpu: expected a number <= 64",
    ),
    "deep-delegation": (
        "execution: {limits: {delegation_depth: 1000}}",
        "$.execution.limits.delegation_depth: expected a number <= 16",
    ),
    "check-timeout-a-year": (None, "$.tasks[0].guards.checks[0].timeout_s: expected a number <= 86400"),
}


@pytest.mark.parametrize("case", BUDGETS.values(), ids=BUDGETS.keys())
def test_absurd_budgets_are_refused(tmp_path, capsys, case):
    extra, expected = case
    if extra is None:
        text = spec(tasks=task_with("guards: {checks: [{name: c, command: 'true', timeout_s: 31536000}]}"))
    else:
        text = spec(extra + "\n")
    assert_refused(tmp_path, text, capsys, expected)


# ---------------------------------------------------------------- paths and endpoints

PATHS = {
    "seed-file-dotdot": (
        "files: {'../escape.py': x}",
        "$.tasks[0].files.../escape.py: expected a path inside the workspace",
    ),
    "seed-file-absolute": (
        "files: {'/etc/cron.d/x': x}",
        "$.tasks[0].files./etc/cron.d/x: expected a path inside the workspace",
    ),
    "seed-file-nested-dotdot": (
        "files: {'a/../../x': x}",
        "$.tasks[0].files.a/../../x: expected a path inside the workspace",
    ),
    "seed-file-home": (
        "files: {'~/.ssh/authorized_keys': x}",
        "$.tasks[0].files.~/.ssh/authorized_keys: expected a path inside",
    ),
    "seed-file-backslash-dotdot": ("files: {'..\\\\x': x}", "$.tasks[0].files"),
    "seed-file-empty": ("files: {'': x}", "$.tasks[0].files.: expected a workspace-relative path, found an empty one"),
    "seed-file-nul": ('files: {"a\\0b": x}', "$.tasks[0].files.a"),
    "seed-file-overlong": ("files: {? '" + "a/" * 600 + "x' : x}", "$.tasks[0].files.a/a/"),
    "deliverable-absolute": (
        "deliverables: [/etc/passwd]",
        "$.tasks[0].deliverables[0]: expected a path inside the workspace",
    ),
    "deliverable-dotdot": (
        "deliverables: [ok.md, ../../out.md]",
        "$.tasks[0].deliverables[1]: expected a path inside the workspace",
    ),
    "required-output-dotdot": (
        "guards: {required_outputs: [..]}",
        "$.tasks[0].guards.required_outputs[0]: expected a path inside",
    ),
    "protected-path-outside": (
        "guards: {protected_paths: [/etc/shadow]}",
        "$.tasks[0].guards.protected_paths[0]: expected a path inside",
    ),
    "protected-path-dotdot": (
        "guards: {protected_paths: [sim/../../../host]}",
        "$.tasks[0].guards.protected_paths[0]: expected a path inside",
    ),
    "metric-file-outside": (
        "guards: {metrics: [{file: /proc/self/environ, key: a}]}",
        "$.tasks[0].guards.metrics[0].file: expected a path inside",
    ),
}


@pytest.mark.parametrize("case", PATHS.values(), ids=PATHS.keys())
def test_paths_leaving_the_workspace_are_refused(tmp_path, capsys, case):
    field, expected = case
    assert_refused(tmp_path, spec(tasks=task_with(field)), capsys, expected)


ENDPOINTS = [
    "not a url",
    "ftp://judge.example/v1",
    "http://",
    "javascript:alert(1)",
    "file:///etc/passwd",
    "localhost:8000/v1",
    "local ",
    "https://judge example/v1",
    "",
]


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_a_judge_endpoint_that_is_not_a_url_or_local_is_refused(tmp_path, capsys, endpoint):
    text = spec(f"judges: [{{name: j, endpoint: '{endpoint}', model: m}}]\n")
    assert_refused(tmp_path, text, capsys, "$.judges[0].endpoint: expected a string matching")


def test_store_endpoint_must_be_a_url(tmp_path, capsys):
    text = spec().replace("store: {uri: 'file://runs'}", "store: {uri: 'file://runs', endpoint_url: 'minio:9000'}")
    assert_refused(tmp_path, text, capsys, "$.store.endpoint_url: expected")


# ---------------------------------------------------------------- YAML structure

STRUCTURE = {
    "duplicate-top-key": (
        spec("name: other\n"),
        "$.name: expected each key once, found it again at line 5 (first at line 1)",
    ),
    "duplicate-nested-key": (spec("search: {seed: 1, seed: 2}\n"), "$.search.seed: expected each key once"),
    "duplicate-task-key": (
        spec(tasks="tasks: [{id: t, split: train, prompt: a, prompt: b}]\n"),
        "$.tasks[0].prompt: expected each key once",
    ),
    "integer-key": (spec("1: x\n"), "$: expected string keys, found '1' (int)"),
    "boolean-key": (spec("yes: x\n"), "$: expected string keys, found 'yes' (bool)"),
    "null-key": (spec("~: x\n"), "$: expected string keys"),
    "sequence-key": (spec("? [a, b]\n: x\n"), "$: expected string keys"),
    "alias-bomb-many-aliases": (bomb_spec(9, 12), "$.search.bomb"),
    "alias-bomb-few-aliases": (bomb_spec(2, 31), "$.search.bomb"),
    "recursive-alias": (spec("search: {seed: 1, loop: &l [*l]}\n"), "$.search.loop"),
    "deep-sequences": (spec("x: " + "[" * 5000 + "]" * 5000 + "\n"), "$.x[0][0]"),
    "deep-mappings": (spec("x: " + "{a: " * 3000 + "1" + "}" * 3000 + "\n"), "$.x.a.a.a"),
    "deep-block-mappings": (
        spec("x:\n" + "".join(" " * i + "a:\n" for i in range(1, 200)) + " " * 200 + "a: 1\n"),
        "$.x.a.a",
    ),
    "two-documents": (spec() + "---\nname: second\n", "$: expected valid YAML or JSON"),
    "python-object-tag": (
        spec("x: !!python/object/apply:os.system ['touch PWNED']\n"),
        "$: expected valid YAML or JSON",
    ),
    "unknown-tag": (spec("x: !vault secret\n"), "$: expected valid YAML or JSON"),
    "tab-indentation": ("name: a\n\tmodel: x\n", "$: expected valid YAML or JSON"),
    "lone-surrogate": (
        spec(tasks='tasks: [{id: t, split: train, prompt: "do \\ud800 it"}]\n'),
        "$.tasks[0].prompt: expected valid Unicode text",
    ),
    "lone-surrogate-key": (spec('"\\udc80": x\n'), "$.\\udc80: expected valid Unicode text"),
    "binary-prompt": (spec(tasks="tasks: [{id: t, split: train, prompt: !!binary aGVsbG8=}]\n"), "$.tasks[0]"),
    "set-for-list": (
        spec(tasks="tasks: [{id: t, split: train, prompt: p, deliverables: !!set {a, b}}]\n"),
        "$.tasks[0]",
    ),
    "empty-document": ("", "$: expected object"),
    "scalar-document": ("42\n", "$: expected object"),
    "list-document": ("[1, 2]\n", "$: expected object"),
}


@pytest.mark.parametrize("case", STRUCTURE.values(), ids=STRUCTURE.keys())
def test_hostile_yaml_structure_exits_2_naming_where(tmp_path, capsys, case):
    text, expected = case
    assert_refused(tmp_path, text, capsys, expected)
    assert not (tmp_path / "PWNED").exists() and not Path("PWNED").exists()


ENCODINGS = {
    "latin-1-byte": (spec().encode() + b"x: caf\xe9\n", "$: expected UTF-8 text, found byte 0xe9"),
    "utf-16": (spec().encode("utf-16"), "$: expected UTF-8 text, found byte 0xff at offset 0"),
    "raw-nul-bytes": (spec().encode() + b"x: a\x00b\n", "$: expected valid YAML or JSON"),
    "fifty-megabytes": (
        spec().encode() + b"# " + b"x" * (50 << 20) + b"\n",
        "$: expected a document of at most 4194304 bytes",
    ),
    "fifty-megabyte-prompt": (
        spec(tasks="tasks: [{id: t, split: train, prompt: '" + "p" * (50 << 20) + "'}]\n").encode(),
        "$: expected a document of at most",
    ),
}


@pytest.mark.parametrize("case", ENCODINGS.values(), ids=ENCODINGS.keys())
def test_bytes_that_are_not_a_bounded_utf8_document_exit_2(tmp_path, capsys, case):
    data, expected = case
    assert_refused(tmp_path, data, capsys, expected)


TASK_FILES = {
    "not-utf8": (
        b"id: t\nsplit: train\nprompt: caf\xe9\n",
        "$.tasks[0].file: t.yaml: expected UTF-8 text, found byte 0xe9",
    ),
    "too-large": (
        b"id: t\nsplit: train\nprompt: p\n# " + b"x" * (5 << 20),
        "$.tasks[0].file: t.yaml: expected a document of at most",
    ),
    "alias-bomb": (bomb_spec(9, 12).encode(), "$.tasks[0].file: t.yaml: expected at most 64 YAML aliases"),
    "nan": (
        b"id: t\nsplit: train\nprompt: p\nguards: {metrics: [{file: m.json, key: a, min: .nan}]}\n",
        "$.tasks[0].file: t.yaml: expected a finite number",
    ),
    "escaping-seed-file": (
        b"id: t\nsplit: train\nprompt: p\nfiles: {'../../x': y}\n",
        "$.tasks[0].files.../../x: expected a path inside",
    ),
    "duplicate-key": (
        b"id: t\nsplit: train\nprompt: p\nprompt: q\n",
        "$.tasks[0].file: t.yaml: expected each key once",
    ),
}


@pytest.mark.parametrize("case", TASK_FILES.values(), ids=TASK_FILES.keys())
def test_hostile_task_files_exit_2_naming_the_reference(tmp_path, capsys, case):
    data, expected = case
    (tmp_path / "t.yaml").write_bytes(data)
    assert_refused(tmp_path, spec(tasks="tasks: [{file: t.yaml}]\n"), capsys, expected)


def test_oversized_spec_on_s3_is_refused_before_it_is_read(make_store, capsys, monkeypatch):
    store = make_store("s3")
    monkeypatch.setenv("AWS_ENDPOINT_URL", store.endpoint_url)
    store.put_bytes("spec.yaml", spec().encode() + b"# " + b"x" * (5 << 20) + b"\n")
    got = []
    monkeypatch.setattr(type(store), "get_bytes", lambda self, key: got.append(key) or b"")
    assert cli_main(["validate", f"{store.uri}/spec.yaml"]) == 2
    assert "$: expected a document of at most 4194304 bytes, found more" in capsys.readouterr().err
    assert got == []  # one HEAD, no download


def test_dates_stay_text(tmp_path):
    from mass_jobs.spec.load import load_spec

    (tmp_path / "2026-01-02").mkdir()
    (tmp_path / "spec.yaml").write_text(spec(name="name: 2026-01-01\n", model="model: {base: 2026-01-02}\n"))
    loaded = load_spec(tmp_path / "spec.yaml")
    assert (loaded.name, Path(loaded.model.base)) == ("2026-01-01", tmp_path / "2026-01-02")


def test_merge_keys_and_small_anchors_still_work(tmp_path, capsys):
    text = spec("judges:\n  - &j {name: a, endpoint: 'http://judge:8000/v1', model: m}\n  - {<<: *j, name: b}\n")
    rc, _, err = validate(tmp_path, text, capsys)
    assert rc == 0, err


# ---------------------------------------------------------------- as a real process


def _limited():
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))  # a bomb that expanded would die here


HEAVY = {
    "alias-bomb": bomb_spec(9, 12).encode(),
    "alias-bomb-few-aliases": bomb_spec(2, 31).encode(),
    "fifty-megabytes": spec().encode() + b"# " + b"x" * (50 << 20) + b"\n",
    "deep-nesting": spec("x: " + "[" * 100_000 + "]" * 100_000 + "\n").encode(),
    "huge-integer": spec("search: {seed: " + "9" * 100_000 + "}\n").encode(),
    "not-utf8": b"\xff\xfe\xfd" * 1000,
    "recursive-alias": spec("search: {seed: 1, loop: &l [*l, *l]}\n").encode(),
}


@pytest.mark.parametrize("data", HEAVY.values(), ids=HEAVY.keys())
def test_mass_validate_process_exits_2_without_traceback(tmp_path, data):
    path = tmp_path / "spec.yaml"
    (tmp_path / "m").mkdir(exist_ok=True)  # model locations are checked: the specs' model exists
    path.write_bytes(data)
    proc = subprocess.run(
        [sys.executable, "-m", "mass_jobs.commands.cli", "validate", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=_limited,
        cwd=REPO,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and proc.stderr.startswith(f"{path}: invalid run spec, 1 error(s):")
    assert proc.stderr.splitlines()[1].strip().startswith("$")


# ---------------------------------------------------------------- every field of the paper's spec, fuzzed


def _leaves(value, path=()):
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _leaves(v, path + (k,))
    elif isinstance(value, list) and value:
        for i, v in enumerate(value):
            yield from _leaves(v, path + (i,))
    else:
        yield path


PAPER = REPO / "examples" / "paper.yaml"
LEAVES = list(_leaves(__import__("yaml").safe_load(PAPER.read_text())))
HOSTILE_VALUES = [-1, 0, 10**20, 2**63, 1.5, 1e300, -1e300, "x", "", [], {}, None, True, "../x", "/abs", "\u202e"]


@pytest.mark.parametrize("path", LEAVES, ids=[".".join(map(str, p)) for p in LEAVES])
def test_every_field_of_the_paper_spec_takes_any_value_without_a_crash(path):
    import copy

    import yaml

    from mass_jobs.spec.load import SpecError, validate_document

    base = yaml.safe_load(PAPER.read_text())
    outcomes = set()
    for value in HOSTILE_VALUES:
        doc = copy.deepcopy(base)
        cur = doc
        for p in path[:-1]:
            cur = cur[p]
        cur[path[-1]] = value
        try:
            validate_document(doc, "fuzz", read=lambda ref: (PAPER.parent / ref).read_text())
            outcomes.add("valid")
        except SpecError as err:
            assert all(i.path.startswith("$") for i in err.issues)
            outcomes.add("refused")
    assert "refused" in outcomes  # every field rejects at least some of these


# ---------------------------------------------------------------- task files: where and what they are


def _task_spec(tmp_path, ref: dict) -> Path:
    spec = tmp_path / "spec" / "run.yaml"
    spec.parent.mkdir(parents=True, exist_ok=True)
    spec.write_text(
        yaml.safe_dump(
            {
                "name": "t",
                "model": {"base": "org/model"},
                "store": {"uri": "file://runs"},
                "tasks": [ref, {"id": "b", "split": "train", "prompt": "do b"}],
            }
        )
    )
    return spec


SECRET = "root:$6$never-echoed$abc:19000:0:99999:7:::\n"


@pytest.mark.parametrize("how", ["absolute", "dotdot", "symlink"])
def test_a_task_file_outside_the_spec_folder_is_never_read(tmp_path, capsys, how):
    secret = tmp_path / "shadow"
    secret.write_text(SECRET)
    folder = tmp_path / "spec"
    folder.mkdir()
    ref = {"absolute": str(secret), "dotdot": "../shadow", "symlink": "tasks/t.yaml"}[how]
    if how == "symlink":
        (folder / "tasks").mkdir()
        (folder / "tasks" / "t.yaml").symlink_to(secret)
    spec = _task_spec(tmp_path, {"file": ref})
    assert mass(["validate", str(spec)]) == 2
    err = capsys.readouterr().err
    assert "expected a task file inside the spec's folder" in err and "never-echoed" not in err
    assert ("a link out of it" if how == "symlink" else "a path outside it") in err


def test_a_fifo_or_a_device_as_a_task_file_is_refused_without_blocking(tmp_path, capsys):
    import os

    folder = tmp_path / "spec"
    folder.mkdir()
    os.mkfifo(folder / "t.yaml")  # opening it for reading would wait for a writer forever
    (folder / "dev.yaml").symlink_to("/dev/zero")  # outside the folder: refused as that
    (folder / "d.yaml").mkdir()
    for ref, needle in (("t.yaml", "a FIFO"), ("d.yaml", "a directory"), ("dev.yaml", "a link out of it")):
        spec = _task_spec(tmp_path, {"file": ref})
        assert mass(["validate", str(spec)]) == 2
        err = capsys.readouterr().err
        assert needle in err, err
    spec = _task_spec(tmp_path, {"file": "/dev/zero", "outside_spec_folder": True})
    assert mass(["validate", str(spec)]) == 2
    assert "expected a regular task file, found '/dev/zero': a device" in capsys.readouterr().err


def test_outside_spec_folder_reads_a_regular_file_there(tmp_path, capsys):
    task = tmp_path / "shared-task.yaml"
    task.write_text(yaml.safe_dump({"id": "a", "split": "train", "prompt": "do a"}))
    spec = _task_spec(tmp_path, {"file": str(task), "outside_spec_folder": True})
    assert mass(["validate", str(spec)]) == 0, capsys.readouterr().err


def test_an_s3_spec_with_a_local_task_path_is_an_error_not_a_traceback(s3_server, s3_env, monkeypatch, capsys):
    import boto3

    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server["endpoint_url"])
    client = boto3.client("s3", endpoint_url=s3_server["endpoint_url"], region_name=s3_server["region"])
    bucket = s3_server["bucket"]
    client.put_object(
        Bucket=bucket,
        Key="specs/run.yaml",
        Body=yaml.safe_dump(
            {
                "name": "t",
                "model": {"base": "org/model"},
                "store": {"uri": f"s3://{bucket}/runs"},
                "tasks": [{"file": "/etc/passwd"}, {"file": "../x.yaml"}],
            }
        ).encode(),
    )
    assert mass(["validate", f"s3://{bucket}/specs/run.yaml"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("expected a task file relative to the spec's S3 folder") == 2


def test_an_empty_model_base_is_named_not_a_crash(tmp_path, capsys):
    spec = tmp_path / "run.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "name": "t",
                "model": {"base": ""},
                "store": {"uri": "file://runs"},
                "tasks": [{"id": "a", "split": "train", "prompt": "do a"}],
            }
        )
    )
    assert mass(["validate", str(spec)]) == 2
    err = capsys.readouterr().err
    assert "$.model.base" in err and "Traceback" not in err
