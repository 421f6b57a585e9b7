"""The build pipeline: labels, channel rules, bad inputs, determinism, publishing and recovery."""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from _exif import tiff_with_orientation

import dlpack
from dlpack import BadInputsError, BuildOptions, DlpackError, OptionError, SourceError, StoreExistsError
from dlpack.cli import main

MakeTree = Callable[..., Path]


def build_open(src: Path, out: Path, **options: Any) -> dlpack.Dataset:
    dlpack.build(src, out, quiet=True, jobs=1, **options)
    return dlpack.open(out)


def siblings(tmp_path: Path) -> list[str]:
    """Names in ``tmp_path`` other than the source tree: stores and leftover temporaries."""
    return sorted(p.name for p in tmp_path.iterdir() if p.name != "src")


def corrupt_png(images: Any, width: int = 10, height: int = 10) -> bytes:
    """A PNG with intact header and IEND but damaged compressed data: only decoding finds it."""
    data = bytearray(images.encode(".png", images.pixels("gray", width, height, seed=7)))
    start = data.find(b"IDAT") + 6
    data[start : start + 20] = bytes(b ^ 0x55 for b in data[start : start + 20])
    return bytes(data)


# ---------------------------------------------------------------- labels


def test_auto_labels_come_from_class_folders(make_tree: MakeTree, tmp_path: Path) -> None:
    ds = build_open(make_tree({"b/0.png": "rgb", "a/1.png": "rgb", "a/deep/2.png": "rgb"}), tmp_path / "o.zarr")
    assert ds.classes == ("a", "b")
    assert [ds[i]["label"] for i in range(3)] == [0, 0, 1]
    assert ds.manifest.labels == "folders"


def test_auto_labels_with_a_top_level_image_raise_source_error(make_tree: MakeTree, tmp_path: Path) -> None:
    # An unlabelled store from one stray image was a silent loss of every label: refused, naming it.
    src = make_tree({"a/0.png": "rgb", "top.png": "rgb"})
    with pytest.raises(SourceError, match="top.png.*--labels none"):
        dlpack.build(src, tmp_path / "o.zarr", quiet=True, jobs=1)
    assert siblings(tmp_path) == []
    ds = build_open(src, tmp_path / "o.zarr", labels="none")
    assert [ds[i]["label"] for i in range(2)] == [-1, -1]
    assert ds.manifest.labels == "none"


def test_folder_labels_with_a_top_level_image_raise_source_error(make_tree: MakeTree, tmp_path: Path) -> None:
    src = make_tree({"a/0.png": "rgb", "top.png": "rgb"})
    with pytest.raises(SourceError, match="top.png"):
        dlpack.build(src, tmp_path / "o.zarr", labels="folders", quiet=True, jobs=1)
    assert siblings(tmp_path) == []


def test_no_labels_ignores_class_folders(make_tree: MakeTree, tmp_path: Path) -> None:
    ds = build_open(make_tree({"a/0.png": "rgb", "b/1.png": "rgb"}), tmp_path / "o.zarr", labels="none")
    assert ds.classes == ()
    assert [ds[i]["label"] for i in range(2)] == [-1, -1]


@pytest.mark.parametrize("make_src", ["missing", "file", "empty"])
def test_unusable_source_raises_source_error(tmp_path: Path, make_src: str) -> None:
    src = tmp_path / "src"
    if make_src == "file":
        src.write_bytes(b"x")
    elif make_src == "empty":
        (src / "a").mkdir(parents=True)
    with pytest.raises(SourceError, match="src"):
        dlpack.build(src, tmp_path / "o.zarr", quiet=True, jobs=1)


def test_unicode_and_space_paths_are_kept(make_tree: MakeTree, tmp_path: Path, backend: str, images: Any) -> None:
    spec = {"Kratzer äöü/缺陷 01.png": "rgb", "Kratzer äöü/b c.jpg": "rgb", "ok/x y.bmp": "rgb"}
    out = tmp_path / "Ausgabe äöü" / f"训练 {backend}"
    ds = build_open(make_tree(spec), out)
    assert ds.classes == ("Kratzer äöü", "ok")
    for i, rel in enumerate(sorted(spec)):
        assert ds[i]["source"] == rel
        assert np.array_equal(ds[i]["image"], images.reference(tmp_path / "src" / rel)), rel


