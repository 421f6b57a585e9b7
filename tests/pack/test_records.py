"""A build spills its per-sample records to files of its own beside the partial store.

The workers' records (:class:`SampleTable`) go into one file per column as the blocks land, in
``.NAME.dlpack-records`` (dlpack's marker inside), and are read back a part at a time when the
manifest's arrays are written; the folder goes away with the partial store, on publication, on
failure and on Ctrl-C, and a killed build's is cleared by the next build. The store's bytes are
those of the in-memory table (tests/pack/test_columns.py compares whole stores too).
"""

from __future__ import annotations

import errno
import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import interrupt_build

import dlpack
from dlpack.backends import ArraySpec, backend_for_path
from dlpack.errors import InputFileError, StoreError
from dlpack.manifest import ImageSpec, Manifest
from dlpack.pack import columns
from dlpack.pack.columns import RECORD_PART, SampleTable, SpilledColumn, remove_records
from dlpack.pack.workers import Sample
from dlpack.pack.write import Partial, commit_store
from dlpack.storage.lock import partial_path, records_path

MakeTree = Callable[..., Path]

SPEC = {f"{cls}/{k:02d}.png": "rgb" for cls in ("a", "b") for k in range(12)}
OPTS: dict[str, Any] = {"shard_bytes": 2**16, "jobs": 1, "quiet": True}


def _sample(k: int) -> Sample:
    return Sample(
        (30 + k, 40), (16, 16, 3), (0.5, 0.25, 1.0, -2.0), k, ("gray to rgb",) if k % 3 else (), None,
        (1000 + k, 1_700_000_000_123_456_789 + k), hashlib.sha256(str(k).encode()).hexdigest(),
    )  # fmt: skip


