"""Export file names: one file per sample in every export, whatever the sources are called."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import dlpack
import dlpack.cli
from dlpack.exports._common import unique_png_names

#: Source names that meet once the extension becomes .png, in one case or another, or as a folder.
HOSTILE = (
    "good/a.jpg",
    "good/a.png",
    "good/a.jpg.png",
    "good/A.bmp",
    "good/sub/a.png",
    "good/c.png/x.png",
    "good/c.jpg",
    "bad/b.jpg",
    "bad/b.png",
    "bad/b_0.bmp",
    "bad/b_1.bmp",
    "bad/b_7.png",
    "bad/B.tif",
)
SIDE = 8


def _fold(name: str) -> str:
    return name.casefold()


@pytest.fixture(autouse=True)
def no_halcon(monkeypatch: pytest.MonkeyPatch) -> None:
    """``import halcon`` fails (the DLDataset export then writes the JSON and a note)."""
    monkeypatch.delitem(sys.modules, "halcon", raising=False)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if not p.endswith("halcon_standin")])


@pytest.fixture
def hostile_store(tmp_path: Path) -> Path:
    """A store of the HOSTILE sources, each image one gray value of its own (10, 20, ...)."""
    src = tmp_path / "src"
    for k, rel in enumerate(HOSTILE):
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        assert cv2.imwrite(str(src / rel), np.full((SIDE, SIDE, 3), 10 * (k + 1), np.uint8))
    store = tmp_path / "s.zarr"
    assert dlpack.cli.main(["build", str(src), str(store), "--quiet"]) == 0
    return store


def _value(path: Path) -> int:
    img = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
    assert img is not None, path
    values = np.unique(img)
    assert len(values) == 1, path
    return int(values[0])


def _export(store: Path, to: str, out: Path, *flags: str) -> None:
    assert dlpack.cli.main(["export", str(store), "--to", to, str(out), *flags]) == 0


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*.png") if p.is_file())


def _assert_one_file_per_sample(ds: Any, named: dict[int, Path], folder: Path) -> None:
    """``named`` (sample index -> file) covers every sample, no name twice in any case, every file
    holds its own sample's pixels and no other file is there."""
    assert sorted(named) == list(range(len(ds)))
    folds = [_fold(p.relative_to(folder).as_posix()) for p in named.values()]
    assert len(set(folds)) == len(folds)
    assert sorted(named.values()) == _files(folder)
    for i, path in named.items():
        assert _value(path) == int(ds[i]["image"][0, 0, 0]), (i, path)


def test_a_dldataset_export_puts_each_sample_in_its_own_file(hostile_store: Path, tmp_path: Path) -> None:
    out = tmp_path / "dl"
    _export(hostile_store, "dldataset", out)
    doc = json.loads((out / "dataset.json").read_text(encoding="utf-8"))
    with dlpack.open(hostile_store) as ds:
        assert len(doc["samples"]) == len(ds) == len(HOSTILE)
        named = {s["image_id"]: out / "images" / s["image_file_name"] for s in doc["samples"]}
        _assert_one_file_per_sample(ds, named, out / "images")


def test_a_coco_export_has_one_images_entry_and_file_per_sample(hostile_store: Path, tmp_path: Path) -> None:
    out = tmp_path / "coco"
    _export(hostile_store, "coco", out)
    doc = json.loads((out / "annotations.json").read_text(encoding="utf-8"))
    with dlpack.open(hostile_store) as ds:
        assert len(doc["images"]) == len(ds)
        named = {im["id"] - 1: out / "images" / im["file_name"] for im in doc["images"]}
        _assert_one_file_per_sample(ds, named, out / "images")


def test_a_folders_export_keeps_every_sample_in_its_class_folder(hostile_store: Path, tmp_path: Path) -> None:
    out = tmp_path / "folders"
    _export(hostile_store, "folders", out)
    files = _files(out)
    with dlpack.open(hostile_store) as ds:
        assert len(files) == len(ds)
        assert len({_fold(p.relative_to(out).as_posix()) for p in files}) == len(files)
        by_class: dict[str, list[int]] = {}
        for i in range(len(ds)):
            by_class.setdefault(ds.classes[ds[i]["label"]], []).append(int(ds[i]["image"][0, 0, 0]))
        for cls, values in by_class.items():
            assert sorted(_value(p) for p in (out / cls).iterdir()) == sorted(values), cls
    rebuilt = tmp_path / "back.zarr"
    assert dlpack.cli.main(["build", str(out), str(rebuilt), "--quiet"]) == 0
    with dlpack.open(rebuilt) as back:
        assert len(back) == len(HOSTILE)


