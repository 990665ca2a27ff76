"""Search rollouts around agent pods (prepare -> `mass episode` -> ingest -> judge and save) store
what the in-process search stores, and a lost agent pod is an infra_error rollout, not a failure.

The agent pod is played here by the CLI entry it runs (`mass episode --in --out`) on the stored
input, with its outputs put where Argo uploads them; the model is the scripted judging endpoint
(a test fixture)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from mass_jobs.commands.cli import main as cli_main
from mass_jobs.episodes import proof
from mass_jobs.episodes.rollouts import RolloutError, episode_runner
from mass_jobs.run.context import RunContext
from mass_jobs.serving.llm import ModelClient
from mass_jobs.steps.search import SearchError, run_search
from mass_jobs.tools.testing.scripted_endpoint import Reply
from tests.fixtures.inner_loop import add_episodes, episode, proposal


def agent_pod(ctx: RunContext, rel: str) -> None:
    prefix, store = ctx.under_run(rel), ctx.store
    with tempfile.TemporaryDirectory() as tmp:
        inp, out = Path(tmp) / "in", Path(tmp) / "out"
        inp.mkdir()
        for name in ("episode.json", "workspace.tar.gz", proof.KEY):
            (inp / name).write_bytes(store.get_bytes(ctx.agent_input(prefix, name)))
        assert cli_main(["episode", "--in", str(inp), "--out", str(out)]) == 0
        for name in (*proof.EPISODE_OUTPUTS, proof.PROOF):  # what the pod wrote (network.jsonl only with a network)
            if (out / name).exists():
                store.put_bytes(ctx.agent_output(prefix, name), (out / name).read_bytes())


def script(ep) -> None:
    add_episodes(ep, episode(1), episode(5))  # reference, W_0
    ep.add("optimizer", Reply.text(proposal("v1")))
    add_episodes(ep, episode(7))  # W_1 beats the elite


def timeless(store, key: str):
    if key.endswith("trace.jsonl"):
        return [
            {k: v for k, v in json.loads(x).items() if k not in ("started_at", "duration_s")}
            for x in store.get_bytes(key).decode().splitlines()
        ]
    if key.endswith("status.json"):
        return {k: v for k, v in store.get_json(key).items() if k != "timings"}
    return store.get_bytes(key)


@pytest.mark.parametrize("network", ["off", ["pypi.org"]], ids=["offline", "network"])
def test_search_in_agent_pods_stores_what_the_local_search_stores(make_store, inner_spec, judging_endpoint, network):
    """With execution.network the egress proxy's records travel as the trace does: episode.json
    carries the hosts, the pod's harness writes and signs network.jsonl, ingest stores it beside the trace."""
    ep = judging_endpoint()  # one per run: its tool-call ids count up
    local, pods = make_store("file"), make_store("file")
    spec = inner_spec(local, search={"iterations": 1}, execution={"network": network})
    client = ModelClient(ep.endpoint, spec.model.sampling, timeout_s=10, retries=0)
    a = RunContext(spec, local)
    script(ep)
    run_search(a, 0, "t1", client, episode_runner(spec, ep.endpoint))

    b = RunContext(inner_spec(pods, search={"iterations": 1}, execution={"network": network}), pods)
    ep = judging_endpoint()
    client = ModelClient(ep.endpoint, spec.model.sampling, timeout_s=10, retries=0)
    script(ep)
    ran = []
    for k in (0, 1):
        items = run_search(b, 0, "t1", client, None, iteration=k, phase="prepare", endpoint=ep.endpoint)["rollouts"]
        assert [i["label"] for i in items] == (["reference", "iter-0"] if k == 0 else ["iter-1"])
        with pytest.raises(SearchError, match="is not stored"):  # never runs an episode itself
            run_search(b, 0, "t1", client, None, iteration=k)
        for item in items:
            agent_pod(b, item["rollout"])
            run_search(b, 0, "t1", None, None, phase="ingest", rollout_key=item["rollout"], agent_status="Succeeded")
            ran.append(item["rollout"])
        assert run_search(b, 0, "t1", client, None, iteration=k)["continue"] is (k == 0)
    assert ran == [b.relative(b.search_rollout(0, "t1", r)) for r in ("reference", 0, 1)]
    state_a, state_b = (c.store.get_json(c.search_state(0, "t1")) for c in (a, b))
    assert state_a == state_b and state_b["elite"] == 1 and state_b["beats_reference"]
    for r in ("reference", 0, 1):
        for name in ("prompt.txt", "workspace.tar.gz", "trace.jsonl", "status.json"):
            key = a.search_file(0, "t1", r, name)
            assert timeless(local, key) == timeless(pods, key), key
        key = a.search_file(0, "t1", r, "network.jsonl")
        assert [c.store.exists(key) for c in (a, b)] == [network != "off"] * 2, key
        if network != "off":
            assert local.get_bytes(key) == pods.get_bytes(key) == b""  # no command asked for a host
            assert local.get_json(a.search_file(0, "t1", r, "status.json"))["network"]["requests"] == 0
    for k in (0, 1):
        manifest = [c.store.get_json(f"{c.search_iter(0, 't1', k)}/_manifest.json") for c in (a, b)]
        assert manifest[0]["input_hash"] == manifest[1]["input_hash"]
        assert sorted(manifest[0]["outputs"]) == sorted(manifest[1]["outputs"])


def test_a_lost_search_agent_is_an_infra_error_rollout(make_store, inner_spec, judging_endpoint):
    ep = judging_endpoint()
    store = make_store("file")
    spec = inner_spec(store, search={"iterations": 0})
    ctx = RunContext(spec, store)
    client = ModelClient(ep.endpoint, spec.model.sampling, timeout_s=10, retries=0)
    add_episodes(ep, episode(1))  # only the reference's agent runs
    items = run_search(ctx, 0, "t1", client, None, iteration=0, phase="prepare", endpoint=ep.endpoint)["rollouts"]
    ref, it0 = (i["rollout"] for i in items)
    agent_pod(ctx, ref)
    run_search(ctx, 0, "t1", None, None, phase="ingest", rollout_key=ref)
    with pytest.raises(RolloutError, match="output is missing"):  # its step not reported over: awaited
        run_search(ctx, 0, "t1", None, None, phase="ingest", rollout_key=it0, agent_status=None)
    out = run_search(ctx, 0, "t1", None, None, phase="ingest", rollout_key=it0, agent_status="Failed")
    assert out["outcome"] == "infra_error"
    with pytest.raises(RolloutError, match="not a rollout of this step"):
        run_search(ctx, 0, "t1", None, None, phase="ingest", rollout_key="gen-0/collect/t1/ep-0")
    run_search(ctx, 0, "t1", client, None, iteration=0)
    state = store.get_json(ctx.search_state(0, "t1"))
    assert state["done"] and state["iterations"][0]["outcome"] == "infra_error"
    assert store.get_bytes(ctx.search_file(0, "t1", 0, "trace.jsonl")) == b""
