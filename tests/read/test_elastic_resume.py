"""Elastic resume: a loader state saved at one world size loads at any other, mid-epoch.

The property test runs whole data-parallel runs over a cheap in-memory :class:`BatchSource`: W
loaders (one per rank) take the same number of batches, one rank's state is loaded by W' new
loaders, which may stop and be resized again. What every stage hands out is compared with an
oracle built from the epoch order alone (the samples not yet handed out, in epoch order, split as
an epoch is split), and the epoch after with a loader that used the last world size from the
start. The end-to-end tests do the same over real stores of both backends, pixels included, and
over cached augmentation views with ``views_per_batch=2``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from _variants import expected_variant, store_with_variants
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dlpack
from dlpack import LoaderOptions, StateError
from dlpack.read.loader import STATE_VERSION, Loader, epoch_order, rank_indices, remaining_order

ORDERS = ("random", "sequential", "block")


class Memory:
    """A BatchSource of ``n`` one-pixel images whose value is the sample index.

    ``cached_views`` plays a store with ``k`` augmentation variants: each row's ``variant`` is a
    pure function of (seed, index, epoch, row within the image's ``m`` repeats), as a store's
    view schedule is, so a resume that changes the batches must not change the views.
    """

    def __init__(self, n: int, k: int = 0, seed: int = 0, views_per_batch: int = 1, viewed: bool = False) -> None:
        self.n, self.k, self.seed, self.m, self.viewed = n, k, seed, views_per_batch, viewed

    def __len__(self) -> int:
        return self.n

    def get_batch(self, indices: np.ndarray, epoch: int = 0, out: np.ndarray | None = None) -> dict[str, Any]:
        idx = np.asarray(indices, dtype=np.int64)
        image = np.empty((len(idx), 1, 1, 1), np.int64) if out is None else out
        image[:, 0, 0, 0] = idx
        batch: dict[str, Any] = {"image": image, "index": idx}
        if self.viewed:
            rows = idx.reshape(-1, self.m)
            assert np.all(rows == rows[:, :1]), "each image repeated m times in a row"
            batch["variant"] = np.array(
                [memory_view(self.seed, int(i), epoch, j, self.k) for i in rows[:, 0] for j in range(self.m)]
            )
        return batch

    def warm(self) -> None:
        pass

    def fingerprint(self) -> str:
        return f"memory-{self.n}-{self.k}" + (f"-views-{self.seed}-{self.m}" if self.viewed else "")

    def image_layout(self) -> tuple[tuple[int, ...], str] | None:
        return (1, 1, 1), "int64"

    def cached_views(self, seed: int, original_rate: float | None = None, views_per_batch: int = 1) -> Memory:
        return Memory(self.n, self.k, seed, views_per_batch, viewed=True)


def memory_view(seed: int, index: int, epoch: int, row: int, k: int) -> int:
    return int(np.random.default_rng([seed, index, epoch, row]).integers(0, k + 1))


def norank(state: dict[str, Any]) -> dict[str, Any]:
    return {**state, "options": {**state["options"], "rank": None, "workers": None}}


def take(loader: Loader, count: int) -> list[dict[str, Any]]:
    """The next ``count`` batches of the current epoch (an iterator closed after them)."""
    it = iter(loader)
    out = [next(it) for _ in range(count)]
    it.close()
    return out


def roundtrip(state: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(json.dumps(state))
    return out


def split_batches(share: np.ndarray, images: int, drop_last: bool) -> list[np.ndarray]:
    """A rank's share cut into batches, as docs/loader.md describes an epoch (the test's oracle)."""
    stop = (len(share) // images) * images if drop_last else len(share)
    return [share[s : min(s + images, stop)] for s in range(0, stop, images)]


@st.composite
def runs(draw: st.DrawFn) -> dict[str, Any]:
    n = draw(st.integers(1, 40))
    m = draw(st.sampled_from([1, 1, 2]))
    selection = None
    if draw(st.booleans()):
        picked = draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=n, unique=True))
        selection = np.array(picked, dtype=np.int64)
    return {
        "n": n,
        "selection": selection,
        "options": {
            "batch_size": m * draw(st.integers(1, 6)),
            "views_per_batch": m,
            "augment": "cached" if m > 1 or draw(st.booleans()) else None,
            "drop_last": draw(st.booleans()),
            "order": draw(st.sampled_from(ORDERS)),
            "block_size": draw(st.integers(1, 5)),
            "window": draw(st.integers(1, 3)),
            "seed": draw(st.integers(0, 3)),
        },
        "epoch": draw(st.integers(0, 2)),
        # world sizes of the stages of one epoch: the first saves, the others resume (and save again)
        "worlds": draw(st.lists(st.integers(1, 6), min_size=2, max_size=3)),
        "stops": draw(st.lists(st.floats(0, 1), min_size=2, max_size=2)),
        "saver": draw(st.integers(0, 5)),
    }


@pytest.mark.slow
@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(runs())
def test_a_resized_run_covers_the_rest_of_the_epoch_once_and_then_runs_as_if_it_began_so(run: dict[str, Any]) -> None:
    src, sel, e = Memory(run["n"], k=3), run["selection"], run["epoch"]
    opts = run["options"]
    images, drop_last, m = opts["batch_size"] // opts["views_per_batch"], opts["drop_last"], opts["views_per_batch"]
    selected = np.arange(run["n"]) if sel is None else sel
    glob = epoch_order(len(selected), opts["seed"], e, opts["order"], opts["block_size"], opts["window"])
    glob = selected[glob]

    def loaders(world: int) -> list[Loader]:
        return [
            Loader(src, LoaderOptions(**opts, rank=r, world_size=world, workers=r % 2), indices=sel)
            for r in range(world)
        ]

    handed: list[np.ndarray] = []  # every image handed out of epoch e, one entry per batch
    rest, split_world, start = glob, run["worlds"][0], 0  # the oracle: what the split in effect covers
    splits, over = 1, False  # splits of epoch e made so far; whether a stage finished the epoch
    state: dict[str, Any] | None = None
    for stage, world in enumerate(run["worlds"]):
        ranks = loaders(world)
        if state is None:
            for loader in ranks:
                loader.set_epoch(e)
        else:
            for loader in ranks:
                loader.load_state_dict(roundtrip(state))
            total = len(split_batches(rank_indices(rest, 0, split_world, drop_last), images, drop_last))
            over = over or (start == total and total > 0)
            if over:  # the saving run had finished the epoch: the new ranks start the next one
                for loader in ranks:  # at once, or (the same world size) after the "epoch just finished" state
                    same = world == split_world and loader.state_dict()["position"] == len(loader) == total
                    assert loader.epoch == e + 1 or (loader.epoch == e and same)
                continue
            if world != split_world:  # a new split of what is left; the same world size carries on
                left = set(np.concatenate(handed).tolist()) if handed else set()
                rest = np.array([i for i in glob.tolist() if i not in left], dtype=np.int64)
                split_world, start, splits = world, 0, splits + 1
        counts = {len(loader) for loader in ranks}
        assert len(counts) == 1, f"ranks have different batch counts {counts}"  # collectives would hang
        wants = [split_batches(rank_indices(rest, r, world, drop_last), images, drop_last) for r in range(world)]
        length = len(wants[0])
        last = stage == len(run["worlds"]) - 1
        stop = length if last else start + round(run["stops"][stage] * (length - start))
        for r, (loader, want) in enumerate(zip(ranks, wants, strict=True)):
            assert loader.epoch == e and len(loader) == len(want) == len(loader.batches())
            assert [b.tolist() for b in loader.batches()] == [np.repeat(b, m).tolist() for b in want]
            assert loader.state_dict()["position"] == start
            whole = last and r % 2 == 0  # to the end of the pass (the epoch moves on), or up to its last batch
            got = list(loader) if whole else take(loader, stop - start)
            assert [b["index"].tolist() for b in got] == [np.repeat(b, m).tolist() for b in want[start:stop]]
            for b in got:
                assert b["image"][:, 0, 0, 0].tolist() == b["index"].tolist()
                if opts["augment"] == "cached":
                    firsts = b["index"][::m].tolist()
                    assert b["variant"].tolist() == [
                        memory_view(opts["seed"], i, e, j, 3) for i in firsts for j in range(m)
                    ]
                handed.append(b["index"][::m])
            assert (loader.epoch, loader.state_dict()["position"]) == ((e + 1, 0) if whole else (e, stop))
        start = stop
        if last:
            break
        states = [loader.state_dict() for loader in ranks]
        assert all(norank(s) == norank(states[0]) for s in states)  # every rank saves the same state but its rank
        state = states[run["saver"] % world]

    # The epoch: each selected sample exactly once; only padding repeats, only drop_last drops.
    out = np.concatenate(handed) if handed else np.zeros(0, np.int64)
    assert set(out.tolist()) <= set(selected.tolist())
    if drop_last:
        assert len(out) == len(set(out.tolist()))
        kept = split_world * ((len(rest) // split_world) // images) * images  # what the last split serves
        assert len(selected) - len(out) == len(rest) - kept < split_world * images  # its dropped tail alone
    else:
        assert set(out.tolist()) == set(selected.tolist())
        assert len(out) - len(selected) <= splits * (max(run["worlds"]) - 1)  # only padding repeats
    # Every rank now stands at the next epoch, which runs as if the run had had this world size from the start.
    world = run["worlds"][-1]
    fresh = loaders(world)
    for r, loader in enumerate(ranks):
        if loader.epoch == e:  # the last batch was handed out: "epoch just finished"
            assert loader.state_dict()["position"] == len(loader)
            if not len(loader):  # nothing was left for this split to hand out: its pass is empty
                assert list(loader) == [] and loader.epoch == e + 1
        fresh[r].set_epoch(e + 1)
        assert [b["index"].tolist() for b in loader] == [b["index"].tolist() for b in fresh[r]]
        assert (loader.epoch, loader.state_dict()["segments"], len(loader)) == (e + 2, [], len(fresh[r]))


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(1, 50),
    world=st.integers(1, 7),
    images=st.integers(1, 5),
    drop_last=st.booleans(),
    data=st.data(),
)
def test_remaining_order_is_the_epoch_order_less_what_the_ranks_handed_out(
    n: int, world: int, images: int, drop_last: bool, data: st.DataObject
) -> None:
    order = np.random.default_rng(n * 7 + world).permutation(n).astype(np.int64) + 100
    shares = [split_batches(rank_indices(order, r, world, drop_last), images, drop_last) for r in range(world)]
    position = data.draw(st.integers(0, len(shares[0])))
    out = {int(i) for batches in shares for b in batches[:position] for i in b}
    rest = remaining_order(order, world, position, images, drop_last)
    assert rest.tolist() == [i for i in order.tolist() if i not in out]


# ---------------------------------------------------------------- the state


def test_state_records_the_segments_and_refuses_edited_ones() -> None:
    src = Memory(30)
    saver = Loader(src, LoaderOptions(batch_size=2, world_size=4, rank=3, seed=1))
    take(saver, 2)
    state = roundtrip(saver.state_dict())
    assert state["version"] == STATE_VERSION == 3 and state["segments"] == []
    resumed = Loader(src, LoaderOptions(batch_size=2, world_size=3, rank=0, seed=1))
    resumed.load_state_dict(state)  # rank 3 is out of range for 3 ranks: any rank's state describes the run
    assert resumed.state_dict()["segments"] == [{"world_size": 4, "position": 2}]
    assert (resumed.epoch, resumed.state_dict()["position"], len(resumed)) == (
        0,
        0,
        3,
    )  # 14 left: 5 per rank, 3 batches
    take(resumed, 1)
    again = roundtrip(resumed.state_dict())
    same = Loader(src, LoaderOptions(batch_size=2, world_size=3, rank=2, seed=1))
    same.load_state_dict(again)  # the same world size: the run goes on exactly, in its segment
    assert (same.state_dict()["segments"], same.state_dict()["position"]) == (again["segments"], 1)
    fresh = Loader(src, LoaderOptions(batch_size=2, world_size=3, rank=2, seed=1))
    for bad in (
        [{"world_size": 4, "position": 0}],  # a segment that handed out nothing
        [{"world_size": 4, "position": 4}],  # ... or the whole epoch (4 batches per rank at 4 ranks)
        [{"world_size": 0, "position": 1}],
        [{"world_size": 4}],
        [[4, 2]],
        [{"world_size": True, "position": 1}],
    ):
        with pytest.raises(StateError, match="segment 0"):
            fresh.load_state_dict({**again, "segments": bad})
    with pytest.raises(StateError, match="segments"):
        fresh.load_state_dict({**again, "segments": None})
    with pytest.raises(
        StateError, match=r"position 9 is past the end of epoch 0, which has 3 batches per rank at world_size 3"
    ):
        fresh.load_state_dict({**again, "position": 9})
    with pytest.raises(StateError, match="world_size"):
        fresh.load_state_dict({**again, "options": {**again["options"], "world_size": 0}})
    assert (fresh.epoch, fresh.state_dict()["position"], fresh.state_dict()["segments"]) == (0, 0, [])  # untouched


@pytest.mark.parametrize("version", [1, 2])
def test_states_of_earlier_versions_are_refused(version: int) -> None:
    src = Memory(21)
    saver = Loader(src, LoaderOptions(batch_size=3, seed=5))
    take(saver, 2)
    state = {**roundtrip(saver.state_dict()), "version": version}
    resumed = Loader(src, LoaderOptions(batch_size=3, seed=5))
    with pytest.raises(StateError, match=f"loader state version {version} is not one this dlpack reads"):
        resumed.load_state_dict(state)
    assert resumed.state_dict()["position"] == 0


@pytest.mark.parametrize(
    ("key", "value"),
    [("batch_size", 4), ("seed", 2), ("drop_last", True), ("order", "block"), ("shuffle", False), ("block_size", 8)],
)
def test_a_resize_still_refuses_other_options(key: str, value: Any) -> None:
    src = Memory(40)
    saver = Loader(src, LoaderOptions(batch_size=2, world_size=4))
    take(saver, 1)
    loader = Loader(src, LoaderOptions(**{"batch_size": 2, "world_size": 2, key: value}))
    with pytest.raises(StateError, match=rf"\b{key}="):
        loader.load_state_dict(roundtrip(saver.state_dict()))
    assert (loader.epoch, loader.state_dict()["position"]) == (0, 0)


def test_a_resize_still_refuses_another_selection() -> None:
    src = Memory(40)
    saver = Loader(src, LoaderOptions(batch_size=2, world_size=4), indices=range(20))
    take(saver, 1)
    with pytest.raises(StateError, match="another selection"):
        Loader(src, LoaderOptions(batch_size=2, world_size=2), indices=range(21)).load_state_dict(saver.state_dict())
    with pytest.raises(StateError, match="another dataset"):
        Loader(Memory(41), LoaderOptions(batch_size=2, world_size=2)).load_state_dict(saver.state_dict())


def test_set_epoch_after_a_resize_starts_the_epoch_whole() -> None:
    src = Memory(30)
    saver = Loader(src, LoaderOptions(batch_size=2, world_size=3, seed=4))
    take(saver, 2)
    loader = Loader(src, LoaderOptions(batch_size=2, world_size=2, seed=4))
    loader.load_state_dict(saver.state_dict())
    assert len(loader) == 5  # 18 of 30 left: 9 per rank, 5 batches
    loader.set_epoch(0)
    plain = Loader(src, LoaderOptions(batch_size=2, world_size=2, seed=4))
    assert loader.state_dict()["segments"] == [] and len(loader) == len(plain) == 8
    assert [b.tolist() for b in loader.batches()] == [b.tolist() for b in plain.batches()]


# ---------------------------------------------------------------- real stores


def write_pngs(root: Path, n: int) -> Path:
    rng = np.random.default_rng(3)
    for k in range(n):
        folder = root / f"class{k % 3}"
        folder.mkdir(parents=True, exist_ok=True)
        assert cv2.imwrite(str(folder / f"img{k:03d}.png"), rng.integers(0, 256, (12, 16, 3), dtype=np.uint8))
    return root


@pytest.fixture(scope="module", params=["zarr", "hdf5"])
def ds(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dlpack.Dataset]:
    tmp = tmp_path_factory.mktemp(f"elastic-{request.param}")
    out = tmp / ("store.zarr" if request.param == "zarr" else "store.h5")
    dlpack.build(write_pngs(tmp / "src", 37), out, size=(16, 12), jobs=1, quiet=True)
    with dlpack.open(out) as d:
        yield d


@pytest.mark.parametrize("drop_last", [False, True])
def test_a_store_resized_four_to_two_to_three_in_one_epoch(ds: dlpack.Dataset, drop_last: bool) -> None:
    """4 ranks stop after 2 batches, 2 ranks after 3 more, 3 ranks finish: pixels and labels are the store's."""
    images = np.stack([ds[i]["image"] for i in range(len(ds))])
    opts = {"batch_size": 2, "seed": 7, "drop_last": drop_last}
    train = np.arange(len(ds))
    served: list[int] = []

    def stage(world: int, state: dict[str, Any] | None, count: int | None) -> tuple[dict[str, Any], int]:
        ranks = [ds.loader(**opts, world_size=world, rank=r, workers=r % 3) for r in range(world)]
        for loader in ranks:
            if state is not None:
                loader.load_state_dict(roundtrip(state))
        assert len({len(loader) for loader in ranks}) == 1
        for loader in ranks:
            for b in take(loader, len(loader) if count is None else count):
                assert np.array_equal(b["image"], images[b["index"]])
                assert b["label"].tolist() == [ds[int(i)]["label"] for i in b["index"]]
                served.extend(b["index"].tolist())
        return ranks[-1].state_dict(), len(ranks[-1])

    state, _ = stage(4, None, 2)
    state, _ = stage(2, state, 3)
    assert state["segments"] == [{"world_size": 4, "position": 2}] and state["position"] == 3
    end, length = stage(3, state, None)
    assert (end["epoch"], end["position"], length) == (0, length, 1 if drop_last else 2)
    assert [(s["world_size"], s["position"]) for s in end["segments"]] == [(4, 2), (2, 3)]
    missing = set(train.tolist()) - set(served)
    if drop_last:
        assert len(served) == len(set(served))  # 16 + 12 handed out, 9 left for 3 ranks: 1 batch each, 3 dropped
        assert len(served) == 16 + 12 + 6 and len(missing) == 3
    else:
        assert not missing and len(served) == 16 + 12 + 9  # 9 left: 3 per rank, nothing to pad
    nxt = ds.loader(**opts, world_size=3, rank=2)
    nxt.load_state_dict(roundtrip(end))
    plain = ds.loader(**opts, world_size=3, rank=2)
    plain.set_epoch(1)
    assert [b["index"].tolist() for b in nxt] == [b["index"].tolist() for b in plain]


