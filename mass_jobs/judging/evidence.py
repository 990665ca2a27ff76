"""Workspace evidence shown to the evaluator and the optimizer, with the paper's code's content and caps.

One bundle of a finished workspace holds, in order:
  - a run notice when the episode did not succeed;
  - a representative file tree: at most 400 entries, 6 levels, and a folder of over 100 entries
    named with its count instead of listed; binaries and large data named, never read;
  - a programmatic preflight: the task's deliverables and the paper's core files found or missing,
    and the plot paths the task text names;
  - excerpts of the high-signal text files: the deliverables and report, the paper's priority files,
    up to four entry scripts and one test, each capped in characters and in tokens, head and tail
    kept with the middle omitted.
`results_appendix` is the optimizer's extra view: every `results/**/*.json` under a per-file and a
total character budget, the files past the budget named as omitted.

Tokens are estimated as characters / 4 (rounded up), the paper's code's counter for local models;
callers fit whole prompts to the served context with the same counter (`fit_tokens`). Reads are
bounded (head and tail of a file, never a whole file of unknown size), links are never followed.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

SKIP_DIRS = {".git", "__pycache__", ".pytest_cache", ".mypy_cache", "node_modules", ".venv", "venv"}
BINARY_SUFFIXES = {
    ".parquet",
    ".pq",
    ".npy",
    ".npz",
    ".pkl",
    ".pickle",
    ".pt",
    ".pth",
    ".onnx",
    ".bin",
    ".h5",
    ".hdf5",
    ".feather",
    ".arrow",
    ".png",
    ".jpg",
    ".jpeg",
    ".gif",
    ".webp",
    ".pdf",
    ".zip",
    ".tar",
    ".gz",
    ".safetensors",
}
TEXT_SUFFIXES = {".md", ".txt", ".py", ".json", ".csv", ".yaml", ".yml", ".toml", ".sh", ".log", ".tsv", ".cfg", ".ini"}
CORE_FILES = ("research_report.md", "deliverables/index.json", "results/metrics.json", "requirements.txt")
PRIORITY_FILES = (
    "research_report.md",
    "deliverables/index.json",
    "results/metrics.json",
    "results/model_comparison.json",
    "requirements.txt",
)
REPORT_NAMES = ("report.md", "REPORT.md", "report.txt", "README.md", "results/report.md", "deliverables/report.md")
ENTRY_PATTERNS = ("run_*.py", "main.py", "pipeline.py")
RESULTS_EXCLUDED = {"raw_records.json", "pilot_raw_records.json"}  # per-record dumps that swamp a prompt
OMITTED = "\n\n[... middle omitted ...]\n\n"
TEST_CAP = 8000


def count_tokens(text: str) -> int:
    """The paper's code's estimate for local models: characters / 4, rounded up."""
    return max(1, math.ceil(len(text) / 4))


@dataclass(frozen=True)
class Caps:
    """Per-file excerpt caps (None: no cap). Defaults: the paper's code with a local model."""

    report_chars: int | None = 28_000
    json_chars: int | None = 24_000
    code_chars: int | None = 12_000
    report_tokens: int | None = None
    json_tokens: int | None = 50_000
    code_tokens: int | None = 10_000
    code_files: int = 4
    tree_entries: int = 400
    tree_depth: int = 6
    tree_children: int = 100
    results_chars: int | None = 24_000
    results_total_chars: int | None = 120_000


def caps_of(spec) -> Caps:
    """Caps from a run spec's `search.evidence`."""
    section = spec.search.evidence
    return Caps(**{k: getattr(section, k) for k in Caps.__dataclass_fields__})


def prompt_budget(spec) -> int:
    """Estimated tokens a role's request may take: the served context less the reply and the margin."""
    s = spec.model.sampling
    return max(256, s.context_length - s.max_output_tokens - spec.search.evidence.safety_tokens)


# ---------------------------------------------------------------- bounded reads


def _read(path: Path, max_chars: int | None) -> str:
    """The file's text, or its head and tail (each at least max_chars characters) around a gap."""
    size = path.stat().st_size
    span = None if max_chars is None else 4 * max_chars + 4  # a character is at most 4 bytes
    with path.open("rb") as f:
        if span is None or size <= 2 * span:
            data = f.read(size if span is None else 2 * span)
            return data.decode("utf-8", errors="replace")
        head = f.read(span)
        f.seek(size - span)
        tail = f.read(span)
    return head.decode("utf-8", errors="replace") + OMITTED + tail.decode("utf-8", errors="replace")


