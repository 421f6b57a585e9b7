"""The build's overlaps: the pool started while the build probes, and --jobs 1 writing one block
while it decodes the next. Neither may change a byte of the store or what a stopped build leaves."""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import dlpack
from dlpack.backends.writer import StoreWriter

_parallel = importlib.import_module("dlpack._parallel")
journal_module = importlib.import_module("dlpack.storage.journal")
write_module = importlib.import_module("dlpack.pack.write")

MakeTree = Callable[..., Path]
SHARD = 2**16  # 18 images of 40x30x3 a block


def _tree(make_tree: MakeTree, n: int = 90) -> Path:
    return make_tree({f"c{k % 3}/{k:03d}.png": "rgb" for k in range(n)})


def _pid() -> int:
    return os.getpid()


def test_a_warmed_pool_is_the_one_the_calls_run_in() -> None:
    from joblib import delayed

    _parallel.warm_pool(2)
    _parallel.wait_for_warm_pool()
    assert _parallel.pool_ready(2) and not _parallel.warming()
    pids = set(_parallel.parallel(2, [delayed(_pid)() for _ in range(8)]))
    assert os.getpid() not in pids and 1 <= len(pids) <= 2
    # Warm again: the same workers (joblib's reusable pool), not new ones.
    _parallel.warm_pool(2)
    again = set(_parallel.parallel(2, [delayed(_pid)() for _ in range(8)]))
    assert again & pids  # at least one worker of the first pool took calls again


def test_the_probe_runs_here_while_the_pool_starts(
    make_tree: MakeTree, tmp_path: Path, snapshot: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A probe that finds the pool still starting reads the headers itself; same store either way."""
    src = _tree(make_tree, 300)  # two probe calls: the build warms a pool of 2
    asked: list[int] = []
    real = _parallel.parallel

    def spy(n_jobs: int, calls: Any, count: int | None = None) -> Any:
        asked.append(n_jobs)
        return real(n_jobs, calls, count)

    monkeypatch.setattr(_parallel, "warming", lambda: True)
    monkeypatch.setattr(_parallel, "parallel", spy)
    a = tmp_path / "a.zarr"
    dlpack.build(src, a, jobs=2, quiet=True, shard_bytes=SHARD)
    assert asked[0] == 1  # the probe: in this process
    assert 2 in asked[1:]  # the packing: in the pool
    monkeypatch.undo()
    b = tmp_path / "b.zarr"
    dlpack.build(src, b, jobs=1, quiet=True, shard_bytes=SHARD)
    assert snapshot(a) == snapshot(b)


def test_jobs_1_writes_every_block_once_in_order(
    make_tree: MakeTree, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = _tree(make_tree)
    written: list[int] = []
    journalled: list[int] = []
    real_write, real_append = StoreWriter.write_block, journal_module.Journal.append_block

    def write(self: Any, name: str, start: int, values: Any) -> None:
        if name == "images":
            written.append(start)
        real_write(self, name, start, values)

    def append(self: Any, start: int, records: Any) -> None:
        assert start in written  # journalled only once written
        journalled.append(start)
        real_append(self, start, records)

    monkeypatch.setattr(StoreWriter, "write_block", write)
    monkeypatch.setattr(journal_module.Journal, "append_block", append)
    result = dlpack.build(src, tmp_path / "o.zarr", jobs=1, quiet=True, shard_bytes=SHARD)
    assert written == journalled == [0, 18, 36, 54, 72]
    assert result.count == 90


def test_a_failed_write_in_the_writer_thread_fails_the_build_and_leaves_no_store(
    make_tree: MakeTree, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = _tree(make_tree)
    real = StoreWriter.write_block
    attempts: list[int] = []

    def full(self: Any, name: str, start: int, values: Any) -> None:
        if name == "images":
            attempts.append(start)
            if start == 36:
                raise dlpack.StoreError("disk full (test)")
        real(self, name, start, values)

    monkeypatch.setattr(StoreWriter, "write_block", full)
    out = tmp_path / "o.zarr"
    with pytest.raises(dlpack.StoreError, match="disk full"):
        dlpack.build(src, out, jobs=1, quiet=True, shard_bytes=SHARD)
    assert attempts == [0, 18, 36]  # the block decoded meanwhile is never written
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.glob(".o.zarr.dlpack-*")) == []  # no partial, no journal


def test_an_interrupt_while_decoding_keeps_only_written_blocks_journalled(
    make_tree: MakeTree, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, snapshot: Any
) -> None:
    """Ctrl-C in the decoding thread: blocks already handed to the writer finish, nothing after."""
    src = _tree(make_tree)
    real = write_module.decode_fixed_block
    calls = [0]

    def stopped(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] == 4:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(write_module, "decode_fixed_block", stopped)
    out = tmp_path / "o.zarr"
    with pytest.raises(KeyboardInterrupt):
        dlpack.build(src, out, jobs=1, quiet=True, shard_bytes=SHARD)
    monkeypatch.undo()
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.glob(".o.zarr.dlpack-*")) == [
        ".o.zarr.dlpack-journal",
        ".o.zarr.dlpack-partial",
    ]
    result = dlpack.build(src, out, jobs=1, quiet=True, shard_bytes=SHARD)
    assert result.resume == "resumed: 3 of 5 blocks already written"
    ref = tmp_path / "ref.zarr"
    dlpack.build(src, ref, jobs=1, quiet=True, shard_bytes=SHARD)
    assert snapshot(out) == snapshot(ref)


@pytest.mark.parametrize("jobs", [1, 2])
def test_the_images_are_hashed_as_they_land_not_read_back_at_commit(
    jobs: int, make_tree: MakeTree, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, snapshot: Any
) -> None:
    base = importlib.import_module("dlpack.backends.writer")
    read_back: list[int] = []
    real = base.array_digest

    def spy(read_rows: Any, rows: int, row_nbytes: int, dtype: str) -> str:
        read_back.append(row_nbytes)
        return str(real(read_rows, rows, row_nbytes, dtype))

    monkeypatch.setattr(base, "array_digest", spy)
    src = _tree(make_tree)
    out = tmp_path / "o.zarr"
    dlpack.build(src, out, jobs=jobs, force_jobs=True, quiet=True, shard_bytes=SHARD)
    assert read_back and 40 * 30 * 3 not in read_back  # the metadata arrays only
    monkeypatch.undo()
    from dlpack.backends import backend_for_path

    with backend_for_path(out).open_reader(out) as reader:
        assert reader.verify_arrays() == []  # the recorded checksum is the one of the bytes read back
    ref = tmp_path / "ref.zarr"
    monkeypatch.setattr(write_module._InOrderDigest, "add", lambda self, start, rows: setattr(self, "on", False))
    dlpack.build(src, ref, jobs=1, quiet=True, shard_bytes=SHARD)
    assert snapshot(out) == snapshot(ref)
