"""Before `argo submit`: every limit that spans the spec, the chart's values and the controllers.

    mass validate SPEC --values VALUES.yaml [--values MORE.yaml]

The values are the chart's defaults (charts/mass-jobs/values.yaml) with each file merged over them,
as `helm install -f` merges. Each check gives a value, the limit it must keep and a verdict; a
failing one is also a SpecIssue naming the spec field (exit 2). The `validate` step of every
`mass-cycle` runs the same checks with the values the chart gave it (`--chart-value`, `cluster_issues`).

What is checked, and why it would fail on a cluster:
- the values themselves, against the chart's values.schema.json (Helm refuses the install on a
  wrong type or an unknown key), and the values the templates require with no default (network peers);
- the store is in the artifact bucket (agent pods exchange episodes as Argo S3 artifacts), at the
  chart's S3 endpoint (step pods get it as AWS_ENDPOINT_URL), which is a host, not a URL;
- context length and output tokens fit vLLM's `--max-model-len` (vLLM rejects longer requests);
- the tool-call and reasoning parsers are the ones the chart gives vLLM (another tool-call parser
  leaves calls unparsed; another reasoning parser leaves the thinking in the content);
- judges are external endpoints whose key variables the judge Secret provides (the evaluate pod
  serves no model and gets only those keys), and `roles.*` endpoints, which agent pods cannot
  reach (their egress is DNS, the predictor, the apiserver and S3);
- an agent pod's deadline leaves the harness time to stop after the episode's wall limit;
- the deepest template recursion stays under Argo's maxAllowedStackDepth (the controller errors at
  depth >= 100 unless its environment sets DISABLE_MAX_RECURSION=true): generations chain
  recursively, search iterations too, under about eight levels of cycle steps;
- what a step pod cannot do: panel checkpoint selection (it would serve models in a 1-CPU pod),
  a chat template file (KServe serves `model.base` as stored), a model base that is no s3:// URI
  or hub id;
- the trainer job the spec's `sft.replicas` and `sft.gpus_per_replica` render passes the training
  operator's webhook (one replica: the Master alone), and GPU jobs may run at all;
- mass-run's Workflow object after its last generation (estimated from the templates and the spec's
  fan-outs) fits the controller's MAX_WORKFLOW_SIZE once its nodes are compressed, unless node
  status is offloaded (`argo.nodeStatusOffload`);
- with a Kueue queue whose GPU quota is known (`kueue.gpuQuota`), the trainer job and the
  predictors evaluate serves together each fit it (Kueue never admits a larger workload);
- the node disk each class of pods asks for (stated: nodes are not read offline);
- with the model's config (`--config`, or a local model.base), the ephemeral storage (or the
  scratch volume, `scratch.<class>.size`) of the pods that download the weights holds them: the
  predictor and each trainer replica one copy, merge the
  base and the merged copy (10% headroom); a trainer pod's memory one copy (rank 0 alone reads the
  model) and 1 GiB of /dev/shm per rank (memory-backed); the merge's memory one input and one output shard (it streams).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import yaml

from mass_jobs.k8s import training
from mass_jobs.k8s.pods import quantity_bytes
from mass_jobs.k8s.schemas import webhook_errors
from mass_jobs.k8s.settings import ClusterSettings
from mass_jobs.pipeline.planning.memory import load_config, meta_model, shipped_config
from mass_jobs.spec.issues import validator_issues
from mass_jobs.spec.load import SpecIssue

CHART_VALUES = Path(__file__).resolve().parents[2] / "charts" / "mass-jobs" / "values.yaml"
CHART_SCHEMA = CHART_VALUES.with_name("values.schema.json")
ARGO_MAX_STACK_DEPTH = 100  # workflow/controller/operator.go: maxAllowedStackDepth
CYCLE_DEPTH = 8  # mass-run -> cycle -> ... -> an agent pod's template, besides the two recursions
# evaluate's agent pods sit three templates deeper: its round, the work served in it, and the round's
# rollouts (prepare and its fan-out, skipped together where the round only judges)
ROUND_DEPTH = 3
AGENT_POD_MIN_S = 6 * 3600  # an uncapped paper-scale team episode runs for hours
AGENT_STOP_S = 300  # the harness stops, uploads and exits after wall_s: an agent pod's deadline must leave this


@dataclass
class Check:
    name: str
    value: str
    limit: str
    ok: bool
    path: str  # the spec field (or value) to change
    why: str = ""
    advice: str = ""  # a passing check that a cluster runs better without: printed under the table

    @property
    def verdict(self) -> str:
        return ("note" if self.advice else "ok") if self.ok else "FAIL"


def merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in (over or {}).items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


class ValuesError(ValueError):
    """Chart values Helm would refuse; `issues` names each key (`values model.maxModelLen`)."""

    def __init__(self, issues: list):
        self.issues = issues
        super().__init__("; ".join(str(i) for i in issues))


def load_values(files: list[str]) -> dict:
    """The chart's defaults with each file merged over them, checked against the chart's
    values.schema.json as Helm checks them before rendering (ValueError naming a bad file,
    ValuesError naming each bad key)."""
    values = yaml.safe_load(CHART_VALUES.read_text()) if CHART_VALUES.is_file() else {}
    for f in files:
        try:
            doc = yaml.safe_load(Path(f).read_text())
        except (OSError, yaml.YAMLError) as err:
            raise ValueError(f"--values {f}: expected a readable YAML file ({type(err).__name__}: {err})") from None
        if doc is not None and not isinstance(doc, dict):
            raise ValueError(f"--values {f}: expected a mapping of chart values, found {type(doc).__name__}")
        values = merge(values, doc or {})
    found = schema_issues(values)
    if found:
        raise ValuesError(found)
    return values


def schema_issues(values: dict) -> list:
    """What the chart's values.schema.json (JSON Schema draft 7, as Helm applies it) says of `values`."""
    import json

    from jsonschema import Draft7Validator

    found = validator_issues(Draft7Validator(json.loads(CHART_SCHEMA.read_text())), values)
    return [SpecIssue("values " + i.path.removeprefix("$").removeprefix("."), i.message) for i in found]


