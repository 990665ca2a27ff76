"""The rules across fields of a typed run spec (after the schema and the models accepted it):
serving, composition and workflow references, each broken rule an issue naming its field."""

from __future__ import annotations

from pathlib import Path

from mass_jobs.config.composition import composition_of
from mass_jobs.config.run_spec import RunSpec
from mass_jobs.config.task_spec import Task, Workflow
from mass_jobs.serving.roles import ROLES
from mass_jobs.spec.issues import SpecIssue, found_text
from mass_jobs.spec.upstream_format import DESIGN_END, UPSTREAM_MARKER

# ---------------------------------------------------------------- cross-field rules


def cross_field_issues(spec: RunSpec) -> list[SpecIssue]:
    out: list[SpecIssue] = []
    embedder = spec.evaluation.embedder
    try:
        model_dir = embedder in ("hash", "minilm") or (Path(embedder) / "config.json").is_file()
    except OSError:  # a name too long for a path: no model dir
        model_dir = False
    if not model_dir:
        out.append(
            SpecIssue(
                "$.evaluation.embedder",
                f"expected 'hash', 'minilm' or a model dir with config.json, found {found_text(embedder)}",
            )
        )
    c = spec.collection
    if c.validation_rank != c.train_ranks + 1:
        out.append(
            SpecIssue(
                "$.collection.validation_rank",
                f"expected train_ranks + 1 = {c.train_ranks + 1}, found {c.validation_rank}",
            )
        )
    if c.episodes < c.validation_rank:
        out.append(
            SpecIssue("$.collection.episodes", f"expected >= validation_rank ({c.validation_rank}), found {c.episodes}")
        )
    if spec.execution.startup_context != "off" and spec.execution.harness != "qwen-code":
        out.append(
            SpecIssue(
                "$.execution.startup_context",
                f"expected 'off' with harness {spec.execution.harness!r} "
                "(the startup view is qwen-code's), found " + repr(spec.execution.startup_context),
            )
        )
    if c.teacher == "single" and spec.execution.harness != "builtin":
        out.append(
            SpecIssue(
                "$.collection.teacher",
                f"expected 'team' with harness {spec.execution.harness!r} "
                "('single' runs on the builtin harness), found 'single'",
            )
        )
    r = spec.ranking
    if r.pairing == "reference" and r.comparisons_per_episode > c.episodes - 1:
        out.append(
            SpecIssue(
                "$.ranking.comparisons_per_episode",
                f"expected <= episodes - 1 ({c.episodes - 1}), found {r.comparisons_per_episode}",
            )
        )

    tasks = spec.resolved_tasks()
    seen: dict[str, int] = {}
    for i, t in enumerate(tasks):
        if t.id in seen:
            out.append(
                SpecIssue(
                    f"$.tasks[{i}].id",
                    f"expected a unique task id, found {t.id!r} again (first at $.tasks[{seen[t.id]}])",
                )
            )
        seen.setdefault(t.id, i)
    train_prompts = {t.prompt.strip(): t.id for t in tasks if t.split == "train"}
    for i, t in enumerate(tasks):
        if t.split == "test" and t.prompt.strip() in train_prompts:
            out.append(
                SpecIssue(
                    f"$.tasks[{i}].prompt",
                    f"expected train/test disjoint, found the same prompt as "
                    f"train task {train_prompts[t.prompt.strip()]!r}",
                )
            )
    if not any(t.split == "train" for t in tasks):
        out.append(SpecIssue("$.tasks", "expected at least one task with split 'train', found none"))
    for i, t in enumerate(tasks):
        if t.workflow is not None:
            out.extend(workflow_issues(t.workflow, f"$.tasks[{i}].workflow"))
    for i, t in enumerate(tasks):
        out.extend(workspace_path_issues(t, f"$.tasks[{i}]"))
    if spec.search.workflow_format == "upstream":
        for i, t in enumerate(tasks):
            text = t.upstream_text
            if text is not None and not 0 <= text.find(UPSTREAM_MARKER) < text.rfind(DESIGN_END):
                out.append(
                    SpecIssue(
                        f"$.tasks[{i}].upstream_text",
                        f"expected the line {UPSTREAM_MARKER!r}, then "
                        f"the agent list, then the rules opening {DESIGN_END!r} (search.workflow_format: "
                        "upstream rewrites the block between them), found no such block",
                    )
                )

    s = spec.sft
    if s.context >= s.window:
        out.append(SpecIssue("$.sft.context", f"expected < window ({s.window}), found {s.context}"))
    if s.fp8_reference and not s.fp8_export:
        out.append(
            SpecIssue(
                "$.sft.fp8_reference",
                f"expected sft.fp8_export: true to use a reference, found {s.fp8_reference!r} with no FP8 export",
            )
        )
    out.extend(composition_issues(spec))
    m = spec.model.sampling
    if m.max_output_tokens > m.context_length:
        out.append(
            SpecIssue(
                "$.model.sampling.max_output_tokens",
                f"expected <= context_length ({m.context_length}), found {m.max_output_tokens}",
            )
        )
    if spec.execution.mode == "argo" and not spec.store.uri.startswith("s3://"):
        out.append(
            SpecIssue("$.store.uri", f"expected an s3:// URI when execution.mode is 'argo', found {spec.store.uri!r}")
        )
    names: set[str] = set()
    for i, j in enumerate(spec.judges):
        if j.name in names:
            out.append(SpecIssue(f"$.judges[{i}].name", f"expected a unique judge name, found {j.name!r} again"))
        names.add(j.name)
    return out + serving_issues(spec)


def vllm_serves(spec: RunSpec) -> bool:
    """vLLM serves the run's generations: every cluster run (KServe's runtime) and local `serving: vllm`."""
    return spec.execution.mode == "argo" or spec.execution.serving == "vllm"


