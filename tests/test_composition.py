"""Teacher-composition presets (sft.preset): each preset's window composition on a stored fixture of
rendered windows (counts per role), the render step applying roles and episodes over a store, the
sampler applying the share, and the spec rules around presets and panel selection."""

import json
from pathlib import Path

import pytest
import yaml

from mass_jobs.config.composition import PRESETS, composition_of, counts_by_role
from mass_jobs.config.run_spec import SftSpec
from mass_jobs.steps.render_sft import composition_split, kept_windows
from mass_jobs.training.sampler import WindowSampler

FIXTURE = Path(__file__).parent / "fixtures" / "composition"


def compose(windows, rankings, comp):
    """What the render step keeps of the fixture's rendered windows: the training episodes its
    `composition_split` gives each task, then the windows its `kept_windows` stores (the fixture
    stands in for rendering those episodes)."""
    train = {task: set(composition_split(ranking, comp)["train"]) for task, ranking in rankings.items()}
    return kept_windows([w for w in windows if w["episode"] in train.get(w["task"], ())], comp)


@pytest.fixture(scope="module")
def rendered():
    """27 rendered windows of two tasks' ranked episodes (task a: a team teacher, 5 episodes; task b:
    workers only, 3 episodes) and the two rank manifests."""
    windows = [json.loads(x) for x in (FIXTURE / "windows.jsonl").read_text().splitlines() if x.strip()]
    return windows, json.loads((FIXTURE / "rankings.json").read_text())


# a: winners ep-2, ep-0 (o1 w2 a1 each), others ep-1, ep-3 (o1 w2), val ep-4; b: winner ep-1, other ep-2 (w3 each)
EXPECTED = {
    "M": {"orchestrator": 2, "worker": 7, "auxiliary": 2},
    "S": {"orchestrator": 0, "worker": 7, "auxiliary": 2},
    "X": {"orchestrator": 4, "worker": 14, "auxiliary": 2},
    "M+": {"orchestrator": 2, "worker": 7, "auxiliary": 2},
    "S+": {"orchestrator": 0, "worker": 7, "auxiliary": 2},
}


@pytest.mark.parametrize("preset", sorted(EXPECTED))
def test_each_preset_yields_its_window_composition(rendered, preset):
    windows, ranks = rendered
    assert counts_by_role(windows) == {"orchestrator": 5, "worker": 19, "auxiliary": 3}
    comp = PRESETS[preset]
    kept = compose(windows, ranks, comp)
    assert counts_by_role(kept) == EXPECTED[preset]
    # the validation episode never trains, whatever the preset
    assert not any(w["task"] == "a" and w["episode"] == 4 for w in kept)
    assert not any(w["task"] == "b" and w["episode"] == 0 for w in kept)
    episodes = {(w["task"], w["episode"]) for w in kept}
    if comp.episodes == "winners":
        assert episodes == {("a", 2), ("a", 0), ("b", 1)}
    else:
        assert episodes == {("a", 2), ("a", 0), ("a", 1), ("a", 3), ("b", 1), ("b", 2)}


def test_presets_as_data():
    assert {k: (v.orchestrator_share, v.checkpoint) for k, v in PRESETS.items()} == {
        "M": (1 / 3, "val_loss"),
        "S": (0.0, "val_loss"),
        "X": (1 / 3, "val_loss"),
        "M+": (1 / 3, "panel"),
        "S+": (0.0, "panel"),
    }
    # no preset: the spec's own fields, the paper's by default (= M)
    default = composition_of(SftSpec())
    assert (default.roles, default.episodes, default.orchestrator_share, default.checkpoint) == (
        PRESETS["M"].roles,
        "winners",
        1 / 3,
        "val_loss",
    )
    assert composition_of(SftSpec(orchestrator_share=0.5)).orchestrator_share == 0.5
    ranking = {"order": ["ep-3", "ep-1", "ep-0"], "train": ["ep-3"], "val": "ep-1"}
    assert composition_split(ranking, PRESETS["X"]) == {"train": [3, 0], "val": [1]}
    assert composition_split(ranking, PRESETS["M"]) == {"train": [3], "val": [1]}


def test_the_sampler_draws_the_presets_orchestrator_share(rendered):
    windows, ranks = rendered
    draws = 3000
    for preset, expected in (("M", 1 / 6), ("S", 0.0)):  # task b has no orchestrator window: its draws fall back
        kept = compose(windows, ranks, PRESETS[preset])
        sampler = WindowSampler(kept, PRESETS[preset].orchestrator_share, seed=0)
        orch = sum(kept[sampler.draw(s, 0)]["role"] == "orchestrator" for s in range(draws)) / draws
        assert orch == pytest.approx(expected, abs=0.02)
    # the trainer draws with the preset's share, not the spec's own field
    from mass_jobs.training.loop import Trainer

    for preset, share in (("S", 0.0), ("S+", 0.0), ("X", 1 / 3), (None, 1 / 3)):
        trainer = Trainer("unused", windows, windows, SftSpec(preset=preset), Path("unused"))
        assert trainer.sampler.orchestrator_share == share