# ---------------------------------------------------------------- channels and depth


def test_alpha_is_dropped(make_tree: MakeTree, tmp_path: Path, images: Any) -> None:
    bgra = images.pixels("rgba", seed=1)
    ds = build_open(make_tree({"a/x.png": bgra}), tmp_path / "o.zarr")
    assert ds.manifest.image.channels == 3
    assert np.array_equal(ds[0]["image"], bgra[:, :, 2::-1])


def test_palette_is_expanded_to_rgb(make_tree: MakeTree, tmp_path: Path, images: Any) -> None:
    idx, pal = images.palette_image(seed=2)
    ds = build_open(make_tree({"a/x.png": images.png_bytes(idx, 3, pal)}), tmp_path / "o.zarr")
    assert np.array_equal(ds[0]["image"], pal[idx])


def test_gray_alpha_keeps_gray_and_drops_alpha(make_tree: MakeTree, tmp_path: Path, images: Any) -> None:
    ga = images.gray_alpha_image(seed=3)
    ds = build_open(make_tree({"a/x.png": images.png_bytes(ga, 4)}), tmp_path / "o.zarr")
    assert ds.manifest.image.channels == 1
    assert np.array_equal(ds[0]["image"], ga[:, :, :1])


def test_rgb_majority_converts_gray_to_rgb(make_tree: MakeTree, tmp_path: Path, images: Any) -> None:
    src = make_tree({"a/0.png": "rgb", "a/1.png": "rgb", "a/2.png": "gray"})
    result = dlpack.build(src, tmp_path / "o.zarr", quiet=True, jobs=1)
    ds = dlpack.open(tmp_path / "o.zarr")
    assert ds.manifest.image.channels == 3
    assert ds.manifest.conversions == result.conversions == {"gray->rgb": 1}
    assert np.array_equal(ds[2]["image"], np.repeat(images.reference(src / "a/2.png"), 3, axis=2))


def test_gray_majority_converts_rgb_to_gray(make_tree: MakeTree, tmp_path: Path, images: Any) -> None:
    src = make_tree({"a/0.png": "gray", "a/1.pgm": "gray", "a/2.png": "rgb"})
    ds = build_open(src, tmp_path / "o.zarr")
    assert ds.manifest.image.channels == 1
    assert ds.manifest.conversions == {"rgb->gray": 1}
    expected = cv2.cvtColor(images.reference(src / "a/2.png"), cv2.COLOR_RGB2GRAY)[:, :, None]
    assert np.array_equal(ds[2]["image"], expected)


def test_channel_tie_goes_to_rgb(make_tree: MakeTree, tmp_path: Path) -> None:
    ds = build_open(make_tree({"a/0.png": "gray", "a/1.png": "rgb"}), tmp_path / "o.zarr")
    assert ds.manifest.image.channels == 3


def test_channels_1_forces_gray(make_tree: MakeTree, tmp_path: Path) -> None:
    ds = build_open(make_tree({"a/0.png": "rgb", "a/1.jpg": "rgb"}), tmp_path / "o.zarr", channels=1)
    assert ds[0]["image"].shape == (30, 40, 1)
    assert ds.manifest.conversions == {"rgb->gray": 2}


def test_channels_3_forces_rgb(make_tree: MakeTree, tmp_path: Path) -> None:
    ds = build_open(make_tree({"a/0.png": "gray", "a/1.pgm": "gray"}), tmp_path / "o.zarr", channels=3)
    assert ds[1]["image"].shape == (30, 40, 3)
    assert ds.manifest.conversions == {"gray->rgb": 2}


def test_sixteen_bit_majority_scales_eight_bit_images(make_tree: MakeTree, tmp_path: Path, images: Any) -> None:
    src = make_tree({"a/0.png": "rgb16", "a/1.png": "rgb16", "a/2.png": "rgb"})
    ds = build_open(src, tmp_path / "o.zarr")
    assert ds.manifest.image.dtype == "<u2"
    assert ds.manifest.conversions == {"8bit->16bit": 1}
    assert np.array_equal(ds[2]["image"], images.reference(src / "a/2.png").astype(np.uint16) * 257)