def required_issues(values: dict) -> list:
    """The values the chart's templates `require` (no default): Helm stops the install without them."""

    out = []
    fqdns, cilium = _get(values, "network.s3.fqdns"), _get(values, "network.cilium") is True
    if not _get(values, "network.s3.to") and not fqdns:
        out.append(
            SpecIssue(
                "values network.s3.to",
                "required, no default: NetworkPolicy peers of the S3 endpoint "
                "(ipBlock CIDRs, or the selector of an in-cluster MinIO; or "
                "network.s3.fqdns on Cilium)",
            )
        )
    if fqdns and not cilium:
        out.append(
            SpecIssue(
                "values network.s3.fqdns",
                "expected network.cilium=true: toFQDNs is a CiliumNetworkPolicy "
                "rule (other CNIs match addresses only: set network.s3.to)",
            )
        )
    if not _get(values, "network.apiServer.to") and _get(values, "network.cilium") is not True:
        out.append(
            SpecIssue(
                "values network.apiServer.to",
                "required unless network.cilium, no default: the kube-apiserver endpoint IPs as ipBlock peers",
            )
        )
    return out


def _get(values: dict, dotted: str):
    node = values
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


_LISTS = {"judges.keys"}
_INTS = {"model.maxModelLen", "agent.activeDeadlineSeconds", "gpu.concurrentJobs"}


def parse_chart_values(items) -> dict:
    """`--chart-value KEY=VALUE` items (dotted keys) as nested values (ValueError naming a bad one)."""
    out: dict = {}
    for item in items or ():
        key, sep, value = str(item).partition("=")
        if not sep or not key or any(not part for part in key.split(".")):
            raise ValueError(
                f"expected KEY=VALUE with a dotted chart key (model.toolCallParser=hermes), found {item!r}"
            )
        if key in _INTS:
            try:
                value = int(value)
            except ValueError:
                raise ValueError(f"{key}: expected an integer, found {value!r}") from None
        elif key in _LISTS:
            value = [v for v in value.split(",") if v]
        node = out
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


def model_config(spec, config: str | None):
    """The model's config for the storage checks: `config`, else a local model.base's; None when
    neither is given (the checks that need it are left out of the table)."""

    if config is None and not (Path(spec.model.base) / "config.json").is_file() and not shipped_config(spec.model.base):
        return None
    return load_config(spec, config)


# Checkpoint shards on the hub are at most 5 GB (transformers' max_shard_size the model families use).
MERGE_SHARD_BYTES = 5e9
MERGE_PROCESS_BYTES = 4 * 2**30  # python, torch and the adapter
# NCCL's shared-memory transport between the ranks of a pod: its buffers per peer and channel, with room
SHM_PER_RANK_BYTES = 2**30


