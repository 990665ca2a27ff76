"""The embedded server (`transformers serve` + MassChatHandler) with the tiny model, via the official openai client.

The tiny model's weights are random, so output text is only checked for shape and determinism. Tool-call
and reasoning parsing is proven end to end by forcing the generation: a `sequence_bias` (sent through the
server's `generation_config` request field) makes greedy decoding emit one known assistant turn, which the
server must split into reasoning_content, content and tool_calls, streaming and not.
"""

from __future__ import annotations

import json
import os

import httpx
import pytest

from mass_jobs.serving.llm import Endpoint
from mass_jobs.serving.serve import ModelServer
from mass_jobs.tiny.build import SPECIAL_TOKENS

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
        },
    }
]
ASK = [{"role": "user", "content": "What is in a.txt?"}]
FORCED = (
    "<think>\nI will read it.\n</think>\n\nLet me look.\n"
    '<tool_call>\n{"name": "read_file", "arguments": {"path": "a.txt"}}\n</tool_call><|im_end|>'
)


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    with ModelServer(tiny_model_dir, served_name="tiny", device="cpu") as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=server.endpoint.base_url, api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def no_special_tokens(tokenizer) -> dict:
    """logit_bias that keeps random output to plain text of a fixed length (no eos, no markup)."""
    return {str(tokenizer.convert_tokens_to_ids(t)): -100 for t in SPECIAL_TOKENS}


def forcing_config(tokenizer, messages, tools, text: str) -> str:
    """A generation_config making greedy decoding emit exactly `text` after the prompt: each target
    token gets +100 when everything before it (from the 'assistant\\n' header on) is already there."""
    prompt = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, return_dict=True)
    anchor = prompt["input_ids"][-3:]  # <|im_start|> assistant \n
    target = tokenizer(text, add_special_tokens=False)["input_ids"]
    bias = [[anchor + target[: k + 1], 100.0] for k in range(len(target))]
    return json.dumps(
        {
            "sequence_bias": bias,
            "do_sample": False,
            "eos_token_id": [tokenizer.eos_token_id],
            "pad_token_id": tokenizer.pad_token_id,
        }
    )


def test_health_models_and_endpoint(server):
    assert httpx.get(f"{server.base_url}/health").json() == {"status": "ok"}
    assert [m["id"] for m in httpx.get(f"{server.base_url}/v1/models").json()["data"]] == ["tiny"]
    assert server.endpoint == Endpoint(base_url=f"http://127.0.0.1:{server.port}/v1", model="tiny")


def sampled(tokenizer, seed: int) -> dict:
    return dict(
        model="tiny", messages=ASK, max_tokens=6, temperature=1.0, seed=seed,
        logit_bias=no_special_tokens(tokenizer), extra_body={"top_k": 50},
    )  # fmt: skip


def test_non_streaming_chat_is_seeded_with_exact_usage(client, tokenizer):
    first, again, other = (client.chat.completions.create(**sampled(tokenizer, s)) for s in (7, 7, 8))
    prompt_len = len(tokenizer.apply_chat_template(ASK, add_generation_prompt=True, return_dict=True)["input_ids"])
    assert (first.usage.prompt_tokens, first.usage.completion_tokens) == (prompt_len, 6)
    assert first.choices[0].finish_reason == "length"
    assert first.choices[0].message.role == "assistant" and first.model == "tiny"
    assert first.choices[0].message.content.strip()
    assert first.choices[0].message.content == again.choices[0].message.content
    assert first.choices[0].message.content != other.choices[0].message.content
    # top_k (not an OpenAI field, added by MassChatHandler) is applied: top_k=1 ignores the seed.
    top1 = [
        client.chat.completions.create(**{**sampled(tokenizer, s), "extra_body": {"top_k": 1}})
        .choices[0]
        .message.content
        for s in (7, 8)
    ]
    assert top1[0] == top1[1]


