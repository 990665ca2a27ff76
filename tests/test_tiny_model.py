"""The tiny model: architecture, determinism, tokenizer, chat template and loss masks; model locations."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from mass_jobs.commands.cli import main as cli_main
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
CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is in a.txt?"},
    {
        "role": "assistant",
        "content": "",
        "reasoning_content": "Read it first.",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": {"path": "a.txt"}}}
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "hello"},
    {"role": "assistant", "content": "It says hello."},
]
EXPECTED_RENDER = (
    "<|im_start|>system\nBe brief.\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    + json.dumps(TOOLS[0])
    + "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call><|im_end|>\n"
    "<|im_start|>user\nWhat is in a.txt?<|im_end|>\n"
    "<|im_start|>assistant\n<think>\nRead it first.\n</think>\n\n"
    '<tool_call>\n{"name": "read_file", "arguments": {"path": "a.txt"}}\n</tool_call><|im_end|>\n'
    "<|im_start|>user\n<tool_response>\nhello\n</tool_response><|im_end|>\n"
    "<|im_start|>assistant\nIt says hello.<|im_end|>\n"
)


def file_hashes(directory) -> dict[str, str]:
    """Content hashes of a model dir's files; the warm build's key file records its build time, so
    it is left out (`warm-key.json`, compared on its own where it matters)."""
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.iterdir())
        if p.name != "warm-key.json"
    }


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def test_loads_as_qwen3_with_the_requested_shape(tiny_model_dir):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    cfg = model.config
    assert (cfg.model_type, type(model).__name__) == ("qwen3", "Qwen3ForCausalLM")
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads) == (2, 128, 4, 2)
    assert cfg.max_position_embeddings >= 65536 and cfg.rope_parameters["rope_theta"] == 1_000_000.0
    assert 4000 <= cfg.vocab_size <= 8000
    assert all(p.dtype == torch.float32 for p in model.parameters())
    logits = model(torch.tensor([[1, 2, 3]])).logits
    assert tuple(logits.shape) == (1, 3, cfg.vocab_size)


def test_same_seed_gives_identical_files_and_other_seed_other_weights(tiny_model_dir, tmp_path):
    assert cli_main(["model", "tiny", "--out", str(tmp_path / "again"), "--seed", "0"]) == 0
    assert cli_main(["model", "tiny", "--out", str(tmp_path / "seed1"), "--seed", "1"]) == 0
    first, again, other = (file_hashes(d) for d in (tiny_model_dir, tmp_path / "again", tmp_path / "seed1"))
    assert set(first) >= {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}
    assert first == again
    assert other["model.safetensors"] != first["model.safetensors"]
    assert {k: v for k, v in other.items() if k != "model.safetensors"} == {
        k: v for k, v in first.items() if k != "model.safetensors"
    }


def test_special_tokens_are_single_ids_and_eos_pad_are_set(tokenizer):
    for token in SPECIAL_TOKENS:
        assert len(tokenizer(token, add_special_tokens=False)["input_ids"]) == 1, token
    assert (tokenizer.eos_token, tokenizer.pad_token) == ("<|im_end|>", "<|endoftext|>")
    # Decoding keeps the text byte-exact (byte-level BPE, no normalisation).
    text = 'def f(x):\n    return {"ok": x}  # café ✓\n'
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text


def test_tool_calls_tokenize_compactly(tokenizer):
    call = '<tool_call>\n{"name": "read_file", "arguments": {"path": "src/main.py"}}\n</tool_call>'
    n = len(tokenizer(call, add_special_tokens=False)["input_ids"])
    assert n <= 26, n  # vs 80 bytes: the BPE learned the JSON/tool-call glue


def test_chat_template_renders_qwen3_layout(tokenizer):
    text = tokenizer.apply_chat_template(CONVERSATION, tools=TOOLS, tokenize=False)
    assert text == EXPECTED_RENDER


def test_generation_prompt_and_thinking_switch(tokenizer):
    msgs = [{"role": "user", "content": "hi"}]
    assert tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
    off = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, enable_thinking=False)
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_reasoning_of_turns_before_the_last_user_message_is_dropped(tokenizer):
    msgs = [
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "a1", "reasoning_content": "old thought"},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "a2", "reasoning_content": "new thought"},
    ]
    text = tokenizer.apply_chat_template(msgs, tokenize=False)
    assert "old thought" not in text
    assert "<|im_start|>assistant\n<think>\nnew thought\n</think>\n\na2<|im_end|>" in text


def test_assistant_mask_covers_exactly_the_generated_parts(tokenizer):
    out = tokenizer.apply_chat_template(CONVERSATION, tools=TOOLS, return_assistant_tokens_mask=True, return_dict=True)
    ids, mask = out["input_ids"], out["assistant_masks"]
    assert len(ids) == len(mask)
    first = (
        "<think>\nRead it first.\n</think>\n\n"
        '<tool_call>\n{"name": "read_file", "arguments": {"path": "a.txt"}}\n</tool_call><|im_end|>'
    )
    second = "It says hello.<|im_end|>"
    expected = len(tokenizer(first, add_special_tokens=False)["input_ids"]) + len(
        tokenizer(second, add_special_tokens=False)["input_ids"]
    )
    assert sum(mask) == expected
    assert tokenizer.decode([i for i, m in zip(ids, mask) if m]) == first + second
    # Prompt-side tokens (system, user, tool results, role headers) are never trained on.
    assert tokenizer.decode(ids[: mask.index(1)]).endswith("<|im_start|>assistant\n")


# ---- model locations (mass_jobs.serving.model_dirs) ----


def test_resolve_local_dir_and_file_uri(tiny_model_dir):
    from mass_jobs.serving.model_dirs import resolve_model

    assert resolve_model(tiny_model_dir) == tiny_model_dir
    assert resolve_model(f"file://{tiny_model_dir}") == tiny_model_dir


@pytest.mark.parametrize("bad", ["/no/such/model/dir", "./missing", "not a hub id!"])
def test_resolve_rejects_what_is_not_a_model_location(bad):
    from mass_jobs.serving.model_dirs import ModelLocationError, resolve_model

    with pytest.raises(ModelLocationError, match="no such directory"):
        resolve_model(bad)


@pytest.mark.parametrize("layout", ["objects", "archive"])
def test_resolve_s3_downloads_once_and_loads(layout, tiny_model_dir, s3_env, tmp_path):
    import torch

    from mass_jobs.serving.model_dirs import ModelLocationError, load_model, load_tokenizer, resolve_model
    from mass_jobs.store import open_store

    options = {"endpoint_url": s3_env["endpoint_url"], "region": s3_env["region"]}
    store = open_store(f"s3://{s3_env['bucket']}", **options)
    key = f"runs/{layout}/gen-1/model"
    if layout == "objects":
        for p in sorted(tiny_model_dir.iterdir()):
            store.put_file(f"{key}/{p.name}", p)
    else:
        store.put_dir(key, tiny_model_dir)
    uri = f"s3://{s3_env['bucket']}/{key}"
    cache = tmp_path / "cache"

    local = resolve_model(uri, cache_dir=cache, store_options=options)
    assert local.parent == cache
    assert {k: v for k, v in file_hashes(local).items() if not k.startswith(".")} == file_hashes(tiny_model_dir)

    # Used again while the objects are the ones it holds: not fetched a second time
    marker = local / ".mass-complete"
    fetched = marker.stat().st_mtime_ns
    assert resolve_model(uri, cache_dir=cache, store_options=options) == local
    assert marker.stat().st_mtime_ns == fetched

    model = load_model(uri, dtype="float32", cache_dir=cache, store_options=options)
    reference = load_model(tiny_model_dir, dtype="float32")
    assert torch.equal(model.model.embed_tokens.weight, reference.model.embed_tokens.weight)
    assert load_tokenizer(uri, cache_dir=cache, store_options=options).eos_token == "<|im_end|>"

    # A model re-uploaded to the same location is fetched anew, not served from the old copy (a
    # cache keyed by the URI alone kept the first upload's files for ever)
    changed = tmp_path / "changed"
    shutil.copytree(tiny_model_dir, changed)
    config = json.loads((changed / "config.json").read_text())
    (changed / "config.json").write_text(json.dumps({**config, "rope_theta": 12345.0}))
    if layout == "objects":
        store.put_file(f"{key}/config.json", changed / "config.json")
    else:
        store.put_dir(key, changed)
    again = resolve_model(uri, cache_dir=cache, store_options=options)
    assert again == local and json.loads((again / "config.json").read_text())["rope_theta"] == 12345.0

    # Gone from the store: an error naming the location, not the stale copy
    for k in store.list(key):
        store.delete(k)
    with pytest.raises(ModelLocationError, match="no objects under"):
        resolve_model(uri, cache_dir=cache, store_options=options)


def test_resolve_s3_missing_key_names_it(s3_env, tmp_path):
    from mass_jobs.serving.model_dirs import ModelLocationError, resolve_model

    options = {"endpoint_url": s3_env["endpoint_url"], "region": s3_env["region"]}
    uri = f"s3://{s3_env['bucket']}/nothing/here"
    with pytest.raises(ModelLocationError, match="no objects under 'nothing/here/'"):
        resolve_model(uri, cache_dir=tmp_path, store_options=options)
    assert list(tmp_path.iterdir()) == []  # no half-written cache entry left behind


# ---- the warm tiny model (mass_jobs.tiny.warm): well-formed replies for the demo ----

DEMO_TASKS = [
    "Write fib.py that prints the first 10 Fibonacci numbers and save them to results/fib.json.",
    "Write primes.py that lists the primes below the number in data/limit.txt and save the count to "
    'results/metrics.json as {"count": N}.',
    "Write sort.py that sorts the numbers in data/nums.txt and writes them to results/sorted.txt.",
]


@pytest.mark.slow  # builds warm models (short warm-ups, then the behaviour check)
def test_warm_up_is_deterministic_for_the_seed_and_moves_the_weights(tiny_model_dir, tmp_path):
    from mass_jobs.tiny.warm import build_warm_model

    first = file_hashes(build_warm_model(tmp_path / "a", seed=0, steps=6))
    again = file_hashes(build_warm_model(tmp_path / "b", seed=0, steps=6))
    assert first == again
    assert first["model.safetensors"] != file_hashes(tiny_model_dir)["model.safetensors"]


def test_warm_corpus_delegates_on_workflow_prompts_and_mostly_works_alone_on_bare_ones():
    import json

    from mass_jobs.episodes.builtin import ORCHESTRATOR_SYSTEM
    from mass_jobs.tiny.warm_corpus import BARE_DELEGATES, warm_corpus

    seen = {"bare": [], "workflow": []}
    for messages, _ in warm_corpus(0, per_kind=60):
        if messages[0]["content"] != ORCHESTRATOR_SYSTEM:
            continue
        first = messages[2]["tool_calls"][0]["function"]["name"]
        seen["workflow" if "## Workflow" in messages[1]["content"] else "bare"].append(first)
        if messages[2]["tool_calls"][0]["function"]["name"] == "delegate":  # the worker's result is true
            assert messages[-1]["tool_calls"][0]["function"]["arguments"]["status"] == "success"
    assert set(seen["workflow"]) == {"delegate"} and len(seen["workflow"]) > 40
    share = seen["bare"].count("delegate") / len(seen["bare"])
    assert len(seen["bare"]) > 40 and 0 < share < 2.5 * BARE_DELEGATES, share  # a minority (seeded draws)
    assert set(seen["bare"]) == {"delegate", "list_files", "read_file"}
    fib = [
        m
        for m, _ in warm_corpus(3, per_kind=60)
        if "fib.py" in m[1]["content"] and m[0]["content"].startswith("You are worker")
    ]
    for m in fib:  # the worker writes the true numbers, so a grader can tell right from wrong
        k = int(m[1]["content"].split("first ")[1].split()[0])
        fib_k = [0, 1]
        while len(fib_k) < k:
            fib_k.append(fib_k[-1] + fib_k[-2])
        assert json.loads(m[4]["tool_calls"][0]["function"]["arguments"]["content"]) == fib_k[:k]


@pytest.mark.slow  # builds warm models (short warm-ups, then the behaviour check)
def test_warm_build_is_cached_by_its_key_and_rebuilt_when_the_key_differs(tmp_path):
    import json

    from mass_jobs.tiny.warm import KEY_FILE, cached_build, is_tiny_build, warm_key

    said = []
    path, seconds = cached_build(tmp_path / "warm", seed=0, steps=3, say=said.append)
    assert seconds is not None and seconds > 0 and "not built yet" in said[-1]
    stamp = json.loads((path / KEY_FILE).read_text())
    assert stamp["key"] == warm_key(0, 3) and stamp["build_s"] > 0
    weights = file_hashes(path)
    assert cached_build(path, seed=0, steps=3, say=said.append) == (path, None) and "cached" in said[-1]
    (path / KEY_FILE).write_text(json.dumps({"key": {**warm_key(0, 3), "builder_version": 1}}))
    _, again = cached_build(path, seed=0, steps=3, say=said.append)
    assert again is not None and "key differs" in said[-1]
    assert file_hashes(path) == weights  # the same inputs give the same bytes
    assert [p.name for p in tmp_path.iterdir()] == ["warm"]  # no temporary build left beside it
    (path / KEY_FILE).unlink()  # an older builder's dir (no key) is still recognised as ours
    assert is_tiny_build(path) and not is_tiny_build(tmp_path / "elsewhere")


def test_warm_corpus_renders_every_role_with_supervised_replies():
    from mass_jobs.tiny.build import build_tokenizer
    from mass_jobs.tiny.warm import encode
    from mass_jobs.tiny.warm_corpus import warm_corpus

    corpus = warm_corpus(0, per_kind=2)
    systems = [messages[0]["content"][:15] for messages, _ in corpus]
    assert len(set(systems)) == 4  # orchestrator, worker, evaluator, optimizer
    for ids, labels in encode(build_tokenizer(), corpus):
        supervised = [t for t in labels if t != -100]
        assert 0 < len(supervised) < len(ids)


@pytest.fixture(scope="module")
def warm_server(warm_tiny_model_dir):
    from mass_jobs.serving.serve import ModelServer

    with ModelServer(warm_tiny_model_dir) as srv:
        yield srv


def _client(srv, temperature: float):
    from mass_jobs.config.run_spec import Sampling
    from mass_jobs.serving.llm import ModelClient

    return ModelClient(srv.endpoint, Sampling(temperature=temperature, max_output_tokens=128), timeout_s=60, retries=0)


def _bundles(tmp_path, task_index: int) -> list[tuple[str, str]]:
    from mass_jobs.judging.compare import bundle

    layouts = [{"main.py": "print(1)\n", "results/out.json": "[1, 2]\n"}, {"main.py": "print(2)\n"}, {}]
    out = []
    for n, files in enumerate(layouts):
        ws = tmp_path / f"t{task_index}-ws{n}"
        ws.mkdir()
        for rel, text in files.items():
            (ws / rel).parent.mkdir(parents=True, exist_ok=True)
            (ws / rel).write_text(text)
        out.append((f"ws{n}", bundle(ws, 16384, ["main.py", "results/out.json"], {"outcome": "success"})))
    return out


# The warm build checks its own behaviours before it is written (mass_jobs/tiny/warm_check.py:
# THRESHOLDS, on other prompts and seeds); these tests sample the same behaviours through the real
# server. Each bound below is set so that a model exactly at the build's guaranteed rate fails it by
# sampling alone with the probability stated (binomial tail, `_tail`), at most 3%.
SAMPLED_SEEDS = (1, 2, 3)


def _tail(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p)."""
    from math import comb

    return sum(comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k + 1))


