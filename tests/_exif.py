"""Test helper: one image with an EXIF orientation tag, written as JPEG, PNG, WebP and TIFF.

Each writer starts from what OpenCV encodes (TIFF is written by hand, as OpenCV has no option for the
tag) and adds the orientation the way other software does: a JPEG APP1 "Exif" segment, a PNG
``eXIf`` chunk, a WebP ``EXIF`` chunk announced by a VP8X header, a TIFF Orientation (274) tag.
"""

from __future__ import annotations

import struct
import zlib

import cv2
import numpy as np

#: The suffixes :func:`oriented_file` writes.
FORMATS = (".jpg", ".png", ".webp", ".tif")


def exif_block(orientation: int, big_endian: bool = False) -> bytes:
    """A TIFF-structured Exif block whose IFD0 holds only the Orientation (0x0112) tag."""
    order, mark = (">", b"MM") if big_endian else ("<", b"II")
    return mark + struct.pack(order + "HIHHHIHHI", 42, 8, 1, 0x0112, 3, 1, orientation, 0, 0)


def _encode(suffix: str, bgr: np.ndarray, params: tuple[int, ...] = ()) -> bytes:
    ok, buf = cv2.imencode(suffix, bgr, list(params))
    assert ok, f"cv2 cannot write {suffix}"
    return buf.tobytes()


def png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def jpeg_with_exif(jpeg: bytes, exif: bytes) -> bytes:
    segment = b"Exif\x00\x00" + exif
    return jpeg[:2] + b"\xff\xe1" + struct.pack(">H", len(segment) + 2) + segment + jpeg[2:]


def png_with_exif(png: bytes, exif: bytes, after_idat: bool = False) -> bytes:
    """``png`` with an ``eXIf`` chunk right after IHDR (where writers put it), or just before IEND."""
    chunk = png_chunk(b"eXIf", exif)
    if after_idat:
        return png[:-12] + chunk + png[-12:]
    return png[:33] + chunk + png[33:]


def webp_with_exif(webp: bytes, width: int, height: int, exif: bytes, prefix: bytes = b"") -> bytes:
    """A simple-format (VP8 or VP8L) ``webp`` turned into the extended format with an EXIF chunk last."""
    assert webp[12:16] in (b"VP8 ", b"VP8L"), webp[12:16]
    payload = prefix + exif
    vp8x = b"VP8X" + struct.pack("<I", 10) + bytes([0x08, 0, 0, 0])
    vp8x += (width - 1).to_bytes(3, "little") + (height - 1).to_bytes(3, "little")
    chunk = b"EXIF" + struct.pack("<I", len(payload)) + payload + (b"\x00" if len(payload) % 2 else b"")
    body = b"WEBP" + vp8x + webp[12:] + chunk
    return b"RIFF" + struct.pack("<I", len(body)) + body


def tiff_with_orientation(rgb: np.ndarray, orientation: int) -> bytes:
    """An uncompressed little-endian RGB TIFF (samples in ``rgb``'s order) with an Orientation tag."""
    h, w, _ = rgb.shape
    tags = [(256, 3, 1, w), (257, 3, 1, h), (258, 3, 3, 0), (259, 3, 1, 1), (262, 3, 1, 2), (273, 4, 1, 0),
            (274, 3, 1, orientation), (277, 3, 1, 3), (278, 3, 1, h), (279, 4, 1, h * w * 3)]  # fmt: skip
    bps_at = 8 + 2 + 12 * len(tags) + 4
    pixels_at = bps_at + 6
    out = b"II*\x00" + struct.pack("<IH", 8, len(tags))
    for tag, kind, count, value in tags:
        value = {258: bps_at, 273: pixels_at}.get(tag, value)
        inline = struct.pack("<I", value) if kind == 4 or tag == 258 else struct.pack("<HH", value, 0)
        out += struct.pack("<HHI", tag, kind, count) + inline
    return out + struct.pack("<I", 0) + struct.pack("<3H", 8, 8, 8) + np.ascontiguousarray(rgb).tobytes()


def oriented_file(suffix: str, bgr: np.ndarray, orientation: int) -> bytes:
    """``bgr`` (H x W x 3, OpenCV's order) written as ``suffix`` with EXIF orientation ``orientation``.

    Lossless for every format but JPEG; orientation 1 is written as a tag too.
    """
    h, w = bgr.shape[:2]
    exif = exif_block(orientation)
    if suffix == ".jpg":
        return jpeg_with_exif(_encode(".jpg", bgr, (cv2.IMWRITE_JPEG_QUALITY, 95)), exif)
    if suffix == ".png":
        return png_with_exif(_encode(".png", bgr), exif)
    if suffix == ".webp":
        return webp_with_exif(_encode(".webp", bgr, (cv2.IMWRITE_WEBP_QUALITY, 101)), w, h, exif)
    if suffix == ".tif":
        return tiff_with_orientation(np.ascontiguousarray(bgr[:, :, ::-1]), orientation)
    raise ValueError(suffix)


def upright(img: np.ndarray, orientation: int) -> np.ndarray:
    """How a viewer shows an image stored as ``img`` with EXIF orientation 1..8 (TIFF 6.0's table)."""
    ops = {
        1: lambda a: a,
        2: lambda a: a[:, ::-1],  # mirrored left-right
        3: lambda a: np.rot90(a, 2),
        4: lambda a: a[::-1],  # mirrored top-bottom
        5: lambda a: np.rot90(a[:, ::-1], 1),  # mirrored, then turned 90 degrees anticlockwise
        6: lambda a: np.rot90(a, -1),  # turned 90 degrees clockwise
        7: lambda a: np.rot90(a[:, ::-1], -1),  # mirrored, then turned 90 degrees clockwise
        8: lambda a: np.rot90(a, 1),  # turned 90 degrees anticlockwise
    }
    return np.ascontiguousarray(ops[orientation](img))
