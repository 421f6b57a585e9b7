"""The loader over cached augmentation views: ``augment="cached"``, ``original_rate``,
``views_per_batch``, the ``online`` layer, the transform hook's keywords, resume, and the torch and
HALCON pass-through.

Every test that reads a store runs on both backends: the module fixture builds one store with
K=3 variants per backend (tests/_variants.py writes the variant arrays itself, as docs/format.md
lays them out). The online layer's interface (``dlpack.transforms.online.OnlineAugment``) is
played by a small stand-in installed per test.
"""

from __future__ import annotations

import functools
import json
import sys
import threading
import types
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import _halcon_standin as halcon_standin
import numpy as np
import pytest
from _variants import expected_variant, store_with_variants

import dlpack
import dlpack.halcon
from dlpack import LoaderOptions, OptionError, StateError
from dlpack.read.loader import sample_rng
from dlpack.read.schedule import view_schedule
from dlpack.read.views import CachedViews

K = 3
N = 24


@pytest.fixture(scope="module", params=["zarr", "hdf5"])
def store_path(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return store_with_variants(tmp_path_factory.mktemp(f"views-{request.param}"), request.param, K, N)


@pytest.fixture(scope="module")
def ds(store_path: Path) -> Iterator[dlpack.Dataset]:
    with dlpack.open(store_path) as d:
        yield d


@pytest.fixture(scope="module")
def originals(ds: dlpack.Dataset) -> list[dict[str, Any]]:
    return [ds[i] for i in range(len(ds))]


def run(loader: dlpack.Loader, epochs: int) -> list[dict[str, Any]]:
    out = []
    for e in range(epochs):
        loader.set_epoch(e)
        out += [{**b, "epoch": e} for b in loader]
    return out


def rows(batches: list[dict[str, Any]]) -> list[tuple[int, int, int]]:
    """(epoch, index, variant) of every row served."""
    return [(b["epoch"], int(i), int(v)) for b in batches for i, v in zip(b["index"], b["variant"], strict=True)]


def assert_rows_are_the_stored_views(batch: dict[str, Any], originals: list[dict[str, Any]]) -> None:
    for r, (i, v) in enumerate(zip(batch["index"].tolist(), batch["variant"].tolist(), strict=True)):
        want = expected_variant(originals[i], v)
        assert np.array_equal(batch["image"][r], want["image"]), (i, v)
        assert np.array_equal(batch["mask"][r], want["mask"]), (i, v)
        for key in ("boxes", "box_labels", "box_crowd"):
            got = batch[key][r]
            assert got.dtype == want[key].dtype and np.array_equal(got, want[key]), (key, i, v)
        assert batch["label"][r] == originals[i]["label"]
        assert batch["source"][r] == originals[i]["source"]


# ---------------------------------------------------------------- cached views


def test_cached_batches_hold_the_stored_variant_arrays(ds: dlpack.Dataset, originals: list[dict[str, Any]]) -> None:
    batches = run(ds.loader(batch_size=5, augment="cached", seed=4), 2 * (K + 1))
    assert {v for _, _, v in rows(batches)} == set(range(K + 1))
    for b in batches:
        assert b["variant"].dtype == np.int64 and b["image"].shape == (len(b["index"]), 32, 48, 3)
        assert_rows_are_the_stored_views(b, originals)


def test_a_batch_of_one_view_and_get_batch_called_directly(ds: dlpack.Dataset, originals: list[dict[str, Any]]) -> None:
    views = CachedViews(ds, seed=4)
    for e in range(K + 1):
        batch = views.get_batch([0, 5, 23, 5], e)
        assert batch["variant"].tolist() == view_schedule(4, [0, 5, 23, 5], e, K)[:, 0].tolist()
        assert_rows_are_the_stored_views(batch, originals)
    # a batch whose rows all have one view reads that one array alone
    e = next(e for e in range(50) if len(set(view_schedule(4, [1, 2], e, K)[:, 0].tolist())) == 1)
    assert_rows_are_the_stored_views(views.get_batch([1, 2], e), originals)


def test_each_sample_sees_every_view_once_per_cycle(ds: dlpack.Dataset) -> None:
    seen: dict[tuple[int, int], list[int]] = {}
    for e, i, v in rows(run(ds.loader(batch_size=7, augment="cached", seed=1), 3 * (K + 1))):
        seen.setdefault((i, e // (K + 1)), []).append(v)
    assert len(seen) == 3 * N
    assert all(sorted(vs) == list(range(K + 1)) for vs in seen.values())


def test_views_follow_the_schedule_whatever_the_loader_reads(ds: dlpack.Dataset) -> None:
    """The view of sample i in epoch e depends on (seed, i, e, K) alone: not on workers, prefetch,
    order, rank, world size, drop_last or the selection."""
    configs: list[dict[str, Any]] = [
        {"workers": 0},
        {"workers": 1, "prefetch": 1},
        {"workers": 2, "prefetch": 4},
        {"order": "sequential"},
        {"order": "block", "block_size": 4, "window": 2},
        {"world_size": 2, "rank": 1},
        {"world_size": 3, "rank": 0, "drop_last": True},
        {"indices": [3, 17, 9, 0]},
    ]
    for config in configs:
        loader = ds.loader(batch_size=4, augment="cached", seed=11, **config)
        got = rows(run(loader, K + 2))
        assert got
        for e, i, v in got:
            assert v == int(view_schedule(11, [i], e, K)[0, 0]), (config, e, i)


def test_a_loader_builds_the_schedule_from_its_start_once(ds: dlpack.Dataset, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each pass warms its source; the schedule's first epoch is built once, not again every pass
    once later epochs' tables replaced it (a walk of the whole store from its first cycle)."""
    from dlpack.read.schedule import ViewSchedule

    starts: list[int] = []
    real = ViewSchedule._start

    def counting(self: ViewSchedule, rows: np.ndarray) -> Any:
        starts.append(len(rows))
        return real(self, rows)

    monkeypatch.setattr(ViewSchedule, "_start", counting)
    loader = ds.loader(batch_size=8, augment="cached", seed=4)
    got = rows(run(loader, 3 * (K + 1)))
    assert len(got) == 3 * (K + 1) * N
    assert starts == [N]
    for e, i, v in got[:: max(1, len(got) // 50)]:
        assert v == int(view_schedule(4, [i], e, K)[0, 0])


def test_workers_and_prefetch_do_not_change_the_batches(ds: dlpack.Dataset) -> None:
    def served(workers: int, prefetch: int) -> list[dict[str, Any]]:
        opts = {"augment": "cached", "original_rate": 0.3, "views_per_batch": 2, "seed": 8}
        return run(ds.loader(batch_size=4, workers=workers, prefetch=prefetch, **opts), 4)

    base = served(0, 0)
    for other in (served(1, 1), served(2, 4)):
        assert len(other) == len(base)
        for a, b in zip(base, other, strict=True):
            assert np.array_equal(a["index"], b["index"]) and np.array_equal(a["variant"], b["variant"])
            assert np.array_equal(a["image"], b["image"]) and a["boxes"] == b["boxes"]


def test_original_rate_serves_the_original_that_often(ds: dlpack.Dataset) -> None:
    assert {v for _, _, v in rows(run(ds.loader(batch_size=8, augment="cached", original_rate=1.0), 3))} == {0}
    never = rows(run(ds.loader(batch_size=8, augment="cached", original_rate=0.0), 2 * K))
    assert {v for _, _, v in never} == set(range(1, K + 1))
    half = rows(run(ds.loader(batch_size=8, augment="cached", original_rate=0.5, seed=2), 40))
    share = sum(v == 0 for _, _, v in half) / len(half)
    assert 0.4 < share < 0.6


def test_views_per_batch_puts_m_different_views_of_each_image_in_a_batch(
    ds: dlpack.Dataset, originals: list[dict[str, Any]]
) -> None:
    m = 3
    loader = ds.loader(batch_size=6, augment="cached", views_per_batch=m, seed=6)
    assert len(loader) == N // 2
    for e in range(3):
        loader.set_epoch(e)
        batches = list(loader)
        assert all(len(b["index"]) == 6 for b in batches)
        served = np.concatenate([b["index"] for b in batches])
        assert sorted(served.tolist()) == sorted(list(range(N)) * m)  # each image once: m x N rows
        for b in batches:
            groups_i = b["index"].reshape(-1, m)
            groups_v = b["variant"].reshape(-1, m)
            assert (groups_i == groups_i[:, :1]).all()  # m rows in a row per image
            assert all(len(set(v)) == m for v in groups_v.tolist())
            assert_rows_are_the_stored_views(b, originals)
        assert [b["index"].tolist() for b in batches] == [x.tolist() for x in loader.batches(e)]


def test_views_per_batch_over_the_whole_cycle_keeps_each_view_once_per_cycle(ds: dlpack.Dataset) -> None:
    loader = ds.loader(batch_size=8, augment="cached", views_per_batch=2, seed=3)
    seq: dict[int, list[int]] = {}
    for _, i, v in rows(run(loader, 2 * (K + 1))):
        seq.setdefault(i, []).append(v)
    for views in seq.values():
        blocks = np.array(views).reshape(-1, K + 1)
        assert (np.sort(blocks, axis=1) == np.arange(K + 1)).all()


def test_a_direct_batch_must_repeat_each_index_m_times(ds: dlpack.Dataset) -> None:
    views = CachedViews(ds, views_per_batch=2)
    with pytest.raises(OptionError, match="each sample 2 times in a row"):
        views.get_batch([1, 2], 0)
    assert views.get_batch([1, 1, 2, 2], 0)["variant"].shape == (4,)


# ---------------------------------------------------------------- resume


def test_resume_mid_epoch_gives_the_same_views(ds: dlpack.Dataset) -> None:
    opts = {"batch_size": 4, "augment": "cached", "original_rate": 0.25, "views_per_batch": 2, "seed": 5}
    whole = ds.loader(**opts)
    whole.set_epoch(6)
    want = list(whole)
    first = ds.loader(**opts)
    first.set_epoch(6)
    it = iter(first)
    head = [next(it) for _ in range(3)]
    state = json.loads(json.dumps(first.state_dict()))
    it.close()
    assert state["options"]["augment"] == "cached" and state["options"]["original_rate"] == 0.25
    resumed = ds.loader(**{**opts, "workers": 0})
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert len(head) + len(rest) == len(want)
    for a, b in zip(head + rest, want, strict=True):
        assert np.array_equal(a["index"], b["index"]) and np.array_equal(a["variant"], b["variant"])
        assert np.array_equal(a["image"], b["image"])


@pytest.mark.parametrize(
    ("saved", "loading"),
    [
        ({"augment": "cached"}, {}),
        ({}, {"augment": "cached"}),
        ({"augment": "cached", "original_rate": 0.5}, {"augment": "cached"}),
        ({"augment": "cached", "views_per_batch": 2}, {"augment": "cached"}),
    ],
)
def test_a_state_with_other_augmentation_options_is_refused(
    ds: dlpack.Dataset, saved: dict[str, Any], loading: dict[str, Any]
) -> None:
    state = ds.loader(batch_size=4, **saved).state_dict()
    key = next(k for k in ("views_per_batch", "original_rate", "augment") if k in saved or k in loading)
    with pytest.raises(StateError, match=f"saved with {key}="):
        ds.loader(batch_size=4, **loading).load_state_dict(state)


def test_a_state_from_before_the_augmentation_options_means_their_defaults(ds: dlpack.Dataset) -> None:
    loader = ds.loader(batch_size=4, seed=2)
    next(iter(loader))
    state = loader.state_dict()
    for key in ("augment", "original_rate", "views_per_batch", "online"):
        del state["options"][key]
    fresh = ds.loader(batch_size=4, seed=2)
    fresh.load_state_dict(state)
    assert fresh.state_dict()["position"] == 1
    with pytest.raises(StateError, match="saved with augment=None"):
        ds.loader(batch_size=4, seed=2, augment="cached").load_state_dict(state)


def test_a_state_is_never_restored_onto_other_variants(tmp_path: Path, store_path: Path) -> None:
    backend = "zarr" if store_path.suffix == ".zarr" else "hdf5"
    other = store_with_variants(tmp_path, backend, K, N, step=20)  # the same originals, other variants
    with dlpack.open(store_path) as a, dlpack.open(other) as b:
        assert a.fingerprint() == b.fingerprint()
        assert CachedViews(a).fingerprint() != CachedViews(b).fingerprint()
        assert CachedViews(a).fingerprint() != a.fingerprint()
        state = a.loader(batch_size=4, augment="cached").state_dict()
        with pytest.raises(StateError, match="another dataset"):
            b.loader(batch_size=4, augment="cached").load_state_dict(state)


# ---------------------------------------------------------------- options


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"augment": "online"}, r"augment must be None or 'cached'"),
        ({"augment": True}, r"augment must be None or 'cached'"),
        ({"original_rate": 0.5}, r"original_rate .*augment='cached'"),
        ({"augment": "cached", "original_rate": 1.5}, r"original_rate must be in 0\.\.1"),
        ({"augment": "cached", "original_rate": True}, r"original_rate must be a number"),
        ({"augment": "cached", "original_rate": "half"}, r"original_rate must be a number"),
        ({"views_per_batch": 0}, r"views_per_batch must be an integer >= 1"),
        ({"views_per_batch": 2.0}, r"views_per_batch must be an integer"),
        ({"views_per_batch": 2}, r"views_per_batch=2 .*augment='cached'"),
        ({"augment": "cached", "views_per_batch": 3, "batch_size": 8}, r"views_per_batch=3 must divide batch_size=8"),
    ],
)
def test_bad_options_are_refused_naming_the_field(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(OptionError, match=message):
        LoaderOptions(**kwargs)


def test_views_per_batch_beyond_the_views_of_a_store_is_refused(ds: dlpack.Dataset) -> None:
    with pytest.raises(OptionError, match=r"views_per_batch must be 1\.\.4"):
        ds.loader(batch_size=8, augment="cached", views_per_batch=8)
    with pytest.raises(OptionError, match=r"views_per_batch must be 1\.\.3"):
        ds.loader(batch_size=8, augment="cached", views_per_batch=4, original_rate=0.5)


def test_a_store_without_variants_is_refused_naming_dlpack_augment(tmp_path: Path) -> None:
    src = tmp_path / "src" / "a"
    src.mkdir(parents=True)
    import cv2

    for k in range(3):
        assert cv2.imwrite(str(src / f"{k}.png"), np.full((6, 8, 3), k, np.uint8))
    out = tmp_path / "plain.zarr"
    dlpack.build(tmp_path / "src", out, jobs=1, quiet=True)
    with dlpack.open(out) as plain:
        with pytest.raises(OptionError, match=r"plain\.zarr has no augmentation variants.*dlpack augment"):
            plain.loader(augment="cached")
        assert "variant" not in next(iter(plain.loader(batch_size=3)))  # plain batches never carry it


def test_a_source_that_is_no_store_is_refused(ds: dlpack.Dataset) -> None:
    class Wrapped:
        def __init__(self, inner: dlpack.Dataset) -> None:
            self.inner = inner

        def __len__(self) -> int:
            return len(self.inner)

        def get_batch(self, indices: Any, epoch: int = 0, out: Any = None) -> dict[str, Any]:
            return self.inner.get_batch(indices, epoch, out)

        def warm(self) -> None:
            self.inner.warm()

        def fingerprint(self) -> str:
            return "w"

        def image_layout(self) -> Any:
            return self.inner.image_layout()

    with pytest.raises(OptionError, match="augment='cached' reads the variants of a dlpack store"):
        dlpack.Loader(Wrapped(ds), LoaderOptions(augment="cached"))


# ---------------------------------------------------------------- the online layer


@dataclass(frozen=True)
class StandInOnline:
    """The interface of dlpack.transforms.online.OnlineAugment: flips rows per (seed, index, epoch)."""

    hflip: bool = True
    shift: int = 0

    @classmethod
    def from_value(cls, value: Any) -> StandInOnline:
        if value is True:
            return cls()
        if isinstance(value, cls):
            return value
        if isinstance(value, dict):
            unknown = set(value) - {"hflip", "shift"}
            if unknown:
                raise OptionError(f"online has no field {sorted(unknown)[0]!r}")
            return cls(**value)
        raise OptionError(f"online must be True, a dict or an OnlineAugment, got {value!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def apply_batch(self, batch: dict[str, Any], seed: int, epoch: int) -> dict[str, Any]:
        THREADS.add(threading.current_thread().name)
        for r, i in enumerate(batch["index"].tolist()):
            if self.hflip and sample_rng(seed, epoch, i).random() < 0.5:
                batch["image"][r] = batch["image"][r][:, ::-1].copy()
        if self.shift:
            batch["image"] += np.uint8(self.shift)
        return batch


THREADS: set[str] = set()


@pytest.fixture
def online(monkeypatch: pytest.MonkeyPatch) -> type[StandInOnline]:
    module = types.ModuleType("dlpack.transforms.online")
    module.OnlineAugment = StandInOnline  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "dlpack.transforms.online", module)
    THREADS.clear()
    return StandInOnline


def flipped(image: np.ndarray, seed: int, epoch: int, index: int) -> np.ndarray:
    return image[:, ::-1] if sample_rng(seed, epoch, index).random() < 0.5 else image


@pytest.mark.parametrize("value", [True, {"hflip": True}, "instance"])
def test_online_accepts_true_a_dict_or_the_layer_and_keeps_its_dict(online: Any, value: Any) -> None:
    opts = LoaderOptions(online=online() if value == "instance" else value)
    assert opts.online == {"hflip": True, "shift": 0}
    assert LoaderOptions(online=None).online is None and LoaderOptions(online=False).online is None  # type: ignore[arg-type]


def test_bad_online_values_are_refused_naming_the_field(online: Any) -> None:
    with pytest.raises(OptionError, match="online has no field 'flip'"):
        LoaderOptions(online={"flip": True})
    with pytest.raises(OptionError, match="online must be"):
        LoaderOptions(online="yes")  # type: ignore[arg-type]


@pytest.mark.parametrize("cached", [False, True])
def test_the_online_layer_runs_on_the_reader_threads_per_seed_index_and_epoch(
    ds: dlpack.Dataset, originals: list[dict[str, Any]], online: Any, cached: bool
) -> None:
    aug = {"augment": "cached"} if cached else {}
    batches = run(ds.loader(batch_size=5, seed=9, online=True, workers=2, **aug), 3)
    assert ("variant" in batches[0]) == cached
    assert THREADS and all(name.startswith("dlpack") for name in THREADS)
    for b in batches:
        for r, i in enumerate(b["index"].tolist()):
            v = int(b["variant"][r]) if cached else 0
            want = flipped(expected_variant(originals[i], v)["image"], 9, b["epoch"], i)
            assert np.array_equal(b["image"][r], want)
    again = run(ds.loader(batch_size=5, seed=9, online={"hflip": True}, workers=0, **aug), 3)
    assert all(np.array_equal(a["image"], b["image"]) for a, b in zip(batches, again, strict=True))


def test_the_online_layer_is_part_of_the_state(ds: dlpack.Dataset, online: Any) -> None:
    state = ds.loader(batch_size=4, online=True).state_dict()
    assert json.loads(json.dumps(state))["options"]["online"] == {"hflip": True, "shift": 0}
    ds.loader(batch_size=4, online={"hflip": True}).load_state_dict(state)
    with pytest.raises(StateError, match="saved with online="):
        ds.loader(batch_size=4, online={"shift": 1}).load_state_dict(state)
    with pytest.raises(StateError, match="saved with online="):
        ds.loader(batch_size=4).load_state_dict(state)


@pytest.mark.parametrize("cached", [False, True])
def test_the_real_online_layer_over_originals_and_cached_views(
    ds: dlpack.Dataset, originals: list[dict[str, Any]], cached: bool
) -> None:
    real = pytest.importorskip("dlpack.transforms.online")
    aug: dict[str, Any] = {"augment": "cached"} if cached else {}
    opts = LoaderOptions(batch_size=4, online=True, seed=3, **aug)
    assert opts.online == real.OnlineAugment.from_value(True).to_dict()
    a = run(ds.loader(opts, workers=2), 2)
    b = run(ds.loader(opts, workers=0), 2)
    for x, y in zip(a, b, strict=True):
        assert np.array_equal(x["image"], y["image"]) and x["boxes"] == y["boxes"]
    flips = 0
    for x in a:  # every row is its view, left-right flipped or not, with its boxes
        for r, i in enumerate(x["index"].tolist()):
            want = expected_variant(originals[i], int(x["variant"][r]) if cached else 0)
            flipped_row = not np.array_equal(x["image"][r], want["image"])
            flips += flipped_row
            image = want["image"][:, ::-1] if flipped_row else want["image"]
            assert np.array_equal(x["image"][r], image)
            boxes = want["boxes"].copy()
            if flipped_row:
                boxes[:, [0, 2]] = image.shape[1] - want["boxes"][:, [2, 0]]
            np.testing.assert_allclose(x["boxes"][r], boxes, atol=1e-4)
    assert 0 < flips < 2 * N


# ---------------------------------------------------------------- the transform hook


def test_a_transform_declaring_epoch_indices_and_sample_rng_gets_them(ds: dlpack.Dataset) -> None:
    calls: list[tuple[int, list[int]]] = []

    def jitter(batch: dict[str, Any], *, epoch: int, indices: np.ndarray, sample_rng: Any) -> dict[str, Any]:
        calls.append((epoch, indices.tolist()))
        assert np.array_equal(indices, batch["index"])
        batch["noise"] = np.array([sample_rng(i).integers(0, 2**31) for i in indices])
        return batch

    loader = ds.loader(batch_size=5, seed=13, workers=2, transform=jitter)
    got = run(loader, 2)
    assert sorted(e for e, _ in calls) == sorted(b["epoch"] for b in got)
    for b in got:
        want = [sample_rng(13, b["epoch"], int(i)).integers(0, 2**31) for i in b["index"]]
        assert b["noise"].tolist() == want
    again = run(ds.loader(batch_size=5, seed=13, workers=0, transform=jitter), 2)
    assert [b["noise"].tolist() for b in again] == [b["noise"].tolist() for b in got]


def test_a_transform_gets_only_the_keywords_it_declares(ds: dlpack.Dataset) -> None:
    seen: list[Any] = []

    def only_epoch(batch: dict[str, Any], epoch: int = -1) -> dict[str, Any]:
        seen.append(epoch)
        return batch

    def plain(batch: dict[str, Any]) -> dict[str, Any]:
        seen.append("plain")
        return batch

    def catch_all(batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        seen.append(kwargs)
        return batch

    def epoch_first(epoch: dict[str, Any]) -> dict[str, Any]:  # the batch's own name is never a keyword
        seen.append("first")
        return epoch

    for fn in (only_epoch, plain, catch_all, functools.partial(catch_all), epoch_first):
        loader = ds.loader(batch_size=N, shuffle=False, transform=fn)
        loader.set_epoch(2)
        list(loader)
    assert seen == [2, "plain", {}, {}, "first"]


# ---------------------------------------------------------------- torch and HALCON pass-through


def test_torch_loader_passes_the_options_and_keeps_variant(ds: dlpack.Dataset, originals: list[dict[str, Any]]) -> None:
    torch = pytest.importorskip("torch")
    from dlpack.torch import torch_loader

    loader = torch_loader(ds, batch_size=4, augment="cached", views_per_batch=2, seed=3, pin_memory=False)
    assert loader.loader.options.augment == "cached" and isinstance(loader.loader.source, CachedViews)
    loader.set_epoch(1)
    batches = list(loader)
    assert len(batches) == N // 2
    for b in batches:
        assert b["variant"].dtype == torch.int64
        idx, var = b["index"].tolist(), b["variant"].tolist()
        assert var == view_schedule(3, idx[::2], 1, K, views_per_batch=2).reshape(-1).tolist()
        for r, (i, v) in enumerate(zip(idx, var, strict=True)):
            want = expected_variant(originals[i], v)
            assert np.array_equal(b["image"][r].permute(1, 2, 0).numpy(), want["image"])
            assert np.array_equal(b["boxes"][r].numpy(), want["boxes"])
    state = loader.state_dict()
    assert state["options"]["views_per_batch"] == 2


def test_halcon_feeder_passes_the_options_and_keeps_variant(
    ds: dlpack.Dataset, originals: list[dict[str, Any]]
) -> None:
    halcon_standin.reset()
    got = [
        d
        for batch in dlpack.halcon.sample_batches(
            ds, 4, shuffle=False, epoch=2, augment="cached", seed=7, halcon=halcon_standin
        )
        for d in batch
    ]
    assert [d.tuples["image_id"][0] for d in got] == list(range(N))
    assert [d.tuples["variant"][0] for d in got] == view_schedule(7, range(N), 2, K)[:, 0].tolist()
    for d in got:
        i, v = d.tuples["image_id"][0], d.tuples["variant"][0]
        want = expected_variant(originals[i], v)
        assert d.tuples["bbox_col1"] == [float(x) - 0.5 for x in want["boxes"][:, 0]]
        np.testing.assert_array_equal(d.objects["image"].array, dlpack.halcon.scale_image(want["image"]))
    plain = [d for b in dlpack.halcon.sample_batches(ds, 4, as_halcon=False) for d in b]
    assert all("variant" not in d for d in plain)
    with pytest.raises(OptionError, match="views_per_batch"):
        dlpack.halcon.sample_batches(ds, 4, augment="cached", views_per_batch=3, halcon=halcon_standin)


# ---------------------------------------------------------------- one take over the views


def test_a_cached_batch_read_in_one_take_equals_the_per_sample_reads(tmp_path: Path, make_tree: Any) -> None:
    """64x64x3 rows (three pages) in shards of five, K=2 built by ``dlpack augment``: the arrays'
    rows are mixed by one take (the reader's MixSpan), and every row, label and source equals the
    per-sample reads (``ds[i]``, ``ds.variant(i, v)``), through the loader and ``get_batch``."""
    store = tmp_path / "s.zarr"
    tree = make_tree({f"{'ab'[k % 2]}/{k}.png": ("rgb", 64, 64) for k in range(23)})
    dlpack.build(tree, store, size=(64, 64), shard_bytes=65536, jobs=1, quiet=True)
    examples = Path(__file__).resolve().parents[2] / "examples"
    dlpack.augment(store, k=2, config=examples / "augment_albumentations.json", seed=1, jobs=1, quiet=True)
    with dlpack.open(store) as d:
        views = CachedViews(d, seed=3)
        views.warm()
        names = views._names["images"]
        assert d.reader._mix_plan(names)[0] is not None  # the one-take path, not row by row

        def want(i: int, v: int) -> dict[str, Any]:
            return d[i] if v == 0 else d.variant(i, v)

        seen = set()
        for e in range(4):
            for batch in d.loader(batch_size=7, augment="cached", seed=3, workers=0).batches(e):
                got = views.get_batch(batch, e)
                for r, (i, v) in enumerate(zip(got["index"].tolist(), got["variant"].tolist(), strict=True)):
                    assert np.array_equal(got["image"][r], want(i, v)["image"]), (e, i, v)
                    assert got["label"][r] == d[i]["label"] and got["source"][r] == d[i]["source"]
                    seen.add(v)
        assert seen == {0, 1, 2}
        loader = d.loader(batch_size=5, augment="cached", seed=3)
        for batch in loader:
            for r, (i, v) in enumerate(zip(batch["index"].tolist(), batch["variant"].tolist(), strict=True)):
                assert np.array_equal(batch["image"][r], want(i, v)["image"]), (i, v)
