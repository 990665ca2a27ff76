"""`mass episode --in DIR --out DIR`: run one agent episode (what an agent pod runs).

Reads DIR/episode.json (prompt, endpoint {base_url, model, api_key_env}, limits, sampling, harness,
seed, files) and the workspace: DIR/workspace.tar.gz (the store's deterministic archive, extracted
safely) or DIR/workspace/, into OUT/workspace/, where the agents work; writes OUT/trace.jsonl,
OUT/status.json and OUT/workspace.tar.gz (the same archive format the store's put_dir writes).
The archives travel as Argo artifacts with `archive: none`, so Argo neither untars them on input
(renaming a single top-level entry onto the path) nor re-tars the output under a `workspace/`
directory: the bytes the collect step stores are the ones this command wrote. Needs no store
credentials. Exit 0 for every classified outcome but infra_error (1, so a retry policy can rerun
it); 2 for a bad episode.json or workspace archive. An episode.json holding `checks` is a guard's
checks job instead (mass_jobs/sandbox/check_job.py): it writes OUT/checks.json only. With DIR/episode.key
(prepare writes one per rollout) OUT/proof.json, written last, signs the outputs for ingest
(mass_jobs/episodes/proof.py); the key is read before anything runs and goes nowhere else.

With `--sandbox SOCKET` (the agent pod's main container) the workspace and everything that runs
model-written code live in the pod's sandbox container (`mass sandbox-serve`, another uid); this
process keeps the proxy, the trace and the status out of that code's reach. With `--qwen SOCKET`
qwen-code runs in the pod's qwen-code container (a third uid), and `--qwen-uid` makes the proxy
serve only the caller's uid the harness needs.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from mass_jobs.episodes import proof
from mass_jobs.episodes.harness import load_episode_file, run_episode
from mass_jobs.episodes.sandbox_client import SandboxClient
from mass_jobs.sandbox.check_job import load_checks_file, run_checks
from mass_jobs.sandbox.run import BOUNDARY_ENV, sandbox_refusal
from mass_jobs.store.archive import UnsafeArchive, extract_dir_archive, write_dir_archive


def add_arguments(parser) -> None:
    parser.add_argument("--in", dest="in_dir", required=True, metavar="DIR", help="holds episode.json and workspace/")
    parser.add_argument(
        "--out", dest="out_dir", required=True, metavar="DIR", help="gets workspace/, trace.jsonl, status.json"
    )
    parser.add_argument(
        "--sandbox",
        default=None,
        metavar="SOCKET",
        help="run tools and shell commands in the sandbox container serving this Unix socket",
    )
    parser.add_argument(
        "--qwen",
        default=None,
        metavar="SOCKET",
        help="start qwen-code in the qwen-code container serving this Unix socket (with --sandbox)",
    )
    parser.add_argument(
        "--egress-proxy",
        default=None,
        metavar="URL",
        help="the run's egress proxy (http://host:port; an agent pod's): with execution.network, "
        "shell commands reach out through it, and its record of --rollout is network.jsonl",
    )
    parser.add_argument(
        "--rollout",
        default=None,
        metavar="PATH",
        help="this rollout's path in the run: the egress proxy's user (its key is DIR/episode.key)",
    )
    parser.add_argument(
        "--qwen-uid",
        type=int,
        default=None,
        metavar="UID",
        help="the qwen-code container's uid: with it the proxy serves only that uid's calls under "
        "qwen-code and only this process's under the built-in harness",
    )


def main(args) -> int:

    in_dir, out_dir = Path(args.in_dir), Path(args.out_dir)
    key = (in_dir / proof.KEY).read_bytes() if (in_dir / proof.KEY).is_file() else None
    try:
        job = load_checks_file(in_dir / "episode.json")
        inp = None if job is not None else load_episode_file(in_dir / "episode.json")
    except ValueError as exc:
        print(f"mass episode: {exc}", file=sys.stderr)
        return 2
    if not args.sandbox and (refusal := sandbox_refusal()) is not None:  # its model-written code would run here
        print(f"mass episode: {refusal} (by hand, without a run's spec: {BOUNDARY_ENV}=none)", file=sys.stderr)
        return 2
    workspace = out_dir / "workspace"
    if workspace.exists():
        print(f"mass episode: {workspace} exists; use an empty --out directory", file=sys.stderr)
        return 2
    import tarfile

    out_dir.mkdir(parents=True, exist_ok=True)
    if (in_dir / "workspace.tar.gz").is_file():
        workspace.mkdir()
        try:
            with open(in_dir / "workspace.tar.gz", "rb") as f:
                extract_dir_archive(f, workspace)
        except (UnsafeArchive, OSError, EOFError, tarfile.TarError) as exc:
            print(f"mass episode: {in_dir / 'workspace.tar.gz'}: {exc}", file=sys.stderr)
            return 2
    elif (in_dir / "workspace").is_dir():
        shutil.copytree(in_dir / "workspace", workspace, symlinks=True)
    else:
        workspace.mkdir()

    sandbox = SandboxClient(args.sandbox) if args.sandbox else None
    qwen = SandboxClient(args.qwen) if args.qwen else None
    if qwen is not None and sandbox is None:
        print("mass episode --qwen: expected --sandbox too (qwen-code's shell commands run there)", file=sys.stderr)
        return 2
    if job is not None:  # a guard's checks over a finished episode's workspace: OUT/checks.json
        doc = run_checks(job, workspace, out_dir, sandbox=sandbox)
        if key is not None:
            proof.sign_outputs(key, out_dir, proof.CHECK_OUTPUTS)
        print(" ".join(f"{r['name']}: exit {r['exit_code']}" for r in doc["checks"]))
        return 0
    egress = None
    if args.egress_proxy and inp.network is not None:
        from mass_jobs.sandbox.egress_service import RemoteEgress

        if sandbox is None or key is None or not args.rollout:
            print(
                "mass episode --egress-proxy: expected --sandbox, --rollout and DIR/episode.key too "
                "(the proxy knows a rollout by its key)",
                file=sys.stderr,
            )
            return 2
        try:
            egress = RemoteEgress(args.egress_proxy, args.rollout, key, out_dir / "network.jsonl")
        except ValueError as exc:
            print(f"mass episode: {exc}", file=sys.stderr)
            return 2
    try:
        result = run_episode(inp, workspace, out_dir, sandbox=sandbox, qwen=qwen, qwen_uid=args.qwen_uid, egress=egress)
    except ValueError as exc:
        print(f"mass episode: {exc}", file=sys.stderr)
        return 2
    with open(out_dir / "workspace.tar.gz", "wb") as f:
        write_dir_archive(workspace, f)
    if key is not None:
        proof.sign_outputs(key, out_dir, proof.EPISODE_OUTPUTS)
    print(f"{result.outcome}: {result.reason} (status: {result.status_path})")
    return 1 if result.outcome == "infra_error" else 0