def test_variants_never_take_a_sample_s_file(tmp_path: Path) -> None:
    """A sample whose source path is where a variant of another would go keeps its file; the
    variant gets another name (before, the export was refused)."""
    src = tmp_path / "src"
    for k, rel in enumerate(("good/a.png", "dlpack_variants/v1/good/a.png", "dlpack_variants/v1/good/A.jpg")):
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        assert cv2.imwrite(str(src / rel), np.full((SIDE, SIDE, 3), 40 * (k + 1), np.uint8))
    store = tmp_path / "s.zarr"
    assert dlpack.cli.main(["build", str(src), str(store), "--quiet"]) == 0
    config = tmp_path / "brighter.json"
    config.write_text(json.dumps({"augmentation_percentage": 100, "mirror": "c"}), encoding="utf-8")
    dlpack.augment(store, 1, config, jobs=1, quiet=True)
    out = tmp_path / "dl"
    _export(store, "dldataset", out, "--include-variants")
    doc = json.loads((out / "dataset.json").read_text(encoding="utf-8"))
    names = [s["image_file_name"] for s in doc["samples"]]
    assert len({_fold(n) for n in names}) == len(names) == 6
    assert sorted(out / "images" / n for n in names) == _files(out / "images")
    with dlpack.open(store) as ds:
        for s in doc["samples"]:
            i = s.get("dlpack_variant_of", s["image_id"])
            want = ds.variant(i, 1)["image"] if "dlpack_variant" in s else ds[i]["image"]
            got = cv2.cvtColor(cv2.imread(str(out / "images" / s["image_file_name"])), cv2.COLOR_BGR2RGB)
            np.testing.assert_array_equal(got, want)


# ---------------------------------------------------------------- the naming function itself

_part = st.sampled_from(["a", "A", "b", "a.png", "A.PNG", "a.jpg", "a_0", "a_1", "a.jpg.png", "b_2.bmp", "x"])
_rel = st.lists(_part, min_size=1, max_size=3).map("/".join)
_folder = st.sampled_from(["", "good", "Good", "train/good", "a.png"])


@given(
    st.lists(st.tuples(_folder, _rel), min_size=1, max_size=12),
    st.lists(_rel.map(lambda r: r + ".png"), max_size=3),
)
def test_names_are_unique_in_any_case_and_never_a_folder_of_another(
    wanted: list[tuple[str, str]], taken: list[str]
) -> None:
    names = unique_png_names(dict(enumerate(wanted)), taken)
    assert sorted(names) == list(range(len(wanted)))
    final = [_fold(n) for n in names.values()]
    assert len(set(final)) == len(final)
    assert not set(final) & {_fold(t) for t in taken}
    folders = {_fold(p.rsplit("/", k)[0]) for p in [*names.values(), *taken] for k in range(1, p.count("/") + 1)}
    assert not set(final) & folders
    for k, (folder, rel) in enumerate(wanted):
        name = names[k]
        assert name.endswith(".png") and name.startswith(f"{folder}/" if folder else "")
        assert name.rpartition("/")[0] == f"{folder}/{rel}".strip("/").rpartition("/")[0]  # same folder


def test_names_that_meet_nowhere_are_the_sources_with_png() -> None:
    wanted = {0: ("", "a/x.jpg"), 1: ("", "a/y.png"), 2: ("cls", "z.bmp")}
    assert unique_png_names(wanted) == {0: "a/x.png", 1: "a/y.png", 2: "cls/z.png"}


def test_names_that_meet_keep_the_extension_then_take_the_sample_index() -> None:
    wanted = {3: ("", "a.jpg"), 4: ("", "a.png"), 5: ("", "a.jpg.png"), 6: ("", "A.jpg")}
    names = unique_png_names(wanted)
    assert names[5] == "a.jpg.png"  # its own name: it kept no extension to get it
    assert names[4] == "a.png.png"
    assert {names[3], names[6]} == {"a.jpg_3.png", "A.jpg_6.png"}


def test_class_folders_that_differ_only_in_case_are_noted(tmp_path: Path) -> None:
    """Their files never meet, but copied to a case-insensitive file system the classes would: a note says so."""
    src = tmp_path / "src"
    for k, rel in enumerate(("Cat/x.png", "cat/x.png", "dog/x.png")):
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        assert cv2.imwrite(str(src / rel), np.full((SIDE, SIDE, 3), 10 * (k + 1), np.uint8))
    store = tmp_path / "s.zarr"
    assert dlpack.cli.main(["build", str(src), str(store), "--quiet"]) == 0
    result = dlpack.export(store, "folders", tmp_path / "out")
    (note,) = [n for n in result.notes if "differ only in case" in n]
    assert "'Cat'" in note and "'cat'" in note and "dog" not in note
    assert len({_fold(p.relative_to(tmp_path / "out").as_posix()) for p in _files(tmp_path / "out")}) == 3