@pytest.fixture(scope="module", params=["zarr", "hdf5"])
def views(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dlpack.Dataset]:
    path = store_with_variants(tmp_path_factory.mktemp(f"elastic-views-{request.param}"), request.param, 3, 18)
    with dlpack.open(path) as d:
        yield d


def test_cached_views_and_views_per_batch_survive_a_resize(views: dlpack.Dataset) -> None:
    opts = {"batch_size": 4, "augment": "cached", "views_per_batch": 2, "seed": 3}
    originals = [views[i] for i in range(len(views))]

    def check(batches: list[dict[str, Any]]) -> list[tuple[int, tuple[int, ...]]]:
        out = []
        for b in batches:
            for r in range(0, len(b["index"]), 2):
                i, vs = int(b["index"][r]), tuple(b["variant"][r : r + 2].tolist())
                assert int(b["index"][r + 1]) == i and vs[0] != vs[1]  # two different views of one image
                for j, v in enumerate(vs):
                    assert np.array_equal(b["image"][r + j], expected_variant(originals[i], v)["image"])
                out.append((i, vs))
        return out

    # The views each sample gets in epoch 1, from a run at one world size.
    whole = dict(check(_epoch(views, opts, 1)))
    savers = [views.loader(**opts, world_size=3, rank=r) for r in range(3)]
    served = []
    for loader in savers:
        loader.set_epoch(1)
        served += check(take(loader, 1))
    state = roundtrip(savers[0].state_dict())
    for r in range(2):
        loader = views.loader(**opts, world_size=2, rank=r)
        loader.load_state_dict(state)
        served += check(list(loader))
    assert sorted(i for i, _ in served) == list(range(len(views)))  # 6 handed out, 12 left: 3 batches a rank
    assert dict(served) == whole  # the views depend on (seed, index, epoch) alone


