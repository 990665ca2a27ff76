"""Prometheus metrics of the generated templates (Argo's template-level `metrics.prometheus`).

Argo's workflow controller serves them on its metrics endpoint (`argo_workflows_` + the name),
emitted when a template's node completes, with `{{status}}`, `{{duration}}` (seconds) and the
node's inputs and outputs substituted. What the templates emit:

- `mass_step_duration_seconds` (histogram; step, status): every step pod, agent pod (an episode,
  a checks job) and resource step (a model served until Loaded, a trainer job until it ended;
  both include time queued for GPUs);
- `mass_episodes_total` (counter; step, outcome): each ingested episode by its recorded outcome
  (success, no_work, failed, turn_limit, loop_detected, timeout, infra_error);
- `mass_supervised_tokens` (gauge; generation): supervised tokens of the rendered SFT windows;
- `mass_win_share` (gauge; generation): L_G's win share against its baselines (L_0, L_G-1) by the
  external judges, from evaluate of G.

Every series has a `run` label (the workflow's `run` parameter, the spec's name): one controller
serves every run in the cluster, and two runs' gauges would otherwise overwrite each other. Counters
and gauges are emitted only for a node that Succeeded: a failed attempt has no outcome or value
(an empty value is a MetricsError condition on the workflow), and its retry is counted when it
succeeds, so each episode counts once. The egress proxy, a Deployment the cycle applies, has none.

`charts/mass-jobs/dashboards/mass-jobs.json` charts them (Grafana, installed with
`metrics.dashboard: true`), a run at a time.
"""

from __future__ import annotations

from hera.workflows import models as m

DURATION_BUCKETS = [10.0, 60.0, 300.0, 900.0, 3600.0, 4 * 3600.0, 24 * 3600.0]
NAMES = ("mass_step_duration_seconds", "mass_episodes_total", "mass_supervised_tokens", "mass_win_share")
GEN_LABEL = m.MetricLabel(key="generation", value="{{inputs.parameters.gen}}")
RUN_LABEL = m.MetricLabel(key="run", value="{{workflow.parameters.run}}")
SUCCEEDED = "{{status}} == Succeeded"
# A step whose output parameter (a file under the step's --outputs DIR) is a generation's gauge.
GAUGES = {
    "render": ("supervised-tokens", "mass_supervised_tokens", "Supervised tokens of the rendered SFT windows."),
    "evaluate-finish": (
        "win-share",
        "mass_win_share",
        "Win share of a generation against its baselines, by the external judges.",
    ),
}
OUTCOME = "outcome"  # the ingest steps' output parameter


def step_duration(step: str) -> m.Prometheus:
    return m.Prometheus(
        name="mass_step_duration_seconds",
        help="Duration of a step, agent pod or resource step.",
        labels=[RUN_LABEL, m.MetricLabel(key="step", value=step), m.MetricLabel(key="status", value="{{status}}")],
        histogram=m.Histogram(buckets=DURATION_BUCKETS, value="{{duration}}"),
    )


def episode_outcomes(step: str) -> m.Prometheus:
    return m.Prometheus(
        name="mass_episodes_total",
        help="Episodes ingested, by their recorded outcome.",
        labels=[
            RUN_LABEL,
            m.MetricLabel(key="step", value=step),
            m.MetricLabel(key="outcome", value="{{outputs.parameters.%s}}" % OUTCOME),
        ],
        counter=m.Counter(value="1"),
        when=SUCCEEDED,
    )


def generation_gauge(step: str, with_gen: bool = True) -> m.Prometheus | None:
    if step not in GAUGES:
        return None
    param, name, help_text = GAUGES[step]
    return m.Prometheus(
        name=name,
        help=help_text,
        labels=[RUN_LABEL, *([GEN_LABEL] if with_gen else [])],
        gauge=m.Gauge(value="{{outputs.parameters.%s}}" % param, realtime=False),
        when=SUCCEEDED,
    )


def metrics(*entries: m.Prometheus | None) -> m.Metrics:
    return m.Metrics(prometheus=[e for e in entries if e is not None])
