"""Label sources read from a bucket: the same trees as the local label tests, uploaded to the loopback
S3 server, build the same store (images, labels, boxes, masks, classes) as the local folder, and a
damaged label file in the bucket is named as the local one is (with its URL instead of its path).

The trees are the hand-made ones of tests/pack/test_labelled_builds.py (40 x 20 images, stored 20 x 20).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _s3 import skip_without_s3, upload

import dlpack
from dlpack.cli import main
from dlpack.errors import DlpackError, OptionError
from dlpack.halcon.source import DLDatasetSource
from dlpack.options import BuildOptions
from dlpack.sources import CocoSource
from dlpack.sources.anomaly import AnomalyFolderSource
from dlpack.sources.csv import CsvSource
from dlpack.sources.labels_kind import label_source
from dlpack.sources.masks import MaskFolderSource

skip_without_s3()
pytestmark = pytest.mark.filterwarnings(
    "ignore:__array__ implementation doesn't accept a copy keyword:DeprecationWarning"
)


def _trees() -> Any:
    """The tree writers of the labelled-build tests (one definition of each test tree)."""
    path = Path(__file__).parent.parent / "pack" / "test_labelled_builds.py"
    spec = importlib.util.spec_from_file_location("_labelled_trees", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("_labelled_trees", module)
    spec.loader.exec_module(module)
    return module


T = _trees()


def _samples(out: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Every sample's arrays by source path, and the store's class names, ids and task."""
    ds = dlpack.open(out)
    try:
        samples = {
            ds[i]["source"]: {k: np.asarray(v) for k, v in ds[i].items() if k != "index"} for i in range(len(ds))
        }
        return samples, {"classes": ds.classes, "class_ids": ds.class_ids, "task": ds.task}
    finally:
        ds.close()


def _same_store(local: Path, bucket: Path) -> None:
    a, meta_a = _samples(local)
    b, meta_b = _samples(bucket)
    assert meta_a == meta_b
    assert sorted(a) == sorted(b) and a
    for rel in a:
        assert sorted(a[rel]) == sorted(b[rel]), rel
        for key in a[rel]:
            np.testing.assert_array_equal(a[rel][key], b[rel][key], err_msg=f"{rel}: {key}")


def _build(source: Any, out: Path) -> Path:
    dlpack.build(source, out, jobs=1, quiet=True, size=(20, 20), shard_bytes=65536)
    return out


def _error(source: Any, out: Path) -> str:
    with pytest.raises(DlpackError) as info:
        _build(source, out)
    return str(info.value)


def test_coco_from_a_bucket_builds_the_local_store(s3: Any, tmp_path: Path) -> None:
    images, ann = T.coco_source(tmp_path)
    upload(images.parent, s3.url("coco"))
    local = _build(CocoSource(images, ann), tmp_path / "local.zarr")
    remote = _build(CocoSource(s3.url("coco/images"), s3.url("coco/annotations.json")), tmp_path / "bucket.zarr")
    _same_store(local, remote)
    assert _samples(remote)[0]["a.png"]["mask"].any()  # the segmentations were painted


def test_a_damaged_coco_file_in_a_bucket_is_named_as_the_local_one(s3: Any, tmp_path: Path) -> None:
    images, ann = T.coco_source(tmp_path, '{"images": [], "annotations": [}')
    upload(images.parent, s3.url("coco"))
    local = _error(CocoSource(images, ann), tmp_path / "local.zarr")
    url = s3.url("coco/annotations.json")
    remote = _error(CocoSource(s3.url("coco/images"), url), tmp_path / "bucket.zarr")
    assert remote == local.replace(str(ann), url) and url in remote and "line 1" in remote


def test_csv_from_a_bucket_builds_the_local_store(s3: Any, tmp_path: Path) -> None:
    images, table = T.csv_source(tmp_path)
    upload(images.parent, s3.url("csv"))
    local = _build(CsvSource(images, table), tmp_path / "local.zarr")
    remote = _build(CsvSource(s3.url("csv/img"), s3.url("csv/labels.csv")), tmp_path / "bucket.zarr")
    _same_store(local, remote)


