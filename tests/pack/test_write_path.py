"""The build's write path makes no second pass over the images: the pixel statistics are counted
where each block is written, and the images' checksum reads each shard file back as it lands."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import dlpack
from dlpack.backends import ArraySpec, open_reader
from dlpack.errors import StoreError
from dlpack.pack.stats import add_moments, histograms, moments, pixel_stats, stats_from_moments

stats_module = importlib.import_module("dlpack.pack.stats")
write_module = importlib.import_module("dlpack.pack.write")
zarr_module = importlib.import_module("dlpack.backends._zarr")

MakeTree = Callable[..., Path]
SHARD = 2**16  # 18 images of 40x30x3 a block


def _tree(make_tree: MakeTree, n: int = 60) -> Path:
    return make_tree({f"c{k % 3}/{k:03d}.png": "rgb" for k in range(n)})


def test_histograms_count_every_value_and_add_up_over_any_split(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(3)
    block = rng.integers(0, 256, (7, 5, 4, 3), dtype=np.uint8)
    whole = histograms(block, 3, "|u1")
    want = np.stack([np.bincount(block[..., c].reshape(-1), minlength=256) for c in range(3)])
    np.testing.assert_array_equal(whole, want)
    np.testing.assert_array_equal(histograms(block[:2], 3, "|u1") + histograms(block[2:], 3, "|u1"), whole)
    monkeypatch.setattr(stats_module, "CHUNK_VALUES", 7)  # chunks of two pixels: the same counts
    np.testing.assert_array_equal(histograms(block, 3, "|u1"), whole)
    gray = rng.integers(0, 65536, (3, 4, 4, 1), dtype=np.uint16)
    counts = histograms(gray, 1, "<u2")
    assert counts.shape == (1, 65536) and counts.sum() == gray.size
    np.testing.assert_array_equal(counts[0], np.bincount(gray.reshape(-1), minlength=65536))


def _exact(block: np.ndarray, channels: int) -> tuple[tuple[int, int, int], ...]:
    flat = block.reshape(-1, channels).astype(np.int64)
    return tuple((len(flat), int(flat[:, c].sum()), int((flat[:, c] ** 2).sum())) for c in range(channels))


@pytest.mark.parametrize("channels", [1, 3, 4])
def test_moments_are_exact_and_add_up_over_any_split(channels: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(channels)
    block = rng.integers(0, 256, (6, 33, 17, channels), dtype=np.uint8)
    block[0] = 255  # the largest squares, and a constant image (no spread) beside the noise
    block[1] = 0
    whole = moments(block, channels, "|u1")
    assert whole == _exact(block, channels)
    assert add_moments(moments(block[:2], channels, "|u1"), moments(block[2:], channels, "|u1")) == whole
    monkeypatch.setattr(stats_module, "CHUNK_VALUES", 5 * channels)  # chunks of five pixels: the same moments
    assert moments(block, channels, "|u1") == whole
    wide = rng.integers(0, 65536, (2, 9, 7, channels), dtype=np.uint16)
    assert moments(wide, channels, "<u2") == _exact(wide, channels)  # counted by histograms


def test_moments_count_a_chunk_again_when_opencvs_figures_are_not_integers(monkeypatch: pytest.MonkeyPatch) -> None:
    block = np.random.default_rng(7).integers(0, 256, (3, 20, 20, 3), dtype=np.uint8)
    real = stats_module.cv2.meanStdDev

    def off(part: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        mean, std = real(part)
        return mean + 0.4 / len(part), std  # a sum 0.4 away from any integer

    monkeypatch.setattr(stats_module.cv2, "meanStdDev", off)
    assert moments(block, 3, "|u1") == _exact(block, 3)


def test_stats_from_moments_match_numpy_and_an_empty_store() -> None:
    block = np.random.default_rng(2).integers(0, 256, (4, 8, 8, 3), dtype=np.uint8)
    stats = stats_from_moments(moments(block, 3, "|u1"))
    np.testing.assert_allclose(stats["mean"], block.reshape(-1, 3).mean(axis=0), rtol=1e-14)
    np.testing.assert_allclose(stats["std"], block.reshape(-1, 3).std(axis=0), rtol=1e-12)
    assert stats["count"] == 4 * 8 * 8
    assert stats_from_moments(((0, 0, 0),)) == {"mean": [0.0], "std": [0.0], "count": 0}


@pytest.mark.parametrize("jobs", [1, 2])
def test_the_pixel_stats_are_counted_as_the_blocks_are_written_not_read_back(
    jobs: int, make_tree: MakeTree, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, snapshot: Any
) -> None:
    def no_read_back(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the commit read the images back for their statistics")

    monkeypatch.setattr(stats_module, "pixel_stats", no_read_back)
    src = _tree(make_tree)
    out = tmp_path / "o.zarr"
    dlpack.build(src, out, jobs=jobs, force_jobs=True, quiet=True, shard_bytes=SHARD)
    monkeypatch.undo()
    with dlpack.open(out) as ds:
        images = np.stack([ds[i]["image"] for i in range(len(ds))])
        recorded = ds.stats
    assert recorded == pixel_stats(lambda a, b: images[a:b], len(images), images[0].size, 3, "|u1")
    # A build whose counts are switched off reads the images back: the same store, byte for byte.
    monkeypatch.setattr(write_module._PixelCounts, "add", lambda self, counts: setattr(self, "on", False))
    ref = tmp_path / "ref.zarr"
    dlpack.build(src, ref, jobs=1, quiet=True, shard_bytes=SHARD)
    assert snapshot(out) == snapshot(ref)


def test_counts_that_miss_a_block_are_not_used() -> None:
    counts = write_module._PixelCounts()
    one = ((10, 70, 490),) * 3  # a block of 10 pixels of value 7
    counts.add(one)
    counts.add(one)
    assert counts.total(30) is None  # 20 of 30 pixels counted: a block is missing
    assert counts.total(20) == ((20, 140, 980),) * 3
    counts.add(None)  # a block that was not counted
    counts.add(one)
    assert counts.total(30) is None


def _writer(path: Path, count: int, shard_bytes: int = 2**16) -> Any:
    writer = zarr_module.ZarrBackend.open_writer(path, "w-", shard_bytes)
    writer.open()
    writer.create_array(ArraySpec("images", "|u1", (64, 64, 3)), count)
    return writer


def test_read_written_reads_a_raw_shard_file_as_read_block_reads_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(5)
    rows = rng.integers(0, 256, (12, 64, 64, 3), dtype=np.uint8)  # 5 rows a shard
    writer = _writer(tmp_path / "s.zarr", len(rows))
    step = writer.shard_rows("images")
    assert 1 < step < len(rows) and len(rows) % step  # a short last shard too
    for s in range(0, len(rows), step):
        writer.write_block("images", s, rows[s : s + step])
    want = {s: writer.read_block("images", s, min(len(rows), s + step)) for s in range(0, len(rows), step)}

    def no_zarr(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("read through zarr-python")

    monkeypatch.setattr(zarr_module.ZarrWriter, "_read_rows", no_zarr)
    for s, block in want.items():
        got = writer.read_written("images", s, min(len(rows), s + step))
        np.testing.assert_array_equal(got, block)
        np.testing.assert_array_equal(got, rows[s : s + step])
    monkeypatch.undo()
    # Not one whole shard: read as read_block reads it.
    np.testing.assert_array_equal(writer.read_written("images", 1, 3), rows[1:3])
    writer.abort()


def test_read_written_refuses_a_truncated_shard(tmp_path: Path) -> None:
    rows = np.ones((12, 64, 64, 3), dtype=np.uint8)
    writer = _writer(tmp_path / "t.zarr", len(rows))
    step = writer.shard_rows("images")
    writer.write_block("images", 0, rows[:step])
    shard = next(p for p in (tmp_path / "t.zarr" / "images" / "c").rglob("*") if p.is_file())
    shard.write_bytes(shard.read_bytes()[:100])
    with pytest.raises(StoreError, match="truncated"):
        writer.read_written("images", 0, step)
    shard.unlink()
    with pytest.raises(StoreError, match="cannot be read"):
        writer.read_written("images", 0, step)
    writer.abort()


def test_jobs_2_checksums_the_images_without_zarr_python(
    make_tree: MakeTree, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The build process reads each landed block back for the checksum from its shard file."""
    read: list[tuple[int, int]] = []
    real = zarr_module.ZarrWriter._read_rows

    def spy(self: Any, name: str, start: int, stop: int) -> Any:
        if name == "images":
            read.append((start, stop))
        return real(self, name, start, stop)

    monkeypatch.setattr(zarr_module.ZarrWriter, "_read_rows", spy)
    out = tmp_path / "o.zarr"
    dlpack.build(_tree(make_tree), out, jobs=2, force_jobs=True, quiet=True, shard_bytes=SHARD)
    assert read == []
    with open_reader(out) as reader:
        assert reader.verify_arrays() == []