def model_bytes(spec, config) -> int:
    """Bytes of the model's weights in the spec's dtype (from the config, no weights read)."""
    import torch

    # auto: the checkpoint's own dtype, bf16 for the models this runs
    itemsize = 2 if spec.model.dtype == "auto" else getattr(torch, spec.model.dtype).itemsize
    return sum(p.numel() for p in meta_model(config).parameters()) * itemsize


def recursion_depth(spec) -> int:
    """The deepest template stack: the last generation's search recursion or evaluate's round."""
    return (spec.generations - 1) + CYCLE_DEPTH + max(spec.search.iterations, ROUND_DEPTH)


def checks(spec, values: dict, config=None) -> list[Check]:
    """Every check whose chart value is known (a partial `values` skips the others); `config`, the
    model's, adds the storage checks."""
    cluster = _get(values, "s3.bucket") is not None  # a whole chart's values, not one step's
    return [
        *_store_checks(spec, values),
        *_serving_checks(spec, values),
        *_judge_checks(spec, values),
        *_agent_checks(spec, values),
        *_agent_machine_checks(spec, values),
        *(_cluster_only_checks(spec, config) if cluster else []),
        *_network_checks(values),
        *disk_checks(values),
        *queue_checks(spec, values),
        *size_checks(spec, values),
        *_gpu_job_checks(values),
        *(_model_storage_checks(spec, values, config) if config is not None else []),
    ]


def _check(name, value, limit, ok, path, why="") -> Check:
    return Check(name, str(value), str(limit), bool(ok), path, why)


def _store_checks(spec, values: dict) -> list[Check]:
    """The spec's store in the chart's artifact bucket, at the chart's S3 endpoint."""
    out = []
    bucket = _get(values, "s3.bucket")
    if bucket is not None:
        mine = spec.store.uri.removeprefix("s3://").partition("/")[0] if spec.store.uri.startswith("s3://") else None
        out.append(
            _check(
                "store in the artifact bucket",
                spec.store.uri,
                f"s3://{bucket}/...",
                mine == bucket,
                "$.store.uri",
                f"expected a store in the artifact repository's bucket {bucket!r} (chart value s3.bucket), found "
                + (f"bucket {mine!r}" if mine else f"{spec.store.uri!r}"),
            )
        )
    endpoint = _get(values, "s3.endpoint")
    if endpoint is not None:
        out.append(
            _check(
                "S3 endpoint is a host",
                endpoint,
                "host[:port], no scheme",
                "://" not in str(endpoint),
                "values s3.endpoint",
                f"expected chart value s3.endpoint as host[:port] (s3.insecure picks http), found {endpoint!r}",
            )
        )
        scheme = "http" if _get(values, "s3.insecure") is True else "https"
        theirs = f"{scheme}://{endpoint}".rstrip("/")
        mine = (spec.store.endpoint_url or "https://s3.amazonaws.com").rstrip("/")
        out.append(
            _check(
                "store endpoint",
                mine,
                theirs,
                mine == theirs or "://" in str(endpoint),
                "$.store.endpoint_url",
                f"expected the chart's S3 endpoint {theirs!r} (values s3.endpoint, s3.insecure), found {mine!r}",
            )
        )
    return out


def _serving_checks(spec, values: dict) -> list[Check]:
    """The sampling lengths within the server's max model length; the chart's parsers the spec's."""
    out = []
    mml = _get(values, "model.maxModelLen")
    if mml is not None:
        s = spec.model.sampling
        out.append(
            _check(
                "context length",
                s.context_length,
                f"<= {mml}",
                s.context_length <= int(mml),
                "$.model.sampling.context_length",
                f"expected at most the server's max model length {mml} (chart value model.maxModelLen), "
                f"found {s.context_length}",
            )
        )
        out.append(
            _check(
                "max output tokens",
                s.max_output_tokens,
                f"< {mml}",
                s.max_output_tokens < int(mml),
                "$.model.sampling.max_output_tokens",
                f"expected less than the server's max model length {mml} (chart value model.maxModelLen), "
                f"found {s.max_output_tokens}",
            )
        )
    for name, key, mine, path in (
        (
            "tool-call parser",
            "model.toolCallParser",
            spec.execution.vllm.tool_call_parser,
            "$.execution.vllm.tool_call_parser",
        ),
        (
            "reasoning parser",
            "model.reasoningParser",
            spec.execution.vllm.reasoning_parser,
            "$.execution.vllm.reasoning_parser",
        ),
    ):
        theirs = _get(values, key)
        if theirs is not None:
            out.append(
                _check(
                    name,
                    mine,
                    theirs,
                    mine == theirs,
                    path,
                    f"expected the chart's vLLM {name} {theirs!r} (chart value {key}), found {mine!r}",
                )
            )
    return out


