"""execution.sandbox applied to this process: what bounds the model-written code a run starts here.

`mode: local` runs that code on this machine, so bubblewrap must be able to build its sandbox
(mass_jobs/sandbox/run.py), or the spec must say `execution.sandbox: none` for a machine its user
trusts. `mass validate` and `mass run` report the first case as a spec issue before anything runs;
every episode runner and guard checker applies the setting before its first episode, so a step
command started on its own refuses the same way. Under `mode: argo` the agent pods' own containers
are the boundary (`mass sandbox-serve` declares it there).
"""

from __future__ import annotations

from mass_jobs.sandbox.run import SandboxUnavailable, bwrap_refusal, declare_outer_boundary
from mass_jobs.spec.load import SpecIssue


def sandbox_issues(spec) -> list[SpecIssue]:
    """The issue (at most one) that stops this spec's model-written code from running on this machine."""
    if spec.execution.mode != "local" or spec.execution.sandbox == "none":
        return []
    refusal = bwrap_refusal()
    return [] if refusal is None else [SpecIssue("$.execution.sandbox", refusal)]


def apply_sandbox(spec) -> None:
    """Declare execution.sandbox for this process and what it starts; SandboxUnavailable when bwrap cannot
    build the sandbox and the spec asks for it (nothing model-written may run then)."""
    if spec.execution.mode != "local":
        return
    if spec.execution.sandbox == "none":
        declare_outer_boundary("none")
        return
    declare_outer_boundary(None)  # a boundary declared before (another spec, the shell) does not stand in for bwrap
    refusal = bwrap_refusal()
    if refusal is not None:
        raise SandboxUnavailable(refusal)
