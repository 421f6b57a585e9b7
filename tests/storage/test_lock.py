"""The build lock: one build per output path, held by the kernel, and recovery from a killed build."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import dlpack
from dlpack.errors import StoreError, StoreExistsError, StoreLockedError
from dlpack.storage.lock import BuildLock, lock_path, old_path, partial_path

MakeTree = Callable[..., Path]

# Takes the lock on argv[1], says so on stdout, then holds it until killed.
HOLDER = """
import sys
from dlpack.storage.lock import BuildLock
lock = BuildLock(sys.argv[1])
lock.acquire()
print("locked", flush=True)
sys.stdin.read()
"""


@pytest.fixture
def holder() -> Iterator[Callable[[Path], subprocess.Popen[str]]]:
    """``holder(out)``: a child process that holds the build lock of ``out``; returns once it does."""
    procs: list[subprocess.Popen[str]] = []

    def start(out: Path) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(out)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        procs.append(proc)
        assert proc.stdout is not None
        line = proc.stdout.readline()  # blocks until the child holds the lock (or dies)
        assert line == "locked\n", f"the lock holder failed to start (rc {proc.wait()})"
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def stale_partial(make_tree: MakeTree, out: Path) -> Path:
    """A dlpack store moved to ``out``'s partial name: what a build killed before publishing leaves."""
    donor = out.parent / "donor" / out.name
    dlpack.build(make_tree({"d/0.png": "gray"}, "donor-src"), donor, quiet=True, jobs=1)
    partial = partial_path(out)
    os.replace(donor, partial)
    shutil.rmtree(out.parent / "donor")
    shutil.rmtree(out.parent / "donor-src")
    return partial


def siblings(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in tmp_path.iterdir() if p.name != "src")


@pytest.mark.slow
def test_second_build_refuses_while_another_process_holds_the_lock(
    make_tree: MakeTree, tmp_path: Path, backend: str, holder: Any
) -> None:
    out = tmp_path / backend
    partial = stale_partial(make_tree, out)
    src = make_tree({"a/0.png": "rgb", "a/1.png": "rgb"})
    proc = holder(out)
    recorded = json.loads(lock_path(out).read_text(encoding="utf-8"))
    assert (recorded["pid"], recorded["host"]) == (proc.pid, socket.gethostname())

    with pytest.raises(StoreLockedError) as info:
        dlpack.build(src, out, quiet=True, jobs=1)
    message = str(info.value)
    assert f"pid {proc.pid} on host {socket.gethostname()} since {recorded['since']}" in message
    assert str(lock_path(out)) in message
    assert isinstance(info.value, StoreError)
    # The holder's partial is left alone while it lives.
    assert partial.exists() and not out.exists()

    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    # The kernel released the lock with the process: the next build takes it, removes the stale
    # partial and publishes.
    result = dlpack.build(src, out, quiet=True, jobs=1)
    assert result.count == 2
    with dlpack.open(out) as ds:
        assert [ds[i]["source"] for i in range(len(ds))] == ["a/0.png", "a/1.png"]
    assert siblings(tmp_path) == [backend]


def test_lock_conflicts_within_one_process_and_is_removed_on_release(tmp_path: Path) -> None:
    out = tmp_path / "o.zarr"
    with BuildLock(out) as lock:
        assert lock.held and lock.path.exists()
        with pytest.raises(StoreLockedError, match=f"pid {os.getpid()} "):
            BuildLock(out).acquire()
    assert not lock.held and not lock.path.exists()
    with BuildLock(out):  # free again
        pass


@pytest.mark.slow
def test_lock_retries_when_the_file_was_replaced_before_it_was_locked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dlpack.storage.lock as lock_module

    out = tmp_path / "o.zarr"
    real_try_lock = lock_module._try_lock
    calls: list[int] = []

    def releasing_holder(fd: int) -> bool:
        # As if the previous holder removed the file between this process's open and its lock.
        if not calls:
            lock_path(out).unlink()
        calls.append(fd)
        return real_try_lock(fd)

    monkeypatch.setattr(lock_module, "_try_lock", releasing_holder)
    lock = BuildLock(out)
    lock.acquire()
    try:
        assert len(calls) == 2
        monkeypatch.setattr(lock_module, "_try_lock", real_try_lock)
        with pytest.raises(StoreLockedError):  # the lock is on the file now at the path
            BuildLock(out).acquire()
    finally:
        lock.release()


