"""The batch read path: vectorised per-shard gathers, lazily decoded source paths, workers="auto"."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

import dlpack
from dlpack.backends.gather import gather_rows
from dlpack.backends.reader import SourceList
from dlpack.errors import OptionError, SampleIndexError
from dlpack.read.loader import Loader, LoaderOptions, auto_workers, parse_cache_size

N = 40  # 48x48x3 images: 9 per 64 KiB shard, so 5 shards, the last one partial


def _folder(root: Path, n: int, side: int, channels: int) -> Path:
    for i in range(n):
        rng = np.random.default_rng([3, i])
        img = rng.integers(0, 256, (side, side, channels), dtype=np.uint8)
        d = root / f"c{i % 3}" / ("deep" if i % 4 == 0 else "")
        d.mkdir(parents=True, exist_ok=True)
        assert cv2.imwrite(str(d / f"{i:03d}.png"), img)
    return root


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Zarr and HDF5 stores, uncompressed and lz4, of 48x48x3 (raw rows per shard) and 32x32x1
    (small: read whole once) images, in small shards."""
    tmp = tmp_path_factory.mktemp("hotpath")
    out = {}
    for side, ch in ((48, 3), (32, 1)):
        src = _folder(tmp / f"png{side}", N, side, ch)
        for fmt, suffix in (("zarr", ".zarr"), ("hdf5", ".h5")):
            for comp in ("none", "lz4"):
                path = tmp / f"s{side}-{comp}{suffix}"
                dlpack.build(src, path, size=(side, side), channels=ch, compression=comp, shard_bytes=2**16, quiet=True)
                out[f"{fmt}-{comp}-{side}"] = path
    return out


ORDERS = {
    "random": np.random.default_rng(0).permutation(N),
    "sorted": np.arange(N),
    "reversed": np.arange(N)[::-1].copy(),
    "one shard": np.array([11, 9, 17, 10]),
    "last partial shard": np.array([39, 36, 38]),
    "repeats": np.array([5, 5, 39, 0, 5, 20]),
    "first and last": np.array([39, 0]),
    "one": np.array([23]),
}


@pytest.mark.parametrize("key", [f"{f}-{c}-{s}" for f in ("zarr", "hdf5") for c in ("none", "lz4") for s in (48, 32)])
@pytest.mark.parametrize("order", list(ORDERS))
def test_batches_are_byte_identical_to_the_per_image_path(stores: dict[str, Path], key: str, order: str) -> None:
    idx = ORDERS[order]
    with dlpack.open(stores[key]) as ds:
        assert isinstance(ds, dlpack.Dataset)
        batch = ds.get_batch(idx)
        one_by_one = [ds[int(i)] for i in idx]
        expect = np.stack([s["image"] for s in one_by_one])
        assert batch["image"].dtype == expect.dtype and batch["image"].tobytes() == expect.tobytes()
        assert batch["label"].tolist() == [s["label"] for s in one_by_one]
        assert batch["index"].tolist() == idx.tolist()
        assert batch["source"] == [s["source"] for s in one_by_one]
        # The backend's own per-image gather (what compressed shards use) gives the same bytes.
        r = ds.reader
        out = np.zeros_like(expect)
        r._stored("images").read_into(idx.tolist(), out)
        assert out.tobytes() == expect.tobytes()
        # A preallocated batch larger than the indices: only its first rows are written.
        wide = np.full((len(idx) + 2, *expect.shape[1:]), 7, dtype=expect.dtype)
        got = ds.get_batch(idx, out=wide)["image"]
        assert got[: len(idx)].tobytes() == expect.tobytes() and (wide[len(idx) :] == 7).all()


def test_the_raw_stores_take_the_vectorised_path(stores: dict[str, Path]) -> None:
    """Which gather each layout gets: the test above would pass on the slow path too."""
    kinds = {}
    for key, path in stores.items():
        with dlpack.open(path) as ds:
            assert isinstance(ds, dlpack.Dataset)
            ds.get_batch([1, 2])
            kinds[key] = ds.reader._gathers["images"][0]
    assert kinds == {
        "zarr-none-48": "views",
        "hdf5-none-48": "views",
        "zarr-lz4-48": "access",
        "hdf5-lz4-48": "access",
        "zarr-none-32": "whole",
        "hdf5-none-32": "whole",
        "zarr-lz4-32": "whole",
        "hdf5-lz4-32": "whole",
    }


