"""What a new user meets first in ``dlpack build`` and ``dlpack info``: ``--split``, ``--exclude``,
label folders, notes on non-image files and variable sizes, the OUT suffix, the hints and dtypes."""

from __future__ import annotations

import importlib
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import dlpack
from dlpack.cli import main
from dlpack.errors import OptionError, SourceError, StoreExistsError

Capsys = pytest.CaptureFixture[str]
MakeTree = Callable[..., Path]

#: Tiny images keep these builds fast.
TINY = ("rgb", 6, 5)


def _classes(n_a: int = 10, n_b: int = 20) -> dict[str, object]:
    return {**{f"a/{i:02d}.png": TINY for i in range(n_a)}, **{f"b/{i:02d}.png": TINY for i in range(n_b)}}


def _build(src: Path, out: Path, *flags: str) -> int:
    return main(["build", str(src), str(out), "--jobs", "1", "--quiet", *flags])


def _split_of(out: Path) -> dict[str, str | None]:
    with dlpack.open(out) as ds:
        return {ds[i]["source"]: ds[i]["split"] for i in range(len(ds))}


# ---------------------------------------------------------------- --split


def test_split_is_stratified_by_class_and_stored_like_folder_splits(make_tree: MakeTree, tmp_path: Path) -> None:
    out = tmp_path / "o.zarr"
    assert _build(make_tree(_classes()), out, "--split", "80,10,10", "--split-seed", "7") == 0
    with dlpack.open(out) as ds:
        assert ds.splits == ("test", "train", "val")
        labels = np.array([ds[i]["label"] for i in range(len(ds))])
        per = {s: np.bincount(labels[ds.indices(s)], minlength=2).tolist() for s in ds.splits}
        assert per == {"train": [8, 16], "val": [1, 2], "test": [1, 2]}
        assert ds.manifest.plan["split"] == {"percent": [80, 10, 10], "seed": 7}
        assert ds.manifest.arrays["split"].dtype == "|i1"


def test_two_parts_are_train_and_val(make_tree: MakeTree, tmp_path: Path) -> None:
    out = tmp_path / "o.zarr"
    assert _build(make_tree(_classes()), out, "--split", "90,10") == 0
    assert dlpack.open(out).splits == ("train", "val")


def test_split_depends_on_the_seed_only_not_on_jobs(make_tree: MakeTree, tmp_path: Path) -> None:
    src = make_tree(_classes(40, 40))
    outs = {}
    for name, flags in {"s1": ["--jobs", "1"], "s2": ["--jobs", "2"], "other": ["--split-seed", "1"]}.items():
        out = tmp_path / f"{name}.zarr"
        assert main(["build", str(src), str(out), "--quiet", "--split", "50,25,25", *flags]) == 0
        outs[name] = _split_of(out)
    assert outs["s1"] == outs["s2"]
    assert outs["s1"] != outs["other"]


def test_split_is_refused_where_the_source_has_split_folders(
    make_tree: MakeTree, tmp_path: Path, capsys: Capsys
) -> None:
    src = make_tree({"train/a/0.png": TINY, "test/a/1.png": TINY})
    assert _build(src, tmp_path / "o.zarr", "--split", "80,20") == 2
    err = capsys.readouterr().err
    assert "already gives splits by its folders (test/, train/)" in err and "drop --split" in err
    assert not (tmp_path / "o.zarr").exists()


@pytest.mark.parametrize("bad", ["80,30", "100", "50,0,50", "a,b", "40,30,20,10"])
def test_bad_split_percentages_exit_2(bad: str, make_tree: MakeTree, tmp_path: Path, capsys: Capsys) -> None:
    assert _build(make_tree(_classes(2, 2)), tmp_path / "o.zarr", "--split", bad) == 2
    assert "split takes 2 or 3 whole percentages" in capsys.readouterr().err


def test_split_seed_without_split_is_refused() -> None:
    with pytest.raises(OptionError, match="split_seed only applies to split"):
        dlpack.BuildOptions(split_seed=3)