def _judge_checks(spec, values: dict) -> list[Check]:
    """Judges external on the cluster, each key one the judge Secret holds."""
    out = []
    cluster, keys = _get(values, "s3.bucket") is not None, _get(values, "judges.keys")
    for i, judge in enumerate(spec.judges):
        if cluster:
            out.append(
                _check(
                    f"judge {judge.name} endpoint",
                    judge.endpoint,
                    "an external URL",
                    judge.endpoint != "local",
                    f"$.judges[{i}].endpoint",
                    f"expected an external endpoint (an OpenAI-compatible URL) on "
                    f"the cluster, found 'local' (judge {judge.name!r})",
                )
            )
        if keys is not None and judge.api_key_env:
            out.append(
                _check(
                    f"judge {judge.name} key",
                    judge.api_key_env,
                    f"one of {list(keys)}",
                    judge.api_key_env in keys,
                    f"$.judges[{i}].api_key_env",
                    f"expected a key of the judge Secret (chart value judges.keys {list(keys)}), "
                    f"found {judge.api_key_env!r}",
                )
            )
    return out


def _agent_checks(spec, values: dict) -> list[Check]:
    """Roles without endpoints of their own on the cluster; the agent pods' deadline past an episode's."""
    out = []
    if _get(values, "s3.bucket") is not None:
        for role in ("optimizer", "evaluator", "executor"):
            model = getattr(spec.roles, role)
            if model is not None:
                out.append(
                    _check(
                        f"roles.{role} reachable",
                        model.endpoint,
                        "the generation's predictor only",
                        False,
                        f"$.roles.{role}",
                        f"expected no endpoint of its own on the cluster: agent pods "
                        f"reach only DNS, the predictor, the apiserver and S3, found {model.endpoint!r}",
                    )
                )
    deadline = _get(values, "agent.activeDeadlineSeconds")
    if deadline is None:
        return out
    wall = spec.execution.limits.wall_s
    if wall is None:  # upstream's setting: the pods' deadline is then what bounds a team episode
        out.append(
            _check(
                "agent pod deadline",
                f"{deadline} s",
                f">= {AGENT_POD_MIN_S} s (no episode wall limit)",
                float(deadline) >= AGENT_POD_MIN_S,
                "$.execution.limits.wall_s",
                f"expected agent pods' deadline (chart value agent.activeDeadlineSeconds) of at least "
                f"{AGENT_POD_MIN_S} s when episodes have no wall limit, or a wall_s {AGENT_STOP_S} s below "
                f"it, found {deadline} s",
            )
        )
    else:
        out.append(
            _check(
                "agent pod deadline",
                f"{deadline} s",
                f">= wall_s {wall:g} + {AGENT_STOP_S} s",
                float(deadline) >= wall + AGENT_STOP_S,
                "$.execution.limits.wall_s",
                f"expected an episode wall limit at least {AGENT_STOP_S} s below the agent pods' deadline "
                f"{deadline} s (chart value agent.activeDeadlineSeconds), found {wall:g}",
            )
        )
    return out


