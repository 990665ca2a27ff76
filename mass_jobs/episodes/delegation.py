"""Which tool hands work to a sub-agent in each harness: the one table threads are classified by.

The behaviour audit (delegation D, who is a worker) and the render step (which thread is the
orchestrator whose teacher prompt is stripped) both read it, so a harness added to
`mass_jobs.episodes.harness.HARNESSES` needs one row here and nothing else. No CLI: imported by
`mass audit` and `mass render sft`.
"""

from __future__ import annotations

# qwen-code: `agent` (its sub-agent tool; releases before the rename called it `task`).
DELEGATION_TOOLS: dict[str, frozenset[str]] = {
    "builtin": frozenset({"delegate"}),
    "qwen-code": frozenset({"agent", "task"}),
}
ANY_DELEGATION_TOOL: frozenset[str] = frozenset().union(*DELEGATION_TOOLS.values())


def delegation_tools(harness: str | None) -> frozenset[str]:
    """The harness's delegation tool names; every harness's when it is not known (a bare trace)."""
    if harness is None:
        return ANY_DELEGATION_TOOL
    try:
        return DELEGATION_TOOLS[harness]
    except KeyError:
        raise ValueError(f"harness: expected one of {sorted(DELEGATION_TOOLS)}, got {harness!r}") from None


def tool_names(tools: list | None) -> set[str]:
    """Function names of an OpenAI `tools` list (request field)."""
    names = set()
    for t in tools or []:
        fn = t.get("function", t) if isinstance(t, dict) else {}
        if isinstance(fn, dict) and fn.get("name"):
            names.add(str(fn["name"]))
    return names


def can_delegate(tools: list | None, harness: str | None = None) -> bool:
    """True when a request offered the model the harness's delegation tool."""
    return bool(tool_names(tools) & delegation_tools(harness))
