"""The loader on a streamed source: it names its next reads to ``prefetch`` before making them,
in read order, and ``order="block"`` reads whole shard-aligned runs (the source's ``block_hint``).

The source is a real in-memory :class:`~dlpack.read.loader.BatchSource` that records what it is
told and what it reads; a local store never gets a call and keeps its orders.
"""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

import dlpack
from dlpack import OptionError
from dlpack.read.loader import Loader, LoaderOptions, epoch_order

SHARD = 8


class Streamed:
    """``n`` 2x2 images in memory, each filled with its index; records ``prefetch`` and reads in order."""

    batch_rows_independent = True
    streamed = True

    def __init__(self, n: int, block_hint: int | None = SHARD) -> None:
        self.images = np.repeat(np.arange(n, dtype=np.uint16), 4).reshape(n, 2, 2, 1)
        self.block_hint = block_hint
        self.events: list[tuple[str, list[int]]] = []
        self.lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.images)

    def prefetch(self, indices: np.ndarray) -> None:
        with self.lock:
            self.events.append(("prefetch", np.asarray(indices).tolist()))

    def get_batch(self, indices: np.ndarray, epoch: int = 0, out: np.ndarray | None = None) -> dict[str, Any]:
        with self.lock:
            self.events.append(("read", np.asarray(indices).tolist()))
        images = np.take(self.images, indices, axis=0, out=None if out is None else out[: len(indices)])
        return {"image": images, "index": indices}

    def warm(self) -> None:
        pass

    def fingerprint(self) -> str:
        return f"memory-{len(self)}"

    def image_layout(self) -> tuple[tuple[int, ...], str] | None:
        return (2, 2, 1), "<u2"

    def named(self) -> list[int]:
        return [i for kind, idx in self.events if kind == "prefetch" for i in idx]

    def calls(self) -> int:
        return sum(kind == "prefetch" for kind, _ in self.events)


def flat(batches: list[np.ndarray]) -> list[int]:
    return [int(i) for b in batches for i in b]


def check_named_before_read(src: Streamed) -> None:
    """Every index a read asks for was named by an earlier prefetch call."""
    named: set[int] = set()
    for kind, idx in src.events:
        if kind == "prefetch":
            named.update(idx)
        else:
            missing = set(idx) - named
            assert not missing, f"read {sorted(missing)[:5]} before naming them"


