"""Agent-pod outputs are ingested only as the harness signed them (mass_jobs/episodes/proof.py)."""

import json

import pytest

from mass_jobs.episodes import proof
from mass_jobs.episodes.rollouts import agent_ended, agent_result, lost_agent_status, new_inputs
from mass_jobs.run.context import RunContext

pytestmark = pytest.mark.unit  # no process, no server, no sandbox (tests/fixtures/unit.py)

KEY = proof.new_key()
ROLLOUT = "run/gen-0/collect/t/ep-0"


def signed(tmp_path, files: dict[str, bytes], key: bytes = KEY) -> bytes:
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    for name, blob in files.items():
        (out / name).write_bytes(blob)
    proof.sign_outputs(key, out, tuple(files))
    return (out / proof.PROOF).read_bytes()


def test_a_proof_holds_for_the_bytes_signed_and_for_no_others(tmp_path):
    files = {"trace.jsonl": b'{"seq": 0}\n', "status.json": b'{"outcome": "success"}', "workspace.tar.gz": b"tgz"}
    doc = signed(tmp_path, files)
    assert proof.refusal(KEY, doc, files) is None
    assert "no proof.json" in proof.refusal(KEY, None, files)
    assert "not a proof" in proof.refusal(KEY, b"[1, 2]", files)
    assert "not signed with this rollout's key" in proof.refusal(proof.new_key(), doc, files)
    assert proof.new_key() != proof.new_key() and len(KEY) == 64
    # one byte changed, one file cut off, one file the harness never wrote
    assert proof.refusal(KEY, doc, {**files, "status.json": b'{"outcome": "succesS"}'}) == (
        "uploaded status.json differ from what the harness signed"
    )
    assert "trace.jsonl" in proof.refusal(KEY, doc, {**files, "trace.jsonl": None})
    assert "checks.json" in proof.refusal(KEY, doc, {**files, "checks.json": b"{}"})
    # a forger's own proof over its own bytes needs the key
    forged = json.loads(doc)
    forged["files"]["status.json"] = proof.digests_of({"s": b'{"outcome": "succesS"}'})["s"]
    assert "not signed" in proof.refusal(
        KEY, json.dumps(forged).encode(), {**files, "status.json": b'{"outcome": "succesS"}'}
    )


class Pod:
    agent_input = RunContext.agent_input
    agent_output = RunContext.agent_output

    def __init__(self, store):
        self.store = store


@pytest.fixture
def pod(make_store):
    p = Pod(make_store("file"))
    new_inputs(p, ROLLOUT, proof.EPISODE_OUTPUTS)
    p.store.put_json(p.agent_input(ROLLOUT, "episode.json"), {"harness": "builtin"})
    p.store.put_bytes(p.agent_input(ROLLOUT, "workspace.tar.gz"), b"seeded")
    return p


def upload(pod, tmp_path, files: dict[str, bytes], key: bytes | None = None) -> None:
    doc = signed(tmp_path, files, key or pod.store.get_bytes(pod.agent_input(ROLLOUT, proof.KEY)))
    for name, blob in {**files, proof.PROOF: doc}.items():
        pod.store.put_bytes(pod.agent_output(ROLLOUT, name), blob)


def test_ingest_takes_signed_outputs_and_records_forged_ones_as_lost(pod, tmp_path):
    status = lost_agent_status("builtin", "a status of the harness")
    files = {"workspace.tar.gz": b"ws", "trace.jsonl": b"", "status.json": json.dumps(status).encode()}
    upload(pod, tmp_path, files)
    got, blobs, _ = agent_result(pod, ROLLOUT, agent_ended("Succeeded"))
    assert got == status and blobs == {"workspace.tar.gz": b"ws", "trace.jsonl": b""}

    # the status replaced after signing: refused, stored as infra_error with the seeded workspace
    pod.store.put_bytes(pod.agent_output(ROLLOUT, "status.json"), json.dumps({**status, "reason": "x"}).encode())
    got, blobs, _ = agent_result(pod, ROLLOUT, agent_ended("Succeeded"))
    assert got["outcome"] == "infra_error" and "status.json differ" in got["reason"]
    assert blobs == {"workspace.tar.gz": b"seeded", "trace.jsonl": b""}
    # a set signed with another key (another rollout's) is refused too
    upload(pod, tmp_path, files, key=proof.new_key())
    assert "not signed" in agent_result(pod, ROLLOUT, True)[0]["reason"]

    # a new attempt's prepare rotates the key and drops every earlier output, the proof included
    old_key = pod.store.get_bytes(pod.agent_input(ROLLOUT, proof.KEY))
    new_inputs(pod, ROLLOUT, proof.EPISODE_OUTPUTS)
    assert pod.store.get_bytes(pod.agent_input(ROLLOUT, proof.KEY)) != old_key
    assert not pod.store.exists(pod.agent_output(ROLLOUT, proof.PROOF))


@pytest.mark.parametrize(
    "phase, lost", [("Succeeded", True), ("Failed", True), ("Error", True), ("Running", False), (None, False)]
)
def test_an_agent_step_that_is_over_left_what_it_left(phase, lost):
    """A Succeeded pod without output had its upload cut short (a sidecar can end it early): lost,
    as a Failed one's; only a step not over yet is awaited."""
    assert agent_ended(phase) is lost
