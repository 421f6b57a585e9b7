"""``dlpack bench`` on a store on object storage (the loopback S3 server): no page cache applies, so
the report says remote; cold runs start with an empty shard cache, warm runs after one epoch filled it."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

import dlpack
from dlpack.storage.location import Location
from dlpack.storage.objects import storage_for

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("dlpack.storage.remote") is None, reason="needs the object-store reader"
)

N = 48


def uploaded(s3: Any, tmp_path: Path) -> str:
    """A small store of several shards, built locally and copied object by object to the bucket."""
    rng = np.random.default_rng(0)
    for i in range(N):
        d = tmp_path / "png" / f"c{i % 2}"
        d.mkdir(parents=True, exist_ok=True)
        assert cv2.imwrite(str(d / f"{i:02d}.png"), rng.integers(0, 256, (32, 32, 3), dtype=np.uint8))
    store = tmp_path / "s.zarr"
    dlpack.build(tmp_path / "png", store, size=(32, 32), jobs=1, quiet=True, shard_bytes=2**16)
    url = s3.url("s.zarr")
    storage = storage_for(Location.parse(url))
    for f in sorted(p for p in store.rglob("*") if p.is_file()):
        storage.put(f.relative_to(store).as_posix(), f.read_bytes())
    return str(url)


def test_bench_on_a_url_reports_remote_and_reads_every_cell(s3: Any, tmp_path: Path) -> None:
    url = uploaded(s3, tmp_path)
    report = dlpack.run_bench([url], caches="cold,warm", orders="sequential,block", repeat=1, quiet=True)
    (target,) = report.targets
    assert target["remote"] and target["path"] == url and target["count"] == N and target["files"] == 0
    assert {(c.cache, c.order) for c in report.cells} == {
        (cache, order) for cache in ("cold", "warm") for order in ("sequential", "block")
    }
    for c in report.cells:
        assert c.images >= N and c.images_per_s > 0
        assert c.eviction_verified if c.cache == "cold" else c.resident_at_start is None
    assert any("remote (object storage)" in n for n in report.notes)
    assert "cold*" not in report.table()  # a cold run on a fresh reader is cold by construction