@pytest.mark.parametrize("key", ["zarr-none-48", "hdf5-none-48", "zarr-none-32", "zarr-lz4-48"])
def test_out_of_range_indices_are_still_refused(stores: dict[str, Path], key: str) -> None:
    with dlpack.open(stores[key]) as ds:
        assert isinstance(ds, dlpack.Dataset)
        for bad in ([0, N], [N + 5], [-N - 1, 2]):
            with pytest.raises(SampleIndexError, match="out of range"):
                ds.get_batch(bad)
        out = np.empty((2, *ds.manifest.image.shape), dtype=np.uint8)  # type: ignore[misc]
        for bad in ([0, N], [-1]):
            with pytest.raises(OptionError, match=f"sample index {bad[-1]} is out of range"):
                ds.reader.read_into("images", bad, out)
        assert ds.get_batch([-1])["index"].tolist() == [N - 1]  # negative ones count from the end, as before


def test_gather_rows_matches_fancy_indexing_for_every_order() -> None:
    rng = np.random.default_rng(1)
    whole = rng.integers(0, 256, (23, 3, 2), dtype=np.uint8)
    views = [whole[s : s + 5] for s in range(0, 23, 5)]  # the last view holds 3 rows
    for _ in range(50):
        idx = rng.integers(0, 23, int(rng.integers(1, 30))).astype(np.int64)
        out = np.zeros((len(idx) + 1, 3, 2), dtype=np.uint8)
        gather_rows(views, 5, idx, out)
        assert np.array_equal(out[: len(idx)], whole[idx]) and not out[len(idx) :].any()
    one = np.zeros((4, 3, 2), dtype=np.uint8)
    assert np.array_equal(gather_rows([whole], 23, np.array([22, 0, 7, 7]), one), whole[[22, 0, 7, 7]])


def test_source_list_is_the_eager_list(stores: dict[str, Path]) -> None:
    with dlpack.open(stores["zarr-none-48"]) as ds:
        assert isinstance(ds, dlpack.Dataset)
        idx = ORDERS["random"]
        got = ds.get_batch(idx)["source"]
        eager = ds.reader.sources(idx.tolist())
        assert isinstance(got, SourceList) and any("/deep/" in p for p in eager)
        assert got == eager and eager == got and got == tuple(eager) and got == ds.get_batch(idx)["source"]
        assert got != eager[::-1] and got != eager[:-1] and (got == "not a list") is False
        assert len(got) == N and list(got) == eager and got[3] == eager[3] and got[-1] == eager[-1]
        assert got[2:5] == eager[2:5] and repr(got) == repr(eager)
        assert json.dumps(list(got)) == json.dumps(eager)
        assert ds.get_batch([])["source"] == []


class _Source:
    """A BatchSource with a chosen layout and compression (only what auto_workers reads)."""

    def __init__(self, layout: tuple[tuple[int, ...], str] | None, compression: str = "none") -> None:
        self._layout = layout
        self.manifest = type("M", (), {"compression": compression})()

    def __len__(self) -> int:
        return 64

    def get_batch(self, indices: np.ndarray, epoch: int = 0, out: np.ndarray | None = None) -> dict[str, Any]:
        shape = (len(indices), 2, 2, 1)
        return {"image": np.zeros(shape, np.uint8) if out is None else out, "index": indices}

    def warm(self) -> None:
        pass

    def fingerprint(self) -> str:
        return "fixed"

    def image_layout(self) -> tuple[tuple[int, ...], str] | None:
        return self._layout


SMALL = ((64, 64, 3), "|u1")
LARGE = ((512, 512, 3), "|u1")


