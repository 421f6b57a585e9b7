"""A Zarr store's shard maps lie end to end in one address range, and live as long as their views.

Mapped one by one, the shards of a store opened after other maps were closed lie scattered over
the holes those left, and the loader's batch blocks land between them (where the one-take gather
must decline them). Mapped into one reserved range, nothing else can lie inside it.
"""

from __future__ import annotations

import gc
import math
import mmap
import os
import sys
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

import dlpack
from dlpack import _maps
from dlpack.backends import _shard
from dlpack.backends._shard import ShardedArray
from dlpack.backends.gather import RowSpan

N = 30


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("maps")
    src = tmp / "src"
    src.mkdir()
    for i in range(N):
        img = np.random.default_rng([3, i]).integers(0, 256, (64, 64, 3), dtype=np.uint8)
        assert cv2.imwrite(str(src / f"{i:03d}.png"), img)
    out = tmp / "s.zarr"
    dlpack.build(src, out, size=(64, 64), shard_bytes=2**16, quiet=True)  # 12 KiB rows: several shards
    return out


def _addr(a: np.ndarray) -> int:
    return int(a.__array_interface__["data"][0])


def _expected(store: Path) -> np.ndarray:
    with dlpack.open(store) as ds:
        return np.stack([ds[i]["image"] for i in range(len(ds))])


@pytest.mark.skipif(_maps.libc() is None, reason="no C library mmap on this platform")
def test_shards_are_mapped_end_to_end_in_one_range(store: Path) -> None:
    arr = ShardedArray(store / "images", strict=True)
    views = arr.shard_views()
    assert len(views) == arr.n_shards >= 3 and all(v is not None for v in views)
    sizes = [len(arr._maps[s]) for s in range(arr.n_shards)]
    row = 64 * 64 * 3
    # Whole pages and whole rows: 3 pages (shards under 2 MiB: nothing to gain from 2 MiB starts)
    step = math.lcm(mmap.PAGESIZE, row)
    starts = [_addr(v) for v in views if v is not None]
    for s in range(1, len(starts)):  # each shard right after the one before, rounded up to a step
        assert starts[s] == starts[s - 1] + -(-sizes[s - 1] // step) * step
    assert all((a - starts[0]) % row == 0 for a in starts)
    assert starts[0] % _maps.HUGE == 0  # the range itself starts on a huge page
    span = RowSpan.of(*arr.row_source())  # type: ignore[misc]
    assert span is not None and span._step == 1  # one whole row per index: the shards are rows apart
    assert span._units.nbytes == starts[-1] - starts[0] + views[-1].nbytes  # type: ignore[union-attr]
    # A block allocated now can never lie inside the span, so the one take always applies.
    for _ in range(20):
        out = np.empty((8, 64, 64, 3), dtype=np.uint8)
        assert not np.may_share_memory(out, span._units)
    idx = np.array([29, 0, 13, 6, 5], dtype=np.int64)
    assert span.gather(idx, out) and np.array_equal(out[:5], _expected(store)[idx])
    arr.close()


def test_maps_start_on_a_huge_page_unless_that_costs_too_much_address_space() -> None:
    """A 4 KiB page-table entry per page of a 10 GB store of views made a 256x256x3 row 20 % slower
    to copy than 2 MiB entries do; file maps can have those only where each starts on a 2 MiB page."""
    big = 32 << 20  # a shard of the default size
    assert _maps._step(3 * mmap.PAGESIZE, big) == 3 * _maps.HUGE  # 64x64x3 rows: 6 MiB steps
    assert _maps._step(_maps.HUGE, big) == _maps.HUGE
    odd = 224 * 224 * 3  # whole rows and huge pages would be 294 MiB apart: rows and pages only
    assert _maps._step(math.lcm(mmap.PAGESIZE, odd), big) == math.lcm(mmap.PAGESIZE, odd)
    # Files under 2 MiB can never be mapped by a 2 MiB entry: their maps are not padded for it.
    assert _maps._step(3 * mmap.PAGESIZE, _maps.HUGE - 1) == 3 * mmap.PAGESIZE
    if _maps.libc() is None:
        return
    sizes = [5000, 3 * _maps.HUGE + 1, 17]
    paths = []
    for k, size in enumerate(sizes):
        fd, path = __import__("tempfile").mkstemp()
        os.write(fd, bytes([k + 1]) * size)
        os.close(fd)
        paths.append(path)
    try:
        got = _maps.map_consecutive(sizes, lambda k: os.open(paths[k], os.O_RDONLY))
        assert got is not None
        assert [_addr(a) % _maps.HUGE for a in got] == [0, 0, 0]
        assert [(len(a), int(a[0]), int(a[-1])) for a in got] == [(s, k + 1, k + 1) for k, s in enumerate(sizes)]
    finally:
        for path in paths:
            os.unlink(path)


def _vm_flags(addr: int) -> list[str] | None:
    """The kernel's flags of this process's mapping holding ``addr`` (``/proc/self/smaps``)."""
    inside = False
    with open("/proc/self/smaps", encoding="ascii", errors="replace") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and ":" not in head:
                lo, hi = (int(v, 16) for v in head.split("-"))
                inside = lo <= addr < hi
            elif inside and line.startswith("VmFlags:"):
                return line.split()[1:]
    return None


@pytest.mark.skipif(
    _maps.libc() is None or not os.path.isdir("/sys/kernel/mm/transparent_hugepage"), reason="Linux with huge pages"
)
def test_maps_of_files_of_2_mib_or_more_ask_for_huge_pages(tmp_path: Path) -> None:
    """A store read cold through its maps then fills the page cache in 2 MiB pieces, which the
    kernel maps 2 MiB at a time (``read`` fills it in small ones: then only 4 KiB entries)."""
    big, small = tmp_path / "big", tmp_path / "small"
    big.write_bytes(b"\1" * (_maps.HUGE + 5))
    small.write_bytes(b"\2" * 5000)
    files = [big, small]
    got = _maps.map_consecutive([_maps.HUGE + 5, 5000], lambda k: os.open(files[k], os.O_RDONLY))
    assert got is not None
    assert "hg" in (_vm_flags(_addr(got[0])) or [])  # MADV_HUGEPAGE
    assert "hg" not in (_vm_flags(_addr(got[1])) or ["?"])  # under 2 MiB: nothing to gain
    with big.open("rb") as f:
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)  # as the HDF5 reader maps its file
    view = np.frombuffer(m, np.uint8)
    _maps.huge_pages(m)
    assert "hg" in (_vm_flags(_addr(view)) or [])
    del view
    m.close()


