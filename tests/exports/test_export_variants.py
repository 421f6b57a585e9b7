"""dlpack export --to dldataset --include-variants: a store's augmentation variants as extra training samples."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from _augment import HEIGHT, N_IMAGES, WIDTH, classification_store, detection_store
from _dldataset_schema import problems

import dlpack
import dlpack.cli

FLIP = {"augmentation_percentage": 100, "mirror": "c"}  # every variant: the original mirrored left-right
VARIANT_KEYS = ("dlpack_variant_of", "dlpack_variant")


@pytest.fixture(autouse=True)
def no_halcon(monkeypatch: pytest.MonkeyPatch) -> None:
    """``import halcon`` fails (the export then writes the JSON and a note), as on machines without HALCON."""
    monkeypatch.delitem(sys.modules, "halcon", raising=False)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if not p.endswith("halcon_standin")])


def _flip_config(tmp_path: Path) -> Path:
    path = tmp_path / "flip.json"
    path.write_text(json.dumps(FLIP), encoding="utf-8")
    return path


def _export(capsys: pytest.CaptureFixture[str], store: Path, out: Path, *flags: str) -> tuple[int, str]:
    code = dlpack.cli.main(["export", str(store), "--to", flags[0] if flags else "dldataset", str(out), *flags[1:]])
    return code, capsys.readouterr().err


def _doc(out: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((out / "dataset.json").read_text(encoding="utf-8"))
    return doc


def _png(path: Path) -> np.ndarray:
    img = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
    assert img is not None, path
    return cv2.cvtColor(img, cv2.COLOR_BGR2RGB) if img.ndim == 3 else img


def _halcon_keys_only(doc: dict[str, Any]) -> dict[str, Any]:
    return {**doc, "samples": [{k: v for k, v in s.items() if k not in VARIANT_KEYS} for s in doc["samples"]]}


def _by_id(doc: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {s["image_id"]: s for s in doc["samples"]}


def _reals(values: np.ndarray) -> list[float]:
    """float32 values by their shortest decimal, moved half a pixel (HALCON's pixel-centred frame)."""
    return [float(str(np.float32(v))) - 0.5 for v in values]


@pytest.fixture
def detection(make_tree: Callable[..., Path], tmp_path: Path, backend: str) -> Path:
    """40 images with 0-2 boxes each and their masks, split 60/20/20, with 2 mirrored variants each."""
    store = detection_store(make_tree, tmp_path, f"det-{backend}", size=(WIDTH, HEIGHT), split="60,20,20")
    dlpack.augment(store, 2, _flip_config(tmp_path), jobs=1, quiet=True)
    return store


def test_variants_of_training_samples_are_extra_samples_pointing_back(
    detection: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "halcon"
    code, err = _export(capsys, detection, out, "dldataset", "--include-variants")
    assert code == 0, err
    assert "dlpack_variant_of" in err  # the note naming the key
    doc = _doc(out)
    assert problems(_halcon_keys_only(doc), "detection") == []
    samples = _by_id(doc)
    n = N_IMAGES
    with dlpack.open(detection) as ds:
        train = set(ds.indices("train").tolist())
        assert 0 < len(train) < n and ds.variants == 2
        assert len(doc["samples"]) == n + 2 * len(train)
        variants = [s for s in doc["samples"] if "dlpack_variant" in s]
        assert {s["dlpack_variant_of"] for s in variants} == train  # no validation or test sample has any
        for s in variants:
            i, v = s["dlpack_variant_of"], s["dlpack_variant"]
            original = samples[i]
            assert s["image_id"] == v * n + i and "dlpack_variant" not in original
            assert s["image_file_name"] == f"dlpack_variants/v{v}/{original['image_file_name']}"
            assert s["split"] == original["split"] == "train"
            view = ds.variant(i, v)
            boxes = np.asarray(view["boxes"]).reshape(-1, 4)
            # HALCON's rows/cols of the variant's own boxes...
            assert s["bbox_row1"] == _reals(boxes[:, 1]) and s["bbox_col1"] == _reals(boxes[:, 0])
            assert s["bbox_row2"] == _reals(boxes[:, 3]) and s["bbox_col2"] == _reals(boxes[:, 2])
            # ... which are the original's mirrored: x -> W - x, rows unchanged, same classes.
            assert s["bbox_row1"] == original["bbox_row1"] and s["bbox_row2"] == original["bbox_row2"]
            mirrored = [WIDTH - (c + 0.5) - 0.5 for c in original["bbox_col2"]]
            assert s["bbox_col1"] == pytest.approx(mirrored, abs=1e-6)
            assert s["bbox_label_id"] == original["bbox_label_id"]
            image = _png(out / "images" / s["image_file_name"])
            np.testing.assert_array_equal(image, view["image"])
            np.testing.assert_array_equal(image, ds[i]["image"][:, ::-1])
        for i in set(range(n)) - train:
            assert all(v * n + i not in samples for v in (1, 2))


def test_without_the_flag_the_variants_stay_out(
    detection: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "halcon"
    code, err = _export(capsys, detection, out)
    assert code == 0, err
    doc = _doc(out)
    assert problems(doc, "detection") == [] and len(doc["samples"]) == N_IMAGES
    assert not (out / "images" / "dlpack_variants").exists()


def test_a_store_without_variants_is_refused_naming_dlpack_augment(
    make_tree: Callable[..., Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = classification_store(make_tree, tmp_path, "plain.zarr")
    code, err = _export(capsys, store, tmp_path / "out", "dldataset", "--include-variants")
    assert code == 2 and "dlpack augment" in err and "no augmentation variants" in err
    assert not (tmp_path / "out").exists()
    with pytest.raises(dlpack.OptionError, match="dlpack augment"):
        dlpack.export(store, "dldataset", tmp_path / "out", include_variants=True)


@pytest.mark.parametrize("to", ["coco", "folders"])
def test_other_formats_refuse_the_flag(
    detection: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], to: str
) -> None:
    code, err = _export(capsys, detection, tmp_path / "out", to, "--include-variants")
    assert code == 2 and "--include-variants" in err and "dldataset" in err
    assert not (tmp_path / "out").exists()


def test_classification_variants_keep_the_label(
    make_tree: Callable[..., Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = classification_store(make_tree, tmp_path, "cls.zarr", split="50,25,25")
    dlpack.augment(store, 1, _flip_config(tmp_path), jobs=1, quiet=True)
    out = tmp_path / "halcon"
    code, err = _export(capsys, store, out, "dldataset", "--include-variants")
    assert code == 0, err
    doc = _doc(out)
    assert problems(_halcon_keys_only(doc), "classification") == []
    samples = _by_id(doc)
    with dlpack.open(store) as ds:
        train = ds.indices("train").tolist()
        variants = [s for s in doc["samples"] if "dlpack_variant" in s]
        assert sorted(s["dlpack_variant_of"] for s in variants) == train
        for s in variants:
            i = s["dlpack_variant_of"]
            assert s["image_id"] == N_IMAGES + i and s["dlpack_variant"] == 1
            assert s["image_label_id"] == samples[i]["image_label_id"] == ds.class_ids[ds[i]["label"]]
            np.testing.assert_array_equal(_png(out / "images" / s["image_file_name"]), ds.variant(i, 1)["image"])


def test_segmentation_variants_get_their_own_label_images(
    make_tree: Callable[..., Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = classification_store(make_tree, tmp_path, "seg.zarr", split="50,25,25")
    masks = np.zeros((N_IMAGES, HEIGHT, WIDTH), np.uint8)
    for i in range(N_IMAGES):
        masks[i, 3:20, 2 + i % 9 : 12 + i % 9] = 1  # off-centre, so the mirror moves it
    dlpack.add_array(store, "mask", masks)
    dlpack.augment(store, 1, _flip_config(tmp_path), jobs=1, quiet=True)
    out = tmp_path / "halcon"
    code, err = _export(capsys, store, out, "dldataset", "--include-variants")
    assert code == 0, err
    doc = _doc(out)
    assert problems(_halcon_keys_only(doc), "segmentation") == []
    with dlpack.open(store) as ds:
        assert ds.task == "segmentation"
        variants = [s for s in doc["samples"] if "dlpack_variant" in s]
        assert sorted(s["dlpack_variant_of"] for s in variants) == ds.indices("train").tolist()
        for s in variants:
            i = s["dlpack_variant_of"]
            assert s["segmentation_file_name"] == s["image_file_name"]
            assert s["image_file_name"].startswith("dlpack_variants/v1/")
            label = _png(out / "segmentation" / s["segmentation_file_name"])
            np.testing.assert_array_equal(label, ds.variant(i, 1)["mask"])
            np.testing.assert_array_equal(label, masks[i][:, ::-1])


def test_a_store_without_splits_gives_every_sample_variants_and_says_what_splitting_would_do(
    make_tree: Callable[..., Path], tmp_path: Path
) -> None:
    store = detection_store(make_tree, tmp_path, "nosplit.zarr", size=(WIDTH, HEIGHT))
    dlpack.augment(store, 1, _flip_config(tmp_path), jobs=1, quiet=True)
    result = dlpack.export(store, "dldataset", tmp_path / "out", include_variants=True)
    assert result.counts["variants"] == N_IMAGES and result.samples == 2 * N_IMAGES
    assert any("split_dl_dataset" in note and "--split" in note for note in result.notes)
    doc = _doc(tmp_path / "out")
    assert all("split" not in s for s in doc["samples"])