def _agent_machine_checks(spec, values: dict) -> list[Check]:
    """The agent pod's sandbox container holds the episode's machine (execution.limits): the memory
    its commands may use (the kubelet would end the container first), the workspace and their /tmp
    (always folders on disk in a pod); GPU agent pods under Kueue queued like the other GPU pods."""
    limits, out = spec.execution.limits, []
    memory = _get(values, "resources.agent.memory")
    if memory is not None:
        out.append(
            _check(
                "agent container memory",
                memory,
                f">= {limits.memory_mb}Mi (memory_mb)",
                quantity_bytes(memory) >= limits.memory_mb * 2**20,
                "values resources.agent.memory",
                f"expected the agent pods' sandbox container (chart value resources.agent.memory) to hold "
                f"execution.limits.memory_mb {limits.memory_mb} MiB, found {memory}: the kubelet would end "
                f"the container, and the episode with it, before a command reaches its own limit",
            )
        )
    size = _get(values, "scratch.agent.size") or _get(values, "resources.agent.ephemeralStorage")
    if size:
        need = limits.workspace_mb + limits.scratch_mb
        where = "scratch.agent.size" if _get(values, "scratch.agent.size") else "resources.agent.ephemeralStorage"
        out.append(
            _check(
                "agent workspace disk",
                size,
                f">= {need}Mi (workspace_mb + scratch_mb)",
                quantity_bytes(size) >= need * 2**20,
                f"values {where}",
                f"expected the agent pods' disk (chart value {where}) to hold execution.limits.workspace_mb "
                f"+ scratch_mb = {need} MiB (a command's /tmp is a folder on it in a pod), found {size}",
            )
        )
    gpus, queue = _get(values, "resources.agent.gpu") or 0, _get(values, "kueue.queueName")
    if gpus and queue:
        pods = bool(_get(values, "kueue.podIntegration"))
        out.append(
            _check(
                "GPU agent pods queued",
                f"kueue.podIntegration {str(pods).lower()}",
                "true",
                pods,
                "values kueue.podIntegration",
                f"expected kueue.podIntegration true with {gpus} GPU(s) per agent pod: without it the agent pods "
                f"are not labelled for queue {queue!r} and take GPUs outside its quota",
            )
        )
    return out


def _mirror_advice(spec, config) -> str:
    """Where the cluster would download a model from the Hub again and again: copy it to S3 once."""
    from mass_jobs.serving.model_dirs import looks_like_hub_id

    hub = [
        (f, u)
        for f, u in (("model.base", spec.model.base), ("model.serve", spec.model.serve))
        if u and not u.startswith("s3://") and looks_like_hub_id(u)
    ]
    if not hub:
        return ""
    size = f"{model_bytes(spec, config) / 1e9:.0f} GB" if config is not None else "the whole model"
    return (
        f"every predictor start, every trainer pod and every merge downloads {size} of "
        f"{' or '.join(u for _, u in hub)} from the Hugging Face Hub (anonymously unless "
        f"HF_TOKEN is in the S3 Secret; the Hub rate-limits): copy it to the bucket once and "
        f"set {' and '.join(f for f, _ in hub)} to its s3:// URI (docs/install.md, 'The base model')"
    )


def _cluster_only_checks(spec, config) -> list[Check]:
    """What only the cluster refuses: Argo's recursion depth, panel selection, a chat template, a
    base model it cannot download (and the advice to mirror a hub id), the operator's webhook."""
    from mass_jobs.serving.model_dirs import looks_like_hub_id

    depth = recursion_depth(spec)
    base = spec.model.base
    out = [
        _check(
            "template recursion depth",
            depth,
            f"< {ARGO_MAX_STACK_DEPTH}",
            depth < ARGO_MAX_STACK_DEPTH,
            "$.search.iterations",
            f"expected (generations - 1) + {CYCLE_DEPTH} + max(search.iterations, {ROUND_DEPTH}) < "
            f"{ARGO_MAX_STACK_DEPTH} (Argo's maxAllowedStackDepth: the controller errors at depth >= "
            f"{ARGO_MAX_STACK_DEPTH} unless its environment sets DISABLE_MAX_RECURSION=true), found {depth}",
        ),
        _check(
            "checkpoint selection",
            spec.sft.checkpoint_selection,
            "val_loss on the cluster",
            spec.sft.checkpoint_selection != "panel",
            "$.sft.checkpoint_selection",
            "expected val_loss on the cluster: panel selection serves every checkpoint and runs episodes inside "
            "the select step's CPU pod",
        ),
        _check(
            "chat template",
            spec.model.chat_template or "none",
            "none on the cluster",
            not spec.model.chat_template,
            "$.model.chat_template",
            "expected none on the cluster (KServe serves model.base as stored): save "
            "the template into the model dir as chat_template.jinja instead",
        ),
        _check(
            "model base downloadable",
            base,
            "s3:// URI or hub id",
            base.startswith("s3://") or looks_like_hub_id(base),
            "$.model.base",
            f"expected an s3:// URI or a hub id 'org/name[@revision]' a cluster can download, found {base!r}",
        ),
    ]
    out[-1].advice = _mirror_advice(spec, config)
    refused = trainer_webhook_errors(spec)
    out.append(
        _check(
            "trainer job admitted",
            f"{spec.sft.replicas} replica(s) x {spec.sft.gpus_per_replica} GPU(s)",
            "the operator's webhook",
            not refused,
            "$.sft.replicas",
            "expected a PyTorchJob the training operator's webhook admits: " + "; ".join(refused),
        )
    )
    return out