def test_a_csv_row_naming_a_missing_object_is_named_as_the_local_one(s3: Any, tmp_path: Path) -> None:
    images, table = T.csv_source(tmp_path, "gone.png,cat,train\n")
    upload(images.parent, s3.url("csv"))
    local = _error(CsvSource(images, table), tmp_path / "local.zarr")
    url = s3.url("csv/labels.csv")
    remote = _error(CsvSource(s3.url("csv/img"), url), tmp_path / "bucket.zarr")
    assert "gone.png" in remote and "line 5" in remote and url in remote
    assert remote.replace(url, str(table)).replace(s3.url("csv/img"), str(images)) == local


def test_a_dldataset_in_a_bucket_builds_the_local_store(s3: Any, tmp_path: Path) -> None:
    path = T.dldataset_source(tmp_path)
    upload(path.parent, s3.url("dl"))
    local = _build(DLDatasetSource(path), tmp_path / "local.zarr")
    remote = _build(DLDatasetSource(s3.url("dl")), tmp_path / "bucket.zarr")  # the prefix holding dataset.json
    _same_store(local, remote)


def test_labels_auto_reads_a_bucket_prefix_holding_a_dldataset_as_that_dataset(s3: Any, tmp_path: Path) -> None:
    # As a local folder holding dataset.json (or the file itself) with the default labels="auto" is.
    path = T.dldataset_source(tmp_path)
    upload(path.parent, s3.url("dl"))
    local = _build(path.parent, tmp_path / "local.zarr")
    assert dlpack.open(local).classes  # read as the dataset: its classes, not as a folder of images
    _same_store(local, _build(s3.url("dl"), tmp_path / "prefix.zarr"))
    _same_store(local, _build(s3.url("dl/dataset.json"), tmp_path / "json.zarr"))
    argv = ["build", s3.url("dl"), str(tmp_path / "cli.zarr"), "--size", "20x20", "--jobs", "1", "--quiet"]
    assert main(argv) == 0
    _same_store(local, tmp_path / "cli.zarr")


def test_a_damaged_dldataset_in_a_bucket_is_named_as_the_local_one(s3: Any, tmp_path: Path) -> None:
    doc = T.dldataset_doc()
    doc["class_ids"] = [3]  # two names, one id
    path = T.dldataset_source(tmp_path, doc)
    upload(path.parent, s3.url("dl"))
    local = _error(DLDatasetSource(path), tmp_path / "local.zarr")
    url = s3.url("dl/dataset.json")
    remote = _error(DLDatasetSource(url), tmp_path / "bucket.zarr")
    assert remote == local.replace(str(path), url) and "2 class_names but 1 class_ids" in remote


def test_label_source_reads_url_label_files_with_the_builds_storage_options(s3: Any, tmp_path: Path) -> None:
    images, ann = T.coco_source(tmp_path)
    upload(images.parent, s3.url("coco"))
    opts = BuildOptions(labels="coco:" + s3.url("coco/annotations.json"))
    source = label_source(s3.url("coco/images"), opts)
    assert isinstance(source, CocoSource) and source.root == s3.url("coco/images")  # not the folder "s3:/..."
    assert [it.rel for it in source.scan().items] == ["a.png", "b.png", "c.png"]
    bad = BuildOptions(labels="coco:" + s3.url("coco/annotations.json"), storage_options={"regoin": "x"})
    with pytest.raises(OptionError, match="regoin"):
        label_source(s3.url("coco/images"), bad).scan()


def test_a_missing_annotation_object_is_named(s3: Any, tmp_path: Path) -> None:
    images, _ = T.coco_source(tmp_path)
    upload(images.parent, s3.url("coco"))
    url = s3.url("coco/nothing.json")
    message = _error(CocoSource(s3.url("coco/images"), url), tmp_path / "bucket.zarr")
    assert message == f"COCO annotation file {url!r} does not exist"
    assert json.dumps(url)  # the URL, never a mangled local path
    assert not (tmp_path / "bucket.zarr").exists()


def _segmentation_dldataset(tmp_path: Path) -> Path:
    """The mask tree of the labelled-build tests as a segmentation DLDataset: ``seg/dataset.json``."""
    images, masks = T.mask_source(tmp_path)
    doc = {
        "image_dir": "images",
        "segmentation_dir": "masks",
        "class_names": list(T.MASK_CLASSES),
        "class_ids": [0, 1, 2],
        "samples": [
            {"image_id": 1, "image_file_name": "a.png", "segmentation_file_name": "a.png"},
            {"image_id": 2, "image_file_name": "sub/b.png", "segmentation_file_name": "sub/b.png"},
        ],
    }
    path = images.parent / "dataset.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def test_a_segmentation_dldataset_reads_its_label_images_from_the_bucket(s3: Any, tmp_path: Path) -> None:
    path = _segmentation_dldataset(tmp_path)
    upload(path.parent, s3.url("seg"))
    local = _build(DLDatasetSource(path), tmp_path / "local.zarr")
    remote = _build(DLDatasetSource(s3.url("seg/dataset.json")), tmp_path / "bucket.zarr")
    _same_store(local, remote)
    assert (_samples(remote)[0]["a.png"]["mask"] == 2).any()