def test_warm_model_answers_valid_verdicts_to_compare_requests(warm_server, tmp_path):
    from mass_jobs.judging import compare
    from mass_jobs.tiny.warm_check import THRESHOLDS

    greedy, sampled = _client(warm_server, 0.0), _client(warm_server, 0.6)
    valid, n, labels = 0, 0, []
    for t, task in enumerate(DEMO_TASKS):
        full, partial, empty = _bundles(tmp_path, t)
        for first, second in ((full, empty), (empty, partial)):
            v = compare.judge(greedy, task, first, second, retries=0)  # the request exactly as search/rank send it
            valid, n = valid + v.valid, n + 1
        for seed in range(4):
            v = compare.judge(sampled, task, partial, full, retries=0, seed=100 + 10 * t + seed)
            valid, n = valid + v.valid, n + 1
            if v.valid:
                labels.append({"ws1": "A", "ws0": "B", "tie": "tie"}[v.winner])
    assert n == 18 and _tail(13, 18, THRESHOLDS["verdicts_valid"][1]) < 0.03
    assert valid >= 14, f"{valid}/{n} verdicts valid"
    assert len(set(labels)) >= 2, labels  # mixed, not one fixed answer


def test_warm_orchestrator_delegates_when_a_workflow_says_so_and_works_alone_on_a_bare_prompt(warm_server):
    """The behaviour MASS must move: at L0 a bare prompt gets no delegation (the paper's L0: 1/110),
    the same task with a workflow in the prompt gets a well-formed `delegate` call."""
    from mass_jobs.episodes import tools as T
    from mass_jobs.episodes.builtin import ORCHESTRATOR_SYSTEM
    from mass_jobs.serving.llm import ModelError, parse_tool_calls
    from mass_jobs.spec.workflow import DEFAULT_WORKFLOW, workflow_prompt_parts
    from mass_jobs.tiny.warm_check import THRESHOLDS

    clients = [(_client(warm_server, 0.0), None)] + [(_client(warm_server, 0.6), s) for s in SAMPLED_SEEDS]
    delegated = {"bare": 0, "workflow": 0}
    for task in DEMO_TASKS:
        for kind, prompt in (("bare", task), ("workflow", workflow_prompt_parts(task, DEFAULT_WORKFLOW).text)):
            for client, seed in clients:
                messages = [{"role": "system", "content": ORCHESTRATOR_SYSTEM}, {"role": "user", "content": prompt}]
                try:  # the server parses <tool_call> blocks; a malformed one is an HTTP 500 there
                    reply = client.chat(messages, tools=[T.DELEGATE, T.READ_FILE, T.LIST_FILES, T.FINISH], seed=seed)
                except ModelError:
                    continue
                delegated[kind] += any(
                    c.name == "delegate" and c.error is None and str(c.arguments.get("assignment", "")).strip()
                    for c in parse_tool_calls(reply)
                )
    n = len(DEMO_TASKS) * len(clients)
    assert n == 12 and _tail(6, n, THRESHOLDS["workflow_delegates"][1]) < 0.005
    assert 1 - _tail(4, n, THRESHOLDS["bare_delegates"][1]) < 0.005
    assert delegated["workflow"] >= 7 and delegated["bare"] <= 4, delegated


