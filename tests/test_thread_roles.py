"""Which thread of a qwen-code episode is the orchestrator's, the worker's or auxiliary, against a
transcription of the paper's code (training/prepare_sft_data.py: thread_role with prompt_match; the
sent-form index it loads from files is not part of it: traces here record what was sent)."""

from __future__ import annotations

import itertools

import pytest

from mass_jobs.config.run_spec import SftSpec
from mass_jobs.steps.sft_threads import Thread, classify, prompt_role

pytestmark = pytest.mark.unit  # no process, no server, no sandbox (tests/fixtures/unit.py)


class Refused(ValueError):
    pass


def upstream_role(messages: list[dict], prompt: str | None) -> str:
    """The code's rule, transcribed: the first user message matched against the prompt's variants
    (as given, stripped, @-spaced, @-spaced and stripped; duplicates once, in that order), the first
    variant found exactly once is a match and found more than once refuses the thread; then the
    match or the main system prompt makes the orchestrator, the sub-agent prompt a worker."""

    def spaced(p):
        if "precision@k" not in p and "recall@k" not in p:
            return p
        return p.replace("precision@k", "precision @k").replace("recall@k", "recall @k").strip()

    matched = False
    if prompt:
        user = messages[1]["content"]
        variants = []
        for cand in (prompt, prompt.strip(), spaced(prompt), spaced(prompt).strip()):
            if cand and cand not in variants:
                variants.append(cand)
        for cand in variants:
            n = user.count(cand)
            if n == 1:
                matched = True
                break
            if n > 1:
                raise Refused(f"{n} occurrences")
    system = messages[0]["content"]
    if matched or system.startswith("You are Qwen Code"):
        return "orchestrator"
    if system.startswith("You are a general-purpose subagent"):
        return "worker"
    return "auxiliary"


PROMPTS = [
    "Write fib.py that prints 10 numbers.",
    "  Write fib.py that prints 10 numbers.\n",
    "Report precision@k for k=5.",
    None,
]
SYSTEMS = [
    "You are Qwen Code, an interactive CLI agent.",
    "You are a general-purpose subagent for the task.",
    "Summarize the conversation so far.",
    "Decide who speaks next.",
    "",
]


def users(prompt: str | None) -> list[str]:
    p = prompt or "Write fib.py that prints 10 numbers."
    return [
        p,
        f"Context first.\n\n{p}",
        f"{p}\n{p}",
        p.strip(),
        f"  {p.strip()}  ",
        p.replace("precision@k", "precision @k"),
        "Something else entirely.",
        "",
    ]


CASES = [(s, u, p) for p in PROMPTS for s, u in itertools.product(SYSTEMS, users(p))]


def test_the_grid_covers_every_outcome():
    outcomes = set()
    for system, user, prompt in CASES:
        try:
            outcomes.add(
                upstream_role([{"role": "system", "content": system}, {"role": "user", "content": user}], prompt)
            )
        except Refused:
            outcomes.add("refused")
    assert outcomes == {"orchestrator", "worker", "auxiliary", "refused"} and len(CASES) == 160


@pytest.mark.parametrize("system,user,prompt", CASES)
def test_the_prompt_rule_is_the_codes(system, user, prompt):
    messages = [
        {"role": "system", "content": system},
        {"role": "user", "content": user},
        {"role": "assistant", "content": "ok"},
    ]
    ours = prompt_role(messages, prompt)
    try:
        theirs = upstream_role(messages, prompt)
    except Refused:
        # the code drops a thread whose first message holds the prompt twice; here it is not matched
        # by the prompt and takes its role from its system prompt alone
        assert ours == upstream_role(messages, None)
        return
    assert ours == theirs
    # a thread without the harness's role header (qwen-code's) gets it under the default rule
    thread = Thread(agent=None, tools=[{"type": "function", "function": {"name": "agent"}}], messages=messages)
    assert classify(thread, "qwen-code", SftSpec().thread_roles, prompt) == theirs


def test_the_tools_rule_and_role_headers():
    delegating = [{"type": "function", "function": {"name": "agent"}}]
    side = [{"role": "system", "content": "Summarize the conversation so far."}, {"role": "user", "content": "x"}]
    thread = Thread(agent=None, tools=delegating, messages=side)
    # a side call offered the delegation tool: the orchestrator's under `tools`, auxiliary under the code's rule
    assert classify(thread, "qwen-code", "tools", "Write fib.py.") == "orchestrator"
    assert classify(thread, "qwen-code", "prompt", "Write fib.py.") == "auxiliary"
    # the built-in harness's role headers decide under either rule
    headed = Thread(agent={"id": "w1", "role": "worker", "parent": "orchestrator"}, tools=delegating, messages=side)
    assert classify(headed, "builtin", "prompt", None) == classify(headed, "builtin", "tools", None) == "worker"
