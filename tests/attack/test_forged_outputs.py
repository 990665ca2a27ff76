"""Forged outputs: what model-written code in an agent pod's sidecar does to the records ingest
trusts, through the generated agent-episode template under the test executor (Argo's emissary
directory, the pod's network and uids modelled as upstream has them)."""

from __future__ import annotations

import io
import json
import tarfile

import pytest

from mass_jobs.episodes import proof
from mass_jobs.store import open_store
from tests.fixtures.argo_cluster import KEY, PodFiles, run_agent_episode, tempfile_dir

FORGED = "FORGED-RECORD"
# What the model's shell command tries from inside the agent pod (the sandbox container): rewrite
# the records where the harness container keeps them, find the harness's processes, leave a
# process behind, and make a model call of its own through every port listening in the pod's network
# (the proxy's and the policy's way to the model, and the way to the run's egress proxy). Each
# attempt prints what it got.
FORGING_COMMAND = r"""
echo "uid=$(id -u)"
for f in /out/trace.jsonl /out/status.json; do
  (echo '{"forged": "FORGED-RECORD"}' >> $f) 2>/dev/null && echo "WROTE $f" || echo "cannot write $f"
done
ls /out >/dev/null 2>&1 && echo "SEES /out" || echo "no /out"
for p in /proc/[0-9]*; do tr '\0' ' ' < $p/cmdline; echo; done 2>/dev/null | grep -c -- "--out /ou[t]" | sed 's/^/harness processes seen: /'
(sleep 2; echo FORGED-RECORD >> /out/trace.jsonl) >/dev/null 2>&1 &
(setsid sh -c 'while [ ! -e go ]; do sleep 0.2; done; echo late > late.txt' >/dev/null 2>&1 &)
python3 - <<'PY'
import json, urllib.request
ports = set()
for name in ("/proc/net/tcp", "/proc/net/tcp6"):
    try:
        lines = open(name).read().splitlines()[1:]
    except OSError:
        continue
    for line in lines:
        local, state = line.split()[1], line.split()[3]
        if state == "0A":
            addr, port = local.rsplit(":", 1)
            ip = ".".join(str(int(addr[i:i + 2], 16)) for i in (6, 4, 2, 0)) if len(addr) == 8 else "127.0.0.1"
            ports.add((ip, int(port, 16)))
body = json.dumps({"model": "scripted", "messages": [{"role": "user", "content": "FORGED-RECORD"}]}).encode()
got = []
for ip, port in sorted(ports):
    req = urllib.request.Request(f"http://{ip}:{port}/v1/chat/completions", data=body, method="POST",
                                 headers={"content-type": "application/json", "x-mass-agent": "forger"})
    try:
        got.append(urllib.request.urlopen(req, timeout=3).status)
    except urllib.error.HTTPError as e:
        got.append("proxy refused" if b"harness only" in e.read() else e.code)
    except Exception:
        got.append("unreachable")
print("ports:", len(ports), "calls:", sorted(set(map(str, got))) or "no port")
PY
echo done > result.txt
"""