def test_a_damaged_label_image_in_the_bucket_is_named_as_the_local_one(s3: Any, tmp_path: Path) -> None:
    path = _segmentation_dldataset(tmp_path)
    mask = path.parent / "masks" / "a.png"
    mask.write_bytes(mask.read_bytes()[:40])  # cut inside the PNG
    upload(path.parent, s3.url("seg"))
    local = _error(DLDatasetSource(path), tmp_path / "local.zarr")
    remote = _error(DLDatasetSource(s3.url("seg/dataset.json")), tmp_path / "bucket.zarr")
    assert "mask 'a.png' is unreadable: truncated PNG" in local
    assert remote == local.replace(str(path.parent / "images"), s3.url("seg/images"))


def test_a_missing_label_object_is_named_as_the_local_file(s3: Any, tmp_path: Path) -> None:
    path = _segmentation_dldataset(tmp_path)
    (path.parent / "masks" / "a.png").unlink()
    upload(path.parent, s3.url("seg"))
    local = DLDatasetSource(path).scan().errors
    remote = DLDatasetSource(s3.url("seg/dataset.json")).scan().errors
    assert [e.path for e in local] == [e.path for e in remote] == ["a.png"]
    url = s3.url("seg/masks/a.png")
    assert str(remote[0]) == str(local[0]).replace(str(path.parent / "masks" / "a.png"), url) and url in str(remote[0])


def test_a_mask_folder_in_a_bucket_builds_the_local_store(s3: Any, tmp_path: Path) -> None:
    images, masks = T.mask_source(tmp_path)
    upload(images.parent, s3.url("seg"))
    local = _build(MaskFolderSource(images, masks), tmp_path / "local.zarr")
    remote = _build(MaskFolderSource(s3.url("seg/images"), s3.url("seg/masks")), tmp_path / "bucket.zarr")
    _same_store(local, remote)
    assert _samples(remote)[1]["classes"] == T.MASK_CLASSES  # classes.txt read from the bucket


def test_a_mask_folder_inside_the_bucket_image_prefix_is_left_out_of_the_images(s3: Any, tmp_path: Path) -> None:
    images, masks = T.mask_source(tmp_path)
    masks.rename(images / "labels")  # a label folder inside the image folder: its images are labels
    upload(images, s3.url("seg"))
    local = MaskFolderSource(images, images / "labels").scan()
    remote = MaskFolderSource(s3.url("seg"), s3.url("seg/labels")).scan()
    assert [(i.rel, i.annotations) for i in remote.items] == [(i.rel, i.annotations) for i in local.items]
    assert [i.rel for i in remote.items] == ["a.png", "sub/b.png"] and remote.classes == T.MASK_CLASSES


def test_a_damaged_class_list_in_the_bucket_is_named_as_the_local_one(s3: Any, tmp_path: Path) -> None:
    images, masks = T.mask_source(tmp_path)
    (masks / "classes.txt").write_text("background\n\nscratch\n", encoding="utf-8")
    upload(images.parent, s3.url("seg"))
    local = _error(MaskFolderSource(images, masks), tmp_path / "local.zarr")
    remote = _error(MaskFolderSource(s3.url("seg/images"), s3.url("seg/masks")), tmp_path / "bucket.zarr")
    assert "line 2 is empty" in local and remote == local.replace(str(masks), s3.url("seg/masks"))


def test_an_anomaly_folder_in_a_bucket_builds_the_local_store(s3: Any, tmp_path: Path) -> None:
    images, truth = T.anomaly_source(tmp_path)
    upload(images.parent, s3.url("an"))
    local = _build(AnomalyFolderSource(images, truth), tmp_path / "local.zarr")
    remote = _build(AnomalyFolderSource(s3.url("an/images"), s3.url("an/ground_truth")), tmp_path / "bucket.zarr")
    _same_store(local, remote)
    assert _samples(remote)[0]["test/crack/c1.png"]["mask"].any()  # the ground truth, read from the bucket


