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


# ---------------------------------------------------------------- arrays added with add_array


def _add_user_arrays(out: Path) -> tuple[np.ndarray, list[np.ndarray]]:
    n = len(dlpack.open(out))
    weights = np.arange(n, dtype=np.float32) + 0.5
    boxes = [np.full((i % 3, 4), i, dtype=np.int16) for i in range(n)]
    dlpack.add_array(out, "weights", weights, key="weight", compression="zstd")
    dlpack.add_array(out, "boxes", boxes, ragged=True)
    return weights, boxes


def _user_values(out: Path) -> dict[str, tuple[float, np.ndarray]]:
    with dlpack.open(out) as ds:
        return {ds.reader.source(i): (float(ds[i]["weight"]), ds[i]["boxes"]) for i in range(len(ds))}


def test_update_carries_every_added_array(make_tree: MakeTree, tmp_path: Path, backend: str, images: Any) -> None:
    src = tree(make_tree)
    out = tmp_path / backend
    dlpack.build(src, out, shard_bytes=2**16, jobs=1, quiet=True)
    _add_user_arrays(out)
    specs = {k: v for k, v in dlpack.open(out).manifest.arrays.items() if k in ("weights", "boxes")}
    before = _user_values(out)
    os.utime(src / "c0" / "000.png", ns=(0, 10**18))  # a touch: nothing to decode
    dlpack.build(src, out, update=True, jobs=1, quiet=True)
    got = _user_values(out)
    assert got.keys() == before.keys()
    assert all(got[k][0] == before[k][0] and np.array_equal(got[k][1], before[k][1]) for k in got)
    after = dlpack.open(out).manifest.arrays
    assert {k: after[k] for k in specs} == specs  # dtype, shape, key and compression unchanged

    # An appended sample needs a value: refused, naming both arrays, until fill gives one.
    (src / "c0" / "zz.png").write_bytes(images.encode(".png", images.pixels("rgb", 40, 30, seed=6)))
    with pytest.raises(OptionError, match=r"boxes, weights .*--fill boxes=,weights=0.*--drop-array"):
        dlpack.build(src, out, update=True, jobs=1, quiet=True)
    assert _user_values(out).keys() == before.keys()  # untouched
    dlpack.build(src, out, update=True, fill="weights=-1,boxes=", jobs=1, quiet=True)
    got = _user_values(out)
    assert got["c0/zz.png"][0] == -1 and got["c0/zz.png"][1].shape == (0, 4)
    assert all(got[k][0] == before[k][0] and np.array_equal(got[k][1], before[k][1]) for k in before)

    # --compact renumbers: every row follows its sample.
    (src / "c0" / "002.png").unlink()
    dlpack.build(src, out, update=True, compact=True, jobs=1, quiet=True)
    got = _user_values(out)
    assert "c0/002.png" not in got and len(got) == 40
    assert all(got[k][0] == before[k][0] and np.array_equal(got[k][1], before[k][1]) for k in before if k in got)
    with dlpack.open(out) as ds:
        assert ds.verify() == []


def test_a_replaced_sample_needs_a_fill_too(make_tree: MakeTree, tmp_path: Path, images: Any) -> None:
    src = tree(make_tree)
    out = tmp_path / "out.h5"
    dlpack.build(src, out, shard_bytes=2**16, jobs=1, quiet=True)
    n = len(dlpack.open(out))
    dlpack.add_array(out, "weights", np.ones(n, dtype=np.int32), key="weight")
    (src / "c1" / "021.png").write_bytes(images.encode(".png", images.pixels("rgb", 40, 30, seed=99)))
    with pytest.raises(OptionError, match=r"weights .*1 replaced sample"):
        dlpack.build(src, out, update=True, jobs=1, quiet=True)
    with pytest.raises(OptionError, match=r"fill value 0.5 does not fit array 'weights' of dtype int32"):
        dlpack.build(src, out, update=True, fill="weights=0.5", jobs=1, quiet=True)
    dlpack.build(src, out, update=True, fill="weights=7", jobs=1, quiet=True)
    with dlpack.open(out) as ds:
        w = {ds.reader.source(i): int(ds[i]["weight"]) for i in range(len(ds))}
    assert w["c1/021.png"] == 7 and sum(v == 1 for v in w.values()) == n - 1