FORMAT_KINDS = [
    (".png", ["rgb", "gray", "rgba", "rgb16", "gray16"]),
    (".jpg", ["rgb", "gray"]),
    (".bmp", ["rgb", "gray", "rgba"]),
    (".tif", ["rgb", "gray", "rgba", "rgb16", "gray16"]),
    (".webp", ["rgb", "rgba"]),
    (".pgm", ["gray", "gray16"]),
    (".ppm", ["rgb", "rgb16"]),
]


@pytest.mark.parametrize(("suffix", "kind"), [(s, k) for s, kinds in FORMAT_KINDS for k in kinds])
def test_every_format_and_kind_packs_as_decoded(
    make_tree: MakeTree, tmp_path: Path, images: Any, suffix: str, kind: str
) -> None:
    src = make_tree({f"a/x{suffix}": kind})
    img = build_open(src, tmp_path / "o.zarr")[0]["image"]
    expected = images.reference(src / f"a/x{suffix}")
    assert (img.dtype, img.shape) == (expected.dtype, expected.shape)
    assert np.array_equal(img, expected)


def test_palette_transparency_is_dropped(make_tree: MakeTree, tmp_path: Path, images: Any) -> None:
    idx, pal = images.palette_image(seed=8)
    data = images.png_bytes(idx, 3, pal, trns=bytes(range(0, 256, 16)))
    ds = build_open(make_tree({"a/x.png": data}), tmp_path / "o.zarr")
    assert np.array_equal(ds[0]["image"], pal[idx])


def test_hidden_and_non_image_files_are_ignored(make_tree: MakeTree, tmp_path: Path) -> None:
    spec = {"a/0.png": "rgb", "a/1.PNG": "rgb", "a/.hidden.png": b"", ".cache/a/2.png": b"", "a/notes.txt": b"x"}
    ds = build_open(make_tree(spec), tmp_path / "o.zarr")
    assert [ds[i]["source"] for i in range(len(ds))] == ["a/0.png", "a/1.PNG"]
    assert ds.manifest.skipped == ()


def jpeg_with_orientation(jpeg: bytes, orientation: int) -> bytes:
    """``jpeg`` with an Exif APP1 segment holding only an Orientation tag."""
    exif = b"Exif\x00\x00II*\x00" + struct.pack("<IHHHIHHI", 8, 1, 274, 3, 1, orientation, 0, 0)
    return jpeg[:2] + b"\xff\xe1" + struct.pack(">H", len(exif) + 2) + exif + jpeg[2:]


def test_jpeg_exif_orientation_is_applied_once(make_tree: MakeTree, tmp_path: Path, images: Any) -> None:
    data = jpeg_with_orientation(images.encode(".jpg", images.pixels("rgb", seed=9)), 6)
    src = make_tree({"a/x.jpg": data})
    ds = build_open(src, tmp_path / "o.zarr")
    # Orientation 6: the stored image is the file's pixels turned 90 degrees clockwise.
    assert np.array_equal(ds[0]["image"], np.rot90(images.reference(src / "a/x.jpg"), -1))
    assert ds.reader.meta("original_size").tolist() == [[40, 30]]


def test_tiff_orientation_is_applied_once(make_tree: MakeTree, tmp_path: Path, images: Any) -> None:
    # OpenCV 5's imdecode(IMREAD_UNCHANGED) already turns a TIFF upright; dlpack must not turn it again.
    rgb = images.pixels("rgb", seed=10)
    src = make_tree({"a/x.tif": tiff_with_orientation(rgb, 6), "a/y.png": ("rgb", 30, 40)})
    ds = build_open(src, tmp_path / "o.zarr", on_error="skip")
    assert ds.manifest.skipped == ()
    assert np.array_equal(ds[0]["image"], np.rot90(rgb, -1))


