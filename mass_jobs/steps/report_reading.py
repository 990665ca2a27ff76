"""How to read the run report: what each number is and its n, and the warnings that say when a run's
numbers are not evidence (most episodes did no work, most verdicts unreadable, code run unsandboxed).
Functions of the report document alone."""

from __future__ import annotations


def trained_no_work(doc: dict, keep_no_work: bool) -> list[str]:
    """Under collection.keep_no_work, how many teacher episodes that did no work were ranked for training."""
    idle = [(o["generation"], o["by_outcome"].get("no_work", 0)) for o in doc["outcomes"] if o["stage"] == "collect"]
    if not keep_no_work or not any(n for _, n in idle):
        return []
    return [
        f"collection.keep_no_work is true: {sum(n for _, n in idle)} teacher episodes that did no work were "
        "ranked and trained on as successes (" + ", ".join(f"L{g} {n}" for g, n in idle if n) + ")"
    ]


def run_warnings(doc: dict) -> list[str]:
    """Each stage where most episodes did no work, each verdict set that is mostly invalid: such a
    run's numbers are not evidence, and what it trained on (under collection.keep_no_work) is not work."""
    out = []
    for o in doc["outcomes"]:
        idle = o["by_outcome"].get("no_work", 0)
        if 2 * idle > o["episodes"]:
            out.append(
                f"L{o['generation']} {o['stage']}: {idle} of {o['episodes']} episodes did no work (finished "
                f"without a workspace tool call; {o['tool_calls']} tool calls in all)"
            )
    ended = [(o, t, n) for o in doc["outcomes"] for t, n in (o.get("ended_by_pod") or {}).items()]
    if ended:
        out.append(
            f"{sum(n for _, _, n in ended)} episodes were ended by their agent pod, not their harness (a signal "
            "or exit-code file written in the pod, or an upload cut short): "
            + ", ".join(f"L{o['generation']} {o['stage']} {t} {n}" for o, t, n in ended)
        )
    bare = [o for o in doc["outcomes"] if o.get("unsandboxed")]
    if bare:
        out.append(
            f"execution.sandbox: none: {sum(o['unsandboxed'] for o in bare)} episodes ran model-written code "
            "without a sandbox, with this machine's filesystem and network ("
            + ", ".join(f"L{o['generation']} {o['stage']} {o['unsandboxed']}" for o in bare)
            + ")"
        )
    for who, v in doc["verdicts"].items():
        if v["total"] and 2 * v["invalid"] > v["total"]:
            name = "ranking self-verdicts" if who == "rank" else f"{who} verdicts"
            out.append(f"{name}: {v['invalid']} of {v['total']} invalid (the judge's answers could not be read)")
    return out


def how_to_read(doc: dict) -> list[str]:
    """The report's opening: what each number is, its n here, and which of them are noise at this n."""
    rows = [w for w in doc["win_share"] if w["split"] == "all"]
    open_ci = [w for w in rows if w["ci"] and w["ci"][0] <= 0.5 <= w["ci"][1]]
    undecided = [w for w in rows if not w["ci"]]
    biased = [w for w in rows if w["note"]]
    n_dec = sorted({w["wins"] + w["losses"] for w in rows})
    lines = [
        "Every number below is a count over a small sample and says its n; at this scale one verdict or one "
        "episode moves a rate by 1/n, so read the counts before the percentages.",
        "Win share is the candidate's wins / (wins + losses) by the judge panel; 50% is no difference. "
        + (
            f"{len(open_ci)} of {len(rows)} comparisons (all tasks, n = {', '.join(map(str, n_dec))} decisive "
            f"verdicts) have an interval that contains 50%: those are indistinguishable from noise."
            + (f" {len(undecided)} have no decisive verdict at all." if undecided else "")
            if rows
            else "No comparison has been judged yet."
        ),
    ]
    if biased:
        lines.append(
            f"{len(biased)} of {len(rows)} comparisons have a judge that chose the same position in every "
            "decisive verdict (position-bias note): over position-balanced pairs their win share is 50% "
            "by construction and measures the judge, not the generations."
        )
    no_maj = sum(a["no_majority"] for a in doc["agreement"])
    counted = sum(a["pairs"] for a in doc["agreement"])
    lines.append(
        "Evaluator agreement counts only pairs on which the panel has a majority "
        f"({counted} here); {no_maj} pairs had no majority and are reported as such, "
        "neither agreement nor disagreement."
    )
    episodes = sorted({a["episodes"] for a in doc["audit"] if a["split"] == "all"})
    lines.append(
        "Delegation D and code handoff H count bare-prompt episodes "
        f"(n = {', '.join(map(str, episodes)) or '0'} per generation); a difference of one or two "
        "episodes between generations is within sampling noise at this n."
    )
    graded = sorted({a.get("graded", 0) for a in doc["audit"] if a["split"] == "all"})
    if any(graded):
        lines.append(
            "Task score is a deterministic grader (each deliverable exists, each expected file is correct), "
            f"no judge involved (n = {', '.join(map(str, graded))} graded episodes per generation): it moves "
            "only when workspaces change, so beside a noisy win share it says whether work got done."
        )
    lines.append(
        "Training loss of a small model over few steps shows that optimisation ran, not that the next "
        "generation is better; the win share and the audit are the evidence for that."
    )
    return lines
