"""qwen-code (the real npm CLI) as the episode harness, against the scripted endpoint (test fixture).

The scripted replies are keyed by system-prompt markers, since qwen-code sends no X-Mass-* headers:
its main session says "You are Qwen Code", its general-purpose sub-agent "You are a general-purpose
agent". Tool names and arguments are qwen-code's own (`agent`, `write_file`, `read_file` with
absolute `file_path`s).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from mass_jobs.config.run_spec import EpisodeLimits, Sampling
from mass_jobs.episodes.audit import audit_episode, split_threads
from mass_jobs.episodes.harness import EpisodeInput, run_episode, validate_status
from mass_jobs.episodes.qwen_code import DEFAULT_BIN, qwen_binary, settings
from mass_jobs.serving.llm import Endpoint
from mass_jobs.serving.proxy import read_trace
from mass_jobs.tools.testing.scripted_endpoint import Reply
from tests.fixtures.scripted import HARNESS_TEXT, MAIN, SUB


def run(ep, tmp_path, prompt="Write analysis.py and check it.", **limit_kw):
    limits = EpisodeLimits(
        **{"wall_s": 90, "request_retries": 0, "request_timeout_s": 30, "loop_repeats": 3, **limit_kw}
    )
    inp = EpisodeInput(prompt=prompt, endpoint=ep.endpoint, limits=limits, sampling=Sampling(max_output_tokens=256),
                       harness="qwen-code", seed=3)  # fmt: skip
    result = run_episode(inp, tmp_path / "ws", tmp_path / "out")
    validate_status(result.status)
    assert json.loads((tmp_path / "out" / "status.json").read_text()) == result.status
    return result, read_trace(tmp_path / "out" / "trace.jsonl")


def test_binary_is_installed_at_the_makefile_location():
    assert qwen_binary() == DEFAULT_BIN and DEFAULT_BIN.exists()


def test_qwen_code_delegates_writes_and_hands_off_a_file(scripted_endpoint, tmp_path, monkeypatch):
    monkeypatch.setenv("MASS_TEST_SECRET", "hunter2")
    ws = tmp_path / "ws"
    ws.mkdir()
    code = "print(sum([1, 2, 3]) / 3)\n"
    ep = scripted_endpoint(
        {
            SUB: [
                Reply.call("write_file", file_path=str(ws / "analysis.py"), content=code),
                Reply.text(f"Wrote {ws / 'analysis.py'}"),
                Reply.call("read_file", file_path=str(ws / "analysis.py")),
                Reply.text("analysis.py prints the mean"),
            ],
            MAIN: [
                Reply.call(
                    "agent",
                    description="write code",
                    prompt="Write analysis.py printing the mean of 1, 2, 3.",
                    subagent_type="general-purpose",
                ),  # fmt: skip
                Reply.call(
                    "agent",
                    description="review code",
                    prompt="Read analysis.py and say what it prints.",
                    subagent_type="general-purpose",
                ),  # fmt: skip
                Reply.text("Done: analysis.py prints 2.0"),
            ],
        }
    )
    result, trace = run(ep, tmp_path)
    assert (result.outcome, result.final_report) == ("success", "Done: analysis.py prints 2.0")
    assert (ws / "analysis.py").read_text() == code
    # All seven model calls went through the proxy: 3 main turns, 2 per sub-agent.
    assert len(trace) == 7 and all(r["status"] == 200 and r["agent"] is None for r in trace)
    names = {t["function"]["name"] for t in trace[0]["request"]["tools"]}
    assert {"agent", "write_file", "read_file", "run_shell_command"} <= names
    assert trace[0]["request"]["stream"] is True
    assert trace[0]["request"]["sampling"] == {
        "temperature": 0.6,
        "top_p": 0.95,
        "top_k": 20,
        "max_tokens": 256,
        "seed": 3,
    }
    assert "hunter2" not in json.dumps(trace)  # the scrubbed environment never reaches the prompt context
    threads = split_threads(trace)
    assert [(t.id, t.role, len(t.records)) for t in threads] == [
        ("orchestrator", "orchestrator", 3),
        ("worker-1", "worker", 2),
        ("worker-2", "worker", 2),
    ]
    assert result.status["counts"] == {"turns": 7, "tool_calls": 4, "delegations": 2, "agents": 3}
    assert result.status["tokens"]["prompt"] == sum(r["response"]["usage"]["prompt_tokens"] for r in trace) > 0
    assert result.status["sandbox"]["network_isolated"] is False
    audit = audit_episode(tmp_path / "out")
    assert (audit.delegation, audit.delegations_ok, audit.code_handoff) == (True, 2, True)
    assert audit.handoffs == [
        {"file": str(ws / "analysis.py"), "writer": "worker-1", "reader": "worker-2", "read_seq": 4}
    ]


def test_repeated_calls_stop_qwen_code_as_a_loop(scripted_endpoint, tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    ep = scripted_endpoint({MAIN: [Reply.call("list_directory", path=str(ws))]}, repeat_last=True)
    result, trace = run(ep, tmp_path, loop_repeats=3)
    assert result.outcome == "loop_detected" and "list_directory" in result.reason
    assert "3 times in a row" in result.reason
    assert 3 <= len(trace) <= 10  # stopped within a poll interval, long before its 40-turn session limit


def test_endpoint_errors_are_infra_error(scripted_endpoint, tmp_path):
    # qwen-code would retry 5xx seven times with backoff; the episode stops after request_retries + 1.
    ep = scripted_endpoint({MAIN: [Reply.fail(500)]}, repeat_last=True)
    result, trace = run(ep, tmp_path, request_retries=1)
    assert result.outcome == "infra_error" and "failed 2 times in a row: upstream_status (HTTP 500)" in result.reason
    assert [r["status"] for r in trace] == [500, 500] and result.status["timings"]["wall_s"] < 15


def test_wall_time_kills_qwen_code(scripted_endpoint, tmp_path):
    ep = scripted_endpoint({MAIN: [Reply(content="late", delay_s=20)]})
    result, _ = run(ep, tmp_path, wall_s=4)
    assert result.outcome == "timeout" and result.status["timings"]["wall_s"] < 12


def test_settings_turn_off_telemetry_and_carry_sampling():
    limits = EpisodeLimits(request_timeout_s=5, request_retries=2)
    s = settings(EpisodeInput(prompt="p", endpoint=Endpoint("http://127.0.0.1:1/v1", "m"), limits=limits, seed=9))
    assert s["privacy"] == {"usageStatisticsEnabled": False} and s["telemetry"] == {"enabled": False}
    assert s["model"]["name"] == "m" and s["security"]["auth"]["selectedType"] == "openai"
    assert s["memory"]["enableManagedAutoMemory"] is False and s["general"]["enableAutoUpdate"] is False
    gen = s["model"]["generationConfig"]
    assert gen["timeout"] == 5000 and gen["maxRetries"] == 2 and gen["extra_body"] == {"seed": 9}
    assert gen["samplingParams"] == {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "max_tokens": 32768}
    assert gen["contextWindowSize"] == 262144  # the served context, not qwen-code's guess for the model name


def test_the_paper_specs_harness_settings_are_upstreams():
    """examples/paper.yaml's settings as qwen-code gets them, beside upstream's run_episode.sh: no
    retries, the model's 262,144-token window, presence 0, repetition 1, thinking on; the builtin
    harness and the judges send the same pins with every request."""
    from mass_jobs.serving.llm import ModelClient
    from mass_jobs.spec.load import load_spec

    spec = load_spec(Path(__file__).parents[1] / "examples" / "paper.yaml")
    inp = EpisodeInput(
        prompt="p",
        endpoint=Endpoint("http://127.0.0.1:1/v1", "m"),
        limits=spec.execution.limits,
        sampling=spec.model.sampling,
        seed=3,
    )
    gen = settings(inp)["model"]["generationConfig"]
    upstream = {"maxRetries": 0, "contextWindowSize": 262144, "timeout": 1_800_000}
    assert {k: gen[k] for k in upstream} == upstream
    assert gen["samplingParams"] == {
        "temperature": 0.6,
        "top_p": 0.95,
        "top_k": 20,
        "max_tokens": 32768,
        "presence_penalty": 0.0,
        "repetition_penalty": 1.0,
    }
    assert gen["extra_body"] == {"seed": 3, "chat_template_kwargs": {"enable_thinking": True}}
    body = ModelClient(inp.endpoint, spec.model.sampling).request_body([{"role": "user", "content": "hi"}])
    assert body["presence_penalty"] == 0.0 and body["repetition_penalty"] == 1.0
    assert body["chat_template_kwargs"] == {"enable_thinking": True}
    # unset (every other spec): nothing extra is sent
    plain = ModelClient(inp.endpoint, EpisodeInput(prompt="p", endpoint=inp.endpoint).sampling).request_body([])
    assert not {"presence_penalty", "repetition_penalty", "chat_template_kwargs"} & set(plain)


# upstream's runtime/run_episode.sh, the settings block it writes for qwen-code, and where each value
# shows on the wire of an episode's first request (None: in qwen-code's settings, not the request)
UPSTREAM_EPISODE_SETTINGS = {
    "temperature": (0.6, "temperature"),
    "top_p": (0.95, "top_p"),
    "top_k": (20, "top_k"),
    "max_tokens": (32768, "max_tokens"),
    "presence_penalty": (0.0, "presence_penalty"),
    "repetition_penalty": (1.0, "repetition_penalty"),
    "enable_thinking": (True, "chat_template_kwargs.enable_thinking"),
    "maxRetries": (0, None),
    "contextWindowSize": (262144, None),
    "timeout (ms)": (1_800_000, None),
    # skipStartupContext left at qwen-code's default: 0.20.0 sends the view as a reminder before the task
    "startup view": ("reminder before the task", "view"),
    # tools.shell.defaultTimeoutMs: the default a shell command without its own timeout gets, as the
    # run_shell_command tool's description tells the model (the pinned bundle patched to read it)
    "shell defaultTimeoutMs": (600_000, "shell timeout"),
    # no loop setting: qwen-code's own detector at its default (0.15.10: skipLoopDetection true), and no
    # cap of the harness's own (execution.limits.loop_repeats)
    "model.skipLoopDetection": ("qwen-code's default", None),
    "loop cap of the harness": (None, None),
}


def shell_timeout_told(first: dict) -> int | None:
    """The default shell timeout (ms) the run_shell_command tool's description states in a request."""
    import re

    for tool in first.get("tools") or []:
        fn = tool.get("function") or {}
        if fn.get("name") == "run_shell_command":
            found = re.search(r"If not specified, commands will timeout after (\d+)ms", fn.get("description", ""))
            return int(found.group(1)) if found else None
    return None


