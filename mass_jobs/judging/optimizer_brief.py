"""The optimizer's request: what the paper's code shows its optimizer, in this project's words.

Sections of the user message, in order:
  1. the task; the current workflow (the version just rolled out); the previous best workflow when
     it is older, with why it is shown; the original workflow v0 as the root of the track;
  2. the current version's workspace evidence (`mass_jobs.judging.evidence`, results/*.json appended);
  2b. execution metadata: the episode status, the last tool calls before a failed episode ended,
      the earlier versions' failures, and a notice telling how to treat them;
  3. the verdict history (against the bare reference under search.selection champion, against the
     elite under elite): a scoreboard, then per verdict its rationale, the action items it names and
     the workflow change behind it (a unified diff, fuller for the three most recent);
  3b. the issues the rationales keep naming, counted;
  4. the instructions and the reply contract: the workflow JSON, or under `search.workflow_format:
     upstream` the paper's reply (a whole replacement design block, with its explanation lists), the
     versions shown as their design blocks and the task's rules after the block shown apart.
`build` fits the request to the served context by cutting the evidence (results appendix first,
then the workspace view) and refuses, naming the spec fields, when the rest alone does not fit.
Pure: `steps/search.py` gathers the inputs from the store.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass, field

from mass_jobs.judging.evidence import count_tokens, fit_tokens
from mass_jobs.spec.upstream_format import UPSTREAM_MARKER

SYSTEM = """You are a principal prompt engineer for teams of autonomous coding agents. A team (one orchestrator that
delegates to workers, all the same model) executed the task below by following a workflow appended to its
prompt. Improve only that workflow, so that the task's deliverables get better.
Favour what a team can do and a single agent cannot: parallel specialist decomposition, cross-agent critique,
agent-to-agent communication and iterative reconciliation. Two improvements come first: (1) stronger output
contracts, saying exactly what each worker returns to the orchestrator; (2) more orchestrator-worker hops, with
explicit recall and narrowed re-delegation instead of one pass in one direction.
Ground every change in concrete evidence from the submission's files and the verdict history.
Reply with one JSON object and nothing else:
{"agents": [{"id": "orchestrator", "role": "...", "instruction": "...", "contract": "..."}, ...],
 "hops": [{"caller": "orchestrator", "callee": "...", "returns": "...", "on_failure": "<agent id or null>"}]}
Agent ids are lowercase letters, digits and dashes; the first agent is the orchestrator."""

# the same request when a version is a free-text design block inside the task text (the paper's reply)
UPSTREAM_SYSTEM = (
    SYSTEM.split("Reply with one JSON object", 1)[0].replace(
        "a workflow appended to its\nprompt", "a workflow (the design block) written into its\nprompt"
    )
    + f"""Reply with one JSON object and nothing else:
{{"improved_multi_agent_design": "<the whole replacement design block>",
 "changes_from_previous": ["..."], "why_it_should_improve": ["..."], "evidence_used": ["..."],
 "expected_impact": ["..."], "verification_checks": ["..."]}}
