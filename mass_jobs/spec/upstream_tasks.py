"""Upstream MASS task directories -> native task files (YAML, `schemas/task.schema.json`).

    mass import upstream UPSTREAM_TASKS_DIR --out examples/tasks/upstream

An upstream task directory holds `splits.json` (`designated_train`, `test`, and the file patterns
`task_prompt_pattern` / `initial_workflow_pattern`), the bare prompts (`bare/query<id>.txt`) and
the task-plus-agent-list files (`initial/query<id>_ourTeam.txt`). Each task becomes one native
file: id from the bare prompt's name, split from splits.json, the bare prompt (upstream's own,
else the text around the agent list), the agent list as the initial workflow, and the task text as
written (`upstream_text`, for `search.workflow_format: upstream`), the hosts its URLs name, and the
deliverables its "Deliverables:" list names (each a required output). What the upstream format
does not hold (seed files, metrics' ranges, check commands) and what could not be derived is listed
in each written file's opening comment, for a person.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from mass_jobs.spec.load import SpecError, SpecIssue
from mass_jobs.spec.upstream_format import WorkflowError, import_upstream

WHAT = "upstream task directory"
DEFAULT_PATTERNS = {
    "task_prompt_pattern": "bare/query{task_id}.txt",
    "initial_workflow_pattern": "initial/query{task_id}_ourTeam.txt",
}


def task_id(name: str) -> str:
    """A file stem as a task id (DNS-label shaped: lower case, digits, dashes)."""
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9]+", "-", name.lower())).strip("-")[:40] or "task"


def convert(src: Path) -> tuple[list[dict], list[str]]:
    """(task documents in splits.json order, notes) of the upstream task directory `src`;
    SpecError naming every file or key that is missing or malformed."""

    src = Path(src)
    where = str(src / "splits.json")
    splits, issues = read_splits(src), []
    patterns = {k: splits.get(k, v) for k, v in DEFAULT_PATTERNS.items()}
    docs = []
    for split, key in (("train", "designated_train"), ("test", "test")):
        for i, tid in enumerate(splits[key]):
            initial = src / patterns["initial_workflow_pattern"].format(task_id=tid)
            bare = src / patterns["task_prompt_pattern"].format(task_id=tid)
            try:
                text = initial.read_text()
                prompt, workflow = import_upstream(text)
            except OSError as exc:
                issues.append(SpecIssue(f"$.{key}[{i}]", f"expected the file {initial} ({exc.__class__.__name__})"))
                continue
            except WorkflowError as exc:
                issues.append(SpecIssue(f"$.{key}[{i}]", f"{initial}: {exc}"))
                continue
            if bare.is_file():
                prompt = bare.read_text().strip()
            hosts = named_hosts(text + "\n" + prompt)
            files, review = derived_outputs(prompt)
            docs.append(
                {
                    "id": task_id(bare.stem),
                    "split": split,
                    "prompt": prompt,
                    **({"deliverables": files, "guards": {"required_outputs": files}} if files else {}),
                    **({"network": hosts} if hosts else {}),  # the data hosts its prompt names
                    "workflow": workflow.model_dump(mode="json", exclude_defaults=True),
                    "upstream_text": text,
                    REVIEW: [f"imported from {initial}", *review],
                }
            )
    if issues:
        raise SpecError(where, issues, what=WHAT)
    return docs, unimported(src, splits)


def read_splits(src: Path) -> dict:
    """splits.json of an upstream task directory; SpecError naming what is missing or malformed."""
    where = str(src / "splits.json")
    try:
        splits = json.loads((src / "splits.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise SpecError(
            where, [SpecIssue("$", f"expected an upstream splits.json ({exc.__class__.__name__}: {exc})")], what=WHAT
        ) from None
    if not isinstance(splits, dict):
        raise SpecError(where, [SpecIssue("$", "expected an object")], what=WHAT)
    issues = [
        SpecIssue(f"$.{k}", "expected a list of task ids")
        for k in ("designated_train", "test")
        if not isinstance(splits.get(k), list)
    ]
    if issues:
        raise SpecError(where, issues, what=WHAT)
    return splits


def unimported(src: Path, splits: dict) -> list[str]:
    """Notes on what upstream's directory has that the spec expresses otherwise."""
    notes = []
    if (src / "teacher_directive.txt").is_file():
        notes.append(
            "upstream's teacher_directive.txt is not imported: the teacher prompt uses the spec's "
            "collection.directive, whose default (null) is the built-in wording of the same seven "
            "requirements for the run's harness; to use upstream's text, set collection.directive to it"
        )
    excluded = splits.get("excluded_from_teacher_collection") or {}
    if excluded:
        notes.append(
            f"upstream excluded {sorted(excluded)} from teacher collection; the spec has no such "
            "per-task switch (collection.require_beats_reference decides per run)"
        )
    return notes