def test_an_array_is_dropped_only_on_request(make_tree: MakeTree, tmp_path: Path, images: Any) -> None:
    src = tree(make_tree)
    out = tmp_path / "out.zarr"
    dlpack.build(src, out, shard_bytes=2**16, jobs=1, quiet=True)
    _add_user_arrays(out)
    (src / "c0" / "zz.png").write_bytes(images.encode(".png", images.pixels("rgb", 40, 30, seed=6)))
    with pytest.raises(OptionError, match=r"has no array 'wieghts' added with add_array \(it has: boxes, weights\)"):
        dlpack.build(src, out, update=True, drop_array="wieghts", jobs=1, quiet=True)
    with pytest.raises(OptionError, match=r"'labels' .* built by dlpack"):
        dlpack.build(src, out, update=True, drop_array="labels", jobs=1, quiet=True)
    with pytest.raises(OptionError, match=r"array 'boxes' is ragged: its fill is no rows"):
        dlpack.build(src, out, update=True, fill="boxes=1", jobs=1, quiet=True)
    with pytest.raises(OptionError, match="fill only applies to update"):
        dlpack.build(src, out, fill="boxes=", jobs=1, quiet=True)
    result = dlpack.build(src, out, update=True, drop_array="boxes", fill="weights=0", jobs=1, quiet=True)
    assert "dropped array(s) boxes" in result.update
    arrays = dlpack.open(out).manifest.arrays
    assert "boxes" not in arrays and "weights" in arrays
    assert not (out / "boxes_data").exists()


