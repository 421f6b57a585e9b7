"""Tests for ``dlpack.sources.probe``: what a header says must match what cv2 decodes."""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence

import cv2
import numpy as np
import pytest
from _exif import exif_block, png_with_exif, webp_with_exif
from hypothesis import given, settings
from hypothesis import strategies as st

from dlpack.sources.probe import HEADER_BYTES, ImageHeader, probe_header, unsupported_reason

# Width != height everywhere, so a swapped pair of axes cannot pass.
WIDTH, HEIGHT = 37, 23

Fields = tuple[int, int, int, bool, int]


def _image(channels: int, dtype: type[np.integer], *, seed: int = 0, opaque: bool = False) -> np.ndarray:
    """A random WIDTH x HEIGHT image; ``opaque`` fills a fourth channel with the maximum value."""
    rng = np.random.default_rng(seed)
    shape = (HEIGHT, WIDTH) if channels == 1 else (HEIGHT, WIDTH, channels)
    image = rng.integers(0, np.iinfo(dtype).max, shape, dtype=dtype, endpoint=True)
    if opaque:
        image[..., 3] = np.iinfo(dtype).max
    return image


def _encode(ext: str, image: np.ndarray, params: Sequence[int] = ()) -> bytes:
    """Encode with cv2, skipping the test when this cv2 build cannot write the format."""
    try:
        ok, buf = cv2.imencode(ext, image, list(params))
    except cv2.error:
        ok = False
    if not ok:
        pytest.skip(f"this cv2 build cannot encode {ext} with shape {image.shape} and dtype {image.dtype}")
    return buf.tobytes()


def _decode(data: bytes, flags: int = cv2.IMREAD_UNCHANGED) -> np.ndarray:
    """Decode with cv2, failing the test when it cannot."""
    decoded = cv2.imdecode(np.frombuffer(data, np.uint8), flags)
    assert decoded is not None, "cv2 could not decode the test image"
    return decoded


def _decoded_fields(data: bytes) -> Fields:
    """``(width, height, channels, has_alpha, bit_depth)`` of what cv2 returns, unchanged."""
    decoded = _decode(data)
    assert decoded.dtype in (np.uint8, np.uint16)
    has_alpha = decoded.ndim == 3 and decoded.shape[2] == 4
    channels = 1 if decoded.ndim == 2 else 3
    return decoded.shape[1], decoded.shape[0], channels, has_alpha, 16 if decoded.dtype == np.uint16 else 8


def _probed_fields(header: ImageHeader | None) -> Fields:
    """The same tuple from a probed header."""
    assert header is not None
    return header.width, header.height, header.channels, header.has_alpha, header.bit_depth


# --- images written by cv2 ---------------------------------------------------------------------------

U8, U16 = np.uint8, np.uint16
WEBP_LOSSY = (cv2.IMWRITE_WEBP_QUALITY, 80)
WEBP_LOSSLESS = (cv2.IMWRITE_WEBP_QUALITY, 101)

ENCODED_CASES = [
    pytest.param(".png", 1, U8, (), "png", id="png-gray8"),
    pytest.param(".png", 1, U16, (), "png", id="png-gray16"),
    pytest.param(".png", 3, U8, (), "png", id="png-colour8"),
    pytest.param(".png", 3, U16, (), "png", id="png-colour16"),
    pytest.param(".png", 4, U8, (), "png", id="png-alpha8"),
    pytest.param(".png", 4, U16, (), "png", id="png-alpha16"),
    pytest.param(".jpg", 1, U8, (), "jpeg", id="jpeg-gray8"),
    pytest.param(".jpg", 3, U8, (), "jpeg", id="jpeg-colour8"),
    pytest.param(".bmp", 1, U8, (), "bmp", id="bmp-gray8"),
    pytest.param(".bmp", 3, U8, (), "bmp", id="bmp-colour8"),
    pytest.param(".bmp", 4, U8, (), "bmp", id="bmp-alpha8"),
    pytest.param(".tiff", 1, U8, (), "tiff", id="tiff-gray8"),
    pytest.param(".tiff", 1, U16, (), "tiff", id="tiff-gray16"),
    pytest.param(".tiff", 3, U8, (), "tiff", id="tiff-colour8"),
    pytest.param(".tiff", 3, U16, (), "tiff", id="tiff-colour16"),
    pytest.param(".tiff", 4, U8, (), "tiff", id="tiff-alpha8"),
    pytest.param(".tiff", 4, U16, (), "tiff", id="tiff-alpha16"),
    pytest.param(".webp", 1, U8, (), "webp", id="webp-gray8-lossless"),
    pytest.param(".webp", 3, U8, (), "webp", id="webp-colour8-lossless"),
    pytest.param(".webp", 3, U8, WEBP_LOSSY, "webp", id="webp-colour8-lossy"),
    pytest.param(".pgm", 1, U8, (), "pnm", id="pgm-gray8"),
    pytest.param(".pgm", 1, U16, (), "pnm", id="pgm-gray16"),
    pytest.param(".ppm", 3, U8, (), "pnm", id="ppm-colour8"),
    pytest.param(".ppm", 3, U16, (), "pnm", id="ppm-colour16"),
    pytest.param(".pbm", 1, U8, (), "pnm", id="pbm-bitmap"),
]


