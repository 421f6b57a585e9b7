"""Store gathers: every path of ``StoreReader.gather`` gives the bytes a plain per-image read gives.

The paths: one take over every shard map (:class:`RowSpan`, rows whose size splits into a few
page-aligned pieces), shard by shard through a scratch buffer (other small rows), row by row (rows
of 64 KiB or more), a single mapped dataset (HDF5), the backend's own reads (compressed stores).
"""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest

import dlpack
from dlpack import _maps
from dlpack.backends import _shard, gather
from dlpack.backends.gather import _ALIAS_GAP, _PAGE, MixSpan, RowSpan, _scratch, gather_rows
from dlpack.errors import OptionError

N = 41
#: (side, channels): 12 KiB rows, 4,800-byte rows and 65,712-byte rows; shards of 64 KiB hold 5, 13
#: and 1 of them. Mapped one by one: the span in 3 pieces, the scratch path (75 pieces), row by row.
SHAPES = ((64, 3), (40, 3), (148, 3))


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("gather")
    out: dict[str, Path] = {}
    for side, ch in SHAPES:
        src = tmp / f"png{side}"
        for i in range(N):
            img = np.random.default_rng([7, side, i]).integers(0, 256, (side, side, ch), dtype=np.uint8)
            d = src / f"c{i % 3}"
            d.mkdir(parents=True, exist_ok=True)
            assert cv2.imwrite(str(d / f"{i:03d}.png"), img)
        for suffix in (".zarr", ".h5"):
            for comp in ("none", "lz4"):
                path = tmp / f"s{side}-{comp}{suffix}"
                dlpack.build(src, path, size=(side, side), channels=ch, compression=comp, shard_bytes=2**16, quiet=True)
                out[f"{side}-{comp}{suffix}"] = path
    return out


