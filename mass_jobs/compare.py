"""Workspace bundles and blind pairwise verdicts (used by search, rank and the judges).

A bundle is a bounded text view of a finished workspace: a run notice when the episode did not
succeed, the file tree, required deliverables found/missing, a report excerpt, metrics JSON and
excerpts of other text files, cut to a byte budget. A verdict compares two bundles under blind
labels A/B; the caller decides which one is shown first. Unreadable replies are retried with the
reason, then recorded as invalid — never turned into a silent tie.

No command of its own; `mass search` and `mass rank` call it.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from mass_jobs.models import Closed

EVALUATOR_ROLE = "evaluator"
REPORT_NAMES = ("report.md", "REPORT.md", "report.txt", "README.md", "results/report.md", "deliverables/report.md")
TEXT_SUFFIXES = {".md", ".txt", ".py", ".json", ".csv", ".yaml", ".yml", ".toml", ".sh", ".log", ".tsv", ".cfg", ".ini"}
MAX_TREE_ENTRIES = 200

EVALUATOR_SYSTEM = (
    "You are the evaluator. Two finished workspaces, labelled A and B, were produced for the same task. "
    "Compare only the artifacts (files, numbers, reports); check that claims are backed by the files. "
    "Say which workspace better accomplishes the task.\n"
    'Reply with one JSON object and nothing else: {"winner": "A" | "B" | "tie", "rationale": "<why, citing files>"}'
)


class Verdict(Closed):
    """One blind pairwise verdict: `first` was shown as A, `second` as B."""

    first: str = Field(description="Id of the workspace shown as A.")
    second: str = Field(description="Id of the workspace shown as B.")
    winner: str | None = Field(description="Id of the preferred workspace, 'tie', or null when invalid.")
    valid: bool
    rationale: str = ""
    attempts: int = Field(ge=1)
    errors: list[str] = Field(default_factory=list, description="Why earlier replies were unreadable.")
    seed: int | None = None
    model: str | None = Field(default=None, description="Who judged: `gen-<g>` or `<model> @ <endpoint>` (roles.evaluator).")

    def score_of_first(self) -> float:
        """1 win, 0.5 tie, 0 loss for `first` (only for valid verdicts)."""
        if not self.valid:
            raise ValueError("an invalid verdict has no score")
        return 0.5 if self.winner == "tie" else float(self.winner == self.first)


# ---------------------------------------------------------------- bundles


def _read_text(path: Path, limit: int) -> str:
    data = path.read_bytes()[: limit + 1]
    text = data[:limit].decode("utf-8", errors="replace")
    return text + ("\n[... truncated]" if len(data) > limit else "")


def _files(workspace: Path) -> list[Path]:
    if not workspace.is_dir():
        return []
    out = []
    for p in sorted(workspace.rglob("*")):
        rel = p.relative_to(workspace)
        if any(part.startswith(".") or part == "__pycache__" for part in rel.parts):
            continue
        if p.is_file() and not p.is_symlink():
            out.append(p)
    return out


def _cut(text: str, limit: int) -> str:
    raw = text.encode("utf-8")
    if len(raw) <= limit:
        return text
    return raw[: max(0, limit - 16)].decode("utf-8", errors="ignore") + "\n[... truncated]"


def bundle(
    workspace: Path,
    max_bytes: int = 16384,
    deliverables: list[str] | tuple[str, ...] = (),
    status: dict | None = None,
) -> str:
    """A bounded text view of a workspace (at most `max_bytes` UTF-8 bytes, deterministic)."""
    workspace = Path(workspace)
    files = _files(workspace)
    rels = [f.relative_to(workspace).as_posix() for f in files]
    sections: list[str] = []
    if status and status.get("outcome") not in (None, "success"):
        sections.append(f"RUN NOTICE: the episode ended with outcome {status.get('outcome')!r}: {status.get('reason', '')}")
    tree = [f"{r} ({f.stat().st_size} bytes)" for r, f in zip(rels, files)][:MAX_TREE_ENTRIES]
    if len(files) > MAX_TREE_ENTRIES:
        tree.append(f"... and {len(files) - MAX_TREE_ENTRIES} more files")
    sections.append(_cut("FILE TREE:\n" + ("\n".join(tree) if tree else "(empty workspace)"), max_bytes // 4))
    if deliverables:
        found = [d for d in deliverables if (workspace / d).exists()]
        missing = [d for d in deliverables if d not in found]
        sections.append(f"DELIVERABLES found: {found or 'none'}; missing: {missing or 'none'}")
    shown: set[str] = set()
    report = next((r for r in REPORT_NAMES if r in rels), None)
    if report:
        shown.add(report)
        sections.append(f"REPORT ({report}):\n" + _read_text(workspace / report, max_bytes // 4))
    metrics = [r for r in rels if r.endswith(".json") and "metric" in r.lower()]
    for r in metrics[:3]:
        shown.add(r)
        sections.append(f"METRICS ({r}):\n" + _read_text(workspace / r, max_bytes // 8))
    text = "\n\n".join(sections)
    for r, f in zip(rels, files):  # remaining text files, in path order, while the budget lasts
        left = max_bytes - len(text.encode("utf-8")) - 64
        if left < 256:
            break
        if r in shown or f.suffix.lower() not in TEXT_SUFFIXES:
            continue
        text += f"\n\nFILE {r}:\n" + _read_text(f, min(left, max_bytes // 8))
    return _cut(text, max_bytes)


# ---------------------------------------------------------------- verdicts



def stored_bundle(store, prefix: str, max_bytes: int, deliverables=(), workspace: Path | None = None) -> str:
    """bundle() of the workspace archive and status stored under `prefix` (extracted into `workspace`,
    a temp folder by default). An archive get_dir refuses (agent-written, hostile) is shown as an
    empty workspace with a notice saying why: a verdict against it, never a crashed step."""
    import tempfile

    from mass_jobs.context import RunContext
    from mass_jobs.store import UnsafeArchive

    status = store.get_json(RunContext.rollout_file(prefix, "status.json"))
    with tempfile.TemporaryDirectory(prefix="mass-bundle-") as tmp:
        ws = Path(workspace) if workspace is not None else Path(tmp)
        try:
            store.get_dir(RunContext.rollout_file(prefix, "workspace.tar.gz"), ws)
        except UnsafeArchive as err:
            notice = f"WORKSPACE REFUSED: the stored archive was not extracted: {str(err)[:300]}"
            return _cut(notice + "\n\n" + bundle(Path(tmp) / "none", max_bytes, deliverables, status), max_bytes)
        return bundle(ws, max_bytes, deliverables, status)

def _strip_think(text: str) -> str:
    text = re.sub(r"<think>.*?</think>", "", text, flags=re.S)
    return text.split("</think>")[-1]


def parse_verdict(text: str | None) -> tuple[Literal["A", "B", "tie"], str]:
    """(label, rationale) from an evaluator reply; ValueError says why it is unreadable."""
    if not text or not text.strip():
        raise ValueError("the reply is empty")
    body = _strip_think(text)
    decoder = json.JSONDecoder()
    for m in re.finditer(r"\{", body):
        try:
            obj, _ = decoder.raw_decode(body[m.start():])
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict) and "winner" in obj:
            label = str(obj["winner"]).strip()
            norm = {"a": "A", "b": "B", "tie": "tie"}.get(label.lower())
            if norm is None:
                raise ValueError(f"'winner' must be \"A\", \"B\" or \"tie\", got {label!r}")
            return norm, str(obj.get("rationale", "")).strip()  # type: ignore[return-value]
    m = re.search(r"^\W*(?:winner|verdict)\W*[:=]\W*(A|B|tie)\b", body, flags=re.I | re.M)
    if m:
        norm = {"a": "A", "b": "B", "tie": "tie"}[m.group(1).lower()]
        return norm, body.strip()  # type: ignore[return-value]
    raise ValueError('no {"winner": ...} object or "Winner: A|B|tie" line was found')


def judge(
    client: Any,
    task_prompt: str,
    first: tuple[str, str],
    second: tuple[str, str],
    *,
    retries: int = 2,
    seed: int | None = None,
    role: str = EVALUATOR_ROLE,
) -> Verdict:
    """Ask `client` to compare two bundles; `first` = (id, bundle) is shown as A, `second` as B."""
    (id_a, bundle_a), (id_b, bundle_b) = first, second
    messages: list[dict] = [
        {"role": "system", "content": EVALUATOR_SYSTEM},
        {
            "role": "user",
            "content": f"TASK:\n{task_prompt}\n\n=== WORKSPACE A ===\n{bundle_a}\n\n=== WORKSPACE B ===\n{bundle_b}\n\n"
            "Which workspace is better? Answer with the JSON object only.",
        },
    ]
    errors: list[str] = []
    for attempt in range(retries + 1):
        reply = client.chat(
            messages,
            seed=None if seed is None else seed + attempt,
            headers={"X-Mass-Role": role, "X-Mass-Agent": role},
        )
        content = reply.get("content") or ""
        try:
            label, rationale = parse_verdict(content)
        except ValueError as e:
            errors.append(f"attempt {attempt + 1}: {e}")
            messages = messages[:2] + [
                {"role": "assistant", "content": content},
                {"role": "user", "content": f"Your reply could not be read ({e}). Reply with the JSON object only: "
                 '{"winner": "A" | "B" | "tie", "rationale": "..."}'},
            ]
            continue
        winner = {"A": id_a, "B": id_b, "tie": "tie"}[label]
        return Verdict(first=id_a, second=id_b, winner=winner, valid=True, rationale=rationale,
                       attempts=attempt + 1, errors=errors, seed=seed)
    return Verdict(first=id_a, second=id_b, winner=None, valid=False, rationale="", attempts=retries + 1,
                   errors=errors, seed=seed)


def blind_judge(
    client: Any,
    task_prompt: str,
    x: tuple[str, str],
    y: tuple[str, str],
    rng: random.Random,
    **kwargs: Any,
) -> Verdict:
    """`judge` with the shown-first position drawn from `rng` (seed it for reproducible runs)."""
    first, second = (x, y) if rng.random() < 0.5 else (y, x)
    return judge(client, task_prompt, first, second, **kwargs)
