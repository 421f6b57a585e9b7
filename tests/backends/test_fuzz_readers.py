"""Fuzz targets for the readers of untrusted bytes: the manifest, the shard index, and whole
HDF5 and Zarr stores with flipped bits.

Whatever the input, the only errors are :class:`~dlpack.StoreError` (or its
:class:`~dlpack.FormatVersionError`), memory stays bounded and no file outside the store is read.
The normal run is short; a longer one by hand:

    DLPACK_FUZZ_EXAMPLES=20000 pytest tests/backends/test_fuzz_readers.py
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlpack import StoreError
from dlpack.backends._shard import ShardedArray
from dlpack.manifest import ArraySpec, ImageSpec, Manifest

# Fuzzing: hundreds of generated inputs per target. `make test-fast` leaves them out.
pytestmark = pytest.mark.slow

EXAMPLES = int(os.environ.get("DLPACK_FUZZ_EXAMPLES", "100"))
FUZZ = settings(
    max_examples=EXAMPLES,
    # The normal run tries the same examples every time (a test run never fails by chance); a long
    # run by hand (DLPACK_FUZZ_EXAMPLES) explores new ones.
    derandomize="DLPACK_FUZZ_EXAMPLES" not in os.environ,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
#: A reader may allocate about this much for these small inputs (tracemalloc sees NumPy's buffers).
MEMORY_BOUND = 64 * 2**20

scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=8)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
# Values a mutation puts in place of a field: the kinds that broke readers before.
hostile = (
    st.sampled_from(
        [
            -1,
            0,
            1,
            2**31,
            2**53,
            10**12,
            -(2**63),
            2**64,
            "1",
            "",
            "/../",
            "..",
            ".",
            True,
            None,
            [],
            {},
            [10**12],
            1.5,
            float("inf"),
        ]
    )
    | json_values
)


def base_manifest() -> dict[str, Any]:
    specs = {
        "images": ArraySpec("images", "|u1", (4, 5, 3), key="image"),
        "labels": ArraySpec("labels", "<i4", key="label"),
        "source": ArraySpec("source", "|u1", (), ragged=True),
    }
    return Manifest(
        count=3, image=ImageSpec("fixed", 3, "|u1", 4, 5), backend="zarr", classes=("a",), arrays=specs
    ).to_dict()


def paths(d: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every key path into a JSON document."""
    yield prefix
    if isinstance(d, dict):
        for k, v in d.items():
            yield from paths(v, (*prefix, k))
    elif isinstance(d, list):
        for i, v in enumerate(d):
            yield from paths(v, (*prefix, i))


def mutate(doc: Any, path: tuple[Any, ...], value: Any, delete: bool) -> Any:
    value = copy.deepcopy(value)  # sampled values are shared objects: never mutate them in place
    if not path:
        return value
    node = doc
    for k in path[:-1]:
        node = node[k]
    if delete and isinstance(node, dict):
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return doc


@pytest.fixture
def bounded_memory() -> Callable[[Callable[[], Any]], None]:
    def run(fn: Callable[[], Any]) -> None:
        tracemalloc.start()
        try:
            try:
                fn()
            except StoreError:
                pass
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < MEMORY_BOUND, f"peak allocation {peak / 2**20:.0f} MiB"

    return run


# ---------------------------------------------------------------- manifest


@FUZZ
@given(st.binary(max_size=300) | st.text(max_size=300).map(str.encode))
def test_manifest_reader_on_arbitrary_bytes(data: bytes) -> None:
    try:
        Manifest.from_json(data)
    except StoreError:
        pass


@FUZZ
@given(json_values)
def test_manifest_reader_on_arbitrary_json(doc: Any) -> None:
    try:
        Manifest.from_json(json.dumps(doc))
    except StoreError:
        pass