def _epoch(ds: dlpack.Dataset, opts: dict[str, Any], epoch: int) -> list[dict[str, Any]]:
    loader = ds.loader(**opts, world_size=1)
    loader.set_epoch(epoch)
    return list(loader)


def test_the_torch_adapter_resumes_at_another_world_size(ds: dlpack.Dataset) -> None:
    torch = pytest.importorskip("torch")
    from dlpack.torch import torch_loader

    opts = {"batch_size": 3, "seed": 2, "pin_memory": False, "workers": 0}
    seen: list[int] = []
    for r in range(2):
        tl = torch_loader(ds, **opts, world_size=2, rank=r)
        it = iter(tl)
        seen += [int(i) for _ in range(2) for i in next(it)["index"]]
        it.close()
    state = roundtrip(tl.state_dict())
    rest: list[int] = []
    counts = set()
    for r in range(3):
        resumed = torch_loader(ds, **opts, world_size=3, rank=r)
        resumed.load_state_dict(state)
        batches = list(resumed)
        counts.add(len(batches))
        for b in batches:
            assert b["image"].dtype == torch.uint8 and b["image"].shape[0] == len(b["index"])
            rest += b["index"].tolist()
    assert len(counts) == 1 and not set(seen) & set(rest)  # 12 handed out, 25 left: 9 per rank with 2 pads
    assert set(seen + rest) == set(range(len(ds))) and len(seen + rest) == len(ds) + 2
