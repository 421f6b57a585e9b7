"""build --update: new files appended, changed ones replaced in place, deleted ones refused or compacted,
class ids kept, only the blocks that change written (Zarr shares the others' shard files)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import dlpack
from dlpack import OptionError
from dlpack.cli import main

MakeTree = Callable[..., Path]

#: 40 noise PNGs of 40x30x3 in 64 KiB shards: blocks of 18, 18 and 4 images.
PER_BLOCK = 18


def tree(make_tree: MakeTree) -> Path:
    return make_tree({f"c{k % 2}/{k:03d}.png": "rgb" for k in range(40)})


def shard(out: Path, s: int) -> Path:
    return out / "images" / "c" / str(s) / "0" / "0" / "0"


def by_source(path: Path) -> dict[str, tuple[bytes, str | None]]:
    """Each sample's stored pixels and class name, by source path."""
    with dlpack.open(path) as ds:
        return {
            ds.reader.source(i): (ds[i]["image"].tobytes(), ds.classes[ds[i]["label"]] if ds.classes else None)
            for i in range(len(ds))
        }


def fresh(src: Path, tmp_path: Path, backend: str) -> dict[str, tuple[bytes, str | None]]:
    ref = tmp_path / "fresh" / backend
    dlpack.build(src, ref, shard_bytes=2**16, jobs=1, quiet=True)
    return by_source(ref)


def test_update_appends_replaces_and_shares_unchanged_shards(make_tree: MakeTree, tmp_path: Path, images: Any) -> None:
    src = tree(make_tree)
    out = tmp_path / "out.zarr"
    dlpack.build(src, out, shard_bytes=2**16, jobs=1, quiet=True)
    with dlpack.open(out) as ds:
        order = [ds.reader.source(i) for i in range(len(ds))]
        classes = ds.classes
    inode0 = os.stat(shard(out, 0)).st_ino
    # Block 1 changes (one file replaced), block 2 grows (new files), block 0 only gets touched.
    (src / "c1" / "021.png").write_bytes(images.encode(".png", images.pixels("rgb", 40, 30, seed=99)))
    os.utime(src / "c0" / "000.png", ns=(0, 10**18))
    (src / "b_new").mkdir()
    (src / "b_new" / "x.png").write_bytes(images.encode(".png", images.pixels("rgb", 40, 30, seed=5)))
    (src / "c0" / "zz.png").write_bytes(images.encode(".png", images.pixels("rgb", 40, 30, seed=6)))
    result = dlpack.build(src, out, update=True, jobs=1, quiet=True)
    assert result.update == "updated: 2 added, 1 replaced, 0 removed; 2 of 3 blocks written"
    with dlpack.open(out) as ds:
        got = [ds.reader.source(i) for i in range(len(ds))]
        assert got == [*order, "b_new/x.png", "c0/zz.png"]  # old indices kept, new files appended
        assert ds.classes == (*classes, "b_new")  # old class ids kept, the new class appended
        assert ds.manifest.history[-1]["added"] == 2 and ds.manifest.history[-1]["replaced"] == 1
    assert os.stat(shard(out, 0)).st_ino == inode0  # the unchanged shard file is the same file
    assert by_source(out) == fresh(src, tmp_path, "out.zarr")  # every sample as a fresh build stores it
    with dlpack.open(out) as ds:
        assert ds.verify() == []


def test_update_of_hdf5_rewrites_the_file_with_the_same_rule(make_tree: MakeTree, tmp_path: Path, images: Any) -> None:
    src = tree(make_tree)
    out = tmp_path / "out.h5"
    dlpack.build(src, out, shard_bytes=2**16, jobs=1, quiet=True)
    inode0 = os.stat(out).st_ino
    (src / "c1" / "021.png").write_bytes(images.encode(".png", images.pixels("rgb", 40, 30, seed=99)))
    (src / "c0" / "zz.png").write_bytes(images.encode(".png", images.pixels("rgb", 40, 30, seed=6)))
    result = dlpack.build(src, out, update=True, jobs=1, quiet=True)
    assert result.update.startswith("updated: 1 added, 1 replaced, 0 removed; ")
    assert os.stat(out).st_ino != inode0  # a new file, published whole
    with dlpack.open(out) as ds:
        assert ds.reader.source(len(ds) - 1) == "c0/zz.png"
    assert by_source(out) == fresh(src, tmp_path, "out.h5")


