"""Grouped reads: a source with independent rows is read a group of batches per ``get_batch`` call.

Each batch of a group is a view of one pooled block; every batch must be the one the loader gave
when it read batch by batch (same keys, types, dtypes and values), the pool must never reuse a
block that a live batch still points into, and a group no reader thread has started is read on
the caller's thread.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from _variants import store_with_variants

import dlpack
from dlpack.backends.reader import SourceList
from dlpack.ragged import RaggedBatch
from dlpack.read.loader import Loader, LoaderOptions, split_batch

N = 60
SIDE = 8


class Recording:
    """A BatchSource over ``inner`` that records each ``get_batch`` call (indices, epoch, thread),
    and says its rows are independent only when ``grouped``."""

    def __init__(self, inner: Any, grouped: bool) -> None:
        self.inner = inner
        self.batch_rows_independent = grouped
        self.calls: list[tuple[list[int], int, str]] = []
        self.lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.inner)

    def get_batch(self, indices: np.ndarray, epoch: int = 0, out: np.ndarray | None = None) -> dict[str, Any]:
        with self.lock:
            self.calls.append((indices.tolist(), epoch, threading.current_thread().name))
        batch: dict[str, Any] = self.inner.get_batch(indices, epoch, out)
        return batch

    def warm(self) -> None:
        self.inner.warm()

    def fingerprint(self) -> str:
        return str(self.inner.fingerprint())

    def image_layout(self) -> tuple[tuple[int, ...], str] | None:
        layout: tuple[tuple[int, ...], str] | None = self.inner.image_layout()
        return layout


@pytest.fixture(scope="module", params=[".zarr", ".h5"])
def labelled(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store with labels, train/val splits, a fixed keyed array, a mask and ragged boxes."""
    tmp = tmp_path_factory.mktemp("group")
    rng = np.random.default_rng(3)
    for i in range(N):
        d = tmp / "png" / ("train" if i % 3 else "val") / f"class{i % 2}"
        d.mkdir(parents=True, exist_ok=True)
        assert cv2.imwrite(str(d / f"{i:03d}.png"), rng.integers(0, 256, (SIDE, SIDE, 3), dtype=np.uint8))
    store = tmp / f"s{request.param}"
    dlpack.build(tmp / "png", store, size=(SIDE, SIDE), jobs=1, quiet=True)
    dlpack.add_array(store, "weight", rng.random(N).astype(np.float32))
    dlpack.add_array(store, "mask", rng.integers(0, 3, (N, SIDE, SIDE), dtype=np.uint8))
    boxes = [rng.random((int(k), 4)).astype(np.float32) for k in rng.integers(0, 4, N)]
    dlpack.add_array(store, "boxes", boxes, ragged=True)
    return store


