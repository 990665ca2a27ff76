"""Typed models of a task and of a workflow, documents of their own (`schemas/task.schema.json`,
`schemas/workflow.schema.json`) that a run spec holds or names."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator

from mass_jobs.config.shared import ID_PATTERN, Closed

# ---------------------------------------------------------------- workflow


class Agent(Closed):
    id: str = Field(pattern=ID_PATTERN, max_length=40, description="Agent id; the first agent is the orchestrator.")
    role: str = Field(min_length=1, description="Short role name, e.g. 'data engineer'.")
    instruction: str = Field(min_length=1, description="What this agent does.")
    contract: str = Field(
        default="",
        description="Output contract: what the agent must return (files, metrics, errors, checks).",
    )


class Hop(Closed):
    caller: str = Field(description="Agent id that makes the call.")
    callee: str = Field(description="Agent id that is called.")
    returns: str = Field(default="", description="What the callee hands back.")
    on_failure: str | None = Field(
        default=None,
        description="Agent id a failed artifact goes back to for narrowed re-work (default: nobody).",
    )


class Workflow(Closed):
    """A workflow is text appended to the task prompt: agents plus the call order (hops)."""

    agents: list[Agent] = Field(min_length=1)
    hops: list[Hop] = Field(default_factory=list, description="Ordered steps: who calls whom.")


# ---------------------------------------------------------------- task


class MetricRange(Closed):
    file: str = Field(description="Workspace-relative JSON file, e.g. results/metrics.json.")
    key: str = Field(description="Dotted path of the number inside the file, e.g. 'backtest.sharpe'.")
    min: float | None = Field(default=None, description="Inclusive lower bound.")
    max: float | None = Field(default=None, description="Inclusive upper bound.")


class CheckCommand(Closed):
    name: str = Field(pattern=ID_PATTERN)
    command: str = Field(min_length=1, description="Shell command run sandboxed in the workspace; must exit 0.")
    timeout_s: float = Field(default=120, gt=0, le=86400)


class Guards(Closed):
    """Deterministic checks beyond the paper; a failing episode is vetoed from ranking and SFT."""

    required_outputs: list[str] = Field(default_factory=list, description="Workspace-relative paths that must exist.")
    protected_paths: list[str] = Field(
        default_factory=list, description="Paths that must be byte-identical after the episode."
    )
    metrics: list[MetricRange] = Field(default_factory=list, description="Named numbers: finite and in range.")
    checks: list[CheckCommand] = Field(default_factory=list)
    train_flagged: bool = Field(
        default=False,
        description="Rank and train on episodes flagged for review (a deliverable states a number its metrics "
        "file contradicts: mass_jobs/judging/claims.py). false (the default): a flagged episode is left "
        "out of ranking and SFT, listed and counted per generation in the report.",
    )


# The phrase that opens the general rules of the paper's task texts (uv, the history log).
UPSTREAM_RULES = "Use uv for all Python workflows"


class Task(Closed):
    id: str = Field(pattern=ID_PATTERN, max_length=40)
    split: Literal["train", "test"]
    prompt: str = Field(min_length=1, description="The bare task prompt (no workflow, no directive).")
    deliverables: list[str] = Field(default_factory=list, description="Workspace-relative paths the task asks for.")
    workflow: Workflow | None = Field(default=None, description="Initial workflow; the default team when absent.")
    upstream_text: str | None = Field(
        default=None,
        min_length=1,
        description="The upstream MASS task text as written (the task, the agent-team line, the JSON agent list, "
        "the general rules after it): under search.workflow_format upstream the search rewrites its design "
        "block in place. Set by `format: upstream` task files and `mass import upstream`.",
    )
    guards: Guards = Field(default_factory=Guards)
    network: list[Annotated[str, Field(min_length=1, max_length=260)]] = Field(
        default_factory=list,
        max_length=64,
        description="Hosts this task's episodes may reach through the egress proxy besides execution.network's "
        "(`host`, `host:port`, `*.domain`): the data hosts its prompt names. Each episode's allowed set is "
        "recorded in its status.json.",
    )
    files: dict[str, str] = Field(
        default_factory=dict, description="Seed files written into every workspace (path -> text)."
    )
    expect: dict[str, str] = Field(
        default_factory=dict,
        description="Deliverable path -> its correct content, for the deterministic task score (mass_jobs.judging.grade): "
        "JSON files compare as parsed values, other files by whitespace-separated tokens.",
    )

    @field_validator("network")
    @classmethod
    def _network_hosts(cls, network):
        from mass_jobs.config.hosts import host_rule_error

        bad = [f"[{i}] {why}" for i, e in enumerate(network) if (why := host_rule_error(e)) is not None]
        if bad:
            raise ValueError("; ".join(bad))
        return network

    @property
    def judged_text(self) -> str:
        """The task as every judge reads it (ranking, the search's evaluator, the panel): the paper's
        code cuts its tasks' general rules off (uv, the history log), from the first UPSTREAM_RULES
        on, and reads the escaped line breaks its task files hold as line breaks; a prompt without
        that phrase is judged as written."""
        head, found, _ = self.prompt.partition(UPSTREAM_RULES)
        return head.replace("\\n", "\n").strip() if found else self.prompt


class TaskFile(Closed):
    file: str = Field(
        min_length=1,
        description="Path relative to the spec (or an s3:// URI) of a task file: a "
        "regular file inside the spec's folder (links resolved) unless outside_spec_folder.",
    )
    outside_spec_folder: bool = Field(
        default=False,
        description="Read `file` although it lies outside the spec's "
        "folder (an absolute path, '..', or a link out); still a regular file only.",
    )
    format: Literal["mass", "upstream"] = Field(
        default="mass",
        description="'mass': a task document (YAML/JSON); 'upstream': MASS task text with an agent list.",
    )
    id: str | None = Field(default=None, pattern=ID_PATTERN, max_length=40, description="Overrides the file's id.")
    split: Literal["train", "test"] | None = Field(default=None, description="Overrides the file's split.")
    deliverables: list[str] | None = Field(default=None, description="Overrides the file's deliverables.")
    guards: Guards | None = Field(default=None, description="Overrides the file's guards.")
    files: dict[str, str] | None = Field(default=None, description="Overrides the file's seed files (path -> text).")