The design block starts with "{UPSTREAM_MARKER}" and holds the agent list and whatever
the team must follow; it never repeats the task or the rules after it."""
)

CUES = (
    "fail",
    "missing",
    "inconsistent",
    "mismatch",
    "not ",
    "lack",
    "weak",
    "nan",
    "null",
    "error",
    "defect",
    "reproducib",
)
ISSUES = (
    ("report and metrics disagree", r"inconsistent|mismatch|contradict|does not match|conflict"),
    ("missing deliverables or sections", r"missing|absent|not found|not present"),
    ("stability or robustness gap", r"stability|robustness|subperiod"),
    ("null or NaN values", r"\bnan\b|null|\bnone\b|non-standard json"),
    ("reproducibility gap", r"reproducib|cannot reproduce|requirements|\bpin"),
    ("validation or test weakness", r"validation|\btest|insufficient evidence|not proven|unclear"),
)
RESULTS_HEAD = "FULL JSON RESULTS (results/*.json):"
RATIONALE_CHARS = 2400
BEST_RATIONALE_CHARS = 2000
DIFF_RECENT, DIFF_RECENT_CHARS, DIFF_OLD_CHARS = 3, 1500, 400


class BriefTooLong(ValueError):
    pass


@dataclass(frozen=True)
class Row:
    """One verdict on version `version` against `against` ('the bare reference' or 'v<j>')."""

    version: int
    against: str
    outcome: str  # win / loss / tie / invalid, for the version
    rationale: str = ""
    model: str | None = None


@dataclass(frozen=True)
class BriefInput:
    task: str
    current: int
    designs: dict[int, dict]  # version -> workflow JSON, every version rolled out so far
    rows: list[Row]
    evidence: str
    results: str = ""
    status: dict | None = None
    last_calls: list[dict] = field(default_factory=list)
    prior_failures: list[dict] = field(default_factory=list)
    best: int | None = None  # the previous best version, when older than the current and proven
    best_case: str = "preferred"  # preferred / best_only_won / both_won
    best_rationale: str = ""
    against_reference: bool = True
    champion: int | None = None  # starred on the scoreboard (a proven best)
    workflow_format: str = "structured"  # "upstream": versions are {"design": block}
    rules: str = ""  # upstream: the task's rules after the design block, as written


def shown(wf: dict) -> str:
    """A version as the optimizer reads it: the design block, or the workflow JSON."""
    return wf["design"] if "design" in wf else json.dumps(wf, indent=1)


def shorten(text: str, limit: int) -> str:
    t = " ".join(text.split())
    return t if len(t) <= limit else t[: limit - 3].rstrip() + "..."


def action_items(rationale: str, limit: int = 6) -> list[str]:
    """The rationale's sentences that name a defect (cue words), first `limit`, no repeats."""
    out: list[str] = []
    for s in re.split(r"(?<=[.!?])\s+", " ".join(rationale.split())):
        if s and s not in out and any(c in s.lower() for c in CUES):
            out.append(s)
            if len(out) == limit:
                break
    return out


def recurring_issues(rationales: list[str]) -> str:
    counts = {name: 0 for name, _ in ISSUES}
    example: dict[str, str] = {}
    for r in rationales:
        low = r.lower()
        for name, pattern in ISSUES:
            if re.search(pattern, low):
                counts[name] += 1
                items = action_items(r, 1)
                if items and name not in example:
                    example[name] = items[0]
    ranked = sorted(((n, c) for n, c in counts.items() if c), key=lambda x: -x[1])
    if not ranked:
        return "- No issue recurs in the verdicts yet."
    lines = ["- Fix first what recurs most (count of verdicts naming it):"]
    lines += [f"- [{c}x] {n}" + (f": e.g. {example[n]}" if n in example else "") for n, c in ranked]
    return "\n".join(lines)


def _design_text(wf: dict) -> list[str]:
    return shown(wf).splitlines()


def design_diff(older: dict, newer: dict, a: int, b: int, limit: int) -> str:
    lines = list(difflib.unified_diff(_design_text(older), _design_text(newer), f"v{a}", f"v{b}", lineterm="", n=1))
    text = "\n".join(lines).strip() or "(the workflows are identical)"
    return text if len(text) <= limit else text[: limit - 4].rstrip() + "\n..."


def scoreboard(rows: list[Row], current: int, champion: int | None) -> str:
    marks = {"win": "W", "loss": "L", "tie": "T", "invalid": "?"}
    verdicts = {r.version: r.outcome for r in rows if r.against == "the bare reference"}
    parts = [f"v{k} {marks.get(verdicts.get(k, ''), '-')}{'*' if k == champion else ''}" for k in range(current + 1)]
    return "Record against the bare reference: " + " . ".join(parts)


def _history(inp: BriefInput) -> str:
    if not inp.rows:
        return "- No verdicts yet."
    diffs: dict[int, str] = {}
    versions = sorted({r.version for r in inp.rows if r.version >= 1}, reverse=True)
    for rank, v in enumerate(versions):
        earlier = [k for k in inp.designs if k < v]
        if earlier and v in inp.designs:
            prev = max(earlier)
            limit = DIFF_RECENT_CHARS if rank < DIFF_RECENT else DIFF_OLD_CHARS
            diffs[v] = design_diff(inp.designs[prev], inp.designs[v], prev, v, limit)
    lines: list[str] = []
    if inp.against_reference:
        lines += [scoreboard(inp.rows, inp.current, inp.champion)]
        if inp.champion is not None:
            lines.append(
                "* = the best version so far: it beat the reference, and won every direct verdict against "
                "later versions that beat it too."
            )
        lines.append(
            "Each entry judges that version's workspace against the same fixed bare reference: the task run "
            "by one agent with no workflow. The diff shows what changed in the workflow before the verdict. "
            "One verdict is one judgement: trust trends over single flips."
        )
        lines.append("")
    for r in inp.rows:
        lines.append(f"- v{r.version} against {r.against}: {r.outcome}" + (f" (judge: {r.model})" if r.model else ""))
        if r.rationale:
            lines.append(f"  - Rationale (excerpt): {shorten(r.rationale, RATIONALE_CHARS)}")
        items = action_items(r.rationale)
        if items:
            lines.append("  - Action items for the next version:")
            lines += [f"    - {i}" for i in items]
        if r.version in diffs:
            lines.append("  - Workflow change before this verdict ('-' removed, '+' added):")
            lines += [f"    {d}" for d in diffs.pop(r.version).splitlines()]
        lines.append("  - Keep what won, fix what the verdict names.")
    return "\n".join(lines)


