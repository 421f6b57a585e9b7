"""Read-ahead across epochs: the threads read the next epoch's first groups while a pass ends.

The next pass uses them only when it starts that epoch from its first batch; anything else
(``set_epoch`` to another epoch, a loaded state, a new finisher, ``close``, a pass that stops
early) drops them, and every epoch is still covered exactly once with exact states and stats.
With ``read_ahead_epochs=False`` no read happens after a pass ends.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

import dlpack
from dlpack import OptionError
from dlpack.read.loader import Loader, LoaderOptions

N = 40
B = 4


class Recording:
    """A store read through, recording when each ``get_batch`` ran and for which epoch."""

    batch_rows_independent = True

    def __init__(self, inner: dlpack.Dataset) -> None:
        self.inner = inner
        self.calls: list[tuple[float, int, list[int]]] = []
        self.lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.inner)

    def get_batch(self, indices: np.ndarray, epoch: int = 0, out: np.ndarray | None = None) -> dict[str, Any]:
        batch = self.inner.get_batch(indices, epoch, out)
        with self.lock:
            self.calls.append((time.perf_counter(), epoch, indices.tolist()))
        return batch

    def warm(self) -> None:
        self.inner.warm()

    def fingerprint(self) -> str:
        return self.inner.fingerprint()

    def image_layout(self) -> tuple[tuple[int, ...], str] | None:
        return self.inner.image_layout()

    def read(self, epoch: int) -> list[int]:
        with self.lock:
            return [i for _, e, idx in self.calls if e == epoch for i in idx]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("readahead")
    rng = np.random.default_rng(1)
    for i in range(N):
        d = tmp / "png" / f"class{i % 2}"
        d.mkdir(parents=True, exist_ok=True)
        assert cv2.imwrite(str(d / f"{i:03d}.png"), rng.integers(0, 256, (8, 8, 3), dtype=np.uint8))
    out = tmp / "s.zarr"
    dlpack.build(tmp / "png", out, size=(8, 8), jobs=1, quiet=True)
    return out


def loader_of(src: Any, **kw: Any) -> Loader:
    # prefetch 2 in groups of 2 batches: one group ahead; an epoch is 10 batches, 5 groups
    loader = Loader(src, LoaderOptions(batch_size=B, workers=1, prefetch=2, seed=7, **kw))
    loader._group = 2
    return loader


def indices(batches: list[dict[str, Any]]) -> list[list[int]]:
    return [b["index"].tolist() for b in batches]


def expected(store: Path, epoch: int) -> list[list[int]]:
    with dlpack.open(store) as ds:
        return [b.tolist() for b in ds.loader(batch_size=B, seed=7).batches(epoch)]


def settle(loader: Loader) -> None:
    """Wait for the reads made ahead (so a test can count them)."""
    if loader._carry is not None:
        for r in loader._carry[1]:
            r.future.result()


def test_the_next_epochs_first_group_is_read_while_the_pass_ends_and_used(store: Path) -> None:
    with dlpack.open(store) as ds:
        src = Recording(ds)
        loader = loader_of(src)
        first = list(loader)
        settle(loader)
        assert loader.epoch == 1 and src.read(1) == [i for b in expected(store, 1)[:2] for i in b]
        second = list(loader)
        assert indices(first) == expected(store, 0) and indices(second) == expected(store, 1)
        assert sorted(src.read(1)) == list(range(N))  # each sample of epoch 1 read once: the carried reads were used
        for batch in second:
            assert np.array_equal(batch["image"], ds.get_batch(batch["index"])["image"])
        stats = loader.stats()
        assert [(s.epoch, s.batches, s.images, s.complete) for s in stats] == [(0, 10, N, True), (1, 10, N, True)]
        state = loader.state_dict()
        assert (state["epoch"], state["position"]) == (2, 0)


def test_set_epoch_to_the_next_epoch_keeps_them_and_to_another_drops_them(store: Path) -> None:
    with dlpack.open(store) as ds:
        src = Recording(ds)
        loader = loader_of(src)
        loader.set_epoch(0)
        list(loader)
        loader.set_epoch(1)  # what a DistributedSampler-style loop does: the natural next epoch
        assert loader._carry is not None
        assert indices(list(loader)) == expected(store, 1)
        settle(loader)
        loader.set_epoch(5)  # elsewhere: epoch 2's reads are dropped
        assert loader._carry is None
        assert indices(list(loader)) == expected(store, 5)
        assert sorted(src.read(1)) == list(range(N)) and sorted(src.read(5)) == list(range(N))


def test_a_loaded_state_drops_them_and_resumes_exactly(store: Path) -> None:
    with dlpack.open(store) as ds:
        loader = loader_of(Recording(ds))
        list(loader)
        other = loader_of(Recording(ds))
        it = iter(other)
        [next(it) for _ in range(3)]
        state = other.state_dict()
        it.close()
        loader.load_state_dict(state)
        assert loader._carry is None
        assert indices(list(loader)) == expected(store, 0)[3:]


def test_the_next_epochs_order_is_drawn_on_a_reader_thread_and_only_used_where_it_applies(store: Path) -> None:
    """The order of epoch e + 1 is drawn by a reader thread during epoch e's pass. It is the same
    order as drawn anywhere else; after a state saved at another world size (the epoch's rest is
    split anew) the loader reads what a loader that drew nothing ahead reads; options replaced
    after it was drawn are not served by it."""
    with dlpack.open(store) as ds:
        loader = loader_of(Recording(ds), read_ahead_epochs=False)  # the order is drawn ahead either way
        list(loader)
        assert loader._order_ahead is not None and loader._order_ahead[0] == 1
        drawn_on = []
        share = loader._rank_order

        def recorded(*a: Any) -> np.ndarray:
            drawn_on.append(threading.current_thread().name)
            return share(*a)

        loader._rank_order = recorded  # type: ignore[method-assign]
        assert indices(list(loader)) == expected(store, 1)  # epoch 1 from the order drawn ahead
        assert loader._order_ahead is not None and loader._order_ahead[0] == 2
        loader._order_ahead[2].result()  # epoch 2's: a thread may still be drawing it
        assert drawn_on and all(name.startswith("dlpack") for name in drawn_on)  # on a reader thread
        assert [b.tolist() for b in loader.batches(2)] == expected(store, 2)  # epoch 2's, drawn ahead

        # A state saved mid-epoch 3 at world size 2 splits the rest of epoch 3 anew at world size 1:
        # the order drawn ahead for epoch 3 (whole, at this world size) must not be used for it.
        wide = Loader(Recording(ds), LoaderOptions(batch_size=B, workers=0, seed=7, world_size=2, rank=0))
        wide.set_epoch(3)
        it = iter(wide)
        [next(it) for _ in range(2)]
        state = wide.state_dict()
        it.close()
        list(loader)  # epoch 2: epoch 3's order is drawn ahead
        assert loader._order_ahead is not None and loader._order_ahead[0] == 3
        loader.load_state_dict(state)
        fresh = loader_of(Recording(ds))  # nothing drawn ahead
        fresh.load_state_dict(state)
        assert indices(list(loader)) == indices(list(fresh))

        # Options replaced after the order was drawn ahead (benchmarks do): drawn again with them.
        assert loader._order_ahead is not None and loader._order_ahead[0] == 4
        loader.options = dataclasses.replace(loader.options, seed=8)
        with dlpack.open(store) as again:
            assert indices(list(loader)) == [b.tolist() for b in again.loader(batch_size=B, seed=8).batches(4)]


def test_a_new_finisher_drops_them(store: Path) -> None:
    with dlpack.open(store) as ds:
        loader = loader_of(Recording(ds))
        list(loader)
        assert loader._carry is not None
        loader.set_finisher(lambda b: b | {"finished": True}, works=False)
        got = list(loader)
        assert indices(got) == expected(store, 1) and all(b.get("finished") for b in got)


def test_close_drops_them(store: Path) -> None:
    """``close`` drops the carried reads and the order drawn ahead (stopping the threads may cancel
    that draw before it ran): the next pass draws the order itself, and a cancelled draw is never
    waited for."""
    from concurrent.futures import Future

    with dlpack.open(store) as ds:
        loader = loader_of(Recording(ds))
        list(loader)
        loader.close()
        assert loader._carry is None and loader._order_ahead is None
        assert indices(list(loader)) == expected(store, 1)
        cancelled: Future[np.ndarray] = Future()
        cancelled.cancel()
        loader._order_ahead = (2, loader.options, cancelled)  # as a pool shut down under it leaves one
        assert indices(list(loader)) == expected(store, 2)


def test_a_pass_that_stops_early_reads_nothing_after_it(store: Path) -> None:
    with dlpack.open(store) as ds:
        src = Recording(ds)
        loader = loader_of(src)
        it = iter(loader)
        got = [next(it) for _ in range(9)]  # the last group is submitted, so is epoch 1's first
        it.close()
        ended = time.perf_counter()
        assert loader._carry is None
        time.sleep(0.05)
        assert all(t <= ended for t, _, _ in src.calls)
        assert indices(list(loader)) == expected(store, 0)[9:] and len(got) == 9


def test_with_read_ahead_off_no_read_happens_after_a_pass(store: Path) -> None:
    with dlpack.open(store) as ds:
        src = Recording(ds)
        loader = loader_of(src, read_ahead_epochs=False)
        for e in range(3):
            list(loader)
            ended = time.perf_counter()
            time.sleep(0.05)
            assert loader._carry is None and all(t <= ended for t, _, _ in src.calls)
            assert sorted(src.read(e + 1)) == []
        assert [sorted(src.read(e)) for e in range(3)] == [list(range(N))] * 3


def test_a_transform_is_never_run_ahead_of_its_pass(store: Path) -> None:
    seen: list[int] = []

    def count(batch: dict[str, Any], epoch: int) -> dict[str, Any]:
        seen.append(epoch)
        return batch

    with dlpack.open(store) as ds:
        loader = Loader(Recording(ds), LoaderOptions(batch_size=B, workers=1, seed=7), count)
        list(loader)
        time.sleep(0.05)
        assert loader._carry is None and seen == [0] * 10


def test_read_ahead_epochs_must_be_a_bool() -> None:
    with pytest.raises(OptionError, match="read_ahead_epochs must be True or False"):
        LoaderOptions(read_ahead_epochs="yes")  # type: ignore[arg-type]


def test_bench_runs_read_nothing_ahead_and_stop_their_threads(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cold bench run evicts the files and then reads them: no read of an earlier run may follow."""
    from dlpack.bench import measure, run_bench

    made: list[Loader] = []
    real = measure._loader

    def spy(source: Any, lopts: LoaderOptions) -> Loader:
        made.append(real(source, lopts))
        return made[-1]

    monkeypatch.setattr(measure, "_loader", spy)
    run_bench([store], samples=16, repeat=1, batch_size=4, quiet=True)
    assert made and all(not ld.options.read_ahead_epochs and ld._threads is None for ld in made)
    assert all(ld._carry is None for ld in made)
