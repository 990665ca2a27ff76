"""`mass episode --in DIR --out DIR`: run one agent episode (what an agent pod runs).

Reads DIR/episode.json (prompt, endpoint {base_url, model, api_key_env}, limits, sampling, harness,
seed, files) and copies DIR/workspace/ (when present) to OUT/workspace/, where the agents work;
writes OUT/trace.jsonl and OUT/status.json. Needs no store credentials. Exit 0 for every classified
outcome but infra_error (1, so a retry policy can rerun it); 2 for a bad episode.json.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path


def add_arguments(parser) -> None:
    parser.add_argument("--in", dest="in_dir", required=True, metavar="DIR", help="holds episode.json and workspace/")
    parser.add_argument("--out", dest="out_dir", required=True, metavar="DIR", help="gets workspace/, trace.jsonl, status.json")


def main(args) -> int:
    from mass_jobs.harness import load_episode_file, run_episode

    in_dir, out_dir = Path(args.in_dir), Path(args.out_dir)
    try:
        inp = load_episode_file(in_dir / "episode.json")
    except ValueError as exc:
        print(f"mass episode: {exc}", file=sys.stderr)
        return 2
    workspace = out_dir / "workspace"
    if workspace.exists():
        print(f"mass episode: {workspace} exists; use an empty --out directory", file=sys.stderr)
        return 2
    out_dir.mkdir(parents=True, exist_ok=True)
    if (in_dir / "workspace").is_dir():
        shutil.copytree(in_dir / "workspace", workspace, symlinks=True)
    else:
        workspace.mkdir()
    try:
        result = run_episode(inp, workspace, out_dir)
    except ValueError as exc:
        print(f"mass episode: {exc}", file=sys.stderr)
        return 2
    print(f"{result.outcome}: {result.reason} (status: {result.status_path})")
    return 1 if result.outcome == "infra_error" else 0