def test_valid_image_with_header_past_64_kib_is_packed(make_tree: MakeTree, tmp_path: Path, images: Any) -> None:
    # A header the probe cannot see in the first 64 KiB falls back to decoding, not "not an image":
    # OpenCV (libtiff) writes the TIFF directory after the pixels, so any TIFF over 64 KiB has one.
    jpeg = images.encode(".jpg", images.pixels("rgb", seed=11))
    app = b"\xff\xe2" + struct.pack(">H", 2 + 40000) + bytes(40000)
    spec = {"a/big.tif": ("rgb", 200, 200), "a/meta.jpg": jpeg[:2] + app + app + jpeg[2:]}
    src = make_tree(spec)
    result = dlpack.build(src, tmp_path / "o.zarr", on_error="skip", quiet=True, jobs=1)
    assert [e.path for e in result.skipped] == []
    assert result.count == 2


@pytest.mark.parametrize("suffix", [".jpg", ".png"])
def test_image_with_bytes_after_its_end_marker_is_packed(
    make_tree: MakeTree, tmp_path: Path, images: Any, suffix: str
) -> None:
    # A complete image followed by a trailer (phones append motion-photo video to JPEGs) is packed:
    # the truncation check does not look for the end marker in the last bytes only.
    data = images.encode(suffix, images.pixels("rgb", seed=12)) + b"trailer!" * 32
    src = make_tree({f"a/x{suffix}": data})
    result = dlpack.build(src, tmp_path / "o.zarr", on_error="skip", quiet=True, jobs=1)
    assert [e.path for e in result.skipped] == []
    assert np.array_equal(dlpack.open(tmp_path / "o.zarr")[0]["image"], images.reference(src / f"a/x{suffix}"))


# ---------------------------------------------------------------- bad inputs