@pytest.mark.parametrize(("ext", "channels", "dtype", "params", "fmt"), ENCODED_CASES)
def test_header_matches_cv2_decode(
    ext: str, channels: int, dtype: type[np.integer], params: Sequence[int], fmt: str
) -> None:
    data = _encode(ext, _image(channels, dtype), params)
    header = probe_header(data)
    assert header is not None
    assert header.format == fmt
    assert header.orientation == 1
    assert header.oriented_size == (WIDTH, HEIGHT)
    assert _probed_fields(header) == _decoded_fields(data)


@pytest.mark.parametrize("params", [(), WEBP_LOSSY], ids=["lossless", "lossy"])
def test_webp_alpha_matches_cv2_decode(params: Sequence[int]) -> None:
    data = _encode(".webp", _image(4, U8), params)
    if _decode(data).shape[2:] != (4,):
        pytest.skip("this cv2 build drops WebP alpha")
    header = probe_header(data)
    assert _probed_fields(header) == (WIDTH, HEIGHT, 3, True, 8)


def test_webp_opaque_alpha_is_dropped_by_encoder_and_probe_agrees() -> None:
    data = _encode(".webp", _image(4, U8, opaque=True))
    assert _probed_fields(probe_header(data)) == _decoded_fields(data)


@pytest.mark.parametrize("ext", [".png", ".jpg", ".bmp", ".webp", ".pgm"])
def test_header_bytes_prefix_is_enough(ext: str) -> None:
    # TIFF is left out: libtiff writes the IFD after the pixels, beyond the prefix of a large file.
    shape = (300, 500) if ext == ".pgm" else (300, 500, 3)
    data = _encode(ext, np.random.default_rng(1).integers(0, 256, shape, dtype=np.uint8))
    assert len(data) > HEADER_BYTES
    assert probe_header(data[:HEADER_BYTES]) == probe_header(data)
    assert probe_header(data) is not None


# --- JPEG with EXIF orientation ----------------------------------------------------------------------


def _exif_app1(orientation: int, byte_order: bytes) -> bytes:
    """An APP1 segment holding a one-entry Exif IFD0 with the orientation tag."""
    order = "<" if byte_order == b"II" else ">"
    entry = struct.pack(order + "HHIH2x", 0x0112, 3, 1, orientation)
    tiff = byte_order + struct.pack(order + "HI", 42, 8) + struct.pack(order + "H", 1) + entry + bytes(4)
    payload = b"Exif\x00\x00" + tiff
    return b"\xff\xe1" + struct.pack(">H", len(payload) + 2) + payload


@pytest.mark.parametrize(
    ("byte_order", "orientation", "oriented"),
    [
        (b"II", 6, (HEIGHT, WIDTH)),
        (b"MM", 6, (HEIGHT, WIDTH)),
        (b"MM", 8, (HEIGHT, WIDTH)),
        (b"II", 3, (WIDTH, HEIGHT)),
    ],
)
def test_jpeg_exif_orientation(byte_order: bytes, orientation: int, oriented: tuple[int, int]) -> None:
    plain = _encode(".jpg", _image(3, U8))
    data = plain[:2] + _exif_app1(orientation, byte_order) + plain[2:]
    header = probe_header(data)
    assert header is not None
    assert (header.width, header.height, header.orientation) == (WIDTH, HEIGHT, orientation)
    assert header.oriented_size == oriented
    # IMREAD_UNCHANGED ignores EXIF, so it returns the stored size; IMREAD_COLOR applies it.
    assert _probed_fields(header) == _decoded_fields(data)
    assert _decode(data, cv2.IMREAD_COLOR).shape[1::-1] == oriented


