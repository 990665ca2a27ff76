"""The tiny test model: a random-weight Qwen3 causal LM with a locally trained tokenizer.

Nothing is downloaded. The tokenizer is a byte-level BPE trained on a small built-in corpus
(English, Python, JSON and rendered chats) so tool calls tokenize compactly, and its chat template
follows Qwen3's layout exactly, so code paths keyed on Qwen3 (the `transformers serve` response
parser for `<think>` and `<tool_call>`, the assistant-token masks used for SFT) behave as they do
on a real Qwen3 checkpoint. The same seed gives byte-identical files.

`mass_jobs.tiny.warm.build_warm_model` then briefly fine-tunes the random weights on synthetic
harness conversations so replies are well-formed tool calls, verdicts and
workflows often enough for a demo report to show numbers.

Run: `mass model tiny --out DIR [--seed N] [--warm]`
"""

from __future__ import annotations

import json
import random
from pathlib import Path

# Added tokens, in id order right after the learned vocabulary's specials (kept stable: tests and
# loss masks refer to them by string, never by id).
SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<tool_call>",
    "</tool_call>",
    "<think>",
    "</think>",
    "<tool_response>",
    "</tool_response>",
]
EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"
VOCAB_SIZE = 6000

# Architecture: small enough for CPU tests, same family and long context as the real targets.
ARCH = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "max_position_embeddings": 65536,
    "rope_theta": 1_000_000.0,
}

# Pre-tokenizer split: contractions, letter runs with one leading non-letter, single digits,
# punctuation runs, newlines and spaces (the GPT-4/Qwen2 style split).
SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# How the family's templates open (this one and tiny.paper_layout's): a message's text (a string
# or text parts), the index of the last user message, and the system turn that lists the tools.
TEMPLATE_HEAD = r"""
{%- macro text(c) -%}
  {%- if c is string -%}{{- c -}}
  {%- elif c is iterable and c is not mapping -%}
    {%- for p in c -%}{%- if p.type == 'text' -%}{{- p.text -}}{%- endif -%}{%- endfor -%}
  {%- endif -%}
{%- endmacro -%}
{%- set ns = namespace(last_user=-1) -%}
{%- for m in messages -%}{%- if m.role == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}{%- endfor -%}
{%- if tools -%}
  {{- '<|im_start|>system\n' -}}
  {%- if messages and messages[0].role == 'system' -%}{{- text(messages[0].content) + '\n\n' -}}{%- endif -%}
""".lstrip("\n")
# A tool result is a user turn of <tool_response> blocks, consecutive results in one turn.
TOOL_TURNS = r"""
  {%- elif m.role == 'tool' -%}
    {%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
    {{- '\n<tool_response>\n' + content + '\n</tool_response>' -}}
    {%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\n' -}}{%- endif -%}
  {%- endif -%}
{%- endfor -%}
""".lstrip("\n")
# The system turn without tools, then each message's turn up to the assistant's generated part.
TURNS_OPEN = r"""
{%- elif messages and messages[0].role == 'system' -%}
  {{- '<|im_start|>system\n' + text(messages[0].content) + '<|im_end|>\n' -}}
{%- endif -%}
{%- for m in messages -%}
  {%- set content = text(m.content) -%}
  {%- if m.role == 'system' and loop.first -%}
  {%- elif m.role == 'user' or m.role == 'system' -%}
    {{- '<|im_start|>' + m.role + '\n' + content + '<|im_end|>\n' -}}
  {%- elif m.role == 'assistant' -%}
    {{- '<|im_start|>assistant\n' -}}
    {%- generation -%}
""".lstrip("\n")
# Qwen3 layout. Everything the model generates inside an assistant turn (reasoning, text, tool
# calls and the closing <|im_end|>) sits in {% generation %} so assistant-token masks cover it.
# Reasoning is kept only for assistant turns after the last user message, as Qwen3 does: earlier
# turns' thoughts are not part of the context the model sees at inference.
CHAT_TEMPLATE = (
    TEMPLATE_HEAD
    + r"""
  {{- '# Tools\n\nYou may call one or more functions to assist with the user query.\n\n' -}}
  {{- 'You are provided with function signatures within <tools></tools> XML tags:\n<tools>' -}}
  {%- for tool in tools -%}{{- '\n' + (tool | tojson) -}}{%- endfor -%}
  {{- '\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' -}}
""".lstrip("\n")
    + TURNS_OPEN
    + r"""
      {%- if m.reasoning_content is string and loop.index0 > ns.last_user -%}
        {{- '<think>\n' + m.reasoning_content.strip('\n') + '\n</think>\n\n' -}}
      {%- endif -%}
      {{- content -}}
      {%- for tc in (m.tool_calls or []) -%}
        {%- set f = tc.function if tc.function is defined else tc -%}
        {%- if content or not loop.first -%}{{- '\n' -}}{%- endif -%}
        {{- '<tool_call>\n{"name": "' + f.name + '", "arguments": ' -}}
        {%- if f.arguments is string -%}{{- f.arguments -}}{%- else -%}{{- f.arguments | tojson -}}{%- endif -%}
        {{- '}\n</tool_call>' -}}
      {%- endfor -%}
      {{- '<|im_end|>' -}}
    {%- endgeneration -%}
    {{- '\n' -}}
""".lstrip("\n")
    + TOOL_TURNS
    + r"""
{%- if add_generation_prompt -%}
  {{- '<|im_start|>assistant\n' -}}
  {%- if enable_thinking is defined and enable_thinking is false -%}{{- '<think>\n\n</think>\n\n' -}}{%- endif -%}
{%- endif -%}
""".lstrip("\n")
).strip()

