"""The loader's view schedule (dlpack.read.schedule), without a store: each view once per cycle,
the spacing bound across cycle boundaries, no lockstep, purity, original_rate and views_per_batch."""

from __future__ import annotations

import numpy as np
import pytest

from dlpack.errors import OptionError
from dlpack.read.schedule import ViewSchedule, hash64, view_gap, view_schedule


def sequences(k: int, n: int, epochs: int, seed: int = 0, **options: object) -> np.ndarray:
    """``[n, epochs * m]``: the views of samples ``0..n-1``, epoch after epoch (m views an epoch)."""
    sched = ViewSchedule(k, seed, count=n, **options)  # type: ignore[arg-type]
    return np.concatenate([sched.views(np.arange(n), e) for e in range(epochs)], axis=1)


def uses(seq: np.ndarray, views: int) -> np.ndarray:
    """``[n, cycles, views]``: the position of each view in each cycle of ``views`` positions."""
    n, t = seq.shape
    blocks = seq[:, : (t // views) * views].reshape(n, -1, views)
    return np.argsort(blocks, axis=2) + np.arange(blocks.shape[1])[None, :, None] * views


@pytest.mark.parametrize("k", range(1, 10))
def test_each_view_is_used_once_per_cycle(k: int) -> None:
    seq = sequences(k, 300, 6 * (k + 1), seed=k)
    blocks = seq.reshape(300, 6, k + 1)
    assert (np.sort(blocks, axis=2) == np.arange(k + 1)).all()


@pytest.mark.parametrize("k", range(1, 13))
def test_two_uses_of_a_view_are_never_closer_than_the_bound(k: int) -> None:
    """Exhaustive over every sample, view and cycle boundary of 2000 samples x 8 cycles; the bound
    ceil((K+1)/2) is met exactly by some sample, and no gap exceeds 2K+1."""
    views = k + 1
    seq = sequences(k, 2000, 8 * views, seed=100 + k)
    gaps = np.diff(uses(seq, views), axis=1)
    g = view_gap(k)
    assert g == -(-(k + 1) // 2)
    assert gaps.min() == g
    assert gaps.max() <= 2 * k + 1


def test_images_are_not_in_lockstep() -> None:
    k, n = 8, 4000
    seq = sequences(k, n, 3 * (k + 1), seed=5)
    for e in range(seq.shape[1]):
        counts = np.bincount(seq[:, e], minlength=k + 1)
        assert counts.min() > 0.8 * n / (k + 1) and counts.max() < 1.2 * n / (k + 1), (e, counts)
    # No two samples share a whole sequence, and neighbours differ in most epochs.
    assert len({tuple(row) for row in seq[:200].tolist()}) == 200
    assert (seq[1:] != seq[:-1]).mean() > 0.8


def test_a_samples_views_depend_only_on_seed_index_epoch_and_k() -> None:
    k = 4
    picked = np.array([17, 3, 999, 0, 250])
    whole = ViewSchedule(k, 9, count=1000)
    for e in (0, 1, 4, 5, 11, 23):
        alone = np.concatenate([view_schedule(9, [i], e, k) for i in picked])
        assert np.array_equal(view_schedule(9, picked, e, k), alone)
        assert np.array_equal(whole.views(picked, e), alone)
        assert np.array_equal(view_schedule(9, picked[::-1], e, k), alone[::-1])
    assert not np.array_equal(sequences(k, 50, 10, seed=9), sequences(k, 50, 10, seed=10))


def test_the_cache_gives_any_epoch_in_any_order() -> None:
    k, n = 3, 200
    want = sequences(k, n, 30, seed=2, original_rate=0.3)
    sched = ViewSchedule(k, 2, count=n, original_rate=0.3)
    for e in [29, 3, 17, 0, 28, 29, 5, 6, 7]:
        assert np.array_equal(sched.views(np.arange(n), e)[:, 0], want[:, e]), e


def test_the_schedule_is_pinned() -> None:
    """Resuming a state made by an earlier dlpack needs the same views: the schedule never changes silently."""
    plain = np.stack([view_schedule(7, range(4), e, 3)[:, 0] for e in range(8)], 1)
    assert plain.tolist() == [
        [3, 0, 1, 2, 0, 3, 1, 2],
        [1, 0, 2, 3, 0, 3, 1, 2],
        [2, 0, 3, 1, 0, 3, 1, 2],
        [2, 3, 1, 0, 1, 3, 0, 2],
    ]
    rated = np.stack([view_schedule(7, range(4), e, 3, original_rate=0.25)[:, 0] for e in range(8)], 1)
    assert rated.tolist() == [
        [2, 1, 3, 2, 1, 3, 2, 1],
        [2, 1, 3, 2, 1, 3, 1, 0],
        [3, 2, 1, 3, 0, 2, 0, 1],
        [0, 2, 3, 1, 0, 3, 1, 2],
    ]


def test_hash64_takes_seeds_of_any_size_and_broadcasts() -> None:
    a = hash64(2**70 + 1, 5, np.arange(3)[:, None], np.arange(2)[None, :])
    assert a.shape == (3, 2) and a.dtype == np.uint64 and len(np.unique(a)) == 6
    assert not np.array_equal(a, hash64(1, 5, np.arange(3)[:, None], np.arange(2)[None, :]))
    assert np.array_equal(hash64(3, 1, 7), hash64(3, 1, np.array([7])))


# ---------------------------------------------------------------- original_rate


@pytest.mark.parametrize("rate", [0.0, 0.2, 0.5, 0.9, 1.0])
def test_original_rate_is_the_share_of_epochs_serving_the_original(rate: float) -> None:
    seq = sequences(4, 5000, 6, seed=1, original_rate=rate)
    share = float((seq == 0).mean())
    assert abs(share - rate) < 0.01
    if rate in (0.0, 1.0):
        assert share == rate


@pytest.mark.parametrize("k", [1, 2, 5, 8])
def test_with_original_rate_the_augmented_views_keep_their_schedule(k: int) -> None:
    """The epochs that do not serve the original walk a schedule of the K variants: each once per
    K of them, two uses at least ceil(K/2) of them apart (so at least that many epochs)."""
    seq = sequences(k, 400, 12 * k, seed=k, original_rate=0.4)
    for row in seq:
        epochs = np.flatnonzero(row != 0)
        drawn = row[epochs]
        full = (len(drawn) // k) * k
        assert (np.sort(drawn[:full].reshape(-1, k), axis=1) == np.arange(1, k + 1)).all()
        for v in range(1, k + 1):
            at = np.flatnonzero(drawn == v)
            assert (np.diff(at) >= -(-k // 2)).all()
            assert (np.diff(epochs[at]) >= -(-k // 2)).all()


# ---------------------------------------------------------------- views_per_batch


@pytest.mark.parametrize(("k", "m"), [(3, 2), (4, 3), (8, 3), (8, 9), (1, 2)])
def test_views_per_batch_serves_m_different_consecutive_views(k: int, m: int) -> None:
    seq = sequences(k, 500, 4 * (k + 1), seed=3, views_per_batch=m)
    per_epoch = seq.reshape(500, -1, m)
    assert all(len(set(views)) == m for views in per_epoch.reshape(-1, m).tolist())
    blocks = seq[:, : (seq.shape[1] // (k + 1)) * (k + 1)].reshape(500, -1, k + 1)
    assert (np.sort(blocks, axis=2) == np.arange(k + 1)).all()  # still each view once per cycle
    if m <= view_gap(k):  # the same sequence as one view an epoch, m positions at a time
        one = sequences(k, 500, seq.shape[1], seed=3)
        assert np.array_equal(seq, one)


def test_views_per_batch_with_original_rate_puts_the_original_first() -> None:
    seq = sequences(5, 2000, 8, seed=4, original_rate=0.5, views_per_batch=3).reshape(2000, 8, 3)
    original = seq[:, :, 0] == 0
    assert 0.45 < original.mean() < 0.55
    assert (seq[:, :, 1:] != 0).all()
    assert all(len(set(v)) == 3 for v in seq.reshape(-1, 3).tolist())


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"k": 0}, "K >= 1"),
        ({"k": 2, "views_per_batch": 4}, r"views_per_batch must be 1\.\.3"),
        ({"k": 2, "views_per_batch": 3, "original_rate": 0.5}, r"views_per_batch must be 1\.\.2"),
        ({"k": 2, "views_per_batch": 0}, "views_per_batch"),
        ({"k": 2, "original_rate": 1.5}, "original_rate must be in 0..1"),
        ({"k": 2, "original_rate": float("nan")}, "original_rate"),
        ({"k": 2, "original_rate": "0.5"}, "original_rate must be a number"),
        ({"k": 2, "seed": -1}, "seed"),
    ],
)
def test_bad_schedules_are_refused_naming_the_field(kwargs: dict[str, object], message: str) -> None:
    k = kwargs.pop("k")
    with pytest.raises(OptionError, match=message):
        ViewSchedule(k, **kwargs)  # type: ignore[arg-type]


def test_bad_indices_and_epochs_are_refused() -> None:
    sched = ViewSchedule(2, count=10)
    with pytest.raises(OptionError, match="out of range for 10 samples"):
        sched.views([10], 0)
    with pytest.raises(OptionError, match=">= 0"):
        sched.views([-1], 0)
    with pytest.raises(OptionError, match="epoch"):
        sched.views([1], -1)
    assert sched.views([], 3).shape == (0, 1)
