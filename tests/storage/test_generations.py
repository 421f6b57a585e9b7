"""What a reader may see: one complete store generation, checked arrays, never a silent mix.

A reader opened before or during a rebuild (``--overwrite``) or an ``add_array`` reads the store as
it was when it opened, or raises :class:`~dlpack.StoreError`; damage to any per-sample array or to
the manifest is found by ``verify`` (and labels out of range already by ``open``).
"""

from __future__ import annotations

import threading
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import zarr
from _stores import rewrite_manifest

import dlpack
from dlpack import StoreError
from dlpack.errors import StoreNotFoundError

Sample = tuple[int, int, str]  # (CRC-32 of the image, label, source)

TREE_A = {f"cat/{k}.png": ("rgb", 20, 16) for k in range(3)} | {f"dog/{k}.png": ("rgb", 20, 16) for k in range(3, 6)}
# Same count and geometry, other pixels (other names hash to other seeds), other classes and labels.
TREE_B = {"ant/p.png": ("gray", 20, 16)} | {f"bee/{k}.png": ("rgb", 20, 16) for k in "qrstu"}


def build(src: Path, out: Path, **options: Any) -> None:
    dlpack.build(src, out, quiet=True, jobs=1, size=(10, 8), **options)


def samples(ds: dlpack.Dataset) -> list[Sample]:
    """Every sample of ``ds`` as (image CRC, label, source), reading each array."""
    out = []
    for i in range(len(ds)):
        s = ds[i]
        out.append((zlib.crc32(np.ascontiguousarray(s["image"]).data), s["label"], s["source"]))
    return out


def expected(out: Path) -> list[Sample]:
    with dlpack.open(out) as ds:
        return samples(ds)


@pytest.fixture
def two_sources(make_tree: Callable[..., Path]) -> tuple[Path, Path]:
    return make_tree(TREE_A, "a"), make_tree(TREE_B, "b")


# ---------------------------------------------------------------- one generation


@pytest.mark.parametrize("touch", ["nothing", "labels"])
def test_reader_opened_before_a_rebuild_sees_the_old_store_or_an_error(
    two_sources: tuple[Path, Path], tmp_path: Path, backend: str, touch: str
) -> None:
    a, b = two_sources
    out = tmp_path / backend
    build(a, out)
    old = expected(out)
    build(b, tmp_path / ("b-" + backend))
    new = expected(tmp_path / ("b-" + backend))
    assert old != new and len(old) == len(new)
    ds = dlpack.open(out)  # the manifest is read now, the arrays on first use
    if touch == "labels":
        ds.reader.read_all("labels")
    build(b, out, overwrite=True)
    try:
        got = samples(ds)
    except StoreError as exc:
        assert "changed while it was open" in str(exc) or "replaced" in str(exc)  # noqa: PT017 - the call may also succeed
    else:
        assert got == old  # never a mix of the two
    ds.close()
    assert expected(out) == new


@pytest.mark.slow
def test_threaded_opens_during_rebuilds_never_mix(two_sources: tuple[Path, Path], tmp_path: Path, backend: str) -> None:
    a, b = two_sources
    out = tmp_path / backend
    build(a, out)
    gen_a = expected(out)
    build(b, tmp_path / ("b-" + backend))
    gen_b = expected(tmp_path / ("b-" + backend))
    stop = threading.Event()
    errors: list[BaseException] = []

    def rebuild() -> None:
        try:
            for k in range(6):
                build(b if k % 2 == 0 else a, out, overwrite=True)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            stop.set()

    seen = {"a": 0, "b": 0, "error": 0}
    t = threading.Thread(target=rebuild)
    t.start()
    try:
        while not stop.is_set() or sum(seen.values()) < 3:
            try:
                with dlpack.open(out) as ds:
                    got = samples(ds)
            except (StoreError, StoreNotFoundError):
                seen["error"] += 1
                continue
            assert got in (gen_a, gen_b), "a reader saw a mix of two store generations"
            seen["a" if got == gen_a else "b"] += 1
    finally:
        t.join()
    assert not errors, errors
    assert seen["a"] + seen["b"] > 0


def test_pickled_reader_refuses_a_store_rebuilt_since(
    two_sources: tuple[Path, Path], tmp_path: Path, backend: str
) -> None:
    import pickle

    a, b = two_sources
    out = tmp_path / backend
    build(a, out)
    ds = dlpack.open(out)
    blob = pickle.dumps(ds)
    build(b, out, overwrite=True)
    with pytest.raises(StoreError, match="changed while it was open"):
        pickle.loads(blob)


