"""The run report rendered for people: report.md (opening with how to read it) and its plots,
each showing its n, from the report document alone."""

from __future__ import annotations

from typing import Any

from mass_jobs.episodes.harness import CAPS, OUTCOMES

PLOTS = ("win_share.png", "search.png", "loss.png", "audit.png", "tokens.png", "information.png")
# What each plot shows, in the words a finished run prints beside its path.
CAPTIONS = {
    "win_share.png": "the panel's win share per generation, with 95% intervals",
    "search.png": "workflow search: tasks whose elite beats the reference, per iteration",
    "loss.png": "training and validation loss per generation",
    "audit.png": "delegation and code handoff per generation",
    "tokens.png": "tokens per episode by role",
    "information.png": "what the panel's verdicts can tell apart",
}


def win_share_summary(doc: dict) -> str:
    """The win-share plot in one line: each comparison of all tasks with its interval and n."""
    parts = []
    for w in doc.get("win_share") or []:
        if w.get("split") != "all" or w.get("win_share") is None:
            continue
        lo, hi = w.get("ci") or (None, None)
        ci = f" [{lo:.0%}, {hi:.0%}]" if lo is not None else ""
        bias = " (position-biased)" if w.get("note") else ""
        parts.append(
            f"L{w['candidate']} vs L{w['baseline']} {w['win_share']:.0%}{ci}, n={w['wins'] + w['losses']}{bias}"
        )
    return "; ".join(parts) or "no decisive panel verdict"


def fmt(x: Any, pct: bool = False) -> str:
    if x is None:
        return "–"
    if pct:
        return f"{100 * x:.1f}%"
    return f"{x:,}" if isinstance(x, int) else f"{x:.4g}"


def _ci(ci) -> str:
    return "–" if not ci else f"[{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]"


def _by_role(counts: dict | None) -> str:
    return ", ".join(f"{role} {n:,}" for role, n in (counts or {}).items()) or "-"


def render_markdown(doc: dict) -> str:
    """report.md: its sections in order, then the plots."""
    sections = (
        _head_and_win_share,
        _verdicts_and_agreement,
        _audit_and_tokens,
        _outcomes,
        _data_search_training,
        _left_out,
        _composition_roles_information,
    )
    lines = [line for section in sections for line in section(doc)]
    lines += ["", "Plots: " + ", ".join(f"![{p}]({p})" for p in PLOTS), ""]
    return "\n".join(lines)


