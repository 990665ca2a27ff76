"""`mass audit EPISODE_DIR... [--json]`: behaviour audit (delegation D, code handoff H, revisions) per episode.

Reads each EPISODE_DIR/trace.jsonl only (see mass_jobs/episodes/audit.py for the definitions) and prints a
table with a total row, or one JSON document with `--json`. Exit 2 when a directory has no trace. A
trace whose records cannot be read is that episode's error: shown, counted as unreadable, not measured.
"""

from __future__ import annotations

import json
import sys

from mass_jobs.episodes.audit import audit_episode


def add_arguments(parser) -> None:
    parser.add_argument("episodes", nargs="+", metavar="EPISODE_DIR", help="episode output dirs (with trace.jsonl)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def main(args) -> int:

    audits = []
    for d in args.episodes:
        try:
            audits.append(audit_episode(d))
        except (FileNotFoundError, ValueError) as exc:
            print(f"mass audit: {exc}", file=sys.stderr)
            return 2
    n = len(audits)
    totals = {
        "episodes": n,
        "delegation": sum(a.delegation for a in audits),
        "code_handoff": sum(a.code_handoff for a in audits),
        "revised": sum(a.revisions > 0 for a in audits),
        "unreadable": sum(a.error is not None for a in audits),
    }
    for a in audits:
        if a.error:
            print(f"mass audit: {a.episode}: unreadable trace: {a.error}", file=sys.stderr)
    if args.json:
        print(json.dumps({"episodes": [a.to_dict() for a in audits], "totals": totals}, indent=2))
        return 0

    from rich.console import Console
    from rich.table import Table

    table = Table(title="Behaviour audit")
    for col in ("episode", "calls", "workers", "D", "delegations ok/failed", "H", "handoff files", "revisions"):
        table.add_column(col)
    for a in audits:
        table.add_row(
            a.episode,
            str(a.calls),
            str(a.workers),
            "unreadable" if a.error else "yes" if a.delegation else "no",
            f"{a.delegations_ok}/{a.delegations_failed}",
            "yes" if a.code_handoff else "no",
            ", ".join(sorted({h["file"] for h in a.handoffs})) or "-",
            f"{a.revisions} (re-delegated {a.redelegations}, rewrites {a.rewrites})",
        )
    table.add_section()
    table.add_row(
        "total",
        "",
        "",
        f"{totals['delegation']}/{n}" + (f" ({totals['unreadable']} unreadable)" if totals["unreadable"] else ""),
        "",
        f"{totals['code_handoff']}/{n}",
        "",
        f"{totals['revised']}/{n} episodes",
    )
    Console().print(table)
    return 0