def test_update_keeps_every_split_and_gives_new_files_theirs_by_the_seed(make_tree: MakeTree, tmp_path: Path) -> None:
    from dlpack.pack.inputs import _split_draw

    src = make_tree(_classes())
    out = tmp_path / "o.zarr"
    assert _build(src, out, "--split", "80,10,10", "--split-seed", "5", "--size", "6x5") == 0
    before = _split_of(out)
    make_tree({f"a/new{i}.png": TINY for i in range(12)})
    assert _build(src, out, "--update") == 0
    after = _split_of(out)
    assert {k: after[k] for k in before} == before  # no sample changes split
    bounds = np.cumsum([80, 10, 10]) / 100
    for i in range(12):
        draw = _split_draw(5, f"a/new{i}.png")
        assert after[f"a/new{i}.png"] == ("train", "val", "test")[int(np.searchsorted(bounds, draw, side="right"))]
    # Giving the split options again with the store's values is fine; other values are refused.
    assert _build(src, out, "--update", "--split", "80,10,10", "--split-seed", "5") == 0


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--split", "70,30"], "split (the store's: 80,10,10; given: 70,30)"),
        (["--split-seed", "6"], "split_seed (the store's: 5; given: 6)"),
    ],
)
def test_update_refuses_another_split(
    flags: list[str], said: str, make_tree: MakeTree, tmp_path: Path, capsys: Capsys
) -> None:
    src = make_tree(_classes(4, 4))
    out = tmp_path / "o.zarr"
    assert _build(src, out, "--split", "80,10,10", "--split-seed", "5", "--size", "6x5") == 0
    assert _build(src, out, "--update", *flags) == 2
    assert said in capsys.readouterr().err


def test_update_refuses_split_on_a_store_built_without_one(make_tree: MakeTree, tmp_path: Path, capsys: Capsys) -> None:
    src = make_tree(_classes(4, 4))
    out = tmp_path / "o.zarr"
    assert _build(src, out, "--size", "6x5") == 0
    assert _build(src, out, "--update", "--split", "80,20") == 2
    assert "split (the store's: none" in capsys.readouterr().err


