"""Attacks on archive extraction (get_dir of a workspace.tar.gz an agent pod wrote).

Every hostile archive must end in the typed `UnsafeArchive` with nothing left behind: no target,
no staging folder, nothing written outside. The CVE-2025-4517 archive is built for real and shown
to escape this interpreter's own `filter="data"` (when unpatched) before it is refused here.

    .venv/bin/python -m pytest -q tests/attack/test_archive.py
"""

from __future__ import annotations

import gzip
import io
import os
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import pytest

from mass_jobs.store import MODEL_LIMITS, ArchiveLimits, UnsafeArchive
from mass_jobs.store.archive import extract_dir_archive

MiB, GiB = 1 << 20, 1 << 30


Member = tuple[tarfile.TarInfo, bytes]


def member(
    name: str,
    *,
    kind: bytes = tarfile.REGTYPE,
    link: str = "",
    data: bytes = b"",
    mode: int = 0o644,
    size: int | None = None,
) -> Member:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, link, mode
    info.size = len(data) if size is None else size
    return info, data


def tar_bytes(*members: Member, fmt: int = tarfile.PAX_FORMAT) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return buf.getvalue()


def targz(*members: Member, fmt: int = tarfile.PAX_FORMAT) -> bytes:
    return gzip.compress(tar_bytes(*members, fmt=fmt))


FINE = member("fine.txt", data=b"ok")
SYM, LNK, DIR = tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.DIRTYPE


def refused(tmp_path: Path, data: bytes, match: str, limits: ArchiveLimits | None = None) -> UnsafeArchive:
    """Extract `data` under tmp_path/box/out; assert it is refused and box is left exactly as it was."""
    box = tmp_path / "box"
    box.mkdir(exist_ok=True)
    (box / "secret").write_text("untouched")
    before = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*"))
    with pytest.raises(UnsafeArchive, match=match) as err:
        extract_dir_archive(io.BytesIO(data), box / "deep" / "out", *([limits] if limits else []))
    after = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*"))
    assert after == before  # no target, no parents, no staging folder, nothing outside
    assert (box / "secret").read_text() == "untouched"
    return err.value


# ---------------------------------------------------------------- names and links

ESCAPES = {
    "dotdot": [member("../escape.txt", data=b"x")],
    "dotdot-after-dot": [member("./../escape.txt", data=b"x")],
    "nested-dotdot": [member("a/../../escape.txt", data=b"x")],
    "dotdot-dir": [member("..", kind=DIR)],
    "absolute-file": [member("/tmp/abs-escape.txt", data=b"x")],
    "absolute-dir": [member("/tmp/abs-escape-dir", kind=DIR)],
    "double-slash-absolute": [member("//etc/evil", data=b"x")],
    "symlink-absolute": [member("ln", kind=SYM, link="/etc")],
    "symlink-up": [member("ln", kind=SYM, link="..")],
    "symlink-up-nested": [member("a/ln", kind=SYM, link="b/../..")],
    "symlink-sibling": [member("ln", kind=SYM, link="../box/secret")],
    "symlink-trailing-dotdot": [member("ln", kind=SYM, link="a/..")],
    "symlink-absolute-root": [member("ln", kind=SYM, link="/")],
    "symlink-empty-target": [member("ln", kind=SYM, link="")],
    "hardlink-absolute": [member("hl", kind=LNK, link="/etc/passwd")],
    "hardlink-up": [member("hl", kind=LNK, link="../box/secret")],
    "hardlink-inside": [FINE, member("hl", kind=LNK, link="fine.txt")],
    "chardev": [member("null", kind=tarfile.CHRTYPE)],
    "blockdev": [member("sda", kind=tarfile.BLKTYPE)],
    "fifo": [member("pipe", kind=tarfile.FIFOTYPE)],
    "empty-name-file": [member("", data=b"x")],
}


