"""Where code that a model wrote runs: `run.run_sandboxed` (bubblewrap view, leased uid, tree limits)
with its launcher, uids, process-tree supervisor and memory cgroup; `lifeline` (children that die with
their parent); `check_job` and `check_site`, a task's guard checks run like agent shell calls. Knows
the spec's limits, nothing of models, stores or episodes."""