def _files(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*")}


def test_the_records_are_dlpacks_files_beside_the_partial_and_vanish_with_it(
    make_tree: MakeTree, tmp_path: Path, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = make_tree(SPEC)
    before = _files(src)
    out = tmp_path / "stores" / backend
    seen: dict[str, Any] = {}
    commit = commit_store

    def watching(partial: Any, out_: Path, arrays: Any, manifest: Any) -> None:
        folder = records_path(out_)
        seen["partial"] = partial_path(out_).exists()
        seen["files"] = sorted(os.listdir(folder))
        seen["fixed"] = {name: type(values).__name__ for name, (spec, values) in arrays.items() if not spec.ragged}
        commit(partial, out_, arrays, manifest)

    monkeypatch.setattr(dlpack.pack, "commit_store", watching)
    dlpack.build(src, out, **OPTS)
    # While committing: the records folder beside the partial, with dlpack's marker and one file per column.
    assert seen["partial"] and records_path(out).parent == partial_path(out).parent == out.parent
    assert seen["files"] == sorted(["dlpack-records", *(f"{c}.col" for c in columns._COLUMNS)])
    assert seen["fixed"]["transform"] == "SpilledColumn" and seen["fixed"]["source_sha256"] == "SpilledColumn"
    # After publication: nothing of the build's own is left, and the source folder was not written to.
    assert sorted(os.listdir(out.parent)) == [backend]
    assert _files(src) == before


def test_a_failed_or_interrupted_build_leaves_no_records_and_resumes_byte_identical(
    make_tree: MakeTree, tmp_path: Path, backend: str, monkeypatch: pytest.MonkeyPatch, snapshot: Any
) -> None:
    src = make_tree(SPEC)
    ref = tmp_path / ("ref" + Path(backend).suffix)
    dlpack.build(src, ref, **OPTS)
    out = tmp_path / backend

    def broken(*args: Any) -> None:
        raise OSError("disk gone")

    with monkeypatch.context() as m:
        m.setattr(dlpack.pack, "manifest_stage", broken)
        with pytest.raises(OSError, match="disk gone"):
            dlpack.build(src, out, **OPTS)
    assert not os.path.lexists(records_path(out)) and not os.path.lexists(partial_path(out))
    interrupt_build(monkeypatch, 1, lambda: dlpack.build(src, out, **OPTS))
    # Ctrl-C keeps the partial and its journal to resume from, not the records: a resume rebuilds them.
    assert not os.path.lexists(records_path(out))
    result = dlpack.build(src, out, **OPTS)
    assert result.resume.startswith("resumed") and not os.path.lexists(records_path(out))
    assert snapshot(out) == snapshot(ref)


def test_a_killed_builds_records_are_cleared_and_anyone_elses_folder_is_refused(
    make_tree: MakeTree, tmp_path: Path
) -> None:
    src = make_tree(SPEC)
    out = tmp_path / "out.zarr"
    stale = SampleTable.spilled(3, records_path(out))  # what a killed build leaves
    stale.put(0, [_sample(0)])
    dlpack.build(src, out, **OPTS)
    assert not os.path.lexists(records_path(out)) and backend_for_path(out).open_reader(out).manifest.count == 24

    foreign = records_path(tmp_path / "other.zarr")
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(StoreError, match=r"dlpack-records.*not dlpack's \(it has no dlpack-records marker file\)"):
        dlpack.build(src, tmp_path / "other.zarr", **OPTS)
    assert (foreign / "notes.txt").read_text() == "mine"
    (foreign / "dlpack-records").write_bytes(columns._MARKER_TEXT)
    with pytest.raises(StoreError, match=r"holds files dlpack does not write there \(notes.txt\)"):
        remove_records(foreign)
    assert (foreign / "notes.txt").exists()
    (foreign / "notes.txt").unlink()
    (foreign / "transform.col").mkdir()  # a folder under a column's name is not what a build writes
    with pytest.raises(StoreError, match=r"transform.col in it is not a regular file"):
        remove_records(foreign)
    assert (foreign / "transform.col").is_dir()


@pytest.mark.slow
def test_a_spilled_table_is_file_backed_and_reads_as_the_in_memory_one(tmp_path: Path) -> None:
    n = 2 * RECORD_PART + 5  # three read-back parts, the last a short one
    samples = [_sample(k) for k in range(n)]
    spilled = SampleTable.spilled(n, tmp_path / "rec")
    held = SampleTable(n)
    for s in [*range(4096, n, 4096), 0]:  # out of order, as a resumed build puts its kept blocks first
        for t in (spilled, held):
            t.put(s, samples[s : s + 4096])
    assert spilled.complete and spilled.folder == tmp_path / "rec"
    for name in ("original_size", "shape", "transform", "checksum", "stat", "sha256"):
        col = getattr(spilled, name)
        assert isinstance(col, SpilledColumn) and not isinstance(col, np.ndarray)
        assert col.shape == getattr(held, name).shape and col.dtype == getattr(held, name).dtype
        # The file holds the rows, little-endian and C order, as the store's array will.
        assert (tmp_path / "rec" / f"{name}.col").read_bytes() == getattr(held, name).tobytes()
    assert spilled.conversion_counts() == held.conversion_counts() == {"gray to rgb": n - len(range(0, n, 3))}
    assert spilled[n - 1] == samples[-1] and spilled[5:8] == samples[5:8]

    reads: list[int] = []
    read = SpilledColumn.read

    def counted(self: SpilledColumn, start: int, stop: int) -> np.ndarray:
        reads.append(min(stop, len(self)) - start)
        return read(self, start, stop)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(SpilledColumn, "read", counted)
        assert list(spilled) == samples
    # Read back a bounded part at a time, never whole.
    assert reads and max(reads) == RECORD_PART and sum(reads) == n * len(columns._COLUMNS)
    err = InputFileError("x.png", "damaged")
    assert spilled.with_failures({1: err})[:3] == [samples[0], err, samples[2]]
    spilled.close()
    assert not (tmp_path / "rec").exists()
    spilled.close()  # once gone, nothing to do


def _counting(write: Any, parts: list[tuple[str, int, int]]) -> Any:
    def counting(self: Any, name: str, start: int, values: Any) -> None:
        parts.append((name, len(values), self.shard_rows(name)))
        write(self, name, start, values)

    return counting


def test_commit_writes_a_spilled_column_one_shard_at_a_time_with_the_bytes_of_one_array(
    tmp_path: Path, backend: str, snapshot: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 32-byte rows in 64 KiB shards: several shards (Zarr: one 1 MiB inner chunk, 32,768 rows, at
    # least; HDF5: 2,048 rows); 4-byte rows: one shard in Zarr (262,144-row chunks), many in HDF5.
    n = 70000
    samples = [_sample(k) for k in range(n)]
    held = SampleTable.of(samples)
    spilled = SampleTable.spilled(n, tmp_path / "rec")
    spilled.put(0, samples)
    manifest = Manifest(
        count=n, image=ImageSpec("fixed", 3, "|u1", 16, 16), backend=backend_for_path(Path(backend)).name
    )
    stores = []
    for name, table in (("held", held), ("spilled", spilled)):
        out = tmp_path / name / backend
        out.parent.mkdir()
        writer = backend_for_path(out).open_writer(out, "w-", 2**16)
        writer.open()
        arrays = {
            c: (ArraySpec(c, getattr(table, a).dtype.str, getattr(table, a).shape[1:]), getattr(table, a))
            for c, a in (("transform", "transform"), ("source_sha256", "sha256"), ("checksum", "checksum"))
        }
        parts: list[tuple[str, int, int]] = []
        monkeypatch.setattr(type(writer), "write_block", _counting(type(writer).write_block, parts))
        commit_store(Partial(writer, None, {}, ""), out, arrays, manifest)
        monkeypatch.undo()
        if table is spilled:
            # Whole shards of the stored array, in order, the last one short: never the column at once.
            for c in arrays:
                sizes = [size for name_, size, _ in parts if name_ == c]
                rows = {shard for name_, _, shard in parts if name_ == c}.pop()
                assert sum(sizes) == n and sizes == [rows] * (n // rows) + ([n % rows] if n % rows else [])
            assert len([1 for name_, _, _ in parts if name_ == "transform"]) > 1
        else:
            assert [size for _, size, _ in parts] == [n, n, n]
        stores.append(snapshot(out))
    assert stores[0] == stores[1]


def test_a_full_disk_while_spilling_names_the_records_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    table = SampleTable.spilled(4, tmp_path / "rec")

    def full(path: Any, mode: str = "r") -> Any:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(columns, "open", full, raising=False)
    with pytest.raises(StoreError, match=r"cannot write .*rec.original_size\.col: the disk is full"):
        table.put(0, [_sample(0)])