def test_jpeg_malformed_exif_falls_back_to_orientation_1() -> None:
    plain = _encode(".jpg", _image(1, U8))
    app1 = _exif_app1(6, b"II")
    data = plain[:2] + app1[:10] + b"XX" + app1[12:] + plain[2:]  # byte order mark destroyed
    header = probe_header(data)
    assert header is not None
    assert header.orientation == 1


# --- hand-built PNG ----------------------------------------------------------------------------------


def _png_chunk(kind: bytes, body: bytes) -> bytes:
    """A PNG chunk with its length and CRC."""
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def _png(
    colour_type: int,
    depth: int,
    *chunks: bytes,
    width: int = WIDTH,
    height: int = HEIGHT,
    pixels: bool = True,
) -> bytes:
    """A PNG of zero pixels; ``chunks`` go between IHDR and IDAT."""
    samples = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}[colour_type]
    row = bytes(1 + (width * samples * depth + 7) // 8)
    ihdr = _png_chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, depth, colour_type, 0, 0, 0))
    idat = _png_chunk(b"IDAT", zlib.compress(row * height)) if pixels else b""
    return b"\x89PNG\r\n\x1a\n" + ihdr + b"".join(chunks) + idat + _png_chunk(b"IEND", b"")


GRAY_PALETTE = _png_chunk(b"PLTE", bytes(i for i in range(16) for _ in range(3)))
COLOUR_PALETTE = _png_chunk(b"PLTE", bytes(v for i in range(16) for v in (i * 16, 0, 255 - i * 16)))


@pytest.mark.parametrize(
    ("data", "fields"),
    [
        pytest.param(_png(3, 8, COLOUR_PALETTE), (WIDTH, HEIGHT, 3, False, 8), id="palette"),
        pytest.param(_png(3, 4, GRAY_PALETTE), (WIDTH, HEIGHT, 3, False, 8), id="gray-palette"),
        pytest.param(
            _png(3, 8, COLOUR_PALETTE, _png_chunk(b"tRNS", b"\x00\x80")),
            (WIDTH, HEIGHT, 3, True, 8),
            id="palette-trns",
        ),
        pytest.param(
            _png(3, 1, GRAY_PALETTE, _png_chunk(b"tEXt", b"k\x00v"), _png_chunk(b"tRNS", b"\x00")),
            (WIDTH, HEIGHT, 3, True, 8),
            id="palette1-text-trns",
        ),
        pytest.param(_png(0, 2), (WIDTH, HEIGHT, 1, False, 8), id="gray2"),
        # cv2 ignores tRNS on gray images but honours it on RGB ones.
        pytest.param(_png(0, 8, _png_chunk(b"tRNS", b"\x00\x05")), (WIDTH, HEIGHT, 1, False, 8), id="gray-trns"),
        pytest.param(_png(2, 16, _png_chunk(b"tRNS", bytes(6))), (WIDTH, HEIGHT, 3, True, 16), id="rgb16-trns"),
        # cv2 expands gray+alpha to BGRA.
        pytest.param(_png(4, 8), (WIDTH, HEIGHT, 3, True, 8), id="gray-alpha8"),
        pytest.param(_png(4, 16), (WIDTH, HEIGHT, 3, True, 16), id="gray-alpha16"),
    ],
)
def test_hand_built_png_matches_cv2_decode(data: bytes, fields: Fields) -> None:
    assert _probed_fields(probe_header(data)) == fields
    assert _decoded_fields(data) == fields


def test_png_size_is_read_without_decoding() -> None:
    # A decompression bomb's IHDR is all a build needs to refuse it.
    header = probe_header(_png(2, 8, width=100_000, height=70_000, pixels=False))
    assert header is not None
    assert (header.width, header.height) == (100_000, 70_000)


# --- hand-built BMP ----------------------------------------------------------------------------------