def test_info_shows_the_splits_and_the_classes_in_each(make_tree: MakeTree, tmp_path: Path, capsys: Capsys) -> None:
    out = tmp_path / "o.zarr"
    assert _build(make_tree(_classes()), out, "--split", "80,10,10") == 0
    capsys.readouterr()
    assert main(["info", str(out)]) == 0
    text = capsys.readouterr().out
    assert "per class    a 10, b 20" in text
    assert "splits       train 24, val 3, test 3" in text
    assert "  train      a 8, b 16" in text and "  test       a 1, b 2" in text
    assert main(["info", str(out), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["splits"]["val"] == {"count": 3, "classes": {"a": 1, "b": 2}}
    assert (doc["class_counts"], doc["unlabelled"], doc["unsplit"]) == ({"a": 10, "b": 20}, 0, 0)


# ---------------------------------------------------------------- label folders and --exclude


@pytest.mark.parametrize(
    ("spec", "named", "flag"),
    [
        ({"images/0.png": TINY, "masks/0.png": TINY}, "label folder(s) masks/", "--exclude 'masks'"),
        (
            {"bottle/train/good/0.png": TINY, "bottle/Ground_Truth/broken/0_mask.png": TINY},
            "label folder(s) bottle/Ground_Truth/",
            "--exclude 'bottle/Ground_Truth'",
        ),
        (
            {"x/GT/0.png": TINY, "y/gt/0.png": TINY, "y/0.png": TINY},
            "label folder(s) x/GT/, y/gt/",
            "--exclude 'x/GT' --exclude 'y/gt'",
        ),
        ({"a/0.png": TINY, "a/0_mask.png": TINY}, "1 label image(s) named *_mask.* (a/0_mask.png)", "'*_mask.*'"),
    ],
)
def test_label_folders_and_mask_images_are_refused_naming_them(
    spec: dict[str, object], named: str, flag: str, make_tree: MakeTree, tmp_path: Path, capsys: Capsys
) -> None:
    assert _build(make_tree(spec), tmp_path / "o.zarr") == 2
    err = capsys.readouterr().err
    assert named in err and flag in err and "move it out of the source folder" in err
    assert "Traceback" not in err
    with pytest.raises(SourceError, match="holds label data"):
        dlpack.build(make_tree(spec, "again"), tmp_path / "p.zarr", quiet=True, jobs=1)


def test_exclude_leaves_folders_and_files_out_and_counts_them(
    make_tree: MakeTree, tmp_path: Path, capsys: Capsys
) -> None:
    src = make_tree(
        {"a/0.png": TINY, "a/1_mask.png": TINY, "b/2.png": TINY, "masks/0.png": TINY, "masks/deep/1.png": TINY}
    )
    out = tmp_path / "o.zarr"
    argv = ["build", str(src), str(out), "--jobs", "1", "--exclude", "masks", "--exclude", "*_mask.*"]
    assert main([*argv, "--verbose"]) == 0
    text = capsys.readouterr().out
    assert "excluded 2 paths matching --exclude" in text
    assert "  excluded a/1_mask.png" in text and "  excluded masks/" in text
    with dlpack.open(out) as ds:
        assert ([ds[i]["source"] for i in range(len(ds))], ds.classes) == (["a/0.png", "b/2.png"], ("a", "b"))
        assert ds.manifest.plan["exclude"] == ["masks", "*_mask.*"]
    assert main([*argv, "--overwrite", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["excluded"] == ["a/1_mask.png", "masks/"]


@pytest.mark.parametrize("pattern", ["a/x", "a/x/", "./a/x"])
def test_a_pattern_with_a_slash_matches_the_relative_path(pattern: str, make_tree: MakeTree, tmp_path: Path) -> None:
    src = make_tree({"a/x/0.png": TINY, "a/y/1.png": TINY, "b/x/2.png": TINY})
    out = tmp_path / "o.zarr"
    assert _build(src, out, "--exclude", pattern) == 0
    with dlpack.open(out) as ds:
        assert sorted(ds[i]["source"] for i in range(len(ds))) == ["a/y/1.png", "b/x/2.png"]


def test_update_keeps_the_excludes_and_refuses_others(make_tree: MakeTree, tmp_path: Path, capsys: Capsys) -> None:
    src = make_tree({"a/0.png": TINY, "b/1.png": TINY, "masks/0.png": TINY})
    out = tmp_path / "o.zarr"
    assert _build(src, out, "--exclude", "masks", "--size", "6x5") == 0
    make_tree({"a/2.png": TINY, "masks/1.png": TINY})
    assert _build(src, out, "--update") == 0  # the store's --exclude holds: masks/ stays out
    with dlpack.open(out) as ds:
        assert sorted(ds[i]["source"] for i in range(len(ds))) == ["a/0.png", "a/2.png", "b/1.png"]
    capsys.readouterr()
    assert _build(src, out, "--update", "--exclude", "masks", "--exclude", "b") == 2
    assert "exclude (the store's: 'masks'; given: 'masks', 'b')" in capsys.readouterr().err


# ---------------------------------------------------------------- notes in the summary


def test_non_image_files_are_counted_and_listed_with_verbose(
    make_tree: MakeTree, tmp_path: Path, capsys: Capsys
) -> None:
    src = make_tree({"a/0.png": TINY, "a/paper.pdf": b"%PDF-1.4", "b/1.png": TINY})
    assert main(["build", str(src), str(tmp_path / "o.zarr"), "--jobs", "1"]) == 0
    text = capsys.readouterr().out
    assert "skipped 1 non-image file (--verbose lists them)" in text and "paper.pdf" not in text
    assert main(["build", str(src), str(tmp_path / "p.zarr"), "--jobs", "1", "--verbose"]) == 0
    assert "  not an image: a/paper.pdf" in capsys.readouterr().out
    assert main(["build", str(src), str(tmp_path / "q.zarr"), "--jobs", "1", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ignored"] == ["a/paper.pdf"] and "skipped 1 non-image file (--verbose lists them)" in doc["notes"]


VARIABLE = "variable-size store (2 distinct sizes): batches are lists; pass --size WxH or --max-side N for tensors"


def test_mixed_sizes_without_size_are_said_in_the_summary_and_json(
    make_tree: MakeTree, tmp_path: Path, capsys: Capsys
) -> None:
    src = make_tree({"a/0.png": ("rgb", 6, 5), "a/1.png": ("rgb", 7, 5), "a/2.png": ("rgb", 7, 5)})
    assert main(["build", str(src), str(tmp_path / "o.zarr"), "--jobs", "1"]) == 0
    assert VARIABLE in capsys.readouterr().out
    assert main(["build", str(src), str(tmp_path / "p.zarr"), "--jobs", "1", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["distinct_sizes"] == 2 and VARIABLE in doc["notes"]
    assert main(["build", str(src), str(tmp_path / "q.zarr"), "--jobs", "1", "--size", "6x5"]) == 0
    assert "variable-size" not in capsys.readouterr().out


# ---------------------------------------------------------------- OUT, hints, dtypes


@pytest.mark.parametrize("name", ["x.txt", "store.zarr.bak"])
def test_an_out_suffix_that_names_no_format_is_refused(
    name: str, make_tree: MakeTree, tmp_path: Path, capsys: Capsys
) -> None:
    assert _build(make_tree({"a/0.png": TINY}), tmp_path / name) == 2
    err = capsys.readouterr().err
    assert "names no store format" in err and ".h5 (hdf5), .hdf5 (hdf5), .zarr (zarr)" in err
    assert "--format FORMAT" in err and "format=FORMAT" not in err
    assert not (tmp_path / name).exists()


def test_a_suffixless_out_is_zarr_and_format_names_any_suffix(make_tree: MakeTree, tmp_path: Path) -> None:
    src = make_tree({"a/0.png": TINY})
    assert _build(src, tmp_path / "plain") == 0
    assert dlpack.open(tmp_path / "plain").backend == "zarr"
    assert _build(src, tmp_path / "x.txt", "--format", "hdf5") == 0
    assert dlpack.open(tmp_path / "x.txt").backend == "hdf5"
    with pytest.raises(OptionError, match="format=FORMAT"):
        dlpack.build(src, tmp_path / "y.txt")


def test_the_out_exists_hint_names_the_flag_on_the_cli_and_the_keyword_in_the_library(
    make_tree: MakeTree, tmp_path: Path, capsys: Capsys
) -> None:
    src, out = make_tree({"a/0.png": TINY}), tmp_path / "o.zarr"
    assert _build(src, out) == 0
    assert _build(src, out) == 2
    err = capsys.readouterr().err
    assert "pass --overwrite to replace it" in err and "overwrite=True" not in err
    with pytest.raises(StoreExistsError, match=r"pass overwrite=True to replace it$"):
        dlpack.build(src, out)


def test_info_prints_numpy_dtype_names_and_json_keeps_the_format_strings(
    make_tree: MakeTree, tmp_path: Path, capsys: Capsys
) -> None:
    out = tmp_path / "o.zarr"
    assert _build(make_tree({"a/0.png": TINY}), out) == 0
    assert main(["info", str(out)]) == 0
    text = capsys.readouterr().out
    assert "channel(s), uint8" in text and "|u1" not in text
    assert main(["info", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["dtype"] == "|u1"


# ---------------------------------------------------------------- progress


class _Bar:
    """A stand-in for the tqdm bar: records every update."""

    def __init__(self, log: dict[str, list[int]], desc: str) -> None:
        self.updates = log.setdefault(desc, [])

    def __enter__(self) -> _Bar:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def update(self, n: int) -> None:
        self.updates.append(n)


def _parallel_module() -> Any:
    return importlib.import_module("dlpack._parallel")  # every stage's bar comes from its progress()


def _bars(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[int]]:
    log: dict[str, list[int]] = {}
    monkeypatch.setattr(_parallel_module(), "progress", lambda total, desc, quiet: _Bar(log, desc))
    return log


@pytest.mark.slow
@pytest.mark.parametrize("jobs", ["1", "2"])
def test_the_packing_bar_moves_within_a_block_of_many_small_images(
    jobs: str, make_tree: MakeTree, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    n = 3000
    src = make_tree({f"a/{i:04d}.png": ("rgb", 4, 4) for i in range(n)})
    log = _bars(monkeypatch)
    monkeypatch.setattr(
        _parallel_module().BlockProgress, "INTERVAL", 0.002
    )  # poll the workers' counts often: a short build
    # --jobs 2 with three blocks (of 65536 // 48 images) runs them in worker processes; --jobs 1
    # decodes the one block in this process.
    shard = ["--shard-bytes", str(2**16)] if jobs == "2" else []
    out = tmp_path / "o.zarr"
    assert main(["build", str(src), str(out), "--jobs", jobs, "--force-jobs", *shard]) == 0
    packing = log["packing"]
    assert sum(packing) == n
    assert len(packing) >= 20, packing  # per sub-block of 64 images, not once per block
    with dlpack.open(out) as ds:
        assert ds.manifest.shard_rows == (n if jobs == "1" else 2**16 // 48)


def test_progress_does_not_change_the_bytes_written(
    make_tree: MakeTree, tmp_path: Path, snapshot: Callable[..., dict[str, bytes]]
) -> None:
    src = make_tree({f"a/{i:03d}.png": ("gray", 2, 2) for i in range(300)})
    stores = []
    for jobs in ("1", "2"):
        out = tmp_path / f"o{jobs}.zarr"
        assert (
            main(["build", str(src), str(out), "--quiet", "--jobs", jobs, "--force-jobs", "--shard-bytes", str(2**16)])
            == 0
        )
        stores.append(snapshot(out))
    assert stores[0] == stores[1]


def test_a_folder_sources_own_excludes_are_recorded_and_other_sources_refuse_exclude(
    make_tree: MakeTree, tmp_path: Path
) -> None:
    from dlpack.sources import FolderSource, SourceItem, SourceScan

    src = make_tree({"a/0.png": TINY, "masks/0.png": TINY})
    out = tmp_path / "o.zarr"
    dlpack.build(FolderSource(src, exclude=["masks"]), out, quiet=True, jobs=1)
    assert dlpack.open(out).manifest.plan["exclude"] == ["masks"]
    with pytest.raises(OptionError, match="give the patterns in one place"):
        dlpack.build(FolderSource(src, exclude=["masks"]), tmp_path / "p.zarr", exclude=("b",), quiet=True)

    class Listed:
        root = src

        def scan(self) -> SourceScan:
            return SourceScan((SourceItem("a/0.png", None),))

    with pytest.raises(OptionError, match="exclude applies to a folder source"):
        dlpack.build(Listed(), tmp_path / "q.zarr", exclude=("masks",), quiet=True)
    dlpack.build(Listed(), tmp_path / "q.zarr", quiet=True, jobs=1, split=(50, 50))
    assert dlpack.open(tmp_path / "q.zarr").splits == ("train", "val")


def test_an_update_refuses_new_label_folders_and_keeps_those_a_store_already_holds(
    make_tree: MakeTree, tmp_path: Path, capsys: Capsys
) -> None:
    from dlpack.sources import FolderSource

    src = make_tree({"a/0.png": TINY, "b/1.png": TINY})
    out = tmp_path / "o.zarr"
    assert _build(src, out, "--size", "6x5") == 0
    make_tree({"masks/0.png": TINY, "a/2_mask.png": TINY})
    assert _build(src, out, "--update") == 2
    err = capsys.readouterr().err
    assert "label folder(s) masks/" in err and "a/2_mask.png" in err and "--exclude 'masks'" in err
    assert len(dlpack.open(out)) == 2
    # A store packed before label folders were refused (here: without the check) holds a class
    # "masks"; its update keeps those samples and appends the new images of other classes.
    old = tmp_path / "old.zarr"
    dlpack.build(FolderSource(src, check_labels=False), old, size=(6, 5), quiet=True, jobs=1)
    assert "masks" in dlpack.open(old).classes
    make_tree({"b/3.png": TINY})
    assert _build(src, old, "--update") == 0
    with dlpack.open(old) as ds:
        assert sorted(ds[i]["source"] for i in range(len(ds))) == [
            "a/0.png", "a/2_mask.png", "b/1.png", "b/3.png", "masks/0.png"
        ]  # fmt: skip


# ---------------------------------------------------------------- the store's size against the source's


@pytest.mark.parametrize(
    ("compression", "cost", "otherwise"),
    [
        (
            "none",
            "decoded pixels, the fastest reads",
            "for a bucket or network share --compression lz4 about halves it (zstd: less still)",
        ),
        ("lz4", "about half the bytes of none, slower reads", "--compression none reads fastest, zstd stores less"),
        ("zstd", "the fewest bytes, the slowest reads", "--compression none reads fastest, lz4 faster than zstd"),
    ],
)
def test_the_summary_compares_the_store_with_its_source_and_names_compression(
    compression: str, cost: str, otherwise: str, make_tree: MakeTree, tmp_path: Path, capsys: Capsys
) -> None:
    src = make_tree({f"k/{i}.png": ("rgb", 24, 18) for i in range(8)})
    source = sum(p.stat().st_size for p in src.rglob("*.png"))
    out = tmp_path / "big.zarr"
    json_file = tmp_path / "big.json"
    # Stored at 4x the pixels: the store is far larger than the files it came from.
    flags = ["--size", "96x72", "--allow-upscale", "--compression", compression, "--json-file", str(json_file)]
    assert main(["build", str(src), str(out), "--jobs", "1", *flags]) == 0
    text = capsys.readouterr().out
    doc = json.loads(json_file.read_text())
    ratio = doc["output_bytes"] / source
    assert doc["input_bytes"] == source
    assert f"{source / 1e3:.1f} kB of source files -> {doc['output_bytes'] / 1e3:.1f} kB on disk ({ratio:.2f}x)" in text
    notes = [n for n in doc["notes"] if n.startswith("compression ")]
    assert notes == [
        f"compression {compression} (store {ratio:.2f}x its source files): {cost}; {otherwise} "
        '(docs/benchmarks.md, "Compression")'
    ]
    assert notes[0] in text.splitlines()


def test_every_build_names_its_codec_also_for_a_store_smaller_than_its_source(
    make_tree: MakeTree, tmp_path: Path, capsys: Capsys
) -> None:
    src = make_tree({f"k/{i}.png": ("rgb", 160, 120) for i in range(6)})
    base = ["build", str(src), str(tmp_path / "small.zarr"), "--jobs", "1"]
    assert main([*base, "--size", "16x12"]) == 0
    text = capsys.readouterr().out
    assert re.search(r"kB of source files -> [0-9.]+ kB on disk \(0\.\d\dx\)", text), text
    assert re.search(r"^compression none \(store 0\.\d\dx its source files\): decoded pixels", text, re.M), text
    # An update decodes only what changed: its bytes in are no measure of the source.
    assert main([*base, "--update"]) == 0
    text = capsys.readouterr().out
    assert "0.0 kB in -> " in text and "of source files" not in text
    assert re.search(r"^compression none: decoded pixels, the fastest reads; ", text, re.M), text
