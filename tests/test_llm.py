"""ModelClient against a real loopback server (the scripted test endpoint): retries, timeouts, sampling."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from mass_jobs.config.run_spec import Sampling
from mass_jobs.serving.llm import Endpoint, ModelClient, ModelError, normalize_message, parse_tool_calls
from mass_jobs.tools.testing.scripted_endpoint import Reply, ScriptedEndpoint

SAMPLING = Sampling(temperature=0.3, top_p=0.9, top_k=7, max_output_tokens=100)
MSGS = [{"role": "system", "content": "you are terse"}, {"role": "user", "content": "say hi"}]


def client(ep, **kw) -> ModelClient:
    kw.setdefault("backoff_s", 0.01)
    return ModelClient(ep.endpoint if hasattr(ep, "endpoint") else ep, SAMPLING, **kw)


def test_chat_returns_normalised_message_and_sends_sampling(scripted_endpoint):
    ep = scripted_endpoint({"*": [Reply.text("hi there", reasoning="think")]})
    msg = client(ep).chat(MSGS, seed=5, max_tokens=500, headers={"X-Mass-Agent": "a1"})
    assert msg["role"] == "assistant"
    assert msg["content"] == "hi there"
    assert msg["reasoning_content"] == "think"
    assert msg["tool_calls"] == []
    assert msg["finish_reason"] == "stop"
    assert msg["usage"] == {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
    body = ep.requests[0]["body"]
    assert (body["temperature"], body["top_p"], body["top_k"], body["seed"]) == (0.3, 0.9, 7, 5)
    assert body["max_tokens"] == 100  # min(max_output_tokens=100, given=500)
    assert ep.requests[0]["headers"]["x-mass-agent"] == "a1"


def test_max_tokens_given_smaller_wins_and_tools_sent(scripted_endpoint):
    ep = scripted_endpoint({"*": [Reply.call("shell", cmd="ls -la")]})
    tools = [{"type": "function", "function": {"name": "shell", "parameters": {"type": "object"}}}]
    msg = client(ep).chat(MSGS, tools=tools, max_tokens=40)
    assert ep.requests[0]["body"]["max_tokens"] == 40
    assert ep.requests[0]["body"]["tools"] == tools
    assert "seed" not in ep.requests[0]["body"]
    assert msg["finish_reason"] == "tool_calls"
    [call] = parse_tool_calls(msg)
    assert (call.name, call.arguments, call.error) == ("shell", {"cmd": "ls -la"}, None)


def test_retries_on_503_then_200(scripted_endpoint):
    ep = scripted_endpoint({"*": [Reply.fail(503), Reply.fail(503), Reply.text("ok")]})
    assert client(ep, retries=4).chat(MSGS)["content"] == "ok"
    assert len(ep.requests) == 3


def test_retries_on_429(scripted_endpoint):
    ep = scripted_endpoint({"*": [Reply.fail(429), Reply.text("ok")]})
    assert client(ep).chat(MSGS)["content"] == "ok"
    assert len(ep.requests) == 2


def test_gives_up_after_retries_with_status_and_body(scripted_endpoint):
    ep = scripted_endpoint({"*": [Reply.fail(500, '{"error": "boom"}')] * 3})
    with pytest.raises(ModelError) as e:
        client(ep, retries=2).chat(MSGS)
    assert (e.value.kind, e.value.status, e.value.body, e.value.attempts) == (
        "upstream_status",
        500,
        '{"error": "boom"}',
        3,
    )
    assert len(ep.requests) == 3


def test_no_retry_on_400(scripted_endpoint):
    ep = scripted_endpoint({"*": [Reply.fail(400, '{"error": "bad tools"}'), Reply.text("never")]})
    with pytest.raises(ModelError) as e:
        client(ep, retries=4).chat(MSGS)
    assert e.value.status == 400 and "bad tools" in e.value.body
    assert len(ep.requests) == 1 and ep.remaining("*") == 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_connection_refused_then_server_comes_up():
    port = free_port()
    ep = ScriptedEndpoint({"*": [Reply.text("up")]}, port=port)
    c = ModelClient(Endpoint(f"http://127.0.0.1:{port}/v1", "scripted"), SAMPLING, retries=6, backoff_s=0.1)
    # the clock starts before the timer: the server cannot answer before 0.3 s however loaded the
    # machine is (measured from after the client was built, a busy worker once saw 0.2 s)
    t0 = time.monotonic()
    starter = threading.Timer(0.3, ep.start)
    starter.start()
    try:
        assert c.chat(MSGS)["content"] == "up"
        assert time.monotonic() - t0 >= 0.3
        assert len(ep.requests) == 1
    finally:
        starter.join()
        ep.stop()


def test_connection_refused_gives_up_as_connection_error():
    c = ModelClient(Endpoint(f"http://127.0.0.1:{free_port()}/v1", "m"), SAMPLING, retries=1, backoff_s=0.01)
    with pytest.raises(ModelError) as e:
        c.chat(MSGS)
    assert e.value.kind == "connection" and e.value.attempts == 2


def test_timeout_is_honoured_and_retried(scripted_endpoint):
    # the slow reply takes 30 s (the endpoint's thread sleeps on alone): finishing well before it shows
    # the 0.3 s timeout acted, with many seconds to spare on a loaded worker
    ep = scripted_endpoint({"*": [Reply(content="late", delay_s=30.0), Reply.text("fast")]})
    t0 = time.monotonic()
    assert client(ep, timeout_s=0.3, retries=1).chat(MSGS)["content"] == "fast"
    assert time.monotonic() - t0 < 15  # did not wait for the slow reply


def test_timeout_gives_up_with_kind_timeout(scripted_endpoint):
    ep = scripted_endpoint({"*": [Reply(content="late", delay_s=30.0)]})
    t0 = time.monotonic()
    with pytest.raises(ModelError) as e:
        client(ep, timeout_s=0.2, retries=0).chat(MSGS)
    assert e.value.kind == "timeout"
    assert time.monotonic() - t0 < 15


def test_api_key_from_env_sent_as_bearer(scripted_endpoint, monkeypatch):
    ep = scripted_endpoint({"*": [Reply.text("ok")]})
    monkeypatch.setenv("TEST_LLM_KEY", "sk-secret")
    c = ModelClient(Endpoint(ep.base_url, "scripted", api_key_env="TEST_LLM_KEY"), SAMPLING)
    c.chat(MSGS)
    assert ep.requests[0]["headers"]["authorization"] == "Bearer sk-secret"
    monkeypatch.delenv("TEST_LLM_KEY")
    with pytest.raises(ModelError, match="TEST_LLM_KEY is not set"):
        c.chat(MSGS)


def test_endpoint_url_keeps_kserve_prefix(scripted_endpoint):
    ep = scripted_endpoint({"*": [Reply.text("ok")]}, base_path="/openai/v1")
    assert Endpoint("http://h/openai/v1/", "m").url("/chat/completions") == "http://h/openai/v1/chat/completions"
    assert client(ep).chat(MSGS)["content"] == "ok"
    assert ep.requests[0]["path"] == "/openai/v1/chat/completions"


def test_parse_tool_calls_reports_malformed_without_raising():
    msg = normalize_message(
        {
            "tool_calls": [
                {"id": "a", "function": {"name": "write", "arguments": '{"path": "x"'}},
                {"id": "b", "function": {"name": "list", "arguments": ""}},
                {"id": "c", "function": {"name": "read", "arguments": "[1, 2]"}},
                {"id": "d", "function": {"name": "read", "arguments": {"path": "y"}}},
                {"id": "e", "function": {"arguments": "{}"}},
            ]
        }
    )
    calls = parse_tool_calls(msg)
    assert [c.id for c in calls] == ["a", "b", "c", "d", "e"]
    assert "not valid JSON" in calls[0].error and calls[0].arguments == {}
    assert calls[1].error is None and calls[1].arguments == {}
    assert "must be a JSON object, got list" in calls[2].error
    assert calls[3].arguments == {"path": "y"} and calls[3].raw_arguments == '{"path": "y"}'
    assert calls[4].error == "tool call has no function name"


def test_malformed_tool_call_json_from_server_is_reported(scripted_endpoint):
    ep = scripted_endpoint({"*": [Reply(tool_calls=[{"name": "shell", "arguments": '{"cmd": "ls'}])]})
    [call] = parse_tool_calls(client(ep).chat(MSGS))
    assert call.name == "shell" and call.raw_arguments == '{"cmd": "ls' and "not valid JSON" in call.error
