"""Runs under vLLM's own python (`make vllm-env`): parses model outputs with vLLM's registered
tool-call and reasoning parser classes, as its OpenAI server does for a non-streaming reply: the
reasoning parser first, the tool parser on the content it leaves.

stdin: {"tokenizer": DIR, "tools": [...], "outputs": {label: text}, "tool_parsers": [names],
        "reasoning_parser": name | null}
stdout (last line): {"tools": {parser: {label: {"calls": [[name, arguments]], "content": str | null}}},
                     "reasoning": {label: {"reasoning": str | null, "content": str | null}}}
"""

import json
import sys

from transformers import AutoTokenizer
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.reasoning import ReasoningParserManager
from vllm.tool_parsers import ToolParserManager


def main() -> None:
    job = json.load(sys.stdin)
    tokenizer = AutoTokenizer.from_pretrained(job["tokenizer"])
    request = ChatCompletionRequest(model="probe", messages=[{"role": "user", "content": "probe"}], tools=job["tools"])
    out = {"tools": {}, "reasoning": {}}
    outputs = dict(job["outputs"])
    if job.get("reasoning_parser"):  # the server splits off the reasoning first, then parses the rest
        parser = ReasoningParserManager.get_reasoning_parser(job["reasoning_parser"])(tokenizer)
        for label, text in job["outputs"].items():
            reasoning, content = parser.extract_reasoning(text, request)
            out["reasoning"][label] = {"reasoning": reasoning, "content": content}
            outputs[label] = content or ""
    for name in job["tool_parsers"]:
        cls = ToolParserManager.get_tool_parser(name)
        try:
            parser = cls(tokenizer, tools=request.tools)
        except TypeError:  # parsers whose constructor takes the tokenizer alone
            parser = cls(tokenizer)
        out["tools"][name] = {}
        for label, text in outputs.items():
            got = parser.extract_tool_calls(text, request)
            out["tools"][name][label] = {
                "calls": [[c.function.name, json.loads(c.function.arguments)] for c in got.tool_calls],
                "content": got.content,
            }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
