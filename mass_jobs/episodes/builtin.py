"""The built-in harness: an orchestrator that delegates to workers, all the same model.

The orchestrator gets `delegate`, `read_file`, `list_files` and `finish`; `delegate` runs a worker
conversation to completion and returns its report (its `finish` summary or last text). Workers get
file tools confined to the workspace, a sandboxed `shell`, `finish`, and `delegate` only while the
depth limit allows. Limits end the episode with a classified outcome instead of an exception:
turns per agent, tool calls per episode, delegation depth, wall time, loop detection (the same call
`loop_repeats` times in a row). Every model call carries X-Mass-Agent / X-Mass-Role / X-Mass-Parent
headers so the recording proxy can attribute it. Entry: `run_episode(..., harness="builtin")`,
i.e. `mass episode --in DIR --out DIR`.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mass_jobs.config.run_spec import EpisodeLimits, Sampling
from mass_jobs.episodes import tools as T
from mass_jobs.episodes.episode import TOOL_CALL_CAP, no_work_reason
from mass_jobs.serving.llm import Endpoint, ModelClient, ModelError, parse_tool_calls, usage_tokens

ORCHESTRATOR_SYSTEM = """You are the orchestrator of a team of agents working in a shared workspace folder.
You cannot run code or write files yourself. Split the task into self-contained assignments and give each
to a worker with the `delegate` tool; a worker starts with no context besides its assignment, so say
which files to read and which files to produce. Check returned artifacts with `read_file` / `list_files`
before relying on them. When the task is done (or cannot be done), call `finish` with a summary."""

WORKER_SYSTEM = """You are {agent_id}, a {role} in a team of agents working in a shared workspace folder.
Do your assignment with the tools: read, write and list workspace files (paths relative to the
workspace root) and run shell commands in the workspace. Check your outputs. When done, call `finish`
with a report that names the files you produced and any failure."""

SINGLE_AGENT_ID = "agent"  # the single-agent teacher: a worker-role thread with no parent, so render strips its prompt
SINGLE_SYSTEM = """You are an agent working alone in a workspace folder. Do the task with the tools: read, write and
list workspace files (paths relative to the workspace root) and run shell commands in the workspace. Check your
outputs. When the task is done (or cannot be done), call `finish` with a summary that names the files you produced."""

ID_SAFE = re.compile(r"[^a-z0-9-]+")


class EpisodeStop(Exception):
    """Ends the whole episode with a classified outcome."""

    def __init__(self, outcome: str, reason: str):
        super().__init__(reason)
        self.outcome = outcome
        self.reason = reason


@dataclass
class AgentReport:
    agent_id: str
    text: str
    ok: bool  # finished (finish tool or plain answer) and did not report failure


@dataclass
class Tally:
    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    delegations: int = 0
    agents: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    network_isolated: bool | None = None
    memory_limits: set = field(default_factory=set)  # what held each shell command's memory
    shell_calls: int = 0
    acting_calls: int = 0  # workspace tool calls that ran without error (none: the episode is no_work)
    failed_workspace_calls: int = 0  # workspace tool calls answered with an error
    killed: list = field(default_factory=list)  # the limit that killed each shell command that one did


@dataclass
class BuiltinHarness:
    """One episode's state; `run(prompt)` returns (outcome, reason, final report)."""

    endpoint: Endpoint
    workspace: Path
    limits: EpisodeLimits
    sampling: Sampling
    seed: int | None = None
    single_agent: bool = False  # one worker-role agent, no delegation tool (the single-agent teacher control)
    sandbox: Any = None  # a SandboxClient: workspace tools run in the sandbox container, not in this process
    egress: str | None = None  # the episode's egress proxy socket (execution.network); None: no network
    tally: Tally = field(default_factory=Tally)
    deadline: float = 0.0
    _worker_ids: set[str] = field(default_factory=set)

    def run(self, prompt: str) -> tuple[str, str, str]:
        self.deadline = time.monotonic() + self.limits.wall_bound_s
        try:
            if self.single_agent:
                report = self._agent(SINGLE_AGENT_ID, "worker", None, 0, SINGLE_SYSTEM, prompt)
            else:
                report = self._agent("orchestrator", "orchestrator", None, 0, ORCHESTRATOR_SYSTEM, prompt)
        except EpisodeStop as stop:
            return stop.outcome, stop.reason, ""
        lead = "agent" if self.single_agent else "orchestrator"
        if not report.ok:
            return "failed", f"{lead} reported failure: {report.text[:500]}", report.text
        if not self.tally.acting_calls:
            return (
                "no_work",
                no_work_reason(lead, self.tally.failed_workspace_calls, tuple(self.tally.killed)),
                report.text,
            )
        return "success", f"{lead} finished", report.text

    # ------------------------------------------------------------------ one agent conversation

    def _tools_for(self, role: str, depth: int) -> list[dict[str, Any]]:
        if role == "orchestrator":
            return [T.DELEGATE, T.READ_FILE, T.LIST_FILES, T.FINISH]
        specs = [T.READ_FILE, T.WRITE_FILE, T.LIST_FILES, T.SHELL, T.FINISH]
        if depth < self.limits.delegation_depth and not self.single_agent:
            specs.insert(0, T.DELEGATE)
        return specs

    def _remaining(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise EpisodeStop("timeout", f"wall time of {self.limits.wall_bound_s:g}s exceeded")
        return left

    def _agent(self, agent_id: str, role: str, parent: str | None, depth: int, system: str, task: str) -> AgentReport:
        self.tally.agents += 1
        specs = self._tools_for(role, depth)
        allowed = {T.tool_name(s) for s in specs}
        messages: list[dict[str, Any]] = [{"role": "system", "content": system}, {"role": "user", "content": task}]
        headers = {"X-Mass-Agent": agent_id, "X-Mass-Role": role}
        if parent:
            headers["X-Mass-Parent"] = parent
        last_text = ""
        last_key: tuple[str, str] | None = None
        repeats = 0
        turns = self.limits.turns_per_agent
        for _turn in range(turns) if turns is not None else itertools.count():
            msg = self._call_model(messages, specs, headers)
            calls = msg.get("tool_calls") or []
            content = msg.get("content") or ""
            if content.strip():
                last_text = content
            assistant: dict[str, Any] = {"role": "assistant", "content": content}
            if calls:
                for i, call in enumerate(calls):
                    if not call.get("id"):  # some servers omit ids; tool results must reference one
                        call["id"] = f"call_{self.tally.turns}_{i}"
                    call["type"] = call.get("type") or "function"
                assistant["tool_calls"] = calls
            messages.append(assistant)
            if not calls:
                return AgentReport(agent_id, last_text, ok=True)
            finished: AgentReport | None = None
            for call, parsed in zip(calls, parse_tool_calls(assistant)):
                name = parsed.name or ""
                key = (name, parsed.raw_arguments)
                repeats = repeats + 1 if key == last_key else 1
                last_key = key
                self.tally.tool_calls += 1
                if self.limits.loop_repeats is not None and repeats >= self.limits.loop_repeats:
                    raise EpisodeStop(
                        "loop_detected",
                        f"{agent_id} made the same call {name}({key[1][:200]}) {repeats} times in a row",
                    )
                if self.limits.tool_calls is not None and self.tally.tool_calls > self.limits.tool_calls:
                    raise EpisodeStop("failed", f"{TOOL_CALL_CAP} {self.limits.tool_calls} reached")
                result, done = self._run_tool(parsed, allowed, agent_id, role, depth)
                if result.startswith(T.ERROR_PREFIX):
                    self.tally.tool_errors += 1
                    if name in T.WORKSPACE_TOOLS:
                        self.tally.failed_workspace_calls += 1
                        if (killed := re.search(r"^killed: (\S+)", result, flags=re.M)) is not None:
                            self.tally.killed.append(killed.group(1))
                elif name in T.WORKSPACE_TOOLS:
                    self.tally.acting_calls += 1
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
                if done is not None and finished is None:
                    finished = done
            if finished is not None:
                return finished
        reason = f"{agent_id} used all {self.limits.turns_per_agent} turns without finishing"
        if role == "orchestrator":
            raise EpisodeStop("failed", reason)
        return AgentReport(agent_id, f"{reason}; last text: {last_text[:2000]}", ok=False)

    def _call_model(self, messages, specs, headers) -> dict[str, Any]:
        remaining = self._remaining()
        self.tally.turns += 1
        box: dict[str, Any] = {}

        def call() -> None:
            client = ModelClient(
                self.endpoint,
                self.sampling,
                timeout_s=min(self.limits.request_timeout_s, remaining),
                retries=self.limits.request_retries,
            )
            try:
                box["msg"] = client.chat(messages, tools=specs, seed=self.seed, headers=headers)
            except BaseException as exc:  # handed to the episode thread, which classifies it
                box["error"] = exc
            finally:
                client.close()

        # The call runs in a daemon thread so the wall-time limit holds even while retries back off;
        # a call still running at the deadline is abandoned (the proxy closes under it).
        worker = threading.Thread(target=call, name=f"model-call-{self.tally.turns}", daemon=True)
        worker.start()
        worker.join(remaining)
        if worker.is_alive():
            raise EpisodeStop("timeout", f"wall time of {self.limits.wall_bound_s:g}s exceeded in a model call")
        if "error" in box:
            exc = box["error"]
            if isinstance(exc, ModelError) and exc.kind == "timeout" and remaining < self.limits.request_timeout_s:
                # the request's timeout was what was left of the wall time: the episode ran out, not the
                # endpoint (the client's timer and the join above end together; either may be first)
                raise EpisodeStop(
                    "timeout", f"wall time of {self.limits.wall_bound_s:g}s exceeded in a model call"
                ) from exc
            if isinstance(exc, ModelError):  # the client already retried: the endpoint is broken, not the episode
                raise EpisodeStop("infra_error", f"model endpoint failed ({exc.kind}): {exc}") from exc
            raise exc
        msg = box["msg"]
        prompt, completion = usage_tokens(msg.get("usage"))  # a negative or absurd count counts 0
        self.tally.prompt_tokens += prompt
        self.tally.completion_tokens += completion
        return msg

    # ------------------------------------------------------------------ tools

    def _run_tool(self, parsed, allowed, agent_id, role, depth) -> tuple[str, AgentReport | None]:
        """(text for the model, a report when this call finishes the agent)."""
        name = parsed.name
        try:
            if not isinstance(name, str) or name not in allowed:
                raise T.ToolError(f"unknown tool {name!r}; available: {', '.join(sorted(allowed))}")
            if parsed.error:
                raise T.ToolError(parsed.error)
            args = parsed.arguments
            if name == "finish":
                summary = T.require_str(args, "summary")
                status = T.require_str(args, "status", "success")
                if status not in ("success", "failure"):
                    raise T.ToolError(f"argument 'status' must be 'success' or 'failure', got {status!r}")
                return "finished", AgentReport(agent_id, summary, ok=status == "success")
            if name == "delegate":
                return self._delegate(args, agent_id, depth), None
            if name in T.WORKSPACE_TOOLS:
                timeout = min(self.limits.shell_timeout_s, self._remaining())
                if self.sandbox is None:
                    out = T.run_workspace_tool(self.workspace, name, args, self.limits, timeout, self.egress)
                else:  # the workspace lives in the agent pod's sandbox container
                    out = self.sandbox.tool(name, args, self.limits, timeout)
                if name == "shell":
                    self.tally.shell_calls += 1
                    prev, now = self.tally.network_isolated, bool(out.network_isolated)
                    self.tally.network_isolated = now if prev is None else (prev and now)
                    self.tally.memory_limits.add(out.memory_limit or "sampled")
                return out.text, None
            raise T.ToolError(f"tool {name!r} has no implementation")
        except T.ToolError as exc:
            return f"{T.ERROR_PREFIX} {exc}", None

    def _delegate(self, args: dict[str, Any], caller: str, depth: int) -> str:
        assignment = T.require_str(args, "assignment")
        if not assignment.strip():
            raise T.ToolError("argument 'assignment' is empty")
        if depth + 1 > self.limits.delegation_depth:
            raise T.ToolError(
                f"delegation depth limit {self.limits.delegation_depth} reached: {caller} may not delegate"
            )
        role = T.require_str(args, "role", "worker").strip() or "worker"
        agent_id = self._new_worker_id(T.require_str(args, "agent_id", ""))
        self.tally.delegations += 1
        system = WORKER_SYSTEM.format(agent_id=agent_id, role=role)
        report = self._agent(agent_id, "worker", caller, depth + 1, system, assignment)
        body = json.dumps(
            {"agent_id": agent_id, "status": "success" if report.ok else "failure", "report": report.text}
        )
        return T.truncate(body if report.ok else f"{T.ERROR_PREFIX} worker did not succeed\n{body}")

    def _new_worker_id(self, requested: str) -> str:
        """A header-safe id, unique per conversation (a re-delegation to 'worker-1' becomes 'worker-1-2')."""
        base = ID_SAFE.sub("-", requested.strip().lower()).strip("-")[:40] or f"worker-{len(self._worker_ids) + 1}"
        agent_id, n = base, 1
        while agent_id in self._worker_ids or agent_id == "orchestrator":
            n += 1
            agent_id = f"{base}-{n}"
        self._worker_ids.add(agent_id)
        return agent_id