def store_run(tmp_path, sft: dict, rank: dict):
    """The render-step store of tests/test_render_sft.py (4 episodes of task primes, ep-3 unstrippable)."""
    from mass_jobs.run.context import RunContext
    from mass_jobs.spec.load import load_spec
    from mass_jobs.store import open_store
    from tests.fixtures.sft_episodes import BARE, DIRECTIVE, TEACHER, WORKFLOW, qwen_code_episode, teacher_episode

    tmp_path.mkdir(parents=True)
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(
        yaml.safe_dump(
            {
                "name": "r",
                "model": {"base": str(tmp_path)},
                "tasks": [{"id": "primes", "split": "train", "prompt": BARE}],
                "collection": {"episodes": 4, "train_ranks": 3, "validation_rank": 4},
                "ranking": {"comparisons_per_episode": 1},
                "sft": {"window": 512, "context": 64, **sft},
                "store": {"uri": f"file://{tmp_path / 'store'}"},
            }
        )
    )
    ctx = RunContext(load_spec(spec_path), open_store(f"file://{tmp_path / 'store'}"))
    doc = {"prompt": TEACHER, "prompt_parts": {"task": BARE, "workflow": WORKFLOW, "directive": DIRECTIVE}}
    for i, records in enumerate([teacher_episode(), teacher_episode(), qwen_code_episode(), qwen_code_episode("?")]):
        ctx.store.put_bytes(
            ctx.episode_file(0, "primes", i, "trace.jsonl"), "".join(json.dumps(r) + "\n" for r in records).encode()
        )
        ctx.store.put_json(
            ctx.episode_file(0, "primes", i, "episode.json"), {**doc, "harness": "builtin" if i < 2 else "qwen-code"}
        )
    ctx.store.put_json(ctx.rank(0, "primes"), {"task": "primes", **rank})
    return ctx


def test_render_step_keeps_the_presets_roles_and_episodes(tiny_model_dir, tmp_path):
    from transformers import AutoTokenizer

    from mass_jobs.steps.render_sft import read_jsonl, run_render

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    winners = {"order": ["ep-0", "ep-2", "ep-3", "ep-1"], "train": ["ep-0", "ep-2", "ep-3"], "val": "ep-1"}
    # M (= no preset): ep-0 and ep-2 render (ep-3 is dropped under strict) -> o3 w3 a1 (test_render_sft's numbers)
    m = run_render(store_run(tmp_path / "m", {"preset": "M"}, winners), 0, tok)
    assert m["windows_by_role"] == {"orchestrator": 3, "worker": 3, "auxiliary": 1}
    # S: the same episodes without the orchestrator's windows, which are counted as left out
    ctx = store_run(tmp_path / "s", {"preset": "S"}, winners)
    s = run_render(ctx, 0, tok)
    assert s["windows_by_role"] == {"orchestrator": 0, "worker": 3, "auxiliary": 1}
    assert s["composition"]["preset"] == "S" and s["stored_supervised_tokens"] < m["stored_supervised_tokens"]
    stats = ctx.store.get_json(ctx.sft_file(0, "stats"))
    assert stats["train"]["windows_left_out_by_role"] == {"orchestrator": 3, "worker": 0, "auxiliary": 0}
    assert {w["role"] for w in read_jsonl(tmp_path / "s/store/r/gen-0/sft/val.jsonl")} <= {"worker", "auxiliary"}
    # X: one winner (ep-0) but every ranked episode except the validation one trains
    few = {"order": ["ep-2", "ep-0", "ep-3", "ep-1"], "train": ["ep-0"], "val": "ep-1"}
    x = run_render(store_run(tmp_path / "x", {"preset": "X"}, few), 0, tok)
    m_few = run_render(store_run(tmp_path / "m-few", {}, few), 0, tok)
    assert x["windows_by_role"] == m["windows_by_role"]
    assert m_few["windows"] < x["windows"]
    train = read_jsonl(tmp_path / "x/store/r/gen-0/sft/train.jsonl")
    assert {w["episode"] for w in train} == {0, 2}


def test_preset_and_panel_rules_name_the_field(tmp_path):
    from mass_jobs.spec.load import SpecError, validate_document
    from tests.fixtures.inner_loop import spec_document

    with pytest.raises(SpecError) as err:
        validate_document(spec_document(f"file://{tmp_path}", sft={"preset": "S", "orchestrator_share": 0.5}))
    assert "$.sft.orchestrator_share" in {i.path for i in err.value.issues}
    with pytest.raises(SpecError, match=r"sft\.preset"):
        validate_document(spec_document(f"file://{tmp_path}", sft={"preset": "Q"}))
    with pytest.raises(SpecError) as err:
        validate_document(spec_document(f"file://{tmp_path}", sft={"preset": "M+"}))
    paths = {i.path: i.message for i in err.value.issues}
    assert "$.sft.panel" in paths and "$.judges" in paths
    doc = spec_document(
        f"file://{tmp_path}",
        sft={"checkpoint_selection": "panel", "panel": {"tasks": ["t1", "nope"]}},
        judges=[{"name": "j", "endpoint": "http://x/v1", "model": "m"}],
    )
    with pytest.raises(SpecError) as err:
        validate_document(doc)
    paths = {i.path: i.message for i in err.value.issues}
    assert "'train' task" in paths["$.sft.panel.tasks[0]"] and "no such task" in paths["$.sft.panel.tasks[1]"]
