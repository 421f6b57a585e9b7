"""A large build keeps its scan's and probe's per-image records in files (dlpack.storage.spill).

The columns move to an anonymous file beside OUT past a few MiB and are read back a part at a time;
the folder scan sorts its paths by an external merge sort. With ``spill_everything`` every column
spills from its first row and the parts and runs are a handful of rows, so these small trees take
the paths a million-image build takes; the stores must be byte-identical to those of the object
path (tests/pack/test_columns.py), whatever the part boundaries.
"""

from __future__ import annotations

import pickle
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import interrupt_build
from test_columns import BAD, SPEC, TupleSource, source_tree, store_files

import dlpack
from dlpack.backends import ArraySpec, backend_for_path
from dlpack.errors import InputFileError, SourceError, StoreError
from dlpack.manifest import ImageSpec, Manifest
from dlpack.pack.inputs import Kept, Probe, ProbeTable, Selection
from dlpack.pack.write import METADATA_SHARD_BYTES, Partial, commit_store
from dlpack.sources import FolderSource
from dlpack.sources._items import ItemTable
from dlpack.sources.folder import _Runs
from dlpack.sources.probe import ImageHeader
from dlpack.storage import spill as _spill
from dlpack.storage.spill import Column, spilling_to

MakeTree = Callable[..., Path]
OPTS: dict[str, Any] = {"shard_bytes": 2**16, "jobs": 1, "quiet": True, "on_error": "skip"}


def test_a_column_reads_the_same_in_memory_and_from_its_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_spill, "PART", 4)
    rows = np.arange(46, dtype=np.int64).reshape(23, 2) * 3
    memory = Column(np.int64, (2,))
    monkeypatch.setattr(_spill, "SPILL_BYTES", 10 * 16)  # spills on the append that passes 10 rows
    spilled = Column(np.int64, (2,))
    for a in range(0, 23, 6):
        spilled.append(rows[a : a + 6])
    monkeypatch.setattr(_spill, "SPILL_BYTES", 1 << 30)
    for a in range(0, 23, 6):
        memory.append(rows[a : a + 6])
    assert spilled.spilled and not memory.spilled
    for col in (memory, spilled):
        assert col.shape == (23, 2) and len(col) == 23
        assert np.array_equal(np.asarray(col), rows)
        assert np.array_equal(col[5:17], rows[5:17]) and np.array_equal(col.read(20, 99), rows[20:])
        assert [col.at(k).tolist() for k in (0, 3, 4, 22, 7)] == [rows[k].tolist() for k in (0, 3, 4, 22, 7)]
        assert np.array_equal(np.concatenate(list(col.parts(5))), rows)
        assert np.array_equal(col.take([0, 3, 4, 9, 22]), rows[[0, 3, 4, 9, 22]])
        assert np.array_equal(col.take(range(2, 11)), rows[2:11])
        assert col.take([]).shape == (0, 2)
        assert np.array_equal(pickle.loads(pickle.dumps(col))[0:23], rows)
        with pytest.raises(TypeError, match="plain slice"):
            col[::2]


def test_a_column_spills_where_it_was_made_and_names_the_folder_it_cannot_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_spill, "SPILL_BYTES", 0)
    made: list[str] = []
    anonymous = _spill.tempfile.TemporaryFile

    def watching(*args: Any, **kwargs: Any) -> Any:
        made.append(kwargs["dir"])
        return anonymous(*args, **kwargs)

    monkeypatch.setattr(_spill.tempfile, "TemporaryFile", watching)
    with spilling_to(tmp_path):
        col = Column(np.int32)
    col.append([1, 2, 3])  # the folder is the one in force where the column was made
    assert made == [str(tmp_path)] and list(tmp_path.iterdir()) == []  # a file without a name
    gone = tmp_path / "gone"
    with spilling_to(gone):
        lost = Column(np.int32)
    with pytest.raises(StoreError, match=f"cannot make a file in {gone} for the build's per-image records"):
        lost.append([1])


