"""`mass compare-runs SPEC_A SPEC_B [...] --out DIR`: runs side by side (teacher composition, windows by
role, generated / stored / processed tokens, win share vs L0) from their stores; writes
DIR/compare.json and DIR/compare.md (see mass_jobs.tools.analysis.composition) and prints the Markdown."""

from __future__ import annotations

from mass_jobs.commands.common import never_ran, open_run
from mass_jobs.spec.load import SpecError, SpecIssue
from mass_jobs.tools.analysis.composition import compare_runs, render_comparison


def add_arguments(parser) -> None:
    parser.add_argument("specs", nargs="+", metavar="SPEC", help="run specs (paths or s3:// URIs), two or more")
    parser.add_argument("--out", required=True, help="directory for compare.json and compare.md")


def main(args) -> int:
    import json
    from pathlib import Path

    if len(args.specs) < 2:
        raise SpecError(
            "compare-runs",
            [SpecIssue("SPEC", f"expected two or more run specs, found {len(args.specs)}")],
            what="arguments",
        )
    import sys

    contexts = [open_run(s) for s in args.specs]
    empty = [why for c in contexts if (why := never_ran(c))]
    if empty:
        for why in empty:
            print(f"mass compare-runs: {why}", file=sys.stderr)
        return 1
    names = [c.run for c in contexts]
    if len(set(names)) != len(names):
        raise SpecError(
            "compare-runs", [SpecIssue("SPEC", f"expected runs with distinct names, found {names}")], what="arguments"
        )
    doc = compare_runs(contexts)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare.json").write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    md = render_comparison(doc)
    (out / "compare.md").write_text(md)
    print(md, end="")
    return 0