VIEW_OPENS = "<system-reminder>\nThis is the Qwen Code. We are setting up the context for our chat.\n"


def startup_view(first: dict) -> str:
    """Where the environment view sits in a first request: a reminder part before the task, or not at all."""
    parts = first["messages"][1]["content"]
    ok = isinstance(parts, list) and len(parts) == 2 and parts[0]["text"].startswith(VIEW_OPENS)
    return "reminder before the task" if ok else "absent"


def test_a_real_qwen_code_episodes_first_request_under_the_paper_spec_is_upstreams(
    scripted_endpoint, tmp_path, tiny_model_dir
):
    """qwen-code itself, configured from examples/paper.yaml, against the scripted endpoint: its first
    request's sampling fields, and its settings, beside upstream's block, field by field; a failed
    request is not retried (upstream's maxRetries 0).

    The startup view (execution.startup_context: reminder): qwen-code 0.15.10 writes it (working
    directory, date, OS, folder tree) as a user turn and a canned reply; the model gets it as the
    paper's release sent it (measured on 0.21.2, the first release after 0.20.0 that npm has): a
    `<system-reminder>` text part before the task in one user message, in every thread. No request,
    trace or window holds the canned reply, and the render step still finds and strips the teacher prompt."""
    from transformers import AutoTokenizer

    from mass_jobs.config.run_spec import SftSpec
    from mass_jobs.spec.load import load_spec
    from mass_jobs.steps.render_sft import render_windows
    from mass_jobs.steps.sft_threads import EpisodeTrace, rebuild_threads
    from mass_jobs.steps.sft_tokens import IGNORE

    spec = load_spec(Path(__file__).parents[1] / "examples" / "paper.yaml")
    ws = tmp_path / "ws"
    ep = scripted_endpoint(
        {
            SUB: [
                Reply.call("write_file", file_path=str(ws / "analysis.py"), content="print(2.0)\n"),
                Reply.text("Wrote analysis.py"),
            ],
            MAIN: [
                Reply.call(
                    "agent",
                    description="write code",
                    prompt="Write analysis.py printing 2.0.",
                    subagent_type="general-purpose",
                ),
                Reply.text("Done: analysis.py prints 2.0"),
            ],
        }
    )
    parts = teacher_parts()
    inp = EpisodeInput(
        prompt=parts.text,
        endpoint=ep.endpoint,
        limits=spec.execution.limits,
        sampling=spec.model.sampling,
        harness="qwen-code",
        seed=3,
        files={"data/prices.csv": "date,close\n"},
        startup_context=spec.execution.startup_context,
    )
    result = run_episode(inp, ws, tmp_path / "out")
    first = next(r["body"] for r in ep.requests if r["path"].endswith("/chat/completions"))
    gen = settings(inp)["model"]["generationConfig"]
    ours = {
        "maxRetries": gen["maxRetries"],
        "contextWindowSize": gen["contextWindowSize"],
        "timeout (ms)": gen["timeout"],
        "model.skipLoopDetection": settings(inp)["model"].get("skipLoopDetection", "qwen-code's default"),
        "loop cap of the harness": inp.limits.loop_repeats,
    }
    rows = []
    for name, (upstream, wire) in UPSTREAM_EPISODE_SETTINGS.items():
        if wire is None:
            got = ours[name]
        elif wire == "view":
            got = startup_view(first)
        elif wire == "shell timeout":
            got = shell_timeout_told(first)
        else:
            got = first
            for part in wire.split("."):
                got = got.get(part, "<absent>") if isinstance(got, dict) else "<absent>"
        rows.append((name, upstream, got))
        print(f"{name:<20} upstream {upstream!s:<10} first request / settings {got}")
    assert [r for r in rows if r[1] != r[2]] == [], rows
    assert first["seed"] == 3 and first["stream"] is True
    assert "web_fetch" not in {t["function"]["name"] for t in first["tools"]}  # docs/parity.md says why

    trace = read_trace(tmp_path / "out" / "trace.jsonl")
    assert result.outcome == "success" and len(trace) == 4
    sent = [r["body"]["messages"] for r in ep.requests if r["path"].endswith("/chat/completions")]
    assert [m["messages"] for m in (r["request"] for r in trace)] == sent  # the trace is what the model got
    for messages in sent:  # every request of both threads: one user message opens it, view first
        assert messages[1]["role"] == "user" and all(m["role"] != "user" for m in messages[2:3])
        view, *task = messages[1]["content"]
        assert view["text"].startswith("<system-reminder>\nThis is the Qwen Code. We are setting up the context")
        assert view["text"].endswith("\n</system-reminder>")
        for line in (
            "My operating system is: linux",
            "I'm currently working in the directory: ",
            "Here is the folder structure of the current working directories:",
            "prices.csv",
        ):
            assert line in view["text"], line
        assert "Today's date is " in view["text"]
    main = [m for m in sent if m[0]["content"] and MAIN in json.dumps(m[0]["content"])]
    assert main[0][1]["content"][1:] == [{"type": "text", "text": parts.text}]
    assert "Got it. Thanks for the context!" not in json.dumps(trace)

    episode = EpisodeTrace(
        "mean",
        0,
        trace,
        bare_prompt=parts.task,
        teacher_prompt=parts.text,
        harness="qwen-code",
        strip_pieces=(parts.workflow, parts.directive),
    )
    assert [t.role for t in rebuild_threads(trace, "qwen-code", roles="prompt", prompt=parts.text)] == [
        "orchestrator",
        "worker",
    ]
    from tests.fixtures.chat_templates import QWEN3_THINKING

    stock = AutoTokenizer.from_pretrained(tiny_model_dir)
    thinking = AutoTokenizer.from_pretrained(tiny_model_dir)
    thinking.chat_template = QWEN3_THINKING
    for tok in (stock, thinking):
        windows, stats = render_windows([episode], tok, SftSpec(window=65536, context=512))
        assert stats["episode_errors"] == [] and stats["windows_by_role"] == {
            "orchestrator": 1,
            "worker": 1,
            "auxiliary": 0,
        }
        texts = [tok.decode(w.input_ids) for w in windows]
        orch = next(t for w, t in zip(windows, texts) if w.role == "orchestrator")
        assert "</system-reminder>" + parts.task in orch  # the view stays, the workflow and directive go
        assert not any(parts.workflow in t or parts.directive in t for t in texts)
        assert all("<system-reminder>" in t for t in texts)
        supervised = [tok.decode([x for x in w.labels if x != IGNORE]) for w in windows]
        assert not any("Got it" in s or "system-reminder" in s for s in supervised)
        assert boilerplate_draw_share(windows, tok) == 0.0

    failing = scripted_endpoint({MAIN: [Reply.fail(500)]}, repeat_last=True)
    failed = run_episode(dataclasses.replace(inp, endpoint=failing.endpoint), tmp_path / "ws2", tmp_path / "out2")
    assert failed.outcome == "infra_error"
    assert len([r for r in failing.requests if r["path"].endswith("/chat/completions")]) == 1