@pytest.mark.parametrize(
    ("source", "options", "cores", "extra", "want", "why"),
    [
        (_Source(SMALL), LoaderOptions(batch_size=256), 2, False, 1, "64x64x3 batches of 256: 3.1 MB, one thread"),
        (_Source(SMALL), LoaderOptions(batch_size=256), 16, False, 1, "one thread copies at memory speed; 16 cores"),
        (_Source(LARGE), LoaderOptions(batch_size=32), 4, False, 2, "25.2 MB, two threads"),
        (_Source(LARGE), LoaderOptions(batch_size=32), 2, False, 1, "25.2 MB, one thread"),  # + the caller
        (_Source(LARGE), LoaderOptions(batch_size=32), 1, False, 1, "one thread copies at memory speed; 1 core"),
        (_Source(SMALL, "lz4"), LoaderOptions(batch_size=256), 2, False, 2, "lz4-compressed: decoding"),
        (_Source(SMALL, "zstd"), LoaderOptions(batch_size=256), 8, False, 4, "zstd-compressed"),
        (_Source(None), LoaderOptions(), 2, False, 2, "several sizes"),
        (_Source(SMALL), LoaderOptions(batch_size=256), 2, True, 2, "work per batch on the reader threads"),
        (_Source(LARGE), LoaderOptions(prefetch=0), 2, False, 0, "prefetch=0"),
    ],
)
def test_auto_workers_picks_by_layout(
    source: _Source, options: LoaderOptions, cores: int, extra: bool, want: int, why: str
) -> None:
    got, reason = auto_workers(source, options, cores, extra_work=extra)
    assert got == want and why in reason, reason


class _Streamed(_Source):
    """A source read over the network: the loader reads it ahead on threads."""

    streamed = True


MIB = 2**20


@pytest.mark.parametrize(
    ("source", "batch", "l2", "cores", "want", "why"),
    [
        # 64x64x3 batches of 32 (384 KiB) fit a 1 or 2 MiB L2 cache: read on the calling thread.
        (_Source(SMALL), 32, 2 * MIB, 2, 0, "batches of 32: 0.4 MB, read on the calling thread"),
        (_Source(SMALL), 32, MIB, 16, 0, "stays in its core's 1 MiB L2 cache; 16 cores"),
        (_Source(SMALL), 32, None, 1, 0, "1 MiB L2"),  # sysfs silent: 1 MiB assumed
        (_Source(SMALL), 128, 2 * MIB, 2, 0, "1.6 MB"),  # 1.5 MiB
        (_Source(SMALL), 128, MIB, 2, 1, "one thread"),  # larger than the cache
        (_Source(SMALL), 32, 256 * 2**10, 2, 1, "one thread"),
        (_Source(SMALL), 256, 32 * MIB, 2, 1, "one thread"),  # 3 MiB: over 2 MiB whatever the cache
        (_Source(((32, 32, 1), "|u1")), 32, 2 * MIB, 2, 1, "one thread"),  # 32 KiB: read in 2 MiB groups
        (_Source(((32, 32, 1), "|u1")), 256, 2 * MIB, 2, 0, "calling thread"),  # 256 KiB
        (_Streamed(SMALL), 32, 2 * MIB, 2, 1, "one thread"),  # over the network: always read ahead
        (_Source(SMALL, "zstd"), 32, 2 * MIB, 2, 2, "zstd-compressed"),
    ],
)
def test_auto_workers_reads_batches_that_fit_the_l2_cache_on_the_calling_thread(
    source: _Source, batch: int, l2: int | None, cores: int, want: int, why: str
) -> None:
    got, reason = auto_workers(source, LoaderOptions(batch_size=batch), cores, l2_bytes=l2)
    assert got == want and why in reason, reason
    work, _ = auto_workers(source, LoaderOptions(batch_size=batch), cores, extra_work=True, l2_bytes=l2)
    assert work == min(cores, 4)  # a transform's work runs on every core, whatever the batch


@pytest.mark.parametrize(
    ("text", "want"),
    [("2048K", 2 * MIB), ("1M", MIB), ("512", 512), ("1G", 2**30), ("", None), ("big", None), ("0K", None)],
)
def test_parse_cache_size(text: str, want: int | None) -> None:
    assert parse_cache_size(text) == want


def test_auto_on_the_calling_thread_reads_what_a_thread_reads(stores: dict[str, Path]) -> None:
    """48x48x3 batches of 32 (216 KiB) fit the L2 cache: "auto" reads them on the calling thread,
    the same batches, epoch after epoch, as a reader thread and as ``workers=0``."""
    with dlpack.open(stores["zarr-none-48"]) as ds:
        auto = ds.loader(batch_size=32, seed=5, drop_last=False)
        assert auto.workers == 0 and "workers=auto->0 (48x48x3 batches of 32" in repr(auto)
        for other in (ds.loader(batch_size=32, seed=5, drop_last=False, workers=w) for w in (0, 1)):
            for epoch in range(3):
                auto.set_epoch(epoch)
                got, want = list(auto), list(other)
                assert [len(b["index"]) for b in got] == [32, 8]
                for g, w in zip(got, want, strict=True):
                    assert np.array_equal(g["index"], w["index"]) and np.array_equal(g["image"], w["image"])
                    assert np.array_equal(g["image"], ds.get_batch(g["index"])["image"])