def _execution(inp: BriefInput) -> str:
    if inp.status is None:
        return "- No execution metadata was recorded."
    # no timings: the request must be the same whichever executor ran the episode (and a rerun's)
    meta = {k: inp.status.get(k) for k in ("outcome", "reason", "harness", "counts", "tokens") if k in inp.status}
    if inp.last_calls:
        meta["last_tool_calls_most_recent_first"] = inp.last_calls
    if inp.prior_failures:
        meta["prior_failures"] = inp.prior_failures
    text = json.dumps(meta, indent=2, ensure_ascii=False, sort_keys=True)
    failed = inp.status.get("outcome") != "success"
    if failed:
        text += (
            "\n\nFAILURE NOTICE: this episode ended before a successful result (see `outcome` and `reason`; "
            "`last_tool_calls_most_recent_first` shows what the agents were doing when it ended). Treat the "
            "failure as first-order evidence and pursue two goals together: (1) make the next run finish, "
            "aimed at the pattern shown: give each worker's contract explicit completion and acceptance "
            "criteria so it returns a definite result instead of repeating equivalent tool calls; add "
            "orchestrator progress checks with recovery hops that send a stalled worker a narrower scope; "
            "say in shared rules how an agent detects and breaks a repeated call pattern (after re-reading "
            "the same file or re-running the same command with nothing new, change strategy or report the "
            "blocker to the orchestrator). (2) Still improve the hops, contracts, roles and instructions for "
            "the quality of the deliverables. Do not reach (1) by numeric caps on agents, hops, tool calls, "
            "turns or time, and do not collapse the team toward one agent: use acceptance gates, explicit "
            "fallbacks and re-delegation."
        )
        if inp.prior_failures:
            text += (
                "\nRECURRING FAILURE: `prior_failures` shows earlier versions of this task failed too; the "
                "counter-measures written so far did not change how the team executes. Compare the failures "
                "and change the approach materially (restructure so the stall cannot arise, e.g. size long "
                "operations to finish within one tool call, or demand a change of strategy after any repeated "
                "result) rather than restating similar rules."
            )
    elif inp.prior_failures:
        text += (
            "\n\nRESOLVED FAILURES: earlier versions of this task failed (`prior_failures`) and the current one "
            "finished. Find which provisions of the current workflow plausibly fixed it and keep them; do not "
            "weaken protections that now work. Otherwise keep improving hops, contracts, roles and instructions."
        )
    return text


def _best_note(inp: BriefInput) -> str:
    b, c = inp.best, inp.current
    why = shorten(inp.best_rationale, BEST_RATIONALE_CHARS) if inp.best_rationale else ""
    if why and why[-1] not in ".!?\"'":
        why += "."
    if inp.best_case == "best_only_won":
        lead = (
            f"It is shown because v{b} beat the bare reference and the current v{c} did not (see the record in "
            f"section 3)."
        ) + (f" The judge's reasons for the reference's win over v{c}: {why}" if why else "")
    elif inp.best_case == "both_won":
        lead = (
            f"Both v{b} and the current v{c} beat the bare reference; judged directly against each other, v{b}'s "
            f"deliverables were better."
        ) + (f" The judge's reasons: {why}" if why else "")
    else:
        lead = f"It is shown because the judge preferred its deliverables over the current v{c}'s." + (
            f" The judge's reasons: {why}" if why else ""
        )
    return (
        f"NOTE: {lead} Write v{c + 1} from both v{b} and v{c}: keep what made v{b} strong and merge in only the "
        f"changes since that genuinely helped."
    )