def _network_checks(values: dict) -> list[Check]:
    """A whole values file's required network peers (the cycle's validate step gets single values)."""
    if "network" not in values:
        return []
    return [
        _check(
            "network.s3.fqdns on Cilium",
            "network.cilium false",
            "network.cilium true",
            False,
            issue.path,
            issue.message,
        )
        if issue.path.endswith("fqdns")
        else _check(issue.path.removeprefix("values ") + " set", "null", "peers", False, issue.path, issue.message)
        for issue in required_issues(values)
    ]


def _gpu_job_checks(values: dict) -> list[Check]:
    jobs = _get(values, "gpu.concurrentJobs")
    if jobs is None:
        return []
    return [
        _check(
            "GPU jobs at once",
            jobs,
            ">= 1",
            int(jobs) >= 1,
            "values gpu.concurrentJobs",
            f"expected at least 1 GPU job at once (chart value gpu.concurrentJobs), found {jobs}: train never starts",
        )
    ]


def _model_storage_checks(spec, values: dict, config) -> list[Check]:
    """Disk and memory of the pods that hold the model, against its size (from `config`)."""
    out = []
    size = model_bytes(spec, config)
    # (row, chart key, copies of the bf16 model, for what): where it is downloaded, and host memory:
    # rank 0 alone reads the model (the other ranks build it on meta and receive its weights)
    # where the model lands: the pod's ephemeral storage, or its scratch volume when it has one
    rows = [
        (
            f"{pod} {'scratch volume' if _get(values, f'scratch.{pod}.size') else 'ephemeral storage'}",
            f"scratch.{pod}.size" if _get(values, f"scratch.{pod}.size") else f"resources.{pod}.ephemeralStorage",
            copies,
            f"for {copies:g} cop{'y' if copies == 1 else 'ies'} of the",
        )
        for pod, copies in (("server", 1), ("trainer", 1), ("merge", 2))
    ]
    for name, key, copies, what in rows:
        have = _get(values, key)
        if have is None:
            continue
        need = int(size * copies * 1.1)
        out.append(
            _check(
                name,
                have,
                f">= {need / 2**30:.0f}Gi ({copies:g} x {size / 1e9:.1f} GB)",
                quantity_bytes(have) >= need,
                f"values {key}",
                f"expected at least {need / 2**30:.0f}Gi {what} "
                f"{size / 1e9:.1f} GB model (chart value {key}), found {have}",
            )
        )
    return out + _memory_checks(spec, values, size)


def _memory_checks(spec, values: dict, size: int) -> list[Check]:
    """Memory of the trainer (the whole model on its rank 0, and NCCL's /dev/shm) and of the merge."""
    out = []
    n, fp8 = spec.sft.gpus_per_replica, spec.sft.fp8_export
    have = _get(values, "resources.trainer.memory")
    if have is not None:
        # rank 0 alone reads the model (the others build it on meta), and NCCL's /dev/shm is a
        # memory-backed emptyDir: what it holds counts against the pod's memory limit
        ranks = max(n, 1)
        shm = ranks * SHM_PER_RANK_BYTES
        need = int(size * 1.1 + shm)
        out.append(
            _check(
                "trainer memory",
                have,
                f">= {need / 2**30:.0f}Gi (1 x {size / 1e9:.1f} GB + /dev/shm)",
                quantity_bytes(have) >= need,
                "values resources.trainer.memory",
                f"expected at least {need / 2**30:.0f}Gi of memory for a trainer pod: the whole {size / 1e9:.1f} GB "
                f"model, which its rank 0 reads, and {shm / 2**30:.0f}Gi of /dev/shm for NCCL ({ranks} rank(s) per "
                f"pod; memory-backed, it counts against the pod's limit) (chart value resources.trainer.memory), "
                f"found {have}",
            )
        )
    have = _get(values, "resources.merge.memory")
    if have is not None:
        # the merge and the FP8 export go shard by shard (mass_jobs.serving.shards): one shard read
        # tensor by tensor, one output shard held, plus the process
        need = int(2 * MERGE_SHARD_BYTES + MERGE_PROCESS_BYTES)
        out.append(
            _check(
                "merge memory",
                have,
                f">= {need / 2**30:.0f}Gi (2 x {MERGE_SHARD_BYTES / 1e9:.0f} GB shards)",
                quantity_bytes(have) >= need,
                "values resources.merge.memory",
                f"expected at least {need / 2**30:.0f}Gi of memory for the merge{' and its FP8 export' if fp8 else ''}, "
                f"which hold one input and one output shard of up to {MERGE_SHARD_BYTES / 1e9:.0f} GB "
                f"(chart value resources.merge.memory), found {have}",
            )
        )
    return out


