"""The augmentation cache holds real views: no operation that cannot change an image is drawn for
it, a variant equal to its original or to an earlier variant of the same image is redrawn (the
same for any ``--jobs``), what stays a copy is counted, and ``min_area`` never takes a box from a
variant that no operation made smaller. Through the real config reader, the API and the CLI."""

from __future__ import annotations

import errno
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _augment as aug
import numpy as np
import pytest

import dlpack
from dlpack.cli import main
from dlpack.transforms import Targets, load_config, variant_rng

MakeTree = Callable[..., Path]


def _config(tmp_path: Path, doc: dict[str, Any], name: str = "aug.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def _store(make_tree: MakeTree, tmp_path: Path, kind: str, name: str, n: int = 12) -> Path:
    src = make_tree({f"c{k % 2}/{k:02d}.png": (kind, 16, 16) for k in range(n)}, f"src-{name}")
    out = tmp_path / name
    dlpack.build(src, out, size=(16, 16), quiet=True, jobs=1)
    return out


def _views(ds: Any, i: int) -> list[bytes]:
    return [ds[i]["image"].tobytes(), *(ds.variant(i, v)["image"].tobytes() for v in range(1, ds.variants + 1))]


def test_a_gray_store_never_draws_saturation_and_holds_no_copy(make_tree: MakeTree, tmp_path: Path) -> None:
    """Saturation cannot change a gray image: it is never a gray variant's operation, and no
    variant equals its original although a quarter of the draws apply nothing."""
    out = _store(make_tree, tmp_path, "gray", "g.zarr")
    doc = {"augmentation_percentage": 75, "saturation_variation": 0.3, "brightness_variation": 30, "mirror": "c"}
    result = dlpack.augment(out, 3, _config(tmp_path, doc), jobs=1, quiet=True)
    assert result.copies == 0
    with dlpack.open(out) as ds:
        ops = [e["op"] for i in range(len(ds)) for v in range(1, 4) for e in ds.augmentation(i, v)]
        assert ops and "saturation_variation" not in ops
        assert {"brightness_variation", "mirror"} <= set(ops)
        for i in range(len(ds)):
            assert all(ds.augmentation(i, v) for v in range(1, 4))  # each variant had an operation
            views = _views(ds, i)
            assert len(set(views)) == len(views), i


def test_variants_of_one_image_are_distinct_and_the_same_for_any_jobs(
    make_tree: MakeTree, tmp_path: Path, backend: str
) -> None:
    """A config with few outcomes (a mirror among three, quarter turns) gives many equal draws;
    the cache still holds K different views of every image, and the same bytes for --jobs 1 and 2."""
    out = _store(make_tree, tmp_path, "rgb", backend)
    other = tmp_path / "other" / backend
    other.parent.mkdir()
    (shutil.copytree if out.is_dir() else shutil.copy2)(out, other)
    cfg = _config(tmp_path, {"augmentation_percentage": 60, "mirror": "rc", "rotate": 90})
    first = dlpack.augment(out, 4, cfg, seed=2, jobs=1, quiet=True)
    second = dlpack.augment(other, 4, cfg, seed=2, jobs=2, quiet=True)
    assert first.copies == second.copies == 0
    assert aug.content(out) == aug.content(other)
    with dlpack.open(out) as ds:
        redrawn = 0
        for i in range(len(ds)):
            views = _views(ds, i)
            assert len(set(views)) == 5, i
            # Redraws happened: some stored variant is not the first draw of its generator.
            t = Targets(ds[i]["image"])
            for v in range(1, 5):
                view, record = load_config(cfg).augmenter(t, variant_rng(2, i, v))
                redrawn += record != ds.augmentation(i, v)
        assert redrawn > 0


def test_a_config_that_cannot_make_k_views_says_how_many_copies(
    make_tree: MakeTree, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One possible change (a left-right mirror) cannot make 3 distinct variants: the first is the
    mirror, the other two stay copies, and the summary and --json count them."""
    out = _store(make_tree, tmp_path, "rgb", "m.zarr", n=6)
    cfg = _config(tmp_path, {"augmentation_percentage": 100, "mirror": "c"})
    assert main(["augment", str(out), "--augment", "3", "--augment-config", str(cfg), "--jobs", "1"]) == 0
    summary = capsys.readouterr().out
    assert "12 variants are copies of another view of the same image" in summary, summary
    with dlpack.open(out) as ds:
        for i in range(len(ds)):
            original = ds[i]["image"]
            assert np.array_equal(ds.variant(i, 1)["image"], original[:, ::-1])
    assert main(["augment", str(out), "--augment", "3", "--augment-config", str(cfg), "--replace", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["copies"] == 12


def test_min_area_drops_only_boxes_an_operation_made_smaller(tmp_path: Path) -> None:
    """A box already below min_area in the original stays in every variant that does not shrink it
    (no operation, a brightness change, a mirror); a crop that shrinks it below drops it."""
    image = np.zeros((32, 32, 3), np.uint8)
    boxes = np.array([[2, 2, 4, 3], [10, 10, 30, 30]], np.float32)  # 2 px and 400 px
    t = Targets(image, boxes=boxes, box_labels=np.array([1, 2], np.int32))
    kept = {
        "brightness": {"augmentation_percentage": 100, "brightness_variation": 20, "min_area": 4},
        "mirror": {"augmentation_percentage": 100, "mirror": "rc", "min_area": 4},
    }
    for name, doc in kept.items():
        config = load_config(_config(tmp_path, doc, f"{name}.json"), task="detection")
        for v in range(1, 6):
            view, record = config.augmenter(t, variant_rng(0, 0, v))
            assert record and view.box_labels.tolist() == [1, 2], (name, record)
            assert np.allclose(np.prod(view.boxes[:, 2:] - view.boxes[:, :2], axis=1), [2, 400])
    # No operation drawn: every box of the original, under any min_area.
    config = load_config(_config(tmp_path, {"augmentation_percentage": 100, "contrast_variation": 0.2,
                                            "min_area": 50}, "c.json"), task="detection")  # fmt: skip
    view, _ = config.augmenter(t, variant_rng(0, 0, 1))
    assert view.box_labels.tolist() == [1, 2]
    # An operation that shrinks every box to a quarter of its area drops the small one only.
    doc = {"__version__": "2.0.8", "transform": {"__class_fullname__": "Compose", "transforms": [
        {"__class_fullname__": "Affine", "p": 1.0, "scale": 0.5}],
        "bbox_params": {"format": "pascal_voc", "min_area": 4, "min_visibility": 0.0}}}  # fmt: skip
    shrink = load_config(_config(tmp_path, doc, "shrink.json"))
    view, record = shrink.augmenter(t, variant_rng(0, 0, 1))
    assert record[0]["op"] == "Affine" and view.box_labels.tolist() == [2]


def _fail_copy(code: int) -> Callable[..., Any]:
    real = shutil.copyfile

    def copyfile(src: Any, dst: Any, *args: Any, **kwargs: Any) -> Any:
        if ".dlpack-augment" in os.fspath(dst):
            raise OSError(code, os.strerror(code), os.fspath(src), None, os.fspath(dst))
        return real(src, dst, *args, **kwargs)

    return copyfile


@pytest.mark.parametrize(
    ("code", "said"),
    [(errno.ENOSPC, "the disk is full"), (errno.EACCES, "is not writable (permission denied)")],
)
def test_augment_that_cannot_prepare_its_zarr_stage_names_the_reason(
    make_tree: MakeTree,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    code: int,
    said: str,
) -> None:
    out = _store(make_tree, tmp_path, "rgb", "s.zarr", n=4)
    cfg = _config(tmp_path, {"augmentation_percentage": 100, "mirror": "c"})
    before = aug.content(out)
    monkeypatch.setattr(shutil, "copyfile", _fail_copy(code))
    rc = main(["augment", str(out), "--augment", "2", "--augment-config", str(cfg), "--quiet"])
    monkeypatch.undo()
    err = capsys.readouterr().err
    assert rc == 2, err
    assert said in err and "s.zarr" in err and "Errno" not in err, err
    assert aug.content(out) == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".s.zarr")) == []


def test_hdf5_augment_replace_gives_back_the_space_of_the_replaced_variants(
    make_tree: MakeTree, tmp_path: Path
) -> None:
    """HDF5 never reuses the space of a deleted dataset: each --replace rewrites the file compactly,
    so the size after several replacements stays that of one, and the user's own objects and
    attributes in the file stay."""
    import h5py

    out = _store(make_tree, tmp_path, "rgb", "r.h5", n=24)
    with h5py.File(out, "r+") as f:
        f.create_dataset("my_notes", data=np.arange(5))
        f.attrs["owner"] = "me"
    cfg = _config(tmp_path, {"augmentation_percentage": 100, "mirror": "rc", "brightness_variation": 20})
    dlpack.augment(out, 3, cfg, jobs=1, quiet=True)
    first = out.stat().st_size
    sizes = []
    for seed in (1, 2, 3):
        assert main(["augment", str(out), "--augment", "3", "--augment-seed", str(seed), "--augment-config",
                     str(cfg), "--replace", "--quiet"]) == 0  # fmt: skip
        sizes.append(out.stat().st_size)
    assert max(sizes) <= first * 1.1, (first, sizes)
    with dlpack.open(out) as ds:
        assert ds.verify() == [] and ds.manifest.augment["seed"] == 3
        assert len(set(_views(ds, 0))) == 4
    with h5py.File(out, "r") as f:
        assert f["my_notes"][()].tolist() == [0, 1, 2, 3, 4] and f.attrs["owner"] == "me"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".r.h5")) == []