def teacher_parts():
    from mass_jobs.spec.workflow import DEFAULT_WORKFLOW, teacher_prompt_parts

    return teacher_prompt_parts("Write analysis.py printing the mean of 1, 2, 3, and check it.", DEFAULT_WORKFLOW)


def test_real_qwen_code_episode_renders_with_the_main_session_as_orchestrator(
    scripted_endpoint, tmp_path, tiny_model_dir
):
    from transformers import AutoTokenizer

    from mass_jobs.config.run_spec import SftSpec
    from mass_jobs.steps.render_sft import render_windows
    from mass_jobs.steps.sft_threads import EpisodeTrace, rebuild_threads
    from mass_jobs.steps.sft_tokens import IGNORE
    from tests.fixtures.chat_templates import QWEN3_THINKING, upstream_segment_masks

    ws = tmp_path / "ws"
    ws.mkdir()
    ep = scripted_endpoint(
        {
            SUB: [
                Reply.call("write_file", file_path=str(ws / "analysis.py"), content="print(2.0)\n"),
                Reply.text("Wrote analysis.py", reasoning="The file is written."),
            ],
            MAIN: [
                Reply(
                    reasoning="A coder should write it.",
                    tool_calls=[
                        {
                            "name": "agent",
                            "arguments": {
                                "description": "write code",
                                "prompt": "Write analysis.py printing 2.0.",
                                "subagent_type": "general-purpose",
                            },
                        }
                    ],
                ),
                Reply.text("Done: analysis.py prints 2.0", reasoning="The worker reported success."),
            ],
        }
    )
    parts = teacher_parts()
    result, trace = run(ep, tmp_path, prompt=parts.text)
    assert result.outcome == "success" and len(trace) == 4
    # qwen-code's thread shape without its startup context (settings: model.skipStartupContext), as
    # upstream's renderer reads it: the system prompt, then the task at messages[1]; no canned reply
    main = trace[0]["request"]["messages"]
    assert [m["role"] for m in main] == ["system", "user"]
    assert main[1]["content"] == [{"type": "text", "text": parts.text}]
    assert "Got it. Thanks for the context!" not in json.dumps(trace) and "setting up the context" not in json.dumps(
        trace
    )
    # A second user query in the main thread, as a follow-up turn of the same session would add.
    follow = {
        **trace[-1],
        "seq": 4,
        "request": {
            **trace[-1]["request"],
            "messages": trace[-1]["request"]["messages"]
            + [trace[-1]["response"]["message"], {"role": "user", "content": "Check it once more."}],
        },
        "response": {
            **trace[-1]["response"],
            "message": {"role": "assistant", "content": "It prints 2.0.", "reasoning_content": "Follow-up checked."},
        },
    }
    records = trace + [follow]
    assert [t.role for t in rebuild_threads(records, "qwen-code")] == ["orchestrator", "worker"]
    episode = EpisodeTrace(
        "mean",
        0,
        records,
        bare_prompt=parts.task,
        teacher_prompt=parts.text,
        harness="qwen-code",
        strip_pieces=(parts.workflow, parts.directive),
    )
    sft = SftSpec(window=65536, context=512)
    stock = AutoTokenizer.from_pretrained(tiny_model_dir)
    thinking = AutoTokenizer.from_pretrained(tiny_model_dir)
    thinking.chat_template = QWEN3_THINKING
    for tok in (stock, thinking):
        windows, stats = render_windows([episode], tok, sft)
        assert stats["episode_errors"] == [] and stats["episodes_dropped"] == []
        assert stats["threads_by_role"] == {"orchestrator": 1, "worker": 1, "auxiliary": 0}
        # per thread one window for the task; the main thread has the follow-up's too; none is harness text
        assert stats["windows_by_role"] == {"orchestrator": 2, "worker": 1, "auxiliary": 0}
        texts = [tok.decode(w.input_ids) for w in windows]
        assert not any(parts.workflow in t or parts.directive in t or "## Workflow" in t for t in texts)
        orch = [t for w, t in zip(windows, texts) if w.role == "orchestrator"]
        assert parts.task in orch[0] and "You are Qwen Code" in orch[0]
        supervised = [tok.decode([x for x in w.labels if x != IGNORE]) for w in windows if w.role == "orchestrator"]
        assert "A coder should write it." in supervised[0] and "Done: analysis.py prints 2.0" in supervised[0]
        assert "Follow-up checked." in supervised[1] and "A coder" not in supervised[1]
        assert boilerplate_draw_share(windows, tok) == 0.0
    # with the thinking template every segment's labels are upstream's mask of that segment
    main_thread = rebuild_threads(records, "qwen-code")[0]
    messages = [{**m, "content": m["content"].replace(parts.text, parts.task)} for m in main_thread.messages]
    reference = upstream_segment_masks(thinking, messages, main_thread.tools)
    orch_windows = [w for w in render_windows([episode], thinking, sft)[0] if w.role == "orchestrator"]
    assert [[x for x in w.labels if x != IGNORE] for w in orch_windows] == [
        [t for t, m in zip(ids, mask) if m] for ids, mask in reference
    ]


