"""Every name Kubernetes derives from a run fits its limit at the largest run the schema allows.

The run name is at most 36 characters (schemas/run-spec.schema.json), generations at most 50 and
trainer replicas at most 1,024: at those bounds the training operator's replica Services
(`mass-<run>-g50-train-worker-1022`), the InferenceService's predictor Service and its `app` label
all stay within 63 characters, and a 37-character name would break one of them. The executor's
operator webhook refuses a job whose replica Services would not fit (the real operator cannot
create them, and the job hangs).
"""

from __future__ import annotations

import pytest

from mass_jobs.config.run_spec import RunSpec
from mass_jobs.k8s.schemas import webhook_errors
from mass_jobs.k8s.serving import isvc_name, predictor_names
from mass_jobs.k8s.settings import ClusterSettings
from mass_jobs.k8s.training import job_name, pytorch_job, replica_names
from mass_jobs.pipeline.table import trainer_step

pytestmark = pytest.mark.unit  # no process, no server, no sandbox (tests/fixtures/unit.py)

LIMIT = 63
FIELDS = RunSpec.model_json_schema()["properties"]


def bounds() -> tuple[int, int, int]:
    from mass_jobs.config.run_spec import SftSpec

    sft = SftSpec.model_json_schema()["properties"]
    return FIELDS["name"]["maxLength"], FIELDS["generations"]["maximum"], sft["replicas"]["maximum"]


def derived(run: str, generations: int, replicas: int) -> list[str]:
    """Every name a run creates whose length Kubernetes bounds: per generation the trainer job and
    its replicas' pods/Services, the InferenceService (L0..L_N) and what KServe names after it."""
    out = []
    trainer = trainer_step().name
    for g in range(generations + 1):
        isvc = isvc_name(run, str(g))
        out += [isvc, *predictor_names(isvc)]
        if g < generations:
            job = job_name(run, str(g), trainer)
            out += [job, *replica_names(job, replicas - 1)]
    return out


def test_the_longest_run_fits_every_derived_name():
    longest, generations, replicas = bounds()
    assert (longest, generations, replicas) == (36, 50, 1024)
    names = derived("r" * longest, generations, replicas)
    too_long = [n for n in names if len(n) > LIMIT]
    assert not too_long, too_long
    assert max(len(n) for n in names) == LIMIT  # tight: one more character breaks a name
    assert [n for n in derived("r" * (longest + 1), generations, replicas) if len(n) > LIMIT]


@pytest.mark.parametrize("length", [1, 20, 36])
@pytest.mark.parametrize("generations,replicas", [(1, 1), (2, 3), (50, 1024)])
def test_names_fit_across_the_schema(length, generations, replicas):
    assert max(len(n) for n in derived("a" * length, generations, replicas)) <= LIMIT


def test_the_operator_webhook_refuses_a_job_whose_services_would_not_fit():
    s = ClusterSettings()
    ok = pytorch_job(s, job_name("r" * 36, "50", "train"), ["train"], {}, workers=1023, nproc="1", gpus="0")
    assert webhook_errors(ok) == []
    long = pytorch_job(s, job_name("r" * 40, "10", "train"), ["train"], {}, workers=1, nproc="1", gpus="0")
    assert webhook_errors(long) == [
        f"PyTorchJob/mass-{'r' * 40}-g10-train: the operator's Service mass-{'r' * 40}-g10-train-master-0 would be "
        "longer than 63 characters (64): the job would hang",
        f"PyTorchJob/mass-{'r' * 40}-g10-train: the operator's Service mass-{'r' * 40}-g10-train-worker-0 would be "
        "longer than 63 characters (64): the job would hang",
    ]


def test_a_longer_run_name_is_refused_by_the_spec(tmp_path):
    from mass_jobs.spec.load import SpecError, validate_document

    doc = {
        "name": "r" * 37,
        "model": {"base": "Qwen/Qwen3-4B"},
        "store": {"uri": f"file://{tmp_path}"},
        "tasks": [{"id": "a", "split": "train", "prompt": "p"}, {"id": "b", "split": "test", "prompt": "p"}],
    }
    with pytest.raises(SpecError, match=r"\$\.name: expected a string of at most 36 characters"):
        validate_document(doc)


def test_the_charts_scheduled_run_name_has_the_specs_bound():
    import json

    from tests.fixtures.k8s import CHART

    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["properties"]["cron"]["properties"]["run"]["maxLength"] == FIELDS["name"]["maxLength"]