@pytest.mark.parametrize("members", ESCAPES.values(), ids=ESCAPES.keys())
def test_escaping_names_and_links_are_refused(tmp_path, members):
    refused(
        tmp_path,
        targz(FINE, *members) if members[0] is not FINE else targz(*members),
        "escapes|points outside|hard link|device|target directory itself",
    )


THROUGH_LINKS = {
    # A link to a folder inside, then a file below the link: never written through, even inside.
    "file-below-downward-link": [
        member("sub", kind=DIR),
        member("ln", kind=SYM, link="sub"),
        member("ln/planted", data=b"x"),
    ],
    "file-below-dot-link": [member("ln", kind=SYM, link="."), member("ln/ln/ln/planted", data=b"x")],
    "dir-below-link": [member("ln", kind=SYM, link="."), member("ln/newdir", kind=DIR)],
    "file-below-file": [member("f", data=b"x"), member("f/planted", data=b"y")],
    "dir-over-link": [member("ln", kind=SYM, link="."), member("ln", kind=DIR)],
}


@pytest.mark.parametrize("members", THROUGH_LINKS.values(), ids=THROUGH_LINKS.keys())
def test_nothing_is_written_through_a_link_or_a_file(tmp_path, members):
    refused(tmp_path, targz(*members), "goes through a link or a file")


DUPLICATES = {
    "file-twice": [member("f", data=b"first"), member("f", data=b"second")],
    "file-over-symlink": [member("f", kind=SYM, link="g"), member("f", data=b"x")],
    "symlink-over-file": [member("f", data=b"x"), member("f", kind=SYM, link="g")],
    "file-over-dir": [member("d", kind=DIR), member("d", data=b"x")],
    "symlink-twice": [member("l", kind=SYM, link="a"), member("l", kind=SYM, link="b")],
}


@pytest.mark.parametrize("members", DUPLICATES.values(), ids=DUPLICATES.keys())
def test_a_second_member_of_the_same_name_is_refused(tmp_path, members):
    refused(tmp_path, targz(*members), "appears twice")


LONG = {
    "name-over-limit": (
        member("a" * 200 + "/" + "b" * 200 + "/" + "c" * 200 + "/" + "d" * 250 + "/" + "e" * 250, data=b"x"),
        "bytes long",
    ),
    "component-over-255": (member("x" * 300, data=b"x"), "component over 255"),
    "too-deep": (member("/".join(["d"] * 100) + "/f", data=b"x"), "levels deep"),
    "link-target-over-limit": (member("ln", kind=SYM, link="/".join(["a"] * 600)), "target is"),
    "link-target-component-over-255": (member("ln", kind=SYM, link="y" * 300), "component over 255"),
}


@pytest.mark.parametrize("case", LONG.values(), ids=LONG.keys())
def test_overlong_names_and_link_targets_are_refused(tmp_path, case):
    m, match = case
    refused(tmp_path, targz(FINE, m), match)


def test_gnu_long_name_format_is_checked_the_same(tmp_path):
    refused(tmp_path, targz(member("../" + "x" * 150, data=b"x"), fmt=tarfile.GNU_FORMAT), "escapes")


def test_negative_size_header_is_refused(tmp_path):
    # CVE-2025-8194 class: a negative size moves the reader backwards; a stream can only go forward.
    head = bytearray(tar_bytes(member("f", data=b"x" * 600))[:512])
    head[124:136] = b"\xff" * 12  # base-256 encoded -1
    head[148:156] = b" " * 8
    head[148:155] = f"{sum(head):06o}\0".encode()
    refused(tmp_path, gzip.compress(bytes(head) + b"\0" * 2048), "negative|not a readable")


NOT_ARCHIVES = {
    "empty": b"",
    "random-bytes": os.urandom(4096),
    "gzip-of-garbage": gzip.compress(os.urandom(4096)),
    "truncated-gzip": targz(FINE, member("big", data=os.urandom(100_000)))[:5000],
    "truncated-tar": gzip.compress(tar_bytes(FINE, member("big", data=os.urandom(100_000)))[:5000]),
    "plain-tar-not-gzipped": tar_bytes(FINE),
}