def _bmp(
    bits: int,
    *,
    compression: int = 0,
    info_size: int = 40,
    palette: Sequence[tuple[int, int, int]] = (),
    colours_used: int = 0,
    masks: tuple[int, int, int, int] | None = None,
    top_down: bool = False,
) -> bytes:
    """A BMP of zero pixels with the given info header size, palette (RGB triples) and masks."""
    stride = (WIDTH * bits + 31) // 32 * 4
    pixels = bytes(stride * HEIGHT)
    height = -HEIGHT if top_down else HEIGHT
    info = struct.pack(
        "<IiiHHIIiiII", info_size, WIDTH, height, 1, bits, compression, len(pixels), 0, 0, colours_used, 0
    )
    if info_size > 40:
        info += struct.pack("<4I", *(masks or (0, 0, 0, 0))) + bytes(info_size - 56)
    colours = b"".join(bytes((b, g, r, 0)) for r, g, b in palette)
    offset = 14 + len(info) + len(colours)
    return b"BM" + struct.pack("<IHHI", offset + len(pixels), 0, 0, offset) + info + colours + pixels


def _grays(n: int) -> list[tuple[int, int, int]]:
    """``n`` gray palette entries."""
    return [(v, v, v) for v in range(0, 256, 256 // n)]


def _colours(n: int) -> list[tuple[int, int, int]]:
    """``n`` palette entries that are not gray."""
    return [(v, 0, 255 - v) for v in range(0, 256, 256 // n)]


ALPHA_MASKS = (0xFF0000, 0xFF00, 0xFF, 0xFF000000)
NO_ALPHA_MASKS = (0xFF0000, 0xFF00, 0xFF, 0)


@pytest.mark.parametrize(
    ("data", "fields"),
    [
        # cv2 returns gray for an all-gray palette and BGR otherwise.
        pytest.param(_bmp(1, palette=_grays(2)), (WIDTH, HEIGHT, 1, False, 8), id="1-gray"),
        pytest.param(_bmp(1, palette=_colours(2)), (WIDTH, HEIGHT, 3, False, 8), id="1-colour"),
        pytest.param(_bmp(4, palette=_colours(16)), (WIDTH, HEIGHT, 3, False, 8), id="4-colour"),
        pytest.param(_bmp(8, palette=_grays(4), colours_used=4), (WIDTH, HEIGHT, 1, False, 8), id="8-gray-short"),
        pytest.param(_bmp(8, palette=_colours(256), top_down=True), (WIDTH, HEIGHT, 3, False, 8), id="8-top-down"),
        pytest.param(_bmp(24, top_down=True), (WIDTH, HEIGHT, 3, False, 8), id="24-top-down"),
        pytest.param(_bmp(16), (WIDTH, HEIGHT, 3, False, 8), id="16"),
        pytest.param(_bmp(32), (WIDTH, HEIGHT, 3, False, 8), id="32-rgb"),
        pytest.param(
            _bmp(32, compression=3, info_size=124, masks=ALPHA_MASKS),
            (WIDTH, HEIGHT, 3, True, 8),
            id="32-v5-alpha",
        ),
        pytest.param(
            _bmp(32, compression=3, info_size=108, masks=ALPHA_MASKS),
            (WIDTH, HEIGHT, 3, True, 8),
            id="32-v4-alpha",
        ),
        # cv2 returns BGRA for any 32-bit BITFIELDS bitmap, even one without an alpha mask.
        pytest.param(
            _bmp(32, compression=3, info_size=124, masks=NO_ALPHA_MASKS),
            (WIDTH, HEIGHT, 3, True, 8),
            id="32-v5-no-alpha-mask",
        ),
    ],
)
def test_hand_built_bmp_matches_cv2_decode(data: bytes, fields: Fields) -> None:
    assert _probed_fields(probe_header(data)) == fields
    assert _decoded_fields(data) == fields


# --- hand-built TIFF ---------------------------------------------------------------------------------


def _tiff(
    samples: int,
    bits: int,
    photometric: int,
    *,
    big_endian: bool = False,
    orientation: int | None = None,
    sample_format: int = 1,
) -> bytes:
    """An uncompressed single-strip TIFF of zero pixels, IFD first."""
    order = ">" if big_endian else "<"
    pixels = bytes((WIDTH * samples * bits + 7) // 8 * HEIGHT)
    tags = {256: [WIDTH], 257: [HEIGHT], 258: [bits] * samples, 259: [1], 262: [photometric], 273: [0]}
    tags |= {277: [samples], 278: [HEIGHT], 279: [len(pixels)], 339: [sample_format] * samples}
    if orientation is not None:
        tags[274] = [orientation]
    if photometric == 3:
        tags[320] = [0] * (3 << bits)
    values_at = 8 + 2 + 12 * len(tags) + 4
    entries, values = b"", b""
    for tag, vals in sorted(tags.items()):
        kind, code = (4, "I") if tag in (273, 279) else (3, "H")
        raw = struct.pack(order + code * len(vals), *vals)
        if len(raw) > 4:
            entries += struct.pack(order + "HHII", tag, kind, len(vals), values_at + len(values))
            values += raw
        else:
            entries += struct.pack(order + "HHI", tag, kind, len(vals)) + raw.ljust(4, b"\x00")
    ifd = struct.pack(order + "H", len(tags)) + entries + bytes(4)
    strip = struct.pack(order + "I", values_at + len(values))
    at = 2 + 12 * sorted(tags).index(273) + 8
    ifd = ifd[:at] + strip + ifd[at + 4 :]
    return (b"MM\x00*" if big_endian else b"II*\x00") + struct.pack(order + "I", 8) + ifd + values + pixels


@pytest.mark.parametrize(
    ("data", "fields"),
    [
        pytest.param(_tiff(3, 8, 2, big_endian=True), (WIDTH, HEIGHT, 3, False, 8), id="rgb8-big-endian"),
        pytest.param(_tiff(1, 16, 1, big_endian=True), (WIDTH, HEIGHT, 1, False, 16), id="gray16-big-endian"),
        pytest.param(_tiff(1, 1, 0), (WIDTH, HEIGHT, 1, False, 8), id="bilevel"),
        pytest.param(_tiff(1, 12, 1), (WIDTH, HEIGHT, 1, False, 16), id="gray12"),
        pytest.param(_tiff(1, 8, 3), (WIDTH, HEIGHT, 3, False, 8), id="palette8"),
        # cv2 drops the alpha of gray+alpha TIFFs and reads 16-bit ones as 8-bit.
        pytest.param(_tiff(2, 8, 1), (WIDTH, HEIGHT, 1, False, 8), id="gray-alpha8"),
        pytest.param(_tiff(2, 16, 1), (WIDTH, HEIGHT, 1, False, 8), id="gray-alpha16"),
        # cv2 returns 4 channels for CMYK.
        pytest.param(_tiff(4, 8, 5), (WIDTH, HEIGHT, 3, True, 8), id="cmyk"),
    ],
)
def test_hand_built_tiff_matches_cv2_decode(data: bytes, fields: Fields) -> None:
    assert _probed_fields(probe_header(data)) == fields
    assert _decoded_fields(data) == fields


@pytest.mark.parametrize("big_endian", [False, True])
def test_tiff_orientation(big_endian: bool) -> None:
    data = _tiff(3, 8, 2, big_endian=big_endian, orientation=6)
    header = probe_header(data)
    assert header is not None
    assert (header.width, header.height, header.orientation) == (WIDTH, HEIGHT, 6)
    assert header.oriented_size == (HEIGHT, WIDTH)
    # cv2 applies TIFF orientation even with IMREAD_UNCHANGED.
    assert _decode(data).shape[1::-1] == header.oriented_size


@pytest.mark.parametrize("sample_format", [2, 3], ids=["signed", "float"])
def test_tiff_samples_cv2_returns_as_neither_uint8_nor_uint16_give_none(sample_format: int) -> None:
    bits = 16 if sample_format == 2 else 32
    assert probe_header(_tiff(1, bits, 1, sample_format=sample_format)) is None


# --- hand-built PNM ----------------------------------------------------------------------------------


def _ascii_pnm(magic: bytes, header: bytes, samples: int, value: int) -> bytes:
    """A plain (ASCII) PNM whose samples all equal ``value``."""
    # cv2's ASCII reader wants bytes after the last sample.
    body = b" ".join([str(value).encode()] * (WIDTH * HEIGHT * samples))
    return magic + header + body + b"\n" * 8


@pytest.mark.parametrize(
    ("data", "fields"),
    [
        pytest.param(_ascii_pnm(b"P1", b"\n37 23\n", 1, 1), (WIDTH, HEIGHT, 1, False, 8), id="P1"),
        pytest.param(
            _ascii_pnm(b"P2", b" # made by hand\n37 # width\n 23\n65535\n", 1, 1000),
            (WIDTH, HEIGHT, 1, False, 16),
            id="P2-16-comments",
        ),
        pytest.param(_ascii_pnm(b"P3", b"\n37 23 255\n", 3, 7), (WIDTH, HEIGHT, 3, False, 8), id="P3"),
        pytest.param(
            b"P5\n#c\n37\t23\r\n1023\n" + bytes(WIDTH * HEIGHT * 2),
            (WIDTH, HEIGHT, 1, False, 16),
            id="P5-10bit",
        ),
    ],
)
def test_hand_built_pnm_matches_cv2_decode(data: bytes, fields: Fields) -> None:
    assert _probed_fields(probe_header(data)) == fields
    assert _decoded_fields(data) == fields


# --- inputs that are not images ----------------------------------------------------------------------


@pytest.mark.parametrize("ext", [".png", ".jpg", ".bmp", ".tiff", ".webp", ".pgm", ".ppm"])
def test_truncated_header_gives_none(ext: str) -> None:
    channels = 1 if ext == ".pgm" else 3
    assert probe_header(_encode(ext, _image(channels, U8))[:10]) is None


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"", id="empty"),
        pytest.param(np.random.default_rng(7).integers(0, 256, 4096, dtype=np.uint8).tobytes(), id="random"),
        pytest.param(b"Plain text, with P5 and BM and RIFF inside.\n" * 20, id="text"),
        pytest.param(b"II+\x00\x08\x00\x00\x00" + bytes(64), id="bigtiff"),
        pytest.param(b"P7\nWIDTH 37\nHEIGHT 23\nDEPTH 1\nMAXVAL 255\nENDHDR\n" + bytes(64), id="pam"),
        pytest.param(b"P5\n37 23\n255", id="pnm-unterminated-maxval"),
        pytest.param(b"P5#c\n37 23\n255\n" + bytes(64), id="pnm-comment-glued-to-magic"),
        pytest.param(b"P5\n0 23\n255\n" + bytes(64), id="pnm-zero-width"),
        pytest.param(_png(2, 8, width=0), id="png-zero-width"),
        pytest.param(b"\xff\xd8\xff\xda\x00\x08" + bytes(64), id="jpeg-scan-before-frame"),
    ],
)
def test_not_an_image_gives_none(data: bytes) -> None:
    assert probe_header(data) is None


# --- properties --------------------------------------------------------------------------------------


def _valid_samples() -> list[bytes]:
    """Small valid files of every format, hand-built so the strategy needs no cv2 encoder."""
    plain_jpeg = b"\xff\xd8\xff\xc0\x00\x11\x08\x00\x17\x00\x25\x03" + bytes(9) + b"\xff\xda\x00\x02\xff\xd9"
    webp_lossless = b"RIFF\x00\x00\x00\x00WEBPVP8L\x05\x00\x00\x00\x2f\x24\x80\x05\x10"
    webp_extended = b"RIFF\x00\x00\x00\x00WEBPVP8X\x0a\x00\x00\x00\x10\x00\x00\x00\x24\x00\x00\x16\x00\x00"
    return [
        _png(3, 8, COLOUR_PALETTE, _png_chunk(b"tRNS", b"\x00")),
        plain_jpeg[:2] + _exif_app1(6, b"MM") + plain_jpeg[2:],
        _bmp(4, palette=_colours(16))[:200],
        _bmp(32, compression=3, info_size=124, masks=ALPHA_MASKS)[:200],
        _tiff(3, 16, 2, orientation=5)[:300],
        _tiff(1, 8, 3, big_endian=True)[:300],
        webp_lossless,
        webp_extended,
        b"P2 # comment\n37 23\n65535\n1 2 3",
    ]


VALID_SAMPLES = _valid_samples()


def test_valid_samples_are_recognised() -> None:
    assert all(probe_header(data) is not None for data in VALID_SAMPLES)


@st.composite
def _mutated_samples(draw: st.DrawFn) -> bytes:
    """A valid sample with a few bytes near the start replaced, then cut at a random length."""
    data = bytearray(draw(st.sampled_from(VALID_SAMPLES)))
    for _ in range(draw(st.integers(0, 6))):
        data[draw(st.integers(0, min(len(data), 128) - 1))] = draw(st.integers(0, 255))
    return bytes(data[: draw(st.integers(0, len(data)))])


MAGICS = [b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"BM", b"II*\x00", b"MM\x00*", b"RIFF\x00\x00\x00\x00WEBP"]
MAGICS += [b"P1", b"P2", b"P3", b"P4", b"P5", b"P6"]


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.binary(max_size=512), st.tuples(st.sampled_from(MAGICS), st.binary(max_size=512)).map(b"".join)))
def test_never_raises_on_arbitrary_bytes(data: bytes) -> None:
    header = probe_header(data)
    assert header is None or (header.width > 0 and header.height > 0 and 1 <= header.orientation <= 8)


