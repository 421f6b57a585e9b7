"""Folder source: a recursive tree of image files, labels from class folders.

Decoding reads bytes and calls ``cv2.imdecode`` (``cv2.imread`` cannot open non-ASCII paths on
every platform) and normalises to RGB/gray ``uint8``/``uint16`` with the documented rules
(docs/format.md, "Decoding rules").
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, replace
from pathlib import Path

import cv2
import numpy as np

from ..errors import InputFileError, SourceError
from ..options import IMAGE_SUFFIXES
from ..transforms.functional import apply_orientation
from .probe import ImageHeader, probe_header

__all__ = ["SourceItem", "scan_folder", "read_source_file", "decode_image", "DecodeError"]


class DecodeError(ValueError):
    """A file is not a usable image; the message is the reason shown to the user."""


@dataclass(frozen=True)
class SourceItem:
    """One input file: its path relative to the source root (``/`` separators) and its class folder."""

    rel: str
    label: str | None


def scan_folder(
    root: str | os.PathLike[str], labels: str = "auto", follow_symlinks: bool = False
) -> tuple[list[SourceItem], tuple[str, ...], list[InputFileError]]:
    """List image files under ``root`` in sorted order of relative path.

    Returns the items, the sorted class names (empty when unlabelled), and errors for entries
    that cannot be used (symlinks that leave the tree). ``labels="auto"`` uses class folders when
    every image sits in a sub-folder.
    """
    base = Path(root)
    if not base.exists():
        raise SourceError(f"source folder {os.fspath(root)!r} does not exist")
    if not base.is_dir():
        raise SourceError(f"source {os.fspath(root)!r} is not a folder")
    real_base = base.resolve()
    rels: list[str] = []
    errors: list[InputFileError] = []
    for dirpath, dirnames, filenames in os.walk(base, followlinks=follow_symlinks):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for name in filenames:
            if name.startswith(".") or os.path.splitext(name)[1].lower() not in IMAGE_SUFFIXES:
                continue
            full = Path(dirpath, name)
            rel = full.relative_to(base).as_posix()
            if full.is_symlink():
                target = full.resolve()
                if not target.is_relative_to(real_base):
                    errors.append(
                        InputFileError(rel, f"symlink to {target} leaves the source folder; copy the file in")
                    )
                    continue
                if not follow_symlinks:
                    errors.append(InputFileError(rel, "is a symlink; pass --follow-symlinks to pack linked files"))
                    continue
            rels.append(rel)
    rels.sort()
    if not rels and not errors:
        raise SourceError(f"no images found in {os.fspath(root)!r} (looked for {', '.join(sorted(IMAGE_SUFFIXES))})")
    nested = all("/" in r for r in rels)
    if labels == "folders" and not nested:
        flat = [r for r in rels if "/" not in r][:5]
        raise SourceError(
            f"labels=folders needs every image inside a class folder, but {', '.join(flat)} "
            f"sit directly in {os.fspath(root)!r}; move them or use --labels none"
        )
    use_folders = labels == "folders" or (labels == "auto" and nested and bool(rels))
    items = [SourceItem(r, r.split("/", 1)[0] if use_folders else None) for r in rels]
    classes = tuple(sorted({i.label for i in items if i.label is not None}))
    return items, classes, errors


def read_source_file(path: str | os.PathLike[str]) -> bytes:
    """Read a whole file; an empty or unreadable file raises :class:`DecodeError`."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise DecodeError(f"cannot read: {exc.strerror or exc}") from exc
    if not data:
        raise DecodeError("empty file (0 bytes)")
    return data


def check_header(header: ImageHeader | None, max_pixels: int) -> None:
    """Refuse images whose header promises more pixels than ``max_pixels`` (decompression bombs)."""
    if header is not None and header.width * header.height > max_pixels:
        raise DecodeError(
            f"image is {header.width}x{header.height} = {header.width * header.height:,} pixels, over the "
            f"limit of {max_pixels:,} (raise max_pixels if this is intended)"
        )


def normalise_header(header: ImageHeader, head: bytes) -> ImageHeader:
    """Apply dlpack's channel rules to a probed header (gray+alpha PNG counts as gray)."""
    # OpenCV expands gray+alpha PNG (IHDR colour type 4) to BGRA; dlpack stores it as gray.
    if header.format == "png" and len(head) > 25 and head[25] == 4:
        return replace(header, channels=1, has_alpha=True)
    return header


def _jpeg_ends(data: bytes) -> bool:
    """Whether the main JPEG image has its end-of-image marker (bytes after it are allowed)."""
    pos = 2
    n = len(data)
    while pos + 4 <= n:
        if data[pos] != 0xFF:
            return False
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:
            pos += 2
            continue
        seg = int.from_bytes(data[pos + 2 : pos + 4], "big")
        if marker == 0xDA:
            # Entropy-coded data stuffs 0xFF as FF00, so FFD9 after the first scan is the end
            # (an EXIF thumbnail's own markers sit inside the APP1 segment skipped above).
            return data.find(b"\xff\xd9", pos + 2 + seg) >= 0
        pos += 2 + seg
    return False