_WORDS = (
    "the a an and or but if then else when while for to of in on at by with from into over under about "
    "is are was were be been being have has had do does did can could will would should may might must "
    "file files folder directory path read write open close list find search replace edit create delete "
    "run test tests build install check fix bug error errors warning value values number numbers string "
    "text line lines word words task tasks agent agents model models tool tools call calls result results "
    "answer question plan step steps first next last done finish start stop output input data json code "
    "function functions class method module package import return print loop index count total sum mean "
    "user assistant system message messages reply request response server client port host local remote "
    "please let me look see think need want try use make get set add remove update change keep move copy "
    "this that these those it its we you they he she i my your our their there here what which who why how "
    "new old good bad small large big little many more most less few some any all each every no not yes "
    "time day week year today now later before after again only also just very really quite too so as "
    "sort sorted order key keys map filter reduce parse format load save store cache config option options "
    "delegate subagent worker review reviewer verify verified correct wrong pass fail failed success "
    "shell command bash python script program source repository branch commit diff patch merge "
    "training loss batch token tokens sequence length layer weight weights learning rate epoch"
).split()

_CODE = [
    'def {f}({a}, {b}):\n    """Return the {w} of {a} and {b}."""\n    if {a} is None:\n        return {b}\n'
    "    return {a} + {b}\n",
    "import json\nimport os\nfrom pathlib import Path\n\n\ndef {f}(path: str) -> dict:\n"
    '    with open(path, encoding="utf-8") as fh:\n        return json.load(fh)\n',
    "class {C}:\n    def __init__(self, {a}: int = 0) -> None:\n        self.{a} = {a}\n\n"
    "    def {f}(self) -> list[int]:\n        return [i * self.{a} for i in range(10)]\n",
    'for {a} in range(len({b})):\n    if {b}[{a}] > 0:\n        print(f"{{{a}}}: {{{b}[{a}]}}")\n',
    "$ python -m pytest tests/test_{f}.py -q\n..F.\nFAILED tests/test_{f}.py::test_{w} - AssertionError\n",
    "$ ls -la\ntotal 12\n-rw-r--r-- 1 user user  120 main.py\n-rw-r--r-- 1 user user 2048 README.md\n",
]


def _pseudo_words(n: int) -> list[str]:
    """Made-up words from syllables: gives BPE enough distinct strings to learn subword merges."""
    rng = random.Random(99)
    onsets = "b c d f g h j k l m n p r s t v w z ch sh th st tr pl".split()
    vowels, codas = "a e i o u ai ea ou".split(), ["", "n", "r", "s", "t", "l", "nd", "ng"]
    return sorted(
        {
            "".join(rng.choice(onsets) + rng.choice(vowels) + rng.choice(codas) for _ in range(rng.randint(1, 3)))
            for _ in range(n)
        }
    )


_PSEUDO = _pseudo_words(4000)


def _word(rng: random.Random) -> str:
    return rng.choice(_WORDS) if rng.random() < 0.7 else rng.choice(_PSEUDO)


def _sentence(rng: random.Random) -> str:
    words = [_word(rng) for _ in range(rng.randint(5, 14))]
    words[0] = words[0].capitalize()
    return " ".join(words) + rng.choice([".", ".", "?", "!", ":"])


def _identifier(rng: random.Random) -> str:
    return "_".join(_word(rng) for _ in range(rng.randint(1, 3)))


def _tool_chat(rng: random.Random) -> str:
    """A rendered agent exchange: what tool calls and results look like in training data."""
    name = rng.choice(["read_file", "write_file", "run_shell", "list_dir", "delegate", "finish", "search"])
    args = {rng.choice(["path", "command", "task", "query", "content"]): _sentence(rng) for _ in range(2)}
    args["n"] = rng.randint(0, 999)
    call = json.dumps({"name": name, "arguments": args})
    result = json.dumps({"ok": rng.random() > 0.3, "output": _sentence(rng)})
    return (
        f"<|im_start|>system\n{_sentence(rng)}<|im_end|>\n<|im_start|>user\n{_sentence(rng)}<|im_end|>\n"
        f"<|im_start|>assistant\n<think>\n{_sentence(rng)}\n</think>\n\n{_sentence(rng)}\n"
        f"<tool_call>\n{call}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n{result}\n"
        f"</tool_response><|im_end|>\n<|im_start|>assistant\n{_sentence(rng)}<|im_end|>\n"
    )