def test_qwen_codes_turn_limit_is_a_model_caused_end_of_its_own(scripted_endpoint, tmp_path):
    """qwen-code exits 53 at --max-session-turns: the model did not finish, the endpoint is not to blame."""
    # One call more than the limit lets through: qwen-code re-sends a request whose stream it judged
    # invalid without counting a turn (its "retry" message type); once in CI an extra request took a
    # scripted reply and the scripted "done" came within the limit. With that third request in the
    # trace, the harness's own turn count stops the episode first (the same outcome, its own reason).
    ep = scripted_endpoint(
        {
            MAIN: [
                Reply.call("run_shell_command", command="echo hi", description="look"),
                Reply.call("run_shell_command", command="echo ho", description="look again"),
                Reply.call("run_shell_command", command="echo hey", description="once more"),
                Reply.text("done"),
            ]
        }
    )
    result, trace = run(ep, tmp_path, turns_per_agent=2)
    shown = json.dumps({"status": result.status, "trace": trace})[-4000:]
    assert result.outcome == "turn_limit", shown
    if len(trace) == 2:
        assert result.reason == "qwen-code reached its turn limit (2 turns per session)", shown
    else:
        assert len(trace) == 3 and result.reason.endswith(" used more than 2 turns"), shown
    assert result.status["counts"]["turns"] == len(trace), shown


