"""A large build keeps its per-sample records in anonymous files beside its output.

The workers' records (:class:`SampleTable`) are :class:`~dlpack.storage.spill.Column` s of the table's
length, written by position as the blocks land; past ``SPILL_BYTES`` a column is an anonymous
file beside OUT, read back a part at a time when the manifest's arrays are written. Nothing of
them has a name, so nothing is left behind on publication, failure, Ctrl-C or a kill. The store's
bytes are those of the in-memory table (tests/pack/test_columns.py compares whole stores too).
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
from dlpack.pack.columns import SampleTable
from dlpack.pack.workers import Sample
from dlpack.pack.write import Partial, commit_store
from dlpack.storage import spill as _spill
from dlpack.storage.lock import partial_path
from dlpack.storage.spill import PART, Column

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


def test_the_records_are_anonymous_files_beside_the_partial_and_leave_nothing(
    make_tree: MakeTree, tmp_path: Path, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = make_tree(SPEC)
    before = _files(src)
    out = tmp_path / "stores" / backend
    seen: dict[str, Any] = {}
    commit = commit_store
    made = []
    anonymous = _spill.tempfile.TemporaryFile

    def watching_files(*args: Any, **kwargs: Any) -> Any:
        made.append(kwargs.get("dir"))
        return anonymous(*args, **kwargs)

    def watching(partial: Any, out_: Path, arrays: Any, manifest: Any) -> None:
        seen["beside"] = sorted(os.listdir(out_.parent))
        seen["fixed"] = {
            name: isinstance(values, Column) and values.spilled
            for name, (spec, values) in arrays.items()
            if not spec.ragged
        }
        commit(partial, out_, arrays, manifest)

    monkeypatch.setattr(_spill, "SPILL_BYTES", 0)
    monkeypatch.setattr(_spill.tempfile, "TemporaryFile", watching_files)
    monkeypatch.setattr(dlpack.pack, "commit_store", watching)
    dlpack.build(src, out, **OPTS)
    # While committing: the columns are in files made beside OUT, and none of them has a name there.
    assert seen["fixed"]["transform"] and seen["fixed"]["source_sha256"] and made
    assert set(made) == {os.fspath(out.parent)}
    assert seen["beside"] == sorted(
        p.name
        for p in (partial_path(out), out.parent / f".{backend}.dlpack-journal", out.parent / f".{backend}.dlpack-lock")
    )
    # After publication: nothing of the build's own is left, and the source folder was not written to.
    assert sorted(os.listdir(out.parent)) == [backend]
    assert _files(src) == before


def test_a_failed_or_interrupted_build_resumes_byte_identical(
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
    assert not os.path.lexists(partial_path(out))
    interrupt_build(monkeypatch, 1, lambda: dlpack.build(src, out, **OPTS))
    # Ctrl-C keeps the partial and its journal to resume from: a resume rebuilds the records from it.
    result = dlpack.build(src, out, **OPTS)
    assert result.resume.startswith("resumed")
    assert snapshot(out) == snapshot(ref)


@pytest.mark.slow
def test_a_spilled_table_is_file_backed_and_reads_as_the_in_memory_one(tmp_path: Path) -> None:
    n = 2 * PART + 5  # three read-back parts, the last a short one
    samples = [_sample(k) for k in range(n)]
    spilled = SampleTable(n, spill=True)
    held = SampleTable(n, in_memory=True)
    for s in [*range(4096, n, 4096), 0]:  # out of order, as a resumed build puts its kept blocks first
        for t in (spilled, held):
            t.put(s, samples[s : s + 4096])
    assert spilled.complete
    for name in ("original_size", "shape", "transform", "checksum", "stat", "sha256"):
        col, kept = getattr(spilled, name), getattr(held, name)
        assert col.spilled and not kept.spilled
        assert col.shape == kept.shape and col.dtype == kept.dtype
        # The file holds the rows, little-endian and C order, as the store's array will.
        assert np.asarray(col).tobytes() == np.asarray(kept).tobytes()
    assert spilled.conversion_counts() == held.conversion_counts() == {"gray to rgb": n - len(range(0, n, 3))}
    assert spilled[n - 1] == samples[-1] and spilled[5:8] == samples[5:8]

    reads: list[int] = []
    read = Column.read

    def counted(self: Column, start: int, stop: int) -> np.ndarray:
        reads.append(min(stop, len(self)) - start)
        return read(self, start, stop)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(Column, "read", counted)
        assert list(spilled) == samples
    # Read back a bounded part at a time, never whole.
    assert reads and max(reads) == PART and sum(reads) == n * len(columns._COLUMNS)
    err = InputFileError("x.png", "damaged")
    assert spilled.with_failures({1: err})[:3] == [samples[0], err, samples[2]]
    spilled.close()
    spilled.close()  # once given back, nothing to do


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
    held = SampleTable(n, in_memory=True)
    spilled = SampleTable(n, spill=True)
    for table in (held, spilled):
        table.put(0, samples)
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


def test_a_full_disk_while_spilling_names_the_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with _spill.spilling_to(tmp_path):
        table = SampleTable(4, spill=True)

    def full(fd: int, data: Any, at: int) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", full)
    with pytest.raises(StoreError, match=f"cannot write the build's per-image records in {tmp_path}: No space left"):
        table.put(0, [_sample(0)])