def _png_ends(data: bytes) -> bool:
    """Whether the PNG's chunk chain reaches IEND (bytes after it are allowed)."""
    pos = 8
    while pos + 8 <= len(data):
        length = int.from_bytes(data[pos : pos + 4], "big")
        if data[pos + 4 : pos + 8] == b"IEND":
            return True
        pos += 12 + length
    return False


def incomplete_reason(data: bytes, fmt: str | None, whole: bool = True) -> str | None:
    """Why a PNG/JPEG file is truncated, or None.

    libjpeg fills a truncated image with gray and only warns, so this is checked before decoding.
    With ``whole=False``, ``data`` is only the file's tail and a miss means "read the whole file".
    """
    if fmt == "jpeg":
        if data.rstrip(b"\x00").endswith(b"\xff\xd9") or (whole and _jpeg_ends(data)):
            return None
        return "truncated JPEG (no end-of-image marker)"
    if fmt == "png":
        if data.endswith(b"IEND\xaeB`\x82") or (whole and _png_ends(data)):
            return None
        return "truncated PNG (no IEND chunk)"
    return None


@functools.lru_cache(maxsize=1)
def _cv2_orients_tiff() -> bool:
    """Whether this OpenCV applies the TIFF orientation tag itself (5.x does, even with IMREAD_UNCHANGED)."""
    entries = [  # tag, type (3 = SHORT, 4 = LONG), value: a 2x1 gray image with orientation 6
        (256, 3, 2), (257, 3, 1), (258, 3, 8), (259, 3, 1), (262, 3, 1),
        (273, 4, 8 + 2 + 10 * 12 + 4), (274, 3, 6), (277, 3, 1), (278, 3, 1), (279, 4, 2),
    ]  # fmt: skip
    ifd = len(entries).to_bytes(2, "little")
    for tag, typ, value in entries:
        ifd += tag.to_bytes(2, "little") + typ.to_bytes(2, "little") + (1).to_bytes(4, "little")
        ifd += value.to_bytes(4, "little")
    tiff = b"II*\x00" + (8).to_bytes(4, "little") + ifd + bytes(4) + bytes([10, 200])
    img = cv2.imdecode(np.frombuffer(tiff, np.uint8), cv2.IMREAD_UNCHANGED)
    return img is not None and img.shape[:2] == (2, 1)


def decode_image(
    data: bytes, header: ImageHeader | None = None, max_pixels: int = 2**28, rgb: bool = True
) -> np.ndarray:
    """Decode file bytes to H x W x C (C = 1 or 3) ``uint8``/``uint16``, RGB order (BGR when
    ``rgb=False``, for callers that resize first), upright.

    Alpha is dropped (not composited); palettes are expanded to RGB; JPEG EXIF orientation is
    applied (also TIFF's orientation tag).
    """
    if header is None:
        header = probe_header(data[:65536]) or probe_header(data)
        if header is not None:
            header = normalise_header(header, data[:32])
    check_header(header, max_pixels)
    fmt = header.format if header is not None else None
    reason = incomplete_reason(data, fmt)
    if reason:
        raise DecodeError(reason)
    buf = np.frombuffer(data, dtype=np.uint8)
    try:
        if fmt == "jpeg":
            # IMREAD_ANYCOLOR keeps gray as gray and, unlike IMREAD_UNCHANGED, applies EXIF orientation.
            img = cv2.imdecode(buf, cv2.IMREAD_ANYCOLOR)
        else:
            img = cv2.imdecode(buf, cv2.IMREAD_UNCHANGED)
    except cv2.error as exc:
        raise DecodeError(f"not an image or corrupt (OpenCV: {str(exc).strip().splitlines()[-1]})") from exc
    if img is None:
        raise DecodeError("not an image or corrupt (OpenCV could not decode it)")
    if img.dtype not in (np.uint8, np.uint16):
        raise DecodeError(f"unsupported pixel type {img.dtype}; dlpack stores 8- and 16-bit images")
    if img.ndim == 2:
        img = img[:, :, None]
    c = img.shape[2]
    gray_alpha = header is not None and header.channels == 1 and header.has_alpha
    if c == 2 or (c == 4 and gray_alpha):
        img = img[:, :, :1]
    elif c == 4:
        img = cv2.cvtColor(img, cv2.COLOR_BGRA2RGB if rgb else cv2.COLOR_BGRA2BGR)
    elif c == 3:
        if rgb:
            img = cv2.cvtColor(img, cv2.COLOR_BGR2RGB)
    elif c != 1:
        raise DecodeError(f"unsupported channel count {c}")
    if img.ndim == 2:
        img = img[:, :, None]
    if header is not None and fmt == "tiff" and header.orientation != 1 and not _cv2_orients_tiff():
        img = np.ascontiguousarray(apply_orientation(img, header.orientation))
    return img
