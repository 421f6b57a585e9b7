"""The build writes label outputs beside the images: per file, in the same blocks, journalled and
resumed with them, replaced together by ``--update``, and refused or skipped naming the entry."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from conftest import interrupt_build

import dlpack
from dlpack.errors import BadInputsError, OptionError, SourceError
from dlpack.sources import CocoSource, FolderSource

#: 20 images of 64x64 RGB (12288 bytes) in 64 KiB shards: 5 images a block, 4 blocks.
N, SIDE, SHARD = 20, 64, 2**16


def _png(path: Path, k: int, shape: tuple[int, ...] = (SIDE, SIDE, 3)) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(k)
    assert cv2.imwrite(str(path), rng.integers(0, 255, shape, dtype=np.uint8))


def coco_tree(tmp_path: Path, n: int = N, size: tuple[int, int] = (SIDE, SIDE)) -> tuple[Path, Path]:
    """``n`` images with one box each (image k: x=k, y=2, w=10, h=6) and a polygon on image 0."""
    src = tmp_path / "images"
    w, h = size
    images, anns = [], []
    for k in range(n):
        _png(src / f"{k:03d}.png", k, (h, w, 3))
        images.append({"id": k + 1, "file_name": f"{k:03d}.png", "width": w, "height": h})
        anns.append({"id": 100 + k, "image_id": k + 1, "category_id": 3 if k % 2 else 7, "bbox": [k, 2, 10, 6]})
    doc = {"images": images, "annotations": anns, "categories": [{"id": 3, "name": "a"}, {"id": 7, "name": "b"}]}
    ann = tmp_path / "ann.json"
    ann.write_text(json.dumps(doc), encoding="utf-8")
    return src, ann


def mask_tree(tmp_path: Path, n: int = N) -> tuple[Path, Path]:
    src, masks = tmp_path / "images", tmp_path / "masks"
    for k in range(n):
        _png(src / f"{k:03d}.png", k)
        m = np.zeros((SIDE, SIDE), np.uint8)
        m[k : k + 8, 10:20] = 1 + k % 2
        masks.mkdir(parents=True, exist_ok=True)
        assert cv2.imwrite(str(masks / f"{k:03d}.png"), m)
    (masks / "classes.txt").write_text("background\nx\ny\n", encoding="utf-8")
    return src, masks


def files(path: Path) -> dict[str, bytes]:
    if path.is_file():
        return {"": path.read_bytes()}
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("suffix", ["zarr", "h5"])
def test_coco_boxes_and_labels_follow_a_stretch(tmp_path: Path, suffix: str) -> None:
    src, ann = coco_tree(tmp_path, n=4, size=(40, 20))
    out = tmp_path / f"out.{suffix}"
    result = dlpack.build(src, out, labels=f"coco:{ann}", size=(20, 10), jobs=1, quiet=True)
    assert result.task == "detection"
    with dlpack.open(out) as ds:
        m = ds.manifest
        assert (m.task, m.classes, m.class_ids) == ("detection", ("a", "b"), (3, 7))
        for k in range(4):
            s = ds[k]
            # COCO [k, 2, 10, 6] -> corners [k, 2, k + 10, 8], halved by the 40x20 -> 20x10 stretch.
            np.testing.assert_array_equal(s["boxes"], np.array([[k / 2, 1, (k + 10) / 2, 4]], np.float32))
            assert s["box_labels"].tolist() == [1 if k % 2 == 0 else 0]
            assert s["box_crowd"].tolist() == [0]
        assert ds.manifest.plan["labels"]["task"] == "detection"
        assert "mask" not in m.arrays and "orientation" in m.arrays and "label_sha256" in m.arrays


def test_clipped_boxes_are_reported_in_the_summary_and_json(tmp_path: Path) -> None:
    src, ann = coco_tree(tmp_path, n=2)
    doc = json.loads(ann.read_text())
    doc["annotations"][0]["bbox"] = [60, 2, 10, 6]  # sticks out of the 64-wide image: the source clips it
    ann.write_text(json.dumps(doc))
    result = dlpack.build(src, tmp_path / "o.zarr", labels=f"coco:{ann}", jobs=1, quiet=True)
    assert any("clipped 1 box(es)" in n and "annotation id 100" in n for n in result.notes)
    assert "clipped 1 box(es)" in result.summary()


def test_masks_are_nearest_neighbour_with_the_pad_ignore_value(tmp_path: Path) -> None:
    src, masks = tmp_path / "images", tmp_path / "masks"
    _png(src / "a.png", 0, (20, 40, 3))
    m = np.zeros((20, 40), np.uint8)
    m[:, 20:] = 2
    masks.mkdir()
    cv2.imwrite(str(masks / "a.png"), m)
    out = tmp_path / "o.zarr"
    dlpack.build(src, out, labels=f"masks:{masks}", size=(20, 20), resize="fit", jobs=1, quiet=True)
    with dlpack.open(out) as ds:
        got = ds[0]["mask"]
        assert ds.manifest.mask_ignore == 255 and got.dtype == np.uint8
    # 40x20 fit into 20x20: scale 0.5, 10 rows of image centred (5 pad rows above and below).
    want = np.full((20, 20), 255, np.uint8)
    want[5:15, :10] = 0
    want[5:15, 10:] = 2
    np.testing.assert_array_equal(got, want)


def test_sixteen_bit_label_images_give_a_sixteen_bit_mask(tmp_path: Path) -> None:
    src, masks = tmp_path / "images", tmp_path / "masks"
    _png(src / "a.png", 0)
    masks.mkdir()
    cv2.imwrite(str(masks / "a.png"), np.full((SIDE, SIDE), 1000, np.uint16))
    out = tmp_path / "o.h5"
    dlpack.build(src, out, labels=f"masks:{masks}", jobs=1, quiet=True)
    with dlpack.open(out) as ds:
        assert ds.manifest.mask_ignore == 65535
        assert ds[0]["mask"].dtype == np.uint16 and int(ds[0]["mask"].max()) == 1000


def test_masks_in_a_variable_size_store_are_refused_naming_size(tmp_path: Path) -> None:
    src, masks = mask_tree(tmp_path, n=2)
    _png(src / "big.png", 9, (80, 70, 3))
    cv2.imwrite(str(masks / "big.png"), np.zeros((80, 70), np.uint8))
    with pytest.raises(OptionError, match="--size"):
        dlpack.build(src, tmp_path / "o.zarr", labels=f"masks:{masks}", jobs=1, quiet=True)
    assert not (tmp_path / "o.zarr").exists()


def test_anomaly_defects_and_ground_truth(tmp_path: Path) -> None:
    src, gt = tmp_path / "src", tmp_path / "gt"
    _png(src / "good" / "0.png", 0)
    _png(src / "scratch" / "1.png", 1)
    g = np.zeros((SIDE, SIDE), np.uint8)
    g[3:9, 3:9] = 255
    (gt / "scratch").mkdir(parents=True)
    cv2.imwrite(str(gt / "scratch" / "1_mask.png"), g)
    out = tmp_path / "o.zarr"
    dlpack.build(src, out, labels="anomaly", anomaly_masks=str(gt), jobs=1, quiet=True)
    with dlpack.open(out) as ds:
        assert (ds.manifest.task, ds.manifest.defects) == ("anomaly", ("good", "scratch"))
        by = {ds[i]["source"]: ds[i] for i in range(2)}
        assert by["good/0.png"]["defect"] == 0 and not by["good/0.png"]["mask"].any()
        assert by["scratch/1.png"]["defect"] == 1
        np.testing.assert_array_equal(by["scratch/1.png"]["mask"], (g != 0).astype(np.uint8))


def test_a_bad_label_file_is_an_input_error_of_its_image(tmp_path: Path) -> None:
    src, masks = mask_tree(tmp_path, n=3)
    cv2.imwrite(str(masks / "001.png"), np.zeros((10, 10), np.uint8))  # another size than its image
    out = tmp_path / "o.zarr"
    with pytest.raises(BadInputsError) as info:
        dlpack.build(src, out, labels=f"masks:{masks}", jobs=1, quiet=True)
    assert "001.png" in str(info.value) and "mask '001.png' is 10x10" in str(info.value)
    assert not out.exists() and not list(tmp_path.glob(".o.zarr.*"))
    result = dlpack.build(src, out, labels=f"masks:{masks}", jobs=1, quiet=True, on_error="skip")
    assert [e.path for e in result.skipped] == ["001.png"] and result.count == 2
    with dlpack.open(out) as ds:
        assert [ds[i]["source"] for i in range(2)] == ["000.png", "002.png"]


def test_a_source_object_refuses_label_options_it_would_ignore(tmp_path: Path) -> None:
    src, ann = coco_tree(tmp_path, n=1)
    with pytest.raises(OptionError, match="class_folder"):
        dlpack.build(FolderSource(src), tmp_path / "o.zarr", class_folder="last", quiet=True)
    with pytest.raises(OptionError, match="labels"):
        dlpack.build(CocoSource(src, ann), tmp_path / "o.zarr", labels=f"coco:{ann}", quiet=True)


@pytest.mark.parametrize("suffix", ["zarr", "h5"])
def test_interrupted_labelled_build_resumes_byte_identical(
    tmp_path: Path, suffix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    src, masks = mask_tree(tmp_path)
    out, ref = tmp_path / f"out.{suffix}", tmp_path / f"ref.{suffix}"
    kw: dict[str, Any] = {"labels": f"masks:{masks}", "shard_bytes": SHARD, "jobs": 1, "quiet": True}
    interrupt_build(monkeypatch, 2, lambda: dlpack.build(src, out, **kw))
    journal = tmp_path / f".out.{suffix}.dlpack-journal"
    lines = [json.loads(x) for x in journal.read_text().splitlines()]
    blocks = [x for x in lines if "start" in x]
    assert len(blocks) == 2 and all(len(s) == 8 and s[7]["mask_crc"] is not None for s in blocks[0]["samples"])
    result = dlpack.build(src, out, **kw)
    assert result.resume == "resumed: 2 of 4 blocks already written"
    dlpack.build(src, ref, **kw)
    assert files(out) == files(ref)
    with dlpack.open(out) as a, dlpack.open(ref) as b:
        for i in range(N):
            np.testing.assert_array_equal(a[i]["mask"], b[i]["mask"])
            np.testing.assert_array_equal(a[i]["image"], b[i]["image"])


def test_resume_rewrites_a_block_whose_mask_was_damaged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src, masks = mask_tree(tmp_path)
    out = tmp_path / "out.zarr"
    kw: dict[str, Any] = {"labels": f"masks:{masks}", "shard_bytes": SHARD, "jobs": 1, "quiet": True}
    interrupt_build(monkeypatch, 2, lambda: dlpack.build(src, out, **kw))
    shard = tmp_path / ".out.zarr.dlpack-partial" / "mask" / "c" / "1" / "0" / "0"
    data = bytearray(shard.read_bytes())
    data[10] ^= 0xFF
    shard.write_bytes(bytes(data))
    result = dlpack.build(src, out, **kw)
    assert result.resume == "resumed: 1 of 4 blocks already written"
    with dlpack.open(out) as ds:
        want = cv2.imread(str(masks / "005.png"), cv2.IMREAD_UNCHANGED)
        np.testing.assert_array_equal(ds[5]["mask"], want)


def test_a_changed_label_plan_starts_over(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src, ann = coco_tree(tmp_path)
    out = tmp_path / "out.zarr"
    interrupt_build(
        monkeypatch, 1, lambda: dlpack.build(src, out, labels=f"coco:{ann}", shard_bytes=SHARD, jobs=1, quiet=True)
    )
    doc = json.loads(ann.read_text())
    doc["annotations"][0]["segmentation"] = [[0, 2, 10, 2, 10, 8]]  # now the store gets a mask
    ann.write_text(json.dumps(doc))
    result = dlpack.build(src, out, labels=f"coco:{ann}", shard_bytes=SHARD, jobs=1, quiet=True)
    assert result.resume == "started over: the plan changed (labels, source)"
    with dlpack.open(out) as ds:
        assert ds[0]["mask"][2:8, 0:10].any() and not ds[1]["mask"].any()


@pytest.mark.parametrize("suffix", ["zarr", "h5"])
def test_update_replaces_a_sample_whose_annotation_changed(tmp_path: Path, suffix: str) -> None:
    src, ann = coco_tree(tmp_path)
    out = tmp_path / f"out.{suffix}"
    kw: dict[str, Any] = {"shard_bytes": SHARD, "jobs": 1, "quiet": True}
    dlpack.build(src, out, labels=f"coco:{ann}", **kw)
    doc = json.loads(ann.read_text())
    doc["annotations"][7]["bbox"] = [30, 30, 4, 4]
    ann.write_text(json.dumps(doc))
    # The update reads the label source the store was built with: no --labels needed.
    result = dlpack.build(src, out, update=True, **kw)
    written = "1 of 4" if suffix == "zarr" else "4 of 4"  # an HDF5 file is rewritten whole
    assert f"0 added, 1 replaced, 0 removed; {written} blocks written" in result.update
    with dlpack.open(out) as ds:
        np.testing.assert_array_equal(ds[7]["boxes"], np.array([[30, 30, 34, 34]], np.float32))
        np.testing.assert_array_equal(ds[6]["boxes"], np.array([[6, 2, 16, 8]], np.float32))
        assert ds[7]["box_labels"].tolist() == [0]
    again = dlpack.build(src, out, update=True, **kw)
    assert again.update == "up to date: nothing to do"


def test_update_replaces_a_sample_whose_label_image_changed_and_shares_the_rest(tmp_path: Path) -> None:
    src, masks = mask_tree(tmp_path)
    out = tmp_path / "out.zarr"
    kw: dict[str, Any] = {"shard_bytes": SHARD, "jobs": 1, "quiet": True}
    dlpack.build(src, out, labels=f"masks:{masks}", **kw)
    before = (out / "mask" / "c" / "0" / "0" / "0").stat().st_ino
    m = np.zeros((SIDE, SIDE), np.uint8)
    m[40:50, 40:50] = 2
    cv2.imwrite(str(masks / "012.png"), m)
    result = dlpack.build(src, out, labels=f"masks:{masks}", update=True, **kw)
    assert "1 replaced" in result.update and "1 of 4 blocks written" in result.update
    assert (out / "mask" / "c" / "0" / "0" / "0").stat().st_ino == before  # an unchanged mask shard is shared
    with dlpack.open(out) as ds:
        assert ds.manifest.mask_classes == ((0, "background"), (1, "x"), (2, "y"))
        np.testing.assert_array_equal(ds[12]["mask"], m)
        np.testing.assert_array_equal(ds[11]["mask"], cv2.imread(str(masks / "011.png"), cv2.IMREAD_UNCHANGED))


def test_update_appends_classes_and_their_ids(tmp_path: Path) -> None:
    src, ann = coco_tree(tmp_path, n=3)
    out = tmp_path / "out.zarr"
    dlpack.build(src, out, labels=f"coco:{ann}", jobs=1, quiet=True)
    _png(src / "new.png", 50)
    doc = json.loads(ann.read_text())
    doc["categories"].insert(0, {"id": 1, "name": "first"})
    doc["images"].append({"id": 99, "file_name": "new.png", "width": SIDE, "height": SIDE})
    doc["annotations"].append({"id": 999, "image_id": 99, "category_id": 1, "bbox": [1, 1, 5, 5]})
    ann.write_text(json.dumps(doc))
    dlpack.build(src, out, update=True, jobs=1, quiet=True)
    with dlpack.open(out) as ds:
        assert ds.manifest.classes == ("a", "b", "first") and ds.manifest.class_ids == (3, 7, 1)
        assert ds[3]["box_labels"].tolist() == [2] and ds[0]["box_labels"].tolist() == [1]


def test_update_refuses_other_label_options(tmp_path: Path) -> None:
    src, ann = coco_tree(tmp_path, n=2)
    out = tmp_path / "out.zarr"
    dlpack.build(src, out, labels=f"coco:{ann}", jobs=1, quiet=True)
    with pytest.raises(OptionError, match="keeps the labels"):
        dlpack.build(src, out, labels="none", update=True, quiet=True)


def test_update_of_a_classification_store_with_label_sources_is_refused(tmp_path: Path) -> None:
    src, ann = coco_tree(tmp_path, n=2)
    out = tmp_path / "out.zarr"
    dlpack.build(src, out, labels="none", jobs=1, quiet=True)
    with pytest.raises((SourceError, OptionError)):
        dlpack.build(src, out, labels=f"coco:{ann}", update=True, quiet=True)


def test_format_dldataset_builds_through_a_hidden_store(tmp_path: Path) -> None:
    src, ann = coco_tree(tmp_path, n=3)
    out = tmp_path / "dl"
    result = dlpack.build(src, out, labels=f"coco:{ann}", format="dldataset", jobs=1, quiet=True)
    assert result.path == out and (out / "dataset.json").is_file()
    doc = json.loads((out / "dataset.json").read_text())
    assert len(doc["samples"]) == 3 and doc["class_ids"] == [3, 7]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ann.json", "dl", "images"]


def test_format_dldataset_that_fails_leaves_no_output(tmp_path: Path) -> None:
    src, masks = mask_tree(tmp_path, n=2)
    cv2.imwrite(str(masks / "001.png"), np.zeros((3, 3), np.uint8))
    with pytest.raises(BadInputsError):
        dlpack.build(src, tmp_path / "dl", labels=f"masks:{masks}", format="dldataset", jobs=1, quiet=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["images", "masks"]


def test_cli_bad_label_input_exits_2_naming_the_entry(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from dlpack.cli import main

    src, ann = coco_tree(tmp_path, n=2)
    doc = json.loads(ann.read_text())
    doc["annotations"][1]["bbox"] = [1, 1, 0, 5]
    ann.write_text(json.dumps(doc))
    code = main(["build", str(src), str(tmp_path / "o.zarr"), "--labels", f"coco:{ann}", "--jobs", "1", "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "001.png" in err and "annotation id 101" in err
    assert not (tmp_path / "o.zarr").exists()
