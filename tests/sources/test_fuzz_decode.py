"""Fuzzing the image path: the probe and the decoder on arbitrary and mutated files.

The properties: ``probe_header`` never raises and never returns nonsense (a size of 0, an unknown
channel count); ``decode_image`` and ``prepare_image`` let only :class:`DecodeError` out, and what
they return has the promised shape and type. The normal run tries ``DLPACK_FUZZ_EXAMPLES``
examples per target (default 200, a few seconds); a longer run is the same tests by hand::

    DLPACK_FUZZ_EXAMPLES=20000 python -m pytest -q tests/sources/test_fuzz_decode.py

Every file is generated here with OpenCV (small, so a decode takes well under a millisecond).
"""

from __future__ import annotations

import os
import struct
import zlib

import cv2
import numpy as np
import pytest
from _tiff import multipage_tiff
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlpack.sources import DecodeError, TargetSpec, decode_image, prepare_image
from dlpack.sources.probe import MAX_TIFF_PAGES, ImageHeader, probe_header, tiff_pages

EXAMPLES = int(os.environ.get("DLPACK_FUZZ_EXAMPLES", "200"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    # The normal run tries the same examples every time (a test run never fails by chance); a long
    # run by hand (DLPACK_FUZZ_EXAMPLES) explores new ones.
    derandomize="DLPACK_FUZZ_EXAMPLES" not in os.environ,
)
# A mutated header may promise a huge image: keep every decode small.
MAX_PIXELS = 1 << 16
FORMATS = {"png", "jpeg", "bmp", "tiff", "webp", "pnm"}


def _encode(ext: str, img: np.ndarray, params: tuple[int, ...] = ()) -> bytes:
    ok, buf = cv2.imencode(ext, img, list(params))
    assert ok, ext
    return buf.tobytes()


def _png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def _palette_png(indices: np.ndarray) -> bytes:
    h, w = indices.shape
    raw = b"".join(b"\x00" + indices[y].tobytes() for y in range(h))
    ihdr = _png_chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 3, 0, 0, 0))
    plte = _png_chunk(b"PLTE", bytes(range(48)))
    trns = _png_chunk(b"tRNS", b"\x00\x80")
    return (
        b"\x89PNG\r\n\x1a\n" + ihdr + plte + trns + _png_chunk(b"IDAT", zlib.compress(raw)) + _png_chunk(b"IEND", b"")
    )


def _exif_jpeg(jpeg: bytes, orientation: int) -> bytes:
    entry = struct.pack(">HHIHH", 274, 3, 1, orientation, 0)
    tiff = b"MM" + struct.pack(">HI", 42, 8) + struct.pack(">H", 1) + entry + bytes(4)
    payload = b"Exif\x00\x00" + tiff
    return jpeg[:2] + b"\xff\xe1" + struct.pack(">H", len(payload) + 2) + payload + jpeg[2:]