@settings(max_examples=400, deadline=None)
@given(_mutated_samples())
def test_never_raises_on_mutated_headers(data: bytes) -> None:
    header = probe_header(data)
    assert header is None or (header.channels in (1, 3) and header.bit_depth in (8, 16))


# --- EXIF orientation of PNG and WebP ---------------------------------------------------------------


@pytest.mark.parametrize("big_endian", [False, True])
@pytest.mark.parametrize("prefix", [b"", b"Exif\x00\x00"], ids=["bare", "exif-prefix"])
def test_png_and_webp_exif_orientation(big_endian: bool, prefix: bytes) -> None:
    exif = prefix + exif_block(7, big_endian)
    png = png_with_exif(_encode(".png", _image(3, U8)), exif)
    webp = webp_with_exif(_encode(".webp", _image(3, U8), WEBP_LOSSLESS), WIDTH, HEIGHT, exif)
    for data in (png, webp):
        header = probe_header(data)
        assert header is not None
        assert (header.width, header.height, header.orientation) == (WIDTH, HEIGHT, 7)
        assert header.oriented_size == (HEIGHT, WIDTH)


def test_webp_exif_chunk_past_the_head_makes_the_probe_read_the_whole_file() -> None:
    # The EXIF chunk follows the image data; a head without it must not pass for orientation 1.
    noise = np.random.default_rng(3).integers(0, 256, (300, 200, 3), dtype=np.uint8)
    data = webp_with_exif(_encode(".webp", noise, WEBP_LOSSLESS), 200, 300, exif_block(6))
    assert len(data) > HEADER_BYTES
    assert probe_header(data[:HEADER_BYTES]) is None
    header = probe_header(data)
    assert header is not None and header.orientation == 6 and header.oriented_size == (300, 200)