def test_warm_optimizer_proposes_valid_workflows(warm_server):
    from mass_jobs.judging import optimizer_brief as ob
    from mass_jobs.judging.compare import bundle
    from mass_jobs.spec.workflow import DEFAULT_WORKFLOW, WorkflowError, parse_proposal, workflow_json
    from mass_jobs.tiny.warm_check import THRESHOLDS

    valid, n = 0, 0
    for t, task in enumerate(DEMO_TASKS):  # the request `mass search` makes after the initial version failed
        brief, _ = ob.build(
            ob.BriefInput(
                task=task,
                current=0,
                designs={0: workflow_json(DEFAULT_WORKFLOW)},
                rows=[ob.Row(0, "the bare reference", "loss")],
                evidence=bundle(Path("/nonexistent")),
                status={"outcome": "failed", "reason": "no result"},
            )
        )
        clients = [(_client(warm_server, 0.0), None)] + [
            (_client(warm_server, 0.6), 10 * t + s) for s in SAMPLED_SEEDS[:2]
        ]
        for client, seed in clients:
            reply = client.chat(brief, seed=seed)
            n += 1
            try:
                parse_proposal(reply["content"])
                valid += 1
            except WorkflowError:
                pass
    assert n == 9 and _tail(4, n, THRESHOLDS["proposals_valid"][1]) < 0.02
    assert valid >= 5, f"{valid}/{n} proposals valid"


