"""The generation-0 model as a run uses it, and what a model must support for MASS to train it.

`base_model_dir(ctx)`: the spec's `model.base` as a local directory (modelio.resolve_model with the
store's endpoint and region). With `model.chat_template` (a Jinja file) it is a sibling directory
that links every file of the base and carries that template instead, plus, when the embedded
server has no tool-call parser for the model's type, the hermes response template
(`<tool_call>{json}</tool_call>`, what vLLM's hermes parser reads too). Serving, rendering and
merging generation 0 all read that directory, and merge copies the tokenizer on, so every later
generation carries the same template.

`fitness_issues(spec, model_dir)`: a multi-agent episode is tool calls; a template that silently
drops tools gives one-turn episodes recorded `success` and a run that learns nothing. So the
template must render a tool definition, an assistant's tool call and a tool result (each probed
by a marker string), and the spec's context length must fit the model's positions.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from mass_jobs.run.context import RunContext
from mass_jobs.serving.model_dirs import resolve_model
from mass_jobs.serving.tool_parsers import parser_issue, written_format
from mass_jobs.spec.load import SpecIssue
from mass_jobs.spec.locations import read_template
from mass_jobs.spec.rules import vllm_serves

TEMPLATE_FILE = "chat_template.jinja"
PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": "mass_fitness_probe",
        "description": "A probe of the chat template.",
        "parameters": {
            "type": "object",
            "properties": {"probe_argument": {"type": "string"}},
            "required": ["probe_argument"],
        },
    },
}
PROBE_CALL_VALUE, PROBE_RESULT = "probe-value-7431", "probe-result-9067"
# The embedded server's parser for hermes-style calls, for model types transformers has none for.
HERMES_RESPONSE_TEMPLATE = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "tool_calls": {
            "open_pattern": r"\s*<tool_call>",
            "close": "</tool_call>",
            "repeats": True,
            "content": "json",
            "transform": {"type": "function", "function": "{content}"},
        },
        "content": {"close_pattern": r"\s*(?:<\|im_end\|>|<\|endoftext\|>|<\|eot_id\|>)", "content": "text"},
    },
}


def templated_model_dir(base: Path, template: str, cache_root: Path | None = None) -> Path:
    """`base` with `template` as its chat template, as a directory of links (built once per pair)."""
    from transformers import AutoConfig

    digest = hashlib.sha256(f"{Path(base).resolve()}\0{template}".encode()).hexdigest()[:16]
    root = Path(cache_root or Path(tempfile.gettempdir()) / "mass-models")
    out = root / "templated" / f"{Path(base).name}-{digest}"
    if (out / TEMPLATE_FILE).is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        for entry in Path(base).resolve().iterdir():
            if entry.name not in (TEMPLATE_FILE, "tokenizer_config.json"):
                os.symlink(entry, staging / entry.name)
        config = {}
        if (Path(base) / "tokenizer_config.json").is_file():
            config = json.loads((Path(base) / "tokenizer_config.json").read_text())
        config.pop("chat_template", None)  # the file below is the template
        from transformers.cli.serving.utils import _RESPONSE_TEMPLATE_FALLBACKS

        model_type = AutoConfig.from_pretrained(base).model_type
        if "response_template" not in config and not any(model_type in k for k in _RESPONSE_TEMPLATE_FALLBACKS):
            config["response_template"] = HERMES_RESPONSE_TEMPLATE
        (staging / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
        (staging / TEMPLATE_FILE).write_text(template)
        try:
            os.replace(staging, out)
        except OSError:  # another process built it meanwhile (os.replace will not replace a full dir)
            if not (out / TEMPLATE_FILE).is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def base_model_dir(ctx, cache_root: Path | None = None) -> Path:
    """Generation 0's local model directory, with the spec's chat template applied when it has one."""

    base = resolve_model(ctx.spec.model.base, store_options=ctx.store_options())
    if ctx.spec.model.chat_template:
        return templated_model_dir(base, read_template(ctx.spec.model.chat_template), cache_root)
    return base


def _probe(tokenizer) -> tuple[str, str]:
    """(the prompt with the probe tool offered, the conversation with a tool call and its result)."""
    offered = tokenizer.apply_chat_template(
        [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Call the probe."}],
        tools=[PROBE_TOOL],
        tokenize=False,
        add_generation_prompt=True,
    )
    call = {
        "id": "call_0",
        "type": "function",
        "function": {"name": "mass_fitness_probe", "arguments": {"probe_argument": PROBE_CALL_VALUE}},
    }
    used = tokenizer.apply_chat_template(
        [
            {"role": "system", "content": "You are an agent."},
            {"role": "user", "content": "Call the probe."},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_0", "content": PROBE_RESULT},
        ],
        tools=[PROBE_TOOL],
        tokenize=False,
        add_generation_prompt=True,
    )
    return offered, used


# A tool-calling ChatML template shipped with the examples (absolute, so the hint works when copied).
SHIPPED_TEMPLATE = Path(__file__).resolve().parents[2] / "examples" / "templates" / "chatml-tools.jinja"


def _remedy(spec) -> str:
    """What to do about an unfit template, where the spec gave none of its own."""
    if spec.model.chat_template:
        return ""
    if SHIPPED_TEMPLATE.is_file():
        return (
            f" (give one with tools in model.chat_template, a path relative to the spec's folder; this "
            f"checkout's ChatML one: {SHIPPED_TEMPLATE}; examples/smollm2.yaml uses it)"
        )
    return " (give one with tools in model.chat_template, a path relative to the spec's folder)"


def fitness_issues(spec, model_dir: Path) -> list:
    """SpecIssues of a local model dir the run cannot train with (see the module docstring)."""
    from transformers import AutoConfig, AutoTokenizer

    where = "$.model.chat_template" if spec.model.chat_template else "$.model.base"
    named = f"model {spec.model.base!r}" + (
        f" with chat template {spec.model.chat_template!r}" if spec.model.chat_template else ""
    )
    remedy = _remedy(spec)
    try:
        tokenizer = AutoTokenizer.from_pretrained(spec.model.tokenizer or model_dir)
        offered, used = _probe(tokenizer)
    except Exception as err:  # a template that raises on a tool turn is unfit, whatever it raised
        return [
            SpecIssue(
                where,
                f"{named}: expected a chat template that renders tools and tool calls; "
                f"rendering a tool-call conversation failed: {type(err).__name__}: {err}{remedy}",
            )
        ]
    missing = [
        what
        for what, ok in (
            ("tool definitions", "mass_fitness_probe" in offered),
            ("the assistant's tool calls", PROBE_CALL_VALUE in used),
            ("tool results", PROBE_RESULT in used),
        )
        if not ok
    ]
    issues = []
    if missing:
        issues.append(
            SpecIssue(
                where,
                f"{named}: expected a chat template that renders tools, tool calls and "
                f"tool results; it drops {', '.join(missing)}{remedy}",
            )
        )

    fmt = written_format(used, PROBE_TOOL["function"]["name"])
    if vllm_serves(spec) and (why := parser_issue(spec.execution.vllm.tool_call_parser, fmt, f"{named}'s template")):
        issues.append(SpecIssue("$.execution.vllm.tool_call_parser", why))
    config = AutoConfig.from_pretrained(model_dir)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    positions = getattr(text, "max_position_embeddings", None)
    if positions and spec.model.sampling.context_length > positions:
        issues.append(
            SpecIssue(
                "$.model.sampling.context_length",
                f"expected at most the model's {positions} positions (max_position_embeddings of "
                f"{spec.model.base!r}), found {spec.model.sampling.context_length}",
            )
        )
    return issues


def local_fitness_issues(spec) -> list:
    """fitness_issues when generation 0 is a local model dir (what `mass validate` and `mass run`
    check before anything starts); a hub id or an s3:// model is checked where it is served."""

    if not (Path(spec.model.base) / "config.json").is_file():
        return []
    return fitness_issues(spec, base_model_dir(RunContext(spec, None)))