def node_disk(values: dict) -> list[tuple[str, str]]:
    """(class, ephemeral-storage request) of each class of pods, largest first: what a node of that
    class's pool must have allocatable (its emptyDirs, logs and writable layers live on the node's
    disk; a scratch volume takes /tmp off it). An agent pod's is its three containers'."""
    asked = {c: _get(values, f"resources.{c}.ephemeralStorage") for c in ("step", "merge", "server", "trainer")}
    agent = [_get(values, f"resources.{c}.ephemeralStorage") for c in ("agent", "qwen", "harness")]
    if None not in agent:
        asked["agent"] = f"{sum(quantity_bytes(q) for q in agent) / 2**30:g}Gi"
    return sorted(((c, str(q)) for c, q in asked.items() if q is not None), key=lambda cq: -quantity_bytes(cq[1]))


def disk_checks(values: dict) -> list[Check]:
    """The node disk the values ask for, stated (nodes are not read offline): a pod whose request no
    node's allocatable ephemeral-storage holds stays Pending until scheduling.pendingTimeoutSeconds."""
    asked = node_disk(values)
    if not asked:
        return []
    return [
        Check(
            "node disk per pod",
            ", ".join(f"{c} {q}" for c, q in asked),
            "each pool's allocatable ephemeral-storage",
            True,
            "values resources.<class>.ephemeralStorage",
        )
    ]


def queue_checks(spec, values: dict) -> list[Check]:
    """With a Kueue queue whose GPU quota is known: a workload that needs more than the quota (the
    trainer job, or one predictor: a run serves one at a time) is never admitted, and its step waits
    out its deadline."""
    queue, quota = _get(values, "kueue.queueName"), _get(values, "kueue.gpuQuota")
    out = covered_checks(values) if queue else []
    if not queue or quota is None:
        return out
    trainer = spec.sft.replicas * spec.sft.gpus_per_replica
    server = _get(values, "resources.server.gpu")
    out += [
        Check(
            "trainer job within the GPU queue",
            f"{spec.sft.replicas} x {spec.sft.gpus_per_replica} GPU(s)",
            f"<= {quota} (kueue.gpuQuota)",
            trainer <= quota,
            "$.sft.replicas",
            f"expected a trainer job of at most {quota} GPUs, the nominal quota of Kueue queue {queue!r} "
            f"(chart value kueue.gpuQuota), found {trainer}: Kueue never admits it",
        )
    ]
    if server is not None:  # one predictor at a time: the cycle's, or evaluate's round (steps.evaluate.serve_order)
        out.append(
            Check(
                "predictor within the GPU queue",
                f"{server} GPU(s)",
                f"<= {quota} (kueue.gpuQuota)",
                int(server) <= quota,
                "values resources.server.gpu",
                f"expected an InferenceService of at most {quota} GPUs, the nominal quota of Kueue queue "
                f"{queue!r} (chart value kueue.gpuQuota), found {server}: Kueue never admits it",
            )
        )
    return out


