"""The PyTorch path at the loader's speed: layouts, conversions on the reader threads, the pinned
pool's allocator seam, store statistics, keyed arrays on every path, and the loader's statistics.

The reference for every value is :func:`dlpack.torch.to_tensor`, the conversion the adapter made
on the training thread before (scale, subtract, divide, then a contiguous copy).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import dlpack  # noqa: E402
from dlpack.manifest import Manifest  # noqa: E402
from dlpack.pack.stats import pixel_stats  # noqa: E402
from dlpack.read.loader import Loader, LoaderOptions, _BufferPool  # noqa: E402
from dlpack.torch import TorchLoader, to_tensor, torch_loader  # noqa: E402

N = 20
SHAPE = (6, 8, 3)  # H, W, C
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
FORMATS = {"channels_last": torch.channels_last, "contiguous": torch.contiguous_format}


def _write_pngs(folder: Path, n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for k in range(n):
        sub = folder / f"c{k % 2}"
        sub.mkdir(parents=True, exist_ok=True)
        cv2.imwrite(str(sub / f"{k:03d}.png"), rng.integers(0, 256, (SHAPE[0] + k % 3, SHAPE[1], 3), np.uint8))


@pytest.fixture(scope="module", params=["s.zarr", "s.h5"])
def store(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """20 noise images at 8x6 in two classes, with boxes, box_labels and a mask."""
    tmp = tmp_path_factory.mktemp("torch-path")
    _write_pngs(tmp / "src", N, 11)
    out = tmp / request.param
    dlpack.build(tmp / "src", out, size=(SHAPE[1], SHAPE[0]), jobs=1, quiet=True)
    dlpack.add_array(out, "boxes", [np.full((i % 3, 4), i, np.float32) for i in range(N)], ragged=True)
    dlpack.add_array(out, "box_labels", [np.full(i % 3, i % 2, np.int32) for i in range(N)], ragged=True)
    dlpack.add_array(out, "mask", np.stack([np.full(SHAPE[:2], i, np.uint8) for i in range(N)]))
    return out


@pytest.fixture(scope="module")
def ds(store: Path) -> Any:
    d = dlpack.open(store)
    yield d
    d.close()


def _reference(ds: Any, seed: int = 3, batch_size: int = 8) -> list[dict[str, Any]]:
    return list(ds.loader(batch_size=batch_size, seed=seed, workers=0, prefetch=0))


class _Deep:
    """A BatchSource of uint16 images (a 16-bit store's batches) made in memory."""

    def __init__(self, n: int = 12) -> None:
        rng = np.random.default_rng(4)
        self.images = rng.integers(0, 65536, (n, 5, 7, 3), dtype=np.uint16)
        self.images[0] = 65535

    def __len__(self) -> int:
        return len(self.images)

    def get_batch(self, indices: np.ndarray, epoch: int = 0, out: np.ndarray | None = None) -> dict[str, Any]:
        imgs = self.images[indices]
        if out is not None:
            out[...] = imgs
            imgs = out
        return {"image": imgs, "index": indices, "label": np.zeros(len(indices), np.int32)}

    def warm(self) -> None:
        pass

    def fingerprint(self) -> str:
        return "deep"

    def image_layout(self) -> tuple[tuple[int, ...], str]:
        return (5, 7, 3), "<u2"


# ---------------------------------------------------------------- layouts


@pytest.mark.parametrize("workers", [0, 2])
def test_default_image_is_a_zero_copy_channels_last_view(ds: Any, workers: int) -> None:
    ref = _reference(ds)
    got = list(torch_loader(ds, batch_size=8, seed=3, workers=workers, pin_memory=False))
    assert len(got) == len(ref) == 3
    for t, b in zip(got, ref, strict=True):
        img = t["image"]
        assert img.dtype == torch.uint8 and tuple(img.shape) == (len(b["index"]), 3, *SHAPE[:2])
        assert img.is_contiguous(memory_format=torch.channels_last) and not img.is_contiguous()
        assert img.stride() == (SHAPE[0] * SHAPE[1] * 3, 1, SHAPE[1] * 3, 3)  # NHWC bytes, NCHW indices
        assert torch.equal(img, to_tensor(b["image"]))


def test_the_view_shares_the_loaders_batch_array(ds: Any) -> None:
    tl = torch_loader(ds, batch_size=8, seed=3, workers=0, prefetch=0, pin_memory=False)
    seen: list[np.ndarray] = []
    inner = tl.loader.finisher
    assert inner is not None

    def spy(batch: dict[str, Any]) -> dict[str, Any]:
        seen.append(batch["image"])
        return inner(batch)

    tl.loader.finisher = spy
    t = next(iter(tl))
    assert np.shares_memory(t["image"].numpy(), seen[0])  # no copy between the loader and the tensor


@pytest.mark.parametrize("workers", [0, 2])
def test_contiguous_nchw_on_request(ds: Any, workers: int) -> None:
    ref = _reference(ds)
    tl = torch_loader(
        ds, batch_size=8, seed=3, workers=workers, memory_format=torch.contiguous_format, pin_memory=False
    )
    for t, b in zip(tl, ref, strict=True):
        assert t["image"].is_contiguous() and t["image"].dtype == torch.uint8
        assert torch.equal(t["image"], to_tensor(b["image"]))
    with pytest.raises(dlpack.OptionError, match="memory_format must be torch.channels_last"):
        torch_loader(ds, memory_format=torch.preserve_format, pin_memory=False)
    with pytest.raises(dlpack.OptionError, match="dtype must be a torch.dtype"):
        torch_loader(ds, dtype="float32", pin_memory=False)


# ---------------------------------------------------------------- values


@pytest.mark.parametrize("fmt", sorted(FORMATS))
@pytest.mark.parametrize(
    ("dtype", "mean", "std", "atol"),
    [
        (torch.float32, None, None, 1e-6),
        (torch.float32, MEAN, STD, 1e-5),
        (torch.float64, MEAN, STD, 1e-12),
        (torch.float16, MEAN, STD, 1e-2),
        (torch.uint8, MEAN, STD, 1e-5),  # today's rule: a normalised uint8 request gives float32
        (torch.float32, (0.5,), (0.25,), 1e-5),  # one number for every channel
    ],
)
def test_float_values_equal_the_reference_conversion(
    ds: Any, fmt: str, dtype: Any, mean: Any, std: Any, atol: float
) -> None:
    ref = _reference(ds)
    tl = torch_loader(
        ds, batch_size=8, seed=3, dtype=dtype, mean=mean, std=std, memory_format=FORMATS[fmt], pin_memory=False
    )
    for t, b in zip(tl, ref, strict=True):
        want = to_tensor(b["image"], dtype, mean, std)
        assert t["image"].dtype == want.dtype and t["image"].shape == want.shape
        assert t["image"].is_contiguous(memory_format=FORMATS[fmt])
        np.testing.assert_allclose(t["image"].double().numpy(), want.double().numpy(), rtol=0, atol=atol)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_uint16_batches_equal_the_reference(fmt: str) -> None:
    src = _Deep()
    for dtype, mean, std in ((torch.uint8, None, None), (torch.float32, None, None), (torch.float32, MEAN, STD)):
        loader = Loader(src, LoaderOptions(batch_size=5, shuffle=False, workers=2))
        got = list(TorchLoader(loader, dtype, mean, std, pin_memory=False, memory_format=FORMATS[fmt]))
        assert len(got) == 3
        for k, t in enumerate(got):
            want = to_tensor(src.images[5 * k : 5 * k + 5], dtype, mean, std)  # 16-bit: always float
            assert t["image"].dtype == want.dtype == torch.float32
            assert t["image"].is_contiguous(memory_format=FORMATS[fmt])
            np.testing.assert_allclose(t["image"].numpy(), want.numpy(), rtol=0, atol=1e-5)
        top = got[0]["image"][0].max()  # image 0 is all 65535
        assert float(top) == pytest.approx(float(to_tensor(src.images[:1], dtype, mean, std).max()), abs=1e-5)


# ---------------------------------------------------------------- store statistics


def test_build_records_pixel_stats_and_ds_stats_shows_them(ds: Any) -> None:
    pixels = np.stack([ds[i]["image"] for i in range(len(ds))]).reshape(-1, 3).astype(np.float64)
    stats = ds.stats
    assert stats is not None and stats["count"] == N * SHAPE[0] * SHAPE[1]
    np.testing.assert_allclose(stats["mean"], pixels.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(stats["std"], pixels.std(axis=0), rtol=1e-12)
    assert ds.info()["stats"] == stats
    # add_array (in the fixture) left the pixels alone, and the statistics with them.
    assert json.loads(ds.manifest.to_json())["stats"] == stats


def test_info_shows_the_pixel_stats_in_one_line(ds: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from dlpack.cli import main

    capsys.readouterr()
    assert main(["info", str(ds.path)]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("pixel stats")]
    mean = ", ".join(f"{v:.2f}" for v in ds.stats["mean"])
    std = ", ".join(f"{v:.2f}" for v in ds.stats["std"])
    assert len(lines) == 1 and lines[0].split(None, 2)[2] == f"mean {mean}; std {std}"


def test_pixel_stats_do_not_depend_on_the_chunking(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(1)
    images = rng.integers(0, 65536, (9, 4, 5, 3), dtype=np.uint16)
    whole = pixel_stats(lambda a, b: images[a:b], 9, 60, 3, "<u2")
    monkeypatch.setattr("dlpack.pack.stats.CHUNK_VALUES", 61)  # one image per chunk
    chunked = pixel_stats(lambda a, b: images[a:b], 9, 60, 3, "<u2")
    assert chunked == whole
    flat = images.reshape(-1)  # a variable-size store's flat data: one value per row
    assert pixel_stats(lambda a, b: flat[a:b], len(flat), 1, 3, "<u2") == whole
    np.testing.assert_allclose(whole["mean"], images.reshape(-1, 3).mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(whole["std"], images.reshape(-1, 3).std(axis=0), rtol=1e-12)


def test_variable_size_store_and_update_record_stats(tmp_path: Path) -> None:
    _write_pngs(tmp_path / "src", 5, 2)
    out = tmp_path / "v.zarr"
    dlpack.build(tmp_path / "src", out, jobs=1, quiet=True)
    with dlpack.open(out) as d:
        pixels = np.concatenate([d[i]["image"].reshape(-1, 3) for i in range(len(d))]).astype(np.float64)
        np.testing.assert_allclose(d.stats["mean"], pixels.mean(axis=0), rtol=1e-12)
        np.testing.assert_allclose(d.stats["std"], pixels.std(axis=0), rtol=1e-12)
    fixed = tmp_path / "f.zarr"  # --update keeps fixed-size stores only
    dlpack.build(tmp_path / "src", fixed, size=(8, 6), jobs=1, quiet=True)
    with dlpack.open(fixed) as d:
        before = d.stats
    cv2.imwrite(str(tmp_path / "src" / "c0" / "new.png"), np.full((9, 9, 3), 255, np.uint8))
    dlpack.build(tmp_path / "src", fixed, update=True, jobs=1, quiet=True)
    with dlpack.open(fixed) as d:
        assert len(d) == 6 and d.stats["count"] == before["count"] + 48
        pixels = np.concatenate([d[i]["image"].reshape(-1, 3) for i in range(len(d))]).astype(np.float64)
        np.testing.assert_allclose(d.stats["mean"], pixels.mean(axis=0), rtol=1e-12)
        assert d.stats["mean"][0] > before["mean"][0]  # the white image raised every mean


def test_manifest_stats_round_trip_and_are_checked(ds: Any) -> None:
    m = ds.manifest
    again = Manifest.from_json(m.to_json())
    assert again.stats == m.stats
    d = json.loads(m.to_json())
    for bad, why in (
        ({"mean": [1.0, 2.0], "std": [1.0, 1.0], "count": 3}, "stats.mean must be 3 finite numbers"),
        ({"mean": [1.0] * 3, "std": [-1.0] * 3, "count": 3}, "stats.std must be >= 0"),
        ({"mean": [1.0] * 3, "std": [1.0] * 3}, "stats must be an object of mean, std and count"),
        ({"mean": [1.0] * 3, "std": [1.0] * 3, "count": -2}, "stats.count must be an integer >= 0"),
    ):
        with pytest.raises(dlpack.StoreError, match=why):
            Manifest.from_dict({**d, "stats": bad})
    del d["stats"]
    assert Manifest.from_dict(d).stats is None  # a store built before them: not computed


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_mean_and_std_store_use_the_recorded_stats(ds: Any, fmt: str) -> None:
    mean = [v / 255 for v in ds.stats["mean"]]
    std = [v / 255 for v in ds.stats["std"]]
    ref = _reference(ds)
    tl = torch_loader(
        ds, batch_size=8, seed=3, dtype=torch.float32, mean="store", std="store", memory_format=FORMATS[fmt],
        pin_memory=False,
    )  # fmt: skip
    images = []
    for t, b in zip(tl, ref, strict=True):
        np.testing.assert_allclose(
            t["image"].numpy(), to_tensor(b["image"], torch.float32, mean, std).numpy(), atol=1e-5
        )
        images.append(t["image"])
    every = torch.cat(images)  # the whole store, normalised by its own statistics: mean 0, std 1
    np.testing.assert_allclose(every.mean(dim=(0, 2, 3)).numpy(), 0.0, atol=1e-4)
    np.testing.assert_allclose(every.std(dim=(0, 2, 3), correction=0).numpy(), 1.0, atol=1e-4)


def test_mean_store_without_recorded_stats_names_the_store_and_the_fix() -> None:
    class Old(_Deep):
        path = "/data/old.zarr"
        manifest = None

    with pytest.raises(
        dlpack.OptionError, match=r"/data/old.zarr has none .*rebuild it with `dlpack build --overwrite`"
    ):
        TorchLoader(Loader(Old()), torch.float32, "store", "store", pin_memory=False)
    with pytest.raises(dlpack.OptionError, match="mean must be per-channel numbers or 'store', got 'stor'"):
        TorchLoader(Loader(Old()), torch.float32, "stor", None, pin_memory=False)


# ---------------------------------------------------------------- pinned buffers


def test_buffer_pool_takes_an_allocator_and_never_recycles_a_held_batch() -> None:
    made: list[tuple[int, int]] = []  # (address, size) only: a reference would keep a block "in use"

    def allocator(nbytes: int) -> np.ndarray:
        block = np.zeros(nbytes, np.uint8)
        made.append((block.ctypes.data, nbytes))
        return block

    def block_of(arr: np.ndarray) -> int | None:
        return next((k for k, (at, n) in enumerate(made) if at <= arr.ctypes.data < at + n), None)

    pool = _BufferPool((4, 2, 3, 3), "|u1", limit=2, allocator=allocator)
    first = pool.take(4)
    assert len(made) == 1 and block_of(first) == 0
    held = torch.from_numpy(first)  # a tensor made from the batch, the batch array dropped
    del first
    second = pool.take(4)
    assert len(made) == 2 and block_of(second) == 1  # the held block is not reused
    second[...] = 7
    assert int(held.sum()) == 0  # what the tensor shows was never overwritten
    del second
    third = pool.take(4)
    assert len(made) == 2 and block_of(third) == 1  # the dropped one is
    assert block_of(pool.take(4)) is None  # both held, the limit reached: a plain array, not a block
    del held, third
    assert block_of(pool.take(4)) in (0, 1)
    pool.use_allocator(lambda n: np.ones(n, np.uint8))
    assert int(pool.take(4).sum()) == 4 * 2 * 3 * 3  # the new allocator's blocks from now on


def test_pin_memory_reads_into_the_pinned_allocators_blocks(ds: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(dlpack.OptionError, match="pin_memory=True needs CUDA"):
        torch_loader(ds, pin_memory=True)
    blocks: list[np.ndarray] = []

    def fake_pinned(nbytes: int) -> np.ndarray:
        blocks.append(np.empty(nbytes, np.uint8))
        return blocks[-1]

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr("dlpack.torch._pinned_block", fake_pinned)
    tl = torch_loader(ds, batch_size=8, seed=3, workers=2, pin_memory=True)
    assert tl.loader._pool is not None and tl.loader._pool.allocator is fake_pinned
    ref = _reference(ds)
    # Through the loader (pinning itself needs CUDA): the batches are views of the pinned blocks.
    for got, b in zip(tl.loader, ref, strict=True):
        assert any(np.shares_memory(got["image"].numpy(), blk) for blk in blocks)
        assert torch.equal(got["image"], to_tensor(b["image"]))
    assert 1 <= len(blocks) <= tl.loader._pool.limit


# ---------------------------------------------------------------- keyed arrays


PATHS = {
    "channels_last": {},
    "contiguous": {"memory_format": torch.contiguous_format},
    "float": {"dtype": torch.float32, "mean": MEAN, "std": STD},
    "float-contiguous": {
        "dtype": torch.float32,
        "mean": "store",
        "std": "store",
        "memory_format": torch.contiguous_format,
    },
    "device": {"device": torch.device("meta"), "dtype": torch.float32, "mean": MEAN, "std": STD},
}


@pytest.mark.parametrize("path", sorted(PATHS))
def test_every_keyed_array_reaches_the_batches_on_every_path(ds: Any, path: str) -> None:
    kw = PATHS[path]
    ref = _reference(ds)
    tl = torch_loader(ds, batch_size=8, seed=3, workers=2, pin_memory=False, **kw)
    on = kw.get("device", torch.device("cpu")).type
    for t, b in zip(tl, ref, strict=True):
        assert set(t) == {"image", "label", "index", "boxes", "box_labels", "mask", "source"} - {"source"}
        n = len(b["index"])
        assert t["index"].device.type == "cpu" and t["index"].tolist() == b["index"].tolist()
        assert t["image"].device.type == on and tuple(t["image"].shape) == (n, 3, *SHAPE[:2])
        assert t["image"].is_contiguous(memory_format=kw.get("memory_format", torch.channels_last))
        for key in ("label", "mask"):
            assert t[key].device.type == on
        assert len(t["boxes"]) == len(t["box_labels"]) == n
        assert all(x.device.type == on for x in t["boxes"] + t["box_labels"])
        if on == "cpu":
            assert t["label"].tolist() == b["label"].tolist()
            assert torch.equal(t["mask"], torch.from_numpy(b["mask"]))
            for k in range(n):
                assert torch.equal(t["boxes"][k], torch.from_numpy(b["boxes"][k]))
                assert t["box_labels"][k].dtype == torch.int64
                assert t["box_labels"][k].tolist() == b["box_labels"][k].tolist()
        else:  # moved: the device holds uint8 first, converted there to the dtype asked for
            assert t["image"].dtype == torch.float32 and t["mask"].dtype == torch.uint8


# ---------------------------------------------------------------- the finisher, stats, report


def test_finisher_runs_after_the_transform_on_a_reader_thread(ds: Any) -> None:
    seen: list[tuple[str, bool]] = []

    def transform(batch: dict[str, Any]) -> dict[str, Any]:
        return {**batch, "transformed": True}

    def finisher(batch: dict[str, Any]) -> dict[str, Any]:
        seen.append((threading.current_thread().name, batch.get("transformed", False)))
        return {**batch, "finished": True}

    for workers, prefetch in ((2, 4), (0, 0)):
        seen.clear()
        loader = Loader(
            ds, LoaderOptions(batch_size=8, workers=workers, prefetch=prefetch), transform, finisher=finisher
        )
        batches = list(loader)
        assert all(b["finished"] for b in batches) and len(seen) == len(batches) == 3
        assert all(done for _, done in seen)  # the user's transform ran first
        if workers:
            assert all(name.startswith("dlpack") for name, _ in seen)
        else:
            assert {name for name, _ in seen} == {threading.current_thread().name}


def test_torch_conversion_runs_on_the_reader_threads(ds: Any) -> None:
    # No read-ahead across epochs: the next epoch's first batches would be finished too.
    tl = torch_loader(
        ds, batch_size=8, workers=2, dtype=torch.float32, mean=MEAN, std=STD, pin_memory=False, read_ahead_epochs=False
    )
    names: list[str] = []
    inner = tl.loader.finisher
    assert inner is not None

    def spy(batch: dict[str, Any]) -> dict[str, Any]:
        out = inner(batch)
        names.append(threading.current_thread().name)
        assert out["image"].dtype == torch.float32  # converted here, not on the caller's thread
        return out

    tl.loader.finisher = spy
    assert len(list(tl)) == 3
    assert len(names) == 3 and all(n.startswith("dlpack") for n in names)


def test_stats_and_report_pass_through(ds: Any, capsys: pytest.CaptureFixture[str]) -> None:
    tl = torch_loader(ds, batch_size=8, seed=1, report=True, pin_memory=False)
    assert tl.loader.options.report
    for _ in range(2):
        assert len(list(tl)) == 3
    stats = tl.stats()
    assert stats == tl.loader.stats() and [s.epoch for s in stats] == [0, 1]
    assert all(s.complete and s.images == N and s.batches == 3 for s in stats)
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("epoch ")]
    assert len(lines) == 2 and lines[0].startswith("epoch 0: ") and "img/s" in lines[0]


@pytest.mark.parametrize(
    ("kw", "works"),
    [({}, False), ({"dtype": torch.float32}, True), ({"memory_format": torch.contiguous_format}, True)],
)
def test_auto_workers_counts_the_conversion_as_work_on_the_reader_threads(
    ds: Any, kw: dict[str, Any], works: bool
) -> None:
    """A zero-copy view adds nothing to the copy (one thread reads at memory speed); a float
    conversion or an NCHW copy is work per batch, so "auto" reads on every core, as for a transform."""
    tl = torch_loader(ds, batch_size=4, **kw)
    plain = ds.loader(batch_size=4)
    busy = ds.loader(batch_size=4, transform=lambda b: b)
    assert tl.loader.workers == (busy.workers if works else plain.workers)
    assert ("work per batch" in repr(tl.loader)) is works


# ---------------------------------------------------------------- what a batch costs


class _Calls(torch.overrides.TorchFunctionMode):
    """Records the torch functions and tensor methods called on this thread while it is active."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.names.append(getattr(func, "__name__", repr(func)))
        return func(*args, **(kwargs or {}))


def test_the_default_batch_is_made_without_a_torch_operation(ds: Any) -> None:
    """uint8 channels_last: the image, label and index tensors wrap NumPy arrays (``from_numpy`` of
    a transposed view), and the only torch call per batch splits each ragged array into its
    samples. Each torch call costs microseconds on a reader thread whose caches the copy flushed."""
    tl = torch_loader(ds, batch_size=8, seed=3, workers=0, prefetch=0, pin_memory=False)
    finish = tl.loader.finisher
    assert finish is not None
    ref = _reference(ds)
    for b in ref:
        batch = ds.get_batch(b["index"], 0, np.empty((len(b["index"]), *SHAPE), np.uint8))
        with _Calls() as calls:  # what the reader thread does to the batch
            t = finish(batch)
        assert calls.names == ["split", "split"]  # boxes and box_labels
        assert t["image"].is_contiguous(memory_format=torch.channels_last)
        assert torch.equal(t["image"], to_tensor(b["image"]))
        assert t["label"].tolist() == b["label"].tolist() and t["index"].tolist() == b["index"].tolist()
        assert len(t["boxes"]) == len(b["index"]) and torch.equal(t["mask"], torch.from_numpy(b["mask"]))


def test_on_the_cpu_the_training_thread_gets_the_finished_batches_as_they_are(ds: Any) -> None:
    """Without pinning or a device, nothing is left to do per batch on the training thread: the
    dicts the reader threads finished are the ones yielded (no generator and dict rebuilt between)."""
    for device in (None, "cpu"):
        # No read-ahead across epochs: the next epoch's first batches would be finished too.
        tl = torch_loader(ds, batch_size=8, seed=3, workers=2, pin_memory=False, device=device, read_ahead_epochs=False)
        finished: list[dict[str, Any]] = []
        inner = tl.loader.finisher
        assert inner is not None

        def spy(batch: dict[str, Any], inner: Any = inner, finished: list[dict[str, Any]] = finished) -> Any:
            finished.append(inner(batch))
            return finished[-1]

        tl.loader.finisher = spy
        got = list(tl)
        assert len(got) == 3 and all(a is b for a, b in zip(got, finished, strict=True))
        assert all(t["label"].device.type == "cpu" for t in got)
    moved = torch_loader(ds, batch_size=8, seed=3, workers=2, pin_memory=False, device="meta")
    assert all(t["image"].device.type == "meta" for t in moved)  # moving still happens where asked


def test_torch_batches_recycle_the_loaders_batch_blocks(ds: Any) -> None:
    """A tensor made from a batch keeps its block only while the caller holds it: over epochs the
    pool serves every batch from its blocks, as for ``ds.loader`` (no fresh array per batch)."""
    tl = torch_loader(ds, batch_size=8, seed=3, workers=2, pin_memory=False)
    pool = tl.loader._pool
    assert pool is not None
    # The blocks' address ranges, not the blocks: a reference kept here would keep every block busy.
    blocks: list[tuple[int, int]] = []

    def counted(nbytes: int) -> np.ndarray:
        block = np.empty(nbytes, np.uint8)
        blocks.append((block.ctypes.data, block.ctypes.data + nbytes))
        return block

    pool.use_allocator(counted)
    seen = 0
    for _ in range(4):
        for t in tl:
            image = t["image"]
            start = image.data_ptr()
            assert any(lo <= start and start + image.untyped_storage().nbytes() <= hi for lo, hi in blocks)
            seen += 1
    assert seen == 12 and 1 <= len(blocks) <= pool.limit


def test_the_device_path_wraps_a_16_bit_batch_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """uint16 pixels cross widened to int32 (torch lacks uint16 arithmetic) and are scaled there."""
    made: list[tuple[int, ...]] = []
    real = torch.from_numpy

    def counting(arr: np.ndarray) -> Any:
        made.append(arr.shape)
        return real(arr)

    src = _Deep()
    tl = TorchLoader(Loader(src, LoaderOptions(batch_size=5, shuffle=False, workers=0)), torch.float32, None, None,
                     pin_memory=False, device="meta")  # fmt: skip
    monkeypatch.setattr(torch, "from_numpy", counting)
    got = list(tl)
    assert len(got) == 3 and all(t["image"].device.type == "meta" and t["image"].dtype == torch.float32 for t in got)
    assert [s for s in made if len(s) == 4] == [(5, 5, 7, 3), (5, 5, 7, 3), (2, 5, 7, 3)]  # one per batch


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"memory_format": torch.contiguous_format},
        {"dtype": torch.float32, "mean": MEAN, "std": STD},
        {"dtype": torch.float64},
        {"dtype": torch.float16, "memory_format": torch.contiguous_format},
    ],
)
def test_loader_stats_count_the_bytes_of_the_tensors_handed_out(ds: Any, kw: dict[str, Any]) -> None:
    """The loader counts image bytes from the finisher's ``image_nbytes`` instead of asking each
    tensor: the count must be the handed tensors' own, whatever the dtype and layout."""
    tl = torch_loader(ds, batch_size=8, seed=1, workers=2, pin_memory=False, **kw)
    handed = sum(b["image"].nbytes for b in tl)
    stats = tl.stats()[-1]
    assert stats.complete and stats.images == N and stats.bytes == handed


def test_loader_stats_count_the_bytes_of_a_16_bit_source_widened_to_float() -> None:
    deep = _Deep()
    tl = TorchLoader(Loader(deep, LoaderOptions(batch_size=5, workers=0, seed=2)), pin_memory=False)
    handed = sum(b["image"].nbytes for b in tl)
    assert tl.stats()[-1].bytes == handed == len(deep) * 5 * 7 * 3 * 4


# ---------------------------------------------------------------- held batches


def _hold(t: dict[str, Any], how: str) -> tuple[Any, Any, torch.Tensor]:
    """What a caller keeps of batch ``t`` (``how``), a function reading its values later, and
    the values it must read."""
    image = t["image"]
    if how == "dict":
        return t, lambda kept: kept["image"].clone(), image.clone()
    if how == "image":
        return image, lambda kept: kept.clone(), image.clone()
    if how == "view":
        return image[1:, :2], lambda kept: kept.clone(), image[1:, :2].clone()
    if how == "numpy":
        return image.numpy(), lambda kept: torch.from_numpy(kept.copy()), image.clone()
    if how == "storage":
        whole = torch.tensor(image.untyped_storage().tolist(), dtype=torch.uint8)
        return image.untyped_storage(), lambda kept: torch.tensor(kept.tolist(), dtype=torch.uint8), whole
    if how == "dlpack":
        return torch.utils.dlpack.to_dlpack(image), lambda kept: torch.from_dlpack(kept).clone(), image.clone()
    if how == "graph":  # only the graph keeps the image: saved for the gradient of p
        p = torch.ones(1, requires_grad=True)
        loss = (image * p).sum()
        grad = image.sum(dtype=torch.float32).reshape(1)
        return (p, loss), lambda kept: (kept[1].backward(), kept[0].grad.clone())[1], grad
    if how == "shared":  # what a torch.multiprocessing queue does to a CPU tensor
        return image.share_memory_(), lambda kept: kept.clone(), image.clone()
    assert how in ("label", "index")
    return t[how], lambda kept: kept.clone(), t[how].clone()


@pytest.mark.parametrize(
    "how", ["dict", "image", "view", "numpy", "storage", "dlpack", "graph", "shared", "label", "index"]
)
@pytest.mark.parametrize("workers", [0, 2])
def test_a_torch_batch_a_caller_holds_is_never_overwritten(
    ds: Any, monkeypatch: pytest.MonkeyPatch, how: str, workers: int
) -> None:
    """The pool's rule (a held batch is never recycled) for every way a caller keeps a default
    uint8 batch: the dict, the image, a view, ``.numpy()``, its storage, a DLPack capsule, a graph
    that saved it, shared memory, the labels or indices. After the loader read every block again
    (three epochs, one batch per block), what is kept reads the values it had."""
    monkeypatch.setattr("dlpack.read.loader._GROUP_BYTES", 1)  # one batch per block, as batches of 1 MiB or more
    tl = torch_loader(ds, batch_size=4, seed=3, pin_memory=False, workers=workers, prefetch=2 if workers else 0)
    assert tl.loader._group == 1
    it = iter(tl)
    for _ in range(2):  # the pool's blocks were all used once
        next(it)
    kept, read, expected = _hold(next(it), how)
    for _ in range(3):
        for _t in it:
            pass
        it = iter(tl)
    assert torch.equal(read(kept), expected)
