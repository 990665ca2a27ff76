"""Numbers a report states against its metrics file (mass_jobs/judging/claims.py): flagged, never vetoed."""

import pytest

from mass_jobs.judging.claims import agrees, contradictions, stated
from mass_jobs.steps.guard import metric_value
from mass_jobs.config.task_spec import Guards

GUARDS = Guards(required_outputs=["report.md", "results/metrics.json"],
                metrics=[{"file": "results/metrics.json", "key": "eval.error", "min": 0, "max": 1}])


@pytest.mark.parametrize("text, found", [
    ("Final error 0.12 on the held-out set.", ["0.12"]),
    ("| error | 12% |", []),  # a table cell is not "error N"
    ("error: 12%; error = 1.5e-2", ["12%", "1.5e-2"]),
    ("**Error:** 0.3", ["0.3"]),
    ("rel_error 0.5, error_bars 2, terror 3", []),  # other words that contain the name
])
def test_what_counts_as_a_stated_value(text, found):
    assert stated(text, "eval.error") == found


@pytest.mark.parametrize("written, value, ok", [
    ("0.12", 0.1234, True), ("0.13", 0.1234, False), ("12%", 0.1234, True), ("12.3%", 0.1234, True),
    ("0.1", 0.15, True), ("0.1", 0.16, False), ("1.2e-1", 0.12, True), ("3", 3.0, True), ("3", 3.4, True),
    ("3", 4.0, False), ("-0.5", -0.5, True),
])
def test_a_value_agrees_at_the_precision_it_was_written_with(written, value, ok):
    assert agrees(written, value) is ok


def workspace(tmp_path, report: str, metrics: str):
    (tmp_path / "results").mkdir()
    (tmp_path / "report.md").write_text(report)
    (tmp_path / "results" / "metrics.json").write_text(metrics)
    return tmp_path


def test_a_report_that_contradicts_its_metrics_is_flagged(tmp_path):
    ws = workspace(tmp_path, "# Result\n\nThe controller reaches error 0.02 (see metrics).\n", '{"eval": {"error": 0.4}}')
    assert contradictions(GUARDS, ws, metric_value) == ["report.md states error 0.02, results/metrics.json holds 0.4"]


@pytest.mark.parametrize("report, metrics", [
    ("The controller reaches error 0.40.\n", '{"eval": {"error": 0.4}}'),
    ("No number is stated here.\n", '{"eval": {"error": 0.4}}'),
    ("error 0.02\n", '{"eval": {"error": "n/a"}}'),  # the metric guard vetoes that; no claim to compare
    ("error 0.02\n", "not json"),
])
def test_nothing_is_flagged_without_a_contradiction(tmp_path, report, metrics):
    assert contradictions(GUARDS, workspace(tmp_path, report, metrics), metric_value) == []