def _samples() -> dict[str, bytes]:
    """One small valid file of every format and most layouts OpenCV writes."""
    rng = np.random.default_rng(0)
    rgb = cv2.GaussianBlur(rng.integers(0, 256, (16, 24, 3), dtype=np.uint8), (3, 3), 0)
    gray = rgb[:, :, 1].copy()
    rgba = np.dstack([rgb, rng.integers(0, 256, (16, 24), dtype=np.uint8)])
    rgb16 = rgb.astype(np.uint16) * 257
    jpeg = _encode(".jpg", rgb, (cv2.IMWRITE_JPEG_QUALITY, 90))
    two_pages = multipage_tiff([rgb, rgb[::-1].copy()])
    return {
        "jpeg": jpeg,
        "jpeg-gray": _encode(".jpg", gray),
        "jpeg-progressive": _encode(".jpg", rgb, (cv2.IMWRITE_JPEG_PROGRESSIVE, 1)),
        "jpeg-restarts": _encode(".jpg", rgb, (cv2.IMWRITE_JPEG_RST_INTERVAL, 2)),
        "jpeg-exif": _exif_jpeg(jpeg, 6),
        "png": _encode(".png", rgb),
        "png-gray": _encode(".png", gray),
        "png-rgba": _encode(".png", rgba),
        "png-16": _encode(".png", rgb16),
        "png-palette": _palette_png(rng.integers(0, 16, (16, 24), dtype=np.uint8)),
        "bmp": _encode(".bmp", rgb),
        "bmp-gray": _encode(".bmp", gray),
        "tiff": _encode(".tiff", rgb, (cv2.IMWRITE_TIFF_COMPRESSION, 1)),
        "tiff-lzw": _encode(".tiff", rgb),
        "tiff-16": _encode(".tiff", rgb16),
        "tiff-rgba": _encode(".tiff", rgba),
        "tiff-pages": two_pages,
        "webp": _encode(".webp", rgb, (cv2.IMWRITE_WEBP_QUALITY, 80)),
        "webp-lossless": _encode(".webp", rgba, (cv2.IMWRITE_WEBP_QUALITY, 101)),
        "pgm": _encode(".pgm", gray),
        "ppm": _encode(".ppm", rgb),
        "pgm-16": _encode(".pgm", rgb16[:, :, 0].copy()),
    }


SAMPLES = _samples()
NAMES = sorted(SAMPLES)


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    """A valid sample damaged by a few edits: bytes set, bits flipped, runs zeroed, cut, spliced or repeated."""
    data = bytearray(SAMPLES[draw(st.sampled_from(NAMES))])
    for _ in range(draw(st.integers(1, 6))):
        n = len(data)
        if n == 0:
            break
        # Half the edits land in the first 64 bytes, where the headers are.
        pos = draw(st.one_of(st.integers(0, min(63, n - 1)), st.integers(0, n - 1)))
        op = draw(st.sampled_from(["set", "flip", "run", "cut", "insert", "delete", "repeat", "int"]))
        if op == "set":
            data[pos] = draw(st.integers(0, 255))
        elif op == "flip":
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif op == "run":
            k = draw(st.integers(1, 64))
            data[pos : pos + k] = bytes([draw(st.sampled_from([0x00, 0xFF, 0x7F, 0x80]))]) * len(data[pos : pos + k])
        elif op == "cut":
            del data[pos:]
        elif op == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=16))
        elif op == "delete":
            del data[pos : pos + draw(st.integers(1, 16))]
        elif op == "repeat":
            data[pos:pos] = data[pos : pos + draw(st.integers(1, 64))]
        else:  # a length, offset or size field set to an extreme value
            value = draw(st.sampled_from([0, 1, 0x7F, 0xFF, 0x7FFF, 0xFFFF, 0x7FFFFFFF, 0xFFFFFFFF]))
            data[pos : pos + 4] = value.to_bytes(4, draw(st.sampled_from(["big", "little"])))
    return bytes(data)


def _sane(header: ImageHeader | None) -> None:
    if header is None:
        return
    assert header.format in FORMATS
    assert header.width > 0 and header.height > 0
    assert header.channels in (1, 3)
    assert isinstance(header.has_alpha, bool)
    assert header.bit_depth in (8, 16)
    assert 1 <= header.orientation <= 8
    assert 1 <= header.pages <= MAX_TIFF_PAGES + 1
    assert header.pages == 1 or header.format == "tiff"


def test_every_sample_is_valid() -> None:
    for name, data in SAMPLES.items():
        header = probe_header(data)
        assert header is not None, name
        if name == "tiff-pages":
            assert header.pages == 2
            continue
        img = decode_image(data, max_pixels=MAX_PIXELS)
        assert header.oriented_size == (img.shape[1], img.shape[0]) == ((16, 24) if "exif" in name else (24, 16))


MAGICS = [b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"BM", b"II*\x00", b"MM\x00*", b"RIFF\x00\x00\x00\x00WEBP"]
MAGICS += [b"P1", b"P2", b"P3", b"P4", b"P5", b"P6"]


