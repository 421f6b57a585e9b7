"""Reading a store on object storage: the same samples as the local store, an open that costs a
handful of requests, ETag pinning, verify of damaged shards, pickling, and the shard cache."""

from __future__ import annotations

import json
import os
import pickle
import time
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from _s3 import upload

import dlpack
from dlpack.errors import OptionError, StoreError
from dlpack.read.dataset import verify_store
from dlpack.storage.location import Location
from dlpack.storage.objects import storage_for
from dlpack.storage.remote import ObjectZarrReader
from dlpack.storage.shardcache import ShardCache

#: 96x96 RGB: 27,648 bytes, two images in a shard of the smallest shard_bytes (65,536).
SIDE = 96


def _source(root: Path, n: int, side: int = SIDE) -> Path:
    rng = np.random.default_rng(0)
    for i in range(n):
        folder = root / ("a" if i % 2 else "b")
        folder.mkdir(parents=True, exist_ok=True)
        cv2.imwrite(str(folder / f"{i:05d}.png"), rng.integers(0, 256, (side, side, 3), dtype=np.uint8))
    return root


def _store(tmp_path: Path, s3: Any, n: int = 9, name: str = "x.zarr", **kw: Any) -> tuple[Path, str]:
    local = tmp_path / name
    dlpack.build(_source(tmp_path / "src", n), local, shard_bytes=2**16, jobs=1, **kw)
    url = s3.url(name)
    upload(local, url)
    return local, url


def _same(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], np.ndarray):
            np.testing.assert_array_equal(a[k], b[k])
        else:
            assert a[k] == b[k], k


def _shard_keys(url: str) -> list[str]:
    return sorted(i.key for i in storage_for(Location.parse(url)).list("images/c"))


def test_every_sample_equals_the_local_store(tmp_path: Path, s3: Any) -> None:
    local, url = _store(tmp_path, s3)
    assert len(_shard_keys(url)) == 5  # 9 images, 2 per shard
    with dlpack.open(local) as here, dlpack.open(url) as there:
        assert isinstance(there, dlpack.Dataset) and str(there.path) == url
        assert len(there) == len(here) == 9
        for i in range(len(here)):
            _same(here[i], there[i])
        idx = np.array([8, 0, 3, 4, 1], dtype=np.int64)
        _same(here.get_batch(idx), there.get_batch(idx))
        assert there.info()["bytes_on_disk"] == here.info()["bytes_on_disk"]
        assert there.verify() == []


def test_a_compressed_store_reads_its_shard_indexes_lazily(tmp_path: Path, s3: Any) -> None:
    local, url = _store(tmp_path, s3, compression="zstd")
    with dlpack.open(local) as here, dlpack.open(url, cache_bytes=0) as there:
        for i in (0, 5, 8):
            _same(here[i], there[i])
        assert there.verify() == []


def test_an_hdf5_url_is_refused_with_what_to_do() -> None:
    with pytest.raises(OptionError, match="HDF5 stores are local files; build a .zarr store"):
        dlpack.open("s3://some-bucket/x.h5")


def test_the_open_costs_a_handful_of_requests(tmp_path: Path, s3: Any) -> None:
    _local, url = _store(tmp_path, s3)
    reader = ObjectZarrReader(Location.parse(url))
    ds = dlpack.Dataset(url)
    requests = ds.reader.storage.requests  # type: ignore[attr-defined]
    # zarr.json, manifest.json, then labels: its zarr.json and its one shard (read whole).
    assert sum(requests.values()) <= 6, requests
    ds[3]
    assert requests["LIST"] == 0 and requests["HEAD"] == 0
    ds.close()
    reader.close()


@pytest.mark.slow
def test_the_open_of_a_store_of_2000_shards_costs_under_10_requests(tmp_path: Path, s3: Any) -> None:
    import shutil

    import zarr

    local = tmp_path / "many.zarr"
    dlpack.build(_source(tmp_path / "src", 2000, side=40), local, jobs=1, quiet=True)  # above the "small" 4 KiB
    # The images again, one per shard (below the writers' floor of 64 KiB a shard): the same bytes,
    # so the same digest the manifest lists.
    old = zarr.open_array(str(local / "images"), mode="r")
    data, attrs = old[:], dict(old.attrs)
    shutil.rmtree(local / "images")
    with zarr.config.set({"array.write_empty_chunks": True}):
        new = zarr.create_array(
            str(local / "images"), shape=data.shape, dtype=data.dtype, chunks=(1, 40, 40, 3), shards=(1, 40, 40, 3),
            compressors=None, fill_value=0, attributes=attrs, zarr_format=3,
        )  # fmt: skip
        new[:] = data
    url = s3.url("many.zarr")
    upload(local, url, threads=16)
    assert len(_shard_keys(url)) == 2000
    started = time.perf_counter()
    with dlpack.Dataset(url) as ds:
        requests = ds.reader.storage.requests  # type: ignore[attr-defined]
        assert sum(requests.values()) < 10, requests  # the open: group, manifest, the labels
        ds[1234]  # + the zarr.json and one range of each array a sample reads (images, sources)
        assert sum(requests.values()) <= 10 and requests["GET"] == sum(requests.values()), requests
    assert time.perf_counter() - started < 10