# A deliverable: a workspace path with an extension, not part of a URL.
_PATH = re.compile(r"(?<![\w/.:-])((?:[\w-]+/)*[\w-]+(?:\.[\w-]+)*\.[A-Za-z][A-Za-z0-9]{0,7})(?![\w/-])")
_ITEM = re.compile(r"^\s*(?:\d+[.)]|[-*\u2022])\s*(.+)$")
REVIEW = "_review"  # what a person must still decide about a written task: its file's opening comment


def derived_outputs(prompt: str) -> tuple[list[str], list[str]]:
    """(deliverables, what a person must review) of an upstream prompt: the paper's tasks list their
    outputs under a "Deliverables:" line, one numbered item each; the item's path is the
    deliverable (and a required output). An item without a path, or a prompt without that list,
    is left to a person, as are metrics' ranges and check commands, which no prompt states."""
    from mass_jobs.config.task_spec import UPSTREAM_RULES

    text = prompt.partition(UPSTREAM_RULES)[0].replace("\\n", "\n")
    text = re.sub(r"https?://\S+", " ", text)
    head, found, rest = text.partition("Deliverables:")
    if not found:
        return [], [
            "deliverables: the prompt has no 'Deliverables:' list; add its output files, and guards "
            "that check them, by hand"
        ]
    files, review = [], []
    for line in rest.splitlines():
        item = _ITEM.match(line)
        if item is None:
            if line.strip() and (files or review):
                break  # the list ended
            continue
        paths = [p for p in _PATH.findall(item.group(1)) if not p.replace(".", "").isdigit()]
        if paths:
            files += [p for p in paths if p not in files]
        else:
            review.append(f"deliverables: item {item.group(1).strip()[:80]!r} names no file: add its path by hand")
    review.append(
        "guards: every listed deliverable is a required output; metrics' ranges and check commands "
        "are not in the prompt: add them by hand"
    )
    return files, review


def named_hosts(text: str) -> list[str]:
    """The hosts of the http(s) URLs a task's text names, in order, each once (`host` or `host:port`):
    what its episodes must reach for the data the prompt points at."""
    import re

    from mass_jobs.config.hosts import host_rule_error

    out: list[str] = []
    for url in re.findall(r"https?://[^\s\"'<>()\[\]{}`,;]+", text):
        host = url.split("://", 1)[1].split("/", 1)[0].split("?", 1)[0].split("#", 1)[0].rsplit("@", 1)[-1].lower()
        host = host.rstrip(".:")
        if host and host not in out and host_rule_error(host) is None:
            out.append(host)
    return out


def write(docs: list[dict], out: Path) -> list[Path]:
    import yaml

    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for doc in docs:
        doc = dict(doc)
        notes = doc.pop(REVIEW, [])
        head = "".join(f"# {n}\n" for n in (notes[:1] + [f"to review: {n}" for n in notes[1:]]))
        path = out / f"{doc['id']}.yaml"
        path.write_text(head + yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=100))
        paths.append(path)
    return paths


def overlay(paths: list[Path], spec: Path) -> dict:
    """The spec overlay that runs `paths` as the spec's tasks (`mass run SPEC --overlay ...`): each
    file relative to the spec's folder, or by its absolute path where it lies outside it."""
    folder = Path(spec).resolve().parent
    tasks = []
    for p in paths:
        p = Path(p).resolve()
        inside = p.is_relative_to(folder)
        tasks.append(
            {
                "file": str(p.relative_to(folder)) if inside else str(p),
                **({} if inside else {"outside_spec_folder": True}),
            }
        )
    return {"tasks": tasks}
