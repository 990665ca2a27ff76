"""Which vLLM tool-call parser reads which tool-call format, and which format a model writes.

Each of vLLM's parsers reads one format: `hermes` a JSON object between `<tool_call>` tags, which
Qwen3's template writes; `qwen3_coder` (and `qwen3_xml`) an XML function block,
`<tool_call>\\n<function=NAME>\\n<parameter=ARG>\\nVALUE\\n</parameter>\\n</function>\\n</tool_call>`,
which the templates of Qwen3.5, Qwen3.6 and Qwen3-Coder write (the paper's code serves its model with
`--tool-call-parser qwen3_coder --reasoning-parser qwen3`). A parser that cannot read the model's
format leaves every call in the reply's text: each episode is one turn without a tool call.
"""

from __future__ import annotations

import re

from mass_jobs.config.run_spec import XML_CALL_FAMILIES

READS = {"hermes": "json", "qwen3_coder": "xml", "qwen3_xml": "xml"}
SHOWN = {
    "json": '<tool_call>{"name": ..., "arguments": {...}}</tool_call>',
    "xml": "<tool_call><function=NAME><parameter=ARG>VALUE</parameter></function></tool_call>",
}


def written_format(rendered: str, tool: str) -> str | None:
    """The format of the call to `tool` in a rendered conversation: 'xml', 'json' or None."""
    if re.search(rf"<function={re.escape(tool)}>", rendered):
        return "xml"
    if re.search(rf'<tool_call>\s*\{{\s*"name"\s*:\s*"{re.escape(tool)}"', rendered):
        return "json"
    return None


def family_format(model_id: str) -> str | None:
    """'xml' for the families whose own templates write XML calls (checked where the template is not here)."""
    return "xml" if XML_CALL_FAMILIES.search(model_id) else None


def parser_issue(parser: str, fmt: str | None, model: str) -> str | None:
    """Why `parser` cannot read the calls `model` writes in `fmt`, or None (a parser this table does
    not know is vLLM's to refuse, by name, when it starts)."""
    reads = READS.get(parser)
    if fmt is None or reads is None or reads == fmt:
        return None
    readers = ", ".join(sorted(p for p, f in READS.items() if f == fmt))
    return (
        f"expected a tool-call parser that reads what {model} writes ({SHOWN[fmt]}: {readers}), found "
        f"{parser!r}, which reads {SHOWN[reads]}"
    )
