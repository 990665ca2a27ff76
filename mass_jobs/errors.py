"""Errors the CLI turns into exit codes: SpecError (mass_jobs.spec) -> 2, StepFailed -> 1."""


class StepFailed(RuntimeError):
    """A step could not do its work for a reason one line explains; `mass` prints it and exits 1."""