def test_the_default_is_auto_and_repr_says_why() -> None:
    assert LoaderOptions().workers == "auto"
    loader = Loader(_Source(SMALL), LoaderOptions(batch_size=256))
    n, why = auto_workers(loader.source, loader.options)
    assert loader.workers == n >= 1 and f"workers=auto->{n} ({why})" in repr(loader)
    assert "3.1 MB" in repr(loader)
    fixed = Loader(_Source(SMALL), LoaderOptions(batch_size=256, workers=2))
    assert fixed.workers == 2 and " workers=2 {" in repr(fixed)
    assert Loader(_Source(SMALL), LoaderOptions(workers=3)).workers == 3
    with_transform = Loader(_Source(SMALL), LoaderOptions(batch_size=256), transform=lambda b: b)
    assert "work per batch" in repr(with_transform) or with_transform.workers == 1  # one core: 1


@pytest.mark.parametrize("bad", ["many", "2", -1, 1.5, True])
def test_workers_refuses_anything_but_auto_or_a_count(bad: Any) -> None:
    with pytest.raises(OptionError, match="workers must be"):
        LoaderOptions(workers=bad)


def test_auto_reads_every_batch_and_resumes_with_other_workers(stores: dict[str, Path]) -> None:
    with dlpack.open(stores["zarr-none-48"]) as ds:
        assert isinstance(ds, dlpack.Dataset)
        ref = [b["index"].tolist() for b in ds.loader(batch_size=8, workers=0, seed=3)]
        auto = ds.loader(batch_size=8, seed=3)
        it = iter(auto)
        got = [next(it)["index"].tolist(), next(it)["index"].tolist()]
        state = auto.state_dict()
        it.close()
        assert state["options"]["workers"] == "auto"
        again = ds.loader(batch_size=8, seed=3, workers=2)
        again.load_state_dict(state)
        got += [b["index"].tolist() for b in again]
        assert got == ref and sorted(sum(ref, [])) == list(range(N))
        back = ds.loader(batch_size=8, seed=3, workers=1)
        back.load_state_dict(again.state_dict() | {"options": {**again.state_dict()["options"], "workers": "auto"}})
        assert back.state_dict()["epoch"] == again.state_dict()["epoch"] == 1


def test_gather_rows_of_large_rows_across_views() -> None:
    """Rows of 64 KiB or more take the row-by-row path across shards: the same bytes."""
    rng = np.random.default_rng(2)
    whole = rng.integers(0, 256, (7, 128, 128, 4), dtype=np.uint8)  # 64 KiB rows
    views = [whole[s : s + 3] for s in range(0, 7, 3)]
    idx = np.array([6, 0, 4, 4, 2, 5], dtype=np.int64)
    out = np.zeros((6, 128, 128, 4), dtype=np.uint8)
    assert np.array_equal(gather_rows(views, 3, idx, out), whole[idx])


@pytest.mark.parametrize("suffix", [".zarr", ".h5"])
def test_keyed_arrays_ride_along_identical_to_the_samples(tmp_path: Path, suffix: str) -> None:
    src = _folder(tmp_path / "png", 12, 16, 3)
    store = tmp_path / f"s{suffix}"
    dlpack.build(src, store, size=(16, 16), quiet=True)
    rng = np.random.default_rng(4)
    dlpack.add_array(store, "weight", rng.random(12).astype(np.float32))
    dlpack.add_array(store, "emb", rng.random((12, 3, 2)).astype(np.float32))
    dlpack.add_array(
        store, "boxes", [rng.random((int(k), 4)).astype(np.float32) for k in rng.integers(0, 3, 12)], ragged=True
    )
    with dlpack.open(store) as ds:
        assert isinstance(ds, dlpack.Dataset)
        for idx in (np.array([11, 0, 5, 5, 3]), np.arange(12)[::-1].copy()):
            batch = ds.get_batch(idx)
            for r, i in enumerate(idx.tolist()):
                s = ds[i]
                assert batch["weight"][r] == s["weight"] and np.array_equal(batch["emb"][r], s["emb"])
                assert np.array_equal(batch["boxes"][r], s["boxes"]) and batch["label"][r] == s["label"]