def test_the_warm_build_recorded_its_own_check_and_the_machine(warm_tiny_model_dir):
    """The build measured the demo's behaviours before writing the weights and stored the rates."""
    import json

    from mass_jobs.tiny.warm_check import THRESHOLDS, Rate, failures

    stamp = json.loads((warm_tiny_model_dir / "warm-key.json").read_text())
    assert set(stamp["check"]) == set(THRESHOLDS)
    rates = {k: Rate(*v) for k, v in stamp["check"].items()}
    assert all(r.n >= 32 for r in rates.values()) and failures(rates) == []
    assert stamp["machine"]["cpu_capability"] and stamp["machine"]["torch"]


@pytest.mark.slow(cost=20)  # two scratch tiny models and their warm corpora
def test_the_shipped_warm_model_was_built_from_what_the_current_code_trains_on(warm_tiny_model_dir, monkeypatch):
    """models/tiny-warm is committed, so CI does not spend 5 minutes rebuilding it: its key must be the
    current recipe's, and the digest it recorded must be that of the initial weights and the encoded
    corpus the current code would train on (any prompt, tool, template or tokenizer change moves it)."""
    import json

    from mass_jobs.tiny import warm, warm_corpus

    stamp = json.loads((warm_tiny_model_dir / "warm-key.json").read_text())
    rebuild = (
        "the warm model's recipe or inputs changed: bump BUILDER_VERSION in mass_jobs/tiny/warm.py, "
        "run `make test-models` (rebuilds models/tiny-warm, about 5 minutes) and commit models/tiny-warm"
    )
    assert stamp["key"] == warm.warm_key(0), rebuild
    assert stamp["inputs_sha256"] == warm.current_inputs_digest(0), rebuild
    # the digest sees a change of one system prompt
    monkeypatch.setattr(warm_corpus, "WORKER_SYSTEM", warm_corpus.WORKER_SYSTEM + " ")
    assert warm.current_inputs_digest(0) != stamp["inputs_sha256"]


