"""Judging and measuring workspaces: what a judge sees (`evidence`, `optimizer_brief`), blind pairwise
verdicts (`compare`, `judges`), the ranking (`pairing`, `bradley_terry`), deterministic scores and
vetoes (`grade`, `claims`, `directives`) and the report's numbers (`metrics`, `information`, `embed`)."""