def test_unchanged_source_publishes_nothing(make_tree: MakeTree, tmp_path: Path, snapshot: Any) -> None:
    src = tree(make_tree)
    out = tmp_path / "out.zarr"
    dlpack.build(src, out, shard_bytes=2**16, jobs=1, quiet=True)
    before = snapshot(out)
    ds = dlpack.open(out)  # a reader opened before the update stays valid: nothing was published
    result = dlpack.build(src, out, update=True, jobs=1, quiet=True)
    assert result.update == "up to date: nothing to do"
    assert result.classes == ("c0", "c1") and result.count == 40
    assert snapshot(out) == before
    assert not list(tmp_path.glob(".out.zarr.dlpack-*[!k]"))  # no partial, no journal (the lock may stay)
    with ds:
        assert ds.manifest.history == () and ds[39]["index"] == 39


def test_touched_files_write_no_block(make_tree: MakeTree, tmp_path: Path, snapshot: Any) -> None:
    src = tree(make_tree)
    out = tmp_path / "out.zarr"
    dlpack.build(src, out, shard_bytes=2**16, jobs=1, quiet=True)
    before = snapshot(out)
    os.utime(src / "c0" / "000.png", ns=(0, 10**18))
    result = dlpack.build(src, out, update=True, jobs=1, quiet=True)
    assert result.update == "updated: 0 added, 0 replaced, 0 removed; 0 of 3 blocks written"
    after = snapshot(out)
    # The new size and mtime are recorded (source_stat), so the next update does not hash the file again.
    meta = ("manifest.json", "zarr.json", "source_stat/zarr.json", "source_stat/c/0/0")
    assert {k: v for k, v in after.items() if k not in meta} == {k: v for k, v in before.items() if k not in meta}
    assert dlpack.build(src, out, update=True, jobs=1, quiet=True).update == "up to date: nothing to do"


def test_deleted_file_is_refused_without_compact_and_dropped_with_it(
    make_tree: MakeTree, tmp_path: Path, backend: str
) -> None:
    src = tree(make_tree)
    out = tmp_path / backend
    dlpack.build(src, out, shard_bytes=2**16, jobs=1, quiet=True)
    (src / "c1" / "005.png").unlink()
    with pytest.raises(OptionError, match=r"1 packed file\(s\) are gone .*c1/005.png.*--compact"):
        dlpack.build(src, out, update=True, jobs=1, quiet=True)
    assert len(dlpack.open(out)) == 40  # untouched
    result = dlpack.build(src, out, update=True, compact=True, jobs=1, quiet=True)
    assert result.update.startswith("updated: 0 added, 0 replaced, 1 removed; ")
    with dlpack.open(out) as ds:
        # c1/005.png was sample 22 (20 files in c0 first): the samples after it moved down by one.
        assert len(ds) == 39 and [ds.reader.source(i) for i in (21, 22)] == ["c1/003.png", "c1/007.png"]
    assert by_source(out) == fresh(src, tmp_path, backend)


def test_update_refuses_a_changed_plan_and_a_missing_store(make_tree: MakeTree, tmp_path: Path) -> None:
    src = tree(make_tree)
    out = tmp_path / "out.zarr"
    with pytest.raises(dlpack.StoreNotFoundError, match="build it first"):
        dlpack.build(src, out, update=True, jobs=1, quiet=True)
    dlpack.build(src, out, jobs=1, quiet=True)
    with pytest.raises(OptionError, match="differs in size"):
        dlpack.build(src, out, update=True, size=(20, 15), jobs=1, quiet=True)


def test_update_flags_from_the_cli(make_tree: MakeTree, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tree(make_tree)
    out = tmp_path / "out.zarr"
    assert main(["build", str(src), str(out), "--quiet", "--jobs", "1"]) == 0
    (src / "c1" / "005.png").unlink()
    assert main(["build", str(src), str(out), "--update", "--jobs", "1"]) == 2
    assert "--compact" in capsys.readouterr().err
    assert main(["build", str(src), str(out), "--update", "--compact", "--jobs", "1"]) == 0
    assert "1 removed" in capsys.readouterr().out
    assert main(["build", str(src), str(out), "--compact"]) == 2
    assert "compact only applies to update" in capsys.readouterr().err
    assert np.asarray(len(dlpack.open(out))) == 39