def assert_same_batch(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert list(got) == list(want)
    for key, w in want.items():
        g = got[key]
        assert type(g) is type(w), key
        if isinstance(w, np.ndarray):
            assert g.dtype == w.dtype and g.shape == w.shape and np.array_equal(g, w), key
        elif isinstance(w, RaggedBatch):
            assert g.data.dtype == w.data.dtype and np.array_equal(g.offsets, w.offsets), key
            assert np.array_equal(g.data, w.data), key
        else:
            assert list(g) == list(w), key


def epochs(loader: Loader, count: int) -> list[dict[str, Any]]:
    out = []
    for e in range(count):
        loader.set_epoch(e)
        out += list(loader)
    return out


@pytest.mark.parametrize("workers", [0, 1, 2])
def test_grouped_batches_equal_batch_by_batch_ones_key_by_key(labelled: Path, workers: int) -> None:
    with dlpack.open(labelled) as ds:
        assert ds.splits == ("train", "val")
        opts = LoaderOptions(batch_size=7, workers=workers, seed=5)
        sel = ds.indices("train")
        grouped = Recording(ds, grouped=True)
        plain = Recording(ds, grouped=False)
        got = epochs(Loader(grouped, opts, indices=sel, split="train"), 3)
        want = epochs(Loader(plain, opts, indices=sel, split="train"), 3)
        assert len(got) == len(want) == 3 * -(-len(sel) // 7)
        for g, w in zip(got, want, strict=True):
            assert_same_batch(g, w)
        assert {"weight", "mask", "boxes", "split", "source", "label"} <= set(got[0])
        assert isinstance(got[0]["boxes"], RaggedBatch) and isinstance(got[0]["source"], SourceList)
        # The whole epoch (6 batches of 7, < 2 MiB) is one group: one call per epoch, not per batch
        # (the threads also read the first group of epoch 3 ahead).
        assert len([c for c in plain.calls if c[1] < 3]) == len(want)
        assert len([c for c in grouped.calls if c[1] < 3]) == 3


def test_grouped_cached_views_equal_batch_by_batch_ones(tmp_path: Path) -> None:
    store = store_with_variants(tmp_path, "zarr", 3, 24)
    with dlpack.open(store) as ds:
        for m in (1, 2):
            opts = LoaderOptions(batch_size=4, augment="cached", views_per_batch=m, seed=2, workers=1)
            loader = ds.loader(opts)
            assert loader._grouped and loader._group > 1
            ungrouped = ds.loader(opts)
            ungrouped._grouped = False  # what the loader did before grouped reads
            got, want = epochs(loader, 5), epochs(ungrouped, 5)
            assert "variant" in got[0] and len(got) == len(want) == 5 * 24 // (4 // m)
            for g, w in zip(got, want, strict=True):
                assert_same_batch(g, w)
        views = Recording(ds.cached_views(2), grouped=True)
        assert len(epochs(Loader(views, LoaderOptions(batch_size=4, seed=2, workers=0)), 2)) == 12
        assert len(views.calls) == 2  # one call per epoch of 6 batches


def test_a_held_batch_keeps_its_pixels_while_the_pool_reads_on(labelled: Path) -> None:
    with dlpack.open(labelled) as ds:
        loader = ds.loader(batch_size=4, workers=1, prefetch=2, seed=1)
        assert loader._group > 1  # several batches share one block
        held: list[dict[str, Any]] = []
        for e in range(6):
            loader.set_epoch(e)
            for k, batch in enumerate(loader):
                if k % 5 == 2:  # one batch of a group: its block must not be reused
                    held.append(batch)
        for batch in held:
            assert np.array_equal(batch["image"], ds.get_batch(batch["index"])["image"])
            assert np.array_equal(batch["mask"], ds.get_batch(batch["index"])["mask"])


@pytest.mark.slow
def test_a_group_no_thread_started_is_read_on_the_callers_thread(labelled: Path) -> None:
    with dlpack.open(labelled) as ds:
        src = Recording(ds, grouped=True)
        loader = Loader(src, LoaderOptions(batch_size=2, workers=1, prefetch=2, shuffle=False))
        assert loader._group > 1
        gate = threading.Event()
        loader._executor(1).submit(gate.wait, 10)  # the only reader thread is busy elsewhere
        try:
            got = list(loader)
        finally:
            gate.set()
        assert np.array_equal(np.concatenate([b["index"] for b in got]), np.arange(N))
        assert any(name == threading.current_thread().name for _, _, name in src.calls)


def test_a_value_that_cannot_be_cut_falls_back_to_batch_by_batch(labelled: Path) -> None:
    class Odd(Recording):
        def get_batch(self, indices: np.ndarray, epoch: int = 0, out: np.ndarray | None = None) -> dict[str, Any]:
            return super().get_batch(indices, epoch, out) | {"calls": object()}

    with dlpack.open(labelled) as ds:
        src = Odd(ds, grouped=True)
        got = list(Loader(src, LoaderOptions(batch_size=8, workers=0, seed=3)))
        assert len(got) == -(-N // 8) and all(len(b["index"]) == len(b["image"]) for b in got)
        assert sorted(np.concatenate([b["index"] for b in got]).tolist()) == list(range(N))
        # one grouped attempt, then each batch on its own
        assert len(src.calls) == 1 + len(got)


def test_split_batch_cuts_every_kind_of_value_by_rows() -> None:
    ragged = RaggedBatch(np.arange(12, dtype=np.float32).reshape(6, 2), np.array([0, 1, 1, 3, 4, 6, 6]))
    batch = {"image": np.arange(6 * 4).reshape(6, 2, 2), "index": np.arange(6), "list": list("abcdef"), "r": ragged}
    parts = split_batch(batch, [2, 3, 1])
    assert parts is not None and [list(p) for p in parts] == [list(batch)] * 3
    assert np.array_equal(parts[1]["image"], batch["image"][2:5]) and parts[2]["list"] == ["f"]
    cut = parts[1]["r"]
    assert isinstance(cut, RaggedBatch) and len(cut) == 3
    assert all(np.array_equal(a, b) for a, b in zip(cut, list(ragged)[2:5], strict=True))
    assert split_batch(batch | {"n": np.float32(1)}, [3, 3]) is None
    assert split_batch(batch | {"short": np.arange(5)}, [3, 3]) is None


def test_source_list_take_rows_is_the_slice_still_undecoded(labelled: Path) -> None:
    with dlpack.open(labelled) as ds:
        sources = ds.get_batch(np.arange(10))["source"]
        part = sources.take_rows(3, 7)
        assert isinstance(part, SourceList) and list(part) == list(sources)[3:7]


def test_while_a_thread_reads_the_head_the_caller_reads_the_next_group(labelled: Path) -> None:
    """The caller waits for a group a thread is reading: it reads the next one meanwhile (a reader
    thread alone must not be slower than reading in the calling thread)."""
    main = threading.current_thread().name
    gate = threading.Event()

    class Gated(Recording):
        def get_batch(self, indices: np.ndarray, epoch: int = 0, out: np.ndarray | None = None) -> dict[str, Any]:
            if threading.current_thread().name == main:
                gate.set()
            else:
                gate.wait(10)  # the thread's first read holds until the caller reads one itself
            return super().get_batch(indices, epoch, out)

    with dlpack.open(labelled) as ds:
        src = Gated(ds, grouped=True)
        loader = Loader(src, LoaderOptions(batch_size=2, workers=1, prefetch=4, shuffle=False))
        loader._group = 1  # four single-batch groups ahead
        t = time.perf_counter()
        got = list(loader)
        assert time.perf_counter() - t < 5
        assert np.array_equal(np.concatenate([b["index"] for b in got]), np.arange(N))
        names = {name for _, _, name in src.calls}
        assert main in names and len(names) == 2


def test_a_stolen_read_that_fails_raises_when_its_batch_is_asked_for(labelled: Path) -> None:
    main = threading.current_thread().name
    gate = threading.Event()

    class Failing(Recording):
        def get_batch(self, indices: np.ndarray, epoch: int = 0, out: np.ndarray | None = None) -> dict[str, Any]:
            if threading.current_thread().name == main:
                gate.set()
                raise OSError("disk gone")
            gate.wait(10)
            return super().get_batch(indices, epoch, out)

    with dlpack.open(labelled) as ds:
        loader = Loader(Failing(ds, grouped=True), LoaderOptions(batch_size=2, workers=1, prefetch=4, shuffle=False))
        loader._group = 1
        it = iter(loader)
        assert next(it)["index"].tolist() == [0, 1]  # the thread's read, handed out first
        with pytest.raises(OSError, match="disk gone"):
            next(it)


@pytest.mark.parametrize("workers", [0, 2])
def test_the_transform_and_finisher_run_once_per_batch_in_order_on_grouped_reads(labelled: Path, workers: int) -> None:
    seen: list[list[int]] = []
    finished: list[list[int]] = []

    def transform(batch: dict[str, Any], indices: np.ndarray) -> dict[str, Any]:
        assert np.array_equal(batch["index"], indices) and len(batch["image"]) == len(indices)
        seen.append(indices.tolist())
        return batch | {"doubled": batch["image"].astype(np.int16) * 2}

    def finisher(batch: dict[str, Any]) -> dict[str, Any]:
        finished.append(batch["index"].tolist())
        return batch

    with dlpack.open(labelled) as ds:
        src = Recording(ds, grouped=True)
        loader = Loader(src, LoaderOptions(batch_size=6, workers=workers, seed=4), transform, finisher=finisher)
        got = list(loader)
        want = [b.tolist() for b in loader.batches(0)]
        assert [b["index"].tolist() for b in got] == want == seen == finished
        assert len(src.calls) < len(want)  # grouped: fewer calls than batches
        for batch in got:
            assert np.array_equal(batch["doubled"], ds.get_batch(batch["index"])["image"].astype(np.int16) * 2)


def test_the_loader_reads_a_store_through_get_valid_batch_which_equals_get_batch(labelled: Path) -> None:
    """The loader's indices are in range by construction, so a store skips its index check for
    them; for a caller, ``get_batch`` still checks (and gives the same batch)."""
    with dlpack.open(labelled) as ds:
        idx = np.array([5, 0, 59, 17], dtype=np.int64)
        assert_same_batch(ds.get_valid_batch(idx), ds.get_batch(idx))
        with pytest.raises(dlpack.SampleIndexError, match="out of range"):
            ds.get_batch(np.array([0, N], dtype=np.int64))
        called = []
        valid = ds.get_valid_batch

        def recorded(indices: np.ndarray, epoch: int = 0, out: np.ndarray | None = None) -> dict[str, Any]:
            called.append(len(indices))
            return valid(indices, epoch, out)

        ds.get_valid_batch = recorded  # type: ignore[method-assign]
        got = [b["index"].tolist() for b in ds.loader(batch_size=7, workers=0, seed=2)]
        assert sum(called) == N and sorted(i for b in got for i in b) == list(range(N))


def test_large_batches_on_the_calling_thread_are_read_one_by_one_into_the_same_blocks(tmp_path: Path) -> None:
    """With ``workers=0``, batches of at least ``_ALONE_BYTES`` are read one ``get_batch`` each, and
    a caller that drops each batch before the next gets the same two blocks again and again (they
    stay in the CPU cache); smaller batches are still read in groups."""
    from dlpack.read import loader as loader_module

    rng = np.random.default_rng(4)
    for i in range(24):
        d = tmp_path / "png" / f"class{i % 2}"
        d.mkdir(parents=True, exist_ok=True)
        assert cv2.imwrite(str(d / f"{i:03d}.png"), rng.integers(0, 256, (64, 64, 3), dtype=np.uint8))
    dlpack.build(tmp_path / "png", tmp_path / "s.zarr", size=(64, 64), jobs=1, quiet=True)
    with dlpack.open(tmp_path / "s.zarr") as ds:
        for batch_size in (16, 2):  # 192 KiB and 24 KiB batches
            src = Recording(ds, grouped=True)
            loader = Loader(src, LoaderOptions(batch_size=batch_size, workers=0, seed=1))
            alone = batch_size * 64 * 64 * 3 >= loader_module._ALONE_BYTES
            addresses = set()
            for _ in range(3):
                for batch in loader:
                    addresses.add(batch["image"].__array_interface__["data"][0])
                    assert np.array_equal(batch["image"], ds.get_batch(batch["index"])["image"])
                    del batch
            sizes = [len(idx) for idx, _, _ in src.calls]
            if alone:
                assert batch_size * 64 * 64 * 3 == 192 * 2**10
                assert sizes == [16, 8] * 3 and len(addresses) <= 2
            else:
                assert max(sizes) > batch_size  # grouped: several batches per call