@pytest.mark.parametrize("data", NOT_ARCHIVES.values(), ids=NOT_ARCHIVES.keys())
def test_what_is_not_a_complete_tar_gz_is_refused_and_leaves_nothing(tmp_path, data):
    refused(tmp_path, data, "not a readable tar.gz|member")


# ---------------------------------------------------------------- CVE-2025-4517 (PATH_MAX)


def cve_2025_4517(dest: Path) -> bytes:
    """Dirs and links whose resolved path exceeds PATH_MAX, so realpath stops expanding and a last
    link `escape` -> the folder above `dest` looks inside; then a hard link and files written through it."""
    steps = "abcdefghijklmnop"
    path_max = os.pathconf(dest.parent, "PC_PATH_MAX")
    comp = "d" * ((path_max - len(str(dest)) - 1) // (len(steps) + 1))
    members, path = [], ""
    for step in steps:
        members += [
            member(os.path.join(path, comp), kind=DIR, mode=0o777),
            member(os.path.join(path, step), kind=SYM, link=comp),
        ]
        path = os.path.join(path, comp)
    linkpath = os.path.join(*steps, "l" * 254)
    members += [
        member(linkpath, kind=SYM, link=os.path.join(*[".."] * len(steps))),
        member("escape", kind=SYM, link=os.path.join(linkpath, "..")),
        member("flaglink", kind=LNK, link="escape/flag"),
        member("flaglink", data=b"overwrite"),
        member("escape/newfile", data=b"new"),
    ]
    return targz(*members)


STDLIB_EXTRACT = textwrap.dedent("""
    import sys, tarfile
    with tarfile.open(sys.argv[1]) as tar:
        try:
            tar.extractall(sys.argv[2], filter="data")
        except Exception as err:
            print("refused", type(err).__name__)
""")


def test_cve_2025_4517_archive_escapes_stdlib_filter_when_unpatched_and_is_refused_here(tmp_path):
    outer = tmp_path / "box"
    outer.mkdir()
    (outer / "flag").write_text("secret")
    dest = outer / "dest"
    data = cve_2025_4517(dest)
    assert len(data) < 4096

    # The archive is the real thing: this interpreter's own filter lets it write outside, unless patched
    # (the upstream fix added os.path.ALLOW_MISSING with it).
    (tmp_path / "cve.tar.gz").write_bytes(data)
    (tmp_path / "std").mkdir()
    (tmp_path / "std" / "flag").write_text("secret")  # same path length as box/: the same archive fits
    proc = subprocess.run(
        [sys.executable, "-c", STDLIB_EXTRACT, str(tmp_path / "cve.tar.gz"), str(tmp_path / "std" / "dest")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if hasattr(os.path, "ALLOW_MISSING"):
        assert proc.stdout.startswith("refused")
    else:
        assert (tmp_path / "std" / "newfile").read_text() == "new", proc.stdout + proc.stderr
        assert (tmp_path / "std" / "flag").read_text() == "overwrite"

    with pytest.raises(UnsafeArchive, match="bytes long"):
        extract_dir_archive(io.BytesIO(data), dest)
    # Refused without the length limits too: its link up is a string check, no path is resolved.
    with pytest.raises(UnsafeArchive, match="points outside"):
        extract_dir_archive(io.BytesIO(data), dest, ArchiveLimits(max_name=1 << 20, max_link=1 << 20))
    assert sorted(p.name for p in outer.iterdir()) == ["flag"]
    assert (outer / "flag").read_text() == "secret"


@pytest.mark.parametrize("steps", [2, 8, 32])
def test_symlink_chains_pointing_up_are_refused_at_any_length(tmp_path, steps):
    members = [member("/".join(["d"] * (i + 1)), kind=DIR) for i in range(steps)]
    members += [member("/".join(["d"] * steps) + "/up", kind=SYM, link="/".join([".."] * (steps + 1)))]
    refused(tmp_path, targz(*members), "points outside")


# ---------------------------------------------------------------- bombs


def concat_bomb(content: int, *, declare: bool = True) -> bytes:
    """One file of `content` zero bytes as concatenated gzip members: ~1 KB per MiB, built cheaply."""
    header = member("zeros", size=content if declare else 1)[0].tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
    one_mib = gzip.compress(b"\0" * MiB, 9)
    return gzip.compress(header) + one_mib * (content // MiB) + gzip.compress(b"\0" * 1024)


class CountingReader(io.RawIOBase):
    def __init__(self, data: bytes, seekable: bool = True):
        self.buf, self.read_bytes, self._seekable = io.BytesIO(data), 0, seekable

    def readable(self):
        return True

    def seekable(self):
        return self._seekable

    def tell(self):
        if not self._seekable:
            raise OSError("not seekable")
        return self.buf.tell()

    def seek(self, *a):
        if not self._seekable:
            raise OSError("not seekable")
        return self.buf.seek(*a)

    def read(self, n=-1):
        data = self.buf.read(n)
        self.read_bytes += len(data)
        return data

    def readinto(self, b):
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)


def test_one_megabyte_expanding_to_a_gibibyte_is_refused_at_its_header(tmp_path):
    data = concat_bomb(GiB)
    assert len(data) < 1.5 * MiB
    reader = CountingReader(data)
    with pytest.raises(UnsafeArchive, match="decompression bomb"):
        extract_dir_archive(reader, tmp_path / "out")
    assert reader.read_bytes < 64 * 1024  # refused from the first header, not after inflating
    assert not (tmp_path / "out").exists() and list(tmp_path.iterdir()) == []


def test_bomb_from_a_stream_of_unknown_length_is_refused_by_the_running_ratio(tmp_path):
    reader = CountingReader(concat_bomb(GiB), seekable=False)
    with pytest.raises(UnsafeArchive, match="decompression bomb"):
        extract_dir_archive(reader, tmp_path / "out")
    assert reader.read_bytes < 200 * 1024  # stopped after inflating ~64 MiB, not 1 GiB
    assert list(tmp_path.iterdir()) == []


def test_bomb_over_the_byte_limit_is_refused_even_when_ratio_is_allowed(tmp_path):
    limits = ArchiveLimits(max_bytes=8 * MiB, max_ratio=float("inf"))
    refused(tmp_path, concat_bomb(16 * MiB), "more than 8388608 bytes", limits)


def test_many_small_members_adding_up_are_refused(tmp_path):
    zeros = [member(f"f{i:04d}", data=b"\0" * 128 * 1024) for i in range(80)]  # 10 MiB, compresses ~1000x
    refused(tmp_path, targz(*zeros), "more than", ArchiveLimits(max_bytes=4 * MiB))
    refused(tmp_path, targz(*zeros), "decompression bomb", ArchiveLimits(ratio_floor=MiB, max_ratio=50))


def test_member_count_is_bounded(tmp_path):
    many = [member(f"e{i}") for i in range(101)]
    refused(tmp_path, targz(*many), "more than 100 members", ArchiveLimits(max_members=100))


def test_pax_header_bomb_is_refused(tmp_path):
    m = member("f", data=b"x")
    m[0].pax_headers = {"comment": "z" * (3 * MiB)}
    refused(tmp_path, targz(m), "headers exceed", ArchiveLimits(max_header_bytes=MiB))


def test_gnu_long_name_bomb_is_refused(tmp_path):
    refused(
        tmp_path,
        targz(member("n" * (3 * MiB), data=b"x"), fmt=tarfile.GNU_FORMAT),
        "headers exceed|bytes long",
        ArchiveLimits(max_header_bytes=MiB),
    )


def test_the_same_bomb_under_model_limits_is_still_bounded_by_bytes(tmp_path):
    assert MODEL_LIMITS.max_bytes < float("inf")
    refused(tmp_path, concat_bomb(32 * MiB), "more than", ArchiveLimits(max_bytes=16 * MiB, max_ratio=float("inf")))


# ---------------------------------------------------------------- what is kept, made harmless


def test_setuid_and_world_writable_modes_are_stripped(tmp_path):
    data = targz(member("run", data=b"#!/bin/sh\n", mode=0o6777), member("d", kind=DIR, mode=0o1777))
    out = extract_dir_archive(io.BytesIO(data), tmp_path / "out")
    assert (out / "run").stat().st_mode & 0o7777 == 0o755
    assert (out / "d").stat().st_mode & 0o7777 == 0o755


def test_downward_links_backslashes_and_odd_bytes_stay_inside(tmp_path):
    data = targz(
        member("sub", kind=DIR),
        member("sub/f", data=b"x"),
        member("ln", kind=SYM, link="sub/f"),
        member("..\\evil", data=b"y"),
        member("caf\udce9", data=b"z"),
    )
    out = extract_dir_archive(io.BytesIO(data), tmp_path / "out")
    assert sorted(os.listdir(out)) == sorted(["..\\evil", "caf\udce9", "ln", "sub"])
    assert (out / "ln").read_text() == "x" and os.readlink(out / "ln") == "sub/f"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


@pytest.mark.parametrize("image", ["jobs", "sandbox", "trainer"])
def test_images_pin_a_python_with_the_upstream_tarfile_fixes(image):
    import re

    text = (Path(__file__).resolve().parents[2] / "images" / f"{image}.Dockerfile").read_text()
    versions = [tuple(map(int, v)) for v in re.findall(r"^FROM python:(\d+)\.(\d+)\.(\d+)", text, re.M)]
    assert versions and all(v >= (3, 11, 14) for v in versions)  # CVE-2025-4517 fixed in 3.11.13, -8194 in .14


# ---------------------------------------------------------------- at the steps that extract


HOSTILE_WORKSPACES = {
    "cve-2025-4517": lambda tmp: cve_2025_4517(tmp / "x" / "dest"),
    "symlink-up": lambda tmp: targz(member("report.md", data=b"score: 9"), member("ln", kind=SYM, link="../../..")),
    "gibibyte-bomb": lambda tmp: concat_bomb(GiB),
    "not-an-archive": lambda tmp: b"score: 9",
}


@pytest.mark.parametrize("make", HOSTILE_WORKSPACES.values(), ids=HOSTILE_WORKSPACES.keys())
def test_guard_vetoes_an_episode_whose_archive_is_refused_and_rank_never_shows_it(
    make, make_store, inner_spec, judging_endpoint, tmp_path
):
    from mass_jobs.episodes.rollouts import episode_runner
    from mass_jobs.run.context import RunContext
    from mass_jobs.serving.llm import ModelClient
    from mass_jobs.steps.collect import run_collect
    from mass_jobs.steps.guard import run_guard
    from mass_jobs.steps.rank import run_rank
    from mass_jobs.steps.search import run_search
    from tests.fixtures.inner_loop import add_episodes, episode

    store = make_store("file")
    task = {"id": "t1", "split": "train", "prompt": "Write report.md with a score.", "deliverables": ["report.md"]}
    spec = inner_spec(store, tasks=[task], search={"iterations": 0}, collection={"episodes": 4})
    ep = judging_endpoint()
    ctx = RunContext(spec, store)
    client = ModelClient(ep.endpoint, spec.model.sampling, timeout_s=10, retries=0)
    execute = episode_runner(spec, ep.endpoint)
    add_episodes(ep, episode(1), episode(5))
    run_search(ctx, 0, "t1", client, execute)
    add_episodes(ep, episode(3), episode(4), episode(2), episode(6))
    run_collect(ctx, 0, "t1", execute)

    # The agent pod of ep-1 uploads a hostile workspace in place of its own.
    store.put_bytes("inner/gen-0/collect/t1/ep-1/workspace.tar.gz", make(tmp_path))
    report = run_guard(ctx, 0, "t1")
    assert report.vetoed == ["ep-1"]
    assert report.episodes["ep-1"].reasons[0].startswith("workspace archive refused: ")
    ranking = run_rank(ctx, 0, "t1", client)
    assert set(ranking.episodes) == {"ep-0", "ep-2", "ep-3"} and list(ranking.excluded) == ["ep-1"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stores"]  # nothing landed outside


def test_a_refused_rollout_workspace_is_shown_to_the_judge_as_refused(make_store):
    from mass_jobs.judging.compare import stored_views

    store = make_store("file")
    store.put_json("r/status.json", {"outcome": "success"})
    store.put_bytes(
        "r/workspace.tar.gz", targz(member("report.md", data=b"score: 9"), member("ln", kind=SYM, link="/etc/passwd"))
    )
    text, _ = stored_views(store, "r", 4096, ["report.md"])
    assert text.startswith("WORKSPACE REFUSED: the stored archive was not extracted: archive symlink 'ln'")
    assert "score: 9" not in text and "- report.md: MISSING" in text and len(text.encode()) <= 4096


def remove_deep_chain(root: Path, name: str) -> None:
    """Remove root/name/name/.../(files) of any depth, deepest first, without recursion."""
    fds = [os.open(root, os.O_RDONLY)]
    try:
        while name in os.listdir(fds[-1]):
            fds.append(os.open(name, os.O_RDONLY, dir_fd=fds[-1]))
        while len(fds) > 1:
            for entry in os.listdir(fds[-1]):
                os.unlink(entry, dir_fd=fds[-1])
            os.close(fds.pop())
            os.rmdir(name, dir_fd=fds[-1])
    finally:
        for fd in fds:
            os.close(fd)


def test_put_dir_of_a_hostile_tree_stores_only_what_extraction_accepts(make_store, tmp_path):
    """An agent's workspace: a 1100-level tree (the recursive walk overflowed), long names, a link up."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "report.md").write_text("score: 1")
    fd = os.open(ws, os.O_RDONLY)
    try:
        for _ in range(1100):
            os.mkdir("d", dir_fd=fd)
            child = os.open("d", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = child
        with open(os.open("bottom.txt", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd), "w") as f:
            f.write("deep")
    finally:
        os.close(fd)
    (ws / ("n" * 200)).mkdir()
    (ws / ("n" * 200) / ("m" * 200)).mkdir()
    (ws / ("n" * 200) / ("m" * 200) / ("o" * 200)).mkdir()
    (ws / ("n" * 200) / ("m" * 200) / ("o" * 200) / ("p" * 250)).mkdir()
    (ws / ("n" * 200) / ("m" * 200) / ("o" * 200) / ("p" * 250) / ("q" * 250)).write_text("x")
    (ws / "up").symlink_to("../..")
    store = make_store("file")
    try:
        store.put_dir("ws.tar.gz", ws)
    finally:
        remove_deep_chain(ws, "d")  # shutil.rmtree (and pytest's cleanup) recurse: 1100 levels overflow
    out = store.get_dir("ws.tar.gz", tmp_path / "out")
    kept = sorted(p.relative_to(out).as_posix() for p in out.rglob("*"))
    assert "report.md" in kept and "up" not in kept
    assert max(len(k.split("/")) for k in kept) == 64 and not any(k.endswith("bottom.txt") for k in kept)
    assert max(len(k.encode()) for k in kept) <= 1024


@pytest.mark.parametrize("seekable", [True, False], ids=["seekable", "stream"])
def test_a_large_incompressible_member_is_not_mistaken_for_a_bomb(tmp_path, seekable):
    data = os.urandom(3 * MiB)
    archive = targz(member("small.txt", data=b"x"), member("weights.bin", data=data))
    limits = ArchiveLimits(ratio_floor=MiB, max_ratio=5)  # random bytes expand ~1x: far below 5
    out = extract_dir_archive(CountingReader(archive, seekable=seekable), tmp_path / "out", limits)
    assert (out / "weights.bin").read_bytes() == data