@FUZZ
@given(st.data())
def test_manifest_reader_on_mutated_manifests(data: st.DataObject) -> None:
    doc = base_manifest()
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(list(paths(doc))))
        doc = mutate(doc, path, data.draw(hostile), data.draw(st.booleans()))
    try:
        m = Manifest.from_json(json.dumps(doc))
    except StoreError:
        return
    # Whatever is accepted is a consistent manifest that writes back to the same thing.
    assert Manifest.from_json(m.to_json()) == m
    assert isinstance(m.count, int) and m.count >= 0
    assert all(isinstance(c, str) for c in m.classes)


# ---------------------------------------------------------------- shard index


@pytest.fixture(scope="module")
def sharded_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small store (3 shards of images, raw and zstd-compressed copies) to mutate."""
    from dlpack.backends import open_writer
    from dlpack.testing import CLASSES

    path = tmp_path_factory.mktemp("fuzz") / "s.zarr"
    w = open_writer(path, "w-", shard_bytes=2**16)
    rng = np.random.default_rng(0)
    for name, compression in (("raw", "none"), ("packed", "zstd")):
        spec = ArraySpec(name, "|u1", (60, 80, 3), compression=compression)
        w.create_array(spec, 7)
        values = rng.integers(0, 256, (7, 60, 80, 3), dtype=np.uint8)
        step = w.shard_rows(name)
        for s in range(0, 7, step):
            w.write_block(name, s, values[s : s + step])
    w.commit(Manifest(count=7, image=ImageSpec("fixed", 3, "|u1", 60, 80), backend="zarr", classes=CLASSES))
    return path


@pytest.fixture
def scratch(sharded_store: Path, tmp_path: Path) -> Callable[[str], Path]:
    def copy(name: str) -> Path:
        dst = tmp_path / "copy" / name
        shutil.rmtree(dst.parent, ignore_errors=True)
        shutil.copytree(sharded_store / name, dst)
        return dst

    return copy


def read_everything(path: Path, opened: list[str]) -> None:
    real = os.open

    def spy(p: Any, *args: Any, **kwargs: Any) -> int:
        opened.append(os.fspath(p))
        return real(p, *args, **kwargs)

    os.open = spy  # type: ignore[assignment]
    try:
        meta = json.loads((path / "zarr.json").read_text())
        fd = real(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            arr = ShardedArray(path, strict=True, meta=meta, dir_fd=fd)
            arr.map_all()
        finally:
            os.close(fd)
        n = arr.shape[0]
        if n:
            arr.read_rows(0, min(n, 2))
            out = np.empty((1, *arr.shape[1:]), dtype=arr.dtype)
            arr.read_into([n - 1], out)
        arr.close()
    finally:
        os.open = real  # type: ignore[assignment]


def inside(path: Path, opened: list[str]) -> None:
    for p in opened:
        assert ".." not in Path(p).parts and (not os.path.isabs(p) or Path(p).is_relative_to(path)), p


@FUZZ
@given(data=st.data(), name=st.sampled_from(["raw", "packed"]))
def test_shard_reader_on_mutated_metadata(
    data: st.DataObject, name: str, scratch: Callable[[str], Path], bounded_memory: Callable[..., None]
) -> None:
    path = scratch(name)
    meta = json.loads((path / "zarr.json").read_text())
    for _ in range(data.draw(st.integers(1, 3))):
        where = data.draw(st.sampled_from(list(paths(meta))))
        meta = mutate(meta, where, data.draw(hostile), data.draw(st.booleans()))
    (path / "zarr.json").write_text(json.dumps(meta))
    opened: list[str] = []
    bounded_memory(lambda: read_everything(path, opened))
    inside(path, opened)


@FUZZ
@given(data=st.data(), name=st.sampled_from(["raw", "packed"]))
def test_shard_reader_on_mutated_shard_tails(
    data: st.DataObject, name: str, scratch: Callable[[str], Path], bounded_memory: Callable[..., None]
) -> None:
    path = scratch(name)
    shards = sorted(p for p in (path / "c").rglob("*") if p.is_file())
    shard = data.draw(st.sampled_from(shards))
    raw = bytearray(shard.read_bytes())
    action = data.draw(st.sampled_from(["poke", "truncate", "append"]))
    if action == "poke":  # bytes of the index or its CRC (the last 4 + 16 * chunks bytes)
        for _ in range(data.draw(st.integers(1, 8))):
            pos = len(raw) - 1 - data.draw(st.integers(0, min(len(raw) - 1, 200)))
            raw[pos] = data.draw(st.integers(0, 255))
    elif action == "truncate":
        del raw[data.draw(st.integers(0, len(raw))) :]
    else:
        raw += data.draw(st.binary(max_size=64))
    if data.draw(st.booleans()):  # a forger who fixes the index CRC
        from dlpack.backends._shard import crc32c

        meta = json.loads((path / "zarr.json").read_text())
        cps = (
            meta["chunk_grid"]["configuration"]["chunk_shape"][0]
            // meta["codecs"][0]["configuration"]["chunk_shape"][0]
        )
        if len(raw) >= 16 * cps + 4:
            table = bytes(raw[len(raw) - 16 * cps - 4 : len(raw) - 4])
            raw[len(raw) - 4 :] = crc32c(table).to_bytes(4, "little")
    shard.write_bytes(bytes(raw))
    opened: list[str] = []
    bounded_memory(lambda: read_everything(path, opened))
    inside(path, opened)


# ---------------------------------------------------------------- whole stores, bit flips


def _tiny_store(root: Path, name: str) -> Path:
    """A small store built by dlpack (7 images, 2 classes): every file of it is fuzzed."""
    from conftest import write_tree

    src = write_tree(root / "src", {f"{'ab'[k % 2]}/{k}.png": ("rgb", 6, 5) for k in range(7)})
    out = root / name
    import dlpack

    dlpack.build(src, out, quiet=True, jobs=1, shard_bytes=2**16)
    return out


@pytest.fixture(scope="module")
def tiny_stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("flip")
    return {name: _tiny_store(root, name) for name in ("s.h5", "s.zarr")}


def open_verify_read(path: Path) -> None:
    """What ``dlpack verify`` and training do: open, verify, read every sample and batch."""
    import dlpack

    with dlpack.open(path) as ds:
        ds.verify()
        for i in range(len(ds)):
            ds[i]
        ds.get_batch(list(range(len(ds))))


def flip(data: st.DataObject, raw: bytearray) -> None:
    for _ in range(data.draw(st.integers(1, 6))):
        pos = data.draw(st.integers(0, len(raw) - 1))
        raw[pos] ^= 1 << data.draw(st.integers(0, 7))


@FUZZ
@given(data=st.data())
def test_hdf5_store_with_flipped_bits_gives_only_store_errors(
    data: st.DataObject, tiny_stores: dict[str, Path], tmp_path: Path
) -> None:
    from dlpack import DlpackError

    path = tmp_path / "s.h5"
    raw = bytearray(tiny_stores["s.h5"].read_bytes())
    flip(data, raw)
    path.write_bytes(bytes(raw))
    try:
        open_verify_read(path)
    except DlpackError:
        pass


@FUZZ
@given(data=st.data())
def test_zarr_store_with_flipped_bits_gives_only_store_errors(
    data: st.DataObject, tiny_stores: dict[str, Path], tmp_path: Path
) -> None:
    from dlpack import DlpackError

    path = tmp_path / "s.zarr"
    shutil.rmtree(path, ignore_errors=True)
    shutil.copytree(tiny_stores["s.zarr"], path)
    files = sorted(p for p in path.rglob("*") if p.is_file() and p.stat().st_size)
    for target in data.draw(st.lists(st.sampled_from(files), min_size=1, max_size=2, unique=True)):
        raw = bytearray(target.read_bytes())
        flip(data, raw)
        target.write_bytes(bytes(raw))
    try:
        open_verify_read(path)
    except DlpackError:
        pass
