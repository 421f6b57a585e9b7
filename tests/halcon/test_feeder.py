"""dlpack.halcon: the DLSample mapping without HALCON, and sample_batches against a recording stand-in."""

from __future__ import annotations

import importlib.util
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _halcon_standin as standin
import cv2
import numpy as np
import pytest

import dlpack
import dlpack.halcon
import dlpack.halcon.feeder
from dlpack.halcon import sample_batches, store_class_ids, store_task, to_dlsample

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _fresh_standin() -> None:
    standin.reset()


def _folders(root: Path, classes: dict[str, int], shape: tuple[int, ...] = (6, 8, 3), dtype: Any = np.uint8) -> Path:
    """``root/<class>/<i>.png``: ``count`` flat images per class, pixel value ``10 * i``."""
    for name, count in classes.items():
        (root / name).mkdir(parents=True)
        for i in range(count):
            assert cv2.imwrite(str(root / name / f"{i}.png"), np.full(shape, 10 * i, dtype))
    return root


def _store(tmp_path: Path, classes: dict[str, int], **kwargs: Any) -> dlpack.Dataset:
    src = _folders(tmp_path / "raw", classes, **kwargs)
    dlpack.build(src, tmp_path / "s.zarr", quiet=True, jobs=1)
    return dlpack.open(tmp_path / "s.zarr")


def _builtin(value: Any) -> bool:
    items = value if isinstance(value, list) else [value]
    return all(type(v) in (int, float, str) for v in items)


# ---------------------------------------------------------------- the mapping, without HALCON


def test_uint8_images_map_to_the_default_range_as_float32() -> None:
    image = np.array([[[0], [255]], [[127], [1]]], np.uint8)
    out = to_dlsample({"image": image, "label": 1, "index": 3}, "classification", (7, 9))
    assert out["image"].dtype == np.float32 and out["image"].shape == (2, 2, 1)
    assert out["image"][..., 0].tolist() == [[-127.0, 128.0], [0.0, -126.0]]
    assert out["image_id"] == 3 and out["image_label_id"] == 9
    assert {k for k, v in out.items() if not isinstance(v, np.ndarray)} == {"image_id", "image_label_id"}
    assert all(_builtin(v) for k, v in out.items() if k != "image")


def test_uint16_images_map_their_full_range() -> None:
    image = np.array([[0, 65535, 32767]], np.uint16)[..., None]
    out = to_dlsample({"image": image, "label": -1, "index": 0}, "classification", (), image_range=(0.0, 1.0))
    assert out["image"].dtype == np.float32
    np.testing.assert_allclose(out["image"][0, :, 0], [0.0, 1.0, 32767 / 65535], rtol=1e-6)
    assert "image_label_id" not in out  # unlabelled: HALCON gets no label rather than a wrong one


def test_a_bad_image_range_or_dtype_is_refused() -> None:
    sample = {"image": np.zeros((2, 2, 1), np.uint8), "label": 0, "index": 0}
    with pytest.raises(dlpack.OptionError, match="min < max"):
        to_dlsample(sample, "classification", (0,), image_range=(1.0, 1.0))
    with pytest.raises(dlpack.OptionError, match="float64"):
        to_dlsample({**sample, "image": np.zeros((2, 2, 1))}, "classification", (0,))


def test_detection_boxes_become_pixel_centred_rows_first() -> None:
    boxes = np.array([[1.0, 2.0, 5.0, 7.5], [0.0, 0.0, 3.0, 4.0]], np.float32)  # x_min, y_min, x_max, y_max
    sample = {"image": np.zeros((8, 8, 3), np.uint8), "index": 5, "label": -1, "boxes": boxes}
    out = to_dlsample({**sample, "box_labels": np.array([1, 0], np.int32)}, "detection", (3, 11))
    assert out["bbox_label_id"] == [11, 3]
    assert out["bbox_row1"] == [1.5, -0.5] and out["bbox_col1"] == [0.5, -0.5]
    assert out["bbox_row2"] == [7.0, 3.5] and out["bbox_col2"] == [4.5, 2.5]
    assert all(_builtin(out[k]) for k in ("bbox_label_id", "bbox_row1", "bbox_col1", "bbox_row2", "bbox_col2"))
    empty = to_dlsample(
        {**sample, "boxes": np.zeros((0, 4), np.float32), "box_labels": np.zeros(0, np.int32)}, "detection", (3, 11)
    )
    assert empty["bbox_label_id"] == [] and empty["bbox_row1"] == []


