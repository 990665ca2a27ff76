"""Errors the CLI turns into exit codes: SpecError (mass_jobs.spec.load) -> 2, StepFailed -> 1; WorkflowError,
what a workflow document or an optimizer proposal fails with."""


class StepFailed(RuntimeError):
    """A step could not do its work for a reason one line explains; `mass` prints it and exits 1.
    `repeats`: the same spec and store fail the same way again, so a hint says what to change, not
    to rerun (`mass` adds REPEATS to the message, which a runner reads back from a step's log)."""

    repeats = False


REPEATS = "a rerun fails the same way until what this names changes"


class WorkflowError(ValueError):
    """A workflow document is invalid; `errors` lists one 'path: problem' line each."""

    def __init__(self, errors: list[str]):
        self.errors = errors
        super().__init__("invalid workflow:\n" + "\n".join(f"  - {e}" for e in errors))


class SandboxError(RuntimeError):
    """The sandbox container did not answer as it should (gone, killed, a reply out of bounds)."""