def _instructions(inp: BriefInput) -> str:
    c, n = inp.current, inp.current + 1
    goal = (
        f" The goal is deliverables that clearly beat the bare reference (section 3), not merely better than v{c}'s."
        if inp.against_reference
        else ""
    )
    if inp.best is not None:
        lead = (
            f"Write workflow v{n} combining the strengths of the previous best v{inp.best} and the current v{c}.{goal}"
        )
    else:
        lead = f"Improve the workflow from v{c} to v{n}, so the team gains real advantages over a single agent.{goal}"
    return "\n".join(
        [
            lead,
            "Keep the task's intent and required deliverables; fix the weaknesses the evidence shows.",
            "Strengthen every worker's contract (what it returns to the orchestrator) so the next agent can consume it.",
            "Add orchestrator-worker feedback loops: let the orchestrator recall a worker it called before with a "
            "narrower follow-up and updated acceptance criteria.",
            "Above all, prefer changes that give the team what one agent lacks: specialist parallelism, cross-agent "
            "checking, agent-to-agent communication, conflict resolution loops.",
            "Be specific: cite files, metrics and verdicts from the evidence; explain the mechanism of each change and "
            "its expected effect rather than general claims.",
            "Change only the workflow, not the task.",
            f"Propose workflow v{n}: one JSON object with its agents and hops, nothing else."
            if inp.workflow_format != "upstream"
            else f"Propose workflow v{n}: the JSON object of the reply contract; its improved_multi_agent_design starts "
            f"with '{UPSTREAM_MARKER}' and holds the whole block.",
        ]
    )


def sections(inp: BriefInput, evidence: str, results: str) -> list[str]:
    cur = shown(inp.designs[inp.current])
    out = ["1. THE TASK AND ITS WORKFLOWS", f"TASK:\n{inp.task}", f"CURRENT WORKFLOW (v{inp.current}):\n{cur}"]
    if inp.best is not None:
        out.append(f"PREVIOUS BEST WORKFLOW (v{inp.best}):\n{_best_note(inp)}\n{shown(inp.designs[inp.best])}")
    if inp.current >= 1 and inp.best != 0 and 0 in inp.designs:
        out.append(
            "ORIGINAL WORKFLOW (v0, where the track started):\nNOTE: the root of the versions whose changes "
            "the history below shows; use it to follow how the workflow evolved and to notice drift from its "
            "intent. The current and best workflows supersede it: do not revert to it wholesale.\n"
            + shown(inp.designs[0])
        )
    if inp.workflow_format == "upstream" and inp.rules:
        out.append(f"RULES AFTER THE DESIGN BLOCK (part of the task, kept as they are):\n{inp.rules}")
    out += [f"2. EVIDENCE: THE CURRENT VERSION'S WORKSPACE (v{inp.current})\n{evidence}"]
    if results:
        out.append(f"{RESULTS_HEAD}\n{results}")
    out += [
        f"2b. EXECUTION METADATA\n{_execution(inp)}",
        ("3. VERDICTS AGAINST THE BARE REFERENCE" if inp.against_reference else "3. VERDICTS AGAINST THE BEST VERSION")
        + "\n"
        + _history(inp),
        "3b. RECURRING ISSUES\n" + recurring_issues([r.rationale for r in inp.rows if r.rationale]),
        "4. INSTRUCTIONS\n" + _instructions(inp),
    ]
    return out


def build(inp: BriefInput, budget_tokens: int | None = None) -> tuple[list[dict], dict]:
    """(messages, info): info says the estimated tokens and what was cut to fit `budget_tokens`."""

    def render(evidence: str, results: str) -> str:
        return "\n\n".join(sections(inp, evidence, results))

    system = UPSTREAM_SYSTEM if inp.workflow_format == "upstream" else SYSTEM

    def total(user: str) -> int:
        return count_tokens(system) + count_tokens(user)

    evidence, results, cut = inp.evidence, inp.results, []
    user = render(evidence, results)
    if budget_tokens is not None and total(user) > budget_tokens:
        fixed = total(render("", "")) + count_tokens(RESULTS_HEAD) + 1
        room = budget_tokens - fixed - 8  # each part's estimate rounds up by under one token
        if room < 64:
            raise BriefTooLong(
                f"the optimizer's request without evidence takes about {fixed} tokens, over the "
                f"{budget_tokens} that model.sampling.context_length less max_output_tokens and "
                "search.evidence.safety_tokens leave"
            )
        if results and count_tokens(evidence) + 64 < room:
            results, cut = fit_tokens(results, room - count_tokens(evidence), "results appendix"), ["results"]
        else:
            results, cut = "", ["results", "evidence"]
            evidence = fit_tokens(evidence, room, "workspace evidence")
        user = render(evidence, results)
    info = {"tokens": total(user), "budget_tokens": budget_tokens, "cut": cut}
    return [{"role": "system", "content": system}, {"role": "user", "content": user}], info
