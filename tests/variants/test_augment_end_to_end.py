"""From a config in examples/ to a training loader: build --augment through the CLI, read the variants
and their records, serve a cached-views epoch, draw a preview; the albumentations engine for any --jobs."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from _augment import content

import dlpack
import dlpack.cli
from dlpack import schema
from dlpack.sample import make_sample
from dlpack.variants import preview as P

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
CONFIGS = ["augment_halcon.json", "augment_albumentations.json", "augment_albumentations.yaml"]
K, SIDE, N = 3, 64, 12
#: Keys of a HALCON-style config that are settings, not operations.
HALCON_SETTINGS = {"augmentation_percentage", "min_area", "min_visibility", "allow_crop_with_labels"}


@pytest.fixture(scope="module")
def labelled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """12 images of the built-in sample with their COCO boxes (``images/``, ``annotations.json``)."""
    return make_sample(tmp_path_factory.mktemp("e2e") / "sample", N, size=128, seed=0, labels=True)


def _build(sample: Path, out: Path, config: str, *extra: str) -> None:
    argv = ["build", str(sample / "images"), str(out), "--labels", f"coco:{sample / 'annotations.json'}"]
    argv += ["--size", f"{SIDE}x{SIDE}", "--augment", str(K), "--augment-config", str(EXAMPLES / config)]
    assert dlpack.cli.main([*argv, "--quiet", *extra]) == 0


def _albumentations_names(node: Mapping[str, Any]) -> Iterator[str]:
    name = str(node.get("__class_fullname__", ""))
    if name not in ("Compose", "OneOf"):
        yield name.rsplit(".", 1)[-1]
    for child in node.get("transforms", ()):
        yield from _albumentations_names(child)


def _operations(config: str) -> set[str]:
    """The operation names a variant of this example config may record."""
    text = (EXAMPLES / config).read_text(encoding="utf-8")
    if config.endswith(".yaml"):
        import yaml

        doc = yaml.safe_load(text)
    else:
        doc = json.loads(text)
    if "transform" in doc:
        return set(_albumentations_names(doc["transform"]))
    return set(doc) - HALCON_SETTINGS


@pytest.mark.parametrize("config", CONFIGS)
def test_a_config_becomes_variants_a_loader_epoch_and_a_preview(
    config: str, labelled: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if config.endswith(".yaml"):
        pytest.importorskip("yaml")
    store = tmp_path / "aug.zarr"
    _build(labelled, store, config, "--jobs", "1")
    allowed = _operations(config)
    with dlpack.open(store) as ds:
        assert (len(ds), ds.variants, ds.task) == (N, K, "detection")
        record = ds.manifest.augment
        assert record is not None and (record["k"], record["seed"], record["engine"]) == (K, 0, "dlpack")
        assert record["config"]["text"] == (EXAMPLES / config).read_text(encoding="utf-8")
        assert record["config"]["name"] == config
        applied: set[str] = set()
        changed = 0
        for i in range(N):
            original = ds[i]
            assert ds.augmentation(i, 0) == []
            for v in range(1, K + 1):
                view = ds.variant(i, v)
                assert view["variant"] == v and view["image"].shape == original["image"].shape
                boxes = np.asarray(view["boxes"]).reshape(-1, 4)
                assert len(boxes) == len(view["box_labels"]) == len(view["box_crowd"])
                assert ((boxes >= 0) & (boxes <= SIDE)).all() and (boxes[:, :2] < boxes[:, 2:]).all()
                assert set(np.asarray(view["box_labels"]).tolist()) <= set(np.asarray(original["box_labels"]).tolist())
                ops = ds.augmentation(i, v)
                assert all(isinstance(op, dict) and "op" in op for op in ops)
                applied |= {op["op"] for op in ops}
                changed += not np.array_equal(view["image"], original["image"])
        assert applied and applied <= allowed, (applied, allowed)
        assert changed >= N  # most of the 36 variants differ from their original

        # One cycle of K + 1 epochs of cached views: every row is the stored view its batch names.
        loader = ds.loader(batch_size=5, seed=0, augment="cached")
        seen: dict[int, list[int]] = {i: [] for i in range(N)}
        for epoch in range(K + 1):
            loader.set_epoch(epoch)
            for batch in loader:
                for row, (i, v) in enumerate(zip(batch["index"].tolist(), batch["variant"].tolist(), strict=True)):
                    view = ds.variant(i, v)
                    np.testing.assert_array_equal(batch["image"][row], view["image"])
                    np.testing.assert_array_equal(np.asarray(batch["boxes"][row]).reshape(-1, 4), view["boxes"])
                    np.testing.assert_array_equal(np.asarray(batch["box_labels"][row]), view["box_labels"])
                    seen[i].append(v)
        assert all(sorted(views) == list(range(K + 1)) for views in seen.values())

    sheet = tmp_path / "preview.png"
    assert dlpack.cli.main(["preview", str(store), str(sheet), "--count", "4", "--tile", "64"]) == 0, (
        capsys.readouterr()
    )
    img = cv2.imread(str(sheet))
    assert img is not None
    assert img.shape == (P.HEADER + 4 * (64 + P.CAPTION + 2 * P.MARGIN), (K + 1) * (64 + 2 * P.MARGIN), 3)


@pytest.mark.slow
def test_the_albumentations_engine_gives_the_same_bytes_for_any_jobs(labelled: Path, tmp_path: Path) -> None:
    pytest.importorskip("albumentations")
    stores = []
    for jobs in ("1", "2"):
        out = tmp_path / f"jobs{jobs}.zarr"
        _build(labelled, out, "augment_albumentations.json", "--augment-engine", "albumentations", "--jobs", jobs)
        stores.append(content(out))
    one, two = stores
    names = [n for n in one["arrays"] if schema.variant_of(n) is not None]
    assert {f"images_v{v}" for v in range(1, K + 1)} <= set(names)
    assert names == [n for n in two["arrays"] if schema.variant_of(n) is not None]
    for name in names:
        assert one["arrays"][name] == two["arrays"][name], name
    assert one["manifest"]["augment"] == two["manifest"]["augment"]
    assert one["manifest"]["augment"]["engine"] == "albumentations"
    with dlpack.open(tmp_path / "jobs1.zarr") as ds:
        records = [ds.augmentation(i, v) for i in range(N) for v in range(1, K + 1)]
        assert all(r and r[0]["op"] == "albumentations" and isinstance(r[0]["seed"], int) for r in records)
        assert len({r[0]["seed"] for r in records}) == len(records)  # a seed of its own per (i, v)
        # The engine really augmented: some variants differ from their originals.
        assert any(not np.array_equal(ds.variant(i, 1)["image"], ds[i]["image"]) for i in range(N))


def test_relative_store_paths_work_after_the_working_folder_changes(
    labelled: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pool's worker processes outlive a call, in the folder they started in: a second build of
    a relative ``aug.zarr`` elsewhere must not read or write the first one."""
    for name, side in (("first", 48), ("second", 40)):
        folder = tmp_path / name
        folder.mkdir()
        monkeypatch.chdir(folder)
        argv = ["build", str(labelled / "images"), "aug.zarr", "--labels", f"coco:{labelled / 'annotations.json'}"]
        argv += ["--size", f"{side}x{side}", "--augment", "2", "--augment-config", str(EXAMPLES / CONFIGS[0])]
        assert dlpack.cli.main([*argv, "--jobs", "2", "--quiet"]) == 0
        with dlpack.open("aug.zarr") as ds:
            assert ds.variants == 2 and ds.variant(0, 1)["image"].shape == (side, side, 3)