def test_a_box_label_outside_the_classes_is_an_error_naming_the_sample() -> None:
    sample = {"image": np.zeros((4, 4, 1), np.uint8), "index": 2, "label": -1}
    bad = {**sample, "boxes": np.ones((1, 4), np.float32), "box_labels": np.array([4], np.int32)}
    with pytest.raises(dlpack.StoreError, match="a box label of sample 2 is class index 4"):
        to_dlsample(bad, "detection", (0, 1))


def test_segmentation_and_anomaly_keep_their_label_images() -> None:
    mask = np.array([[0, 3], [255, 3]], np.uint8)
    base = {"image": np.zeros((2, 2, 1), np.uint8), "index": 1, "label": -1, "mask": mask}
    seg = to_dlsample(base, "segmentation", (0, 3))
    assert seg["segmentation_image"].tolist() == mask.tolist() and seg["segmentation_image"].dtype == np.uint8
    ok = to_dlsample({**base, "label": 1}, "anomaly", (0, 1), classes=("nok", "ok"))
    nok = to_dlsample({**base, "label": 0}, "anomaly", (0, 1), classes=("nok", "ok"))
    assert ok["anomaly_label"] == "ok" and nok["anomaly_label"] == "nok"
    assert nok["anomaly_ground_truth"].tolist() == mask.tolist()
    del base["mask"]
    assert "anomaly_ground_truth" not in to_dlsample({**base, "label": 0}, "anomaly", (0, 1), classes=("nok", "ok"))


class _Manifest:
    def __init__(self, classes: tuple[str, ...], arrays: tuple[str, ...], **fields: Any) -> None:
        self.classes, self.arrays = classes, dict.fromkeys(arrays)
        self.__dict__.update(fields)


def test_the_task_is_the_manifests_else_read_from_the_arrays() -> None:
    assert store_task(_Manifest(("a",), ("labels", "mask"), task="detection")) == "detection"
    assert store_task(_Manifest(("a",), ("labels", "mask"))) == "segmentation"
    assert store_task(_Manifest(("a",), ("labels", "boxes", "box_labels"))) == "detection"
    assert store_task(_Manifest(("nok", "ok"), ("labels", "mask"))) == "anomaly"
    assert store_task(_Manifest(("a", "b"), ("labels",))) == "classification"
    assert store_task(_Manifest((), ("labels",))) == "none"
    assert store_class_ids(_Manifest(("a", "b"), ())) == (0, 1)
    assert store_class_ids(_Manifest(("a", "b"), (), class_ids=[4, 2])) == (4, 2)
    with pytest.raises(dlpack.StoreError, match="2 class_ids for 3 classes"):
        store_class_ids(_Manifest(("a", "b", "c"), (), class_ids=[4, 2]))


# ---------------------------------------------------------------- sample_batches, against the stand-in


def test_classification_batches_are_halcon_dicts_of_builtin_values(tmp_path: Path) -> None:
    ds = _store(tmp_path, {"cat": 3, "dog": 2})
    batches = list(sample_batches(ds, 2, shuffle=False, workers=1, prefetch=2, halcon=standin))
    assert [len(b) for b in batches] == [2, 2, 1]
    dicts = [d for b in batches for d in b]
    assert all(isinstance(d, standin.Dict) for d in dicts)
    assert [d.tuples["image_id"] for d in dicts] == [[0], [1], [2], [3], [4]]
    labels = {d.tuples["image_id"][0]: d.tuples["image_label_id"][0] for d in dicts}
    assert labels == {i: int(ds[i]["label"]) for i in range(len(ds))} and set(labels.values()) == {0, 1}
    image = dicts[1].objects["image"].array
    assert image.dtype == np.float32 and image.shape == (6, 8, 3)
    np.testing.assert_array_equal(image, ds[1]["image"].astype(np.float32) - 127.0)
    assert ("himage_from_numpy_array", ((6, 8, 3), "<f4")) in standin.calls
    assert sum(c == ("create_dict", None) for c in standin.calls) == 5