def test_a_view_outlives_close_and_reads_the_same_bytes(store: Path) -> None:
    want = _expected(store)
    arr = ShardedArray(store / "images", strict=True)
    view, rows = arr.shard_views()[1], arr.shard_rows
    assert view is not None
    arr.close()
    del arr
    gc.collect()
    assert np.array_equal(view, want[rows : 2 * rows])  # the range is unmapped only with its last view


@pytest.mark.parametrize("how", ["unsupported", "refused"])
def test_shards_map_one_by_one_where_one_range_cannot_be_had(
    store: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    def refuse(sizes: object, open_file: object, align: int = 1, arena: object = None) -> None:
        if how == "refused":
            raise OSError(12, "cannot reserve address space")

    monkeypatch.setattr(_shard, "map_consecutive", refuse)
    arr = ShardedArray(store / "images", strict=True)
    assert all(isinstance(m, mmap.mmap) for m in arr._maps.values()) or not arr._maps
    got = arr.read_rows(0, N)
    assert all(isinstance(m, mmap.mmap) for m in arr._maps.values()) and len(arr._maps) == arr.n_shards
    assert np.array_equal(got, _expected(store))
    arr.close()


def test_an_empty_shard_file_is_named(store: Path, tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "s.zarr"
    shutil.copytree(store, copy)
    arr = ShardedArray(copy / "images", strict=True)
    (copy / "images" / arr.shard_key(2)).write_bytes(b"")
    with pytest.raises(dlpack.errors.StoreError, match=r"c/2.*the file is empty"):
        _ = ShardedArray(copy / "images", strict=True).index


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir() or _maps.libc() is None, reason="counts descriptors in /proc")
def test_one_shard_file_is_open_at_a_time(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A store may have more shards than a process may open files: each is closed once mapped
    (Python's ``mmap``, where one range cannot be had, keeps a descriptor of its own per map)."""
    want = _expected(store)
    seen: list[int] = []
    real = ShardedArray._open

    def counting(self: ShardedArray, s: int) -> int | None:
        seen.append(len(os.listdir("/proc/self/fd")))
        return real(self, s)

    monkeypatch.setattr(ShardedArray, "_open", counting)
    arr = ShardedArray(store / "images", strict=True)
    assert np.array_equal(arr.read_rows(0, N), want)
    assert len(seen) == 2 * arr.n_shards  # sizes first, then each mapped
    assert max(seen) == min(seen)  # nothing left open from one shard to the next
    arr.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inotify")
def test_all_unchanged_tells_an_event_on_any_arrays_file_in_one_look(store: Path, tmp_path: Path) -> None:
    import shutil

    arrays = []
    for k in range(3):
        copy = tmp_path / f"s{k}.zarr"
        shutil.copytree(store, copy)
        arrays.append(ShardedArray(copy / "images", strict=True))
        assert all(v is not None for v in arrays[-1].shard_views())  # mapped, so watched
    assert ShardedArray.all_unchanged(arrays) and all(a.unchanged() for a in arrays)
    os.utime(arrays[1].shard_file(1))  # an attribute change: the file may have been rewritten
    assert not ShardedArray.all_unchanged(arrays)
    assert arrays[0].unchanged() and not arrays[1].unchanged() and arrays[2].unchanged()
    assert ShardedArray.all_unchanged([arrays[0], arrays[2]])
    for a in arrays:
        a.close()


def test_a_shard_that_changes_while_the_store_opens_is_an_error(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil

    copy = tmp_path / "s.zarr"
    shutil.copytree(store, copy)
    arr = ShardedArray(copy / "images", strict=True)
    victim = copy / "images" / arr.shard_key(1)
    real = ShardedArray._size
    calls: list[int] = []

    def grow_after_the_first_look(self: ShardedArray, s: int, fd: int) -> int:
        calls.append(s)
        if s == 1 and calls.count(1) == 1:
            size = real(self, s, fd)
            with open(victim, "ab") as f:
                f.write(b"x" * 10)
            return size
        return real(self, s, fd)

    monkeypatch.setattr(ShardedArray, "_size", grow_after_the_first_look)
    with pytest.raises(dlpack.errors.StoreError, match=r"c/1/0/0/0 changed while the store was being opened"):
        _ = arr.index


def _mapped(start: int) -> bool:
    """Whether /proc/self/maps lists a mapping that contains address ``start``."""
    with open("/proc/self/maps", encoding="ascii") as f:
        for line in f:
            lo, hi = (int(v, 16) for v in line.split()[0].split("-"))
            if lo <= start < hi:
                return True
    return False


@pytest.mark.skipif(_maps.libc() is None or not os.path.exists("/proc/self/maps"), reason="Linux maps")
def test_a_stores_images_and_variants_are_mapped_in_one_range_with_nothing_else_between(
    store: Path, tmp_path: Path
) -> None:
    """A batch block allocated after the originals were mapped and before the variants cannot lie
    between them, so the one take over all of them writes straight into it (no copy, no row by row)."""
    import shutil

    examples = Path(__file__).resolve().parents[2] / "examples"
    copy = tmp_path / "v.zarr"
    shutil.copytree(store, copy)
    dlpack.augment(copy, k=2, config=examples / "augment_albumentations.json", seed=1, jobs=1, quiet=True)
    names = ["images", "images_v1", "images_v2"]
    with dlpack.open(copy) as ds:
        r = ds.reader
        first = r._stored("images")
        first.shard_views()
        between = np.empty(2**22, dtype=np.uint8)  # 4 MiB: a block of its own, placed by the kernel
        between[:] = 1
        arrays = [r._stored(n) for n in names]
        arena = arrays[0]._arena
        assert arena is not None and all(a._arena is arena for a in arrays)
        lo, hi = arena._base, arena._base + arena._size
        starts = []
        for a in arrays:
            views = [v for v in a.shard_views() if v is not None]
            assert all(lo <= _addr(v) and _addr(v) + v.nbytes <= hi for v in views)
            starts.append(_addr(views[0]))
        row = 64 * 64 * 3
        assert all((s - starts[0]) % row == 0 for s in starts)  # whole rows apart: one take of whole rows
        assert not (lo <= _addr(between) < hi)
        span = r._mix_plan(names)[0]
        assert span is not None and not np.may_share_memory(between, span._units)
        which = np.array([2, 0, 1, 2], dtype=np.int64)
        idx = np.array([7, 3, 29, 0], dtype=np.int64)
        out = between[: 4 * row].reshape(4, 64, 64, 3)
        r.read_into_from(names, which, idx, out)
        for k in range(4):
            want = ds[int(idx[k])]["image"] if which[k] == 0 else ds.variant(int(idx[k]), int(which[k]))["image"]
            assert np.array_equal(out[k], want)
        del arrays, first, span, views, a, r, arena
    del ds
    gc.collect()
    assert not _mapped(lo)  # the range goes with the store's last map


def _perms(start: int) -> str | None:
    with open("/proc/self/maps", encoding="ascii") as f:
        for line in f:
            lo, hi = (int(v, 16) for v in line.split()[0].split("-"))
            if lo <= start < hi:
                return line.split()[1]
    return None


@pytest.mark.skipif(
    _maps.libc() is None or not os.path.exists("/proc/self/maps") or mmap.PAGESIZE != 4096, reason="Linux, 4 KiB pages"
)
def test_an_arena_keeps_a_dropped_arrays_range_reserved_and_goes_with_its_last_map(tmp_path: Path) -> None:
    files = []
    for k in range(2):
        f = tmp_path / f"f{k}"
        f.write_bytes(bytes([k + 1]) * 5000)
        files.append(f)

    def opener(f: Path) -> Any:
        return lambda _k: os.open(f, os.O_RDONLY)

    arena = _maps.Arena(2)
    one = _maps.map_consecutive([5000], opener(files[0]), 1, arena)
    two = _maps.map_consecutive([5000], opener(files[1]), 1, arena)
    assert one is not None and two is not None
    a, b = _addr(one[0]), _addr(two[0])
    assert b - a == 2 * mmap.PAGESIZE and one[0][0] == 1 and two[0][-1] == 2  # carved one after the other
    assert a % _maps.HUGE == 0  # the arena starts on a huge page
    lo, hi = arena._base, arena._base + arena._size  # 2 x 2 pages and an eighth, in whole pages: 5
    assert hi - lo == 5 * mmap.PAGESIZE
    rest = _maps.map_consecutive([5000], opener(files[0]), 1, arena)
    assert rest is not None and not lo <= _addr(rest[0]) < hi  # no room left: a range of its own
    assert rest[0][0] == 1
    del rest
    del one
    gc.collect()
    assert _perms(a) == "---p"  # the file map is gone, the addresses stay the arena's
    assert two[0][0] == 2
    del arena, two
    gc.collect()
    assert _perms(a) is None and _perms(b) is None


@pytest.mark.skipif(_maps.libc() is None, reason="no C library mmap on this platform")
def test_threads_carving_one_arena_never_get_overlapping_ranges() -> None:
    from concurrent.futures import ThreadPoolExecutor

    arena = _maps.Arena(64)
    page = mmap.PAGESIZE
    arena.carve(page, page)  # reserved for 64 pages (and an eighth, rounded): room for 64 more
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda _: arena.carve(page, page), range(80)))
    starts = sorted(a for a in got if a is not None)
    assert len(starts) == arena._size // page - 1 and len(set(starts)) == len(starts)  # every page once
    assert all(b - a >= page for a, b in zip(starts, starts[1:], strict=False))
