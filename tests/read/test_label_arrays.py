"""The label arrays (boxes, box_labels, box_crowd, mask, defect) and manifest fields through
``ds[i]``, ``get_batch`` and the loader, on every backend, with stores made by ``dlpack.build``
and ``dlpack.add_array``; and stores without them, which open with the defaults."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import dlpack
from dlpack.backends import open_reader, open_writer
from dlpack.errors import OptionError, StoreError

TREE = {f"{c}/{k}.png": "rgb" for c in ("cat", "dog") for k in range(6)}
N = 12
H, W = 12, 16
#: The dtypes the format stores the label arrays with.
STORED = {"boxes": np.float32, "box_labels": np.int32, "box_crowd": np.uint8, "mask": np.uint8}


@pytest.fixture
def store(make_tree: Callable[..., Path], tmp_path: Path, backend: str) -> Path:
    out = tmp_path / backend
    dlpack.build(make_tree(TREE), out, size=(W, H), quiet=True, jobs=1, shard_bytes=2**16)
    return out


def _set_manifest(store: Path, **changes: Any) -> None:
    """Commit the store's manifest with ``changes`` (what a build with labels records)."""
    with open_reader(store) as reader:
        manifest = reader.manifest
    writer = open_writer(store, "r+")
    try:
        writer.commit(dataclasses.replace(manifest, **changes))
    finally:
        writer.abort()


def _labels() -> dict[str, Any]:
    counts = [i % 3 for i in range(N)]  # samples 0, 3, 6, 9 have no box
    return {
        "boxes": [np.arange(4 * k, dtype=np.float32).reshape(k, 4) + i for i, k in enumerate(counts)],
        # int64, as Python ints give them: stored as the format's int32 codes
        "box_labels": [np.array([(i + j) % 2 for j in range(k)], dtype=np.int64) for i, k in enumerate(counts)],
        "box_crowd": [np.array([j == 1 for j in range(k)], dtype=np.uint8) for k in counts],
        "mask": np.stack([np.full((H, W), i, dtype=np.uint8) for i in range(N)]),
    }


def _add(store: Path, arrays: dict[str, Any]) -> None:
    for name, values in arrays.items():
        dlpack.add_array(store, name, values, key=name, ragged=isinstance(values, list))


def test_label_arrays_in_samples_batches_and_the_loader(store: Path) -> None:
    arrays = _labels()
    _add(store, arrays)
    with dlpack.open(store) as ds:
        s = ds[4]
        assert s["boxes"].dtype == np.float32 and s["boxes"].shape == (1, 4)
        assert np.array_equal(s["boxes"], arrays["boxes"][4])
        assert s["box_labels"].dtype == np.int32 and s["box_labels"].tolist() == [0]
        assert s["box_crowd"].tolist() == [0]
        assert s["mask"].shape == (H, W) and s["mask"].dtype == np.uint8 and int(s["mask"][0, 0]) == 4
        assert ds[3]["boxes"].shape == (0, 4) and ds[3]["box_labels"].shape == (0,)

        batch = ds.get_batch([5, 0, 5])
        assert batch["mask"].shape == (3, H, W) and batch["mask"][:, 0, 0].tolist() == [5, 0, 5]
        for key in ("boxes", "box_labels", "box_crowd"):  # every ragged keyed array: a sequence of B arrays
            assert isinstance(batch[key], dlpack.RaggedBatch) and len(batch[key]) == 3
            for got, i in zip(batch[key], [5, 0, 5], strict=True):
                assert np.array_equal(got, arrays[key][i]) and got.dtype == STORED[key]

        seen: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for b in ds.loader(batch_size=5, shuffle=True, seed=2, workers=3, prefetch=2):
            assert b["mask"].shape == (len(b["index"]), H, W)
            for k, i in enumerate(b["index"].tolist()):
                seen[i] = (b["boxes"][k], b["mask"][k])
        assert sorted(seen) == list(range(N))
        assert all(np.array_equal(bx, arrays["boxes"][i]) and int(m[0, 0]) == i for i, (bx, m) in seen.items())


def test_rank_shards_and_resume_carry_the_label_arrays(store: Path) -> None:
    arrays = _labels()
    _add(store, arrays)
    with dlpack.open(store) as ds:
        shards = []
        for rank in (0, 1):
            idx: list[int] = []
            for b in ds.loader(batch_size=3, seed=1, rank=rank, world_size=2, drop_last=True):
                assert [len(x) for x in b["boxes"]] == [i % 3 for i in b["index"].tolist()]
                assert all(x.dtype == np.int32 for x in b["box_labels"])
                idx += b["index"].tolist()
            shards.append(idx)
        assert not set(shards[0]) & set(shards[1]) and len(shards[0]) == len(shards[1]) == 6

        whole = [(b["index"].tolist(), [x.tolist() for x in b["box_labels"]]) for b in ds.loader(batch_size=3, seed=7)]
        loader = ds.loader(batch_size=3, seed=7)
        it = iter(loader)
        head = [next(it)]
        it.close()
        state = json.loads(json.dumps(loader.state_dict()))
        again = ds.loader(batch_size=3, seed=7, workers=1)
        again.load_state_dict(state)
        got = [(b["index"].tolist(), [x.tolist() for x in b["box_labels"]]) for b in head + list(again)]
        assert got == whole


