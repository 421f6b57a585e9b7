"""Resume: a build killed at any point continues from its journalled blocks and ends byte-identical.

A real ``dlpack build`` process is killed with SIGKILL (its whole process group, workers included)
at a known point: a small wrapper pauses the build right after it journals its K-th block, or
just before it writes the manifest, and the test waits for that journal line, never for a time.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import interrupt_build

import dlpack

MakeTree = Callable[..., Path]

#: Runs ``python -m dlpack ...`` with the build paused for good at one point, for the test to kill it there.
PAUSED = r"""
import importlib, runpy, sys, threading
b = importlib.import_module("dlpack.storage.journal")
from dlpack.backends.writer import StoreWriter
where, k = sys.argv[1], int(sys.argv[2])
del sys.argv[1:3]
def hang(*args, **kwargs):
    threading.Event().wait()
if where == "blocks":
    append = b.Journal.append_block
    def paused(self, *args, **kwargs):
        append(self, *args, **kwargs)
        if self.blocks >= k:
            hang()
    b.Journal.append_block = paused
else:
    StoreWriter.commit = hang
runpy.run_module("dlpack", run_name="__main__", alter_sys=True)
"""

#: 90 noise PNGs of 40x30x3 (3600 bytes stored) in 64 KiB shards: 18 images a block, 5 blocks.
N_IMAGES, PER_BLOCK, N_BLOCKS = 90, 18, 5
SHARD = ["--shard-bytes", "65536"]


def tree(make_tree: MakeTree) -> Path:
    return make_tree({f"c{k % 3}/{k:03d}.png": "rgb" for k in range(N_IMAGES)})


def journal_of(out: Path) -> Path:
    return out.parent / f".{out.name}.dlpack-journal"


def partial_of(out: Path) -> Path:
    return out.parent / f".{out.name}.dlpack-partial"


def journal_lines(out: Path) -> list[dict[str, Any]]:
    """The complete lines of ``out``'s journal (a torn last line is left out)."""
    try:
        text = journal_of(out).read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\n")]


def blocks_of(lines: list[dict[str, Any]]) -> list[int]:
    return [line["start"] for line in lines if "start" in line]


def cli(args: list[str]) -> list[str]:
    return [sys.executable, "-m", "dlpack", *args]


def kill_when(args: list[str], out: Path, where: str, k: int, ready: Callable[[list[dict[str, Any]]], bool]) -> None:
    """Run ``dlpack ARGS`` paused at ``where``/``k``, wait until its journal is ``ready``, SIGKILL its process group."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(dlpack.__file__).parents[1]), *sys.path])}
    proc = subprocess.Popen(
        [sys.executable, "-c", PAUSED, where, str(k), *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
        env=env,
    )
    try:
        deadline = time.monotonic() + 120
        while not ready(journal_lines(out)):
            if proc.poll() is not None:
                pytest.fail(f"the build ended (rc {proc.returncode}) before the kill: {proc.stderr.read()!r}")  # type: ignore[union-attr]
            if time.monotonic() > deadline:
                pytest.fail("the build did not reach the kill point within 120 s")
            time.sleep(0.005)
    finally:
        with contextlib.suppress(ProcessLookupError):  # ended on its own: the test has failed already
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stderr.close()  # type: ignore[union-attr]
        _wait_group_gone(proc.pid)
    assert proc.returncode == -signal.SIGKILL


def _wait_group_gone(pgid: int) -> None:
    """Wait until every process of the killed group (worker processes too) has gone."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        except PermissionError:  # pragma: no cover - a zombie of another parent
            return
        time.sleep(0.01)
    pytest.fail("the killed build's processes did not end")


