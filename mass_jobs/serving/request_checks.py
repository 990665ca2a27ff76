"""The chat requests the embedded server refuses as vLLM refuses them, one check per field, before
transformers sees them (its route would fail some with a 500 or ignore them)."""

from __future__ import annotations

import json

ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
# Sampling knobs our clients send that transformers' chat route rejects as "Unexpected fields".
EXTRA_SAMPLING = {"top_k": int, "min_p": float, "repetition_penalty": float}


def invalid_request_reason(body) -> str | None:
    """Why a chat-completions body is unusable, or None. transformers serve answers these with a
    500 (KeyError/TypeError deep in message conversion); clients must get a 400 they can act on."""
    if not isinstance(body, dict):
        return "request body must be a JSON object"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "'messages' must be a non-empty list of message objects"
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            return f"messages[{i}] must be an object, got {type(m).__name__}"
        if m.get("role") not in ROLES:
            return f"messages[{i}].role must be one of {sorted(ROLES)}, got {m.get('role')!r}"
        content = m.get("content")
        if content is not None and not isinstance(content, (str, list)):
            return f"messages[{i}].content must be a string, a list of parts or null"
        if isinstance(content, list) and not all(isinstance(p, dict) and "type" in p for p in content):
            return f"messages[{i}].content parts must be objects with a 'type'"
        calls = m.get("tool_calls")
        if calls is not None and not isinstance(calls, list):
            return f"messages[{i}].tool_calls must be a list"
        for j, call in enumerate(calls or []):
            fn = call.get("function") if isinstance(call, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                return f"messages[{i}].tool_calls[{j}].function.name must be a string"
            args = fn.get("arguments", "{}")
            if isinstance(args, str):
                try:
                    args = json.loads(args)
                except json.JSONDecodeError:
                    return f"messages[{i}].tool_calls[{j}].function.arguments is not valid JSON"
            if not isinstance(args, dict):
                return f"messages[{i}].tool_calls[{j}].function.arguments must be a JSON object"
    tools = body.get("tools")
    if tools is not None and (
        not isinstance(tools, list)
        or not all(isinstance(t, dict) and isinstance(t.get("function"), dict) for t in tools)
    ):
        return "'tools' must be a list of {'type': 'function', 'function': {...}} objects"
    for key in ("max_tokens", "max_completion_tokens", "seed"):
        value = body.get(key)
        if value is not None and (
            not isinstance(value, int) or isinstance(value, bool) or (key != "seed" and value < 1)
        ):
            return f"'{key}' must be {'an integer' if key == 'seed' else 'a positive integer'}"
    for key in ("temperature", "top_p", "frequency_penalty"):
        if body.get(key) is not None and not isinstance(body[key], (int, float)):
            return f"'{key}' must be a number"
    config = body.get("generation_config")
    if config is not None:
        try:
            if not isinstance(json.loads(config), dict):
                raise ValueError
        except (TypeError, ValueError):
            return "'generation_config' must be a string holding a JSON object"
    bias = body.get("logit_bias")
    if bias is not None and not (
        isinstance(bias, dict)
        and all(str(k).isdigit() and isinstance(v, (int, float)) and -100 <= v <= 100 for k, v in bias.items())
    ):
        return "'logit_bias' must map token ids to numbers in [-100, 100]"
    for key in EXTRA_SAMPLING:
        if body.get(key) is not None and not isinstance(body[key], (int, float)):
            return f"'{key}' must be a number"
    return None
