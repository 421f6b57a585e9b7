"""Crafted stores: every bad manifest or array metadata is a clear StoreError, with bounded memory
and no file outside the store read; HDF5 writes refuse a nearly full disk instead of crashing."""

from __future__ import annotations

import json
import os
import shutil
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

import dlpack
from dlpack.backends import _hdf5
from dlpack.errors import StoreError

TREE = {f"a/{k}.png": ("rgb", 12, 10) for k in range(5)} | {f"b/{k}.png": ("gray", 12, 10) for k in range(5, 7)}


@pytest.fixture
def zstore(make_tree: Callable[..., Path], tmp_path: Path) -> Path:
    out = tmp_path / "s.zarr"
    dlpack.build(make_tree(TREE), out, quiet=True, jobs=1)
    return out


def edit_json(path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    d = json.loads(path.read_text(encoding="utf-8"))
    change(d)
    path.write_text(json.dumps(d), encoding="utf-8")


def reseal(store: Path) -> None:
    """Record the edited manifest's checksum, as a careful forger would: validation must still hold."""
    import hashlib

    digest = hashlib.sha256((store / "manifest.json").read_bytes()).hexdigest()
    edit_json(store / "zarr.json", lambda d: d["attributes"]["dlpack"].update(manifest_sha256=digest))


def open_and_read(store: Path) -> None:
    with dlpack.open(store) as ds:
        ds.warm()
        ds.get_batch(list(range(len(ds))))


@pytest.fixture
def bounded() -> Iterator[None]:
    """Fail when Python-visible allocations (NumPy's included) peak over 64 MiB."""
    tracemalloc.start()
    try:
        yield
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 * 2**20, f"peak allocation {peak / 2**20:.0f} MiB"


@pytest.mark.parametrize(
    ("field", "value"),
    [("count", -1), ("count", "7"), ("count", True), ("count", 10**12), ("classes", "ab"), ("image", {"layout": "fixed"}),
     ("arrays", {"labels": {"layout": "fixed", "dtype": "<i4", "shape": "x"}}), ("skipped", [1]), ("shard_images", -3)],
)  # fmt: skip
def test_crafted_manifest_fields_are_store_errors(zstore: Path, bounded: None, field: str, value: Any) -> None:
    edit_json(zstore / "manifest.json", lambda d: d.update({field: value}))
    reseal(zstore)
    with pytest.raises(StoreError):
        open_and_read(zstore)


def test_count_must_match_every_array(zstore: Path) -> None:
    edit_json(zstore / "manifest.json", lambda d: d.update(count=5))
    reseal(zstore)
    with pytest.raises(StoreError, match=r"the manifest says"):
        open_and_read(zstore)


@pytest.mark.parametrize(
    "change",
    [
        lambda m: m.update(shape=[10**12, 10, 12, 3]),
        lambda m: m["chunk_grid"]["configuration"].update(chunk_shape=[10**12, 10, 12, 3]),
        lambda m: m["codecs"][0]["configuration"].update(chunk_shape=[2**20, 10, 12, 3]),
        lambda m: m["chunk_grid"]["configuration"].update(chunk_shape=[2**40, 10, 12, 3]),
        lambda m: m.update(shape="big"),
        lambda m: m.update(data_type="|O"),
        lambda m: m["chunk_key_encoding"].update(configuration={"separator": "/../"}),
        lambda m: m["chunk_key_encoding"].update(name="v2"),
        lambda m: m.update(codecs=[]),
        lambda m: m["codecs"][0]["configuration"]["codecs"][0].update(configuration={"endian": "big"}),
        # Found by the reader fuzz target: a codec configuration that is not an object.
        lambda m: m["codecs"][0]["configuration"]["codecs"][0].update(configuration=-1),
    ],
)
def test_crafted_array_metadata_is_a_store_error(
    zstore: Path, bounded: None, change: Callable[[dict[str, Any]], None]
) -> None:
    edit_json(zstore / "images" / "zarr.json", change)
    with pytest.raises(StoreError):
        open_and_read(zstore)


def test_separator_pointing_outside_the_store_reads_nothing_there(zstore: Path, tmp_path: Path) -> None:
    outside = tmp_path / "secret"
    outside.mkdir()
    edit_json(
        zstore / "labels" / "zarr.json",
        lambda m: m["chunk_key_encoding"].update(configuration={"separator": "/../../secret/"}),
    )
    opened: list[str] = []
    real_open = os.open

    def spy(path: Any, *args: Any, **kwargs: Any) -> int:
        opened.append(os.fspath(path))
        return real_open(path, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(os, "open", spy)
        with pytest.raises(StoreError, match="separator"):
            open_and_read(zstore)
    assert not any("secret" in p or ".." in p for p in opened), opened


def test_shard_index_larger_than_its_file_is_refused(zstore: Path, bounded: None) -> None:
    # A forged shard shape (and index CRC that cannot match) must not allocate a table of that size.
    edit_json(
        zstore / "images" / "zarr.json",
        lambda m: m["chunk_grid"]["configuration"].update(chunk_shape=[2**30, 10, 12, 3]),
    )
    with pytest.raises(StoreError):
        open_and_read(zstore)


# ---------------------------------------------------------------- HDF5


@pytest.fixture
def hstore(make_tree: Callable[..., Path], tmp_path: Path) -> Path:
    out = tmp_path / "s.h5"
    dlpack.build(make_tree(TREE), out, quiet=True, jobs=1)
    return out


def _replace_dataset(store: Path, name: str, **kwargs: Any) -> None:
    with h5py.File(store, "r+") as f:
        attrs = dict(f[name].attrs)
        data = f[name][()]
        del f[name]
        ds = f.create_dataset(name, shape=data.shape, dtype=data.dtype, **kwargs)
        for k, v in attrs.items():
            ds.attrs[k] = v


def test_hdf5_external_storage_is_refused(hstore: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside.bin"
    outside.write_bytes(np.zeros(7, "<i4").tobytes())
    _replace_dataset(hstore, "labels", external=[(str(outside), 0, 28)])
    with pytest.raises(StoreError, match="external storage"):
        dlpack.open(hstore)


def test_hdf5_virtual_dataset_is_refused(hstore: Path, tmp_path: Path) -> None:
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as f:
        f["x"] = np.zeros(7, "<i4")
    with h5py.File(hstore, "r+") as f:
        attrs = dict(f["labels"].attrs)
        del f["labels"]
        layout = h5py.VirtualLayout(shape=(7,), dtype="<i4")
        layout[:] = h5py.VirtualSource(str(other), "x", shape=(7,))
        f.create_virtual_dataset("labels", layout)
        for k, v in attrs.items():
            f["labels"].attrs[k] = v
    with pytest.raises(StoreError, match="virtual dataset"):
        dlpack.open(hstore)


def _disk_fills_after(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, checks: int) -> list[str]:
    """``shutil.disk_usage`` reports plenty of space for ``checks`` calls, then 1 MiB."""
    usage = shutil.disk_usage(tmp_path)
    calls: list[str] = []

    def fake(path: Any) -> Any:
        calls.append(os.fspath(path))
        free = usage.free if len(calls) <= checks else 2**20
        return type(usage)(usage.total, usage.total - free, free)

    monkeypatch.setattr(_hdf5.shutil, "disk_usage", fake)
    return calls


def test_hdf5_writes_check_free_space_before_each_step(
    make_tree: Callable[..., Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = make_tree(TREE)
    calls = _disk_fills_after(monkeypatch, tmp_path, 10**6)
    dlpack.build(src, tmp_path / "ok.h5", quiet=True, jobs=1)
    steps = len(calls)
    assert steps >= 4  # the file, each array, each checksum, the manifest
    for fail_at in range(steps):  # the disk fills before step fail_at: a clear error, never a crash
        monkeypatch.undo()
        _disk_fills_after(monkeypatch, tmp_path, fail_at)
        out = tmp_path / f"s{fail_at}.h5"
        with pytest.raises(StoreError, match="not enough free space"):
            dlpack.build(src, out, quiet=True, jobs=1)
        assert not out.exists()