def test_a_damaged_ground_truth_object_is_named_as_the_local_file(s3: Any, tmp_path: Path) -> None:
    images, truth = T.anomaly_source(tmp_path)
    gt = truth / "crack" / "c1_mask.png"
    gt.write_bytes(b"not a png at all")
    upload(images.parent, s3.url("an"))
    local = _error(AnomalyFolderSource(images, truth), tmp_path / "local.zarr")
    remote = _error(AnomalyFolderSource(s3.url("an/images"), s3.url("an/ground_truth")), tmp_path / "bucket.zarr")
    assert "ground-truth image 'crack/c1_mask.png' is unreadable" in local
    assert remote == local.replace(str(images), s3.url("an/images"))


def test_label_source_reads_a_bucket_mask_folder_and_anomaly_ground_truth(s3: Any, tmp_path: Path) -> None:
    images, masks = T.mask_source(tmp_path)
    upload(images.parent, s3.url("seg"))
    scan = label_source(s3.url("seg/images"), BuildOptions(labels="masks:" + s3.url("seg/masks"))).scan()
    assert scan.label_root == s3.url("seg/masks") and [i.rel for i in scan.items] == ["a.png", "sub/b.png"]
    images, truth = T.anomaly_source(tmp_path)
    upload(images.parent, s3.url("an"))
    opts = BuildOptions(labels="anomaly", anomaly_masks=s3.url("an/ground_truth"))
    scan = label_source(s3.url("an/images"), opts).scan()
    assert [i.annotations for i in scan.items if i.label == "nok"] == [
        {"defect": "crack", "anomaly_mask": "crack/c1_mask.png"}
    ]


@pytest.mark.parametrize("kind", ["coco", "csv", "masks", "anomaly", "dldataset"])
def test_dlpack_build_of_a_bucket_with_label_urls_equals_the_local_build(s3: Any, tmp_path: Path, kind: str) -> None:
    """``dlpack build s3://.../images OUT --labels KIND:s3://...``: the CLI, each label kind."""
    if kind == "coco":
        images, ann = T.coco_source(tmp_path)
        top, local_args, url_args = images.parent, ["--labels", f"coco:{ann}"], ["--labels", "coco:{}/annotations.json"]
    elif kind == "csv":
        images, table = T.csv_source(tmp_path)
        top, local_args, url_args = images.parent, ["--labels", f"csv:{table}"], ["--labels", "csv:{}/labels.csv"]
    elif kind == "masks":
        images, masks = T.mask_source(tmp_path)
        top, local_args, url_args = images.parent, ["--labels", f"masks:{masks}"], ["--labels", "masks:{}/masks"]
    elif kind == "anomaly":
        images, truth = T.anomaly_source(tmp_path)
        top = images.parent
        local_args = ["--labels", "anomaly", "--anomaly-masks", str(truth)]
        url_args = ["--labels", "anomaly", "--anomaly-masks", "{}/ground_truth"]
    else:
        path = T.dldataset_source(tmp_path)
        images, top = path.parent / "images", path.parent
        local_args, url_args = ["--labels", f"dldataset:{path}"], ["--labels", "dldataset:{}/dataset.json"]
    upload(top, s3.url("t"))
    common = ["--quiet", "--jobs", "1", "--size", "20x20"]
    assert main(["build", str(images), str(tmp_path / "local.zarr"), *common, *local_args]) == 0
    src = s3.url("t/" + images.relative_to(top).as_posix())
    remote_args = [a.format(s3.url("t")) for a in url_args]
    assert main(["build", src, str(tmp_path / "bucket.zarr"), *common, *remote_args]) == 0
    _same_store(tmp_path / "local.zarr", tmp_path / "bucket.zarr")


def test_images_in_a_bucket_with_a_local_annotation_file_and_the_other_way_round(s3: Any, tmp_path: Path) -> None:
    images, ann = T.coco_source(tmp_path)
    upload(images.parent, s3.url("coco"))
    local = _build(CocoSource(images, ann), tmp_path / "local.zarr")
    _same_store(local, _build(CocoSource(s3.url("coco/images"), ann), tmp_path / "a.zarr"))
    _same_store(local, _build(CocoSource(images, s3.url("coco/annotations.json")), tmp_path / "b.zarr"))
