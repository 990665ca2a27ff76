"""The serve step's wait: a generation's InferenceService Ready, or the reason it cannot be, in bounds.

KServe (v0.20, Standard mode) gives nothing to wait on for a predictor that never schedules: its
model state reads Pending both for a pod no node takes and for a model still loading once the
storage initializer is done, and the Deployment's ProgressDeadlineExceeded fires on a slow load
too. So the wait reads the predictor's pods themselves (KServe labels them
`serving.kserve.io/inferenceservice=<name>`) and fails once one of them has been held (not
scheduled: Unschedulable or gated by a queue; or its image not pulling) past the pending bound,
naming the scheduler's message. It ends well when KServe's target model state is Loaded, fails on
its terminal load failure (transitionStatus is UpToDate by default before a load, so only the
terminal states count), and fails at the ready deadline with what it last saw.

`look` is the pure part: one reading of the objects; `wait` polls the API server with it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from mass_jobs.cluster.api import Cluster, Forbidden, Unreachable
from mass_jobs.cluster.pods import reason

ISVC_LABEL = "serving.kserve.io/inferenceservice"
# a container waiting for one of these will not start by waiting longer (the kubelet's reasons)
IMAGE_HELD = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull")


class ModelNotServed(Exception):
    """The model will not be served: the message says why (a scheduler's message, a load failure)."""


def loaded(isvc: dict) -> bool:
    """KServe's target model state is Loaded: the predictor serves."""
    states = ((isvc.get("status") or {}).get("modelStatus") or {}).get("states") or {}
    return states.get("targetModelState") == "Loaded"


def load_failure(isvc: dict) -> str:
    """KServe's terminal transition (the model failed to load, or the spec is
    invalid) with its failure info; "" otherwise."""
    model = (isvc.get("status") or {}).get("modelStatus") or {}
    if model.get("transitionStatus") not in ("BlockedByFailedLoad", "InvalidSpec"):
        return ""
    info = model.get("lastFailureInfo") or {}
    return f"{model['transitionStatus']}: {info.get('reason', '')}: {info.get('message', '')}".rstrip(": ")


def held(pod: dict) -> str:
    """Why a predictor pod cannot start ("" when it is not held): not scheduled (the scheduler's
    condition: Unschedulable with its message, or SchedulingGated while a queue holds it), or a
    container whose image does not pull. A scheduled pod that is loading is not held: the ready
    deadline bounds a load."""
    status = pod.get("status") or {}
    if status.get("phase", "Pending") != "Pending":
        return ""
    scheduled = [c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"]
    if not scheduled:
        return "not scheduled yet"
    why = reason(pod)  # `mass pods`'s reading: the scheduler's condition, then each container's state
    if scheduled[0].get("status") == "False":
        return why
    return why if why.split(" ", 1)[0] in IMAGE_HELD else ""


@dataclass
class Look:
    """One reading: served (done), a reason it never will be (failure), else what it waits for."""

    done: bool = False
    failure: str = ""
    waiting: str = ""


def look(
    name: str, isvc: dict | None, pods: list[dict], held_since: dict[str, float], now: float, pending_s: float
) -> Look:
    """The InferenceService `name` and its predictor's pods at `now`. `held_since` (pod uid -> when
    it was first seen held) is kept across readings: a pod held for `pending_s` fails the wait (0:
    no bound); one no longer held is forgotten."""
    if isvc is not None and loaded(isvc):
        return Look(done=True)
    if isvc is not None and (failed := load_failure(isvc)):
        return Look(failure=f"InferenceService {name}: {failed}")
    seen: set[str] = set()
    waits = []
    for pod in sorted(pods, key=lambda p: p["metadata"]["name"]):
        meta = pod["metadata"]
        uid = meta.get("uid") or meta["name"]
        why = held(pod)
        if not why:
            continue
        seen.add(uid)
        since = held_since.setdefault(uid, now)
        if pending_s and now - since >= pending_s:
            return Look(
                failure=f"predictor pod {meta['name']} held for {int(now - since)} s (the pending bound is "
                f"{int(pending_s)} s): {why}"
            )
        waits.append(f"pod {meta['name']}: {why}")
    for uid in set(held_since) - seen:
        del held_since[uid]
    if isvc is None:
        return Look(waiting=f"InferenceService {name} not found yet")
    if waits:
        return Look(waiting="; ".join(waits))
    states = ((isvc.get("status") or {}).get("modelStatus") or {}).get("states") or {}
    return Look(
        waiting=f"model {states.get('targetModelState') or 'not reported yet'}"
        f" ({len(pods)} predictor pod{'s' if len(pods) != 1 else ''})"
    )


def wait(
    cluster: Cluster,
    name: str,
    pending_s: float,
    ready_s: float,
    poll_s: float = 5.0,
    clock=time.monotonic,
    sleep=time.sleep,
    say=print,
) -> None:
    """Poll until the model is served; raise ModelNotServed on a failure, on a read this account
    may not make (a permanent misconfiguration), or past `ready_s` (0: no deadline). An API server
    that does not answer is waited for: it comes back, or the ready deadline ends the wait."""
    ns = cluster.namespace
    isvc_path = f"/apis/serving.kserve.io/v1beta1/namespaces/{ns}/inferenceservices/{name}"
    start, held_since, last = clock(), {}, None
    while True:
        now = clock()
        try:
            reading = look(
                name,
                cluster.get(isvc_path),
                cluster.items(f"/api/v1/namespaces/{ns}/pods", f"{ISVC_LABEL}={name}"),
                held_since,
                now,
                pending_s,
            )
        except Forbidden as err:
            raise ModelNotServed(f"this pod's account may not read what the wait needs: {err}") from None
        except Unreachable as err:
            reading = Look(waiting=f"the API server did not answer: {err}")
        if reading.done:
            say(f"{name}: served after {int(now - start)} s", flush=True)
            return
        if reading.failure:
            raise ModelNotServed(reading.failure)
        if reading.waiting != last:  # progress: each change of what it waits for, once
            say(f"{name}: {int(now - start)} s: {reading.waiting}", flush=True)
            last = reading.waiting
        if ready_s and now - start >= ready_s:
            raise ModelNotServed(
                f"InferenceService {name} not served within {int(ready_s)} s "
                f"(model.readyDeadlineSeconds): {reading.waiting}"
            )
        sleep(poll_s)
