"""The episode's data: what a harness is given (EpisodeInput, episode.json), what it hands back
(HarnessOutcome) and what it leaves (status.json, validated against its schema).

Below every harness and the sandbox service, so they import it and not each other; re-exported by
`mass_jobs.episodes.harness`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from mass_jobs.config.run_spec import EpisodeLimits, Sampling
from mass_jobs.config.shared import Closed
from mass_jobs.sandbox.run import resolve_in_workspace
from mass_jobs.serving.llm import Endpoint

OUTCOMES = ("success", "no_work", "failed", "turn_limit", "loop_detected", "timeout", "infra_error")
HARNESSES = ("builtin", "qwen-code")
# The episode limits (execution.limits) that end an episode, by the outcome each ends it with; the
# tool-call cap ends it "failed" with this reason (both harnesses word it so).
CAPS = ("turns_per_agent", "tool_calls", "wall_s", "loop_repeats")
TOOL_CALL_CAP = "tool-call limit of"


def episode_cap(status: dict) -> str | None:
    """Which cap of execution.limits ended the episode (CAPS), or None when none did."""
    outcome, reason = status.get("outcome"), str(status.get("reason") or "")
    if outcome == "failed" and reason.startswith(TOOL_CALL_CAP):
        return "tool_calls"
    return {"turn_limit": "turns_per_agent", "timeout": "wall_s", "loop_detected": "loop_repeats"}.get(outcome)


def no_work_reason(lead: str, failed: int = 0, killed: tuple[str, ...] = ()) -> str:
    """Why a finished episode is `no_work`: no agent made a workspace tool call (file, shell) that ran;
    delegating, finishing and calls answered with an error do not count. Such an episode is not
    ranked or trained on by default: a prose reply cut at the length limit is not a finished task.
    `failed` workspace calls ran and failed, `killed` of them by these limits (a shell's
    killed_reason): then the reason says so, since the limits, not the model, may be at fault."""
    if not failed:
        return f"{lead} finished, but no agent ran a workspace tool (file or shell) call"
    why = f"; {len(killed)} killed by a limit ({', '.join(sorted(set(killed)))})" if killed else ""
    return f"{lead} finished, but every workspace tool call failed: {failed} ran and failed{why}"


SCHEMA_PATH = Path(__file__).resolve().parents[2] / "schemas" / "episode-status.schema.json"


@dataclass(frozen=True)
class EpisodeRequest:
    """What a step decides about one episode; the spec and the model it calls decide the rest."""

    prompt: str
    files: dict[str, str]  # seed files: workspace-relative path -> text
    seed: int
    single_agent: bool = False  # one agent with the workers' tools and no delegation tool (builtin only)
    network: tuple[str, ...] = ()  # the task's own hosts (tasks[].network), added to execution.network's


def status_text(status: dict[str, Any]) -> str:
    """status.json's bytes as every path writes them (the harness, a lost pod's record, the store)."""
    return json.dumps(status, indent=2, sort_keys=True) + "\n"


@dataclass
class EpisodeInput:
    """Everything an episode runs with. Steps build it with `from_spec` only, so an execution setting
    reaches every episode (search, collect, evaluate, panel selection, benchmark) from one place."""

    prompt: str
    endpoint: Endpoint
    limits: EpisodeLimits = field(default_factory=EpisodeLimits)
    sampling: Sampling = field(default_factory=Sampling)
    harness: str = "builtin"
    seed: int | None = None
    files: dict[str, str] = field(default_factory=dict)  # seed files: workspace-relative path -> text
    single_agent: bool = False  # one agent with the workers' tools and no delegation tool (builtin only)
    network: tuple[str, ...] | None = None  # hosts shell commands reach through the egress proxy; None: no network
    startup_context: str = "off"  # execution.startup_context: qwen-code's startup view, "reminder" or none

    @classmethod
    def from_spec(cls, spec, endpoint: Endpoint, request: EpisodeRequest) -> EpisodeInput:
        """The episode of `request` as the spec runs it: its limits, sampling and harness, against `endpoint`;
        its network the spec's hosts and its task's (none at all when both are empty)."""
        hosts = [*([] if spec.execution.network == "off" else spec.execution.network), *request.network]
        return EpisodeInput(
            prompt=request.prompt,
            endpoint=endpoint,
            limits=spec.execution.limits,
            sampling=spec.model.sampling,
            harness=spec.execution.harness,
            seed=request.seed,
            files=dict(request.files),
            single_agent=request.single_agent,
            network=tuple(dict.fromkeys(hosts)) if hosts else None,
            startup_context=spec.execution.startup_context,
        )


@dataclass
class EpisodeResult:
    outcome: str
    reason: str
    status: dict[str, Any]  # the content of status.json
    workspace: Path
    trace_path: Path
    status_path: Path
    final_report: str = ""

    @property
    def ok(self) -> bool:
        return self.outcome == "success"


@dataclass
class HarnessOutcome:
    """What a harness hands back to `run_episode`, which adds timings and writes status.json."""

    outcome: str
    reason: str
    counts: dict[str, int]
    tokens: dict[str, int]
    network_isolated: bool
    sandbox_note: str
    final_report: str = ""
    memory_limit: str | None = None  # what held the shell commands' memory, when any ran


class EpisodeEndpointFile(Closed):
    base_url: str = Field(min_length=1, description="OpenAI-compatible API root, e.g. http://host:8000/v1.")
    model: str = Field(min_length=1)
    api_key_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")


class EpisodeFile(Closed):
    """`episode.json` of `mass episode --in DIR` (what an agent pod receives besides DIR/workspace/)."""

    prompt: str = Field(min_length=1)
    endpoint: EpisodeEndpointFile
    limits: EpisodeLimits = Field(default_factory=EpisodeLimits)
    sampling: Sampling = Field(default_factory=Sampling)
    harness: Literal["builtin", "qwen-code"] = "builtin"
    seed: int | None = None
    files: dict[str, str] = Field(default_factory=dict)
    single_agent: bool = Field(default=False, description="One agent, no delegation tool (builtin harness).")
    network: list[str] | None = Field(default=None, description="execution.network's hosts; absent: no network.")
    startup_context: Literal["off", "reminder"] = Field(default="off", description="execution.startup_context.")


def load_episode_file(path: Path) -> EpisodeInput:
    """Parse and validate episode.json; ValueError names each bad field."""
    from pydantic import ValidationError

    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: cannot read episode JSON: {exc}") from None
    try:
        return episode_input(data)
    except ValidationError as exc:
        lines = [f"$.{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()]
        raise ValueError(f"{path}: invalid episode file:\n" + "\n".join(lines)) from None


def episode_input(data: Any) -> EpisodeInput:
    """An episode.json document as an EpisodeInput (pydantic's ValidationError when it is not one)."""
    f = EpisodeFile.model_validate(data)
    return EpisodeInput(  # the pod's side: what prepare wrote with from_spec, read back
        prompt=f.prompt,
        endpoint=Endpoint(f.endpoint.base_url, f.endpoint.model, f.endpoint.api_key_env),
        limits=f.limits,
        sampling=f.sampling,
        harness=f.harness,
        seed=f.seed,
        files=dict(f.files),
        single_agent=f.single_agent,
        network=None if f.network is None else tuple(f.network),
        startup_context=f.startup_context,
    )


def episode_file_json(inp: EpisodeInput) -> dict[str, Any]:
    """The episode.json document for `inp` (what a step writes for an agent pod)."""
    ep = inp.endpoint
    return EpisodeFile(
        prompt=inp.prompt,
        endpoint=EpisodeEndpointFile(base_url=ep.base_url, model=ep.model, api_key_env=ep.api_key_env),
        limits=inp.limits,
        sampling=inp.sampling,
        harness=inp.harness,
        seed=inp.seed,
        files=inp.files,
        single_agent=inp.single_agent,
        network=None if inp.network is None else list(inp.network),
        startup_context=inp.startup_context,
    ).model_dump(
        mode="json",
        exclude={
            k
            for k, keep in (
                ("single_agent", inp.single_agent),
                ("network", inp.network),
                ("startup_context", inp.startup_context != "off"),
            )
            if not keep
        },
    )  # files without them stay as they were


@lru_cache(maxsize=1)
def status_validator():
    from jsonschema import Draft202012Validator

    schema = json.loads(SCHEMA_PATH.read_text())
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def validate_status(status: dict[str, Any]) -> None:
    """Raise ValueError naming every field of `status` that breaks the episode-status schema."""
    errors = sorted(status_validator().iter_errors(status), key=lambda e: list(e.absolute_path))
    if errors:
        lines = [f"$.{'.'.join(str(p) for p in e.absolute_path)}: {e.message}" for e in errors]
        raise ValueError("status.json does not match episode-status.schema.json:\n" + "\n".join(lines))


def seed_workspace(workspace: Path, files: dict[str, str]) -> None:

    workspace.mkdir(parents=True, exist_ok=True)
    for relpath, text in sorted(files.items()):
        path = resolve_in_workspace(workspace, relpath)  # a seed file may not escape either
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