def test_box_labels_are_checked_against_the_classes(store: Path) -> None:
    good = _labels()["box_labels"]
    bad = [b.copy() for b in good]
    bad[5][1] = 2  # two classes: cat, dog
    with pytest.raises(OptionError, match=r"'box_labels' of .* must be codes 0\.\.1 .*\(cat, dog\); sample 5 holds 2"):
        dlpack.add_array(store, "box_labels", bad, ragged=True)
    with pytest.raises(OptionError, match="pass ragged=True"):
        dlpack.add_array(store, "box_labels", good)
    with pytest.raises(OptionError, match="under the key 'box_labels'"):
        dlpack.add_array(store, "box_labels", good, ragged=True, key="cls")
    as_int64 = [b.astype(np.int64) for b in good]
    dlpack.add_array(store, "box_labels", as_int64, ragged=True)  # codes are stored as the format says
    with dlpack.open(store) as ds:
        assert ds.manifest.arrays["box_labels"].dtype == "<i4"
        assert [ds[i]["box_labels"].tolist() for i in range(N)] == [b.tolist() for b in good]


def test_damaged_box_labels_are_refused_by_the_reader_and_named_by_verify(store: Path) -> None:
    writer = open_writer(store, "r+")  # written around add_array's checks, as damage would be
    try:
        spec = dlpack.ArraySpec("box_labels", "<i4", (), ragged=True, key="box_labels")
        writer.create_array(spec, N)
        writer.write_block("box_labels", 0, [np.array([0, 9][: i % 3], dtype=np.int32) for i in range(N)])
        with open_reader(store) as reader:
            manifest = reader.manifest
        writer.commit(manifest)
    finally:
        writer.abort()
    with dlpack.open(store) as ds:  # the store opens: the codes are checked at their first use
        assert len(ds) == N and ds.classes == ("cat", "dog")
        with pytest.raises(StoreError, match=r"'box_labels' .* holds 9 at sample 2 \(row 1\), outside 0\.\.1 for 2 cl"):
            ds[0]
        report = ds.check()
    assert [name for name, _ in report.damaged] == ["box_labels"]
    assert [name for name, _ in dlpack.read.dataset.verify_store(store).damaged] == ["box_labels"]


def test_defect_codes_index_the_manifest_defects(store: Path) -> None:
    codes = np.array([i % 3 for i in range(N)], dtype=np.int32)
    with pytest.raises(OptionError, match=r"'defect' of .* must be codes -1\.\.-1 for the store's 0 defects"):
        dlpack.add_array(store, "defect", codes)
    _set_manifest(store, task="anomaly", defects=("good", "crack", "scratch"))
    with pytest.raises(OptionError, match="fixed, one code per sample"):
        dlpack.add_array(store, "defect", [c.reshape(1) for c in codes], ragged=True)
    dlpack.add_array(store, "defect", codes.astype(np.uint8))
    with dlpack.open(store) as ds:
        assert ds.task == "anomaly" and ds.defects == ("good", "crack", "scratch")
        assert ds[4]["defect"] == 1 and isinstance(ds[4]["defect"], int)
        assert ds.manifest.arrays["defect"].dtype == "<i4"
        assert ds.get_batch([2, 3])["defect"].tolist() == [2, 0]


def test_orientation_and_the_other_internal_arrays_are_never_written(store: Path) -> None:
    for name in ("orientation", "source", "transform", "checksum", "images"):
        with pytest.raises(OptionError, match="identifies or protects the samples"):
            dlpack.add_array(store, name, np.ones(N, np.uint8), replace=True)


def test_a_store_without_the_label_fields_opens_with_the_defaults(store: Path, tmp_path: Path) -> None:
    with dlpack.open(store) as ds:
        d = json.loads(ds.manifest.to_json())
        assert not {"class_ids", "task", "mask_ignore", "defects", "mask_classes"} & set(d)
        assert ds.classes == ("cat", "dog") and ds.class_ids == (0, 1) and ds.task == "classification"
        assert ds.defects == () and ds.manifest.mask_ignore is None and ds.manifest.mask_classes == ()
        assert set(ds[0]) == {"image", "label", "index", "source"}
    flat = tmp_path / "flat"
    flat.mkdir()
    (flat / "a.png").write_bytes((Path(str(store)).parent / "src" / "cat" / "0.png").read_bytes())
    dlpack.build(flat, tmp_path / "flat.zarr", quiet=True, jobs=1)
    with dlpack.open(tmp_path / "flat.zarr") as ds:
        assert ds.task == "none" and ds.class_ids == ()


def test_recorded_class_ids_and_task_are_exposed(store: Path) -> None:
    _set_manifest(store, class_ids=(3, 17), task="detection", mask_ignore=255, mask_classes=((3, "cat"), (17, "dog")))
    with dlpack.open(store) as ds:
        assert ds.class_ids == (3, 17) and ds.task == "detection" and ds.manifest.mask_ignore == 255
        assert ds.manifest.mask_classes == ((3, "cat"), (17, "dog"))
        d = json.loads(ds.manifest.to_json())
        assert d["class_ids"] == [3, 17] and d["mask_classes"] == [[3, "cat"], [17, "dog"]]
