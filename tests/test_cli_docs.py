"""The CLI table of docs/architecture.md agrees with the parser: every command and sub-command has
a row and a description; each documented form names only options its `--help` lists, names every
required one, and takes the run spec the one way (`mass CMD SPEC`); `--spec SPEC` works too."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from mass_jobs.commands.cli import COMMANDS, build_parser, main

ROOT = Path(__file__).resolve().parent.parent
SECTION = (ROOT / "docs" / "architecture.md").read_text().split("## CLI", 1)[1].split("\n## ", 1)[0]
FORMS = [
    f
    for row in SECTION.splitlines()
    if row.startswith("| `mass ")
    for f in re.findall(r"`(mass [^`]+)`", row.split(" | ")[0])
]


def leaf_parsers() -> dict[str, argparse.ArgumentParser]:
    """'render sft' -> its parser, for every command and nested sub-command."""
    out = {}

    def walk(name, parser):
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            out[name] = parser
        for child_name, child in subs[0].choices.items() if subs else []:
            walk(f"{name} {child_name}", child)

    for name in COMMANDS:
        root = build_parser(name)
        sub = next(a for a in root._actions if isinstance(a, argparse._SubParsersAction))
        walk(name, sub.choices[name])
    return out


LEAVES = leaf_parsers()


def documented(name: str) -> list[str]:
    return [f for f in FORMS if f == f"mass {name}" or f.startswith(f"mass {name} ")]


def test_every_command_and_sub_command_has_a_row_and_every_row_a_command():
    assert sorted(n for n in LEAVES if not documented(n)) == []
    named = {" ".join(f.split()[1:3]) if " ".join(f.split()[1:3]) in LEAVES else f.split()[1] for f in FORMS}
    assert named == set(LEAVES)


@pytest.mark.parametrize("name", sorted(LEAVES))
def test_help_and_the_table_agree(name):
    # the text `mass NAME --help` prints, from the parser it builds (tests/test_cli.py runs each --help
    # in a process of its own)
    parser = LEAVES[name]
    text = parser.format_help()
    usage, _, rest = text.partition("\n\n")
    description = rest.split("\n\n")[0].strip()
    assert description and not description.startswith(("positional arguments", "options")), f"{name}: no description"
    listed = set(re.findall(r"--[a-z][a-z-]*", text))
    required = {a.option_strings[0] for a in parser._actions if a.required and a.option_strings}
    takes_spec = any(a.dest == "spec" for a in parser._actions)
    for form in documented(name):
        options = set(re.findall(r"--[a-z][a-z-]*", form))
        assert options <= listed, f"{form!r}: not in `mass {name} --help`: {sorted(options - listed)}"
        assert required <= options, f"{form!r}: leaves out required {sorted(required - options)}"
        assert ("SPEC" in form.split()) == takes_spec, f"{form!r}: the run spec is `mass {name} SPEC`"
        assert "--spec" not in options, f"{form!r}: documents --spec instead of SPEC"


def test_spec_positional_and_flag_are_the_same(tmp_path, capsys):
    missing = str(tmp_path / "none.yaml")
    for argv in (
        ["report", missing],
        ["report", "--spec", missing],
        ["status", missing],
        ["status", "--spec", missing],
    ):
        assert main(argv) == 2
        assert f"$: expected a spec file, found nothing at {missing!r}" in capsys.readouterr().err
    assert main(["report"]) == 2
    assert capsys.readouterr().err.strip() == "mass report: expected one run spec (`mass report SPEC`), found none"
    assert main(["guard", "a.yaml", "--spec", "b.yaml", "--gen", "0", "--task", "t"]) == 2
    assert "found a.yaml and b.yaml" in capsys.readouterr().err


def test_the_readme_is_what_a_newcomer_needs_first_and_points_to_documents_that_exist():
    """The README stays short (the rest lives in docs/) and every document it names is there."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.encode()) < 15_000
    named = set(re.findall(r"`(docs/[\w-]+\.md)`", readme))
    assert {"docs/running.md", "docs/demo.md", "docs/paper.md", "docs/kubernetes.md", "docs/parity.md"} <= named
    assert all((ROOT / doc).is_file() for doc in named), named
    for target in ("demo:", "test:", "test-fast:", "paper-mini:", "attack:"):
        assert f"\n{target}" in (ROOT / "Makefile").read_text(), target


def readme_commands() -> list[list[str]]:
    """Each command line of the README's code blocks, without its comment, split as a shell would."""
    import shlex

    blocks = re.findall(r"```(?:\w+)?\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    return [
        shlex.split(line.split("  #", 1)[0])
        for block in blocks
        for line in block.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]


def test_every_readme_command_exists_with_its_options_and_files():
    """`make X`: a Makefile target; `mass ...`: parses with the real parser; a spec it names exists."""
    makefile = (ROOT / "Makefile").read_text()
    lines = readme_commands()
    assert len(lines) >= 8
    for argv in lines:
        if argv[0] == "make":
            assert all(re.search(rf"^{re.escape(t)}:", makefile, re.M) for t in argv[1:] if "=" not in t), argv
            continue
        if argv[0] in (".venv/bin/mass", "mass"):
            args = build_parser(argv[1]).parse_args(argv[1:])  # an unknown option exits 2 here
            assert args.command == argv[1]
            for word in argv[2:]:
                if word.endswith((".yaml", ".yml", ".json")) and not word.startswith("s3://"):
                    assert (ROOT / word).is_file(), f"{' '.join(argv)}: {word} does not exist"