def test_seeded_text_does_not_depend_on_concurrent_requests(client, tokenizer):
    """Collection runs episodes concurrently: a seeded request must give the same text whatever
    else the server is generating (upstream seeded on arrival, so requests shared one RNG stream)."""
    from concurrent.futures import ThreadPoolExecutor

    def ask(seed: int) -> str:
        body = {**sampled(tokenizer, seed), "max_tokens": 16}
        return client.chat.completions.create(**body).choices[0].message.content

    seeds = [11, 12, 13, 14]
    alone = [ask(s) for s in seeds]
    with ThreadPoolExecutor(max_workers=4) as pool:
        together = list(pool.map(ask, seeds))
    assert together == alone and len(set(alone)) == len(seeds)


def test_a_shared_prefix_is_reused_and_the_reply_is_unchanged(server, client, tokenizer):
    """The agent's case: a long system prompt and tool list in every request. The second request
    with it prefills only its own tail (the /prefix_cache counters), and the seeded text on a hit is
    the text of the miss, streamed or not."""
    system = {"role": "system", "content": " ".join(f"rule {i}: keep files under src/." for i in range(160))}
    convo = lambda q: [system, {"role": "user", "content": q}]  # noqa: E731
    stats = lambda: httpx.get(f"{server.base_url}/prefix_cache").json()  # noqa: E731
    before = stats()
    body = {**sampled(tokenizer, 5), "messages": convo("What is in a.txt?"), "tools": TOOLS}
    miss = client.chat.completions.create(**body).choices[0].message.content
    prompt_len = len(
        tokenizer.apply_chat_template(body["messages"], tools=TOOLS, add_generation_prompt=True, return_dict=True)[
            "input_ids"
        ]
    )
    assert prompt_len > 2 * before["block"]
    hit = client.chat.completions.create(**body).choices[0].message.content
    stream = "".join(
        c.choices[0].delta.content or "" for c in client.chat.completions.create(**body, stream=True) if c.choices
    )
    other = client.chat.completions.create(**{**body, "messages": convo("And b.txt?")}).choices[0].message.content
    after = stats()
    assert miss == hit and stream.strip() == hit.strip() and other  # (non-streamed content comes stripped)
    whole = (prompt_len - 1) // before["block"] * before["block"]
    assert after["requests"] - before["requests"] == 4
    # The repeats reuse every whole block; the other question at least the system prompt's.
    assert after["reused_tokens"] - before["reused_tokens"] >= 2 * whole + whole - before["block"]
    assert 0 < after["bytes"] <= after["budget_bytes"]


def test_streaming_chunks_reassemble_to_the_non_streaming_answer(client, tokenizer):
    whole = client.chat.completions.create(**sampled(tokenizer, 7)).choices[0].message.content
    chunks = list(client.chat.completions.create(stream=True, **sampled(tokenizer, 7)))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason] == ["length"]
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert streamed.strip() == whole.strip() and len(chunks) >= 4
    assert chunks[-1].usage.completion_tokens == 6


def test_forced_tool_call_is_parsed_into_reasoning_content_and_tool_calls(client, tokenizer):
    config = forcing_config(tokenizer, ASK, TOOLS, FORCED)
    resp = client.chat.completions.create(
        model="tiny", messages=ASK, tools=TOOLS, max_tokens=64, extra_body={"generation_config": config}
    )
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me look."
    assert choice.message.model_extra["reasoning_content"] == "I will read it."
    [call] = choice.message.tool_calls
    assert (call.type, call.function.name, json.loads(call.function.arguments)) == (
        "function",
        "read_file",
        {"path": "a.txt"},
    )
    assert resp.usage.completion_tokens == len(tokenizer(FORCED, add_special_tokens=False)["input_ids"])
    # Round trip: the parsed message, rendered back as history, is byte-identical to what was generated,
    # so training on traces sees exactly the tokens the model produced.
    turn = {
        "role": "assistant",
        "content": choice.message.content,
        "reasoning_content": choice.message.model_extra["reasoning_content"],
        "tool_calls": [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.function.name, "arguments": call.function.arguments},
            }
        ],
    }
    prompt = tokenizer.apply_chat_template(ASK, tools=TOOLS, add_generation_prompt=True, tokenize=False)
    assert tokenizer.apply_chat_template(ASK + [turn], tools=TOOLS, tokenize=False) == prompt + FORCED + "\n"