def covered_checks(values: dict) -> list[Check]:
    """Kueue admits a workload only through a ClusterQueue that lists every resource it requests
    (its flavor assigner: "resource X unavailable in ClusterQueue"): the trainer jobs and predictors
    request cpu, memory, ephemeral-storage and GPUs, and under the plain-pod integration the step
    and agent pods the first three."""
    covered = _get(values, "kueue.coveredResources")
    if covered is None:
        return []
    asked = ["cpu", "memory", "ephemeral-storage", _get(values, "gpu.resourceName") or "nvidia.com/gpu"]
    missing = [r for r in asked if r not in covered]
    return [
        Check(
            "Kueue queue covers every requested resource",
            ", ".join(covered) or "none",
            ", ".join(asked),
            not missing,
            "values kueue.coveredResources",
            f"expected ClusterQueue of LocalQueue {_get(values, 'kueue.queueName')!r} to cover "
            f"{', '.join(missing)} (chart value kueue.coveredResources): every trainer job, predictor"
            f"{' and pod' if _get(values, 'kueue.podIntegration') else ''} requests it, and Kueue never "
            f'admits a workload with a resource its ClusterQueue does not list ("resource {missing[0] if missing else ""} '
            f"unavailable in ClusterQueue\"): add it to a resourceGroup's coveredResources with a quota",
        )
    ]


def size_checks(spec, values: dict) -> list[Check]:
    """mass-run's Workflow object after the last generation (mass_jobs.k8s.workflow_size) against
    the controller's limit: past it, compressed, the workflow errors mid-run unless the controller
    offloads node status to its database."""
    limit, offload = _get(values, "argo.maxWorkflowSize"), _get(values, "argo.nodeStatusOffload")
    if limit is None:
        return []
    if offload is True:
        return [Check("workflow object size", "not bounded", "nodes offloaded", True, "values argo.nodeStatusOffload")]

    from mass_jobs.k8s.workflow_size import estimate  # the templates' models: 1.4 s to import

    last = estimate(spec)[-1]
    kib = f"{last.stored_bytes / 1024:,.0f} KiB"
    return [
        Check(
            "workflow object size",
            f"{kib} ({last.nodes:,} nodes)",
            f"<= {limit / 1024:,.0f} KiB (argo.maxWorkflowSize)",
            last.stored_bytes <= limit,
            "$.generations",
            f"expected mass-run's Workflow object within the controller's MAX_WORKFLOW_SIZE {limit} B (chart "
            f"value argo.maxWorkflowSize), found about {last.stored_bytes} B after generation {last.generation} "
            f"with its nodes compressed: the workflow would error mid-run. Enable nodeStatusOffLoad (persistence "
            f"in workflow-controller-configmap, then argo.nodeStatusOffload: true), raise MAX_WORKFLOW_SIZE, or "
            f"run fewer generations per submission",
        )
    ]


def trainer_webhook_errors(spec) -> list[str]:
    """What the training operator's webhook says of the PyTorchJob this spec's sft renders."""

    from mass_jobs.pipeline.table import trainer_step  # every step's module

    trainer = trainer_step()
    workers = spec.sft.replicas - 1
    job = training.pytorch_job(
        ClusterSettings(),
        training.job_name(spec.name, "0", trainer.name),
        trainer.argv("spec.yaml", 0),
        {},
        workers=workers if workers > 0 else None,
        nproc=str(max(1, spec.sft.gpus_per_replica)),
        gpus=str(spec.sft.gpus_per_replica),
    )
    return webhook_errors(job)


PREREQUISITES = "docs/kubernetes.md#cluster-prerequisites"


def judge_key_issues(spec, env) -> list:
    """In the cycle's validate pod, which mounts the judge Secret as evaluate's finish does: each
    external judge's api_key_env must be set there. The Secret is optional to the pods (a run without
    keyed judges needs none), so a key it lacks would otherwise surface at the first verdict, after
    a generation's training."""
    return [
        SpecIssue(
            f"$.judges[{i}].api_key_env",
            f"expected {j.api_key_env} in the judge Secret (chart value judges.secretName; validate and "
            f"evaluate's finish read it from there), found it unset or empty (judge {j.name!r})",
        )
        for i, j in enumerate(spec.judges)
        if j.endpoint != "local" and j.api_key_env and not env.get(j.api_key_env)
    ]


def issues(found: list[Check]) -> list:
    """A SpecIssue per failing check; each names where the cluster's side of it is documented."""

    return [SpecIssue(c.path, f"{c.why} (cluster prerequisites: {PREREQUISITES})") for c in found if not c.ok]


def table(found: list[Check]) -> str:
    rows = [("check", "value", "limit", "verdict")] + [(c.name, c.value, c.limit, c.verdict) for c in found]
    rows = [tuple(x if len(x) <= 60 else x[:57] + "..." for x in r) for r in rows]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    notes = [f"note: {c.name}: {c.advice}" for c in found if c.ok and c.advice]
    return "\n".join(lines + ([""] + notes if notes else []))
