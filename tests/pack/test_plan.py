"""The build plan: a frozen value, recorded in the manifest, equal to what the build used."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import dlpack
from dlpack.errors import StoreError
from dlpack.manifest import ImageSpec, Manifest
from dlpack.pack import BuildPlan
from dlpack.sources import TargetSpec

MakeTree = Callable[..., Path]

PLAN = BuildPlan(
    target=TargetSpec(mode="fit", size=(64, 48), channels=3, dtype="|u1", max_pixels=2**20),
    image=ImageSpec("fixed", 3, "|u1", 48, 64),
    backend="zarr",
    compression="lz4",
    shard_bytes=2**16,
    shard_rows=7,
    count=20,
    order="ab" * 32,
    source="cd" * 32,
)


def test_plan_round_trips_through_the_manifest_json() -> None:
    manifest = Manifest(count=20, image=PLAN.image, backend="zarr", plan=PLAN.to_dict())
    again = Manifest.from_json(manifest.to_json())
    assert again == manifest
    assert BuildPlan.from_dict(again.plan) == PLAN
    assert BuildPlan.from_dict(again.plan).fingerprint() == PLAN.fingerprint()


@pytest.mark.parametrize(
    "change",
    [
        {"count": 21},
        {"order": "ef" * 32},
        {"source": "ef" * 32},
        {"shard_rows": 8},
        {"compression": "none"},
        {"target": replace(PLAN.target, allow_upscale=True)},
    ],
)
def test_any_change_changes_the_fingerprint(change: dict[str, Any]) -> None:
    assert replace(PLAN, **change).fingerprint() != PLAN.fingerprint()


def test_fingerprint_is_a_stable_digest_of_the_canonical_json() -> None:
    text = json.dumps(PLAN.to_dict(), sort_keys=True, separators=(",", ":"))
    assert PLAN.fingerprint() == hashlib.sha256(text.encode()).hexdigest()


def test_target_and_image_must_agree() -> None:
    with pytest.raises(ValueError, match="stored image is 1 channels"):
        replace(PLAN, image=ImageSpec("fixed", 1, "|u1", 48, 64))


@pytest.mark.parametrize(
    "broken", [{}, {**PLAN.to_dict(), "image": {"layout": "fixed"}}, {**PLAN.to_dict(), "count": None}]
)
def test_malformed_recorded_plan_is_a_store_error(broken: dict[str, Any]) -> None:
    d = {k: v for k, v in broken.items() if v is not None}
    with pytest.raises(StoreError, match="recorded build plan is malformed"):
        BuildPlan.from_dict(d)


def test_recorded_plan_is_the_plan_the_build_used(make_tree: MakeTree, tmp_path: Path, backend: str) -> None:
    src = make_tree({f"c{k % 2}/{k:02d}.png": ("rgb", 40, 30) for k in range(9)})
    out = tmp_path / backend
    result = dlpack.build(src, out, size=(20, 16), shard_bytes=2**16, quiet=True, jobs=1)
    assert result.plan is not None
    with dlpack.open(out) as ds:
        recorded = BuildPlan.from_dict(ds.manifest.plan)
        sources = [ds[i]["source"] for i in range(len(ds))]
        image = ds.manifest.image
    assert recorded == result.plan
    assert recorded.image == image == ImageSpec("fixed", 3, "|u1", 16, 20)
    assert recorded.target == TargetSpec(mode="stretch", size=(20, 16), channels=3, dtype="|u1")
    assert recorded.count == len(sources) == 9
    order = json.dumps(sources, separators=(",", ":"))
    assert recorded.order == hashlib.sha256(order.encode()).hexdigest()
    assert recorded.backend == ("zarr" if backend.endswith(".zarr") else "hdf5")
    # 64 KiB shards of 20x16x3 bytes hold 68 images: every image fits in one.
    assert recorded.shard_rows == 9
    if backend.endswith(".zarr"):
        meta = json.loads((out / "images" / "zarr.json").read_text())
        assert meta["chunk_grid"]["configuration"]["chunk_shape"][0] == recorded.shard_rows


def test_plan_after_skipping_damaged_data_is_the_clean_builds(make_tree: MakeTree, tmp_path: Path, images: Any) -> None:
    good = {"a/0.png": "rgb", "a/1.png": "rgb"}
    damaged = bytearray(images.encode(".png", images.pixels("gray", 20, 20, seed=7)))
    start = damaged.find(b"IDAT") + 6
    damaged[start : start + 20] = bytes(b ^ 0x55 for b in damaged[start : start + 20])
    skip = dlpack.build(
        make_tree({**good, "a/2.png": bytes(damaged)}), tmp_path / "s.zarr", on_error="skip", quiet=True, jobs=1
    )
    clean = dlpack.build(make_tree(good, "clean"), tmp_path / "c.zarr", quiet=True, jobs=1)
    assert skip.plan is not None and clean.plan is not None
    # The same samples under the same plan; only the source listing (which names the damaged file) differs.
    assert replace(skip.plan, source="") == replace(clean.plan, source="")
    assert skip.plan.source != clean.plan.source


def test_source_fingerprint_follows_labels_and_file_sizes(make_tree: MakeTree, tmp_path: Path) -> None:
    src = make_tree({"a/0.png": "rgb", "b/1.png": "rgb"})
    first = dlpack.build(src, tmp_path / "1.zarr", quiet=True, jobs=1).plan
    unlabelled = dlpack.build(src, tmp_path / "2.zarr", labels="none", quiet=True, jobs=1).plan
    (src / "b/1.png").write_bytes((src / "b/1.png").read_bytes() + b"\0")
    grown = dlpack.build(src, tmp_path / "3.zarr", quiet=True, jobs=1).plan
    assert first is not None and unlabelled is not None and grown is not None
    assert len({first.source, unlabelled.source, grown.source}) == 3
    assert first.order == unlabelled.order == grown.order
