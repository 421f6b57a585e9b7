"""The PyTorch adapter: TorchDataset in a DataLoader, torch_loader tensors, resume pass-through.

Runs against both backends with its own module-scoped store (50 noise PNGs in 3 class folders,
packed at 16x12), and only where torch is installed.
"""

from __future__ import annotations

import itertools
import json
import pickle
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import dlpack  # noqa: E402
from dlpack.read.loader import epoch_order  # noqa: E402
from dlpack.torch import TorchDataset, TorchLoader, to_tensor, torch_loader  # noqa: E402

N_IMAGES = 50
SIZE = (16, 12)  # width, height
SHAPE = (12, 16, 3)
STORE_NAMES = {"zarr": "out.zarr", "hdf5": "out.h5"}
MEAN = (0.1, 0.5, 0.9)
STD = (0.2, 0.3, 0.4)


@pytest.fixture(scope="module", params=sorted(STORE_NAMES))
def store_path(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 50-image store of noise at 16x12, one per backend."""
    tmp = tmp_path_factory.mktemp(f"torch-{request.param}")
    rng = np.random.default_rng(3)
    for k in range(N_IMAGES):
        img = rng.integers(0, 256, (SHAPE[0] + k % 4, SHAPE[1] + k % 5, 3), dtype=np.uint8)
        ok, buf = cv2.imencode(".png", img)
        assert ok
        folder = tmp / "src" / f"class{k % 3}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"img{k:03d}.png").write_bytes(buf.tobytes())
    out = tmp / STORE_NAMES[request.param]
    dlpack.build(tmp / "src", out, size=SIZE, jobs=1, quiet=True)
    return out


@pytest.fixture(scope="module")
def ds(store_path: Path) -> Iterator[dlpack.Dataset]:
    d = dlpack.open(store_path)
    yield d
    d.close()


@pytest.fixture(scope="module")
def all_images(ds: dlpack.Dataset) -> np.ndarray:
    images = np.stack([ds[i]["image"] for i in range(len(ds))])
    assert images.shape == (N_IMAGES, *SHAPE)
    assert len({im.tobytes() for im in images}) == N_IMAGES  # every sample tells itself apart
    return images


def chw(images: np.ndarray) -> torch.Tensor:
    """The reference NCHW (or CHW) tensor, built independently of dlpack.torch."""
    axes = (0, 3, 1, 2) if images.ndim == 4 else (2, 0, 1)
    return torch.tensor(np.transpose(images, axes).copy())


def _tag_worker(sample: dict[str, Any]) -> dict[str, Any]:
    info = torch.utils.data.get_worker_info()
    return {**sample, "worker": -1 if info is None else info.id}


# ---------------------------------------------------------------- TorchDataset


@pytest.mark.slow
def test_torch_dataset_in_a_multiprocess_dataloader(store_path: Path, all_images: np.ndarray) -> None:
    tds = TorchDataset(store_path, transform=_tag_worker)
    assert len(tds) == N_IMAGES
    assert tds[0]["worker"] == -1  # opened here, in the main process, before the workers start
    loader = torch.utils.data.DataLoader(
        tds, batch_size=None, shuffle=False, num_workers=2, multiprocessing_context="spawn"
    )
    samples = list(loader)
    assert [int(s["index"]) for s in samples] == list(range(N_IMAGES))
    assert {int(s["worker"]) for s in samples} == {0, 1}  # both worker processes read
    ds = dlpack.open(store_path)
    for i, s in enumerate(samples):
        assert s["image"].dtype == torch.uint8
        assert tuple(s["image"].shape) == (3, *SHAPE[:2])
        assert torch.equal(s["image"], chw(all_images[i]))
        assert int(s["label"]) == ds[i]["label"]
    ds.close()


def test_torch_dataset_batches_collate_to_nchw(store_path: Path, all_images: np.ndarray) -> None:
    loader = torch.utils.data.DataLoader(TorchDataset(store_path), batch_size=16, shuffle=False, num_workers=0)
    batches = list(loader)
    assert [len(b["index"]) for b in batches] == [16, 16, 16, 2]
    images = torch.cat([b["image"] for b in batches])
    assert torch.equal(images, chw(all_images))


def test_torch_dataset_pickles_as_a_path(store_path: Path, all_images: np.ndarray) -> None:
    tds = TorchDataset(store_path)
    first = tds[5]["image"]  # handles are open now
    data = pickle.dumps(tds)
    assert len(data) < 1_000
    copy = pickle.loads(data)
    assert copy.path == tds.path
    assert torch.equal(copy[5]["image"], first)
    assert torch.equal(copy[49]["image"], chw(all_images[49]))
    assert torch.equal(tds[5]["image"], first)  # the original still reads


# ---------------------------------------------------------------- torch_loader


@pytest.mark.parametrize("by_path", [False, True])
def test_torch_loader_yields_uint8_nchw(ds: dlpack.Dataset, store_path: Path, by_path: bool) -> None:
    tl = torch_loader(store_path if by_path else ds, batch_size=8, seed=4, pin_memory=False)
    assert isinstance(tl, TorchLoader)
    ref = list(ds.loader(batch_size=8, seed=4))
    got = list(tl)
    assert len(got) == len(ref) == len(tl) == 7
    for t, b in zip(got, ref, strict=True):
        assert set(t) == {"image", "label", "index"}
        assert t["image"].dtype == torch.uint8
        assert t["image"].is_contiguous(memory_format=torch.channels_last)  # a view of the NHWC batch
        assert tuple(t["image"].shape) == (len(b["index"]), 3, *SHAPE[:2])
        assert torch.equal(t["image"], chw(b["image"]))
        assert t["label"].dtype == torch.int64 and t["label"].tolist() == b["label"].tolist()
        assert t["index"].dtype == torch.int64 and t["index"].tolist() == b["index"].tolist()


def test_torch_loader_float_scales_to_unit_range(ds: dlpack.Dataset, all_images: np.ndarray) -> None:
    tl = torch_loader(ds, batch_size=10, shuffle=False, dtype=torch.float32, pin_memory=False)
    images = torch.cat([b["image"] for b in tl])
    assert images.dtype == torch.float32
    expected = np.transpose(all_images, (0, 3, 1, 2)).astype(np.float64) / 255.0
    np.testing.assert_allclose(images.numpy(), expected, rtol=0, atol=1e-6)
    assert float(images.min()) >= 0.0 and float(images.max()) <= 1.0


def test_torch_loader_normalises_per_channel(ds: dlpack.Dataset, all_images: np.ndarray) -> None:
    tl = torch_loader(ds, batch_size=10, shuffle=False, dtype=torch.float32, mean=MEAN, std=STD, pin_memory=False)
    images = torch.cat([b["image"] for b in tl]).numpy()
    mean = np.array(MEAN).reshape(1, 3, 1, 1)
    std = np.array(STD).reshape(1, 3, 1, 1)
    expected = (np.transpose(all_images, (0, 3, 1, 2)) / 255.0 - mean) / std
    np.testing.assert_allclose(images, expected, rtol=0, atol=1e-5)
    # A pixel of 255 in channel c becomes (1 - mean[c]) / std[c]: 4.5, 1.666..., 0.25.
    full = to_tensor(np.full((2, 2, 3), 255, np.uint8), torch.float32, MEAN, STD)
    assert torch.allclose(full[:, 0, 0], torch.tensor([4.5, 5 / 3, 0.25]))
    zero = to_tensor(np.zeros((1, 2, 2, 3), np.uint8), torch.float64, MEAN, STD)
    assert zero.dtype == torch.float64
    assert torch.allclose(zero[0, :, 1, 1], torch.tensor([-0.5, -5 / 3, -2.25], dtype=torch.float64))


def test_to_tensor_layouts_and_depths() -> None:
    hwc = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    t = to_tensor(hwc)
    assert t.dtype == torch.uint8 and tuple(t.shape) == (4, 2, 3)
    assert torch.equal(t, chw(hwc))
    deep = np.array([[[0, 65535, 32768]]], dtype=np.uint16)
    f = to_tensor(deep, torch.float32)
    assert torch.allclose(f.flatten(), torch.tensor([0.0, 1.0, 32768 / 65535]))


def test_torch_loader_state_passes_through(ds: dlpack.Dataset) -> None:
    ref = list(torch_loader(ds, batch_size=6, seed=8, pin_memory=False))
    tl = torch_loader(ds, batch_size=6, seed=8, pin_memory=False)
    it = iter(tl)
    head = list(itertools.islice(it, 3))
    it.close()
    state = tl.state_dict()
    assert state == tl.loader.state_dict()
    assert state["position"] == 3
    resumed = torch_loader(ds, batch_size=6, seed=8, workers=0, prefetch=0, pin_memory=False)
    resumed.load_state_dict(json.loads(json.dumps(state)))
    rest = list(resumed)
    got = head + rest
    assert len(got) == len(ref)
    for a, b in zip(got, ref, strict=True):
        assert torch.equal(a["index"], b["index"])
        assert torch.equal(a["image"], b["image"])
    with pytest.raises(dlpack.StateError, match="seed="):
        torch_loader(ds, batch_size=6, seed=9).load_state_dict(state)


def test_torch_loader_refuses_a_second_live_iterator(ds: dlpack.Dataset) -> None:
    tl = torch_loader(ds, batch_size=8, seed=2, pin_memory=False)
    first = iter(tl)
    head = [next(first)["index"]]
    with pytest.raises(dlpack.StateError, match="already being iterated"):
        iter(tl)  # refused at once, not at the first batch
    got = torch.cat(head + [b["index"] for b in first])
    assert got.tolist() == epoch_order(N_IMAGES, 2, 0).tolist()
    assert len(list(tl)) == len(tl)  # the finished pass freed the loader


def test_torch_loader_set_epoch_passes_through(ds: dlpack.Dataset) -> None:
    tl = torch_loader(ds, batch_size=8, seed=2, pin_memory=False)
    tl.set_epoch(3)
    got = torch.cat([b["index"] for b in tl])
    assert got.tolist() == epoch_order(N_IMAGES, 2, 3).tolist()
    assert tl.loader.epoch == 4


def test_torch_loader_refuses_a_variable_size_store_unless_lists_are_asked_for(tmp_path: Path) -> None:
    src = tmp_path / "src" / "a"
    src.mkdir(parents=True)
    shapes = [(10, 14), (12, 9), (7, 7), (10, 14)]
    for k, (h, w) in enumerate(shapes):
        img = np.full((h, w, 3), 20 * k, np.uint8)
        (src / f"{k}.png").write_bytes(cv2.imencode(".png", img)[1].tobytes())
    out = tmp_path / "v.zarr"
    dlpack.build(tmp_path / "src", out, jobs=1, quiet=True)
    hint = "variable-size store (3 distinct sizes): batches are lists; pass --size WxH or --max-side N for tensors"
    with pytest.raises(dlpack.OptionError, match=re.escape(hint)):
        torch_loader(out, batch_size=4)
    with pytest.raises(dlpack.OptionError, match="allow_lists=True"):
        TorchLoader(dlpack.open(out).loader())
    loader = torch_loader(out, batch_size=4, shuffle=False, workers=0, prefetch=0, allow_lists=True)
    batch = next(iter(loader))
    assert [tuple(t.shape) for t in batch["image"]] == [(3, h, w) for h, w in shapes]
    assert batch["index"].tolist() == [0, 1, 2, 3]


# ---------------------------------------------------------------- splits


@pytest.fixture(scope="module")
def split_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """12 images at 8x6 under ``train/`` (8) and ``test/`` (4), two classes each."""
    tmp = tmp_path_factory.mktemp("torch-splits")
    rng = np.random.default_rng(5)
    for k in range(12):
        folder = tmp / "src" / ("test" if k % 3 == 0 else "train") / f"c{k % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{k:02d}.png").write_bytes(
            cv2.imencode(".png", rng.integers(0, 256, (6, 8, 3), np.uint8))[1].tobytes()
        )
    dlpack.build(tmp / "src", tmp / "s.zarr", jobs=1, quiet=True)
    return tmp / "s.zarr"


def test_torch_loader_selects_a_split_and_resumes_it(split_store: Path) -> None:
    ds = dlpack.open(split_store)
    train = ds.indices("train")
    ref = [b["index"].tolist() for b in ds.loader(split="train", batch_size=3, seed=4)]
    tl = torch_loader(ds, split="train", batch_size=3, seed=4, pin_memory=False)
    assert len(tl) == 3
    it = iter(tl)
    head = [next(it)["index"].tolist()]
    it.close()
    state = json.loads(json.dumps(tl.state_dict()))
    resumed = torch_loader(split_store, indices=train, batch_size=3, seed=4, pin_memory=False)
    resumed.load_state_dict(state)
    assert head + [b["index"].tolist() for b in resumed] == ref
    assert sorted(sum(ref, [])) == train.tolist()
    with pytest.raises(dlpack.StateError, match="another selection"):
        torch_loader(ds, split="test", batch_size=3, seed=4).load_state_dict(state)
    with pytest.raises(dlpack.OptionError, match="its splits are: test, train"):
        torch_loader(ds, split="val")
    ds.close()


def test_torch_dataset_selects_a_split_and_pickles_it(split_store: Path) -> None:
    ds = dlpack.open(split_store)
    test = ds.indices("test")
    tds = TorchDataset(split_store, split="test")
    assert len(tds) == len(test) == 4
    assert [tds[k]["index"] for k in range(len(tds))] == test.tolist()
    assert torch.equal(tds[1]["image"], chw(ds[int(test[1])]["image"]))
    copy = pickle.loads(pickle.dumps(tds))
    assert [copy[k]["index"] for k in range(len(copy))] == test.tolist()
    chosen = TorchDataset(split_store, indices=[5, 0])
    assert len(chosen) == 2 and [chosen[0]["index"], chosen[-1]["index"]] == [5, 0]
    with pytest.raises(dlpack.SampleIndexError, match="item 2 is out of range for a selection of 2 samples"):
        chosen[2]
    batches = list(torch.utils.data.DataLoader(tds, batch_size=2, shuffle=False))
    assert torch.cat([b["index"] for b in batches]).tolist() == test.tolist()
    with pytest.raises(dlpack.OptionError, match="no split 'val'"):
        TorchDataset(split_store, split="val")
    with pytest.raises(dlpack.OptionError, match="repeat sample 1"):
        TorchDataset(split_store, indices=[1, 1])
    ds.close()


# ---------------------------------------------------------------- label arrays


@pytest.fixture(scope="module", params=[("out.zarr", np.uint8), ("out.h5", np.uint16)], ids=["zarr-u1", "hdf5-u2"])
def label_store(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """10 images at 8x6 in two classes, with boxes, box_labels and a mask (uint8, or uint16 in HDF5)."""
    tmp = tmp_path_factory.mktemp("torch-labels")
    rng = np.random.default_rng(6)
    for k in range(10):
        folder = tmp / "src" / f"c{k % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{k:02d}.png").write_bytes(
            cv2.imencode(".png", rng.integers(0, 256, (6, 8, 3), np.uint8))[1].tobytes()
        )
    out = tmp / request.param[0]
    dlpack.build(tmp / "src", out, jobs=1, quiet=True)
    boxes, box_labels = _label_values(10)
    dlpack.add_array(out, "boxes", boxes, ragged=True)
    dlpack.add_array(out, "box_labels", box_labels, ragged=True)
    mask = np.stack(
        [np.full((6, 8), 300 * i if request.param[1] == np.uint16 else i, request.param[1]) for i in range(10)]
    )
    dlpack.add_array(out, "mask", mask)
    return out


def _label_values(n: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    boxes = [np.full((i % 3, 4), i, dtype=np.float32) for i in range(n)]
    return boxes, [np.full(i % 3, i % 2, dtype=np.int32) for i in range(n)]


def test_torch_loader_passes_every_keyed_array(label_store: Path) -> None:
    ds = dlpack.open(label_store)
    stored = ds.manifest.arrays["mask"].dtype
    boxes, box_labels = _label_values(10)
    seen = set()
    for t in torch_loader(ds, batch_size=4, seed=2, workers=2, pin_memory=False):
        b = len(t["index"])
        assert set(t) == {"image", "label", "index", "boxes", "box_labels", "mask"}
        assert t["mask"].shape == (b, 6, 8) and t["mask"].dtype == (torch.uint8 if stored == "|u1" else torch.int32)
        assert isinstance(t["boxes"], list) and isinstance(t["box_labels"], list)
        assert all(isinstance(x, torch.Tensor) for x in t["boxes"])
        assert len(t["boxes"]) == b
        for k, i in enumerate(t["index"].tolist()):
            seen.add(i)
            assert t["boxes"][k].dtype == torch.float32 and torch.equal(t["boxes"][k], torch.from_numpy(boxes[i]))
            assert t["box_labels"][k].dtype == torch.int64  # codes: as torch losses and torchvision take them
            assert t["box_labels"][k].tolist() == box_labels[i].tolist()
            assert int(t["mask"][k, 0, 0]) == int(ds[i]["mask"][0, 0])
    assert seen == set(range(10))
    ds.close()


def test_torch_dataset_collate_keeps_ragged_arrays_as_lists(label_store: Path) -> None:
    tds = TorchDataset(label_store)
    s = tds[4]
    assert s["boxes"].shape == (1, 4) and s["box_labels"].dtype == torch.int64 and s["mask"].shape == (6, 8)
    assert tds.ragged_keys == {"boxes", "box_labels"}
    collate_fn = pickle.loads(pickle.dumps(tds.collate_fn))  # travels to worker processes
    batches = list(torch.utils.data.DataLoader(tds, batch_size=4, shuffle=False, collate_fn=collate_fn))
    assert [len(b["boxes"]) for b in batches] == [4, 4, 2]
    first = batches[0]
    assert first["image"].shape == (4, 3, 6, 8) and first["mask"].shape == (4, 6, 8)
    assert first["label"].dtype == torch.int64 and first["index"].tolist() == [0, 1, 2, 3]
    assert [x.shape[0] for x in first["boxes"]] == [0, 1, 2, 0]
    assert [x.tolist() for x in first["box_labels"]] == [[], [1], [0, 0], []]
    with pytest.raises(RuntimeError):  # what torch's own collate does with ragged boxes
        list(torch.utils.data.DataLoader(tds, batch_size=4, shuffle=False))


def test_torch_collate_of_a_split_store_lists_the_split_names(split_store: Path) -> None:
    tds = TorchDataset(split_store)
    batch = next(iter(torch.utils.data.DataLoader(tds, batch_size=3, shuffle=False, collate_fn=tds.collate_fn)))
    assert batch["split"] == [tds.ds[i]["split"] for i in range(3)]
    tl = torch_loader(split_store, batch_size=3, shuffle=False, pin_memory=False)
    first = next(iter(tl))
    assert first["split"].dtype == torch.int64
    assert [tds.ds.splits[c] for c in first["split"].tolist()] == batch["split"]