@pytest.mark.parametrize(
    ("workers", "prefetch", "fetch_ahead"), [(0, 4, 3), (0, 0, 5), (1, 2, 1), (2, 4, 8), (1, 4, 1000)]
)
def test_the_loader_names_exactly_what_it_reads_next_in_order_before_reading_it(
    workers: int, prefetch: int, fetch_ahead: int
) -> None:
    src = Streamed(75)
    opts = LoaderOptions(batch_size=4, workers=workers, prefetch=prefetch, fetch_ahead=fetch_ahead, seed=3)
    loader = Loader(src, dataclasses.replace(opts, read_ahead_epochs=False))  # this epoch's reads alone
    loader._group = 1 if prefetch == 0 else 2  # several groups per epoch, whatever the image size
    order = flat(loader.batches(0))
    got = list(loader)
    assert flat([b["index"] for b in got]) == order  # what is yielded does not change
    for b in got:
        assert np.array_equal(b["image"][:, 0, 0, 0], b["index"])
    assert src.named() == order  # named in the order read, each sample once
    check_named_before_read(src)
    groups = -(-len(got) // loader._group)
    assert src.calls() <= groups  # at most one call per group read


def test_the_next_epoch_read_ahead_is_named_and_the_next_pass_goes_on_from_there() -> None:
    src = Streamed(40)
    loader = Loader(src, LoaderOptions(batch_size=4, workers=1, prefetch=2, fetch_ahead=2, seed=1))
    loader._group = 2
    first, second = list(loader), list(loader)
    assert flat([b["index"] for b in first + second]) == flat(loader.batches(0)) + flat(loader.batches(1))
    named = src.named()
    assert named[:80] == flat(loader.batches(0)) + flat(loader.batches(1))  # each epoch's reads, in order, once
    assert named[80:] == flat(loader.batches(2))[: len(named) - 80]  # and epoch 2's first group, read ahead
    check_named_before_read(src)


def test_a_resumed_pass_names_from_its_first_unread_batch() -> None:
    src = Streamed(48)
    opts = LoaderOptions(batch_size=4, workers=1, prefetch=2, fetch_ahead=4, seed=2, read_ahead_epochs=False)
    loader = Loader(src, opts)
    it = iter(loader)
    for _ in range(5):
        next(it)
    state = loader.state_dict()
    it.close()
    src2 = Streamed(48)
    resumed = Loader(src2, opts)
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert flat([b["index"] for b in rest]) == flat(loader.batches(0)[5:])
    assert src2.named() == flat(loader.batches(0)[5:])
    check_named_before_read(src2)


def test_no_call_with_fetch_ahead_0_or_on_a_source_that_is_not_streamed() -> None:
    off = Streamed(20)
    assert len(list(Loader(off, LoaderOptions(batch_size=4, fetch_ahead=0)))) == 5
    local = Streamed(20)
    local.streamed = False  # type: ignore[misc]
    assert len(list(Loader(local, LoaderOptions(batch_size=4)))) == 5
    assert off.calls() == local.calls() == 0 and off.events and local.events


def test_fetch_ahead_must_be_a_count() -> None:
    with pytest.raises(OptionError, match="fetch_ahead"):
        LoaderOptions(fetch_ahead=-1)
    with pytest.raises(OptionError, match="block_size"):
        LoaderOptions(block_size=0)


# ---------------------------------------------------------------- block order


def shards_of(indices: list[int]) -> set[int]:
    return {i // SHARD for i in indices}


def test_block_order_on_a_streamed_source_reads_whole_shard_aligned_runs() -> None:
    n = 12 * SHARD
    src = Streamed(n)
    loader = Loader(src, LoaderOptions(batch_size=4, order="block", window=1, seed=4))
    assert loader.block_size == SHARD
    order = flat(loader.batches(0))
    assert order == epoch_order(n, 4, 0, "block", SHARD, 1).tolist()
    for s in range(0, n, SHARD):  # each run of the order is one whole shard
        run = order[s : s + SHARD]
        assert sorted(run) == list(range(run[0] // SHARD * SHARD, run[0] // SHARD * SHARD + SHARD))
    assert loader.state_dict()["options"]["block_size"] == SHARD  # states record the run drawn with


def test_block_order_with_a_window_mixes_whole_shards_and_ranks_split_them() -> None:
    n, window = 16 * SHARD, 4
    src = Streamed(n)
    shares = []
    for rank in (0, 1):
        loader = Loader(src, LoaderOptions(batch_size=4, order="block", window=window, rank=rank, world_size=2))
        shares.append(flat(loader.batches(0)))
    for share in shares:
        for w in range(0, len(share), SHARD * window):  # a window holds `window` whole shards
            part = share[w : w + SHARD * window]
            assert len(shards_of(part)) == window and len(part) == SHARD * window
    assert not shards_of(shares[0]) & shards_of(shares[1])  # a rank fetches only the shards it uses
    assert sorted(shares[0] + shares[1]) == list(range(n))


def test_an_explicit_block_size_wins_over_the_source_hint() -> None:
    src = Streamed(50)
    loader = Loader(src, LoaderOptions(batch_size=5, order="block", block_size=3, window=2, seed=1))
    assert loader.block_size == 3
    assert flat(loader.batches(0)) == epoch_order(50, 1, 0, "block", 3, 2).tolist()
    plain = Loader(Streamed(50, block_hint=None), LoaderOptions(batch_size=5, order="block", seed=1))
    assert plain.block_size == 64


# ---------------------------------------------------------------- a local store


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("fetch_ahead")
    rng = np.random.default_rng(0)
    for i in range(30):
        d = tmp / "png" / f"c{i % 2}"
        d.mkdir(parents=True, exist_ok=True)
        assert cv2.imwrite(str(d / f"{i:02d}.png"), rng.integers(0, 256, (6, 6, 3), dtype=np.uint8))
    dlpack.build(tmp / "png", tmp / "s.zarr", size=(6, 6), jobs=1, quiet=True)
    return tmp / "s.zarr"


def test_a_local_store_is_not_streamed_and_keeps_the_fixed_block(store: Path) -> None:
    with dlpack.open(store) as ds:
        assert isinstance(ds, dlpack.Dataset)
        assert not ds.streamed and ds.block_hint is None and ds.shard_rows == ds.manifest.shard_rows > 0
        loader = ds.loader(batch_size=4, order="block", window=2, seed=6)
        assert loader.block_size == 64 and loader.state_dict()["options"]["block_size"] == 64
        assert flat(loader.batches(0)) == epoch_order(30, 6, 0, "block", 64, 2).tolist()
        before = ds.get_batch([3, 1, 2])["image"]
        ds.prefetch([3, 1, 2])  # a local store has nothing to fetch ahead: reads are unchanged
        assert np.array_equal(ds.get_batch([3, 1, 2])["image"], before)