def test_the_item_and_probe_tables_read_the_same_spilled(spill_everything: None) -> None:
    rels = [f"{'é' if k % 4 == 0 else ''}{k:03d}/x.png" for k in range(17)]
    table = ItemTable(rels, [k % 3 - 1 for k in range(17)], ("a", "b"), [k % 2 - 1 for k in range(17)], ("val",))
    assert table.spilled
    assert [table.rel(k) for k in (16, 0, 5, 4)] == [rels[k] for k in (16, 0, 5, 4)]
    assert list(table.rels(3, 12)) == rels[3:12]
    assert [it.rel for it in table] == rels
    assert [it.label for it in table] == [(None, "a", "b")[k % 3] for k in range(17)]
    keep = [0, 1, 2, 6, 7, 15]
    data, offsets = table.source_bytes(keep)
    assert [bytes(data[a:b]).decode() for a, b in zip(offsets[:-1], offsets[1:], strict=True)] == [
        rels[k] for k in keep
    ]
    batch = table.source_column(range(17))[4:11]
    assert [bytes(v).decode() for v in batch] == rels[4:11]
    assert list(pickle.loads(pickle.dumps(table))) == list(table)

    header = ImageHeader("png", 40, 30, 3, False, 8, 1, 1)
    probes = [Probe(header if k % 5 else None, 100 + k, None if k % 5 else "bad") for k in range(13)]
    table2 = ProbeTable.of(probes)
    assert list(table2) == probes and table2.nbytes(range(13)) == sum(100 + k for k in range(13))
    assert table2.nbytes([1, 6, 12]) == 101 + 106 + 112
    assert dict(table2.errors) == {0: "bad", 5: "bad", 10: "bad"}


def test_the_scan_sorts_by_merging_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    from dlpack.sources import folder

    monkeypatch.setattr(folder, "RUN", 7)
    monkeypatch.setattr(folder, "_MERGE_STEP", 2)
    monkeypatch.setattr(_spill, "SPILL_BYTES", 0)
    rng = random.Random(3)
    names = [
        "/".join("".join(rng.choice("ab-_.é/0Z") for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(1, 3)))
        for _ in range(200)
    ]
    runs = _Runs()
    for name in names:
        runs.append(name)
    assert len(runs) == 200
    assert list(runs.merged()) == sorted(names)
    monkeypatch.setattr(folder, "MAX_RUNS", 4)  # runs merged into one as they pass 4
    runs = _Runs()
    for name in names:
        runs.append(name)
    assert len(runs._runs) < 4 and len(runs) == 200
    assert list(runs.merged()) == sorted(names)


def test_a_spilled_build_is_byte_identical_to_the_object_build(
    make_tree: MakeTree, tmp_path: Path, backend: str, spill_everything: None
) -> None:
    src = source_tree(make_tree)
    scan = FolderSource(src).scan()
    assert isinstance(scan.items, ItemTable) and scan.items.spilled
    spilled, objects = tmp_path / "spilled" / backend, tmp_path / "objects" / backend
    a = dlpack.build(src, spilled, **OPTS)
    b = dlpack.build(TupleSource(src), objects, **OPTS)
    assert [e.path for e in a.skipped] == [BAD] and a.count == len(SPEC) - 1
    assert a.splits == b.splits and a.input_bytes == b.input_bytes
    assert store_files(spilled) == store_files(objects)
    ds = dlpack.open(spilled)
    assert [ds[i]["source"] for i in range(len(ds))] == sorted(r for r in SPEC if r != BAD)


def test_a_spilled_build_resumes_and_splits_byte_identical(
    make_tree: MakeTree, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spill_everything: None
) -> None:
    src = source_tree(make_tree)
    out = tmp_path / "out.zarr"
    interrupt_build(monkeypatch, 2, lambda: dlpack.build(src, out, **OPTS))
    assert dlpack.build(src, out, **OPTS).resume.startswith("resumed: 2 of ")
    dlpack.build(TupleSource(src), tmp_path / "ref.zarr", **OPTS)
    assert store_files(out) == store_files(tmp_path / "ref.zarr")

    flat = make_tree({f"{c}/{k:02d}.png": "gray" for c in ("a", "b", "a-b") for k in range(9)}, "flat")
    opts = {**OPTS, "split": (60, 20, 20), "split_seed": 7}
    dlpack.build(flat, tmp_path / "s.zarr", **opts)
    dlpack.build(TupleSource(flat), tmp_path / "t.zarr", **opts)
    assert store_files(tmp_path / "s.zarr") == store_files(tmp_path / "t.zarr")
    dlpack.build(flat, tmp_path / "n.zarr", **{**OPTS, "labels": "none"})
    assert dlpack.open(tmp_path / "n.zarr").classes == ()


def test_strays_are_counted_and_the_first_listed_when_spilled(make_tree: MakeTree, spill_everything: None) -> None:
    src = make_tree({**{f"{k:02d}.png": "gray" for k in range(12)}, "cat/x.png": "gray"})
    with pytest.raises(
        SourceError, match=r"12 images sit directly in .*: 00\.png, 01\.png, .* and \d+ more; the other 1 is"
    ):
        FolderSource(src).scan()