def rerun(args: list[str]) -> dict[str, Any]:
    """Run ``dlpack ARGS --json`` to its end; its JSON result (exit 0 asserted)."""
    done = subprocess.run(cli([*args, "--json"]), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def shard_stats(out: Path, starts: list[int]) -> dict[int, tuple[int, int]]:
    """(inode, mtime_ns) of the Zarr shard files that hold the blocks starting at ``starts``."""
    found = {}
    for s in starts:
        st = os.stat(out / "images" / "c" / str(s // PER_BLOCK) / "0" / "0" / "0")
        found[s] = (st.st_ino, st.st_mtime_ns)
    return found


def leftovers(out: Path) -> list[str]:
    return sorted(p.name for p in out.parent.glob(f".{out.name}.dlpack-*"))


@pytest.mark.slow
@pytest.mark.parametrize("jobs", [1, 2])
def test_killed_build_resumes_from_its_blocks_and_ends_byte_identical(
    make_tree: MakeTree, tmp_path: Path, backend: str, snapshot: Any, jobs: int
) -> None:
    src = tree(make_tree)
    ref = tmp_path / "ref" / backend
    dlpack.build(src, ref, shard_bytes=2**16, jobs=1, quiet=True)
    out = tmp_path / backend
    args = ["build", str(src), str(out), "--jobs", str(jobs), *SHARD]
    kill_when(args, out, "blocks", 2, lambda lines: len(blocks_of(lines)) >= 2)
    done = blocks_of(journal_lines(out))
    assert len(done) >= 2 and partial_of(out).exists()
    before = shard_stats(partial_of(out), done) if backend.endswith(".zarr") else {}
    # A journalled block is trusted when its file's size and mtime did not change: damage the
    # pixels of one of them behind that (same size, same mtime). Decoding it again would fail.
    victim = src / "c0" / "000.png"
    st = victim.stat()
    data = bytearray(victim.read_bytes())
    at = data.find(b"IDAT") + 8
    data[at : at + 64] = bytes(b ^ 0x5A for b in data[at : at + 64])
    victim.write_bytes(bytes(data))
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))
    result = rerun(args)
    assert result["resume"] == f"resumed: {len(done)} of {N_BLOCKS} blocks already written"
    if before:
        assert shard_stats(out, done) == before  # the same files, never rewritten
    assert sorted(snapshot(out)) == sorted(snapshot(ref))  # the same file names
    assert snapshot(out) == snapshot(ref)
    assert leftovers(out) == []


@pytest.mark.slow
def test_temp_files_of_killed_writes_are_removed_at_resume(make_tree: MakeTree, tmp_path: Path, snapshot: Any) -> None:
    src = tree(make_tree)
    out = tmp_path / "out.zarr"
    args = ["build", str(src), str(out), "--jobs", "1", *SHARD]
    kill_when(args, out, "blocks", 2, lambda lines: len(blocks_of(lines)) >= 2)
    partial = partial_of(out)
    # What writes killed before their rename leave: a shard being written (beside a written shard
    # and in a folder of its own), an array's metadata being rewritten, by dlpack or zarr-python.
    temps = [
        partial / "images" / "c" / "0" / "0" / "0" / ".0.4242.tmp",
        partial / "images" / "c" / "4" / "0" / "0" / ".0.4243.tmp",
        partial / "images" / "zarr.json.tmp",
        partial / "images" / "zarr.0123456789abcdef0123456789abcdef.partial",  # zarr-python's own
    ]
    for temp in temps:
        temp.parent.mkdir(parents=True, exist_ok=True)
        temp.write_bytes(b"\0" * 100)
    rerun(args)
    ref = tmp_path / "ref.zarr"
    dlpack.build(src, ref, shard_bytes=2**16, jobs=1, quiet=True)
    assert sorted(snapshot(out)) == sorted(snapshot(ref))
    assert snapshot(out) == snapshot(ref)


@pytest.mark.parametrize(
    ("name", "temp"),
    [(".0.123.tmp", True), (".17.4.tmp", True), ("0", False), (".0.tmp", False), ("x.0.1.tmp", False),
     (".0.12.tmpx", False), (".a.1.tmp", False), ("zarr.json.tmp", False)],
)  # fmt: skip
def test_shard_temp_names_are_recognised_exactly(name: str, temp: bool) -> None:
    from dlpack.backends._zarr import is_shard_temp_name

    assert is_shard_temp_name(name) is temp


@pytest.mark.slow
def test_block_whose_file_changed_is_written_again(make_tree: MakeTree, tmp_path: Path, snapshot: Any) -> None:
    src = tree(make_tree)
    out = tmp_path / "out.zarr"
    args = ["build", str(src), str(out), "--jobs", "1", *SHARD]
    kill_when(args, out, "blocks", 2, lambda lines: len(blocks_of(lines)) >= 2)
    done = blocks_of(journal_lines(out))
    victim = src / "c0" / "000.png"  # in block 0
    os.utime(victim, ns=(victim.stat().st_atime_ns, victim.stat().st_mtime_ns + 10**9))
    before = shard_stats(partial_of(out), done)
    result = rerun(args)
    assert result["resume"] == f"resumed: {len(done) - 1} of {N_BLOCKS} blocks already written"
    after = shard_stats(out, done)
    assert after[0] != before[0]
    assert {s: after[s] for s in done[1:]} == {s: before[s] for s in done[1:]}
    ref = tmp_path / "ref.zarr"
    dlpack.build(src, ref, shard_bytes=2**16, jobs=1, quiet=True)
    assert snapshot(out) == snapshot(ref)


@pytest.mark.slow
def test_build_killed_while_committing_ends_byte_identical(
    make_tree: MakeTree, tmp_path: Path, backend: str, snapshot: Any
) -> None:
    src = tree(make_tree)
    out = tmp_path / backend
    args = ["build", str(src), str(out), "--jobs", "1", *SHARD]
    kill_when(args, out, "commit", 0, lambda lines: any(line.get("commit") for line in lines))
    result = rerun(args)
    if backend.endswith(".zarr"):  # the metadata arrays are written again beside the kept shards
        assert result["resume"] == f"resumed: {N_BLOCKS} of {N_BLOCKS} blocks already written"
    else:  # HDF5 was killed while its library wrote the file: nothing in it is trusted
        assert result["resume"].startswith("started over: ")
    ref = tmp_path / "ref" / backend
    dlpack.build(src, ref, shard_bytes=2**16, jobs=1, quiet=True)
    assert snapshot(out) == snapshot(ref)
    assert leftovers(out) == []


@pytest.mark.slow
@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (["--size", "20x15"], r"started over: the plan changed \(image, shard_images, target\)"),
        (["--no-resume"], r"started over: --no-resume"),
    ],
    ids=["size", "no-resume"],
)
def test_changed_plan_or_no_resume_starts_over(
    make_tree: MakeTree, tmp_path: Path, backend: str, snapshot: Any, change: list[str], reason: str
) -> None:
    src = tree(make_tree)
    out = tmp_path / backend
    args = ["build", str(src), str(out), "--jobs", "1", *SHARD]
    kill_when(args, out, "blocks", 2, lambda lines: len(blocks_of(lines)) >= 2)
    before = shard_stats(partial_of(out), [0]) if backend.endswith(".zarr") else {}
    result = rerun([*args, *change])
    assert re.fullmatch(reason, result["resume"])
    if before:
        assert shard_stats(out, [0]) != before
    ref = tmp_path / "ref" / backend
    extra = {"size": (20, 15)} if "--size" in change else {}
    dlpack.build(src, ref, shard_bytes=2**16, jobs=1, quiet=True, **extra)
    assert snapshot(out) == snapshot(ref)
    assert leftovers(out) == []