@pytest.mark.parametrize("kind", ["folder", "zarr-group", "file", "hdf5"])
def test_foreign_partial_is_refused_and_left_untouched(make_tree: MakeTree, tmp_path: Path, kind: str) -> None:
    src = make_tree({"a/0.png": "rgb"})
    out = tmp_path / ("o.h5" if kind in ("file", "hdf5") else "o.zarr")
    partial = partial_path(out)
    if kind == "folder":
        partial.mkdir()
        (partial / "notes.txt").write_text("mine")
    elif kind == "zarr-group":
        partial.mkdir()
        (partial / "zarr.json").write_text('{"zarr_format": 3, "node_type": "group", "attributes": {}}')
        (partial / "x").mkdir()
        (partial / "x" / "zarr.json").write_text('{"zarr_format": 3, "node_type": "array"}')
    elif kind == "file":
        partial.write_bytes(b"not a store")
    else:
        import h5py

        with h5py.File(partial, "w") as f:
            f["x"] = [1, 2, 3]
    before = {p.relative_to(tmp_path): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    with pytest.raises(StoreError, match="not a dlpack partial store") as info:
        dlpack.build(src, out, quiet=True, jobs=1)
    assert str(partial) in str(info.value)
    after = {p.relative_to(tmp_path): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert after == before


@pytest.mark.parametrize("zarr_json", [None, "", '{"zarr_format": 3, "node_type": "group", "attributes": {}}'])
def test_partial_killed_while_creating_its_group_is_removed(
    make_tree: MakeTree, tmp_path: Path, zarr_json: str | None
) -> None:
    partial = partial_path(tmp_path / "o.zarr")
    partial.mkdir()
    if zarr_json is not None:
        (partial / "zarr.json").write_text(zarr_json)
    dlpack.build(make_tree({"a/0.png": "rgb"}), tmp_path / "o.zarr", quiet=True, jobs=1)
    assert siblings(tmp_path) == ["o.zarr"]


# Creates an HDF5 file with the dlpack marker and dies before HDF5 writes any metadata.
KILLED_HDF5 = """
import os, sys
import h5py
f = h5py.File(sys.argv[1], "w-")
f.attrs["dlpack_format"] = "dlpack"
f.create_dataset("images", shape=(4, 8, 8, 3), dtype="u1")
os._exit(0)
"""


@pytest.mark.slow
@pytest.mark.parametrize("content", ["never-flushed", "empty"])
def test_hdf5_partial_killed_before_its_metadata_is_removed(make_tree: MakeTree, tmp_path: Path, content: str) -> None:
    import h5py

    partial = partial_path(tmp_path / "o.h5")
    if content == "empty":
        partial.write_bytes(b"")
    else:
        subprocess.run([sys.executable, "-c", KILLED_HDF5, str(partial)], check=True)
        with pytest.raises(OSError, match=r"open file \(truncated file"):  # nothing in it can be read
            h5py.File(partial, "r")
    dlpack.build(make_tree({"a/0.png": "rgb"}), tmp_path / "o.h5", quiet=True, jobs=1)
    assert siblings(tmp_path) == ["o.h5"]


@pytest.mark.parametrize("name", ["run [1].zarr", "set[a]*.h5"])
def test_stale_partial_is_found_whatever_the_store_name(make_tree: MakeTree, tmp_path: Path, name: str) -> None:
    stale_partial(make_tree, tmp_path / name)
    dlpack.build(make_tree({"a/0.png": "rgb"}), tmp_path / name, quiet=True, jobs=1)
    assert siblings(tmp_path) == [name]


@pytest.mark.parametrize("overwrite", [False, True])
def test_store_overwritten_by_a_killed_build_comes_back(
    make_tree: MakeTree, tmp_path: Path, backend: str, snapshot: Any, overwrite: bool
) -> None:
    out = tmp_path / backend
    dlpack.build(make_tree({"a/0.png": "rgb"}), out, quiet=True, jobs=1)
    before = snapshot(out)
    os.replace(out, old_path(out))  # killed between the two renames of publishing
    new = make_tree({"b/0.png": "gray", "b/1.png": "gray"}, "other")
    if overwrite:
        dlpack.build(new, out, overwrite=True, quiet=True, jobs=1)
        assert len(dlpack.open(out)) == 2
    else:
        with pytest.raises(StoreExistsError):
            dlpack.build(new, out, quiet=True, jobs=1)
        assert snapshot(out) == before
    assert siblings(tmp_path) == sorted([backend, "other"])


@pytest.mark.parametrize("link", ["symlink", "hardlink", "dangling"])
@pytest.mark.parametrize("where", ["lock", "journal", "partial"])
def test_a_link_at_a_build_path_is_refused_and_its_target_untouched(
    make_tree: MakeTree, tmp_path: Path, link: str, where: str
) -> None:
    from dlpack.storage.lock import journal_path

    src = make_tree({"a/0.png": "rgb"})
    out = tmp_path / "o.zarr"
    at = {"lock": lock_path, "journal": journal_path, "partial": partial_path}[where](out)
    victim = tmp_path / "victim.txt"
    if link != "dangling":
        victim.write_text("precious\n")
    if link == "hardlink":
        os.link(victim, at)
    else:
        at.symlink_to(victim)
    with pytest.raises(StoreError, match="symbolic link|hard links") as info:
        dlpack.build(src, out, quiet=True, jobs=1)
    assert str(at) in str(info.value)
    if link == "dangling":
        assert not victim.exists() and at.is_symlink()
    else:
        assert victim.read_text() == "precious\n"
        assert at.is_symlink() or os.path.samefile(at, victim)
    assert not out.exists()


def test_a_stale_lock_file_of_someone_else_is_refused_and_left_untouched(make_tree: MakeTree, tmp_path: Path) -> None:
    out = tmp_path / "o.zarr"
    lock_path(out).write_text("my notes\n")
    with pytest.raises(StoreError, match="not a dlpack lock file"):
        dlpack.build(make_tree({"a/0.png": "rgb"}), out, quiet=True, jobs=1)
    assert lock_path(out).read_text() == "my notes\n"


@pytest.mark.parametrize("stale", ["", '{"command": "dlpack build", "host": "h", "pid": 1, "since": "x"}'])
def test_a_stale_dlpack_lock_file_is_taken_over(make_tree: MakeTree, tmp_path: Path, stale: str) -> None:
    out = tmp_path / "o.zarr"
    lock_path(out).write_text(stale)
    dlpack.build(make_tree({"a/0.png": "rgb"}), out, quiet=True, jobs=1)
    assert siblings(tmp_path) == ["o.zarr"]


def test_a_lock_that_cannot_be_written_leaves_no_lock_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    def full(fd: int, data: bytes) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    out = tmp_path / "o.zarr"
    monkeypatch.setattr(os, "write", full)  # the disk fills between creating the file and writing it
    try:
        with pytest.raises(StoreError, match="disk is full") as info:
            BuildLock(out).acquire()
    finally:
        monkeypatch.undo()
    assert str(lock_path(out)) in str(info.value)
    assert not lock_path(out).exists()


@pytest.mark.parametrize("code", [errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP])
def test_a_file_system_that_takes_no_locks_is_refused_and_leaves_no_lock_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    # flock's answer on an NFS mount whose lock service is not reachable (ENOLCK), or on Lustre
    # mounted without -o flock (ENOSYS): no build starts without a lock.
    fcntl = pytest.importorskip("fcntl")

    def refused(fd: int, op: int) -> None:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(fcntl, "flock", refused)
    out = tmp_path / "out.zarr"
    with pytest.raises(StoreError, match="does not take file locks") as info:
        BuildLock(out).acquire()
    assert str(lock_path(out)) in str(info.value) and os.strerror(code) in str(info.value)
    assert not lock_path(out).exists()