def test_kept_positions_are_a_range_with_holes(spill_everything: None) -> None:
    rng = random.Random(11)
    for n in (0, 1, 6, 23):
        dropped = {k for k in range(n) if rng.random() < 0.3} | {n + 2}  # one past the end is ignored
        kept = Kept(n, dropped)
        want = [k for k in range(n) if k not in dropped]
        assert len(kept) == len(want) and list(kept) == want and kept == want
        assert [kept[j] for j in range(len(want))] == want
        assert [kept[j] for j in range(-len(want), 0)] == want
        assert kept[2:9].tolist() == want[2:9] and kept[::3].tolist() == want[::3]
        more = set(want[::4])
        assert list(kept.without(more)) == [k for k in want if k not in more]
        with pytest.raises(IndexError):
            kept[len(want)]
    sel = Selection(range(10), ()).drop({3: InputFileError("3.png", "bad"), 7: InputFileError("7.png", "bad")})
    assert isinstance(sel.keep, Kept) and list(sel.keep) == [0, 1, 2, 4, 5, 6, 8, 9]
    again = sel.drop({0: InputFileError("0.png", "bad")})
    assert list(again.keep) == [1, 2, 4, 5, 6, 8, 9] and [e.path for e in again.errors] == ["3.png", "7.png", "0.png"]


def test_the_commit_writes_the_metadata_arrays_in_small_shards(tmp_path: Path, backend: str) -> None:
    # Two 4 MiB shards of 32-byte transforms (131,072 rows each) and more: the commit holds a
    # shard of an array at a time, not the whole array, however many images the store has.
    n = 2 * 131_072 + 1000
    out = tmp_path / backend
    writer = backend_for_path(out).open_writer(out, "w-", 2**25)
    writer.open()
    transform = Column.of(np.arange(n * 4, dtype="<f8").reshape(n, 4), "<f8", (4,))
    items = ItemTable((f"{k:06d}.png" for k in range(n)), np.full(n, -1), (), np.full(n, -1), ())
    arrays = {
        "transform": (ArraySpec("transform", "<f8", (4,)), transform),
        "source": (ArraySpec("source", "|u1", (), ragged=True), items.source_column(range(n))),
    }
    manifest = Manifest(
        count=n, image=ImageSpec("fixed", 3, "|u1", 2, 2), backend=backend_for_path(out).name, classes=()
    )
    commit_store(Partial(writer, None, {}, ""), out, arrays, manifest)
    assert writer._stored_layout("transform")[1] == METADATA_SHARD_BYTES // 32 < n
    assert writer._stored_layout("source_offsets")[1] * 8 <= METADATA_SHARD_BYTES
    with backend_for_path(out).open_reader(out) as reader:
        assert np.array_equal(reader.meta("transform"), np.asarray(transform))
        assert [bytes(reader.read("source", k)).decode() for k in (0, 131_071, 131_072, n - 1)] == [
            f"{k:06d}.png" for k in (0, 131_071, 131_072, n - 1)
        ]


def test_a_worker_block_travels_as_columns_and_lands_as_its_samples(tmp_path: Path) -> None:
    from test_columns import _sample

    from dlpack.pack.columns import SampleBlock, SampleTable

    err = InputFileError("c.png", "damaged")
    results = [_sample(0), _sample(1, labelled=True), err, _sample(3), _sample(4)]
    packed = pickle.loads(pickle.dumps(SampleBlock(results)))  # as a worker sends it
    assert len(packed) == 5 and packed.failed == {2: err}
    assert list(packed.samples()) == [r for r in results if r is not err] and packed.results() == results
    # Put at an offset into a table that already has other conversions: the codes are remapped.
    by_columns, by_objects = SampleTable(9, spill=True), SampleTable(9)
    for table in (by_columns, by_objects):
        table.put(0, [_sample(5), _sample(6)])
    by_columns.put_table(3, packed.table)
    assert by_objects.put_results(3, results) == {5: err}
    assert not by_columns.complete
    for k in (0, 1, 3, 4, 6, 7):
        assert by_columns[k] == by_objects[k], k
    with pytest.raises(IndexError, match="sample 5 was not written"):
        by_columns[5]
    assert by_columns.conversion_counts() == by_objects.conversion_counts()
    by_columns.close()