def _head_and_win_share(doc: dict) -> list[str]:
    """The title, warnings, how to read it, and the panel's win share per comparison and task."""
    warnings = doc.get("warnings") or []
    lines = [
        f"# MASS run `{doc['run']}`",
        "",
        *(["## Warnings", "", *[f"- **{w}**" for w in warnings], ""] if warnings else []),
        "## How to read this",
        "",
        *[f"- {line}" for line in doc["how_to_read"]],
        "",
        f"Generations: {doc['generations']} (evaluated: {', '.join(f'L{g}' for g in doc['evaluated']) or 'none'}). "
        f"Train tasks: {', '.join(doc['tasks']['train']) or '–'}; test tasks: {', '.join(doc['tasks']['test']) or '–'}.",
        f"Judges: {', '.join(j['name'] + ' (' + j['model'] + ', seeds ' + str(j['seeds']) + ')' for j in doc['judges']) or 'none'}.",
        "",
        "## Win share (panel)",
        "",
        f"wins / (wins + losses), ties and invalid verdicts excluded. {int(100 * doc['confidence'])}% intervals: "
        f"per task {doc['intervals']['per_task']}; overall {doc['intervals']['overall']}.",
        "",
        "| comparison | split | wins | losses | ties | invalid | win share | CI | note |",
        "|---|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for w in doc["win_share"]:
        pos, n = w["positions"], w["positions"]["A"] + w["positions"]["B"]
        note = f"position bias: {n}/{n} chose {'A' if pos['A'] else 'B'}" if w["note"] else ""
        lines.append(
            f"| L{w['candidate']} vs L{w['baseline']} | {w['split']} | {w['wins']} | {w['losses']} | {w['ties']} "
            f"| {w['invalid']} | {fmt(w['win_share'], True)} | {_ci(w['ci'])} | {note} |"
        )
    if any(w["note"] for w in doc["win_share"]):
        lines += [
            "",
            "Position bias: every decisive verdict of the comparison chose the same blind label although "
            "the pairs were shown in both orders, so its win share measures the judge's order preference, "
            "not the workspaces.",
        ]
    lines += [
        "",
        "### Per task",
        "",
        "| comparison | task | wins | losses | ties | invalid | win share | Wilson CI |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for w in doc["win_share"]:
        if w["split"] != "all":
            continue
        for task, t in w["per_task"].items():
            lines.append(
                f"| L{w['candidate']} vs L{w['baseline']} | {task} | {t['wins']} | {t['losses']} | {t['ties']} "
                f"| {t['invalid']} | {fmt(t['win_share'], True)} | {_ci(t['ci'])} |"
            )
    return lines


def _verdicts_and_agreement(doc: dict) -> list[str]:
    """Verdict counts and the self-evaluator's agreement with the panel majority."""
    lines: list[str] = []
    v = doc["verdicts"]
    lines += [
        "",
        f"Verdicts: panel {v['panel']['total']} ({v['panel']['invalid']} invalid), "
        f"self-evaluator {v['self']['total']} ({v['self']['invalid']} invalid), ranking "
        f"{v.get('rank', {}).get('total', 0)} ({v.get('rank', {}).get('invalid', 0)} invalid: left out of the "
        "Bradley-Terry fit).",
        "",
        "## Evaluator agreement with the panel majority",
        "",
        "A pair counts when the self-evaluator gave a valid verdict and more than half of the panel's valid "
        "verdicts made the same call; a split panel is 'no majority', neither agreement nor disagreement.",
        "",
        "| evaluator | agree | pairs with a majority | no majority | rate |",
        "|---|---:|---:|---:|---:|",
    ]
    for a in doc["agreement"]:
        rate = fmt(a["rate"], True) if a["pairs"] else f"no majority: {a['no_majority']}" if a["no_majority"] else "–"
        lines.append(f"| L{a['evaluator']} | {a['agree']} | {a['pairs']} | {a['no_majority']} | {rate} |")
    return lines


def _audit_and_tokens(doc: dict) -> list[str]:
    """The behaviour audit of bare-prompt runs and the token accounting."""
    lines: list[str] = []
    lines += [
        "",
        "## Behaviour audit (bare-prompt runs)",
        "",
        "Task score: the deterministic grader's share of checks passed (each deliverable exists, each expected "
        "file is correct), averaged over graded episodes; solved: every check passed.",
        "",
        "| generation | split | episodes | delegation D | code handoff H | task score | solved |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for a in doc["audit"]:
        lines.append(
            f"| L{a['generation']} | {a['split']} | {a['episodes']} | {a['delegation']}/{a['episodes']} "
            f"| {a['code_handoff']}/{a['episodes']} | {fmt(a.get('task_score'), True)} "
            f"| {a.get('solved', 0)}/{a.get('graded', 0)} |"
        )
    lines += [
        "",
        "## Tokens",
        "",
        "| generation | episodes | generated (search / collect / eval) | stored supervised "
        "| processed to selected | processed to end |",
        "|---|---:|---|---:|---:|---:|",
    ]
    for t in doc["tokens"]:
        lines.append(
            f"| L{t['generation']} | {t['generated_episodes']} | {fmt(t['generated_total'])} "
            f"({fmt(t['generated_search'])} / "
            f"{fmt(t['generated_collect'])} / {fmt(t['generated_eval'])}) | {fmt(t['stored_supervised'])} "
            f"| {fmt(t['processed_to_selected'])} | {fmt(t['processed_to_end'])} |"
        )
    if len(doc["tokens"]) > 1:  # the run's own accounting: every generation together

        def total(k: str):
            values = [t[k] for t in doc["tokens"]]
            return sum(v or 0 for v in values) if any(v is not None for v in values) else None

        lines.append(
            f"| run | {total('generated_episodes')} | {fmt(total('generated_total'))} "
            f"({fmt(total('generated_search'))} / {fmt(total('generated_collect'))} / "
            f"{fmt(total('generated_eval'))}) | {fmt(total('stored_supervised'))} "
            f"| {fmt(total('processed_to_selected'))} | {fmt(total('processed_to_end'))} |"
        )
    return lines


def _outcomes(doc: dict) -> list[str]:
    """Episode outcomes, caps reached and the shell commands' network."""
    lines: list[str] = []
    if doc.get("outcomes"):
        names = [o for o in OUTCOMES if any(x["by_outcome"].get(o) for x in doc["outcomes"])] or ["success"]
        lines += [
            "",
            "## Episode outcomes",
            "",
            "no_work: finished without a workspace tool call (not ranked or trained on unless "
            "`collection.keep_no_work`).",
            "",
            "| generation | stage | episodes | tool calls / episode | " + " | ".join(names) + " |",
            "|---|---|---:|---:|" + "---:|" * len(names),
        ]
        for x in doc["outcomes"]:
            lines.append(
                f"| L{x['generation']} | {x['stage']} | {x['episodes']} | {fmt(x.get('tool_calls_per_episode'))} | "
                + " | ".join(str(x["by_outcome"].get(o, 0)) for o in names)
                + " |"
            )
        lines += [
            "",
            "Episodes ended by a cap of `execution.limits`:",
            "",
            "| generation | stage | " + " | ".join(CAPS) + " |",
            "|---|---|" + "---:|" * len(CAPS),
        ]
        lines += [
            f"| L{x['generation']} | {x['stage']} | "
            + " | ".join(str(x.get("by_cap", {}).get(c, 0)) for c in CAPS)
            + " |"
            for x in doc["outcomes"]
        ]
        online = [x for x in doc["outcomes"] if x.get("network")]
        if online:
            lines += [
                "",
                "Network of the shell commands (`execution.network`, every request in the episode's `network.jsonl`):",
                "",
                "| generation | stage | episodes | requests | allowed | denied | bytes in | hosts |",
                "|---|---|---:|---:|---:|---:|---:|---|",
            ]
            lines += [
                f"| L{x['generation']} | {x['stage']} | {n['episodes']} | {n['requests']} | {n['allowed']} "
                f"| {n['denied']} | {n['bytes_down']} | {', '.join(n['hosts'][:8]) or '-'} |"
                for x in online
                for n in [x["network"]]
            ]
    return lines


def _data_search_training(doc: dict) -> list[str]:
    """SFT data, workflow search coverage and training."""
    lines: list[str] = []
    if doc["sft"]:
        lines += [
            "",
            "## SFT data",
            "",
            "| generation | episodes | episode errors | episodes dropped | orchestrator windows "
            "| windows by role | supervised tokens by role |",
            "|---|---:|---:|---:|---:|---|---|",
        ]
        lines += [
            f"| L{d['generation']} | {d['episodes']} | {d['episode_errors']} | {d['episodes_dropped']} "
            f"| {d['orchestrator_windows']} | {_by_role(d.get('windows_by_role'))} "
            f"| {_by_role(d.get('supervised_by_role'))} |"
            for d in doc["sft"]
        ]
    lines += [
        "",
        "## Workflow search",
        "",
        "| generation | tasks | elite beats reference after iteration k |",
        "|---|---:|---|",
    ]
    for s in doc["search"]:
        lines.append(f"| L{s['generation']} | {s['tasks']} | {' '.join(map(str, s['coverage']))} |")
    lines += [
        "",
        "## Training",
        "",
        "| generation | selected step | last train loss | best val loss |",
        "|---|---:|---:|---:|",
    ]
    for t in doc["training"]:
        last = t["train_loss"][-1][1] if t["train_loss"] else None
        best = min((x[1] for x in t["val_loss"]), default=None)
        by = " (panel)" if t.get("selected_by") == "panel" else ""
        lines.append(f"| L{t['generation']} | {fmt(t['selected_step'])}{by} | {fmt(last)} | {fmt(best)} |")
    return lines


def _left_out(doc: dict) -> list[str]:
    """Guard vetoes, episodes flagged for review and invalid panel verdicts."""
    lines: list[str] = []
    lines += ["", f"## Guard vetoes ({len(doc['guard_vetoes'])})", ""]
    if doc.get("guard_counts"):
        lines += ["| generation | guard | episodes left out |", "|---|---|---:|"]
        lines += [f"| L{c['generation']} | {c['guard']} | {c['episodes']} |" for c in doc["guard_counts"]] + [""]
    for x in doc["guard_vetoes"]:
        lines.append(f"- L{x['generation']} {x['task']} episode {x['episode']}: {'; '.join(x['reasons']) or 'vetoed'}")
    lines += [
        "",
        f"## Flagged for review ({len(doc.get('review', []))})",
        "",
        "Claims of a deliverable that no guard can verify (a number its metrics file contradicts); such "
        "an episode is not ranked or trained on unless its task's guards.train_flagged says so.",
        "",
    ]
    for x in doc.get("review", []):
        fate = (
            " (vetoed)"
            if x["vetoed"]
            else " (not trained)"
            if x.get("held")
            else " (trained: guards.train_flagged)"
            if x.get("trained")
            else ""
        )
        lines.append(f"- L{x['generation']} {x['task']} episode {x['episode']}{fate}: {'; '.join(x['claims'])}")
    lines += ["", f"## Invalid panel verdicts ({len(doc['invalid_verdicts'])})", ""]
    for x in doc["invalid_verdicts"]:
        why = x["errors"][-1] if x["errors"] else "no reason recorded"
        lines.append(
            f"- L{x['candidate']} vs L{x['baseline']} {x['task']} rep {x['replicate']} {x['judge']} "
            f"seed {x['seed']}: {why}"
        )
    return lines


def _composition_roles_information(doc: dict) -> list[str]:
    """The teacher's composition, the roles and the workflow information."""
    lines: list[str] = []
    comp = doc.get("composition") or {}
    if comp:
        lines += [
            "",
            "## Teacher composition",
            "",
            f"preset {comp['preset'] or '– (the spec fields)'}; teacher {comp['teacher']}; windows of "
            f"{', '.join(comp['window_roles'])} from {comp['training_episodes']} ranked episodes; orchestrator "
            f"share {comp['orchestrator_share']:.3f}; checkpoint by "
            f"{'the judge panel' if comp['checkpoint_selection'] == 'panel' else 'validation loss'}.",
        ]
    lines += ["", "## Roles", "", "| role | configured | recorded in proposals, verdicts, episodes |", "|---|---|---|"]
    lines += [f"| {r['role']} | {r['configured']} | {', '.join(r['recorded']) or '–'} |" for r in doc.get("roles", [])]
    lines += [
        "",
        "## Workflow information (Gaussian proxies)",
        "",
        "Search rollouts' workflow text, embedded locally, against their outcome (success) and verdict (won its "
        "comparison), in nats, computed as if jointly Gaussian: proxies of dependence, not exact information. "
        "'within': task means removed first.",
        "",
        "| generation | embedder | rollouts | tasks | dims | I(E;outcome) | I(E;verdict) | TC | dims within "
        "| I(E;outcome) within | I(E;verdict) within | TC within |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for x in doc.get("information", []):
        lines.append(
            f"| L{x['generation']} | {x['embedder']} | {x['samples']} | {x['tasks']} | "
            + " | ".join(
                fmt(x[k])
                for k in (
                    "dims",
                    "mi_outcome",
                    "mi_verdict",
                    "tc",
                    "dims_within",
                    "mi_outcome_within",
                    "mi_verdict_within",
                    "tc_within",
                )
            )
            + " |"
        )
    return lines
