"""A conformance suite for store backends: subclass :class:`BackendTests` to test one.

Every backend's tests subclass it and set ``backend``; the suite exercises the reader/writer
interface directly (named fixed and ragged arrays streamed in blocks, open modes, pickling,
``abort``, registry routing, capability errors), so a new backend (DLDataset, object storage)
is held to exactly what the build and the loader rely on. Needs pytest (the ``test`` extra).
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

from .backends import (
    BACKENDS,
    ArraySpec,
    Backend,
    StoreReader,
    StoreWriter,
    backend_for_path,
    detect_backend,
    get_backend,
    open_reader,
    open_writer,
    owned_store,
    register_backend,
)
from .errors import IncompleteStoreError, OptionError, StoreError, StoreExistsError, StoreNotFoundError
from .manifest import ImageSpec, Manifest, store_generation

__all__ = ["BackendTests", "label_arrays", "sample_arrays"]

N = 23  # samples: a prime, so no block size divides it and the last shard is always partial
SHARD_BYTES = 2**16  # small shards, so every array spans several


def sample_arrays(n: int = N, seed: int = 0) -> dict[str, Any]:
    """Deterministic per-sample arrays of several shapes and dtypes, two of them ragged."""
    rng = np.random.default_rng(seed)
    return {
        "images": rng.integers(0, 256, (n, 12, 10, 3), dtype=np.uint8),
        "masks": rng.integers(0, 4, (n, 12, 10), dtype=np.uint8),
        "depth": rng.integers(0, 65536, (n, 6, 5, 1), dtype=np.uint16),
        "embedding": rng.standard_normal((n, 7)).astype(np.float32),
        "weight": rng.standard_normal(n),
        "labels": rng.integers(-1, 5, n).astype(np.int32),
        # Ragged: boxes as rows of (x0, y0, x1, y1), some samples with none; bytes of any length.
        "boxes": [rng.random((int(k), 4)).astype(np.float32) for k in rng.integers(0, 4, n)],
        "blob": [rng.integers(0, 256, int(k), dtype=np.uint8) for k in rng.integers(0, 9000, n)],
    }


def _spec(name: str, value: Any, compression: str = "none") -> ArraySpec:
    if isinstance(value, list):
        first = value[0]
        return ArraySpec(name, first.dtype.str, tuple(first.shape[1:]), ragged=True, key=name, compression=compression)
    return ArraySpec(name, value.dtype.str, tuple(value.shape[1:]), key=name, compression=compression)


#: Class names of the suite's stores: ``labels`` of sample_arrays are -1..4.
CLASSES = ("a", "b", "c", "d", "e")


def _manifest(backend: str, n: int, **fields: Any) -> Manifest:
    return Manifest(count=n, image=ImageSpec("fixed", 3, "|u1", 12, 10), backend=backend, classes=CLASSES, **fields)


def label_arrays(n: int = N, seed: int = 0, mask_dtype: Any = np.uint8) -> dict[str, Any]:
    """The label arrays of the format (docs/format.md): ragged ``boxes`` (float32 rows of 4),
    ``box_labels`` (int32 codes of CLASSES, one per box) and ``box_crowd`` (uint8 flags), some
    samples with no box, and a fixed ``mask`` [N, H, W] of ``mask_dtype``."""
    rng = np.random.default_rng(seed)
    counts = [int(k) for k in rng.integers(0, 4, n)]
    top = np.iinfo(mask_dtype).max
    return {
        "boxes": [(rng.random((k, 4)) * 10).astype(np.float32) for k in counts],
        "box_labels": [rng.integers(0, len(CLASSES), k).astype(np.int32) for k in counts],
        "box_crowd": [rng.integers(0, 2, k).astype(np.uint8) for k in counts],
        "mask": rng.integers(0, top, (n, 12, 10), dtype=mask_dtype, endpoint=True),
    }


class BackendTests:
    """Subclass with ``backend = "name"`` (a registered backend) to run the suite against it."""

    backend: ClassVar[str]
    #: Compressions the backend supports besides "none" (tested when listed).
    compressions: ClassVar[tuple[str, ...]] = ()

    # ------------------------------------------------------------------ helpers

    @property
    def cls(self) -> type[Backend]:
        """The registered class of ``backend``."""
        return get_backend(self.backend)

    def store_path(self, tmp_path: Path, name: str = "store") -> Path:
        """Where store ``name`` goes under ``tmp_path``, with the backend's first suffix if it has any."""
        return tmp_path / (name + (self.cls.suffixes[0] if self.cls.suffixes else ""))

    def new_writer(self, path: Path, mode: str = "w-") -> StoreWriter:
        """An opened writer with small shards (SHARD_BYTES), so every array spans several."""
        writer = self.cls.open_writer(path, mode, SHARD_BYTES)  # type: ignore[arg-type]
        writer.open()
        return writer

    def write(self, writer: StoreWriter, arrays: dict[str, Any], compression: str = "none") -> None:
        """Create and stream ``arrays`` in aligned blocks, as the build does."""
        for name, value in arrays.items():
            writer.create_array(_spec(name, value, compression), len(value))
            if isinstance(value, list):
                for s in range(0, len(value), 5):  # ragged: appended in order, a few at a time
                    writer.write_block(name, s, value[s : s + 5])
            else:
                step = writer.shard_rows(name)
                for s in range(0, len(value), step):
                    writer.write_block(name, s, value[s : s + step])

    def build_store(
        self, tmp_path: Path, arrays: dict[str, Any] | None = None, compression: str = "none", **fields: Any
    ) -> Path:
        """A store of ``arrays`` (:func:`sample_arrays` by default); ``fields`` go into its manifest."""
        arrays = sample_arrays() if arrays is None else arrays
        path = self.store_path(tmp_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        writer = self.new_writer(path)
        self.write(writer, arrays, compression)
        writer.commit(_manifest(self.backend, N, **fields))
        return path

    def assert_reads_back(self, reader: StoreReader, arrays: dict[str, Any]) -> None:
        """Every read path gives ``arrays`` back: single rows, batches in any order (repeats too), rows= targets."""
        order = [N - 1, 0, 7, 7, 3, 22, 11]
        for name, value in arrays.items():
            spec = reader.spec(name)
            if isinstance(value, list):
                assert spec.ragged
                for i in range(N):
                    got = reader.read(name, i)
                    assert got.dtype == value[i].dtype and np.array_equal(got, value[i]), (name, i)
                batch = reader.read_ragged(name, order)
                assert len(batch) == len(order), name
                for got, i in zip(batch, order, strict=True):
                    assert got.dtype == value[i].dtype and got.shape == value[i].shape, (name, i)
                    assert np.array_equal(got, value[i]), (name, i)
            else:
                assert not spec.ragged and spec.shape == value.shape[1:] and np.dtype(spec.dtype) == value.dtype
                out = np.empty((len(order), *value.shape[1:]), dtype=value.dtype)
                assert np.array_equal(reader.read_into(name, order, out), value[order]), name
                # rows=: sample order[k] into row rows[k] of a wider array, and nothing else written
                rows = [2 * k + 1 for k in range(len(order))][::-1]
                wide = np.zeros((2 * len(order) + 1, *value.shape[1:]), dtype=value.dtype)
                reader.read_into(name, order, wide, rows=rows)
                assert np.array_equal(wide[rows], value[order]) and not wide[::2].any(), name
                # the same through the stored array itself, the path samples too large to cache take
                wide[...] = 0
                reader._stored(name).read_into(order, wide, rows)
                assert np.array_equal(wide[rows], value[order]) and not wide[::2].any(), name
                assert np.array_equal(reader._stored(name).read_into(order, out), value[order]), name
                assert np.array_equal(reader.read(name, 5), value[5]), name
                assert np.array_equal(reader.read_all(name), value), name

    # ------------------------------------------------------------------ named arrays

    def test_fixed_and_ragged_arrays_round_trip(self, tmp_path: Path) -> None:
        arrays = sample_arrays()
        path = self.build_store(tmp_path, arrays)
        with open_reader(path) as reader:
            assert reader.manifest.count == N
            assert set(reader.arrays) == set(arrays)
            self.assert_reads_back(reader, arrays)

    def test_read_into_from_mixes_arrays_row_by_row(self, tmp_path: Path) -> None:
        rng = np.random.default_rng(7)
        big = rng.integers(0, 256, (N, 40, 40, 3), dtype=np.uint8)  # 4800 bytes a sample: read from the arrays
        small = rng.integers(0, 256, (N, 4), dtype=np.uint8)  # read from a cached copy
        arrays = {"a": big, "b": big[::-1].copy(), "c": small, "d": small[::-1].copy()}
        for codec in ("none", *self.compressions[:1]):
            path = self.build_store(tmp_path / codec, arrays, codec)
            order, which = [N - 1, 0, 7, 7, 3, 22, 11], [0, 1, 1, 0, 1, 0, 1]
            with open_reader(path) as reader:
                for names in (["a", "b"], ["c", "d"]):
                    values = [arrays[n] for n in names]
                    out = np.zeros((len(order), *values[0].shape[1:]), dtype=np.uint8)
                    reader.read_into_from(names, which, order, out)
                    want = np.stack([values[w][i] for w, i in zip(which, order, strict=True)])
                    assert np.array_equal(out, want), (codec, names)
                    reader.read_into_from(names, [1] * len(order), order, out)  # one array: a plain gather
                    assert np.array_equal(out, values[1][order]), (codec, names)
                    for _ in range(2):  # gather_from (checked int64 arrays): before and after a plan is made
                        out[...] = 0
                        reader.gather_from(names, np.array(which, np.int64), np.array(order, np.int64), out)
                        assert np.array_equal(out, want), (codec, names)
                with pytest.raises(OptionError, match="different sample shapes"):
                    reader.read_into_from(["a", "c"], which, order, np.zeros((7, 40, 40, 3), np.uint8))

    def test_compressed_arrays_round_trip(self, tmp_path: Path) -> None:
        if not self.compressions:
            pytest.skip(f"{self.backend} lists no compression")
        for codec in self.compressions:
            arrays = sample_arrays(seed=1)
            path = self.build_store(tmp_path / codec, arrays, codec)
            with open_reader(path) as reader:
                assert all(s.compression == codec for s in reader.arrays.values())
                self.assert_reads_back(reader, arrays)

    def test_ragged_batches_are_the_samples_in_any_order(self, tmp_path: Path, monkeypatch: Any) -> None:
        from .backends import reader as base

        arrays = label_arrays()
        arrays["boxes"][4] = np.zeros((0, 4), np.float32)  # a sample without boxes
        arrays["box_labels"][4] = np.zeros(0, np.int32)
        path = self.build_store(tmp_path, arrays)
        order = np.array([9, 4, 0, N - 1, 9, 4, 13], dtype=np.int64)  # unsorted, repeats, an empty sample
        for whole in (True, False):  # small arrays gathered at once; large ones sample by sample
            if not whole:
                monkeypatch.setattr(base, "_SMALL_ARRAY", 0)
            with open_reader(path) as reader:
                for name in ("boxes", "box_labels", "box_crowd"):
                    got = reader.read_ragged(name, order)
                    assert [g.shape for g in got] == [arrays[name][i].shape for i in order], name
                    assert all(g.dtype == arrays[name][0].dtype for g in got), name
                    assert all(np.array_equal(g, arrays[name][i]) for g, i in zip(got, order, strict=True)), name
                    assert reader.read_ragged(name, []) == []
                    got[0][...] = 0  # each sample's array is its own: nothing else changes
                    assert np.array_equal(got[4], arrays[name][9]), name
                    assert np.array_equal(reader.read_ragged(name, [9])[0], arrays[name][9]), name
                    assert np.array_equal(reader.read(name, 9), arrays[name][9]), name
                assert ("boxes_data" in reader._whole) is whole
                both = reader.read_ragged_batch(["boxes", "box_labels", "box_crowd"], order)
                for name, got in both.items():  # one offsets lookup for all three, the same samples
                    assert all(np.array_equal(g, arrays[name][i]) for g, i in zip(got, order, strict=True)), name
        other = sample_arrays(seed=3)  # boxes and blob: ragged arrays with different offsets
        with open_reader(self.build_store(tmp_path / "other", other)) as reader:
            both = reader.read_ragged_batch(["boxes", "blob"], order)
            for name, got in both.items():
                assert [g.shape for g in got] == [other[name][i].shape for i in order], name
                assert all(np.array_equal(g, other[name][i]) for g, i in zip(got, order, strict=True)), name

    def test_empty_ragged_array_round_trips(self, tmp_path: Path) -> None:
        arrays = {"boxes": [np.zeros((0, 4), np.float32) for _ in range(N)]}
        path = self.build_store(tmp_path, arrays)
        with open_reader(path) as reader:
            assert all(reader.read("boxes", i).shape == (0, 4) for i in range(N))

    def test_ragged_offsets_are_written_a_shard_at_a_time(self, tmp_path: Path) -> None:
        # More samples than one inner chunk of offsets (2**17 rows), so the offsets span two
        # shards: the writer holds at most one shard of them, not one per sample until the commit.
        n, step = 2**17 + 5000, 4096
        rng = np.random.default_rng(5)
        sizes = rng.integers(0, 4, n)
        data = rng.integers(0, 256, int(sizes.sum()), dtype=np.uint8)
        bounds = np.concatenate(([0], np.cumsum(sizes)))
        path = self.store_path(tmp_path)
        writer = self.cls.open_writer(path, "w-", 2**20)
        writer.open()
        writer.create_array(ArraySpec("blob", "|u1", (), ragged=True), n)
        per = writer._stored_layout("blob_offsets")[1]
        assert per < n + 1
        held = 0
        for s in range(0, n, step):
            stop = min(n, s + step)
            writer.write_block("blob", s, [data[bounds[i] : bounds[i + 1]] for i in range(s, stop)])
            held = max(held, len(writer._ragged["blob"].offsets))
        assert held <= per
        writer.commit(_manifest(self.backend, n))
        with open_reader(path) as reader:
            assert np.array_equal(reader.meta("blob_offsets"), bounds)
            for i in (0, 1, per - 1, per, n - 1):
                assert np.array_equal(reader.read("blob", i), data[bounds[i] : bounds[i + 1]]), i

    def test_manifest_lists_every_array_with_its_spec(self, tmp_path: Path) -> None:
        arrays = sample_arrays()
        path = self.build_store(tmp_path, arrays)
        with open_reader(path) as reader:
            specs = reader.manifest.arrays
        assert specs["boxes"] == ArraySpec("boxes", "<f4", (4,), ragged=True, key="boxes")
        assert specs["masks"] == ArraySpec("masks", "|u1", (12, 10), key="masks")
        assert specs["weight"] == ArraySpec("weight", "<f8", (), key="weight")

    def test_write_errors_are_clear(self, tmp_path: Path) -> None:
        writer = self.new_writer(self.store_path(tmp_path))
        writer.create_array(ArraySpec("masks", "|u1", (4, 4)), 10)
        with pytest.raises(OptionError, match="shape"):
            writer.write_block("masks", 0, np.zeros((2, 4, 5), np.uint8))
        with pytest.raises(OptionError, match="outside"):
            writer.write_block("masks", 9, np.zeros((2, 4, 4), np.uint8))
        with pytest.raises(StoreError, match="no array 'nope'"):
            writer.write_block("nope", 0, np.zeros((1,), np.uint8))
        with pytest.raises(OptionError, match="samples"):
            writer.create_array(ArraySpec("other", "<i4"), 11)
        with pytest.raises(OptionError, match="already has"):
            writer.create_array(ArraySpec("masks", "<i4"), 10)
        writer.create_array(ArraySpec("boxes", "<f4", (4,), ragged=True), 10)
        with pytest.raises(OptionError, match="overwrite"):
            writer.create_array(ArraySpec("boxes_data", "<f4"), 10)
        with pytest.raises(OptionError, match="in order"):
            writer.write_block("boxes", 3, [np.zeros((1, 4), np.float32)])
        with pytest.raises(StoreError, match="0 of 10"):
            writer.commit(_manifest(self.backend, 10))
        writer.abort()

    def test_array_names_and_dtypes_are_validated(self) -> None:
        for bad in ("", "Images", "1x", "a/b", "../x", "x" * 65):
            with pytest.raises(OptionError, match="array name"):
                ArraySpec(bad, "<i4")
        with pytest.raises(OptionError, match="dtype"):
            ArraySpec("x", "O")
        with pytest.raises(OptionError, match="shape"):
            ArraySpec("x", "<i4", (0,))

    def test_label_arrays_round_trip(self, tmp_path: Path) -> None:
        for mask_dtype in (np.uint8, np.uint16):
            arrays = label_arrays(mask_dtype=mask_dtype)
            path = self.build_store(tmp_path / np.dtype(mask_dtype).name, arrays)
            with open_reader(path) as reader:
                specs = reader.manifest.arrays
                assert specs["boxes"] == ArraySpec("boxes", "<f4", (4,), ragged=True, key="boxes")
                assert specs["box_labels"] == ArraySpec("box_labels", "<i4", (), ragged=True, key="box_labels")
                assert specs["box_crowd"] == ArraySpec("box_crowd", "|u1", (), ragged=True, key="box_crowd")
                assert specs["mask"] == ArraySpec("mask", np.dtype(mask_dtype).str, (12, 10), key="mask")
                self.assert_reads_back(reader, arrays)
                assert all(reader.read("boxes", i).shape == (len(arrays["box_labels"][i]), 4) for i in range(N))
                assert reader.code_problems() == [] and reader.verify_arrays() == []

    def test_label_arrays_round_trip_compressed(self, tmp_path: Path) -> None:
        if not self.compressions:
            pytest.skip(f"{self.backend} lists no compression")
        for codec in self.compressions:
            arrays = label_arrays(seed=2, mask_dtype=np.uint16)
            path = self.build_store(tmp_path / codec, arrays, codec)
            with open_reader(path) as reader:
                self.assert_reads_back(reader, arrays)

    def test_box_labels_outside_the_classes_are_refused(self, tmp_path: Path) -> None:
        arrays = label_arrays()
        k = next(i for i, b in enumerate(arrays["box_labels"]) if len(b) > 1)
        arrays["box_labels"][k] = arrays["box_labels"][k].copy()
        arrays["box_labels"][k][1] = len(CLASSES)
        path = self.build_store(tmp_path, arrays)
        with open_reader(path) as reader:
            with pytest.raises(StoreError, match=rf"holds {len(CLASSES)} at sample {k} \(row 1\), outside 0\.\.4"):
                reader.read("box_labels", 0)  # the whole array is checked at its first use
            assert [name for name, _ in reader.code_problems()] == ["box_labels"]
            assert np.array_equal(reader.read("boxes", k), arrays["boxes"][k])  # other arrays still read

    def test_defect_codes_index_the_defects(self, tmp_path: Path) -> None:
        codes = (np.arange(N) % 3).astype(np.int32)
        path = self.build_store(tmp_path / "ok", {"defect": codes}, defects=("good", "crack", "scratch"))
        with open_reader(path) as reader:
            assert reader.manifest.defects == ("good", "crack", "scratch")
            assert np.array_equal(reader.read_all("defect"), codes)
        path = self.build_store(tmp_path / "bad", {"defect": codes}, defects=("good", "crack"))
        with open_reader(path) as reader, pytest.raises(StoreError, match=r"holds 2 at sample 2, outside -1\.\.1"):
            reader.read_all("defect")

    # ------------------------------------------------------------------ modes

    def test_create_mode_refuses_an_existing_store(self, tmp_path: Path) -> None:
        path = self.build_store(tmp_path)
        with pytest.raises(StoreExistsError):
            self.new_writer(path, "w-")

    def test_update_mode_needs_an_existing_store(self, tmp_path: Path) -> None:
        with pytest.raises(StoreNotFoundError):
            self.new_writer(self.store_path(tmp_path), "r+")

    def test_append_mode_creates_then_reopens(self, tmp_path: Path) -> None:
        path = self.store_path(tmp_path)
        arrays = sample_arrays()
        writer = self.new_writer(path, "a")
        self.write(writer, {"labels": arrays["labels"]})
        writer.commit(_manifest(self.backend, N))
        writer = self.new_writer(path, "a")
        assert set(writer.arrays) == {"labels"} and writer.count == N
        self.write(writer, {"boxes": arrays["boxes"]})
        writer.commit(_manifest(self.backend, N))
        with open_reader(path) as reader:
            assert set(reader.arrays) == {"labels", "boxes"}
            self.assert_reads_back(reader, {"labels": arrays["labels"], "boxes": arrays["boxes"]})

    def test_reopened_store_adds_and_replaces_arrays(self, tmp_path: Path) -> None:
        arrays = sample_arrays()
        path = self.build_store(tmp_path, arrays)
        writer = open_writer(path, "r+")
        new_weight = np.arange(N, dtype=np.float64)
        writer.delete_array("weight")
        extra = {"weight": new_weight, "score": np.arange(N, dtype=np.int16)}
        self.write(writer, extra)
        writer.commit(_manifest(self.backend, N))
        with open_reader(path) as reader:
            assert set(reader.arrays) == set(arrays) | {"score"}
            self.assert_reads_back(reader, {**arrays, **extra})

    def test_arrays_are_renamed_with_their_data_and_debris_is_cleared(self, tmp_path: Path) -> None:
        arrays = sample_arrays()
        path = self.build_store(tmp_path, arrays)
        writer = open_writer(path, "r+")
        self.write(writer, {"junk": np.ones(N, np.float32)})
        writer.abort()  # never committed: what a killed writer leaves
        writer = open_writer(path, "r+")
        assert writer.clear_debris() == ["junk"]
        writer.rename_array("boxes", "boxes2", "b2")
        writer.rename_array("weight", "weight2", "weight2")
        with pytest.raises(OptionError, match="already has"):
            writer.rename_array("masks", "depth")
        writer.commit(_manifest(self.backend, N))
        renamed = {"boxes2": arrays.pop("boxes"), "weight2": arrays.pop("weight")}
        with open_reader(path) as reader:
            assert set(reader.arrays) == set(arrays) | set(renamed) and reader.spec("boxes2").key == "b2"
            self.assert_reads_back(reader, {**arrays, **renamed})
            assert reader.verify_arrays() == []

    def test_reopening_a_foreign_path_is_refused(self, tmp_path: Path) -> None:
        path = self.store_path(tmp_path)
        path.write_bytes(b"someone else's file")
        for mode in ("r+", "a"):
            with pytest.raises(StoreError, match="not a dlpack store"):
                self.new_writer(path, mode)
        assert owned_store(path) is None
        assert path.read_bytes() == b"someone else's file"

    def test_reader_accepts_only_read_mode(self, tmp_path: Path) -> None:
        path = self.build_store(tmp_path)
        with pytest.raises(OptionError, match="mode"):
            self.cls.open_reader(path, "r+")
        with pytest.raises(OptionError, match="mode"):
            self.cls.open_writer(path, "w")  # type: ignore[arg-type]

    # ------------------------------------------------------------------ lifecycle

    def test_abort_leaves_an_incomplete_store(self, tmp_path: Path) -> None:
        path = self.store_path(tmp_path)
        writer = self.new_writer(path)
        self.write(writer, {"labels": sample_arrays()["labels"]})
        writer.abort()
        assert owned_store(path) is self.cls  # recognisably dlpack's own partial store
        with pytest.raises(IncompleteStoreError):
            _ = open_reader(path).manifest

    def test_reader_pickles_without_handles(self, tmp_path: Path) -> None:
        arrays = sample_arrays()
        path = self.build_store(tmp_path, arrays)
        with open_reader(path) as reader:
            reader.warm()
            copy = pickle.loads(pickle.dumps(reader))
        with copy:
            self.assert_reads_back(copy, arrays)

    def test_warm_is_done_once_until_close_and_covers_what_a_later_call_asks(self, tmp_path: Path) -> None:
        """A loader warms its source at every pass: a warm reader returns at once, a call that skips
        fewer arrays warms the rest, and a closed (or copied) reader warms again."""
        arrays = sample_arrays()
        path = self.build_store(tmp_path, arrays)
        with open_reader(path) as reader:
            others = sorted(set(reader.arrays) - {"images"})
            reader.warm(skip=others)
            assert reader._warmed == frozenset(others)
            reader.warm(skip=[*others, "images"])  # asks less than was warmed: nothing to do
            assert reader._warmed == frozenset(others)
            reader.warm()  # asks for the rest too
            assert reader._warmed == frozenset()
            reader.close()
            assert reader._warmed is None
            reader.warm()
            copy = pickle.loads(pickle.dumps(reader))
            assert copy._warmed is None
            self.assert_reads_back(reader, arrays)

    def test_pickled_writer_writes_blocks_like_a_worker(self, tmp_path: Path) -> None:
        arrays = sample_arrays()
        path = self.store_path(tmp_path)
        writer = self.new_writer(path)
        fixed = {k: v for k, v in arrays.items() if not isinstance(v, list)}
        for name, value in fixed.items():
            writer.create_array(_spec(name, value), N)
        for name, value in fixed.items():
            step = writer.shard_rows(name)
            for s in range(0, N, step):
                # Each block through its own pickled copy, as joblib sends it to a worker process.
                target = pickle.loads(pickle.dumps(writer)) if writer.parallel_safe(name) else writer
                target.write_block(name, s, value[s : s + step])
        writer.commit(_manifest(self.backend, N))
        with open_reader(path) as reader:
            self.assert_reads_back(reader, fixed)

    def test_writer_with_buffered_ragged_rows_refuses_pickling(self, tmp_path: Path) -> None:
        writer = self.new_writer(self.store_path(tmp_path))
        writer.create_array(ArraySpec("blob", "|u1", (), ragged=True), 3)
        writer.write_block("blob", 0, [np.zeros(10, np.uint8)])
        with pytest.raises(StoreError, match="pickled"):
            pickle.dumps(writer)
        writer.abort()

    # ------------------------------------------------------------------ integrity and generations

    def test_commit_records_a_checksum_per_stored_array_and_the_generation(self, tmp_path: Path) -> None:
        path = self.build_store(tmp_path)
        with open_reader(path) as reader:
            m = reader.manifest
            digests: dict[str, str] = {}
            for spec in m.arrays.values():
                assert set(spec.sha256) == set(spec.stored_names()), spec.name
                digests.update(spec.sha256)
            assert m.generation == store_generation(N, digests)
            assert reader.verify_arrays() == []

    def test_same_arrays_give_the_same_generation(self, tmp_path: Path) -> None:
        one = self.build_store(tmp_path / "one")
        two = self.build_store(tmp_path / "two")
        other = self.build_store(tmp_path / "other", sample_arrays(seed=3))
        gens = []
        for path in (one, two, other):
            with open_reader(path) as reader:
                gens.append(reader.manifest.generation)
        assert gens[0] == gens[1] != gens[2]

    def test_commit_refuses_a_manifest_whose_count_differs_from_the_arrays(self, tmp_path: Path) -> None:
        writer = self.new_writer(self.store_path(tmp_path))
        self.write(writer, {"labels": sample_arrays()["labels"]})
        with pytest.raises(StoreError, match="manifest says"):
            writer.commit(_manifest(self.backend, N - 1))
        writer.abort()

    def test_reader_sees_its_generation_or_refuses_after_an_array_is_replaced(self, tmp_path: Path) -> None:
        arrays = sample_arrays()
        path = self.build_store(tmp_path, arrays)
        reader = open_reader(path)
        assert reader.manifest.count == N  # the manifest is pinned now, the arrays on first use
        try:
            writer = open_writer(path, "r+")
            writer.delete_array("weight")
            self.write(writer, {"weight": np.arange(N, dtype=np.float64)})
            writer.commit(_manifest(self.backend, N))
        except StoreError as exc:  # a backend may refuse to write while a reader has the store open
            assert "open" in str(exc)  # noqa: PT017 - the write may also succeed
        try:
            got = reader.read_all("weight")
        except StoreError as exc:
            assert "changed while it was open" in str(exc)  # noqa: PT017 - the read may also succeed
        else:
            assert np.array_equal(got, arrays["weight"])
        assert np.array_equal(reader.read_all("labels"), arrays["labels"])  # untouched arrays still read
        reader.close()

    def test_pickled_reader_refuses_a_store_rewritten_since(self, tmp_path: Path) -> None:
        import shutil

        path = self.build_store(tmp_path)
        with open_reader(path) as reader:
            blob = pickle.dumps(reader)
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
        self.build_store(tmp_path, sample_arrays(seed=5))
        copy = pickle.loads(blob)
        with pytest.raises(StoreError, match="changed while it was open"):
            copy.read_all("labels")

    def test_labels_outside_the_classes_are_refused(self, tmp_path: Path) -> None:
        arrays = {"labels": np.array([0, 1, 7] + [0] * (N - 3), dtype=np.int32)}
        path = self.build_store(tmp_path, arrays)
        with open_reader(path) as reader, pytest.raises(StoreError, match=r"holds 7 at sample 2"):
            reader.read_all("labels")

    # ------------------------------------------------------------------ registry

    def test_registry_routes_by_name_suffix_and_content(self, tmp_path: Path) -> None:
        assert BACKENDS[self.backend] is self.cls
        for suffix in self.cls.suffixes:
            assert backend_for_path(tmp_path / f"x{suffix}") is self.cls
            assert backend_for_path(tmp_path / f"x{suffix.upper()}") is self.cls
        path = self.build_store(tmp_path)
        assert detect_backend(path) is self.cls
        assert owned_store(path) is self.cls
        assert backend_for_path(tmp_path / "x.anything", self.backend) is self.cls
        with pytest.raises(OptionError, match="unknown store format"):
            get_backend("no-such-format")

    def test_capability_flags_are_checked_in_the_registry(self) -> None:
        read_only = type(
            f"ReadOnly{self.cls.__name__}", (self.cls,), {"name": "test-read-only", "supports_write": False}
        )
        register_backend(read_only)
        try:
            with pytest.raises(OptionError, match="cannot write"):
                get_backend("test-read-only", write=True)
            assert get_backend("test-read-only") is read_only
        finally:
            del BACKENDS["test-read-only"]