def test_uncapped_limits_pass_no_turn_limit_and_breach_nothing():
    """Upstream's default: qwen-code runs without --max-session-turns (its own default is no limit)
    and a trace of 60 turns and 300 calls breaks no limit; capped, the same trace breaks each."""
    from mass_jobs.episodes.qwen_code import command, limit_breach

    ep = Endpoint("http://127.0.0.1:1/v1", "m")
    capped = EpisodeInput(prompt="p", endpoint=ep, limits=EpisodeLimits(turns_per_agent=40))
    assert command(Path("qwen"), capped, ep)[-3:] == ["--max-session-turns", "40", "p"]
    free = EpisodeInput(prompt="p", endpoint=ep, limits=EpisodeLimits(loop_repeats=None))
    assert "--max-session-turns" not in command(Path("qwen"), free, ep)

    def call(i):
        return {"function": {"name": "run_shell_command", "arguments": '{"command": "echo %d"}' % (i // 5)}}

    records = [
        {
            "agent": {"id": "main", "role": "orchestrator", "parent": None},
            "status": 200,
            "request": {"messages": [{"role": "user", "content": "p"}] + [{"role": "user", "content": "x"}] * t},
            "response": {"message": {"role": "assistant", "tool_calls": [call(5 * t + j) for j in range(5)]}},
        }
        for t in range(60)
    ]
    assert limit_breach(records, free) is None
    for kw, outcome in (
        ({"turns_per_agent": 40}, "turn_limit"),
        ({"tool_calls": 200}, "failed"),
        ({"loop_repeats": 5}, "loop_detected"),
    ):
        lim = EpisodeLimits(**{"loop_repeats": None, **kw})
        assert limit_breach(records, EpisodeInput(prompt="p", endpoint=ep, limits=lim))[0] == outcome


def boilerplate_draw_share(windows, tok) -> float:
    """The share of the sampler's draws (orchestrator windows 1/3, the rest 2/3, uniform within;
    mass_jobs.training.sampler) that land on a window whose supervised text is only harness text."""
    from mass_jobs.steps.sft_tokens import IGNORE

    def only_harness(w) -> bool:
        text = tok.decode([x for x in w.labels if x != IGNORE])
        for canned in HARNESS_TEXT:
            text = text.replace(canned, "")
        return not text.replace("<|im_end|>", "").strip()

    groups = [[w for w in windows if w.role == "orchestrator"], [w for w in windows if w.role != "orchestrator"]]
    weights = [1 / 3, 2 / 3] if all(groups) else [1.0 if g else 0.0 for g in groups]
    return sum(wt * sum(map(only_harness, g)) / len(g) for wt, g in zip(weights, groups) if g)


def test_qwen_codes_prompt_does_not_depend_on_where_the_workspace_is(scripted_endpoint, tmp_path):
    """qwen-code shows its home's files in the system prompt by their path relative to the
    workspace: in the sandbox its home is one fixed place beside the workspace's folder (as in an
    agent pod), so two episodes in two folders send the model the same prompt."""
    import tempfile

    from mass_jobs.episodes.qwen_code import sandbox_home

    prompts = []
    for _ in range(2):
        ep = scripted_endpoint({"*": [Reply.text("done")]})
        with tempfile.TemporaryDirectory(prefix="mass-collect-") as tmp:  # as the steps lay out an episode
            run(ep, Path(tmp))
            prompts.append(ep.requests[0]["body"]["messages"][0]["content"])
    assert prompts[0] == prompts[1]
    assert "Context from: ../../tmp/qwen-home/.qwen/output-language.md" in str(prompts[0])
    pod = tmp_path / "pod"
    home = sandbox_home(pod / "workspace" / "ws")  # an agent pod's /workspace/ws: its /tmp/qwen-home
    assert home == pod / "tmp" / "qwen-home" and home.is_dir()
    assert sandbox_home(pod / "workspace" / "ws") is None  # taken: never shared by two runs
