"""Numbers a report states against its metrics file (mass_jobs/judging/claims.py): flagged, never vetoed."""

import pytest

from mass_jobs.config.task_spec import Guards
from mass_jobs.judging.claims import agrees, contradictions, stated
from mass_jobs.steps.workspace_reads import metrics_document

pytestmark = pytest.mark.unit  # no process, no server, no sandbox (tests/fixtures/unit.py)

GUARDS = Guards(
    required_outputs=["report.md", "results/metrics.json"],
    metrics=[{"file": "results/metrics.json", "key": "eval.error", "min": 0, "max": 1}],
)


@pytest.mark.parametrize(
    "text, found",
    [
        ("Final error 0.12 on the held-out set.", ["0.12"]),
        ("| error | 12% |", []),  # a table cell is not "error N"
        ("error: 12%; error = 1.5e-2", ["12%", "1.5e-2"]),
        ("**Error:** 0.3", ["0.3"]),
        ("rel_error 0.5, error_bars 2, terror 3", []),  # other words that contain the name
    ],
)
def test_what_counts_as_a_stated_value(text, found):
    assert stated(text, "eval.error") == found


@pytest.mark.parametrize(
    "written, value, ok",
    [
        ("0.12", 0.1234, True),
        ("0.13", 0.1234, False),
        ("12%", 0.1234, True),
        ("12.3%", 0.1234, True),
        ("0.1", 0.15, True),
        ("0.1", 0.16, False),
        ("1.2e-1", 0.12, True),
        ("3", 3.0, True),
        ("3", 3.4, True),
        ("3", 4.0, False),
        ("-0.5", -0.5, True),
    ],
)
def test_a_value_agrees_at_the_precision_it_was_written_with(written, value, ok):
    assert agrees(written, value) is ok


def workspace(tmp_path, report: str, metrics: str):
    (tmp_path / "results").mkdir()
    (tmp_path / "report.md").write_text(report)
    (tmp_path / "results" / "metrics.json").write_text(metrics)
    return tmp_path


def test_a_report_that_contradicts_its_metrics_is_flagged(tmp_path):
    ws = workspace(
        tmp_path, "# Result\n\nThe controller reaches error 0.02 (see metrics).\n", '{"eval": {"error": 0.4}}'
    )
    assert contradictions(GUARDS, ws, metrics_document) == [
        "report.md states error 0.02, results/metrics.json holds 0.4"
    ]


@pytest.mark.parametrize(
    "report, metrics",
    [
        ("The controller reaches error 0.40.\n", '{"eval": {"error": 0.4}}'),
        ("No number is stated here.\n", '{"eval": {"error": 0.4}}'),
        ("error 0.02\n", '{"eval": {"error": "n/a"}}'),  # the metric guard vetoes that; no claim to compare
        ("error 0.02\n", "not json"),
    ],
)
def test_nothing_is_flagged_without_a_contradiction(tmp_path, report, metrics):
    assert contradictions(GUARDS, workspace(tmp_path, report, metrics), metrics_document) == []


@pytest.mark.parametrize(
    "text, key, found",
    [
        ("success rate 1.00, mean steps 12.0", "success_rate", ["1.00"]),
        ("success rate 1.00, mean steps 12.0", "eval.mean_steps", ["12.0"]),
        ("Success-rate: 100%", "successRate", ["100%"]),
        ("**Mean_steps** = 7", "mean_steps", ["7"]),
        ("successful rates 3, mean stepsize 4", "success_rate", []),  # other words that begin with its words
    ],
)
def test_a_metric_is_found_however_the_prose_names_it(text, key, found):
    assert stated(text, key) == found


def test_a_report_whose_prose_contradicts_its_metrics_file_is_flagged_for_each_figure(tmp_path):
    """The faked success: prose claims every episode succeeded in 12 steps over a metrics file that
    says none did; the step count is no guarded metric, and is compared all the same."""
    guards = Guards(
        required_outputs=["report.md", "results/metrics.json"],
        metrics=[{"file": "results/metrics.json", "key": "success_rate", "min": 0, "max": 1}],
    )
    ws = workspace(
        tmp_path,
        "## Results\n\nsuccess rate 1.00, mean steps 12.0 over 20 episodes.\n",
        '{"success_rate": 0.0, "mean_steps": 100.0, "episodes": 20}',
    )
    assert contradictions(guards, ws, metrics_document) == [
        "report.md states success_rate 1.00, results/metrics.json holds 0",
        "report.md states mean_steps 12.0, results/metrics.json holds 100",
    ]