def test_a_shard_rewritten_after_open_is_a_changed_store(tmp_path: Path, s3: Any) -> None:
    _local, url = _store(tmp_path, s3)
    storage = storage_for(Location.parse(url))
    with dlpack.open(url, cache_bytes=0) as ds:
        first = ds[2]["image"]
        key = "images/c/1/0/0/0"
        data = bytearray(storage.get(key))
        storage.put(key, bytes(data))  # the same bytes, a new version (moto: a new ETag? MD5 alike)
        data[0] ^= 0xFF
        storage.put(key, bytes(data))
        with pytest.raises(StoreError, match="changed while it was open.*reopen it"):
            ds[3]
        with pytest.raises(StoreError, match="changed while it was open"):
            ds[2]
    with dlpack.open(url) as again:  # a reopen reads the new bytes
        assert not np.array_equal(again[2]["image"], first) or again[2]["image"].flat[0] != first.flat[0]


def test_a_deleted_shard_is_an_error_on_read_and_in_verify(tmp_path: Path, s3: Any) -> None:
    _local, url = _store(tmp_path, s3)
    storage = storage_for(Location.parse(url))
    storage.delete(["images/c/2/0/0/0"])
    with dlpack.open(url, cache_bytes=0) as ds:
        ds[0]
        with pytest.raises(StoreError, match=r"images/c/2/0/0/0 is missing"):
            ds[4]
    report = verify_store(url)
    assert not report.ok
    assert any("images/c/2/0/0/0" in reason for _, reason in report.damaged), report


def test_flipped_bytes_in_a_shard_are_reported_by_verify(tmp_path: Path, s3: Any) -> None:
    _local, url = _store(tmp_path, s3)
    storage = storage_for(Location.parse(url))
    key = "images/c/3/0/0/0"
    data = bytearray(storage.get(key))
    data[100] ^= 0xFF  # same size, wrong bytes (in the first image of shard 3: sample 6)
    storage.put(key, bytes(data))
    report = verify_store(url)
    assert not report.ok and [i for i, _ in report.mismatched] == [6]
    labels = "labels/c/0"
    raw = bytearray(storage.get(labels))
    raw[0] ^= 0x01
    storage.put(labels, bytes(raw))
    assert not verify_store(url).ok


def test_a_pickled_dataset_reads_the_same_store(tmp_path: Path, s3: Any) -> None:
    local, url = _store(tmp_path, s3)
    with dlpack.open(url, {"endpoint_url": s3.endpoint}) as ds:
        copy = pickle.loads(pickle.dumps(ds))
        assert isinstance(copy.reader, ObjectZarrReader)
        assert copy.reader.pin == ds.reader.pin
        assert dict(copy.reader.location.options) == {"endpoint_url": s3.endpoint}
        with dlpack.open(local) as here:
            _same(copy[7], here[7])
        copy.close()


def _epoch(ds: Any) -> None:
    for i in range(len(ds)):
        ds[i]


def test_the_cache_counts_and_keeps_half_the_store_across_epochs(tmp_path: Path, s3: Any) -> None:
    _local, url = _store(tmp_path, s3, n=16)  # 8 shards of 55,300 bytes
    storage = storage_for(Location.parse(url))
    shard = storage.head("images/c/0/0/0/0")
    assert shard is not None
    # The small arrays (labels, checksums, sources: one shard each) are resident too.
    small = sum(i.size for i in storage.list() if "/c/" in i.key and not i.key.startswith("images/"))
    with dlpack.open(url, cache_bytes=4 * shard.size + small) as ds:
        _epoch(ds)
        stats = ds.reader.cache.stats  # type: ignore[attr-defined]
        first = dict(stats)
        _epoch(ds)
        hits = stats["hits"] - first.get("hits", 0)
        # 16 reads per epoch over 8 shards, 4 of them resident: 8 hits (LRU would evict each before its turn).
        assert hits == 8, dict(stats)
        # Whole shards only while there was room: the other four are read image by image.
        assert 4 * shard.size <= stats["fetched_bytes"] <= 4 * shard.size + small