def test_interrupted_build_keeps_its_partial_and_resumes(
    make_tree: MakeTree, tmp_path: Path, backend: str, snapshot: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tree(make_tree)
    out = tmp_path / backend
    interrupt_build(monkeypatch, 3, lambda: dlpack.build(src, out, shard_bytes=2**16, jobs=1, quiet=True))
    assert partial_of(out).exists() and len(blocks_of(journal_lines(out))) == 3
    with open(journal_of(out), "a", encoding="utf-8") as f:
        f.write('{"start": 54, "samp')  # a line torn by a kill is ignored
    result = dlpack.build(src, out, shard_bytes=2**16, jobs=1, quiet=True)
    assert result.resume == f"resumed: 3 of {N_BLOCKS} blocks already written"
    assert "resumed: 3 of 5" in result.summary()
    ref = tmp_path / "ref" / backend
    dlpack.build(src, ref, shard_bytes=2**16, jobs=1, quiet=True)
    assert snapshot(out) == snapshot(ref)
    assert leftovers(out) == []


def test_failed_build_removes_its_partial(make_tree: MakeTree, tmp_path: Path, backend: str, images: Any) -> None:
    spec: dict[str, Any] = {f"c0/{k:03d}.png": "rgb" for k in range(40)}
    # Damaged compressed data behind an intact header: found while packing, after blocks were journalled.
    data = bytearray(images.encode(".png", images.pixels("rgb", 40, 30, seed=7)))
    at = data.find(b"IDAT") + 6
    data[at : at + 20] = bytes(b ^ 0x55 for b in data[at : at + 20])
    spec["c0/039.png"] = bytes(data)
    out = tmp_path / backend
    with pytest.raises(dlpack.BadInputsError):
        dlpack.build(make_tree(spec), out, shard_bytes=2**16, jobs=1, quiet=True)
    assert leftovers(out) == []


def test_journal_that_is_not_dlpacks_is_refused_and_kept(make_tree: MakeTree, tmp_path: Path) -> None:
    out = tmp_path / "out.zarr"
    journal_of(out).write_text("someone's notes\n", encoding="utf-8")
    with pytest.raises(dlpack.StoreError, match="not a dlpack journal"):
        dlpack.build(make_tree({"a/0.png": "rgb"}), out, jobs=1, quiet=True)
    assert journal_of(out).read_text(encoding="utf-8") == "someone's notes\n"


@pytest.mark.slow
def test_sigterm_to_the_process_group_prints_no_resource_tracker_warnings(make_tree: MakeTree, tmp_path: Path) -> None:
    src = tree(make_tree)
    out = tmp_path / "out.zarr"
    args = ["build", str(src), str(out), "--jobs", "2", *SHARD]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(dlpack.__file__).parents[1]), *sys.path])}
    proc = subprocess.Popen(
        [sys.executable, "-c", PAUSED, "blocks", "2", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env=env,
    )
    try:
        deadline = time.monotonic() + 120
        while len(blocks_of(journal_lines(out))) < 2:  # the worker pool is running
            assert proc.poll() is None and time.monotonic() < deadline, "the build did not reach its second block"
            time.sleep(0.005)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        # Read to the end: the pool's resource tracker holds stderr until it has cleaned up.
        err = proc.communicate(timeout=60)[1]
        _wait_group_gone(proc.pid)
    assert proc.returncode == -signal.SIGTERM
    assert "resource_tracker" not in err and "leaked" not in err, err
    assert rerun(args)["resume"].startswith("resumed: ")