def _orders(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {
        "random": rng.permutation(N),
        "sorted": np.arange(N),
        "reversed": np.arange(N)[::-1].copy(),
        "repeated": np.array([5, 5, 40, 0, 5, 20, 40]),
        "across two shards": np.array([4, 5, 6, 3]),
        "last partial shard": np.array([40, 39]),
        "one": np.array([17]),
        "long": rng.integers(0, N, 3000),  # several batches at once
        "empty": np.array([], dtype=np.int64),
    }


@pytest.fixture(params=["one range", "one by one"])
def maps(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Zarr shards mapped end to end in one range (whole rows apart: every batch is one take), or
    one map each, as where the platform cannot (the per-shard paths: pieces, scratch, row by row)."""
    if request.param == "one by one":
        monkeypatch.setattr(_shard, "map_consecutive", lambda sizes, open_file, align=1, arena=None: None)
    return str(request.param)


#: The stores of one-row shards (side 148) take seconds: `make test-fast` leaves them out (the 64 and 40 px
#: stores keep the mapped span, the pieces and the scratch path in it; the row-by-row path is in the full suite).
KEYS = [
    pytest.param(key, marks=pytest.mark.slow) if key.startswith("148-") else key
    for key in (f"{s}-{c}{x}" for s, _ in SHAPES for c in ("none", "lz4") for x in (".zarr", ".h5"))
]


@pytest.mark.parametrize("key", KEYS)
def test_gather_equals_per_image_reads(stores: dict[str, Path], key: str, maps: str) -> None:
    ds = dlpack.open(stores[key])
    r = ds.reader
    ref = np.stack([r.read("images", i) for i in range(N)])
    assert ref.any()
    for name, idx in _orders(np.random.default_rng(3)).items():
        idx = idx.astype(np.int64)
        out = np.zeros((len(idx) + 2, *ref.shape[1:]), dtype=ref.dtype)
        assert r.gather("images", idx, out) is out
        assert np.array_equal(out[: len(idx)], ref[idx]), name
        assert not out[len(idx) :].any(), name  # nothing written past the batch
        again = np.zeros_like(out)
        r.read_into("images", idx, again)
        assert np.array_equal(again[: len(idx)], ref[idx]), name
        assert np.array_equal(ds.get_batch(idx)["image"], ref[idx]), name


def test_which_path_each_store_takes(stores: dict[str, Path], maps: str) -> None:
    """Mapped in one range, every raw Zarr store has a span of whole rows; mapped one by one, the
    small-row store only (in pieces): the test above covers every path."""
    for side, _ in SHAPES:
        got = {x: dlpack.open(stores[f"{side}-none{x}"]).reader._row_span("images") for x in (".zarr", ".h5")}
        assert got[".h5"] is None  # one mapped dataset: a single take already
        span = got[".zarr"]
        if maps == "one range" and _maps.libc() is not None:
            assert span is not None and span._step == 1, side
        else:
            assert (span is not None) == (side == 64), side
    assert dlpack.open(stores["64-lz4.zarr"]).reader._row_span("images") is None  # decoded, not mapped


def test_a_span_outlives_the_readers_close(stores: dict[str, Path]) -> None:
    """The span keeps its shard maps: a batch in flight while the reader closes reads the same bytes."""
    r = dlpack.open(stores["64-none.zarr"]).reader
    ref = np.stack([r.read("images", i) for i in range(N)])
    span = r._row_span("images")
    assert span is not None
    r.close()
    idx = np.random.default_rng(4).permutation(N).astype(np.int64)
    out = np.empty((N, *ref.shape[1:]), dtype=ref.dtype)
    assert span.gather(idx, out)
    assert np.array_equal(out, ref[idx])


def _views(
    rows: int, row_shape: tuple[int, ...], per: int, pages: int, seed: int = 0
) -> tuple[np.ndarray, list[np.ndarray]]:
    """``rows`` random rows as views of ``per`` rows placed ``pages`` pages apart in one block (as
    shard maps lie apart in memory): the row span's unit is ``gcd(row bytes, pages * 4096)``."""
    whole = np.random.default_rng(seed).integers(0, 256, (rows, *row_shape), dtype=np.uint8)
    count = -(-rows // per)
    assert whole[:per].nbytes <= pages * _PAGE
    block = np.empty((count * pages + 1) * _PAGE, dtype=np.uint8)
    base = -block.__array_interface__["data"][0] % _PAGE
    views = []
    for v, s in enumerate(range(0, rows, per)):
        part = whole[s : s + per]
        at = base + v * pages * _PAGE
        view = block[at : at + part.nbytes].reshape(part.shape)
        view[...] = part
        views.append(view)
    return whole, views


def test_row_span_gathers_across_views_in_one_take() -> None:
    whole, views = _views(50, (16, 16, 3), 7, pages=2)  # 768-byte rows 8,192 bytes apart: 3 pieces of 256
    span = RowSpan.of(views, 7)
    assert span is not None and span._step == 3
    rng = np.random.default_rng(5)
    for k in (1, 2, 49, 50, 4000):
        idx = rng.integers(0, 50, k).astype(np.int64)
        out = np.zeros((k, 16, 16, 3), dtype=np.uint8)
        assert span.gather(idx, out)
        assert np.array_equal(out, whole[idx])
        again = np.zeros_like(out)
        assert np.array_equal(gather_rows(views, 7, idx, again, span), whole[idx])
        assert np.array_equal(gather_rows(views, 7, idx, np.zeros_like(out)), whole[idx])  # the scratch path


@pytest.mark.parametrize("table", [True, False])
def test_row_span_refuses_indices_outside_its_rows(monkeypatch: pytest.MonkeyPatch, table: bool) -> None:
    """An unchecked index would read memory between the maps: it is an error, never a read (with
    the table of whole rows' places, and with the arithmetic over shards of larger spans)."""
    if not table:
        monkeypatch.setattr(gather, "_LOOKUP_ROWS", 0)
    _, views = _views(20, (8, 8, 4), 6, pages=1)
    span = RowSpan.of(views, 6)
    assert span is not None and (span._at is not None) == table
    out = np.zeros((3, 8, 8, 4), dtype=np.uint8)
    for bad in (20, 10**9, -(10**9)) if table else (20, -1, 10**9):
        with pytest.raises(OptionError, match=f"sample index {bad} is out of range"):
            span.gather(np.array([0, bad, 1], dtype=np.int64), out)
        assert not out.any()
    if table:  # every entry of the table is a stored row: -1 is the last one, as in NumPy
        whole = np.concatenate(views)
        assert span.gather(np.array([0, -1, 1], dtype=np.int64), out)
        assert np.array_equal(out, whole[[0, 19, 1]])


def test_row_span_table_and_arithmetic_read_the_same_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whole rows (4 KiB, a page apart) through the table of their places and through the shard
    arithmetic, for every row and in a random order: the same bytes."""
    whole, views = _views(23, (32, 32, 4), 5, pages=6)
    table = RowSpan.of(views, 5)
    monkeypatch.setattr(gather, "_LOOKUP_ROWS", 0)
    arithmetic = RowSpan.of(views, 5)
    assert table is not None and table._at is not None and table._step == 1
    assert arithmetic is not None and arithmetic._at is None
    idx = np.random.default_rng(2).permutation(np.repeat(np.arange(23), 2)).astype(np.int64)
    for span in (table, arithmetic):
        out = np.zeros((len(idx), 32, 32, 4), dtype=np.uint8)
        assert span.gather(idx, out) and np.array_equal(out, whole[idx])


def test_row_span_declines_what_it_cannot_write_in_place() -> None:
    whole, views = _views(20, (8, 8, 4), 6, pages=1)
    span = RowSpan.of(views, 6)
    assert span is not None
    idx = np.array([19, 0, 7], dtype=np.int64)
    strided = np.zeros((6, 8, 8, 4), dtype=np.uint8)[::2]
    assert not span.gather(idx, strided) and not strided.any()
    assert not span.gather(idx, np.zeros((3, 8, 8, 4), dtype=np.int16))
    assert np.array_equal(gather_rows(views, 6, idx, strided, span), whole[idx])  # the other paths then


def test_row_span_declines_an_out_that_lies_between_its_views() -> None:
    """Memory in a gap between the views (an allocation made after the maps) is inside the span's
    address range: NumPy's take would gather into a temporary copy there, so the span declines it
    and the rows come the view-by-view way, equal all the same."""
    rows, side = 10, (8, 8, 4)
    block = np.zeros((3 * rows, *side), dtype=np.uint8)
    block[:rows] = np.arange(rows * 256, dtype=np.uint32).astype(np.uint8).reshape(rows, *side)
    block[2 * rows :] = 255 - block[:rows]
    views = [block[:rows], block[2 * rows :]]  # a gap of `rows` rows between the two
    span = RowSpan.of(views, rows)
    assert span is not None
    idx = np.array([19, 0, 12, 3], dtype=np.int64)
    want = np.concatenate(views)[idx]
    in_gap = block[rows : rows + len(idx)]
    assert not span.gather(idx, in_gap) and not in_gap.any()
    assert np.array_equal(gather_rows(views, rows, idx, in_gap, span), want)
    elsewhere = np.zeros_like(in_gap)
    assert span.gather(idx, elsewhere) and np.array_equal(elsewhere, want)


def test_row_span_only_where_one_take_pays() -> None:
    _, views = _views(14, (8, 8, 4), 6, pages=1)
    assert RowSpan.of(views, 6) is not None
    assert RowSpan.of(views[:1], 6) is None  # one view: a plain take
    assert RowSpan.of(views[::-1], 6) is None  # a short view before the last: not a store's shards
    whole, large = _views(4, (128, 128, 4), 2, pages=32)
    span = RowSpan.of(large, 2)  # 64 KiB rows a whole number of rows apart: one take of whole rows
    assert span is not None and span._step == 1
    out = np.empty((4, 128, 128, 4), dtype=np.uint8)
    assert span.gather(np.array([3, 0, 2, 1]), out) and np.array_equal(out, whole[[3, 0, 2, 1]])
    _, apart = _views(4, (128, 128, 4), 2, pages=33)
    assert RowSpan.of(apart, 2) is None  # 64 KiB rows in 16 pieces each go row by row
    _, odd = _views(12, (10, 10, 3), 6, pages=2)
    assert RowSpan.of(odd, 6) is None  # 300-byte rows 8,192 bytes apart would be copied in 75 pieces


def _arrays(
    n: int, row_shape: tuple[int, ...], per: int, pages: int, count: int, gap: int = 0
) -> tuple[list[np.ndarray], list]:
    """``count`` arrays of ``n`` random rows, each as views of ``per`` rows ``pages`` pages apart
    (as :func:`_views`), the arrays one after another in one block, ``gap`` pages between them (where
    other memory may lie: each array of a store is mapped in one range, the arrays one by one)."""
    wholes = [np.random.default_rng(u).integers(0, 256, (n, *row_shape), dtype=np.uint8) for u in range(count)]
    shards = -(-n // per)
    block = np.empty((count * (shards * pages + gap) + 1) * _PAGE, dtype=np.uint8)
    at = -block.__array_interface__["data"][0] % _PAGE
    sources = []
    for whole in wholes:
        views = []
        for s in range(0, n, per):
            part = whole[s : s + per]
            view = block[at : at + part.nbytes].reshape(part.shape)
            view[...] = part
            views.append(view)
            at += pages * _PAGE
        sources.append((views, per))
        at += gap * _PAGE
    return wholes, sources


@pytest.mark.parametrize("table", [True, False])
def test_mix_span_gathers_rows_of_several_arrays_in_one_take(monkeypatch: pytest.MonkeyPatch, table: bool) -> None:
    """Row ``idx[k]`` of array ``which[k]``, through the table of the rows' places and through the
    arithmetic over views: the rows a per-row read gives, for any mix and any order."""
    if not table:
        monkeypatch.setattr(gather, "_LOOKUP_ROWS", 0)
    wholes, sources = _arrays(23, (16, 16, 3), 5, pages=1, count=4)  # 768-byte rows: a few pieces each
    span = MixSpan.of(sources, 23)
    assert span is not None and (span._at is not None) == table
    rng = np.random.default_rng(3)
    for k in (1, 2, 23, 300):
        which = rng.integers(0, 4, k).astype(np.int64)
        idx = rng.integers(0, 23, k).astype(np.int64)
        out = np.zeros((k, 16, 16, 3), dtype=np.uint8)
        assert span.gather(which, idx, out)
        assert np.array_equal(out, np.stack([wholes[w][i] for w, i in zip(which, idx, strict=True)]))


def test_mix_span_declines_what_it_cannot_write_in_place_and_where_a_take_does_not_pay() -> None:
    wholes, sources = _arrays(12, (8, 8, 4), 6, pages=1, count=2)
    span = MixSpan.of(sources, 12)
    assert span is not None
    which, idx = np.array([1, 0, 1], dtype=np.int64), np.array([11, 0, 6], dtype=np.int64)
    strided = np.zeros((6, 8, 8, 4), dtype=np.uint8)[::2]
    assert not span.gather(which, idx, strided) and not strided.any()
    assert not span.gather(which, idx, np.zeros((3, 8, 8, 4), dtype=np.int16))
    inside = sources[0][0][0][:3]  # rows of a view: inside the span's address range
    assert not span.gather(which, idx, inside)
    assert MixSpan.of(sources[:1], 12) is None  # one array: the plain gather
    assert MixSpan.of(sources, 13) is None  # not n rows each
    _, large = _arrays(4, (128, 128, 4), 2, pages=33, count=2)
    assert MixSpan.of(large, 4) is None  # 64 KiB rows in pieces: row by row


def test_mix_span_gathers_into_a_batch_that_lies_between_two_arrays() -> None:
    """A batch block allocated after one array was mapped and before the next lies inside the
    span's address range: the rows come through a buffer beside it (one take and one copy)."""
    wholes, sources = _arrays(10, (16, 16, 3), 5, pages=1, count=3, gap=4)
    span = MixSpan.of(sources, 10)
    assert span is not None
    last = sources[0][0][-1]  # the first array's last view: the gap starts a page after it
    start = int(last.__array_interface__["data"][0]) + _PAGE
    base = last.base if last.base is not None else last
    offset = start - int(base.__array_interface__["data"][0])
    rng = np.random.default_rng(9)
    which = rng.integers(0, 3, 5).astype(np.int64)
    idx = rng.integers(0, 10, 5).astype(np.int64)
    out = base[offset : offset + 5 * 768].reshape(5, 16, 16, 3)  # in the gap: inside the span
    assert np.may_share_memory(out, span._units)
    assert span.gather(which, idx, out)
    assert np.array_equal(out, np.stack([wholes[w][i] for w, i in zip(which, idx, strict=True)]))
    for whole, (views, _) in zip(wholes, sources, strict=True):  # no stored row was touched
        assert np.array_equal(np.concatenate(views), whole)
    wholes, sources = _arrays(4, (128, 128, 4), 1, pages=16, count=2, gap=16)  # 64 KiB rows
    span = MixSpan.of(sources, 4)
    assert span is not None
    last = sources[0][0][-1]
    base = last.base if last.base is not None else last
    offset = int(last.__array_interface__["data"][0]) + 16 * _PAGE - int(base.__array_interface__["data"][0])
    out = base[offset : offset + 65536].reshape(1, 128, 128, 4)
    assert not span.gather(np.array([1]), np.array([2]), out)  # large rows: row by row, by the caller


def test_scratch_sits_off_its_source_in_the_page() -> None:
    """A buffer a few bytes past its source modulo 4096 makes the copy several times slower."""
    for near in (0, 16, 3000, 4096 * 7 + 5):
        buf = _scratch((5, 12, 3), np.dtype(np.uint8), near)
        assert buf.shape == (5, 12, 3) and buf.flags.c_contiguous
        assert (buf.__array_interface__["data"][0] - near) % _PAGE == _ALIAS_GAP
    wide = _scratch((3, 2), np.dtype(np.float32), 0)
    assert wide.dtype == np.float32 and (wide.__array_interface__["data"][0] % _PAGE) == _ALIAS_GAP


def test_sources_and_lazy_sources_are_one_path(stores: dict[str, Path]) -> None:
    r = dlpack.open(stores["40-none.zarr"]).reader
    idx = np.array([40, 0, 7, 7], dtype=np.int64)
    eager = r.sources(idx.tolist())
    assert eager == list(r.lazy_sources(idx)) == [r.source(int(i)) for i in idx]
    assert r.sources(idx) == eager and isinstance(eager, list) and all(isinstance(p, str) for p in eager)
    assert eager[2] == eager[3] and len(set(eager)) == 3 and all(p.endswith(".png") for p in eager)
    assert r.sources([]) == []