def test_agent_pod_code_cannot_forge_the_trace_or_status(executor_for, s3_env, scripted_endpoint):
    """The generated agent-episode template (read from argo/mass-cycle.yaml, with the workflow's pod
    securityContext) run as a pod: the harness container and the sandbox sidecar as their uids.
    The worker's shell command attacks the records (FORGING_COMMAND); the artifacts Argo uploads
    are the proxy's records and the harness's status, and the workspace came back from the sandbox."""
    from mass_jobs.config.run_spec import EpisodeLimits, Sampling
    from mass_jobs.episodes.harness import EpisodeInput
    from mass_jobs.k8s.pods import SANDBOX_UID, UID
    from mass_jobs.tools.testing.scripted_endpoint import Reply

    ep = scripted_endpoint(
        {
            "orchestrator": [Reply.call("delegate", assignment="tidy the records"), Reply.text("records tidied")],
            "worker-1": [
                Reply.call("shell", command=FORGING_COMMAND),
                # a daemon left by the command above writes late.txt once `go` exists (the sandbox
                # reaps it when the command returns): none survived it
                Reply.call("shell", command="touch go; sleep 3; test -e late.txt && echo LATE-WROTE || echo no-late"),
                Reply.call("finish", summary="tidied"),
            ],
        }
    )
    inp = EpisodeInput(
        prompt="Tidy up.",
        endpoint=ep.endpoint,
        sampling=Sampling(),
        files={"notes.md": "n\n"},
        limits=EpisodeLimits(wall_s=90, request_timeout_s=20, request_retries=0, shell_timeout_s=30),
    )
    with tempfile_dir() as seed:
        wf, output = run_agent_episode(executor_for, "forge", inp, seed)
    assert wf.phase == "Succeeded", wf.summary()  # the daemon's end is checked in the episode itself (no-late)

    trace = [json.loads(x) for x in output("trace.jsonl").decode().splitlines()]
    status = json.loads(output("status.json"))
    # the proxy's records only: one per call the harness made, in order; none of the forger's
    assert [r["seq"] for r in trace] == [0, 1, 2, 3, 4]
    assert [r["agent"]["id"] for r in trace] == ["orchestrator", "worker-1", "worker-1", "worker-1", "orchestrator"]
    # (the command's own text is in the trace, as the worker's tool call; the forger's call is not)
    assert not [r for r in trace if "forged" in r or r["request"]["messages"][-1].get("content") == FORGED]
    assert status["outcome"] == "success" and FORGED not in json.dumps(status)
    assert status["counts"]["turns"] == 5 and status["counts"]["tool_calls"] == 4
    assert len([r for r in ep.requests if r["headers"].get("x-mass-agent") != "forger"]) == 5
    # what the command saw: its own uid, no /out, no harness process; nothing it wrote landed
    shell_output = [m["content"] for m in trace[2]["request"]["messages"] if m["role"] == "tool"][-1]
    assert f"uid={SANDBOX_UID}" in shell_output and SANDBOX_UID != UID, shell_output
    assert "WROTE" not in shell_output and "no /out" in shell_output and "harness processes seen: 0" in shell_output
    assert "proxy refused" in shell_output, shell_output  # it found the proxy on the pod's loopback: refused
    # the policy's way to the model answers it too (a call of its own, in no record); the third is the
    # run's egress proxy, which serves no model route (404); that is all it reached
    assert [r for r in ep.requests if r["headers"].get("x-mass-agent") == "forger"], shell_output
    assert "ports: 3 " in shell_output and "'404'" in shell_output and "unreachable" not in shell_output, shell_output
    later = [m["content"] for m in trace[3]["request"]["messages"] if m["role"] == "tool"][-1]
    assert "no-late" in later and "LATE-WROTE" not in later, later  # the sandbox reaped the daemon
    # the workspace Argo uploaded is the sandbox's, result.txt included
    with tarfile.open(fileobj=io.BytesIO(output("workspace.tar.gz")), mode="r:gz") as tar:
        names = sorted(m.name for m in tar.getmembers())
        assert tar.extractfile("result.txt").read() == b"done\n"
    assert "notes.md" in names and "result.txt" in names and "late.txt" not in names, names
    # and the harness signed exactly what Argo uploaded
    uploaded = {n: output(n) for n in proof.EPISODE_OUTPUTS if n != "network.jsonl"}  # no network: none written
    uploaded["network.jsonl"] = None
    assert proof.refusal(KEY, output(proof.PROOF), uploaded) is None