@pytest.mark.slow
@FUZZ
@given(st.one_of(st.binary(max_size=1024), st.tuples(st.sampled_from(MAGICS), st.binary(max_size=1024)).map(b"".join)))
def test_probe_on_arbitrary_bytes(data: bytes) -> None:
    _sane(probe_header(data))
    assert 0 <= tiff_pages(data) <= MAX_TIFF_PAGES + 1


@pytest.mark.slow
@FUZZ
@given(mutated())
def test_probe_on_mutated_files(data: bytes) -> None:
    _sane(probe_header(data))
    _sane(probe_header(data[:64]))
    assert 0 <= tiff_pages(data) <= MAX_TIFF_PAGES + 1


@pytest.mark.slow
@FUZZ
@given(mutated())
def test_decode_on_mutated_files_gives_an_image_or_a_decode_error(data: bytes) -> None:
    try:
        img = decode_image(data, max_pixels=MAX_PIXELS)
    except DecodeError as exc:
        assert str(exc)  # noqa: PT017 - the call may also succeed
        return
    assert img.dtype in (np.uint8, np.uint16)
    assert img.ndim == 3 and img.shape[2] in (1, 3) and img.shape[0] > 0 and img.shape[1] > 0
    assert img.shape[0] * img.shape[1] <= MAX_PIXELS


TARGETS = [
    TargetSpec(mode="stretch", size=(8, 6), allow_upscale=True, channels=3, dtype="|u1", max_pixels=MAX_PIXELS),
    TargetSpec(mode="fit", max_side=12, allow_upscale=True, channels=1, dtype="<u2", max_pixels=MAX_PIXELS),
    TargetSpec(mode="none", max_side=20, channels=3, dtype="<u2", max_pixels=MAX_PIXELS),
]


@pytest.mark.slow
@FUZZ
@given(mutated(), st.sampled_from(TARGETS))
def test_prepare_on_mutated_files_gives_the_target_or_a_decode_error(data: bytes, target: TargetSpec) -> None:
    header = probe_header(data)
    try:
        prepared = prepare_image(data, target, header)
    except DecodeError as exc:
        assert str(exc)  # noqa: PT017 - the call may also succeed
        return
    pixels = prepared.pixels
    assert pixels.dtype == np.dtype(target.dtype) and pixels.flags.c_contiguous
    assert pixels.ndim == 3 and pixels.shape[2] == target.channels
    if target.mode == "stretch":
        assert pixels.shape[:2] == (6, 8)
    elif target.mode == "fit":
        assert pixels.shape[:2] == (12, 12)
    else:
        assert 0 < max(pixels.shape[:2]) <= 20


# --- formats the probe does not read: the pixel limit and the refusals still hold ------------------


def _pam(width: int, height: int) -> bytes:
    return f"P7\nWIDTH {width}\nHEIGHT {height}\nDEPTH 1\nMAXVAL 255\nENDHDR\n".encode() + bytes(width * height)


def test_a_format_the_probe_does_not_know_cannot_bypass_the_pixel_limit() -> None:
    # OpenCV decodes PAM, Sun raster and others that probe_header does not read: the pixel limit
    # (checked on the header) never saw them, and a 6-megapixel PAM came back under max_pixels=1000.
    assert probe_header(_pam(3000, 2000)) is None
    with pytest.raises(DecodeError, match="not an image"):
        decode_image(_pam(3000, 2000), max_pixels=1000)


def test_formats_the_build_refuses_are_refused_by_decode_too() -> None:
    ok, ras = cv2.imencode(".ras", np.zeros((5, 7, 3), np.uint8))
    assert ok
    for data in (ras.tobytes(), _pam(7, 5)):
        with pytest.raises(DecodeError, match="the header is not PNG, JPEG, BMP, TIFF, WebP or PNM"):
            prepare_image(data, TargetSpec())
