"""The bench's on-the-fly folder reader is a BatchSource: same pixels as a build, stable fingerprint."""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import dlpack
from dlpack.bench.folder import FolderReader, FolderSpec
from dlpack.errors import DlpackError, SourceError
from dlpack.read.loader import BatchSource

TREE = {"a/0.png": "rgb", "a/1.jpg": "rgb", "b/2.png": "gray", "b/3.png": "rgba", "b/4.png": "palette"}
RELS = sorted(TREE)
SIZE = (20, 15)
SPEC = FolderSpec(size=SIZE, channels=3, dtype="|u1", mode="stretch")


@pytest.fixture
def src(make_tree: Callable[..., Path]) -> Path:
    return make_tree(TREE)


def test_the_folder_reader_satisfies_the_batch_source_protocol(src: Path) -> None:
    reader = FolderReader(src, RELS, SPEC)
    assert isinstance(reader, BatchSource)
    params = inspect.signature(reader.get_batch).parameters
    assert list(params) == ["indices", "epoch", "out"]
    assert params["epoch"].default == 0 and params["out"].default is None
    assert len(reader) == len(TREE)
    assert reader.image_layout() == ((SIZE[1], SIZE[0], 3), "|u1")


@pytest.mark.parametrize("mode", ["stretch", "fit"])
def test_a_folder_batch_holds_the_pixels_a_build_stores(src: Path, tmp_path: Path, mode: str) -> None:
    """The baseline is fair: decoding on the fly gives exactly the images the store holds."""
    store = tmp_path / "s.zarr"
    dlpack.build(src, store, size=SIZE, resize=mode, channels=3, jobs=1, quiet=True)
    reader = FolderReader(src, RELS, FolderSpec(size=SIZE, channels=3, dtype="|u1", mode=mode))
    idx = np.array([4, 0, 2, 3, 1], dtype=np.int64)
    with dlpack.open(store) as ds:
        assert list(ds.get_batch(idx)["source"]) == [RELS[i] for i in idx]
        expected = ds.get_batch(idx)["image"]
    batch = reader.get_batch(idx)
    assert batch["image"].shape == (5, SIZE[1], SIZE[0], 3) and batch["image"].dtype == np.uint8
    assert np.array_equal(batch["image"], expected)
    assert batch["index"].dtype == np.int64 and np.array_equal(batch["index"], idx)


def test_get_batch_fills_out_and_does_not_depend_on_the_epoch(src: Path) -> None:
    reader = FolderReader(src, RELS, SPEC)
    reader.warm()
    idx = np.array([3, 1], dtype=np.int64)
    out = np.zeros((2, SIZE[1], SIZE[0], 3), dtype=np.uint8)
    batch = reader.get_batch(idx, epoch=7, out=out)
    assert batch["image"] is out and out.any()
    assert np.array_equal(reader.get_batch(idx)["image"], out)


def test_the_fingerprint_follows_paths_sizes_mtimes_and_spec(src: Path) -> None:
    first = FolderReader(src, RELS, SPEC).fingerprint()
    assert len(first) == 16 and int(first, 16) >= 0
    assert FolderReader(src, RELS, SPEC).fingerprint() == first  # stable across readers
    assert FolderReader(src, RELS[::-1], SPEC).fingerprint() != first  # order is part of the content
    assert FolderReader(src, RELS[:-1], SPEC).fingerprint() != first
    other = FolderSpec(size=(10, 10), channels=3, dtype="|u1", mode="stretch")
    assert FolderReader(src, RELS, other).fingerprint() != first
    path = src / RELS[0]
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    touched = FolderReader(src, RELS, SPEC).fingerprint()
    assert touched != first
    path.write_bytes(path.read_bytes() + b"\0")  # one byte longer, same mtime
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert FolderReader(src, RELS, SPEC).fingerprint() not in (first, touched)


def test_a_removed_file_is_named_in_the_fingerprint_error(src: Path) -> None:
    reader = FolderReader(src, RELS, SPEC)
    (src / RELS[2]).unlink()
    with pytest.raises(SourceError, match=str(src / RELS[2]).replace("\\", r"\\")):
        reader.fingerprint()


def test_an_undecodable_image_is_named_in_the_error(src: Path) -> None:
    (src / RELS[1]).write_bytes(b"not a jpeg at all")
    reader = FolderReader(src, RELS, SPEC)
    with pytest.raises(DlpackError, match=r"cannot decode .*1\.jpg.*remove or fix the file"):
        reader.get_batch(np.array([0, 1], dtype=np.int64))