# What the sandbox can do to Argo's /var/run/argo (every container mounts it, 0777, umask 0): stage
# a forged status and trace where the emissary stages outputs, and write the main container's exit
# code, so the wait container uploads /out as it is mid-episode.
EARLY_EXIT_COMMAND = r"""
ls -ld /var/run/argo >/dev/null 2>&1 && echo "SEES /var/run/argo" || echo "no /var/run/argo"
mkdir -p /var/run/argo/outputs/artifacts/out 2>/dev/null
for f in status.json trace.jsonl; do
  (echo '{"forged": "FORGED-RECORD"}' | gzip > /var/run/argo/outputs/artifacts/out/$f.tgz) 2>/dev/null && echo "STAGED $f"
done
mkdir -p /var/run/argo/ctr/main 2>/dev/null
(echo 0 > /var/run/argo/ctr/main/exitcode) 2>/dev/null && echo "WROTE exitcode" || echo "cannot write exitcode"
sleep 2
"""


def test_a_sidecar_that_ends_the_upload_early_leaves_outputs_ingest_refuses(executor_for, s3_env, scripted_endpoint):
    """The emissary's handshake, attacked from the sandbox: its exit-code file written mid-episode
    makes the wait container upload a partial /out while the harness runs on (to a Succeeded pod).
    Ingest finds no proof, stores the episode as infra_error with the reason, and never fails the
    step; without the ended agent step counted (the switch-off) the same upload failed ingest."""
    from mass_jobs.config.run_spec import EpisodeLimits, Sampling
    from mass_jobs.episodes.harness import EpisodeInput
    from mass_jobs.episodes.rollouts import RolloutError, agent_ended, agent_result
    from mass_jobs.tools.testing.scripted_endpoint import Reply

    ep = scripted_endpoint(
        {
            "orchestrator": [Reply.call("delegate", assignment="tidy the records"), Reply.text("records tidied")],
            "worker-1": [Reply.call("shell", command=EARLY_EXIT_COMMAND), Reply.call("finish", summary="tidied")],
        }
    )
    inp = EpisodeInput(
        prompt="Tidy up.",
        endpoint=ep.endpoint,
        sampling=Sampling(),
        files={"notes.md": "n\n"},
        limits=EpisodeLimits(wall_s=90, request_timeout_s=20, request_retries=0, shell_timeout_s=30),
    )
    with tempfile_dir() as seed:
        wf, output = run_agent_episode(executor_for, "early", inp, seed)
    assert wf.phase == "Succeeded", wf.summary()
    assert len(ep.requests) == 4  # the harness ran to its end after the upload
    said = [m["content"] for m in ep.requests[2]["body"]["messages"] if m["role"] == "tool"][-1]
    assert "SEES /var/run/argo" in said and "WROTE exitcode" in said and "STAGED status.json" in said, said
    # what /out held when the upload began: the two records before the command's result, none forged
    trace = [json.loads(x) for x in output("trace.jsonl").decode().splitlines()]
    assert [r["seq"] for r in trace] == [0, 1] and not [r for r in trace if "forged" in r]
    for missing in ("status.json", "proof.json", "workspace.tar.gz"):
        with pytest.raises(Exception, match="NoSuchKey"):
            output(missing)

    store = open_store(f"s3://{s3_env['bucket']}", endpoint_url=s3_env["endpoint_url"], region=s3_env["region"])
    pod = PodFiles(store)
    status, blobs, _ = agent_result(pod, "runs/early/gen-0/collect/t/ep-0", agent_ended("Succeeded"))
    assert status["outcome"] == "infra_error" and "outputs were refused" in status["reason"], status
    assert "no proof.json" in status["reason"] and blobs["trace.jsonl"] == b""
    assert status["ended_by"] == "pod" and status["reason"].startswith("the harness did not end this episode")
    # switched off (no key, a Succeeded agent step not counted as over): the partial upload failed the step
    store.delete(f"runs/early/gen-0/collect/t/ep-0/input/{proof.KEY}")
    with pytest.raises(RolloutError, match="output is missing"):
        agent_result(pod, "runs/early/gen-0/collect/t/ep-0", False)