def test_the_epoch_and_seed_give_the_loaders_order(tmp_path: Path) -> None:
    ds = _store(tmp_path, {"a": 4, "b": 4})

    def ids(epoch: int) -> list[int]:
        return [s["image_id"] for b in sample_batches(ds, 3, epoch=epoch, seed=5, as_halcon=False) for s in b]

    expected = [int(i) for b in ds.loader(batch_size=3, seed=5).batches(epoch=1) for i in b]
    assert ids(1) == expected and sorted(ids(1)) == list(range(8)) and ids(0) != ids(1)


def test_a_split_and_drop_last_select_the_samples(tmp_path: Path) -> None:
    src = tmp_path / "raw"
    _folders(src / "train", {"a": 3, "b": 2})
    _folders(src / "test", {"a": 1, "b": 1})
    dlpack.build(src, tmp_path / "s.h5", quiet=True, jobs=1)
    ds = dlpack.open(tmp_path / "s.h5")
    got = list(sample_batches(ds, 2, split="train", drop_last=True, as_halcon=False))
    assert [len(b) for b in got] == [2, 2]
    assert {s["image_id"] for b in got for s in b} <= {int(i) for i in ds.indices("train")}
    assert all(isinstance(s["image"], np.ndarray) for b in got for s in b)


def test_the_mapping_runs_on_the_reader_threads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _store(tmp_path, {"a": 4})
    threads: list[str] = []
    real = dlpack.halcon.to_dlsample

    def recording(*args: Any, **kwargs: Any) -> dict[str, Any]:
        threads.append(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(dlpack.halcon.feeder, "to_dlsample", recording)
    got = list(sample_batches(str(tmp_path / "s.zarr"), 2, workers=2, prefetch=2, halcon=standin))  # a path works too
    assert [len(b) for b in got] == [2, 2] and len(threads) == 4
    assert all(name.startswith("dlpack") for name in threads)  # the loader's workers, not the caller


def test_the_feeder_keeps_the_loaders_statistics(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ds = _store(tmp_path, {"a": 3, "b": 2})
    batches = sample_batches(ds, 2, shuffle=False, workers=1, prefetch=2, halcon=standin)
    assert isinstance(batches.loader, dlpack.Loader) and batches.stats() == []
    assert [len(b) for b in batches] == [2, 2, 1]
    (stats,) = batches.stats()
    assert isinstance(stats, dlpack.EpochStats) and (stats.images, stats.batches, stats.complete) == (5, 3, True)
    assert 0.0 <= stats.wait_share <= 1.0 and stats.line().startswith("epoch 0: ")
    assert capsys.readouterr().err == ""  # report is off by default
    reported = sample_batches(ds, 2, epoch=1, report=True, as_halcon=False)
    next(reported)
    reported.close()  # stopped early: the pass is kept, marked partial, and its line printed
    (partial,) = reported.stats()
    assert (partial.epoch, partial.batches, partial.complete) == (1, 1, False)
    assert capsys.readouterr().err.strip() == partial.line() and "partial (1 batches)" in partial.line()


def test_detection_batches_carry_the_boxes(tmp_path: Path) -> None:
    ds = _store(tmp_path, {"a": 2, "b": 1})
    path = tmp_path / "s.zarr"
    boxes = [
        np.array([[1, 2, 4, 5]], np.float32),
        np.zeros((0, 4), np.float32),
        np.array([[0, 0, 8, 6]] * 2, np.float32),
    ]
    dlpack.add_array(path, "boxes", boxes, ragged=True)
    dlpack.add_array(
        path, "box_labels", [np.array([1], np.int32), np.zeros(0, np.int32), np.array([0, 1], np.int32)], ragged=True
    )
    ds = dlpack.open(path)
    assert store_task(ds.manifest) == "detection"
    dicts = [d for b in sample_batches(ds, 3, shuffle=False, halcon=standin) for d in b]
    assert [d.tuples["bbox_label_id"] for d in dicts] == [[1], [], [0, 1]]
    assert dicts[0].tuples["bbox_row1"] == [1.5] and dicts[0].tuples["bbox_col2"] == [3.5]
    assert dicts[2].tuples["bbox_row2"] == [5.5, 5.5] and dicts[1].tuples["bbox_col1"] == []
    assert "image_label_id" not in dicts[0].tuples


def test_segmentation_batches_carry_a_label_image(tmp_path: Path) -> None:
    _store(tmp_path, {"a": 2})
    path = tmp_path / "s.zarr"
    masks = np.zeros((2, 6, 8), np.uint16)
    masks[1, 2:4, 3:5] = 7
    dlpack.add_array(path, "mask", masks)
    dicts = [d for b in sample_batches(dlpack.open(path), 2, shuffle=False, halcon=standin) for d in b]
    seg = dicts[1].objects["segmentation_image"].array
    assert seg.dtype == np.uint16 and seg.tolist() == masks[1].tolist()
    assert "image" in dicts[1].objects and set(dicts[1].tuples) == {"image_id"}


def test_anomaly_batches_say_ok_or_nok(tmp_path: Path) -> None:
    ds = _store(tmp_path, {"ok": 2, "nok": 1}, shape=(4, 4), dtype=np.uint16)
    assert store_task(ds.manifest) == "anomaly" and ds.manifest.image.dtype == "<u2"
    dicts = [d for b in sample_batches(ds, 4, shuffle=False, halcon=standin) for d in b]
    by_id = {d.tuples["image_id"][0]: d.tuples["anomaly_label"][0] for d in dicts}
    assert by_id == {i: ds.classes[ds[i]["label"]] for i in range(3)}
    image = dicts[0].objects["image"].array
    assert image.shape == (4, 4, 1) and float(image.min()) == -127.0  # uint16 0 maps to the range's minimum


def test_the_standin_refuses_what_the_binding_refuses() -> None:
    d = standin.create_dict()
    for bad in (np.int64(1), True, [1, np.float32(2)], None):
        with pytest.raises(standin.HalconError):
            standin.set_dict_tuple(d, "k", bad)
    with pytest.raises(standin.HalconError, match="float64"):
        standin.himage_from_numpy_array(np.zeros((2, 2)))


def test_without_halcon_the_error_names_the_extra_and_the_native_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    ds = _store(tmp_path, {"a": 1})
    monkeypatch.setitem(sys.modules, "halcon", None)  # import halcon raises ImportError
    with pytest.raises(dlpack.MissingExtraError) as info:
        sample_batches(ds, 1)
    message = str(info.value)
    assert "dlpack-datasets[halcon]" in message and "native HALCON installation with a licence" in message
    assert list(sample_batches(ds, 1, as_halcon=False))  # the plain dicts need no HALCON


def test_a_task_whose_array_is_missing_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ds = _store(tmp_path, {"a": 1})
    monkeypatch.setattr(
        "dlpack.halcon.feeder.store_task", lambda manifest: "detection"
    )  # as a manifest's task would say
    with pytest.raises(dlpack.StoreError, match="is a detection store but has no boxes, box_labels array"):
        sample_batches(ds, 1, halcon=standin)


# ---------------------------------------------------------------- examples/train_halcon.py


def _train_main() -> Callable[..., int]:
    spec = importlib.util.spec_from_file_location("train_halcon", ROOT / "examples" / "train_halcon.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    main: Callable[..., int] = module.main
    return main


def test_the_example_trains_batch_by_batch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _store(tmp_path, {"a": 3, "b": 3})
    (tmp_path / "m.hdl").write_bytes(b"")  # the stand-in reads no file, the example checks that it exists
    args = [str(tmp_path / "s.zarr"), "--model", str(tmp_path / "m.hdl"), "--epochs", "2", "--batch-size", "4"]
    args += ["--save", "out.hdl"]
    assert _train_main()(args, halcon=standin) == 0
    (model,) = standin.models
    assert model.params["batch_size"] == [4] and model.params["class_ids"] == [0, 1]
    assert [len(b) for b in model.batches] == [4, 4]  # drop_last: one full batch per epoch
    assert ("write_dl_model", "out.hdl") in standin.calls
    out = capsys.readouterr().out
    assert "epoch 1: 4 images in" in out and "waiting for data" in out
    assert "  loader: epoch 0: " in out and "  loader: epoch 1: " in out and "% of the time (p99" in out


def test_the_example_refuses_images_of_another_size(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _store(tmp_path, {"a": 2})
    original = standin.read_dl_model

    def read(path: str) -> standin.Model:
        model = original(path)
        model.params.update(image_width=[224], image_height=[6])
        return model

    monkeypatch.setattr(standin, "read_dl_model", read)
    (tmp_path / "m.hdl").write_bytes(b"")
    assert _train_main()([str(tmp_path / "s.zarr"), "--model", str(tmp_path / "m.hdl")], halcon=standin) == 2
    err = capsys.readouterr().err
    assert "m.hdl: image_width 8 (the model wants 224)" in err and "image_height" not in err