def test_reader_during_add_array_sees_the_old_arrays_or_an_error(
    two_sources: tuple[Path, Path], tmp_path: Path, backend: str
) -> None:
    out = tmp_path / backend
    build(two_sources[0], out)
    dlpack.add_array(out, "weight", np.zeros(6, np.float32))
    ds = dlpack.open(out)
    before = samples(ds)
    try:
        dlpack.add_array(out, "weight", np.ones(6, np.float32), replace=True)
    except StoreError as exc:  # HDF5: the library's file lock refuses a writer while a reader has the file
        assert "open" in str(exc)  # noqa: PT017 - the call may also succeed
        assert [float(ds[i]["weight"]) for i in range(6)] == [0.0] * 6
        return
    try:
        weights = [float(ds[i]["weight"]) for i in range(6)]
    except StoreError as exc:
        assert "changed while it was open" in str(exc)  # noqa: PT017 - the call may also succeed
    else:
        assert weights == [0.0] * 6
    assert samples(ds) == before  # the arrays add_array left alone still read
    ds.close()
    with dlpack.open(out) as fresh:
        assert [float(fresh[i]["weight"]) for i in range(6)] == [1.0] * 6


# ---------------------------------------------------------------- checksums


def stored_location(store: Path, name: str) -> tuple[Path, int]:
    """The file holding uncompressed array ``name`` and the byte offset of its first element."""
    if store.is_dir():
        return next(p for p in sorted((store / name / "c").rglob("*")) if p.is_file()), 0
    with h5py.File(store, "r") as f:
        return store, int(f[name].id.get_offset())


def poke(store: Path, name: str, element: int, value: Any, dtype: str) -> None:
    path, offset = stored_location(store, name)
    raw = np.asarray(value, dtype=dtype).tobytes()
    with open(path, "r+b") as f:
        f.seek(offset + element * len(raw))
        f.write(raw)


def test_label_out_of_range_is_refused_on_open(two_sources: tuple[Path, Path], tmp_path: Path, backend: str) -> None:
    out = tmp_path / backend
    build(two_sources[0], out)
    poke(out, "labels", 0, 255, "<i4")  # a flipped byte: label 255 in a 2-class store
    with pytest.raises(StoreError, match=r"labels.*255.*2 classes"):
        dlpack.open(out)


@pytest.mark.parametrize(
    ("name", "element", "value", "dtype"),
    [("labels", 0, 1, "<i4"), ("source_offsets", 2, 9, "<i8"), ("transform", 1, 0.375, "<f8")],
)
def test_verify_finds_damage_to_any_per_sample_array(
    two_sources: tuple[Path, Path], tmp_path: Path, backend: str, name: str, element: int, value: Any, dtype: str
) -> None:
    out = tmp_path / backend
    build(two_sources[0], out)
    poke(out, name, element, value, dtype)
    with pytest.raises(StoreError, match=rf"{name}.*checksum"), dlpack.open(out) as ds:
        ds.verify()


def test_edited_manifest_is_refused(two_sources: tuple[Path, Path], tmp_path: Path, backend: str) -> None:
    out = tmp_path / backend
    build(two_sources[0], out)

    def smaller(d: dict[str, Any]) -> None:
        d["count"] = 4

    rewrite_manifest(out, smaller)
    with pytest.raises(StoreError, match="manifest.*checksum"), dlpack.open(out) as ds:
        ds.verify()


def test_intact_store_verifies(two_sources: tuple[Path, Path], tmp_path: Path, backend: str) -> None:
    out = tmp_path / backend
    build(two_sources[0], out)
    with dlpack.open(out) as ds:
        assert ds.verify() == []


# ---------------------------------------------------------------- foreign stores


def test_plain_zarr_group_is_not_called_an_incomplete_dlpack_store(tmp_path: Path) -> None:
    path = tmp_path / "theirs.zarr"
    zarr.open_group(str(path), mode="w-").create_array("data", shape=(3,), dtype="<i4")
    with pytest.raises((StoreError, StoreNotFoundError), match="not a dlpack store") as info:
        dlpack.open(path)
    assert "overwrite" not in str(info.value) and "incomplete" not in str(info.value)


def test_plain_hdf5_file_is_not_called_an_incomplete_dlpack_store(tmp_path: Path) -> None:
    path = tmp_path / "theirs.h5"
    with h5py.File(path, "w") as f:
        f["data"] = np.arange(3)
    with pytest.raises((StoreError, StoreNotFoundError), match="not a dlpack store") as info:
        dlpack.open(path)
    assert "overwrite" not in str(info.value) and "incomplete" not in str(info.value)