@pytest.mark.slow  # builds warm models (short warm-ups, then the behaviour check)
def test_a_warm_build_that_misses_a_behaviour_fails_and_writes_nothing(tmp_path, monkeypatch):
    """Three warm-up steps cannot teach the reply shapes: the build's own check refuses the model."""
    import mass_jobs.tiny.warm as warm
    import mass_jobs.tiny.warm_check as check
    from mass_jobs.tiny.warm import build_warm_model, cached_build

    monkeypatch.setattr(check, "probe_prompts", lambda: [DEMO_TASKS[0]])  # 4 requests, not 128
    monkeypatch.setattr(check, "SAMPLES_PER_PROMPT", 1)
    corpus = warm.warm_corpus  # three steps see three conversations: encoding all 640 was most of the test
    monkeypatch.setattr(warm, "warm_corpus", lambda seed: corpus(seed, per_kind=2))
    said = []
    with pytest.raises(check.WarmCheckFailed, match=r"workflow_delegates 0/1.*needs >= 0\.90") as err:
        build_warm_model(tmp_path / "m", steps=3, check=True, say=said.append)
    assert said == [str(err.value).split("; below")[0]] and "bare_delegates 0/1" in said[0]
    assert not (tmp_path / "m" / "model.safetensors").exists()
    monkeypatch.setattr("mass_jobs.tiny.warm.WARM_STEPS", 3)  # the full recipe is checked by default
    with pytest.raises(check.WarmCheckFailed):
        cached_build(tmp_path / "warm", seed=0, steps=3)
    assert list(tmp_path.iterdir()) == [tmp_path / "m"]  # no cached-looking directory left behind