def test_png_exif_chunk_after_idat_is_read_when_the_bytes_reach_it() -> None:
    data = png_with_exif(_encode(".png", _image(1, U8)), exif_block(5), after_idat=True)
    header = probe_header(data)
    assert header is not None and header.orientation == 5


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (_tiff(1, 32, 1, sample_format=3), "float TIFF (32-bit floating-point samples) is not supported"),
        (_tiff(1, 16, 1, sample_format=3), "float TIFF (16-bit floating-point samples) is not supported"),
        (_tiff(1, 16, 1, sample_format=2), "signed-integer TIFF (16-bit signed samples) is not supported"),
        (_tiff(1, 32, 1), "TIFF with 32-bit integer samples is not supported"),
        (_tiff(1, 16, 32845), "LogLuv TIFF (floating-point luminance samples) is not supported"),
        (b"II+\x00\x08\x00\x00\x00" + bytes(16), "BigTIFF is not supported"),
    ],
    ids=["float32", "float16", "int16", "uint32", "logluv", "bigtiff"],
)
def test_images_the_probe_cannot_use_get_an_accurate_reason(data: bytes, reason: str) -> None:
    assert probe_header(data) is None
    found = unsupported_reason(data)
    assert found is not None and found.startswith(reason)


@pytest.mark.parametrize("data", [_tiff(3, 8, 2), b"not an image", b"II*\x00" + bytes(4), b"\x89PNG\r\n\x1a\n"])
def test_usable_or_unknown_bytes_get_no_unsupported_reason(data: bytes) -> None:
    assert unsupported_reason(data) is None
