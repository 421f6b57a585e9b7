"""The inotify shortcut of the shrink check: a quiet file costs no stat, a written one is looked at again."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from dlpack.backends._watch import FileWatch

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inotify is Linux's")


def test_a_written_or_truncated_file_is_told_and_a_quiet_one_is_not(tmp_path: Path) -> None:
    quiet, cut = tmp_path / "quiet", tmp_path / "cut"
    quiet.write_bytes(b"q" * 4096)
    cut.write_bytes(b"c" * 4096)
    watch = FileWatch()
    q, c = watch.watch(str(quiet)), watch.watch(str(cut))
    assert q is not None and c is not None and q[0] == os.getpid()
    assert watch.changed(q[0]) == set()
    quiet.read_bytes()  # reading is no change
    os.truncate(cut, 100)
    changed = watch.changed(q[0])
    assert changed == {c[1]}
    assert watch.changed(q[0]) == {c[1]}  # told once, kept: the file is looked at from then on


def test_another_processes_watches_are_never_told_unchanged(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_bytes(b"x")
    watch = FileWatch()
    token = watch.watch(str(f))
    assert token is not None
    assert watch.changed(token[0] + 1) is None  # as a fork sees its parent's watches: every file is looked at


def test_the_last_reference_removes_the_watch(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_bytes(b"x")
    watch = FileWatch()
    a, b = watch.watch(str(f)), watch.watch(str(f))
    assert a is not None and b is not None and a == b  # one inode, one watch
    watch.unwatch(a)
    f.write_bytes(b"y")
    assert watch.changed(a[0]) == {a[1]}  # still watched by b
    watch.unwatch(b)
    assert watch.changed(a[0]) == set()


def test_a_store_read_with_watched_shards_still_refuses_a_shrunk_one(tmp_path: Path, make_tree: object) -> None:
    import dlpack

    src = make_tree({f"{'ab'[k % 2]}/{k}.png": ("rgb", 32, 32) for k in range(12)})  # type: ignore[operator]
    out = tmp_path / "s.zarr"
    dlpack.build(src, out, size=(32, 32), shard_bytes=2**16, quiet=True)
    ds = dlpack.open(out)
    ds.get_batch(list(range(len(ds))))
    arr = ds._reader._stored("images")  # the images' sharded array
    assert arr._watches and len(arr._watches) == len(arr._mapped)
    assert arr.unchanged()
    shard = sorted((out / "images" / "c").rglob("0/0/0"))[-1]
    size = shard.stat().st_size
    with open(shard, "r+b") as fh:  # the same size: no SIGBUS risk, but a write all the same
        fh.write(fh.read(1))
    assert not arr.unchanged()
    assert shard.stat().st_size == size
    ds.get_batch(list(range(len(ds))))  # looked at by stat now, and still whole
    ds.close()