def test_fill_and_drop_array_given_several_times_all_apply(
    make_tree: MakeTree, tmp_path: Path, images: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    src = make_tree({f"k{k % 2}/{k:02d}.png": "rgb" for k in range(6)})
    out = tmp_path / "rep.zarr"
    dlpack.build(src, out, jobs=1, quiet=True)
    n = len(dlpack.open(out))
    dlpack.add_array(out, "score", np.zeros(n, dtype=np.float32), key="score")
    dlpack.add_array(out, "points", [np.ones((2, 2), np.float32)] * n, key="points", ragged=True)
    dlpack.add_array(out, "extra", np.zeros(n, dtype=np.int8))
    (src / "k1" / "new.png").write_bytes(images.encode(".png", images.pixels("rgb", 40, 30, seed=11)))
    base = ["build", str(src), str(out), "--update", "--jobs", "1", "--quiet"]
    # The same array in two flags is refused as such, naming it.
    assert main([*base, "--fill", "score=1", "--fill", "points=,score=2", "--drop-array", "extra"]) == 2
    assert "fill names array 'score' twice" in capsys.readouterr().err
    assert main([*base, "--fill", "score=2.5", "--fill", "points=", "--drop-array", "extra"]) == 0
    with dlpack.open(out) as ds:
        new = next(i for i in range(len(ds)) if ds.reader.source(i) == "k1/new.png")
        assert float(ds[new]["score"]) == 2.5 and len(ds[new]["points"]) == 0
        assert "extra" not in ds.manifest.arrays
    dlpack.add_array(out, "a1", np.zeros(n + 1, dtype=np.int8))
    dlpack.add_array(out, "a2", np.zeros(n + 1, dtype=np.int8))
    (src / "k0" / "new2.png").write_bytes(images.encode(".png", images.pixels("rgb", 40, 30, seed=12)))
    fills = ["--fill", "score=0", "--fill", "points="]
    assert main([*base, *fills, "--drop-array", "a1", "--drop-array", "a2"]) == 0
    assert not {"a1", "a2"} & set(dlpack.open(out).manifest.arrays)


def test_update_shares_unchanged_shards_of_added_arrays(make_tree: MakeTree, tmp_path: Path, images: Any) -> None:
    src = tree(make_tree)
    out = tmp_path / "out.zarr"
    dlpack.build(src, out, shard_bytes=2**16, jobs=1, quiet=True)
    masks = np.random.default_rng(0).integers(0, 255, (40, 100, 200), dtype=np.uint8)
    dlpack.add_array(out, "masks", masks, key="mask")  # one shard of 40 samples
    (src / "c1" / "zz.png").write_bytes(images.encode(".png", images.pixels("rgb", 40, 30, seed=6)))
    (src / "c0" / "zz.png").write_bytes(images.encode(".png", images.pixels("rgb", 40, 30, seed=7)))
    first = out / "masks" / "c" / "0" / "0" / "0"
    inode = os.stat(first).st_ino
    dlpack.build(src, out, update=True, fill="masks=3", jobs=1, quiet=True)
    with dlpack.open(out) as ds:
        got = {ds.reader.source(i): ds[i]["mask"] for i in range(len(ds))}
        assert ds.verify() == []
    assert np.array_equal(got["c0/000.png"], masks[0]) and (got["c1/zz.png"] == 3).all()
    assert os.stat(first).st_ino == inode  # the unchanged shard file is the same file
    last = out / "masks" / "c" / "1" / "0" / "0"
    assert os.stat(last).st_nlink == 1  # the shard that grew was written anew


def test_update_keeps_what_is_not_dlpacks_in_the_store(make_tree: MakeTree, tmp_path: Path, backend: str) -> None:
    src = tree(make_tree)
    out = tmp_path / backend
    dlpack.build(src, out, shard_bytes=2**16, jobs=1, quiet=True)
    if backend.endswith(".zarr"):
        (out / "NOTES.md").write_text("labelled by hand, weeks 1-6\n")
        (out / "annotations").mkdir()
        (out / "annotations" / "extra.json").write_text('{"a": 1}')
        (out / "labels" / "README").write_text("class ids: see classes")
    else:
        import h5py

        with h5py.File(out, "r+") as f:
            f.create_dataset("my_notes", data=np.arange(5))
            f.attrs["owner"] = "lab 3"
    os.utime(src / "c0" / "000.png", ns=(0, 10**18))
    result = dlpack.build(src, out, update=True, jobs=1, quiet=True)
    if backend.endswith(".zarr"):
        assert "kept 3 entries that are not dlpack's (NOTES.md, annotations, labels/README)" in result.update
        assert (out / "labels" / "README").read_text() == "class ids: see classes"
        assert (out / "NOTES.md").read_text() == "labelled by hand, weeks 1-6\n"
        assert (out / "annotations" / "extra.json").read_text() == '{"a": 1}'
    else:
        import h5py

        with h5py.File(out, "r") as f:
            assert list(f["my_notes"][()]) == [0, 1, 2, 3, 4] and f.attrs["owner"] == "lab 3"
    with dlpack.open(out) as ds:
        assert ds.verify() == []


# ---------------------------------------------------------------- classes, splits and folder rules


SPLIT_TREE = {
    f"{s}/{c}/{k}.png": "rgb" for s, n in (("train", 4), ("val", 2)) for c in ("bad", "good") for k in range(n)
}


def test_update_keeps_classes_and_splits(make_tree: MakeTree, tmp_path: Path, backend: str, images: Any) -> None:
    src = make_tree(SPLIT_TREE)
    out = tmp_path / backend
    dlpack.build(src, out, jobs=1, quiet=True)
    (src / "train" / "good" / "new.png").write_bytes(images.encode(".png", images.pixels("rgb", 40, 30, seed=3)))
    (src / "test" / "bad").mkdir(parents=True)
    (src / "test" / "bad" / "t.png").write_bytes(images.encode(".png", images.pixels("rgb", 40, 30, seed=4)))
    result = dlpack.build(src, out, update=True, jobs=1, quiet=True)
    assert result.classes == ("bad", "good")
    assert result.splits == {"train": 9, "val": 4, "test": 1}
    assert "classes (2): bad, good" in result.summary() and "splits: test 1, train 9, val 4" in result.summary()
    with dlpack.open(out) as ds:
        assert ds.manifest.splits == ("train", "val", "test")  # old codes kept, the new split appended
        for i in range(len(ds)):
            split, cls = ds.reader.source(i).split("/")[:2]
            assert ds.classes[ds[i]["label"]] == cls and ds[i]["split"] == split


def test_a_folder_outside_the_splits_is_refused_not_relabelled(
    make_tree: MakeTree, tmp_path: Path, images: Any
) -> None:
    src = make_tree(SPLIT_TREE)
    out = tmp_path / "out.zarr"
    dlpack.build(src, out, jobs=1, quiet=True)
    (src / "holdout" / "good").mkdir(parents=True)
    (src / "holdout" / "good" / "h1.png").write_bytes(images.encode(".png", images.pixels("rgb", 40, 30, seed=3)))
    with pytest.raises(dlpack.SourceError, match=r"split folders \(train, val\).*holdout/ outside them.*split rule"):
        dlpack.build(src, out, update=True, jobs=1, quiet=True)
    with dlpack.open(out) as ds:
        assert ds.classes == ("bad", "good") and ds.manifest.splits == ("train", "val")
    (src / "holdout" / "good" / "h1.png").unlink()
    (src / "stray.png").write_bytes(images.encode(".png", images.pixels("rgb", 40, 30, seed=3)))
    with pytest.raises(dlpack.SourceError, match=r"stray.png.*--labels none would be refused: move them into class"):
        dlpack.build(src, out, update=True, jobs=1, quiet=True)


def test_a_kept_sample_keeps_its_stored_label(make_tree: MakeTree, tmp_path: Path, images: Any) -> None:
    src = tree(make_tree)
    out = tmp_path / "out.zarr"
    dlpack.build(src, out, shard_bytes=2**16, jobs=1, quiet=True)
    with dlpack.open(out) as ds:
        fixed = 1 - ds.reader.meta("labels")  # a user's relabelling: every class swapped
    dlpack.add_array(out, "labels", fixed.astype(np.int32), replace=True)
    (src / "c0" / "zz.png").write_bytes(images.encode(".png", images.pixels("rgb", 40, 30, seed=6)))
    dlpack.build(src, out, update=True, jobs=1, quiet=True)
    with dlpack.open(out) as ds:
        labels = ds.reader.meta("labels")
    assert np.array_equal(labels[:40], fixed) and labels[40] == 0  # the new file gets its folder's class


# ---------------------------------------------------------------- options and messages


def test_every_build_option_has_an_update_rule() -> None:
    from dataclasses import fields

    from dlpack.pack.changes import UPDATE_OPTIONS

    assert {f.name for f in fields(dlpack.BuildOptions)} == set(UPDATE_OPTIONS)


def test_update_refuses_options_it_would_ignore(make_tree: MakeTree, tmp_path: Path) -> None:
    src = tree(make_tree)
    out = tmp_path / "out.zarr"
    dlpack.build(src, out, shard_bytes=2**16, compression="lz4", jobs=1, quiet=True)
    with pytest.raises(OptionError, match=r"compression \(the store's: lz4, given: zstd\)"):
        dlpack.build(src, out, update=True, compression="zstd", jobs=1, quiet=True)
    with pytest.raises(OptionError, match=r"shard_bytes \(the store's: 65536, given: 70000\)"):
        dlpack.build(src, out, update=True, shard_bytes=70000, jobs=1, quiet=True)
    with pytest.raises(OptionError, match=r"is a dlpack zarr store; --update keeps its format: drop --format hdf5"):
        dlpack.build(src, out, update=True, format="hdf5", jobs=1, quiet=True)
    # Left at their defaults, they keep the store's values.
    assert dlpack.build(src, out, update=True, jobs=1, quiet=True).update == "up to date: nothing to do"


def test_allow_upscale_is_applied_by_an_update(make_tree: MakeTree, tmp_path: Path, images: Any) -> None:
    src = tree(make_tree)
    out = tmp_path / "out.zarr"
    dlpack.build(src, out, size=(40, 30), shard_bytes=2**16, jobs=1, quiet=True)
    (src / "c0" / "small.png").write_bytes(images.encode(".png", images.pixels("rgb", 20, 20, seed=1)))
    with pytest.raises(dlpack.BadInputsError, match="pass --allow-upscale with --update") as info:
        dlpack.build(src, out, update=True, jobs=1, quiet=True)
    assert "--resize fit" not in str(info.value)  # an update keeps the resize mode: no advice it would refuse
    dlpack.build(src, out, update=True, allow_upscale=True, jobs=1, quiet=True)
    with dlpack.open(out) as ds:
        assert len(ds) == 41 and ds.manifest.plan["target"]["allow_upscale"] is True


def test_an_image_of_another_shape_gets_advice_an_update_can_follow(
    make_tree: MakeTree, tmp_path: Path, images: Any
) -> None:
    src = tree(make_tree)
    out = tmp_path / "out.zarr"
    dlpack.build(src, out, max_side=20, shard_bytes=2**16, jobs=1, quiet=True)  # every image 40x30: fixed 20x15
    (src / "c0" / "wide.png").write_bytes(images.encode(".png", images.pixels("rgb", 60, 20, seed=1)))
    with pytest.raises(
        dlpack.BadInputsError, match=r"keeps the store's 20x15 images.*rebuild with --overwrite"
    ) as info:
        dlpack.build(src, out, update=True, jobs=1, quiet=True)
    assert "pass --size" not in str(info.value)


def test_the_stores_symlink_rule_is_kept(make_tree: MakeTree, tmp_path: Path) -> None:
    src = tree(make_tree)
    hidden = src / ".originals"  # hidden folders are not walked: the file is packed through its link only
    hidden.mkdir()
    (src / "c0" / "000.png").rename(hidden / "000.png")
    (src / "c0" / "000.png").symlink_to(hidden / "000.png")
    out = tmp_path / "out.zarr"
    dlpack.build(src, out, follow_symlinks=True, shard_bytes=2**16, jobs=1, quiet=True)
    assert dlpack.build(src, out, update=True, jobs=1, quiet=True).update == "up to date: nothing to do"
    plain = tmp_path / "plain.zarr"
    dlpack.build(src, plain, on_error="skip", shard_bytes=2**16, jobs=1, quiet=True)
    with pytest.raises(OptionError, match=r"follow_symlinks \(the store was built without --follow-symlinks\)"):
        dlpack.build(src, plain, update=True, follow_symlinks=True, jobs=1, quiet=True)


def test_a_packed_file_the_scan_now_refuses_is_named_with_the_reason(make_tree: MakeTree, tmp_path: Path) -> None:
    src = tree(make_tree)
    out = tmp_path / "out.zarr"
    dlpack.build(src, out, shard_bytes=2**16, jobs=1, quiet=True)
    (src / "c0" / "000.png").rename(tmp_path / "moved.png")
    (src / "c0" / "000.png").symlink_to(tmp_path / "moved.png")
    with pytest.raises(OptionError, match=r"still in .* no longer packs them \(c0/000.png: symlink to .* leaves"):
        dlpack.build(src, out, update=True, jobs=1, quiet=True)


def test_a_replaced_file_that_fails_cannot_be_skipped(make_tree: MakeTree, tmp_path: Path) -> None:
    src = tree(make_tree)
    out = tmp_path / "out.zarr"
    dlpack.build(src, out, shard_bytes=2**16, jobs=1, quiet=True)
    (src / "c1" / "021.png").write_bytes(b"not an image at all")
    with pytest.raises(dlpack.BadInputsError, match="cannot be skipped.*delete it and pass --compact") as info:
        dlpack.build(src, out, update=True, on_error="skip", jobs=1, quiet=True)
    assert "pass --on-error skip" not in str(info.value) and "c1/021.png" in str(info.value)


def test_a_copy_with_normalised_names_matches_its_files(make_tree: MakeTree, tmp_path: Path) -> None:
    import shutil
    import unicodedata

    nfc, nfd = unicodedata.normalize("NFC", "café"), unicodedata.normalize("NFD", "café")
    assert nfd != nfc
    src = make_tree(
        {**{f"c{k % 2}/{k:03d}.png": "rgb" for k in range(6)}, f"c0/{nfc}.png": "rgb", f"{nfc}/x.png": "rgb"}
    )
    out = tmp_path / "out.zarr"
    dlpack.build(src, out, jobs=1, quiet=True)
    copy = tmp_path / "copy"
    shutil.copytree(src, copy)
    (copy / "c0" / f"{nfc}.png").rename(copy / "c0" / f"{nfd}.png")
    (copy / nfc).rename(copy / nfd)  # a class folder too
    (copy / nfd / "y.png").write_bytes((copy / nfd / "x.png").read_bytes())
    result = dlpack.build(copy, out, update=True, jobs=1, quiet=True)
    assert result.update.startswith("updated: 1 added, 0 replaced, 0 removed")
    with dlpack.open(out) as ds:
        sources = [ds.reader.source(i) for i in range(len(ds))]
        assert f"c0/{nfd}.png" in sources and f"{nfd}/x.png" in sources  # recorded as they are spelled now
        assert ds.classes == ("c0", "c1", nfc)  # the class folder is the same class
        assert ds.classes[ds[len(ds) - 1]["label"]] == nfc


def test_update_summary_and_json_show_the_stores_classes(
    make_tree: MakeTree, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    src = make_tree(SPLIT_TREE)
    out = tmp_path / "out.zarr"
    assert main(["build", str(src), str(out), "--quiet", "--jobs", "1"]) == 0
    assert main(["build", str(src), str(out), "--update", "--jobs", "1"]) == 0
    text = capsys.readouterr().out
    assert "up to date: nothing to do" in text and "classes (2): bad, good" in text and "unlabelled" not in text
    assert main(["build", str(src), str(out), "--update", "--jobs", "1", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["classes"] == ["bad", "good"] and doc["splits"] == {"train": 8, "val": 4}


def test_a_loader_state_survives_only_an_update_that_changes_nothing(
    make_tree: MakeTree, tmp_path: Path, images: Any
) -> None:
    src = tree(make_tree)
    out = tmp_path / "out.zarr"
    dlpack.build(src, out, shard_bytes=2**16, jobs=1, quiet=True)
    with dlpack.open(out) as ds:
        state = ds.loader(batch_size=8, seed=1, workers=0, prefetch=0).state_dict()
    dlpack.build(src, out, update=True, jobs=1, quiet=True)  # nothing to do: nothing published
    with dlpack.open(out) as ds:
        ds.loader(batch_size=8, seed=1, workers=0, prefetch=0).load_state_dict(state)
    (src / "c0" / "zz.png").write_bytes(images.encode(".png", images.pixels("rgb", 40, 30, seed=6)))
    dlpack.build(src, out, update=True, jobs=1, quiet=True)
    with dlpack.open(out) as ds, pytest.raises(dlpack.StateError, match="saved for another dataset"):
        ds.loader(batch_size=8, seed=1, workers=0, prefetch=0).load_state_dict(state)


def test_an_update_repairs_labels_outside_the_stores_classes(make_tree: MakeTree, tmp_path: Path, backend: str) -> None:
    """A store whose labels name no class refuses every open; an update opens it and takes the folders' classes."""
    from dlpack.backends import open_reader, open_writer

    src = make_tree({f"c{k % 2}/{k:02d}.png": "rgb" for k in range(6)})
    out = tmp_path / backend
    dlpack.build(src, out, jobs=1, quiet=True)
    with dlpack.open(out) as ds:
        want = [ds[i]["label"] for i in range(len(ds))]
    with open_reader(out) as reader:
        manifest, n = reader.manifest, len(reader)
    writer = open_writer(out, "r+")  # the low-level writer does not check labels
    writer.delete_array("labels")
    writer.create_array(manifest.arrays["labels"], n)
    writer.write_block("labels", 0, np.full(n, 7, np.int32))
    writer.commit(manifest)
    with pytest.raises(dlpack.StoreError, match="holds 7 at sample 0"):
        dlpack.open(out)
    result = dlpack.build(src, out, update=True, jobs=1, quiet=True)  # no file changed
    assert result.update is not None and "nothing to do" not in result.update
    with dlpack.open(out) as ds:
        assert [ds[i]["label"] for i in range(len(ds))] == want and ds.verify() == []


def _advice_an_update_refuses(message: str) -> list[str]:
    """The flags ``message`` advises passing that ``build --update`` refuses to change (a rebuild
    with ``--overwrite`` is advice for another command, and dropping an option is always possible)."""
    import dataclasses
    import re

    from dlpack import BuildOptions
    from dlpack.cli import option_flag
    from dlpack.pack.changes import UPDATE_OPTIONS

    fields = {f.name: option_flag(f) for f in dataclasses.fields(BuildOptions)}
    refused = {flag for name, flag in fields.items() if UPDATE_OPTIONS[name] != "applied"} - {"--overwrite"}
    flags = re.findall(r"\b(?:pass|with|use)\s+(--[a-z][a-z-]*)", message)
    flags += [fields.get(k) or k for k in re.findall(r"\bpass\s+([a-z_]+)=", message)]
    return [f for f in flags if f in refused]


UPDATE_ADVICE_CASES = ["resize alone", "resize and max side", "augment", "augment seed", "symlink", "label folder"]


@pytest.mark.parametrize("case", UPDATE_ADVICE_CASES)
def test_every_error_of_an_update_gives_advice_an_update_can_follow(
    case: str, make_tree: MakeTree, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = make_tree({f"p{k % 2}/{k:02d}.png": "rgb" for k in range(6)})
    out = tmp_path / "adv.zarr"
    dlpack.build(src, out, size=(24, 16), jobs=1, quiet=True)
    flags: list[str] = []
    if case == "resize alone":
        flags = ["--resize", "fit"]
    elif case == "resize and max side":
        flags = ["--resize", "stretch", "--max-side", "20"]
    elif case == "augment":
        flags = ["--augment", "2"]
    elif case == "augment seed":
        flags = ["--augment-seed", "3"]
    elif case == "symlink":
        (src / "p0" / "link.png").symlink_to(src / "p1" / "01.png")
    else:
        (src / "labels").mkdir()
        (src / "labels" / "new.png").write_bytes((src / "p1" / "01.png").read_bytes())
    capsys.readouterr()
    assert main(["build", str(src), str(out), "--update", "--jobs", "1", "--quiet", *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dlpack: error:") and "Traceback" not in err
    assert _advice_an_update_refuses(err) == [], err
    # Following it: the options dropped, or the source fixed as the message says; the update then runs.
    if case == "symlink":
        assert "put the file itself there, or rebuild with --overwrite --follow-symlinks" in err
        (src / "p0" / "link.png").unlink()
        (src / "p0" / "link.png").write_bytes((src / "p1" / "01.png").read_bytes())
    elif case == "label folder":
        assert "move it out of the source folder, or rebuild with --overwrite --exclude 'labels'" in err
        (src / "labels" / "new.png").rename(tmp_path / "new.png")
    else:
        assert "drop those options" in err or "update the store first (without them)" in err
    assert main(["build", str(src), str(out), "--update", "--jobs", "1", "--quiet"]) == 0


def test_the_advice_checker_finds_advice_an_update_refuses() -> None:
    assert _advice_an_update_refuses("resize=fit needs a target: pass size=WxH or max_side=N") == ["--size"]
    assert _advice_an_update_refuses("a link; pass --follow-symlinks to pack it") == ["--follow-symlinks"]
    assert _advice_an_update_refuses("Leave it out with --exclude 'masks'") == ["--exclude"]
    assert _advice_an_update_refuses("rebuild with --overwrite --exclude 'x'; or pass --on-error skip") == []
