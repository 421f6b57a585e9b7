"""A new per-sample array added to a built store by one backend-agnostic call, then read back
through ``ds[i]``, ``get_batch`` and the loader, on every backend."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import dlpack
from dlpack import Dataset
from dlpack.errors import OptionError, SampleIndexError, StoreExistsError

TREE = {f"{c}/{k}.png": "rgb" for c in ("ok", "bad") for k in range(5)}


@pytest.fixture
def store(make_tree: Callable[..., Path], tmp_path: Path, backend: str) -> Path:
    out = tmp_path / backend
    dlpack.build(make_tree(TREE), out, size=(16, 12), quiet=True, jobs=1, shard_bytes=2**16)
    return out


def _weights(n: int) -> np.ndarray:
    return np.linspace(0.5, 2.0, n).astype(np.float32)


def _boxes(n: int) -> list[np.ndarray]:
    return [np.full((i % 3, 4), i, dtype=np.float32) for i in range(n)]


def test_added_arrays_appear_in_samples_batches_and_the_loader(store: Path) -> None:
    n = len(dlpack.open(store))
    masks = np.stack([np.full((12, 16), i, dtype=np.uint8) for i in range(n)])
    dlpack.add_array(store, "weights", _weights(n), key="weight")
    dlpack.add_array(store, "masks", masks, key="mask")
    dlpack.add_array(store, "boxes", _boxes(n), ragged=True)

    with dlpack.open(store) as ds:
        s = ds[3]
        assert s["weight"] == pytest.approx(_weights(n)[3])
        assert np.array_equal(s["mask"], masks[3])
        assert np.array_equal(s["boxes"], _boxes(n)[3])
        assert {"image", "label", "index", "source"} <= set(s)

        batch = ds.get_batch([4, 0, 4])
        assert np.array_equal(batch["weight"], _weights(n)[[4, 0, 4]])
        assert np.array_equal(batch["mask"], masks[[4, 0, 4]])
        assert [b.shape[0] for b in batch["boxes"]] == [1, 0, 1]

        seen = {}
        for b in ds.loader(batch_size=3, shuffle=True, seed=1, workers=2, prefetch=2):
            for k, i in enumerate(b["index"].tolist()):
                seen[i] = (b["weight"][k], b["mask"][k], b["boxes"][k])
        assert sorted(seen) == list(range(n))
        for i, (w, m, bx) in seen.items():
            assert (
                w == pytest.approx(_weights(n)[i]) and np.array_equal(m, masks[i]) and np.array_equal(bx, _boxes(n)[i])
            )


def test_adding_keeps_everything_else_intact(store: Path) -> None:
    with dlpack.open(store) as ds:
        before = [ds[i] for i in range(len(ds))]
        fingerprint = ds.fingerprint()
    dlpack.add_array(store, "weights", _weights(len(before)))
    with dlpack.open(store) as ds:
        assert ds.fingerprint() == fingerprint
        assert ds.verify() == []
        for old, new in zip(before, (ds[i] for i in range(len(ds))), strict=True):
            assert np.array_equal(old["image"], new["image"])
            assert (old["label"], old["source"]) == (new["label"], new["source"])


def test_replacing_needs_consent_and_never_touches_images(store: Path) -> None:
    n = len(dlpack.open(store))
    dlpack.add_array(store, "weights", _weights(n))
    with pytest.raises(StoreExistsError, match="replace=True"):
        dlpack.add_array(store, "weights", _weights(n))
    dlpack.add_array(store, "weights", np.zeros(n, np.float32), replace=True)
    assert dlpack.open(store)[2]["weights"] == 0
    with pytest.raises(OptionError, match="cannot be replaced"):
        dlpack.add_array(store, "checksum", np.zeros(n, np.uint32), replace=True)


def test_wrong_length_and_taken_keys_are_refused(store: Path) -> None:
    n = len(dlpack.open(store))
    with pytest.raises(OptionError, match="samples"):
        dlpack.add_array(store, "weights", _weights(n + 1))
    with pytest.raises(OptionError, match="key"):
        dlpack.add_array(store, "extra", _weights(n), key="image")
    with pytest.raises(OptionError, match="key"):
        dlpack.add_array(store, "other_labels", _weights(n), key="label")


def test_sample_index_must_be_an_integer(store: Path) -> None:
    ds: Dataset = dlpack.open(store)
    assert ds[np.int64(1)]["index"] == 1
    with pytest.raises(SampleIndexError, match="integer"):
        ds[1.7]  # type: ignore[index]
    with pytest.raises(SampleIndexError, match="integers"):
        ds.get_batch(np.array([0.5, 1.0]))
