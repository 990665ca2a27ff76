"""Model access: an OpenAI-compatible endpoint and a chat client with retries, timeouts and sampling.

`Endpoint` names where a model is served (`base_url` ends at the API root, e.g. `.../v1` or
KServe's `.../openai/v1`). `ModelClient.chat` sends one non-streaming chat completion and returns the
assistant message in one normalised shape (the same shape the recording proxy writes to traces):

    {"role": "assistant", "content": str | None, "reasoning_content": str | None,
     "tool_calls": [{"id", "type": "function", "function": {"name", "arguments": str}}],
     "finish_reason": str | None, "usage": dict | None}

Transient failures (HTTP 429 / 5xx, connection errors, timeouts) are retried with exponential
backoff and jitter; any other 4xx fails at once with `ModelError`. `parse_tool_calls` checks the
argument JSON of each tool call and reports malformed ones instead of raising, so a harness can hand
the error back to the model as a tool result.
"""

from __future__ import annotations

import functools
import json
import os
import random
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mass_jobs.config.run_spec import Sampling

if TYPE_CHECKING:
    import ssl

    import httpx


@functools.cache
def tls_context() -> ssl.SSLContext:
    """The process's one TLS context for model traffic, as httpx builds it (certifi, or
    SSL_CERT_FILE / SSL_CERT_DIR). Loading the CA bundle costs about 40 ms of CPU, and a client
    is made per model call: a context per client made that the larger part of a call's cost."""
    import httpx

    return httpx.create_ssl_context()


@dataclass(frozen=True)
class Endpoint:
    """An OpenAI-compatible API root and the model name to ask for."""

    base_url: str
    model: str
    api_key_env: str | None = None
    key: str | None = field(default=None, repr=False)  # a key held in memory (a recording proxy's own token)

    def api_key(self) -> str | None:
        """`key`, else the key from the environment variable `api_key_env` names; None when neither is set."""
        if self.key:
            return self.key
        if not self.api_key_env:
            return None
        value = os.environ.get(self.api_key_env)
        if not value:
            raise ModelError(f"endpoint api_key_env: environment variable {self.api_key_env} is not set", kind="config")
        return value

    def url(self, path: str) -> str:
        """Join the API root and a route without losing a path prefix (`/openai/v1` + `chat/completions`)."""
        return self.base_url.rstrip("/") + "/" + path.lstrip("/")


class ModelError(RuntimeError):
    """A chat call that failed for good. `kind` is one of: upstream_status, connection, timeout,
    invalid_response, config. `status` and `body` are set for HTTP errors."""

    def __init__(self, message: str, *, kind: str, status: int | None = None, body: str = "", attempts: int = 0):
        super().__init__(message)
        self.kind = kind
        self.status = status
        self.body = body
        self.attempts = attempts


RETRY_STATUSES = frozenset({408, 409, 429}) | frozenset(range(500, 600))
BODY_EXCERPT = 2000


def normalize_message(message: dict | None) -> dict:
    """The assistant message in the one shape used by the client and the traces.

    Servers differ: vLLM names reasoning `reasoning_content` or `reasoning`, omit or null
    `tool_calls`, and send empty strings for absent text; all of those map to one form here. Any
    other shape a server sends is coerced (a call that is not an object keeps its JSON as arguments
    and no name, so the harness answers it with a tool error); only a message that is not an object
    raises ValueError.
    """
    if message is None:
        message = {}
    if not isinstance(message, dict):
        raise ValueError(f"message is a {type(message).__name__}, not an object")
    reasoning = message.get("reasoning_content")
    if reasoning is None:
        reasoning = message.get("reasoning")
    raw_calls = message.get("tool_calls") or []
    if isinstance(raw_calls, dict):
        raw_calls = [raw_calls]
    elif not isinstance(raw_calls, list):
        raw_calls = [raw_calls]
    calls = []
    for call in raw_calls:
        call = call if isinstance(call, dict) else {"function": {"arguments": call}}
        fn = call.get("function")
        fn = fn if isinstance(fn, dict) else {"arguments": fn}
        args, name, call_id = fn.get("arguments"), fn.get("name"), call.get("id")
        calls.append(
            {
                "id": call_id if isinstance(call_id, str) else None,
                "type": "function",
                "function": {
                    "name": name if isinstance(name, str) else None,
                    "arguments": args if isinstance(args, str) else json.dumps(args if args is not None else {}),
                },
            }
        )
    return {
        "role": "assistant",
        "content": _text(message.get("content")) or None,
        "reasoning_content": _text(reasoning) or None,
        "tool_calls": calls,
    }


def _text(value: Any) -> str:
    """Text of a content field: a string, a list of text parts, or anything else as JSON."""
    if value is None or isinstance(value, str):
        return value or ""
    if isinstance(value, list) and all(isinstance(p, dict) for p in value):
        return "".join(p["text"] for p in value if isinstance(p.get("text"), str))
    return json.dumps(value)


MAX_TOKENS_PER_CALL = 10**8  # more than any context window: a count above it is not a count


def usage_tokens(usage: Any) -> tuple[int, int]:
    """(prompt, completion) tokens of a response's `usage`; what is not a plausible count counts 0."""
    if not isinstance(usage, dict):
        return 0, 0

    def count(key: str) -> int:
        v = usage.get(key)
        return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_TOKENS_PER_CALL else 0

    return count("prompt_tokens"), count("completion_tokens")


@dataclass
class ToolCall:
    """One tool call with parsed arguments; `error` says why the arguments were unusable (then `arguments` is {})."""

    id: str | None
    name: str | None
    arguments: dict = field(default_factory=dict)
    raw_arguments: str = ""
    error: str | None = None