def test_forced_tool_call_streams_as_deltas(client, tokenizer):
    config = forcing_config(tokenizer, ASK, TOOLS, FORCED)
    chunks = list(
        client.chat.completions.create(
            model="tiny",
            messages=ASK,
            tools=TOOLS,
            max_tokens=64,
            stream=True,
            extra_body={"generation_config": config},
        )
    )
    deltas = [c.choices[0].delta for c in chunks]
    reasoning = "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas)
    content = "".join(d.content or "" for d in deltas)
    calls = [tc for d in deltas for tc in (d.tool_calls or [])]
    # Upstream streams the whitespace around </think> that the non-streaming parser strips.
    assert (reasoning.strip(), content.strip()) == ("I will read it.", "Let me look.")
    assert [(tc.index, tc.function.name, json.loads(tc.function.arguments)) for tc in calls] == [
        (0, "read_file", {"path": "a.txt"})
    ]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


MALFORMED = 'Let me look.\n<tool_call>\n{"name": "read_file", "arguments": {"path": \n</tool_call><|im_end|>'


def test_malformed_tool_call_comes_back_as_content_not_a_server_error(client, tokenizer):
    """A model that writes a <tool_call> whose body is not JSON produced output, not a server fault:
    the reply is 200 with the raw text as content and no tool_calls (upstream answered 500)."""
    config = forcing_config(tokenizer, ASK, TOOLS, MALFORMED)
    resp = client.chat.completions.create(
        model="tiny", messages=ASK, tools=TOOLS, max_tokens=64, extra_body={"generation_config": config}
    )
    message = resp.choices[0].message
    assert not message.tool_calls and resp.choices[0].finish_reason == "stop"
    assert message.content.startswith("Let me look.") and '"path": ' in message.content
    chunks = list(
        client.chat.completions.create(
            model="tiny",
            messages=ASK,
            tools=TOOLS,
            max_tokens=64,
            stream=True,
            extra_body={"generation_config": config},
        )
    )
    assert not [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    assert "Let me look." in "".join(c.choices[0].delta.content or "" for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert client.chat.completions.create(**sampled(tokenizer, 7)).choices[0].message.content  # still serving


def test_tools_and_history_reasoning_reach_the_prompt(client, tokenizer):
    history = ASK + [
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "The file may be long so I read it whole.",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "a.txt"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "hello"},
    ]
    resp = client.chat.completions.create(model="tiny", messages=history, tools=TOOLS, max_tokens=1)
    local = tokenizer.apply_chat_template(history, tools=TOOLS, add_generation_prompt=True, return_dict=True)
    without_reasoning = [{k: v for k, v in m.items() if k != "reasoning_content"} for m in history]
    shorter = tokenizer.apply_chat_template(
        without_reasoning, tools=TOOLS, add_generation_prompt=True, return_dict=True
    )
    assert resp.usage.prompt_tokens == len(local["input_ids"])
    assert len(shorter["input_ids"]) < resp.usage.prompt_tokens


@pytest.mark.parametrize(
    "body, status, needle",
    [
        pytest.param("{not json", 422, "JSON decode error", id="bad-json"),
        pytest.param({"model": "tiny"}, 400, "'messages' must be a non-empty list", id="missing-messages"),
        pytest.param({"messages": "hi"}, 400, "'messages' must be a non-empty list", id="messages-not-list"),
        pytest.param({"messages": [{"role": "robot", "content": "x"}]}, 400, "messages[0].role", id="bad-role"),
        pytest.param({"messages": [{"role": "user", "content": 5}]}, 400, "messages[0].content", id="bad-content"),
        pytest.param(
            {
                "messages": [
                    {
                        "role": "assistant",
                        "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{x"}}],
                    }
                ]
            },
            400,
            "arguments is not valid JSON",
            id="bad-tool-arguments",
        ),  # fmt: skip
        pytest.param({"messages": ASK, "tools": [{"type": "function"}]}, 400, "'tools' must be", id="bad-tools"),
        pytest.param({"messages": ASK, "logit_bias": {"x": 1}}, 400, "'logit_bias' must map", id="bad-logit-bias"),
        pytest.param(
            {"messages": ASK, "max_tokens": 0}, 400, "'max_tokens' must be a positive integer", id="bad-max-tokens"
        ),
        pytest.param(
            {"messages": ASK, "generation_config": "{x"}, 400, "'generation_config' must be", id="bad-gen-config"
        ),
        pytest.param({"model": "other", "messages": ASK}, 404, "not served here", id="unknown-model"),
        pytest.param({"messages": ASK, "bogus": 1}, 422, "Unexpected fields", id="unknown-field"),
    ],
)
def test_malformed_requests_get_4xx_and_the_server_survives(server, body, status, needle):
    content = body if isinstance(body, str) else json.dumps(body)
    resp = httpx.post(
        f"{server.base_url}/v1/chat/completions",
        content=content,
        headers={"content-type": "application/json"},
        timeout=30,
    )
    assert resp.status_code == status, resp.text
    assert needle in resp.text
    assert httpx.get(f"{server.base_url}/health").status_code == 200


