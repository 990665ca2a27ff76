"""Per-role models: which model plays the optimizer, the evaluator and the executor.

By default every role is the current generation (the paper's homogeneous setting). `roles.<role>` in
the spec names any OpenAI-compatible endpoint, model and API-key variable instead (the paper's
stronger-optimizer / stronger-evaluator ablations). Search and rank ask `role_client` for their
optimizer and evaluator clients, `episode_runner` asks `role_endpoint` for the executor, and every
proposal and verdict records `role_label` so the report can say which model played which role.
No CLI of its own: used by `mass search`, `mass collect`, `mass rank` and the local runner.
"""

from __future__ import annotations

from typing import Any

from mass_jobs.serving.llm import Endpoint, ModelClient

ROLES = ("optimizer", "evaluator", "executor")


def role_spec(spec, role: str):
    if role not in ROLES:
        raise ValueError(f"role: expected one of {ROLES}, got {role!r}")
    return getattr(spec.roles, role)


def role_endpoint(spec, role: str):
    """The role's own Endpoint, or None when the current generation plays it."""

    r = role_spec(spec, role)
    return None if r is None else Endpoint(base_url=r.endpoint, model=r.model, api_key_env=r.api_key_env)


def role_client(spec, role: str, generation_client: Any) -> Any:
    """A client of the role's endpoint (the spec's sampling and request limits), else the generation's."""
    endpoint = role_endpoint(spec, role)
    return generation_client if endpoint is None else client_for(spec, endpoint)


def client_for(spec, endpoint) -> Any:
    """A ModelClient of `endpoint` with the spec's sampling and request limits."""

    lim = spec.execution.limits
    return ModelClient(endpoint, spec.model.sampling, timeout_s=lim.request_timeout_s, retries=lim.request_retries)


def role_label(spec, role: str, gen: int) -> str:
    """What a record says played the role: `gen-<g>` (the current generation) or `<model> @ <endpoint>`."""
    r = role_spec(spec, role)
    return f"gen-{gen}" if r is None else f"{r.model} @ {r.endpoint}"


def roles_input(spec) -> dict:
    """The configured roles for step input hashes; empty (hash unchanged) in the homogeneous setting."""
    return {k: v for k, v in spec.roles.model_dump(mode="json").items() if v is not None}


def recorded_players(ctx) -> dict[str, list[str]]:
    """role -> the models recorded as playing it in the stored proposals and verdicts (search and rank)
    and teacher episodes, over every generation: what the report shows next to the configuration."""
    spec, store = ctx.spec, ctx.store
    seen: dict[str, set[str]] = {r: set() for r in ROLES}

    def get(key):
        return store.get_json(key) if store.exists(key) else None

    train = [t.id for t in spec.train_tasks()]
    for g in range(spec.generations + 1):
        for t in train:
            state = get(ctx.search_state(g, t)) or {}
            for rec in state.get("iterations", []):
                for v in (rec.get("verdict"), rec.get("reference_verdict")):
                    if v:
                        seen["evaluator"].add(v.get("model") or "unrecorded")
                if rec.get("k", 0) > 0:
                    proposal = get(ctx.search_file(g, t, rec["k"], "proposal.json")) or {}
                    seen["optimizer"].add(proposal.get("model") or "unrecorded")
                if rec.get("outcome") is not None:
                    seen["executor"].add(role_label(spec, "executor", g))
            for v in (get(ctx.rank(g, t)) or {}).get("verdicts", []):
                seen["evaluator"].add(v.get("model") or "unrecorded")
            for key in store.list(ctx.collect(g, t) + "/"):
                if key.endswith("/episode.json") and not ctx.is_pod_copy(key):
                    ex = store.get_json(key).get("executor")
                    seen["executor"].add(f"{ex['model']} @ {ex['endpoint']}" if ex else f"gen-{g}")
    return {r: sorted(v) for r, v in seen.items()}