def parse_tool_calls(message: dict) -> list[ToolCall]:
    """Parse each tool call's argument JSON; malformed calls come back with `error` set, never raised."""
    parsed = []
    for call in message.get("tool_calls") or []:
        fn = call.get("function") or {}
        name, raw = fn.get("name"), fn.get("arguments")
        tc = ToolCall(id=call.get("id"), name=name, raw_arguments=raw if isinstance(raw, str) else json.dumps(raw))
        if not name:
            tc.error = "tool call has no function name"
        elif isinstance(raw, dict):
            tc.arguments = raw
        elif raw is None or (isinstance(raw, str) and not raw.strip()):
            tc.arguments = {}  # some servers send "" for a call without parameters
        else:
            try:
                value = json.loads(raw)
            except (TypeError, ValueError, RecursionError) as e:
                tc.error = f"arguments of {name!r} are not valid JSON: {e}"
            else:
                if isinstance(value, dict):
                    tc.arguments = value
                else:
                    tc.error = f"arguments of {name!r} must be a JSON object, got {type(value).__name__}"
        parsed.append(tc)
    return parsed


class ModelClient:
    """Chat completions against one endpoint with the run's sampling settings. Thread-safe."""

    def __init__(
        self,
        endpoint: Endpoint,
        sampling: Sampling | None = None,
        timeout_s: float = 600,
        retries: int = 4,
        backoff_s: float = 0.5,
        headers: dict[str, str] | None = None,
    ):
        import httpx

        self.endpoint = endpoint
        self.sampling = sampling or Sampling()
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.headers = dict(headers or {})
        self._http = httpx.Client(timeout=httpx.Timeout(timeout_s), verify=tls_context())
        self._rng = random.Random()

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ModelClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request_body(
        self,
        messages: list[dict],
        tools: list[dict] | None = None,
        seed: int | None = None,
        max_tokens: int | None = None,
    ) -> dict:
        """The JSON body sent upstream; `top_k` travels as an extra top-level key (vLLM and transformers read it)."""
        s = self.sampling
        body: dict[str, Any] = {
            "model": self.endpoint.model,
            "messages": messages,
            "temperature": s.temperature,
            "top_p": s.top_p,
            "top_k": s.top_k,
            "max_tokens": min(s.max_output_tokens, max_tokens) if max_tokens else s.max_output_tokens,
            "stream": False,
            **s.pins(),
        }
        if tools:
            body["tools"] = tools
        if seed is not None:
            body["seed"] = seed
        return body

    def chat(
        self,
        messages: list[dict],
        tools: list[dict] | None = None,
        seed: int | None = None,
        max_tokens: int | None = None,
        headers: dict[str, str] | None = None,
    ) -> dict:
        """One assistant turn (see the module docstring for the shape); raises `ModelError` when retries run out."""
        body = self.request_body(messages, tools, seed, max_tokens)
        send_headers = {"Content-Type": "application/json", **self.headers, **(headers or {})}
        key = self.endpoint.api_key()
        if key:
            send_headers["Authorization"] = f"Bearer {key}"
        last: ModelError | None = None
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self._delay(attempt, last))
            try:
                return self._once(body, send_headers, attempt + 1)
            except ModelError as e:
                last = e
                if e.kind == "upstream_status" and e.status not in RETRY_STATUSES:
                    raise
                if e.kind in ("invalid_response", "config"):
                    raise
        assert last is not None
        last.attempts = self.retries + 1
        raise last

    def _once(self, body: dict, headers: dict, attempt: int) -> dict:
        import httpx

        url = self.endpoint.url("chat/completions")
        try:
            resp = self._http.post(url, json=body, headers=headers)
        except httpx.TimeoutException as e:
            raise ModelError(
                f"timeout after {self.timeout_s}s calling {url}: {e!r}", kind="timeout", attempts=attempt
            ) from e
        except httpx.HTTPError as e:
            raise ModelError(f"cannot reach {url}: {e!r}", kind="connection", attempts=attempt) from e
        if resp.status_code >= 400:
            excerpt = resp.text[:BODY_EXCERPT]
            err = ModelError(
                f"HTTP {resp.status_code} from {url}: {excerpt}",
                kind="upstream_status",
                status=resp.status_code,
                body=excerpt,
                attempts=attempt,
            )
            err.retry_after = _retry_after(resp)  # type: ignore[attr-defined]
            raise err
        try:
            data = resp.json()
            choice = data["choices"][0]
            if not isinstance(choice, dict):
                raise TypeError(f"choices[0] is a {type(choice).__name__}")
            msg = normalize_message(choice.get("message"))
        except (ValueError, KeyError, IndexError, TypeError, AttributeError, RecursionError) as e:
            raise ModelError(
                f"response from {url} is not a chat completion ({e}): {resp.text[:BODY_EXCERPT]}",
                kind="invalid_response",
                status=resp.status_code,
                body=resp.text[:BODY_EXCERPT],
                attempts=attempt,
            ) from None
        reason = choice.get("finish_reason")
        msg["finish_reason"] = reason if isinstance(reason, str) else None
        msg["usage"] = data.get("usage") if isinstance(data.get("usage"), dict) else None
        return msg

    def _delay(self, attempt: int, last: ModelError | None) -> float:
        # Exponential backoff with +-50% jitter so parallel episodes do not retry in lockstep;
        # a server's Retry-After (capped) wins when it asks for longer.
        delay = self.backoff_s * (2 ** (attempt - 1)) * self._rng.uniform(0.5, 1.5)
        retry_after = getattr(last, "retry_after", None)
        if retry_after is not None:
            delay = max(delay, min(retry_after, 60.0))
        return delay


def _retry_after(resp: httpx.Response) -> float | None:
    value = resp.headers.get("retry-after")
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None
