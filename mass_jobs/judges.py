"""The judge panel: blind, position-balanced pairwise verdicts on two workspaces.

Used by the evaluate step (`mass evaluate --spec S --gen G`) for the external panel
(`spec.judges`: each judge x each of its seeds = one verdict per pair) and for the
self-evaluator (the generation's own model, one verdict per pair) whose agreement with the
panel the report shows. Reporting only: nothing here feeds search, ranking or selection.

- Blind: the judge sees "Workspace A" / "Workspace B", never a generation or a path.
- Position balanced: the order alternates over a judge's seeds and starts on opposite sides for
  consecutive judges, so every pair is seen in both orders when a judge has two or more seeds.
- Structured: the answer must be a JSON object {"winner": "A"|"B"|"tie", "rationale": "..."};
  a malformed answer or a failing endpoint is retried with a correction, and after the retries it
  is recorded as INVALID (never as a tie).
- Resumable: each verdict is its own store object; a rerun skips verdicts already stored.

Self-contained on purpose: the workspace bundle here is the judge's own evidence format, so the
panel's view of a workspace does not change when the inner loop's comparison prompt is tuned.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

VERDICT_SYSTEM = (
    "You are an impartial reviewer. Two teams worked on the same task, each in its own workspace. "
    "Compare the two workspaces (the files they produced) against the task and decide which is better: "
    "correct, complete, honest results and deliverables beat polish. Ignore the order in which they are "
    "shown. Answer with ONLY a JSON object: "
    '{"winner": "A" | "B" | "tie", "rationale": "<two to five sentences>"}'
)

CORRECTION = (
    'Your answer was not a valid verdict ({error}). Reply with ONLY a JSON object like '
    '{{"winner": "A", "rationale": "..."}} where winner is "A", "B" or "tie".'
)

TEXT_SUFFIXES = {".py", ".md", ".txt", ".json", ".csv", ".yaml", ".yml", ".toml", ".sh", ".tsv", ".log", ".ini",
                 ".cfg", ".html", ".tex", ".r", ".jl", ".c", ".cpp", ".h", ".js", ".ts", ".rst"}


class ChatClient(Protocol):
    def chat(self, messages: list[dict], tools: Any = None, seed: int | None = None,
             max_tokens: int | None = None, headers: dict | None = None) -> dict: ...


@dataclass(frozen=True)
class PairJob:
    """One workspace pair: candidate generation vs baseline generation on (task, replicate)."""

    task: str
    replicate: int
    candidate: int
    baseline: int
    task_prompt: str
    candidate_bundle: str
    baseline_bundle: str

    @property
    def name(self) -> str:
        return f"gen-{self.candidate}-vs-gen-{self.baseline}/{self.task}/rep-{self.replicate}"


@dataclass(frozen=True)
class PanelMember:
    name: str
    model: str
    seeds: tuple[int, ...]
    client: ChatClient
    kind: str = "panel"  # "panel" or "self"


# ---------------------------------------------------------------- evidence


def workspace_bundle(workspace: Path, cap_bytes: int = 16384) -> str:
    """Text view of a workspace: a file list (size, short hash) then text files, capped.

    Deterministic (sorted paths) so the same workspace always reads the same to a judge."""
    workspace = Path(workspace)
    files = sorted(p for p in workspace.rglob("*") if p.is_file() and not p.is_symlink())
    listing, bodies = [], []
    for p in files:
        rel = p.relative_to(workspace).as_posix()
        data = p.read_bytes()
        listing.append(f"- {rel} ({len(data)} bytes, sha256 {hashlib.sha256(data).hexdigest()[:12]})")
        if p.suffix.lower() in TEXT_SUFFIXES or not p.suffix:
            try:
                bodies.append(f"### {rel}\n{data.decode('utf-8')}")
            except UnicodeDecodeError:
                pass
    head = "Files:\n" + ("\n".join(listing) if listing else "(empty workspace)")
    text = head + ("\n\n" + "\n\n".join(bodies) if bodies else "")
    encoded = text.encode("utf-8")
    if len(encoded) > cap_bytes:
        text = encoded[:cap_bytes].decode("utf-8", errors="ignore") + "\n[... truncated]"
    return text


def verdict_messages(task_prompt: str, first: str, second: str) -> list[dict]:
    user = (f"Task:\n{task_prompt}\n\n=== Workspace A ===\n{first}\n\n=== Workspace B ===\n{second}\n\n"
            "Which workspace is better? Answer with the JSON object only.")
    return [{"role": "system", "content": VERDICT_SYSTEM}, {"role": "user", "content": user}]


# ---------------------------------------------------------------- parsing


class InvalidVerdict(ValueError):
    pass


_THINK = re.compile(r"<think>.*?</think>", re.S)
_FENCE = re.compile(r"```(?:json)?\s*(\{.*?\})\s*```", re.S)


def parse_verdict(content: str | None) -> tuple[str, str]:
    """(winner, rationale) from a model answer, or InvalidVerdict saying what was wrong."""
    if not content or not content.strip():
        raise InvalidVerdict("empty answer")
    text = _THINK.sub("", content).strip()
    fenced = _FENCE.search(text)
    candidate = fenced.group(1) if fenced else text[text.find("{"): text.rfind("}") + 1] if "{" in text else ""
    if not candidate:
        raise InvalidVerdict("no JSON object in the answer")
    try:
        obj = json.loads(candidate)
    except json.JSONDecodeError as e:
        raise InvalidVerdict(f"JSON does not parse: {e.msg}") from None
    winner = obj.get("winner")
    if not isinstance(winner, str) or winner.strip().lower() not in ("a", "b", "tie"):
        raise InvalidVerdict(f"'winner' must be \"A\", \"B\" or \"tie\", got {winner!r}")
    rationale = obj.get("rationale")
    if not isinstance(rationale, str) or not rationale.strip():
        raise InvalidVerdict("'rationale' must be a non-empty string")
    w = winner.strip().lower()
    return ("tie" if w == "tie" else w.upper()), rationale.strip()


# ---------------------------------------------------------------- one verdict


def order_for(job: PairJob, judge_index: int, seed_index: int) -> str:
    """Alternate over seeds, start on opposite sides for consecutive judges, and let the pair
    itself pick the starting side (so position is balanced over pairs too)."""
    parity = hashlib.sha256(job.name.encode()).digest()[0] % 2
    return "candidate_first" if (seed_index + judge_index + parity) % 2 == 0 else "baseline_first"


def ask_verdict(client: ChatClient, job: PairJob, order: str, seed: int, retries: int,
                max_tokens: int | None = None) -> dict:
    """One verdict with validation and retries; never raises for endpoint or format failures."""
    first, second = ((job.candidate_bundle, job.baseline_bundle) if order == "candidate_first"
                     else (job.baseline_bundle, job.candidate_bundle))
    messages = verdict_messages(job.task_prompt, first, second)
    errors: list[str] = []
    for attempt in range(retries + 1):
        try:
            reply = client.chat(messages, seed=seed + attempt, max_tokens=max_tokens)
        except Exception as e:  # endpoint down, HTTP error, timeout: recorded, retried, never a crash
            errors.append(f"endpoint: {type(e).__name__}: {e}"[:500])
            continue
        content = reply.get("content") if isinstance(reply, dict) else None
        try:
            winner, rationale = parse_verdict(content)
        except InvalidVerdict as e:
            errors.append(f"format: {e}")
            messages = messages + [{"role": "assistant", "content": content or ""},
                                   {"role": "user", "content": CORRECTION.format(error=e)}]
            continue
        return {"order": order, "winner": winner, "valid": True, "rationale": rationale,
                "attempts": attempt + 1, "errors": errors}
    return {"order": order, "winner": None, "valid": False, "rationale": None,
            "attempts": retries + 1, "errors": errors}


# ---------------------------------------------------------------- the panel


def verdict_key(prefix: str, job: PairJob, member: PanelMember, seed: int) -> str:
    return f"{prefix}/{job.name}/{member.kind}-{member.name}-seed-{seed}.json"


def run_panel(store, prefix: str, jobs: Iterable[PairJob], members: list[PanelMember], retries: int,
              max_tokens: int | None = None, on_verdict: Callable[[dict], None] | None = None) -> list[dict]:
    """Every member's verdicts on every job, stored under `prefix`; stored ones are reused."""
    records = []
    for job in jobs:
        for ji, member in enumerate(members):
            for si, seed in enumerate(member.seeds):
                key = verdict_key(prefix, job, member, seed)
                if store.exists(key):
                    record = store.get_json(key)
                else:
                    result = ask_verdict(member.client, job, order_for(job, ji, si), seed, retries, max_tokens)
                    record = {"task": job.task, "replicate": job.replicate, "candidate": job.candidate,
                              "baseline": job.baseline, "judge": member.name, "kind": member.kind,
                              "model": member.model, "seed": seed, **result}
                    store.put_json(key, record)
                records.append(record)
                if on_verdict:
                    on_verdict(record)
    return records


def load_verdicts(store, prefix: str) -> list[dict]:
    """All stored verdict records under `prefix` (panel and self), in key order."""
    return [store.get_json(k) for k in store.list(prefix + "/") if k.endswith(".json") and "/_" not in k]
