"""One conformance suite, run against every store backend (the ``backend`` fixture).

Whatever the backend, ``dlpack.open`` must give back exactly what a build put in, checked against
an independent decode of the source files, and the store must read the same with plain
zarr-python or h5py (the format is standard).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import cv2
import h5py
import numpy as np
import pytest
import zarr
from _stores import rewrite_manifest

import dlpack
from dlpack import Dataset, FormatVersionError, Manifest

RGB_TREE = {
    "cat/0.png": "rgb",
    "cat/1.jpg": "rgb",
    "cat/2.bmp": "rgb",
    "dog/3.tif": "rgb",
    "dog/4.webp": "rgb",
    "dog/5.ppm": "rgb",
}
SOURCES = sorted(RGB_TREE)
#: Stretch target (W, H): uneven, non-integer factors, so area and linear interpolation differ.
STRETCH = (25, 17)


def build_open(src: Path, out: Path, **options: Any) -> Dataset:
    dlpack.build(src, out, quiet=True, jobs=1, **options)
    return dlpack.open(out)


def plain_read(path: Path, name: str, index: Any = ()) -> np.ndarray:
    """``name[index]`` read with zarr-python or h5py alone (no dlpack code)."""
    if path.suffix == ".zarr":
        return np.asarray(zarr.open_group(str(path), mode="r")[name][index])
    import hdf5plugin  # noqa: F401 - registers the Blosc/Zstd filters with h5py

    with h5py.File(path, "r") as f:
        return np.asarray(f[name][index])


@pytest.fixture
def rgb_store(make_tree: Callable[..., Path], tmp_path: Path, backend: str) -> Dataset:
    """Six RGB 40x30 images in two classes, one per input format, stretched to 25x17."""
    return build_open(make_tree(RGB_TREE), tmp_path / backend, size=STRETCH)


# ---------------------------------------------------------------- indexing


def test_len_is_number_of_images(rgb_store: Dataset) -> None:
    assert len(rgb_store) == 6


def test_classes_are_sorted_folder_names(rgb_store: Dataset) -> None:
    assert rgb_store.classes == ("cat", "dog")


def test_sample_has_image_label_index_source(rgb_store: Dataset) -> None:
    assert set(rgb_store[0]) == {"image", "label", "index", "source"}


def test_samples_follow_sorted_source_paths(rgb_store: Dataset) -> None:
    assert [rgb_store[i]["source"] for i in range(len(rgb_store))] == SOURCES


def test_labels_index_the_class_of_each_source(rgb_store: Dataset) -> None:
    for i, rel in enumerate(SOURCES):
        s = rgb_store[i]
        assert (s["index"], s["label"]) == (i, rgb_store.classes.index(rel.split("/")[0]))


def test_negative_index_counts_from_the_end(rgb_store: Dataset) -> None:
    assert rgb_store[-1]["index"] == len(rgb_store) - 1


def test_index_past_the_end_raises_index_error(rgb_store: Dataset) -> None:
    with pytest.raises(IndexError, match="out of range"):
        rgb_store[len(rgb_store)]


def test_get_batch_stacks_samples(rgb_store: Dataset) -> None:
    idx = [5, 0, 3]
    batch = rgb_store.get_batch(idx)
    assert batch["image"].shape == (3, 17, 25, 3)
    for k, i in enumerate(idx):
        assert np.array_equal(batch["image"][k], rgb_store[i]["image"])
    assert batch["label"].tolist() == [rgb_store[i]["label"] for i in idx]
    assert batch["index"].tolist() == idx
    assert batch["source"] == [SOURCES[i] for i in idx]


def test_get_batch_fills_the_given_buffer(rgb_store: Dataset) -> None:
    out = np.zeros((4, 17, 25, 3), np.uint8)
    batch = rgb_store.get_batch([1, 2], out=out)
    assert np.array_equal(out[0], rgb_store[1]["image"])
    assert np.array_equal(out[1], rgb_store[2]["image"])
    assert np.shares_memory(batch["image"], out)


# ---------------------------------------------------------------- pixels and geometry


def test_stretch_pixels_equal_reference_decode(rgb_store: Dataset, tmp_path: Path, images: Any) -> None:
    for i, rel in enumerate(SOURCES):
        expected = images.reference(tmp_path / "src" / rel, STRETCH)
        assert np.array_equal(rgb_store[i]["image"], expected), rel


def test_stretch_records_scale_and_original_size(rgb_store: Dataset) -> None:
    assert rgb_store.reader.meta("transform").tolist() == [[17 / 30, 25 / 40, 0.0, 0.0]] * 6
    assert rgb_store.reader.meta("original_size").tolist() == [[30, 40]] * 6


@pytest.fixture
def fit_store(make_tree: Callable[..., Path], tmp_path: Path, backend: str) -> Dataset:
    """A 40x30 and a 30x40 image fitted into 25x25: scale 0.625, resized to 25x19 / 19x25, offset 3."""
    src = make_tree({"a/tall.png": ("rgb", 30, 40), "a/wide.png": ("rgb", 40, 30)})
    return build_open(src, tmp_path / backend, size=(25, 25), resize="fit")


def test_fit_pads_wide_image_top_and_bottom(fit_store: Dataset, tmp_path: Path, images: Any) -> None:
    img = fit_store[1]["image"]
    assert img.shape == (25, 25, 3)
    assert np.array_equal(img[3:22], images.reference(tmp_path / "src/a/wide.png", (25, 19)))
    assert not img[:3].any() and not img[22:].any()


def test_fit_pads_tall_image_left_and_right(fit_store: Dataset, tmp_path: Path, images: Any) -> None:
    img = fit_store[0]["image"]
    assert np.array_equal(img[:, 3:22], images.reference(tmp_path / "src/a/tall.png", (19, 25)))
    assert not img[:, :3].any() and not img[:, 22:].any()


def test_fit_records_scale_offset_and_original_size(fit_store: Dataset) -> None:
    # (scale_y, scale_x, offset_y, offset_x) per sample; tall first (sorted paths).
    expected = [[25 / 40, 19 / 30, 0.0, 3.0], [19 / 30, 25 / 40, 3.0, 0.0]]
    assert fit_store.reader.meta("transform").tolist() == expected
    assert fit_store.reader.meta("original_size").tolist() == [[40, 30], [30, 40]]


MIXED_SIZES = {"a/big.png": ("rgb", 40, 30), "a/small.png": ("rgb", 20, 10), "b/square.jpg": ("rgb", 16, 16)}


def test_resize_none_keeps_each_original_size(
    make_tree: Callable[..., Path], tmp_path: Path, backend: str, images: Any
) -> None:
    ds = build_open(make_tree(MIXED_SIZES), tmp_path / backend, resize="none")
    assert ds.manifest.image.layout == "variable"
    for i, rel in enumerate(sorted(MIXED_SIZES)):
        assert np.array_equal(ds[i]["image"], images.reference(tmp_path / "src" / rel)), rel


def test_variable_store_batch_is_a_list(make_tree: Callable[..., Path], tmp_path: Path, backend: str) -> None:
    ds = build_open(make_tree(MIXED_SIZES), tmp_path / backend, resize="none")
    batch = ds.get_batch([2, 0])
    assert [im.shape for im in batch["image"]] == [(16, 16, 3), (30, 40, 3)]


def test_max_side_shrinks_only_larger_images(
    make_tree: Callable[..., Path], tmp_path: Path, backend: str, images: Any
) -> None:
    ds = build_open(make_tree(MIXED_SIZES), tmp_path / backend, max_side=25)
    assert [ds[i]["image"].shape for i in range(3)] == [(19, 25, 3), (10, 20, 3), (16, 16, 3)]
    assert np.array_equal(ds[0]["image"], images.reference(tmp_path / "src/a/big.png", (25, 19)))
    assert np.array_equal(ds[1]["image"], images.reference(tmp_path / "src/a/small.png"))
    assert ds.reader.meta("transform")[:, :2].tolist() == [[19 / 30, 25 / 40], [1.0, 1.0], [1.0, 1.0]]


def test_variable_images_straddling_chunks_round_trip(
    make_tree: Callable[..., Path], tmp_path: Path, backend: str, images: Any
) -> None:
    # 120 000-element images: several share one 2**18-element chunk and some cross chunk boundaries.
    spec = {f"a/{k}.png": ("rgb", 200 - k, 150 - k) for k in range(6)}
    ds = build_open(make_tree(spec), tmp_path / backend, resize="none", shard_bytes=2**16)
    for i, rel in enumerate(sorted(spec)):
        assert np.array_equal(ds[i]["image"], images.reference(tmp_path / "src" / rel)), rel


def test_many_shards_round_trip(make_tree: Callable[..., Path], tmp_path: Path, backend: str, images: Any) -> None:
    # 3600-byte images, 64 KiB shards: 18 images per shard, the last shard partly filled.
    spec = {f"a/{k:02d}.png": "rgb" for k in range(25)}
    ds = build_open(make_tree(spec), tmp_path / backend, shard_bytes=2**16)
    assert ds.manifest.shard_rows == 18
    expected = [images.reference(tmp_path / "src" / rel) for rel in sorted(spec)]
    for i in range(25):
        assert np.array_equal(ds[i]["image"], expected[i]), i
    batch = ds.get_batch([24, 17, 18, 0])
    assert all(np.array_equal(batch["image"][k], expected[i]) for k, i in enumerate([24, 17, 18, 0]))


def test_sixteen_bit_input_is_stored_as_uint16(
    make_tree: Callable[..., Path], tmp_path: Path, backend: str, images: Any
) -> None:
    spec = {"a/0.png": "rgb16", "a/1.tif": "rgb16", "a/2.png": "rgb16"}
    ds = build_open(make_tree(spec), tmp_path / backend)
    assert ds.manifest.image.dtype == "<u2"
    for i, rel in enumerate(sorted(spec)):
        img = ds[i]["image"]
        assert img.dtype == np.uint16 and img.max() > 255
        assert np.array_equal(img, images.reference(tmp_path / "src" / rel)), rel


def test_all_gray_input_gives_one_channel_store(
    make_tree: Callable[..., Path], tmp_path: Path, backend: str, images: Any
) -> None:
    spec = {"a/0.png": "gray", "a/1.pgm": "gray", "a/2.jpg": "gray"}
    ds = build_open(make_tree(spec), tmp_path / backend)
    assert ds.manifest.image.channels == 1
    for i, rel in enumerate(sorted(spec)):
        assert np.array_equal(ds[i]["image"], images.reference(tmp_path / "src" / rel)), rel


@pytest.mark.parametrize("compression", ["lz4", "zstd"])
def test_compressed_store_round_trips_exactly(
    make_tree: Callable[..., Path], tmp_path: Path, backend: str, images: Any, compression: str
) -> None:
    ds = build_open(make_tree(RGB_TREE), tmp_path / backend, size=STRETCH, compression=compression)
    assert ds.manifest.compression == compression
    for i, rel in enumerate(SOURCES):
        assert np.array_equal(ds[i]["image"], images.reference(tmp_path / "src" / rel, STRETCH)), rel
    assert np.array_equal(ds.get_batch([4, 1])["image"][1], ds[1]["image"])


@pytest.mark.parametrize("compression", ["lz4", "zstd"])
def test_compressed_variable_store_round_trips_exactly(
    make_tree: Callable[..., Path], tmp_path: Path, backend: str, images: Any, compression: str
) -> None:
    ds = build_open(make_tree(MIXED_SIZES), tmp_path / backend, resize="none", compression=compression)
    for i, rel in enumerate(sorted(MIXED_SIZES)):
        assert np.array_equal(ds[i]["image"], images.reference(tmp_path / "src" / rel)), rel


# ---------------------------------------------------------------- manifest


def test_manifest_round_trips_through_json(rgb_store: Dataset) -> None:
    m = rgb_store.manifest
    assert Manifest.from_json(m.to_json()) == m


def test_manifest_describes_the_store(rgb_store: Dataset, backend: str) -> None:
    m = rgb_store.manifest
    assert (m.count, m.image.shape, m.image.dtype) == (6, (17, 25, 3), "|u1")
    assert m.backend == ("zarr" if backend.endswith(".zarr") else "hdf5")
    assert m.format_version == dlpack.FORMAT_VERSION


def test_newer_format_version_is_refused(make_tree: Callable[..., Path], tmp_path: Path, backend: str) -> None:
    out = tmp_path / backend
    dlpack.build(make_tree(RGB_TREE), out, quiet=True, jobs=1)
    rewrite_manifest(out, lambda d: d.update(format_version=999))
    with pytest.raises(FormatVersionError, match="999"):
        dlpack.open(out)


# ---------------------------------------------------------------- plain zarr-python / h5py


@pytest.mark.parametrize("compression", ["none", "lz4", "zstd"])
def test_plain_library_reads_same_images(
    make_tree: Callable[..., Path], tmp_path: Path, backend: str, compression: str
) -> None:
    out = tmp_path / backend
    ds = build_open(make_tree(RGB_TREE), out, size=STRETCH, compression=compression)
    for i in range(len(ds)):
        assert np.array_equal(plain_read(out, "images", i), ds[i]["image"]), i


def test_plain_library_reads_labels_and_sources(rgb_store: Dataset, tmp_path: Path, backend: str) -> None:
    out = tmp_path / backend
    assert plain_read(out, "labels", ...).tolist() == [0, 0, 0, 1, 1, 1]
    offsets, data = plain_read(out, "source_offsets", ...), plain_read(out, "source_data", ...)
    assert [bytes(data[offsets[i] : offsets[i + 1]]).decode() for i in range(6)] == SOURCES


def test_plain_library_reads_variable_images(make_tree: Callable[..., Path], tmp_path: Path, backend: str) -> None:
    out = tmp_path / backend
    ds = build_open(make_tree(MIXED_SIZES), out, resize="none")
    offsets, shapes = plain_read(out, "image_offsets", ...), plain_read(out, "image_shapes", ...)
    for i in range(len(ds)):
        flat = plain_read(out, "image_data", slice(int(offsets[i]), int(offsets[i + 1])))
        assert np.array_equal(flat.reshape(shapes[i]), ds[i]["image"]), i


def test_upscale_allowed_uses_linear_interpolation(
    make_tree: Callable[..., Path], tmp_path: Path, backend: str, images: Any
) -> None:
    ds = build_open(make_tree({"a/0.png": "rgb"}), tmp_path / backend, size=(80, 60), allow_upscale=True)
    expected = images.reference(tmp_path / "src/a/0.png", (80, 60), cv2.INTER_LINEAR)
    assert np.array_equal(ds[0]["image"], expected)
