"""The training loader and the read side: exact epochs, rank shards, exact resume, safe readers.

Every loader test runs against both backends: the module fixture ``store_path`` builds one small
store per backend (50 noise PNGs in 3 class folders, packed at 16x12). Order properties that need
no store call :func:`dlpack.read.loader.epoch_order` and :func:`dlpack.read.loader.rank_indices` directly.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import multiprocessing
import os
import pickle
import re
import shutil
import threading
from collections.abc import Iterator
from dataclasses import replace as replace_options
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dlpack
from dlpack import (
    FormatVersionError,
    IncompleteStoreError,
    LoaderOptions,
    OptionError,
    StateError,
    StoreError,
)
from dlpack.read.loader import BatchSource, epoch_order, rank_indices, sample_rng

N_IMAGES = 50
SIZE = (16, 12)  # width, height
SHAPE = (12, 16, 3)  # what a stored image looks like
ORDERS = ("random", "sequential", "block")
STORE_NAMES = {"zarr": "out.zarr", "hdf5": "out.h5"}


# ---------------------------------------------------------------- fixtures


def write_pngs(root: Path, n: int, seed: int, dark: bool = False) -> Path:
    """``n`` noise PNGs in ``class0..class2`` folders, at sizes from 16x12 up to 22x16 (never upscaled).

    ``dark``: 16x12 black images whose only non-zero pixel is the first (no two alike, none empty).
    """
    rng = np.random.default_rng(seed)
    for k in range(n):
        if dark:
            img = np.zeros(SHAPE, np.uint8)
            img[0, 0] = k + 1
        else:
            h, w = SHAPE[0] + k % 5, SHAPE[1] + k % 7
            img = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        ok, buf = cv2.imencode(".png", img)
        assert ok
        folder = root / f"class{k % 3}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"img{k:03d}.png").write_bytes(buf.tobytes())
    return root


def build_store(tmp: Path, backend: str, seed: int, n: int = N_IMAGES, dark: bool = False) -> Path:
    src = write_pngs(tmp / "src", n, seed, dark)
    out = tmp / STORE_NAMES[backend]
    dlpack.build(src, out, size=SIZE, jobs=1, quiet=True)
    return out


@pytest.fixture(scope="module", params=sorted(STORE_NAMES))
def store_path(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished 50-image store, one per backend."""
    return build_store(tmp_path_factory.mktemp(f"loader-{request.param}"), request.param, seed=1)