def bad_input(kind: str, images: Any) -> tuple[bytes, str]:
    """(file bytes, expected reason fragment) for each kind of unusable input."""
    png = images.encode(".png", images.pixels("rgb", 10, 10, seed=4))
    jpg = images.encode(".jpg", images.pixels("rgb", 10, 10, seed=5))
    return {
        "empty.png": (b"", "empty file"),
        "truncated.png": (png[: len(png) // 2], "truncated PNG"),
        "truncated.jpg": (jpg[: len(jpg) * 2 // 3], "truncated JPEG"),
        "random.png": (np.random.default_rng(6).bytes(500), "not an image"),
        "text.jpg": (b"this is a note, not a picture\n", "not an image"),
        "huge.png": (images.encode(".png", images.pixels("rgb", 40, 30)), "over the limit"),
    }[kind]


BAD_KINDS = ["empty.png", "truncated.png", "truncated.jpg", "random.png", "text.jpg", "huge.png"]
GOOD = {"a/good0.png": ("rgb", 10, 10), "a/good1.jpg": ("rgb", 10, 10)}


@pytest.mark.parametrize("kind", BAD_KINDS)
def test_bad_input_is_skipped_with_path_and_reason(make_tree: MakeTree, tmp_path: Path, images: Any, kind: str) -> None:
    data, reason = bad_input(kind, images)
    src = make_tree({**GOOD, f"a/{kind}": data})
    result = dlpack.build(src, tmp_path / "o.zarr", on_error="skip", max_pixels=100, quiet=True, jobs=1)
    assert result.count == 2
    assert [e.path for e in result.skipped] == [f"a/{kind}"]
    assert reason in result.skipped[0].reason


def test_damaged_image_data_is_skipped_with_path_and_reason(make_tree: MakeTree, tmp_path: Path, images: Any) -> None:
    src = make_tree({**GOOD, "a/damaged.png": corrupt_png(images)})
    result = dlpack.build(src, tmp_path / "o.zarr", on_error="skip", quiet=True, jobs=1)
    assert result.count == 2
    assert [(e.path, "corrupt" in e.reason) for e in result.skipped] == [("a/damaged.png", True)]


def test_symlink_leaving_the_tree_is_reported(make_tree: MakeTree, tmp_path: Path, images: Any) -> None:
    src = make_tree(GOOD)
    outside = tmp_path / "outside.png"
    outside.write_bytes(images.encode(".png", images.pixels("rgb", 10, 10)))
    (src / "a/link.png").symlink_to(outside)
    for follow in (False, True):
        result = dlpack.build(
            src, tmp_path / "o.zarr", on_error="skip", follow_symlinks=follow, overwrite=True, quiet=True, jobs=1
        )
        assert [e.path for e in result.skipped] == ["a/link.png"]
        assert "leaves the source folder" in result.skipped[0].reason


def test_symlink_inside_the_tree_is_packed_when_following(make_tree: MakeTree, tmp_path: Path) -> None:
    # The target is hidden, so the link is the only path to it (a file reached twice is packed once).
    src = make_tree({**GOOD, ".pool/good0.png": ("rgb", 10, 10)})
    (src / ".pool/good0.png").write_bytes((src / "a/good0.png").read_bytes())
    (src / "a/link.png").symlink_to(src / ".pool/good0.png")
    ds = build_open(src, tmp_path / "o.zarr", follow_symlinks=True)
    assert len(ds) == 3
    assert np.array_equal(ds[0]["image"], ds[2]["image"])  # good0.png, link.png


def test_symlink_inside_the_tree_is_not_said_to_leave_it(make_tree: MakeTree, tmp_path: Path) -> None:
    # Without follow_symlinks, an in-tree link is skipped as a link, not as one that leaves the source folder.
    src = make_tree(GOOD)
    (src / "a/link.png").symlink_to(src / "a/good0.png")
    result = dlpack.build(src, tmp_path / "o.zarr", on_error="skip", quiet=True, jobs=1)
    assert not any("leaves the source folder" in e.reason for e in result.skipped)


@pytest.fixture
def all_bad(make_tree: MakeTree, tmp_path: Path, images: Any) -> Path:
    """Two good images and one of every bad kind, including a symlink out of the tree."""
    src = make_tree({**GOOD, **{f"a/{k}": bad_input(k, images)[0] for k in BAD_KINDS}})
    (tmp_path / "outside.png").write_bytes(images.encode(".png", images.pixels("rgb", 10, 10)))
    (src / "a/link.png").symlink_to(tmp_path / "outside.png")
    return src


ALL_BAD = sorted([f"a/{k}" for k in BAD_KINDS] + ["a/link.png"])


def test_fail_lists_every_bad_input(all_bad: Path, tmp_path: Path) -> None:
    with pytest.raises(BadInputsError) as info:
        dlpack.build(all_bad, tmp_path / "o.zarr", max_pixels=100, quiet=True, jobs=1)
    assert [e.path for e in info.value.errors] == ALL_BAD
    assert all(path in str(info.value) for path in ALL_BAD)


def test_fail_leaves_no_store_and_no_temporary(all_bad: Path, tmp_path: Path, backend: str) -> None:
    with pytest.raises(BadInputsError):
        dlpack.build(all_bad, tmp_path / backend, max_pixels=100, quiet=True, jobs=1)
    assert siblings(tmp_path) == ["outside.png"]


def test_fail_on_damaged_data_leaves_no_store_and_no_temporary(
    make_tree: MakeTree, tmp_path: Path, images: Any, backend: str
) -> None:
    src = make_tree({**GOOD, "a/damaged.png": corrupt_png(images)})
    with pytest.raises(BadInputsError, match="a/damaged.png"):
        dlpack.build(src, tmp_path / backend, quiet=True, jobs=1)
    assert siblings(tmp_path) == []


def test_fail_lists_damaged_data_along_with_header_errors(make_tree: MakeTree, tmp_path: Path, images: Any) -> None:
    # Files that only fail to decode are listed with those that already failed the probe.
    src = make_tree({**GOOD, "a/damaged.png": corrupt_png(images), "a/empty.png": b""})
    with pytest.raises(BadInputsError) as info:
        dlpack.build(src, tmp_path / "o.zarr", quiet=True, jobs=1)
    assert [e.path for e in info.value.errors] == ["a/damaged.png", "a/empty.png"]


def test_skip_packs_the_rest_and_lists_skipped_in_manifest(all_bad: Path, tmp_path: Path, backend: str) -> None:
    ds = build_open(all_bad, tmp_path / backend, on_error="skip", max_pixels=100)
    assert [ds[i]["source"] for i in range(len(ds))] == sorted(GOOD)
    assert [e.path for e in ds.manifest.skipped] == ALL_BAD


def test_skip_lists_skipped_in_info_json(all_bad: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dlpack.build(all_bad, tmp_path / "o.zarr", on_error="skip", max_pixels=100, quiet=True, jobs=1)
    capsys.readouterr()
    assert main(["info", str(tmp_path / "o.zarr"), "--json"]) == 0
    skipped = json.loads(capsys.readouterr().out)["skipped"]
    assert [e["path"] for e in skipped] == ALL_BAD
    assert all(e["reason"] for e in skipped)


def test_skip_from_cli_returns_1_and_names_skipped_files(
    all_bad: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["build", str(all_bad), str(tmp_path / "o.zarr"), "--on-error", "skip", "--max-pixels", "100"]
    assert main([*argv, "--quiet", "--jobs", "1"]) == 1
    err = capsys.readouterr().err
    assert all(path in err for path in ALL_BAD)


def test_skip_with_nothing_left_raises(make_tree: MakeTree, tmp_path: Path) -> None:
    src = make_tree({"a/empty.png": b"", "a/note.jpg": b"text"})
    with pytest.raises(BadInputsError, match="a/empty.png"):
        dlpack.build(src, tmp_path / "o.zarr", on_error="skip", quiet=True, jobs=1)
    assert siblings(tmp_path) == []


@pytest.mark.parametrize(
    ("damaged_spec", "field"),
    [
        # A damaged 20x20 image among 40x30 ones: the store should still be fixed-size 40x30.
        ({"a/damaged.png": ("size", 20, 20)}, "layout"),
        # Two damaged gray images and one good RGB one: the store should still be RGB.
        ({"a/damaged0.png": ("size", 40, 30), "a/damaged1.png": ("size", 40, 30)}, "channels"),
    ],
    ids=["layout", "channels"],
)
def test_skip_of_damaged_data_stores_as_if_absent(
    make_tree: MakeTree, tmp_path: Path, images: Any, damaged_spec: dict[str, Any], field: str
) -> None:
    # The plan (layout, channels) is made again without the files that failed to decode, not kept
    # from every probed header.
    good = {"a/good0.png": "rgb"} if field == "channels" else {"a/good0.png": "rgb", "a/good1.png": "rgb"}
    damaged = {rel: corrupt_png(images, w, h) for rel, (_, w, h) in damaged_spec.items()}
    ds = build_open(make_tree({**good, **damaged}), tmp_path / "skip.zarr", on_error="skip")
    clean = build_open(make_tree(good, "clean"), tmp_path / "clean.zarr")
    assert len(ds.manifest.skipped) == len(damaged)
    assert ds.manifest.image == clean.manifest.image
    assert ds.manifest.conversions == clean.manifest.conversions


# ---------------------------------------------------------------- upscaling


def test_stretch_that_would_upscale_is_a_bad_input(make_tree: MakeTree, tmp_path: Path) -> None:
    src = make_tree({"a/big.png": ("rgb", 80, 60), "a/small.png": "rgb"})
    with pytest.raises(BadInputsError) as info:
        dlpack.build(src, tmp_path / "o.zarr", size=(60, 45), quiet=True, jobs=1)
    assert [e.path for e in info.value.errors] == ["a/small.png"]
    assert "upscale" in info.value.errors[0].reason


def test_stretch_upscales_when_allowed(make_tree: MakeTree, tmp_path: Path) -> None:
    src = make_tree({"a/big.png": ("rgb", 80, 60), "a/small.png": "rgb"})
    ds = build_open(src, tmp_path / "o.zarr", size=(60, 45), allow_upscale=True)
    assert [ds[i]["image"].shape for i in range(2)] == [(45, 60, 3)] * 2


def test_fit_never_upscales_by_default(make_tree: MakeTree, tmp_path: Path) -> None:
    ds = build_open(make_tree({"a/x.png": "rgb"}), tmp_path / "o.zarr", size=(80, 80), resize="fit")
    assert ds.reader.meta("transform").tolist() == [[1.0, 1.0, 25.0, 20.0]]


# ---------------------------------------------------------------- determinism


def _many(n: int, variable: bool) -> dict[str, Any]:
    if variable:
        return {f"c{k % 3}/{k:02d}.png": ("rgb", 20 + k, 30 - k % 7) for k in range(n)}
    return {f"c{k % 3}/{k:02d}.{'png' if k % 2 else 'jpg'}": "rgb" for k in range(n)}


@pytest.mark.parametrize("layout", ["fixed", "variable", "fixed-with-damaged"])
def test_jobs_do_not_change_store_bytes(
    make_tree: MakeTree, tmp_path: Path, backend: str, images: Any, snapshot: Any, layout: str
) -> None:
    # 64 KiB shards: 18 of these 3600-byte images per shard, so the fixed case spans three shards.
    spec = _many(40, layout == "variable")
    if layout == "fixed-with-damaged":  # found while decoding, so the store is written twice
        spec["c1/20.png"] = corrupt_png(images, 40, 30)
    src = make_tree(spec)
    one = tmp_path / "one" / backend
    two = tmp_path / "two" / backend
    dlpack.build(src, one, jobs=1, shard_bytes=2**16, on_error="skip", quiet=True)
    dlpack.build(src, two, jobs=2, shard_bytes=2**16, on_error="skip", quiet=True)
    a, b = snapshot(one), snapshot(two)
    assert sorted(a) == sorted(b)
    assert [name for name in a if a[name] != b[name]] == []


@pytest.mark.slow
def test_rebuild_a_second_later_writes_same_bytes(
    make_tree: MakeTree, tmp_path: Path, backend: str, snapshot: Any
) -> None:
    # HDF5 datasets record their creation time unless told not to: two builds must give the same bytes.
    src = make_tree({"a/0.png": "rgb", "b/1.png": "rgb"})
    dlpack.build(src, tmp_path / "one" / backend, quiet=True, jobs=1)
    time.sleep(1.1)
    dlpack.build(src, tmp_path / "two" / backend, quiet=True, jobs=1)
    assert snapshot(tmp_path / "one" / backend) == snapshot(tmp_path / "two" / backend)


# ---------------------------------------------------------------- publishing


def test_existing_store_is_refused_and_untouched(
    make_tree: MakeTree, tmp_path: Path, backend: str, snapshot: Any
) -> None:
    out = tmp_path / backend
    dlpack.build(make_tree({"a/0.png": "rgb"}), out, quiet=True, jobs=1)
    before = snapshot(out)
    with pytest.raises(StoreExistsError, match="overwrite"):
        dlpack.build(make_tree({"b/0.png": "gray"}, "other"), out, quiet=True, jobs=1)
    assert snapshot(out) == before


def test_overwrite_replaces_existing_store(make_tree: MakeTree, tmp_path: Path, backend: str) -> None:
    out = tmp_path / backend
    dlpack.build(make_tree({"a/0.png": "rgb", "a/1.png": "rgb"}), out, quiet=True, jobs=1)
    dlpack.build(make_tree({"b/0.png": "gray"}, "other"), out, overwrite=True, quiet=True, jobs=1)
    with dlpack.open(out) as ds:
        assert (len(ds), ds.classes) == (1, ("b",))
    assert siblings(tmp_path) == sorted(["other", backend])


@pytest.mark.parametrize("bad", ["empty", "damaged"])
def test_failed_overwrite_leaves_old_store_intact(
    make_tree: MakeTree, tmp_path: Path, backend: str, images: Any, snapshot: Any, bad: str
) -> None:
    out = tmp_path / backend
    dlpack.build(make_tree({"a/0.png": "rgb"}), out, quiet=True, jobs=1)
    before = snapshot(out)
    data = b"" if bad == "empty" else corrupt_png(images)
    new = make_tree({"b/good.png": ("rgb", 10, 10), "b/bad.png": data}, "other")
    with pytest.raises(BadInputsError):
        dlpack.build(new, out, overwrite=True, quiet=True, jobs=1)
    assert snapshot(out) == before
    assert len(dlpack.open(out)) == 1
    assert siblings(tmp_path) == sorted(["other", backend])


def _wait_for_partial(proc: subprocess.Popen[bytes], pattern: Path) -> list[Path]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = list(pattern.parent.glob(pattern.name))
        if found:
            return found
        if proc.poll() is not None:
            pytest.fail(f"the build ended (rc {proc.returncode}) before its temporary appeared; give it more files")
        time.sleep(0.002)
    pytest.fail("no temporary store appeared within 60 s")


@pytest.mark.slow
def test_killed_build_leaves_nothing_openable_and_next_build_cleans_up(
    make_tree: MakeTree, tmp_path: Path, backend: str, images: Any
) -> None:
    # 300 links to one 512x384 noise JPEG: about a second of decoding with one job.
    src = tmp_path / "src"
    first = make_tree({"a/0000.jpg": ("rgb", 512, 384)}) / "a/0000.jpg"
    for k in range(1, 300):
        os.link(first, src / f"a/{k:04d}.jpg")
    out = tmp_path / backend
    cmd = [sys.executable, "-m", "dlpack", "build", str(src), str(out), "--jobs", "1", "--size", "64x48", "--quiet"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        partial = _wait_for_partial(proc, tmp_path / f".{backend}.dlpack-partial")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    for path in [out, *tmp_path.glob(f".{backend}*")]:
        with pytest.raises(DlpackError):
            dlpack.open(path)
    dlpack.build(make_tree({"a/0.png": "rgb"}, "small"), out, quiet=True, jobs=1)
    assert len(dlpack.open(out)) == 1
    assert not any(p.exists() for p in partial)
    assert siblings(tmp_path) == sorted(["small", backend])


# ---------------------------------------------------------------- options


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"size": "0x512"}, "size must be WIDTHxHEIGHT with both > 0, got '0x512'"),
        ({"size": (512, 0)}, "size must be WIDTHxHEIGHT with both > 0, got '512x0'"),
        ({"size": "512"}, "size must be WIDTHxHEIGHT, e.g. 512x512, got '512'"),
        ({"size": (64, 64), "max_side": 32}, "either size (WxH) or max_side, not both"),
        ({"max_side": 0}, "max_side must be a positive integer, got 0"),
        ({"resize": "crop"}, "resize must be one of stretch, fit, none; got 'crop'"),
        ({"resize": "fit"}, "resize=fit needs a target"),
        ({"resize": "stretch", "max_side": 8}, "resize=stretch needs size=WxH"),
        ({"resize": "none", "size": (8, 8)}, "resize=none keeps original sizes"),
        ({"channels": 2}, "channels must be one of keep, 1, 3; got 2"),
        ({"labels": "dirs"}, "labels: unknown kind 'dirs' in 'dirs'; use one of auto, folders, none, anomaly"),
        ({"jobs": 0}, "jobs must be a positive number of processes or -1 for all cores, got 0"),
        ({"jobs": -2}, "got -2"),
        ({"compression": "gzip"}, "compression must be one of none, lz4, zstd; got 'gzip'"),
        ({"on_error": "ignore"}, "on_error must be one of fail, skip; got 'ignore'"),
        ({"format": "tiff"}, "format must be one of hdf5, zarr, dldataset; got 'tiff'"),
        ({"max_pixels": 0}, "max_pixels must be > 0, got 0"),
        ({"shard_bytes": 1000}, "shard_bytes must be at least 65536, got 1000"),
    ],
)
def test_invalid_option_is_refused_with_message(options: dict[str, Any], message: str) -> None:
    with pytest.raises(OptionError) as info:
        BuildOptions(**options)
    assert message in str(info.value)
    assert isinstance(info.value, ValueError)


def test_option_text_is_normalised() -> None:
    opts = BuildOptions(size=" 64X32 ", channels="3")  # type: ignore[arg-type]
    assert (opts.size, opts.channels, opts.resize_mode) == ((64, 32), 3, "stretch")


@pytest.mark.parametrize(
    ("out", "fmt"), [("a.h5", "hdf5"), ("a.HDF5", "hdf5"), ("a.zarr", "zarr"), ("a.zarr/", "zarr"), ("a", "zarr")]
)
def test_format_follows_the_suffix(out: str, fmt: str) -> None:
    from dlpack.backends import backend_for_path

    assert backend_for_path(out, None).name == fmt


def test_build_keywords_are_validated_before_anything_is_written(make_tree: MakeTree, tmp_path: Path) -> None:
    src = make_tree({"a/0.png": "rgb"})
    with pytest.raises(OptionError, match="0x512"):
        dlpack.build(src, tmp_path / "o.zarr", size="0x512")
    assert siblings(tmp_path) == []