def head_tail(text: str, max_chars: int) -> str:
    """`text` cut to about max_chars characters: the first and last halves kept, the middle marked."""
    if len(text) <= max_chars:
        return text
    half = max_chars // 2
    return text[:half] + OMITTED + text[len(text) - (max_chars - half) :]


def excerpt(text: str, max_chars: int | None, max_tokens: int | None) -> tuple[str, bool]:
    """(text within both caps, whether it was cut)."""
    cut = False
    if max_tokens is not None and count_tokens(text) > max_tokens:
        text, cut = head_tail(text, max(64, 4 * max_tokens - len(OMITTED))), True
    if max_chars is not None and len(text) > max_chars:
        text, cut = head_tail(text, max_chars), True
    return text, cut


# ---------------------------------------------------------------- tree and preflight


def _entries(folder: Path) -> list[Path]:
    try:
        subs = [p for p in folder.iterdir() if not p.name.startswith(".") and p.name not in SKIP_DIRS]
    except OSError:
        return []
    return sorted(subs, key=lambda p: (not _is_dir(p), p.name.lower(), p.name))


def _is_dir(p: Path) -> bool:
    return p.is_dir() and not p.is_symlink()


def _is_file(p: Path) -> bool:
    return p.is_file() and not p.is_symlink()


def file_tree(root: Path, caps: Caps = Caps()) -> str:
    """A bounded, representative tree: folders first, a crowded folder named with its entry count."""
    lines = ["workspace/"]
    left = caps.tree_entries
    truncated = False

    def walk(folder: Path, depth: int) -> None:
        nonlocal left, truncated
        if depth > caps.tree_depth:
            return
        subs = _entries(folder)
        if caps.tree_children and len(subs) > caps.tree_children:
            lines.append(f"{'  ' * depth}... [{len(subs)} entries, over the {caps.tree_children} listed per folder]")
            return
        for p in subs:
            if left <= 0:
                truncated = True
                return
            left -= 1
            if _is_dir(p):
                lines.append(f"{'  ' * depth}{p.name}/")
                walk(p, depth + 1)
            elif p.is_symlink():
                lines.append(f"{'  ' * depth}{p.name}  [link, not followed]")
            elif p.suffix.lower() in BINARY_SUFFIXES:
                lines.append(f"{'  ' * depth}{p.name}  [{p.suffix.lower()} binary/large]")
            else:
                lines.append(f"{'  ' * depth}{p.name}")

    if _is_dir(root):
        walk(root, 1)
    else:
        lines.append("  (empty workspace)")
    if truncated:
        lines.append("... (tree truncated)")
    return "\n".join(lines)


_PLOT = re.compile(r"([\w./-]*deliverables/plots/[\w.-]+\.png)", re.I)
_PNG = re.compile(r"(?:deliverables/plots/|\b)([A-Za-z0-9_-]+\.png)\b")


def plot_mentions(task_text: str) -> list[str]:
    """Plot paths the task text names: explicit deliverables/plots/ paths and bare .png names under it."""
    found = {m.group(1) for m in _PLOT.finditer(task_text)}
    found |= {f"deliverables/plots/{m.group(1)}" for m in _PNG.finditer(task_text)}
    return sorted(found)


def preflight(root: Path, task_text: str, deliverables) -> str:
    lines = ["PREFLIGHT (checked by the harness from the task text and the files; evidence, not a verdict):"]
    for rel in list(dict.fromkeys([*deliverables, *CORE_FILES])):
        lines.append(f"- {rel}: {'FOUND' if (root / rel).exists() else 'MISSING'}")
    plots = plot_mentions(task_text)
    if plots:
        lines.append(f"Plot paths named by the task: {len(plots)}")
        lines += [f"  - [{'ok' if _is_file(root / p) else 'missing'}] {p}" for p in plots[:40]]
        if len(plots) > 40:
            lines.append("  - ...")
    else:
        lines.append("Plot paths named by the task: none found")
    return "\n".join(lines)


# ---------------------------------------------------------------- excerpts


def _kind_caps(rel: str, caps: Caps) -> tuple[int | None, int | None]:
    suffix = Path(rel).suffix.lower()
    if suffix == ".json":
        return caps.json_chars, caps.json_tokens
    if suffix in (".py", ".sh"):
        return caps.code_chars, caps.code_tokens
    return caps.report_chars, caps.report_tokens