def test_a_disk_cache_is_shared_by_a_second_dataset(tmp_path: Path, s3: Any) -> None:
    _local, url = _store(tmp_path, s3)
    folder = tmp_path / "cache"
    stale = folder / "leftover.tmp-999999999"
    folder.mkdir()
    stale.write_bytes(b"half a shard")
    with dlpack.open(url, cache_dir=folder) as ds:
        _epoch(ds)
    assert not stale.exists()  # swept: its process is gone
    assert list(folder.rglob("*.tmp-*")) == []
    with dlpack.open(url, cache_dir=folder, cache_bytes=0) as again:
        _epoch(again)
        requests = again.reader.storage.requests  # type: ignore[attr-defined]
        # zarr.json and manifest.json of the group, one zarr.json per array read: no shard GETs.
        assert requests["GET"] <= 2 + len(again.manifest.arrays), requests
        assert again.reader.cache.stats["disk_hits"] >= 5  # type: ignore[attr-defined]


def test_prefetch_fetches_whole_shards_ahead(tmp_path: Path, s3: Any) -> None:
    _local, url = _store(tmp_path, s3)
    with dlpack.open(url) as ds:
        ds[0]
        ds.reader.prefetch([2, 3, 4, 5])
        ds.reader.pool().shutdown(wait=True)  # type: ignore[attr-defined]
        ds.reader._pool = None  # type: ignore[attr-defined]
        before = ds.reader.storage.requests["GET"]  # type: ignore[attr-defined]
        for i in (2, 3, 4, 5):
            ds[i]
        assert ds.reader.storage.requests["GET"] == before  # type: ignore[attr-defined]


def test_a_cache_folder_key_holds_the_etag(tmp_path: Path) -> None:
    cache = ShardCache(0, tmp_path / "c")
    cache.offer(("store", "images", 0, '"abc"'), b"one")
    assert cache.get(("store", "images", 0, '"abc"')) == b"one"
    assert cache.get(("store", "images", 0, '"def"')) is None  # another version of the shard: a miss
    assert os.listdir(tmp_path / "c") == ["store"]


def test_info_and_verify_read_a_url(tmp_path: Path, s3: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from dlpack.cli import main

    local, url = _store(tmp_path, s3)
    assert main(["info", url, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["path"] == url and info["count"] == 9
    assert main(["verify", url]) == 0
    assert "all 9 images match" in capsys.readouterr().out
    storage_for(Location.parse(url)).delete(["images/c/1/0/0/0"])
    assert main(["verify", url]) != 0
    assert "images/c/1/0/0/0" in capsys.readouterr().err


def test_a_warm_store_is_read_from_one_copy_and_a_cleared_cache_fetches_again(tmp_path: Path, s3: Any) -> None:
    local, url = _store(tmp_path, s3, n=16)
    with dlpack.open(url) as ds, dlpack.open(local) as mine:
        reader = ds.reader  # type: ignore[attr-defined]

        def epoch(e: int) -> list[np.ndarray]:
            loader = ds.loader(batch_size=4, order="block", seed=3)
            loader.set_epoch(e)
            return [b["image"].copy() for b in loader]

        def expected(e: int) -> list[np.ndarray]:
            loader = mine.loader(batch_size=4, order="block", seed=3, block_size=reader.shard_len("images"))
            loader.set_epoch(e)
            return [b["image"].copy() for b in loader]

        assert all(np.array_equal(a, b) for a, b in zip(epoch(0), expected(0), strict=True))
        fetched = reader.cache.stats["fetched_bytes"]
        warm = epoch(1)
        assert reader.cache.stats["fetched_bytes"] == fetched  # nothing fetched once warm
        images = reader._stored("images")
        assert images._arena is not None  # every shard resident: gathered from one contiguous copy
        assert all(np.array_equal(a, b) for a, b in zip(warm, expected(1), strict=True))
        reader.cache.clear()  # the copy goes with the cache: the next epoch fetches again, same pixels
        again = epoch(2)
        assert reader.cache.stats["fetched_bytes"] > fetched
        assert all(np.array_equal(a, b) for a, b in zip(again, expected(2), strict=True))