def serving_issues(spec: RunSpec) -> list[SpecIssue]:
    """execution.serving needs what it serves with: vLLM installed here (local runs only: Argo runs
    serve with KServe), or for `external` an endpoint for every role."""

    ex, out = spec.execution, []
    if ex.serving == "vllm" and ex.mode == "local":
        from mass_jobs.serving.backends import vllm_missing_reason

        if reason := vllm_missing_reason():
            out.append(SpecIssue("$.execution.serving", reason))
    if ex.serving == "external":
        for role in ROLES:
            if getattr(spec.roles, role) is None:
                out.append(
                    SpecIssue(
                        f"$.roles.{role}",
                        "expected an endpoint (roles.<role>: endpoint, model) "
                        "when execution.serving is 'external', found none",
                    )
                )
    if ex.continuous_batching and ex.serving != "embedded":
        out.append(
            SpecIssue(
                "$.execution.continuous_batching",
                f"expected false unless execution.serving is 'embedded', found true with {ex.serving!r}",
            )
        )
    if vllm_serves(spec):
        from mass_jobs.serving.tool_parsers import family_format, parser_issue

        if why := parser_issue(ex.vllm.tool_call_parser, family_format(spec.model.base), repr(spec.model.base)):
            out.append(SpecIssue("$.execution.vllm.tool_call_parser", why))
    if ex.vllm.max_model_len is not None and spec.model.sampling.context_length > ex.vllm.max_model_len:
        out.append(
            SpecIssue(
                "$.model.sampling.context_length",
                f"expected at most execution.vllm.max_model_len "
                f"({ex.vllm.max_model_len}), found {spec.model.sampling.context_length}",
            )
        )
    return out


def composition_issues(spec: RunSpec) -> list[SpecIssue]:
    """A preset fixes the share and the selection; panel selection needs judges and held-out tasks."""

    out: list[SpecIssue] = []
    s = spec.sft
    if s.preset is not None:
        defaults = type(s)()
        for name in ("orchestrator_share", "checkpoint_selection"):
            if getattr(s, name) != getattr(defaults, name):  # by value: a dumped spec lists defaults too
                out.append(
                    SpecIssue(
                        f"$.sft.{name}",
                        f"expected no {name} with sft.preset {s.preset!r} (the preset "
                        f"fixes it), found {getattr(s, name)!r}",
                    )
                )
    if composition_of(s).checkpoint != "panel":
        return out
    why = f"sft.preset {s.preset!r}" if s.preset else "checkpoint_selection 'panel'"
    if s.panel is None:
        out.append(
            SpecIssue("$.sft.panel", f"expected panel settings (tasks, rollouts, checkpoints) with {why}, found none")
        )
    if not spec.judges:
        out.append(SpecIssue("$.judges", f"expected at least one judge with {why}, found none"))
    splits = {t.id: t.split for t in spec.resolved_tasks()}
    for i, t in enumerate(s.panel.tasks if s.panel else []):
        if splits.get(t) != "test":
            found = f"a {splits[t]!r} task" if t in splits else "no such task"
            out.append(
                SpecIssue(
                    f"$.sft.panel.tasks[{i}]",
                    f"expected the id of a held-out task (split 'test'), found {t!r} ({found})",
                )
            )
    return out


def workflow_issues(wf: Workflow, where: str) -> list[SpecIssue]:
    out: list[SpecIssue] = []
    ids = [a.id for a in wf.agents]
    for i, a in enumerate(ids):
        if a in ids[:i]:
            out.append(SpecIssue(f"{where}.agents[{i}].id", f"expected a unique agent id, found {a!r} again"))
    for i, h in enumerate(wf.hops):
        for key in ("caller", "callee", "on_failure"):
            value = getattr(h, key)
            if value is not None and value not in ids:
                out.append(
                    SpecIssue(f"{where}.hops[{i}].{key}", f"expected one of the agent ids {ids}, found {value!r}")
                )
    return out


MAX_PATH_BYTES = 1024


def _workspace_path_problem(path: str) -> str | None:
    if not path or "\x00" in path:
        return "expected a workspace-relative path, found an empty one or a NUL byte"
    if path.startswith(("/", "~")) or ".." in path.replace("\\", "/").split("/"):
        return f"expected a path inside the workspace (relative, no '..'), found {path!r}"
    if len(path.encode("utf-8", "surrogatepass")) > MAX_PATH_BYTES:
        return f"expected a path of at most {MAX_PATH_BYTES} bytes, found {len(path.encode('utf-8', 'surrogatepass'))}"
    return None


def workspace_path_issues(task: Task, where: str) -> list[SpecIssue]:
    """Seed files, deliverables and guarded paths must stay inside the workspace: harness, guards and
    the sandbox join them onto it, so `..` or an absolute path would reach (or seed) the host."""
    g = task.guards
    named = [(f"{where}.files.{p}", p) for p in task.files]
    named += [(f"{where}.deliverables[{k}]", p) for k, p in enumerate(task.deliverables)]
    named += [(f"{where}.expect.{p}", p) for p in task.expect]
    named += [(f"{where}.guards.required_outputs[{k}]", p) for k, p in enumerate(g.required_outputs)]
    named += [(f"{where}.guards.protected_paths[{k}]", p) for k, p in enumerate(g.protected_paths)]
    named += [(f"{where}.guards.metrics[{k}].file", m.file) for k, m in enumerate(g.metrics)]
    issues = [SpecIssue(at, problem) for at, p in named if (problem := _workspace_path_problem(p))]
    issues += [
        SpecIssue(f"{where}.expect.{p}", f"expected one of the task's deliverables {task.deliverables}, found {p!r}")
        for p in task.expect
        if p not in task.deliverables
    ]
    return issues