def excerpt_paths(root: Path, deliverables, caps: Caps = Caps()) -> list[tuple[str, int | None, int | None]]:
    """(path, char cap, token cap) of the files excerpted, in the order shown."""
    picked: dict[str, tuple[int | None, int | None]] = {}

    def add(rel: str, limits=None) -> None:
        p = root / rel
        if rel not in picked and _is_file(p) and p.suffix.lower() in TEXT_SUFFIXES | {""}:
            picked[rel] = limits or _kind_caps(rel, caps)

    for rel in deliverables:
        add(rel)
    report = next((r for r in REPORT_NAMES if _is_file(root / r)), None)
    if report:
        add(report)
    for rel in PRIORITY_FILES:
        add(rel)
    scripts = sorted({p.relative_to(root).as_posix() for pat in ENTRY_PATTERNS for p in root.glob(pat) if _is_file(p)})
    for rel in scripts[: caps.code_files]:
        add(rel, (caps.code_chars, caps.code_tokens))
    tests = sorted(p for p in (root / "tests").glob("test_*.py") if _is_file(p)) if _is_dir(root / "tests") else []
    if tests:
        cap = lambda c: None if c is None else min(TEST_CAP, c)  # noqa: E731
        add(tests[0].relative_to(root).as_posix(), (cap(caps.code_chars), cap(caps.code_tokens)))
    return [(rel, c, t) for rel, (c, t) in picked.items()]


def bundle(
    workspace: Path, task_text: str = "", deliverables=(), status: dict | None = None, caps: Caps = Caps()
) -> str:
    """The evidence of one workspace (deterministic for the same files)."""
    root = Path(workspace)
    sections: list[str] = []
    if status and status.get("outcome") not in (None, "success"):
        sections.append(
            f"RUN NOTICE: the episode ended with outcome {status.get('outcome')!r}: {status.get('reason', '')}"
        )
    sections += ["FILE TREE (representative):\n" + file_tree(root, caps), preflight(root, task_text, deliverables)]
    shown = []
    for rel, max_chars, max_tokens in excerpt_paths(root, deliverables, caps) if _is_dir(root) else []:
        try:
            text, cut = excerpt(
                _read(
                    root / rel, max_chars if max_tokens is None else min(max_chars or 4 * max_tokens, 4 * max_tokens)
                ),
                max_chars,
                max_tokens,
            )
        except OSError:
            continue
        shown.append(f"FILE {rel}{' [truncated]' if cut else ''}:\n{text}")
    sections.append(
        "FILE EXCERPTS (size-capped; binaries omitted):" + ("\n\n" + "\n\n".join(shown) if shown else " none")
    )
    return "\n\n".join(sections)


def results_appendix(workspace: Path, per_file_chars: int | None = 24_000, total_chars: int | None = 120_000) -> str:
    """Every results/**/*.json (but the per-record dumps), each head+tail cut, under a total budget."""
    results = Path(workspace) / "results"
    if not _is_dir(results):
        return "results/ is missing."
    paths = sorted(
        p
        for p in results.rglob("*.json")
        if _is_file(p)
        and p.name not in RESULTS_EXCLUDED
        and not any(part.startswith(".") for part in p.relative_to(results).parts)
    )
    if not paths:
        return "No JSON files under results/."
    blocks, used, omitted = [], 0, []
    for p in paths:
        rel = p.relative_to(workspace).as_posix()
        try:
            body = _read(p, per_file_chars)
        except OSError as exc:
            body = f"<unreadable: {type(exc).__name__}>"
        cut = per_file_chars is not None and len(body) > per_file_chars
        if cut:
            body = head_tail(body, per_file_chars)
        if total_chars is not None and used + len(body) > total_chars:
            omitted.append(rel)
            continue
        used += len(body)
        blocks.append(f"FILE {rel}{' [truncated]' if cut else ''}:\n{body}")
    if omitted:
        blocks.append("Omitted, over the appendix budget: " + ", ".join(omitted))
    return "\n\n".join(blocks)


def fit_tokens(text: str, max_tokens: int, what: str = "evidence") -> str:
    """`text` cut (head and tail kept) to at most max_tokens estimated tokens, the cut said in the text."""
    if count_tokens(text) <= max_tokens:
        return text
    note = f"\n\n[... {what} cut to fit the served context ...]\n\n"
    keep = max(0, 4 * max_tokens - len(note))
    half = keep // 2
    return text[:half] + note + text[len(text) - (keep - half) :] if keep else note.strip()