def training_corpus(n_docs: int = 4000) -> list[str]:
    """The fixed corpus the tokenizer learns from (own RNG: independent of the weight seed)."""
    rng = random.Random(1234)
    docs = []
    for i in range(n_docs):
        kind = i % 4
        if kind == 0:
            docs.append(" ".join(_sentence(rng) for _ in range(rng.randint(2, 6))))
        elif kind == 1:
            names = {k: _identifier(rng) for k in ("f", "a", "b", "w")}
            docs.append(rng.choice(_CODE).format(C=names["f"].title().replace("_", ""), **names))
        elif kind == 2:
            obj = {
                _identifier(rng): rng.choice([rng.randint(-50, 5000), _sentence(rng), True, None])
                for _ in range(rng.randint(1, 5))
            }
            docs.append(json.dumps(obj, indent=rng.choice([None, 2])))
        else:
            docs.append(_tool_chat(rng))
    return docs


def build_tokenizer():
    """Train the byte-level BPE and wrap it as a transformers tokenizer with the chat template."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(training_corpus(), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        additional_special_tokens=SPECIAL_TOKENS[1:2] + SPECIAL_TOKENS[3:],
        chat_template=CHAT_TEMPLATE,
        model_max_length=ARCH["max_position_embeddings"],
        clean_up_tokenization_spaces=False,
        padding_side="right",
    )


def build_tiny_model(out_dir, seed: int = 0, prepare=None) -> Path:
    """Write config, float32 safetensors weights, generation config and tokenizer to `out_dir`.

    float32 because the tiny model runs on CPU in tests; real models default to bfloat16.
    `prepare(model, tokenizer, out)` runs before anything is written: the warm build
    (`tiny_warm.build_warm_model`) fine-tunes and checks the weights there.
    """
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    eos_id = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    pad_id = tokenizer.convert_tokens_to_ids(PAD_TOKEN)
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=ARCH["hidden_size"],
        intermediate_size=ARCH["intermediate_size"],
        num_hidden_layers=ARCH["num_hidden_layers"],
        num_attention_heads=ARCH["num_attention_heads"],
        num_key_value_heads=ARCH["num_key_value_heads"],
        head_dim=ARCH["head_dim"],
        max_position_embeddings=ARCH["max_position_embeddings"],
        rope_parameters={"rope_type": "default", "rope_theta": ARCH["rope_theta"]},
        tie_word_embeddings=True,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        bos_token_id=None,
        dtype="float32",
    )
    # Seed a private generator state only for the init, then restore: callers' RNG is untouched.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config).to(torch.float32)
    model.generation_config = GenerationConfig(
        eos_token_id=[eos_id, pad_id],
        pad_token_id=pad_id,
        do_sample=True,
        temperature=0.7,
        top_p=0.9,
        top_k=20,
    )
    if prepare is not None:
        prepare(model, tokenizer, out)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


# A hybrid-attention variant in the layout of the paper's model (Qwen3.5: gated-delta-net linear
# attention in three of every four layers, full attention in the fourth), for code that must
# handle linear-attention layers (`in_proj_qkv`, `in_proj_z`, `in_proj_a`, `in_proj_b`, `out_proj`).
HYBRID_ARCH = {
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "full_attention_interval": 4,
    "num_hidden_layers": 4,
}
# The vision tower of the multimodal variant: only there so code can be shown to leave it alone.
HYBRID_VISION = {
    "depth": 1,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_heads": 2,
    "patch_size": 4,
    "spatial_merge_size": 1,
    "temporal_patch_size": 1,
}


def tiny_hybrid_model(seed: int = 0, vocab_size: int = VOCAB_SIZE, vision: bool = False):
    """A random-weight hybrid-attention Qwen3.5 model (float32): `Qwen3_5ForCausalLM`, or with
    `vision` the `Qwen3_5ForConditionalGeneration` layout (vision tower + language model) of the
    paper's checkpoint. CPU runs use transformers' reference kernels for the linear attention."""
    import torch
    from transformers import Qwen3_5Config, Qwen3_5ForCausalLM, Qwen3_5ForConditionalGeneration, Qwen3_5TextConfig

    text = dict(
        vocab_size=vocab_size,
        hidden_size=ARCH["hidden_size"],
        intermediate_size=ARCH["intermediate_size"],
        num_attention_heads=ARCH["num_attention_heads"],
        num_key_value_heads=ARCH["num_key_value_heads"],
        head_dim=ARCH["head_dim"],
        max_position_embeddings=ARCH["max_position_embeddings"],
        tie_word_embeddings=True,
        dtype="float32",
        **HYBRID_ARCH,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if vision:
            config = Qwen3_5Config(
                text_config=text,
                tie_word_embeddings=True,
                vision_config={**HYBRID_VISION, "out_hidden_size": ARCH["hidden_size"]},
            )
            return Qwen3_5ForConditionalGeneration(config).to(torch.float32)
        return Qwen3_5ForCausalLM(Qwen3_5TextConfig(**text)).to(torch.float32)


def build_tiny_hybrid_model(out_dir, seed: int = 0) -> Path:
    """Write the text-only hybrid model (config + safetensors) and the tiny tokenizer to `out_dir`."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    model = tiny_hybrid_model(seed, vocab_size=len(tokenizer))
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out
