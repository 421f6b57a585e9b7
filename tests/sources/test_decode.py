"""``prepare_image``: the one decode -> orient -> resize -> convert function, and its callers agreeing."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import cv2
import numpy as np
import pytest
from _exif import FORMATS, exif_block, oriented_file, png_with_exif, upright

import dlpack
from dlpack.errors import OptionError
from dlpack.sources import DecodeError, TargetSpec, prepare_image
from dlpack.sources.probe import HEADER_BYTES, probe_header

MakeTree = Callable[..., Path]
REPO = Path(__file__).resolve().parents[2]

# At 129 and 200, rounding (x + 128) // 257 and truncation x >> 8 disagree.
SIXTEEN = np.array([[0, 128, 129, 200, 65535]], dtype=np.uint16)


def png(img: np.ndarray) -> bytes:
    ok, buf = cv2.imencode(".png", img)
    assert ok
    return buf.tobytes()


def test_sixteen_bit_to_eight_bit_rounds_x_over_257() -> None:
    prepared = prepare_image(png(SIXTEEN), TargetSpec(channels=1, dtype="|u1"))
    expected = ((SIXTEEN.astype(np.uint32) + 128) // 257).astype(np.uint8)[:, :, None]
    assert expected.ravel().tolist() == [0, 0, 1, 1, 255]
    assert np.array_equal(prepared.pixels, expected)
    assert not np.array_equal(prepared.pixels, (SIXTEEN >> 8).astype(np.uint8)[:, :, None])
    assert prepared.conversions == ("16bit->8bit",)


def test_eight_bit_to_sixteen_bit_scales_by_257() -> None:
    gray = np.arange(0, 256, 17, dtype=np.uint8)[None, :]
    prepared = prepare_image(png(gray), TargetSpec(channels=1, dtype="<u2"))
    assert prepared.pixels.dtype == np.uint16
    assert np.array_equal(prepared.pixels[:, :, 0], gray.astype(np.uint16) * 257)
    assert prepared.conversions == ("8bit->16bit",)


def test_channels_are_converted_after_resizing_and_reported(images: Any) -> None:
    bgr = images.pixels("rgb", 40, 30, seed=1)
    prepared = prepare_image(png(bgr), TargetSpec(mode="stretch", size=(20, 15), channels=1))
    rgb_small = cv2.cvtColor(cv2.resize(bgr, (20, 15), interpolation=cv2.INTER_AREA), cv2.COLOR_BGR2RGB)
    assert np.array_equal(prepared.pixels[:, :, 0], cv2.cvtColor(rgb_small, cv2.COLOR_RGB2GRAY))
    assert prepared.conversions == ("rgb->gray",)
    assert prepared.original_size == (30, 40)
    assert (prepared.geometry.scale_y, prepared.geometry.scale_x) == (0.5, 0.5)
    assert prepared.pixels.flags.c_contiguous


def test_fit_pads_and_records_where_the_image_lies(images: Any) -> None:
    prepared = prepare_image(png(images.pixels("gray", 40, 20)), TargetSpec(mode="fit", size=(20, 20), channels=3))
    g = prepared.geometry
    assert prepared.pixels.shape == (20, 20, 3)
    assert (g.new_h, g.new_w, g.off_y, g.off_x) == (10, 20, 5, 0)
    assert not prepared.pixels[:5].any() and not prepared.pixels[15:].any()
    assert prepared.conversions == ("gray->rgb",)


@pytest.mark.parametrize(
    ("data", "target", "reason"),
    [
        (b"", TargetSpec(), "empty file"),
        (b"not an image at all", TargetSpec(), "not an image"),
        (None, TargetSpec(mode="stretch", size=(80, 60)), "would upscale"),
        (None, TargetSpec(max_pixels=100), "over the limit"),
    ],
)
def test_unusable_input_is_a_decode_error(images: Any, data: bytes | None, target: TargetSpec, reason: str) -> None:
    with pytest.raises(DecodeError, match=reason):
        prepare_image(png(images.pixels("rgb", 40, 30)) if data is None else data, target)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"mode": "crop"}, "mode must be one of stretch, fit, none; got 'crop'"),
        ({"mode": "stretch"}, "mode=stretch needs size"),
        ({"mode": "fit"}, "mode=fit needs size"),
        ({"channels": 2}, "channels must be 1 or 3; got 2"),
        ({"dtype": "float32"}, "dtype must be one of |u1, <u2; got 'float32'"),
        ({"max_pixels": 0}, "max_pixels must be > 0"),
    ],
)
def test_invalid_target_is_an_option_error(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(OptionError) as info:
        TargetSpec(**fields)
    assert message in str(info.value)


def test_target_normalises_dtype_and_round_trips() -> None:
    target = TargetSpec(mode="fit", size=(64, 32), channels=1, dtype="uint16", allow_upscale=True)
    assert target.dtype == "<u2"
    assert TargetSpec.from_dict(target.to_dict()) == target


def _load_script(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"_script_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_build_example_and_benchmark_decode_a_file_alike(make_tree: MakeTree, tmp_path: Path) -> None:
    """The build, examples/train_torch.py and benchmarks/loader.py give the same pixels for one file."""
    torch = pytest.importorskip("torch")
    loader_bench = _load_script(REPO / "benchmarks" / "loader.py")
    example = _load_script(REPO / "examples" / "train_torch.py")
    size = loader_bench.SIZE
    # Two 8-bit colour files make the store RGB 8-bit; the 16-bit gray one is converted on both counts.
    src = make_tree({"a/0.png": "rgb", "a/1.png": "rgb", "a/2.png": "gray16"})
    dlpack.build(src, tmp_path / "o.zarr", size=(size, size), allow_upscale=True, quiet=True, jobs=1)
    with dlpack.open(tmp_path / "o.zarr") as ds:
        stored = ds[2]["image"]
        assert ds.manifest.conversions == {"16bit->8bit": 1, "gray->rgb": 1}
    path = src / "a/2.png"
    from_bench = loader_bench.load_folder_image(path)
    from_example = example.FolderDataset(str(src), (size, size))[2]["image"]
    assert isinstance(from_example, torch.Tensor)
    assert stored.shape == (size, size, 3)
    assert np.array_equal(from_bench, stored)
    assert np.array_equal(from_example.permute(1, 2, 0).numpy(), stored)


# ---------------------------------------------------------------- EXIF orientation, every format


def _asymmetric_bgr() -> np.ndarray:
    """A 7 x 4 colour image whose eight orientations all differ: no flip or turn maps it onto itself."""
    return np.random.default_rng(5).integers(0, 256, (4, 7, 3), dtype=np.uint8)


def test_exif_orientation_is_applied_for_every_format(make_tree: MakeTree, tmp_path: Path) -> None:
    """The same image with orientation tags 1..8 as JPEG, PNG (eXIf), WebP (EXIF) and TIFF is stored upright."""
    bgr = _asymmetric_bgr()
    spec = {f"{suffix[1:]}/{o}{suffix}": oriented_file(suffix, bgr, o) for suffix in FORMATS for o in range(1, 9)}
    src = make_tree(spec)
    # No resize: orientations 5 to 8 swap the axes, so the store holds 7x4 and 4x7 images.
    dlpack.build(src, tmp_path / "o.zarr", quiet=True, jobs=1)
    with dlpack.open(tmp_path / "o.zarr") as ds:
        stored = {ds[i]["source"]: ds[i]["image"] for i in range(len(ds))}
        sizes = dict(zip(stored, ds.reader.meta("original_size").tolist(), strict=True))
    assert sorted(stored) == sorted(spec)
    plain_jpeg = cv2.imdecode(np.frombuffer(oriented_file(".jpg", bgr, 1), np.uint8), cv2.IMREAD_COLOR)
    for rel, image in stored.items():
        suffix, o = Path(rel).suffix, int(Path(rel).stem)
        # JPEG is lossy: its reference is the same decoder's pixels of the untagged-orientation file.
        pixels = plain_jpeg if suffix == ".jpg" else bgr
        expected = upright(np.ascontiguousarray(pixels[:, :, ::-1]), o)
        assert image.shape == expected.shape, rel
        assert np.array_equal(image, expected), rel
        assert sizes[rel] == list(expected.shape[:2]), rel
        # The probe's size agrees with the decoded one (what the build plans sizes and refusals on).
        header = probe_header(spec[rel])
        assert header is not None and header.orientation == o, rel
        assert header.oriented_size == (expected.shape[1], expected.shape[0]), rel
        if suffix != ".jpg":
            # An independent reader shows the files the same way (PIL's exif_transpose).
            from PIL import Image, ImageOps

            with Image.open(src / rel) as im:
                shown = np.asarray(ImageOps.exif_transpose(im).convert("RGB"))
            assert np.array_equal(shown, expected), rel


def test_orientation_of_a_png_exif_chunk_after_the_image_data_is_applied() -> None:
    # The probe sees only a large file's head; the decoder finds the eXIf chunk at the end anyway.
    bgr = np.random.default_rng(6).integers(0, 256, (300, 200, 3), dtype=np.uint8)
    data = png_with_exif(png(bgr), exif_block(8, big_endian=True), after_idat=True)
    assert len(data) > HEADER_BYTES
    head = probe_header(data[:HEADER_BYTES])
    assert head is not None and head.orientation == 1
    prepared = prepare_image(data, TargetSpec(), head)
    assert np.array_equal(prepared.pixels, upright(np.ascontiguousarray(bgr[:, :, ::-1]), 8))
    assert prepared.original_size == (200, 300)