@pytest.fixture(scope="module")
def other_store_path(store_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store of the same backend and size with different pixels (so only the content differs)."""
    backend = "hdf5" if store_path.suffix == ".h5" else "zarr"
    return build_store(tmp_path_factory.mktemp(f"other-{backend}"), backend, seed=2)


@pytest.fixture(scope="module")
def ds(store_path: Path) -> Iterator[dlpack.Dataset]:
    d = dlpack.open(store_path)
    yield d
    d.close()


@pytest.fixture(scope="module")
def all_images(ds: dlpack.Dataset) -> np.ndarray:
    """Every image, read one by one through ``ds[i]`` (the reference the batches must match)."""
    return np.stack([ds[i]["image"] for i in range(len(ds))])


@pytest.fixture
def store_copy(store_path: Path, tmp_path: Path) -> Path:
    """A private copy of the store that a test may damage."""
    dst = tmp_path / store_path.name
    if store_path.is_dir():
        shutil.copytree(store_path, dst)
    else:
        shutil.copy2(store_path, dst)
    return dst


def epoch_indices(loader: dlpack.Loader) -> list[np.ndarray]:
    """The index arrays of one pass over ``loader``."""
    return [b["index"] for b in loader]


def same_batches(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> bool:
    return len(a) == len(b) and all(
        np.array_equal(x["index"], y["index"])
        and np.array_equal(x["image"], y["image"])
        and np.array_equal(x["label"], y["label"])
        and x["source"] == y["source"]
        for x, y in zip(a, b, strict=True)
    )


def test_fixture_store_is_what_the_tests_assume(ds: dlpack.Dataset, all_images: np.ndarray) -> None:
    assert len(ds) == N_IMAGES
    assert ds.classes == ("class0", "class1", "class2")
    assert all_images.shape == (N_IMAGES, *SHAPE)
    assert all_images.dtype == np.uint8
    # Noise images: no two samples alike, so an index mix-up shows up as a pixel mismatch.
    flat = all_images.reshape(N_IMAGES, -1)
    assert len({row.tobytes() for row in flat}) == N_IMAGES


# ---------------------------------------------------------------- epoch order (pure functions)


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(0, 300),
    block_size=st.integers(1, 40),
    window=st.integers(1, 8),
    seed=st.integers(0, 2**32),
    epoch=st.integers(0, 10_000),
    order=st.sampled_from(ORDERS),
)
def test_epoch_order_is_an_exact_permutation(
    n: int, block_size: int, window: int, seed: int, epoch: int, order: str
) -> None:
    o = epoch_order(n, seed, epoch, order, block_size, window)  # type: ignore[arg-type]
    assert o.dtype == np.int64
    assert np.array_equal(np.sort(o), np.arange(n))
    assert np.array_equal(o, epoch_order(n, seed, epoch, order, block_size, window))  # type: ignore[arg-type]
    if order == "sequential":
        assert np.array_equal(o, np.arange(n))


@settings(max_examples=100, deadline=None)
@given(
    n=st.integers(1, 400),
    block_size=st.integers(1, 20),
    window=st.integers(1, 6),
    seed=st.integers(0, 2**32),
    epoch=st.integers(0, 100),
)
def test_block_order_keeps_each_block_inside_one_window(
    n: int, block_size: int, window: int, seed: int, epoch: int
) -> None:
    o = epoch_order(n, seed, epoch, "block", block_size, window)
    position = np.empty(n, dtype=np.int64)
    position[o] = np.arange(n)
    for start in range(0, n, block_size):
        p = position[start : start + block_size]
        assert p.max() - p.min() < block_size * window


def test_epoch_order_depends_on_seed_and_epoch() -> None:
    for order in ("random", "block"):
        base = epoch_order(500, 7, 3, order, 8, 4)  # type: ignore[arg-type]
        assert not np.array_equal(base, np.arange(500))
        assert not np.array_equal(base, epoch_order(500, 7, 4, order, 8, 4))  # type: ignore[arg-type]
        assert not np.array_equal(base, epoch_order(500, 8, 3, order, 8, 4))  # type: ignore[arg-type]
    assert np.array_equal(epoch_order(20, 1, 0, "sequential"), epoch_order(20, 2, 5, "sequential"))


def test_block_order_shuffles_blocks_and_samples_inside_windows() -> None:
    o = epoch_order(512, 3, 1, "block", 8, 4)  # 64 blocks of 8, windows of 4 blocks (32 samples)
    blocks = o // 8
    first_window = sorted(set(blocks[:32].tolist()))
    assert len(first_window) == 4  # a window holds whole blocks ...
    assert first_window != [0, 1, 2, 3]  # ... drawn from anywhere in the store
    # Samples are mixed inside each window: a sample is rarely followed by its successor.
    assert np.mean(np.diff(o) == 1) < 0.2


def test_epoch_order_refuses_an_unknown_order() -> None:
    with pytest.raises(OptionError, match="shuffled"):
        epoch_order(10, 0, 0, "shuffled")  # type: ignore[arg-type]


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(0, 300),
    world_size=st.integers(1, 6),
    drop_last=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_rank_shards_are_equal_and_cover_the_epoch(n: int, world_size: int, drop_last: bool, seed: int) -> None:
    order = epoch_order(n, seed, 0, "random")
    shards = [rank_indices(order, r, world_size, drop_last) for r in range(world_size)]
    sizes = {len(s) for s in shards}
    assert len(sizes) == 1  # equal on every rank, so every rank runs the same number of steps
    union = np.concatenate(shards)
    if drop_last:
        assert len(union) == len(set(union.tolist()))  # disjoint
        assert n - (world_size - 1) <= len(union) <= n
        assert set(union.tolist()) <= set(range(n))
    else:
        assert set(union.tolist()) == set(range(n))
        assert len(union) - n <= world_size - 1  # only the padding repeats
    # Contiguous shares of the one global order, in rank order.
    assert np.array_equal(union, np.resize(order, len(union)))


# ---------------------------------------------------------------- epochs over a store


@pytest.mark.parametrize("order", ORDERS)
def test_every_epoch_covers_each_sample_exactly_once(ds: dlpack.Dataset, order: str) -> None:
    loader = ds.loader(batch_size=8, order=order, block_size=7, window=3, seed=5)  # 50 is no multiple of 7
    seen = []
    for epoch in range(3):
        loader.set_epoch(epoch)
        idx = np.concatenate(epoch_indices(loader))
        assert np.array_equal(np.sort(idx), np.arange(N_IMAGES))
        assert np.array_equal(idx, epoch_order(N_IMAGES, 5, epoch, order, 7, 3))  # type: ignore[arg-type]
        seen.append(idx)
    if order == "sequential":
        assert all(np.array_equal(s, np.arange(N_IMAGES)) for s in seen)
    else:
        assert not np.array_equal(seen[0], seen[1])


def test_shuffle_flag_picks_the_default_order(ds: dlpack.Dataset) -> None:
    plain = np.concatenate(epoch_indices(ds.loader(batch_size=8, shuffle=False)))
    assert np.array_equal(plain, np.arange(N_IMAGES))
    shuffled = np.concatenate(epoch_indices(ds.loader(batch_size=8, shuffle=True, seed=3)))
    assert np.array_equal(shuffled, epoch_order(N_IMAGES, 3, 0, "random"))


@pytest.mark.parametrize("order", ["random", "block"])
def test_order_is_deterministic_across_loaders(ds: dlpack.Dataset, order: str) -> None:
    def run(seed: int, epoch: int) -> np.ndarray:
        loader = ds.loader(batch_size=8, order=order, block_size=4, window=3, seed=seed)
        loader.set_epoch(epoch)
        return np.concatenate(epoch_indices(loader))

    assert np.array_equal(run(11, 2), run(11, 2))
    assert not np.array_equal(run(11, 2), run(11, 3))
    assert not np.array_equal(run(11, 2), run(12, 2))


# ---------------------------------------------------------------- batches


@pytest.mark.parametrize("workers", [0, 2])
def test_batches_match_samples(ds: dlpack.Dataset, all_images: np.ndarray, workers: int) -> None:
    loader = ds.loader(batch_size=8, seed=4, workers=workers)
    batches = list(loader)
    assert [len(b["index"]) for b in batches] == [8] * 6 + [2]
    assert len(loader) == len(batches) == 7
    for b in batches:
        assert set(b) == {"image", "label", "index", "source"}
        idx = b["index"]
        assert b["image"].shape == (len(idx), *SHAPE)
        assert b["image"].dtype == np.uint8
        assert np.array_equal(b["image"], np.stack([ds[int(i)]["image"] for i in idx]))
        assert np.array_equal(b["image"], all_images[idx])
        assert b["label"].tolist() == [ds[int(i)]["label"] for i in idx]
        assert b["source"] == [ds[int(i)]["source"] for i in idx]
        # Labels come from the class folder each source file sits in.
        assert [ds.classes[lab] for lab in b["label"]] == [s.split("/")[0] for s in b["source"]]


def test_get_batch_matches_samples(ds: dlpack.Dataset, all_images: np.ndarray) -> None:
    idx = [49, 0, 7, 7, -1]
    batch = ds.get_batch(idx)
    assert batch["index"].tolist() == [49, 0, 7, 7, 49]
    assert np.array_equal(batch["image"], all_images[[49, 0, 7, 7, 49]])
    empty = ds.get_batch([])
    assert empty["image"].shape == (0, *SHAPE)
    assert len(empty["label"]) == 0 and empty["source"] == []
    with pytest.raises(IndexError, match="50"):
        ds.get_batch([0, 50])


@pytest.mark.parametrize(("batch_size", "expected"), [(8, [8] * 6), (10, [10] * 5), (64, []), (1, [1] * 50)])
def test_drop_last_drops_the_partial_batch(ds: dlpack.Dataset, batch_size: int, expected: list[int]) -> None:
    loader = ds.loader(batch_size=batch_size, drop_last=True, seed=2)
    sizes = [len(b["index"]) for b in loader]
    assert sizes == expected
    assert len(loader) == len(expected)
    keep = ds.loader(batch_size=batch_size, drop_last=False, seed=2)
    assert sum(len(b["index"]) for b in keep) == N_IMAGES
    assert len(keep) == -(-N_IMAGES // batch_size)


# ---------------------------------------------------------------- rank sharding


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("batch_size", [4, 7])
def test_rank_shards_of_a_store(ds: dlpack.Dataset, world_size: int, batch_size: int) -> None:
    for drop_last in (True, False):
        per_rank = []
        for rank in range(world_size):
            loader = ds.loader(
                batch_size=batch_size, seed=9, rank=rank, world_size=world_size, drop_last=drop_last, workers=0
            )
            loader.set_epoch(1)
            got = epoch_indices(loader)
            assert len(got) == len(loader)
            per_rank.append(got)
        counts = {len(b) for b in per_rank}
        assert len(counts) == 1, f"ranks run different numbers of steps: {[len(b) for b in per_rank]}"
        samples = [np.concatenate(b) if b else np.empty(0, np.int64) for b in per_rank]
        union = np.concatenate(samples)
        if drop_last:
            assert len(union) == len(set(union.tolist()))
            assert all(len(b) == batch_size for r in per_rank for b in r)
            assert counts == {(N_IMAGES // world_size) // batch_size}
        else:
            assert set(union.tolist()) == set(range(N_IMAGES))
            assert len(union) - N_IMAGES <= world_size - 1
            share = -(-N_IMAGES // world_size)
            assert counts == {-(-share // batch_size)}


# ---------------------------------------------------------------- resume


def _take(loader: dlpack.Loader, k: int) -> list[dict[str, Any]]:
    """The first ``k`` batches of a pass, leaving the loader where a training loop that stops would."""
    it = iter(loader)
    got = list(itertools.islice(it, k))
    it.close()
    return got


@settings(max_examples=60, deadline=None)
@given(
    batch_size=st.integers(1, 13),
    drop_last=st.booleans(),
    order=st.sampled_from(ORDERS),
    seed=st.integers(0, 2**31),
    epoch=st.integers(0, 3),
    stop=st.integers(0, 60),
    saver=st.tuples(st.sampled_from([0, 1, 2]), st.sampled_from([0, 1, 4])),
    resumer=st.tuples(st.sampled_from([0, 1, 2]), st.sampled_from([0, 1, 4])),
)
def test_resume_equals_an_uninterrupted_run(
    ds: dlpack.Dataset,
    batch_size: int,
    drop_last: bool,
    order: str,
    seed: int,
    epoch: int,
    stop: int,
    saver: tuple[int, int],
    resumer: tuple[int, int],
) -> None:
    opts = LoaderOptions(batch_size=batch_size, drop_last=drop_last, order=order, seed=seed, block_size=6, window=2)  # type: ignore[arg-type]

    def loader(workers: int, prefetch: int) -> dlpack.Loader:
        return ds.loader(opts, workers=workers, prefetch=prefetch)

    ref = loader(0, 0)
    ref.set_epoch(epoch)
    this_epoch = list(ref)
    next_epoch = list(ref)
    k = min(stop, len(this_epoch))

    first = loader(*saver)
    first.set_epoch(epoch)
    head = _take(first, k)
    assert same_batches(head, this_epoch[:k])
    state = json.loads(json.dumps(first.state_dict()))

    second = loader(*resumer)
    second.load_state_dict(state)
    rest = list(second)
    if k < len(this_epoch):
        assert same_batches(rest, this_epoch[k:])
        assert same_batches(list(second), next_epoch)  # and it carries on into the next epoch
    else:  # stopped at the end of the epoch: resuming starts the next one
        assert same_batches(rest, next_epoch)


@pytest.mark.parametrize("exhaust", [True, False])
def test_resume_at_an_epoch_boundary(ds: dlpack.Dataset, exhaust: bool) -> None:
    ref = ds.loader(batch_size=8, seed=1)
    epoch0, epoch1 = epoch_indices(ref), epoch_indices(ref)
    first = ds.loader(batch_size=8, seed=1)
    if exhaust:
        list(first)  # the pass ran to its end: the loader has moved to epoch 1
    else:
        _take(first, len(epoch0))  # the last batch was handed out, but the pass was not finished
    state = json.loads(json.dumps(first.state_dict()))
    assert (state["epoch"], state["position"]) == ((1, 0) if exhaust else (0, len(epoch0)))
    second = ds.loader(batch_size=8, seed=1, workers=1, prefetch=1)
    second.load_state_dict(state)
    got = epoch_indices(second)
    assert len(got) == len(epoch1)
    assert all(np.array_equal(a, b) for a, b in zip(got, epoch1, strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(epoch0, epoch1, strict=True))


def test_state_dict_is_json_and_names_its_fields(ds: dlpack.Dataset) -> None:
    loader = ds.loader(batch_size=8, seed=3)
    _take(loader, 2)
    state = loader.state_dict()
    assert json.loads(json.dumps(state)) == state
    assert state["epoch"] == 0 and state["position"] == 2
    assert state["count"] == N_IMAGES


# ---------------------------------------------------------------- workers and prefetch


def test_workers_and_prefetch_do_not_change_batches(ds: dlpack.Dataset) -> None:
    def run(workers: int, prefetch: int) -> list[dict[str, Any]]:
        loader = ds.loader(batch_size=6, seed=21, workers=workers, prefetch=prefetch)
        return list(loader) + list(loader)  # two epochs

    ref = run(0, 0)
    assert len(ref) == 2 * 9
    for workers, prefetch in itertools.product([0, 1, 2], [0, 1, 4]):
        assert same_batches(run(workers, prefetch), ref), (workers, prefetch)


# ---------------------------------------------------------------- epochs advance


def test_iterating_again_moves_to_the_next_epoch(ds: dlpack.Dataset) -> None:
    loader = ds.loader(batch_size=8, seed=13)
    assert loader.epoch == 0
    e0 = np.concatenate(epoch_indices(loader))
    assert loader.epoch == 1
    e1 = np.concatenate(epoch_indices(loader))
    assert loader.epoch == 2
    assert np.array_equal(e0, epoch_order(N_IMAGES, 13, 0))
    assert np.array_equal(e1, epoch_order(N_IMAGES, 13, 1))
    loader.set_epoch(0)
    assert np.array_equal(np.concatenate(epoch_indices(loader)), e0)


def test_set_epoch_restarts_a_partly_read_epoch(ds: dlpack.Dataset) -> None:
    loader = ds.loader(batch_size=8, seed=13)
    _take(loader, 3)
    loader.set_epoch(1)
    assert np.array_equal(np.concatenate(epoch_indices(loader)), epoch_order(N_IMAGES, 13, 1))
    _take(loader, 2)
    loader.set_epoch(1)  # the same epoch again: back to its first batch
    assert np.array_equal(np.concatenate(epoch_indices(loader)), epoch_order(N_IMAGES, 13, 1))
    with pytest.raises(OptionError, match="epoch"):
        loader.set_epoch(-1)


def test_a_pass_over_an_empty_epoch_advances_one_epoch(ds: dlpack.Dataset) -> None:
    loader = ds.loader(batch_size=64, drop_last=True)  # 50 samples: no full batch
    assert list(loader) == []
    assert loader.epoch == 1


# ---------------------------------------------------------------- one pass at a time


@pytest.mark.parametrize("workers", [0, 2])
def test_a_second_live_iterator_is_refused(ds: dlpack.Dataset, workers: int) -> None:
    loader = ds.loader(batch_size=8, seed=4, workers=workers)
    first = iter(loader)
    head = [next(first)["index"] for _ in range(2)]
    with pytest.raises(StateError, match="already being iterated; finish or close the first iterator"):
        iter(loader)
    with pytest.raises(StateError, match="already being iterated"):
        list(loader)
    rest = [b["index"] for b in first]  # the refused attempts did not disturb the first pass
    assert np.array_equal(np.concatenate(head + rest), epoch_order(N_IMAGES, 4, 0))
    assert loader.epoch == 1


def test_state_cannot_be_changed_under_a_live_iterator(ds: dlpack.Dataset) -> None:
    loader = ds.loader(batch_size=8, seed=4)
    state = loader.state_dict()
    it = iter(loader)
    next(it)
    assert loader.state_dict()["position"] == 1  # reading the state mid-pass is what checkpoints do
    with pytest.raises(StateError, match="already being iterated"):
        loader.set_epoch(3)
    with pytest.raises(StateError, match="already being iterated"):
        loader.load_state_dict(state)
    it.close()
    loader.load_state_dict(state)
    assert (loader.epoch, loader.state_dict()["position"]) == (0, 0)


def _exhaust(it: Iterator[dict[str, Any]]) -> None:
    for _ in it:
        pass


@pytest.mark.parametrize("end", ["exhausted", "closed", "dropped", "never started", "broken out of"])
def test_the_loader_is_free_again_after_its_iterator_ends(ds: dlpack.Dataset, end: str) -> None:
    loader = ds.loader(batch_size=8, seed=6, workers=2)
    it = iter(loader)
    if end == "exhausted":
        _exhaust(it)
    elif end == "closed":
        next(it)
        it.close()
    elif end == "dropped":
        next(it)
        del it  # garbage-collected: CPython closes the generator when its last reference goes
    elif end == "never started":
        del it
    else:
        del it
        for _ in loader:
            break
    # A new pass goes on after the last batch handed out (one, unless none was or the epoch ended).
    epoch, done = (1, 0) if end == "exhausted" else (0, 0 if end == "never started" else 8)
    assert loader.epoch == epoch
    assert np.array_equal(np.concatenate(epoch_indices(loader)), epoch_order(N_IMAGES, 6, epoch)[done:])


def test_two_loaders_over_one_dataset_iterate_side_by_side(ds: dlpack.Dataset) -> None:
    a, b = ds.loader(batch_size=8, seed=4), ds.loader(batch_size=8, seed=4, workers=0)
    got_a, got_b = [], []
    for x, y in zip(a, b, strict=True):
        got_a.append(x["index"])
        got_b.append(y["index"])
    assert np.array_equal(np.concatenate(got_a), epoch_order(N_IMAGES, 4, 0))
    assert np.array_equal(np.concatenate(got_b), epoch_order(N_IMAGES, 4, 0))


# ---------------------------------------------------------------- bad states


def test_state_of_another_dataset_is_refused(ds: dlpack.Dataset, other_store_path: Path) -> None:
    other = dlpack.open(other_store_path)
    assert len(other) == len(ds)  # same size: only the content tells them apart
    foreign = other.loader(batch_size=8)
    _take(foreign, 2)
    state = json.loads(json.dumps(foreign.state_dict()))
    loader = ds.loader(batch_size=8)
    with pytest.raises(StateError, match="another dataset"):
        loader.load_state_dict(state)
    assert (loader.epoch, loader.state_dict()["position"]) == (0, 0)  # untouched
    other.close()


@pytest.mark.parametrize(
    ("key", "saved", "resumed"),
    [
        # world_size and rank may differ: tests/read/test_elastic_resume.py
        ("batch_size", {"batch_size": 8}, {"batch_size": 16}),
        ("seed", {"seed": 1}, {"seed": 2}),
        ("drop_last", {"drop_last": True}, {"drop_last": False}),
        ("order", {"order": "block"}, {"order": "random"}),
    ],
)
def test_state_with_other_options_is_refused(
    ds: dlpack.Dataset, key: str, saved: dict[str, Any], resumed: dict[str, Any]
) -> None:
    first = ds.loader(**saved)
    _take(first, 1)
    state = json.loads(json.dumps(first.state_dict()))
    second = ds.loader(**resumed)
    with pytest.raises(StateError, match=rf"\b{key}="):
        second.load_state_dict(state)
    assert second.state_dict()["position"] == 0


@pytest.mark.parametrize(
    "bad",
    [
        {},
        {"foo": 1},
        [],
        "state",
        None,
        {"version": 1},
    ],
)
def test_garbage_state_is_refused(ds: dlpack.Dataset, bad: Any) -> None:
    with pytest.raises(StateError):
        ds.loader().load_state_dict(bad)


@pytest.mark.parametrize(
    "change",
    [
        {"epoch": -1},
        {"position": -2},
        {"epoch": "3"},
        {"position": 1.5},
        {"epoch": None},
        {"dataset": "0000000000000000"},
        {"count": 49},
    ],
)
def test_state_with_bad_fields_is_refused(ds: dlpack.Dataset, change: dict[str, Any]) -> None:
    state = {**ds.loader().state_dict(), **change}
    with pytest.raises(StateError):
        ds.loader().load_state_dict(state)


@pytest.mark.parametrize("change", [{"version": "1"}, {"version": None}, {"options": None}, {"options": []}])
def test_state_with_mistyped_fields_is_refused(ds: dlpack.Dataset, change: dict[str, Any]) -> None:
    state = {**ds.loader().state_dict(), **change}
    with pytest.raises(StateError):
        ds.loader().load_state_dict(state)


@pytest.mark.parametrize(
    ("opts", "batches"),
    [
        ({"batch_size": 8}, 7),  # 50 samples: 6 full batches and one of 2
        ({"batch_size": 8, "drop_last": True}, 6),
        ({"batch_size": 8, "world_size": 2, "rank": 1}, 4),  # 25 samples on this rank
        ({"batch_size": 64, "drop_last": True}, 0),
    ],
)
def test_state_past_the_end_of_the_epoch_is_refused(ds: dlpack.Dataset, opts: dict[str, Any], batches: int) -> None:
    loader = ds.loader(**opts)
    assert len(loader) == batches
    state = {**loader.state_dict(), "epoch": 2}
    loader.load_state_dict({**state, "position": batches})  # "epoch just finished", as the loader saves it
    assert (loader.epoch, loader.state_dict()["position"]) == (2, batches)
    fresh = ds.loader(**opts)
    for position in (batches + 1, batches + 100):
        with pytest.raises(StateError, match=f"position {position}.* {batches} batches"):
            fresh.load_state_dict({**state, "position": position})
    assert (fresh.epoch, fresh.state_dict()["position"]) == (0, 0)  # untouched


def test_newer_state_version_is_refused(ds: dlpack.Dataset) -> None:
    state = ds.loader().state_dict()
    ds.loader().load_state_dict(state)  # the unchanged state is fine
    with pytest.raises(StateError, match="newer"):
        ds.loader().load_state_dict({**state, "version": state["version"] + 1})


# ---------------------------------------------------------------- options


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"batch_size": 0}, r"batch_size must be an integer >= 1, got 0"),
        ({"batch_size": -3}, r"batch_size .* got -3"),
        ({"batch_size": 2.5}, r"batch_size .* got 2\.5"),
        ({"batch_size": True}, r"batch_size .* got True"),
        ({"prefetch": -1}, r"prefetch must be an integer >= 0"),
        ({"workers": -1}, r"workers must be an integer >= 0"),
        ({"world_size": 0}, r"world_size must be an integer >= 1"),
        ({"block_size": 0}, r"block_size"),
        ({"window": 0}, r"window"),
        ({"rank": 2, "world_size": 2}, r"rank must be in 0\.\.1 for world_size 2, got 2"),
        ({"rank": -1}, r"rank must be in 0\.\.0"),
        ({"rank": 4, "world_size": 4}, r"rank must be in 0\.\.3"),
        ({"order": "shuffled"}, r"order must be random, sequential or block, got 'shuffled'"),
    ],
)
def test_loader_options_are_validated(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(OptionError, match=message) as info:
        LoaderOptions(**kwargs)
    assert isinstance(info.value, ValueError)


def test_loader_options_accept_their_edges(ds: dlpack.Dataset) -> None:
    opts = LoaderOptions(
        batch_size=1, prefetch=0, workers=0, rank=3, world_size=4, order="block", block_size=1, window=1
    )
    assert opts.effective_order == "block"
    assert LoaderOptions(shuffle=False).effective_order == "sequential"
    assert LoaderOptions().effective_order == "random"
    with pytest.raises(OptionError, match="batch_size"):
        ds.loader(batch_size=0)  # keyword shortcuts are validated too
    base = LoaderOptions(batch_size=5, seed=7)
    assert ds.loader(base, workers=0).options == LoaderOptions(batch_size=5, seed=7, workers=0)


@pytest.mark.parametrize("seed", [-1, 1.5, "0"])
def test_loader_options_validate_the_seed(seed: Any) -> None:
    with pytest.raises(OptionError, match="seed"):
        LoaderOptions(seed=seed)


def test_numpy_integer_options_give_a_json_state(ds: dlpack.Dataset) -> None:
    loader = ds.loader(batch_size=np.int64(8), seed=np.int64(3))
    state = loader.state_dict()
    assert json.loads(json.dumps(state))["options"]["batch_size"] == 8


def test_rank_accepts_a_numpy_integer() -> None:
    assert LoaderOptions(rank=np.int64(1), world_size=2).rank == 1


# ---------------------------------------------------------------- pickling and transforms


def test_dataset_and_reader_pickle_after_reading(ds: dlpack.Dataset, all_images: np.ndarray) -> None:
    list(ds.loader(batch_size=16, workers=2))  # maps and handles are open now
    data = pickle.dumps(ds)
    assert len(data) < 2_000  # a path, not pixels or handles
    copy = pickle.loads(data)
    assert len(copy) == N_IMAGES and copy.classes == ds.classes
    assert np.array_equal(np.stack([copy[i]["image"] for i in range(N_IMAGES)]), all_images)
    assert np.array_equal(copy.get_batch(range(N_IMAGES))["image"], all_images)
    copy.close()

    reader = pickle.loads(pickle.dumps(ds.reader))
    assert type(reader) is type(ds.reader)
    assert np.array_equal(reader.read_image(17), all_images[17])
    assert np.array_equal(reader.meta("labels"), ds.reader.meta("labels"))
    reader.close()
    assert np.array_equal(ds[3]["image"], all_images[3])  # the original still reads


def _invert(batch: dict[str, Any]) -> dict[str, Any]:
    return {**batch, "image": 255 - batch["image"], "tag": threading.current_thread().name}


@pytest.mark.parametrize("workers", [0, 2])
def test_transform_is_applied_to_every_batch(ds: dlpack.Dataset, all_images: np.ndarray, workers: int) -> None:
    calls = []

    def transform(batch: dict[str, Any]) -> dict[str, Any]:
        calls.append(len(batch["index"]))
        return _invert(batch)

    loader = ds.loader(batch_size=8, seed=6, workers=workers, transform=transform)
    batches = list(loader)
    assert sorted(calls) == sorted([8] * 6 + [2])
    for b in batches:
        assert np.array_equal(b["image"], 255 - all_images[b["index"]])
    if workers:
        assert all(b["tag"].startswith("dlpack") for b in batches)  # ran on the loader's threads


# ---------------------------------------------------------------- reader safety


def _rewrite_manifest(path: Path, edit: Any) -> None:
    if path.is_dir():
        m = path / "manifest.json"
        m.write_text(edit(m.read_text(encoding="utf-8")), encoding="utf-8")
        return
    import h5py

    with h5py.File(path, "r+") as f:
        text = f["manifest"][()]
        text = text.decode("utf-8") if isinstance(text, bytes) else text
        del f["manifest"]
        new = edit(text)
        if new is not None:
            f.create_dataset("manifest", data=new, dtype=h5py.string_dtype("utf-8"))


def test_store_without_manifest_is_incomplete(store_copy: Path) -> None:
    if store_copy.is_dir():
        (store_copy / "manifest.json").unlink()
    else:
        _rewrite_manifest(store_copy, lambda text: None)
    with pytest.raises(IncompleteStoreError, match="incomplete"):
        dlpack.open(store_copy)


def test_newer_format_version_is_refused(store_copy: Path) -> None:
    def bump(text: str) -> str:
        d = json.loads(text)
        d["format_version"] = 999
        return json.dumps(d)

    _rewrite_manifest(store_copy, bump)
    with pytest.raises(FormatVersionError, match="999") as info:
        dlpack.open(store_copy)
    assert "pip install -U" in str(info.value)


def _shard_files(store: Path) -> list[Path]:
    return sorted(p for p in (store / "images" / "c").rglob("*") if p.is_file())


@pytest.mark.parametrize("keep", [0.0, 0.001, 0.5, 0.99])
def test_truncated_store_raises_store_error(store_copy: Path, keep: float) -> None:
    target = _shard_files(store_copy)[0] if store_copy.is_dir() else store_copy
    size = target.stat().st_size
    with open(target, "r+b") as f:
        f.truncate(int(size * keep))
    assert target.stat().st_size < size
    with pytest.raises(StoreError):  # noqa: PT012 - open or the read raises, whichever meets the damage
        d = dlpack.open(store_copy)
        d.get_batch(range(len(d)))
    with pytest.raises(StoreError):  # noqa: PT012 - open or the read raises, whichever meets the damage
        d = dlpack.open(store_copy)
        list(d.loader(batch_size=8, workers=2))


def test_truncated_shard_of_dark_images_raises_store_error(tmp_path: Path) -> None:
    n = 10
    store = build_store(tmp_path, "zarr", seed=0, n=n, dark=True)
    d = dlpack.open(store)
    assert sorted(d.get_batch(range(n))["image"][:, 0, 0, 0].tolist()) == list(range(1, n + 1))
    d.close()
    (shard,) = _shard_files(store)
    # Cut exactly the shard index (16 bytes per image) and its CRC: the new tail is black pixels.
    with open(shard, "r+b") as f:
        f.truncate(shard.stat().st_size - (16 * n + 4))
    d = dlpack.open(store)
    with pytest.raises(StoreError):
        d.get_batch(range(n))


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), written out here so the test does not trust the library's own."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 & -(crc & 1))
    return crc ^ 0xFFFFFFFF


def forge_shard_index(shard: Path, n: int, edit: Any) -> None:
    """Rewrite the shard's (offset, nbytes) table through ``edit`` and give it a valid checksum."""
    raw = bytearray(shard.read_bytes())
    table = np.frombuffer(bytes(raw[-(16 * n + 4) : -4]), dtype="<u8").reshape(n, 2).copy()
    assert crc32c(table.tobytes()) == int.from_bytes(raw[-4:], "little")  # the layout is what we think
    edit(table)
    body = table.astype("<u8").tobytes()
    raw[-(16 * n + 4) :] = body + crc32c(body).to_bytes(4, "little")
    shard.write_bytes(bytes(raw))


@pytest.mark.parametrize(
    ("case", "edit"),
    [
        pytest.param("unchanged", lambda t: None, id="unchanged"),
        pytest.param("short chunk", lambda t: t.__setitem__((3, 1), t[3, 1] - 1), id="short-chunk"),
        pytest.param("past the data", lambda t: t.__setitem__((3, 0), t[3, 0] + 10**6), id="past-the-data"),
        pytest.param(
            "wraps around",
            lambda t: t.__setitem__(3, [2**64 - 8, 16]),
            id="offset-plus-nbytes-wraps",
        ),
    ],
)
def test_shard_index_with_a_valid_checksum_is_still_checked(tmp_path: Path, case: str, edit: Any) -> None:
    n = 10
    store = build_store(tmp_path, "zarr", seed=4, n=n)
    d = dlpack.open(store)
    before = d.get_batch(range(n))["image"]
    d.close()
    (shard,) = _shard_files(store)
    forge_shard_index(shard, n, edit)
    d = dlpack.open(store)
    if case == "unchanged":
        assert np.array_equal(d.get_batch(range(n))["image"], before)
    else:
        with pytest.raises(StoreError):
            d.get_batch(range(n))


def _file_states(store: Path) -> dict[str, tuple[int, str]]:
    files = [store] if store.is_file() else sorted(p for p in store.rglob("*"))
    return {
        os.fspath(p.relative_to(store.parent)): (
            (p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest()) if p.is_file() else (0, "dir")
        )
        for p in files
    }


def test_reading_modifies_no_file(store_path: Path, all_images: np.ndarray) -> None:
    before = _file_states(store_path)
    assert len(before) >= 1
    d = dlpack.open(store_path)
    d.info()
    list(d.loader(batch_size=7, workers=2))
    assert np.array_equal(d.get_batch(range(N_IMAGES))["image"], all_images)
    copy = pickle.loads(pickle.dumps(d))
    assert copy[0]["source"] == d[0]["source"]
    copy.close()
    d.close()
    assert _file_states(store_path) == before


def _digest_worker(path: str, barrier: Any, results: Any) -> None:
    """Child process: open the store, wait for the sibling, then read every pixel."""
    d = dlpack.open(path)
    barrier.wait(timeout=60)
    h = hashlib.sha256()
    total = 0
    for batch in d.loader(batch_size=7, shuffle=False):
        total += int(batch["image"].sum(dtype=np.int64))
        h.update(batch["image"].tobytes())
    d.close()
    results.put((total, h.hexdigest()))


@pytest.mark.slow
def test_two_processes_read_one_store_at_once(store_path: Path, all_images: np.ndarray) -> None:
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    results = ctx.Queue()
    procs = [ctx.Process(target=_digest_worker, args=(os.fspath(store_path), barrier, results)) for _ in range(2)]
    for p in procs:
        p.start()
    got = [results.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    expected = (int(all_images.sum(dtype=np.int64)), hashlib.sha256(all_images.tobytes()).hexdigest())
    assert got == [expected, expected]


@pytest.mark.parametrize("workers", [0, 2])
def test_kept_batches_are_never_overwritten_by_buffer_reuse(tmp_path: Path, workers: int) -> None:
    store = build_store(tmp_path, "zarr", seed=5, n=40)
    d = dlpack.open(store)
    loader = d.loader(batch_size=4, workers=workers, prefetch=2, seed=3)
    kept = [b["image"] for b in loader]  # held by the caller: the pool must not recycle them
    views = [b["image"][:1] for b in loader]  # only a view held: its base must not be recycled either
    for images, b in zip(kept, loader.batches(0), strict=True):
        np.testing.assert_array_equal(images, d.get_batch(b)["image"])
    for view, b in zip(views, loader.batches(1), strict=True):
        np.testing.assert_array_equal(view, d.get_batch(b[:1])["image"])


def test_dropped_batches_are_recycled(tmp_path: Path) -> None:
    """Every batch is a view of one of the pool's blocks (none is a fresh array), and six epochs use
    fewer blocks than epochs: blocks are reused. How many the pool holds at a time (up to its limit)
    depends on how far the reader threads got ahead, so that is not what is asserted."""
    store = build_store(tmp_path, "hdf5", seed=6, n=40)
    loader = dlpack.open(store).loader(batch_size=4, workers=2, prefetch=2, seed=0)
    epochs, addresses = 6, []
    for _ in range(epochs):
        for batch in loader:
            addresses.append(batch["image"].__array_interface__["data"][0])
            del batch
    assert loader._pool is not None
    blocks = [(b.__array_interface__["data"][0], b.nbytes) for b, _ in loader._pool._bufs]
    assert len(addresses) == epochs * 10
    outside = [a for a in addresses if not any(start <= a < start + n for start, n in blocks)]
    assert not outside, f"{len(outside)} of {len(addresses)} batches were not read into a pooled block"
    assert len(blocks) <= loader._pool.limit
    assert len(blocks) < epochs, (len(blocks), loader._pool.limit)  # each epoch reads one group at least


# ---------------------------------------------------------------- BatchSource and per-sample randomness


class _Jitter:
    """A view over a BatchSource adding per-sample noise drawn from ``sample_rng``: the shape of an
    online augmentation, written without touching the loader's threading."""

    def __init__(self, inner: dlpack.Dataset, seed: int) -> None:
        self.inner, self.seed = inner, seed

    def __len__(self) -> int:
        return len(self.inner)

    def get_batch(self, indices: np.ndarray, epoch: int = 0, out: np.ndarray | None = None) -> dict[str, Any]:
        batch = self.inner.get_batch(indices, epoch, out)
        noise = [sample_rng(self.seed, epoch, int(i)).integers(0, 8, size=3) for i in batch["index"]]
        batch["noise"] = np.stack(noise) if noise else np.zeros((0, 3), np.int64)
        return batch

    def warm(self) -> None:
        self.inner.warm()

    def fingerprint(self) -> str:
        return f"jitter-{self.seed}-{self.inner.fingerprint()}"

    def image_layout(self) -> tuple[tuple[int, ...], str] | None:
        return self.inner.image_layout()


def test_sample_rng_is_a_pure_function_of_seed_epoch_and_index() -> None:
    draw = [
        sample_rng(s, e, i).integers(0, 2**31) for s, e, i in [(0, 0, 0), (0, 0, 0), (1, 0, 0), (0, 1, 0), (0, 0, 1)]
    ]
    assert draw[0] == draw[1]
    assert len(set(draw[1:])) == 4


def test_per_sample_randomness_ignores_workers_and_resume(ds: dlpack.Dataset) -> None:
    view = _Jitter(ds, seed=5)
    assert isinstance(ds, BatchSource) and isinstance(view, BatchSource)

    def run(workers: int, prefetch: int) -> list[dict[str, Any]]:
        loader = dlpack.Loader(view, LoaderOptions(batch_size=7, seed=3, workers=workers, prefetch=prefetch))
        loader.set_epoch(2)
        return [{k: (list(v) if k == "source" else np.array(v)) for k, v in b.items()} for b in loader]

    def same(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> bool:
        return same_batches(a, b) and all(np.array_equal(x["noise"], y["noise"]) for x, y in zip(a, b, strict=True))

    serial, threaded = run(0, 0), run(2, 3)
    assert same(serial, threaded)
    loader = dlpack.Loader(view, LoaderOptions(batch_size=7, seed=3, workers=2, prefetch=3))
    loader.set_epoch(2)
    it = iter(loader)
    next(it), next(it)
    state = loader.state_dict()
    resumed = dlpack.Loader(view, LoaderOptions(batch_size=7, seed=3, workers=1, prefetch=1))
    resumed.load_state_dict(state)
    rest = [{k: (list(v) if k == "source" else np.array(v)) for k, v in b.items()} for b in resumed]
    assert same(serial[2:], rest)
    other_epoch = dlpack.Loader(view, LoaderOptions(batch_size=7, seed=3, workers=0))
    other_epoch.set_epoch(3)
    by_index = {int(i): n for b in serial for i, n in zip(b["index"], b["noise"], strict=True)}
    later = {int(i): n for b in other_epoch for i, n in zip(b["index"], b["noise"], strict=True)}
    assert any(not np.array_equal(by_index[i], later[i]) for i in by_index)


def test_loader_refuses_what_is_not_a_batch_source() -> None:
    with pytest.raises(OptionError, match="BatchSource"):
        dlpack.Loader([1, 2, 3], LoaderOptions())  # type: ignore[arg-type]


# ---------------------------------------------------------------- splits and selections

#: Split of the k-th image of the split store: uneven shares, and every split holds both classes.
SPLIT_OF = ("train", "train", "test", "train", "val", "train", "test")
N_SPLIT = 21


@pytest.fixture(scope="module")
def split_ds(store_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dlpack.Dataset]:
    """A store of the fixture's backend with ``train/``, ``val/`` and ``test/`` top folders (21 images)."""
    tmp = tmp_path_factory.mktemp("splits")
    rng = np.random.default_rng(7)
    for k in range(N_SPLIT):
        folder = tmp / "src" / SPLIT_OF[k % len(SPLIT_OF)] / f"c{k % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        ok, buf = cv2.imencode(".png", rng.integers(0, 256, (6, 8, 3), dtype=np.uint8))
        assert ok
        (folder / f"{k:02d}.png").write_bytes(buf.tobytes())
    out = tmp / store_path.name
    dlpack.build(tmp / "src", out, jobs=1, quiet=True)
    d = dlpack.open(out)
    yield d
    d.close()


def test_indices_give_the_samples_of_each_split(split_ds: dlpack.Dataset) -> None:
    assert split_ds.splits == ("test", "train", "val")
    seen = []
    for name in split_ds.splits:
        idx = split_ds.indices(name)
        assert idx.dtype == np.int64 and idx.ndim == 1
        assert np.array_equal(idx, np.sort(idx)) and len(idx) > 0
        assert [split_ds[int(i)]["source"].split("/")[0] for i in idx] == [name] * len(idx)
        seen += idx.tolist()
    assert sorted(seen) == list(range(N_SPLIT))  # every sample in exactly one split
    assert len(split_ds.indices("train")) == 12 and len(split_ds.indices("val")) == 3


def test_a_sample_carries_its_split_name(split_ds: dlpack.Dataset, ds: dlpack.Dataset) -> None:
    for i in range(N_SPLIT):
        s = split_ds[i]
        assert type(s["split"]) is str and type(s["label"]) is int
        assert s["split"] == s["source"].split("/")[0]
    batch = split_ds.get_batch([0, 5, 20])  # batches carry the codes, as they carry label ids
    assert [split_ds.splits[c] for c in batch["split"]] == [split_ds[i]["split"] for i in (0, 5, 20)]
    assert "split" not in ds[0] and ds.splits == ()


def test_an_unknown_split_is_refused_naming_the_splits(split_ds: dlpack.Dataset) -> None:
    for bad in ("valid", "Train", "", None, 1):
        with pytest.raises(OptionError, match=r"no split .*its splits are: test, train, val"):
            split_ds.indices(bad)  # type: ignore[arg-type]
    with pytest.raises(OptionError, match="no split 'valid'"):
        split_ds.loader(split="valid")


def test_a_store_without_splits_says_so(ds: dlpack.Dataset) -> None:
    with pytest.raises(OptionError, match=rf"{re.escape(str(ds.path))} has no splits.*indices="):
        ds.indices("train")
    with pytest.raises(OptionError, match="has no splits"):
        ds.loader(split="train")


@pytest.mark.parametrize("order", ORDERS)
def test_a_split_loader_shuffles_exactly_the_split(split_ds: dlpack.Dataset, order: str) -> None:
    sel = split_ds.indices("train")
    opts = {"batch_size": 5, "seed": 3, "order": order, "block_size": 4, "window": 2}
    loader = split_ds.loader(split="train", **opts)
    same = split_ds.loader(indices=sel, **opts)
    for epoch in range(3):
        got = np.concatenate(epoch_indices(loader))
        want = sel[epoch_order(len(sel), 3, epoch, order, 4, 2)]  # type: ignore[arg-type]
        assert np.array_equal(got, want)
        assert np.array_equal(np.concatenate(epoch_indices(same)), want)
    assert len(loader) == 3 and all(b["split"].tolist() == [1] * len(b["index"]) for b in loader)


def test_indices_keep_their_order_and_images(split_ds: dlpack.Dataset) -> None:
    chosen = [20, 3, 11, 0]
    batches = list(split_ds.loader(indices=chosen, shuffle=False, batch_size=3))
    assert [b["index"].tolist() for b in batches] == [[20, 3, 11], [0]]
    for b in batches:
        for k, i in enumerate(b["index"]):
            assert np.array_equal(b["image"][k], split_ds[int(i)]["image"])


@pytest.mark.parametrize(
    ("indices", "message"),
    [
        ([1, 2, 2], "repeat sample 2"),
        ([0, N_SPLIT], f"index {N_SPLIT} is out of range"),
        ([-1], "index -1 is out of range"),
        ([], "select no samples"),
        (np.array([0.0, 1.0]), "integer sample indices"),
        (np.array([True, False]), "integer sample indices"),
        (np.array([[0, 1]]), "1-D"),
    ],
)
def test_bad_indices_are_refused(split_ds: dlpack.Dataset, indices: Any, message: str) -> None:
    with pytest.raises(OptionError, match=message):
        split_ds.loader(indices=indices)


def test_split_and_indices_together_are_refused(split_ds: dlpack.Dataset) -> None:
    with pytest.raises(OptionError, match="split or indices, not both"):
        split_ds.loader(split="train", indices=[0])


def test_a_state_records_the_selection_and_refuses_another(split_ds: dlpack.Dataset) -> None:
    first = split_ds.loader(split="train", batch_size=4, seed=5)
    ref = epoch_indices(split_ds.loader(split="train", batch_size=4, seed=5))
    head = [b["index"] for b in _take(first, 1)]
    state = json.loads(json.dumps(first.state_dict()))
    assert state["selection"]["split"] == "train" and state["selection"]["count"] == 12
    for other in ({"split": "test"}, {"indices": split_ds.indices("train")[::-1]}, {}):
        loader = split_ds.loader(batch_size=4, seed=5, **other)  # type: ignore[arg-type]
        with pytest.raises(StateError, match=r"another selection of samples \(split 'train', 12 samples"):
            loader.load_state_dict(state)
        assert loader.state_dict()["position"] == 0
    # The same samples chosen by their indices are the same selection.
    resumed = split_ds.loader(indices=split_ds.indices("train"), batch_size=4, seed=5)
    resumed.load_state_dict(state)
    rest = epoch_indices(resumed)
    assert all(np.array_equal(a, b) for a, b in zip(head + rest, ref, strict=True))


def test_a_whole_store_state_resumes_with_or_without_indices(ds: dlpack.Dataset) -> None:
    first = ds.loader(batch_size=8, seed=2)
    _take(first, 2)
    state = json.loads(json.dumps(first.state_dict()))
    again = ds.loader(batch_size=8, seed=2, indices=np.arange(N_IMAGES))
    again.load_state_dict(state)
    assert again.state_dict()["position"] == 2
    with pytest.raises(StateError, match="another selection"):
        ds.loader(batch_size=8, seed=2, indices=range(10)).load_state_dict(state)
    with pytest.raises(StateError, match="no 'selection'"):
        ds.loader(batch_size=8, seed=2).load_state_dict({k: v for k, v in state.items() if k != "selection"})


class _Counting:
    """An in-memory BatchSource of ``n`` samples: cheap enough for many random store sizes."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def get_batch(self, indices: np.ndarray, epoch: int = 0, out: np.ndarray | None = None) -> dict[str, Any]:
        return {"image": np.zeros((len(indices), 1, 1, 1), np.uint8), "index": np.asarray(indices)}

    def warm(self) -> None:
        pass

    def fingerprint(self) -> str:
        return f"counting-{self.n}"

    def image_layout(self) -> tuple[tuple[int, ...], str] | None:
        return (1, 1, 1), "|u1"


@settings(max_examples=150, deadline=None, derandomize=True)
@given(
    data=st.data(),
    n=st.integers(1, 120),
    splits=st.integers(1, 4),
    world_size=st.integers(1, 5),
    batch_size=st.integers(1, 9),
    order=st.sampled_from(ORDERS),
    seed=st.integers(0, 2**31),
    epoch=st.integers(0, 3),
)
def test_split_selection_with_ranks_and_resume_covers_each_sample_once(
    data: st.DataObject,
    n: int,
    splits: int,
    world_size: int,
    batch_size: int,
    order: str,
    seed: int,
    epoch: int,
) -> None:
    codes = np.array(data.draw(st.lists(st.integers(0, splits - 1), min_size=n, max_size=n)))
    split = data.draw(st.sampled_from(sorted(set(codes.tolist()))))
    sel = np.flatnonzero(codes == split)
    source = _Counting(n)
    opts = LoaderOptions(batch_size=batch_size, seed=seed, order=order, block_size=3, window=2)  # type: ignore[arg-type]
    shards = []
    for rank in range(world_size):
        ranked = replace_options(opts, rank=rank, world_size=world_size, workers=0)
        loader = dlpack.Loader(source, ranked, indices=sel, split=f"s{split}")
        loader.set_epoch(epoch)
        got = np.concatenate([b["index"] for b in loader] or [np.empty(0, np.int64)])
        # Resuming mid-epoch from a state gives the rest of the same epoch.
        stop = data.draw(st.integers(0, len(loader)))
        cut = dlpack.Loader(source, replace_options(ranked, workers=1, prefetch=2), indices=sel, split=f"s{split}")
        cut.set_epoch(epoch)
        head = [b["index"] for b in _take(cut, stop)]
        resumed = dlpack.Loader(source, ranked, indices=sel, split=f"s{split}")
        resumed.load_state_dict(json.loads(json.dumps(cut.state_dict())))
        rest = [b["index"] for b in resumed] if stop < len(loader) else []
        assert np.array_equal(np.concatenate(head + rest or [np.empty(0, np.int64)]), got)
        shards.append(got)
    assert len({len(s) for s in shards}) == 1  # every rank has the same number of samples
    union = np.concatenate(shards)
    m = len(sel)
    # Each selected sample exactly once; without drop_last the ranks are padded up to a multiple of
    # world_size by repeating the epoch's first samples (fewer than world_size of them).
    assert sorted(union[:m].tolist()) == sel.tolist()
    assert len(union) - m < world_size and np.array_equal(union[m:], union[: len(union) - m])
    assert set(union.tolist()) <= set(sel.tolist())
