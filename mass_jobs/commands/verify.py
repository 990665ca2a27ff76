"""`mass verify RUN_OR_SPEC`: re-hash every output of every step manifest of a run.

    mass verify examples/tiny.yaml              # the run of a spec: its store, under its name
    mass verify examples/tiny.yaml --set name=b # the run of the spec as overridden (as every command)
    mass verify file:///tmp/mass-runs/tiny      # a run's folder in its store: that run
    mass verify file:///tmp/mass-runs           # a store: every run in it

One line per broken step (a missing or changed output, or a manifest that is not one), then a
total. Exit 0 when every manifest holds, 1 when any does not (rerunning the run redoes exactly
those steps), 2 when there is nothing to verify.
"""

from __future__ import annotations

import sys

from mass_jobs.commands.cli import overrides
from mass_jobs.spec.load import load_spec
from mass_jobs.spec.overrides import SpecSource, spec_location
from mass_jobs.store import CorruptObject, MissingKey, open_store, verify_manifest
from mass_jobs.store.manifest import MANIFEST_NAME


def add_arguments(parser) -> None:
    parser.add_argument("run", metavar="RUN_OR_SPEC", help="a run spec (path or s3:// URI) or a store URI of a run")
    parser.add_argument("--quiet", action="store_true", help="print only broken steps")
    overrides(parser)


def _store_uri(where: str | SpecSource) -> bool:
    where = spec_location(where)
    return where.startswith("file://") or (where.startswith("s3://") and not where.endswith((".yaml", ".yml", ".json")))


def _locate(where: str):
    """(store, key prefix) of a spec's run, or of a store URI given directly. A URI naming a run's
    own folder (it holds the run's spec.json) is read from its store: manifests name their outputs
    by keys from the store's root, `<run>/gen-0/...`."""

    if _store_uri(where):
        store = open_store(where)
        parent, _, name = where.rstrip("/").rpartition("/")
        if name and store.exists("spec.json") and parent.split("://", 1)[1].strip("/"):
            return open_store(parent), f"{name}/"
        return store, ""

    spec = load_spec(where)
    return open_store(spec.store), f"{spec.name}/"


def main(args) -> int:
    where = args.run
    if args.overlay or args.set_values:
        if _store_uri(where):
            print("mass verify: --set/--overlay change a spec; a store URI has none to change", file=sys.stderr)
            return 2
        where = SpecSource(where, args.overlay, args.set_values)
    store, prefix = _locate(where)
    steps = [k.removesuffix(f"/{MANIFEST_NAME}") for k in store.list(prefix) if k.endswith(f"/{MANIFEST_NAME}")]
    if not steps:
        print(f"mass verify: no step manifests under {store.uri}/{prefix}", file=sys.stderr)
        return 2
    broken = outputs = 0
    for step in steps:
        try:
            outputs += len(verify_manifest(store, step)["outputs"])
        except (CorruptObject, MissingKey) as err:
            broken += 1
            print(f"BROKEN {step}: {err}")
        else:
            if not args.quiet:
                print(f"ok     {step}")
    print(f"{len(steps)} step manifest(s), {outputs} output(s) re-hashed: {broken} broken")
    return 1 if broken else 0