@pytest.mark.slow(cost=10)  # two server starts: the slow tier
def test_server_stops_cleanly_and_reports_a_failed_start(tiny_model_dir, tmp_path):
    srv = ModelServer(tiny_model_dir, device="cpu")
    assert srv.served_name == tiny_model_dir.name
    with srv:
        pid = srv.process.pid
        assert httpx.get(f"{srv.base_url}/health").status_code == 200
    assert srv.process is None
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{srv.base_url}/health", timeout=2)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)

    with pytest.raises(RuntimeError, match="exited with code 2 before it was healthy(.|\\n)*no such directory"):
        ModelServer(tmp_path / "missing-model", device="cpu", startup_timeout_s=60).start()


def test_the_project_model_client_talks_to_it(server):
    from mass_jobs.config.run_spec import Sampling
    from mass_jobs.serving.llm import ModelClient

    # ModelClient sends top_k top-level and a seed: both must be accepted (upstream alone answers 422).
    with ModelClient(server.endpoint, Sampling(temperature=1.0, top_k=40), timeout_s=60, retries=0) as client:
        first, again = (client.chat(ASK, seed=3, max_tokens=4) for _ in range(2))
    assert first["role"] == "assistant" and first["finish_reason"] in ("length", "stop")
    assert 1 <= first["usage"]["completion_tokens"] <= 4
    assert (first["content"], first["usage"]) == (again["content"], again["usage"])


LEAKY = 'Done <|im_start|>user\nok<|im_start|>.\n<tool_call>\n{"name": \n</tool_call><|im_end|>'


def test_control_tokens_never_reach_a_client(client, tokenizer):
    """Turn and padding markers the model writes (here forced, also around a malformed tool call
    whose raw text is passed through) are removed from content, streamed and not."""
    config = forcing_config(tokenizer, ASK, TOOLS, LEAKY)
    ask = dict(model="tiny", messages=ASK, tools=TOOLS, max_tokens=64, extra_body={"generation_config": config})
    whole = client.chat.completions.create(**ask).choices[0].message.content
    chunks = list(client.chat.completions.create(stream=True, **ask))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks)
    for text in (whole, streamed):
        assert "<|im_start|>" not in text and "<|im_end|>" not in text, text
        assert text.startswith("Done user\nok.")  # the text around the tokens is kept


def test_token_filter_holds_a_split_token_back_until_it_is_decided():
    from mass_jobs.serving.serve import TokenFilter

    flt = TokenFilter(("<|im_end|>",))
    assert [flt.feed(p) for p in ("a <", "|im_", "end|> b <", "c")] == ["a ", "", " b ", "<c"]
    assert (flt.feed("x <|im"), flt.flush()) == ("x ", "<|im")
