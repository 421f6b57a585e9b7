"""Decoding: file bytes -> oriented pixels -> resized -> converted, in one function.

:func:`prepare_image` is the one place a source file becomes stored pixels; the build, the bench's
folder reader and the examples call it, so they agree on every rule (docs/format.md, "Decoding
rules"). Decoding reads bytes and calls ``cv2.imdecode`` (``cv2.imread`` cannot open non-ASCII
paths on every platform).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..errors import OptionError
from ..transforms.functional import (
    Geometry,
    UpscaleError,
    apply_orientation,
    convert_channels,
    convert_depth,
    plan_geometry,
    resize_image,
)
from .probe import ImageHeader, probe_header

__all__ = [
    "DecodeError",
    "TargetSpec",
    "PreparedImage",
    "prepare_image",
    "decode_image",
    "read_source_file",
    "check_header",
    "normalise_header",
    "incomplete_reason",
]


class DecodeError(ValueError):
    """A file is not a usable image; the message is the reason shown to the user."""


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
    import cv2

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
    import cv2  # on first use: ``import dlpack`` stays light

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


_MODES = ("stretch", "fit", "none")
_DTYPES = ("|u1", "<u2")


@dataclass(frozen=True)
class TargetSpec:
    """What :func:`prepare_image` turns a file into.

    Attributes
    ----------
    mode : str
        ``"stretch"`` (exactly ``size``), ``"fit"`` (keep the aspect ratio inside ``size`` or a
        ``max_side`` square, padded with zeros) or ``"none"`` (original size, shrunk to ``max_side``).
    size : tuple of int or None
        ``(width, height)`` for ``stretch`` and ``fit``.
    max_side : int or None
        Longest side for ``fit`` (when ``size`` is None) and ``none``.
    allow_upscale : bool
        Whether an image smaller than the target may be enlarged; otherwise it is a bad input.
    channels : int
        1 (gray) or 3 (RGB).
    dtype : str
        NumPy dtype string of the pixels: ``"|u1"`` or ``"<u2"``.
    max_pixels : int
        Decompression-bomb guard: files whose header promises more pixels are refused.
    """

    mode: str = "none"
    size: tuple[int, int] | None = None
    max_side: int | None = None
    allow_upscale: bool = False
    channels: int = 3
    dtype: str = "|u1"
    max_pixels: int = 2**28

    def __post_init__(self) -> None:
        if self.mode not in _MODES:
            raise OptionError(f"mode must be one of {', '.join(_MODES)}; got {self.mode!r}")
        if self.size is not None:
            object.__setattr__(self, "size", (int(self.size[0]), int(self.size[1])))
        if self.mode == "stretch" and self.size is None:
            raise OptionError("mode=stretch needs size=(width, height)")
        if self.mode == "fit" and self.size is None and self.max_side is None:
            raise OptionError("mode=fit needs size=(width, height) or max_side")
        if self.channels not in (1, 3):
            raise OptionError(f"channels must be 1 or 3; got {self.channels!r}")
        try:
            dtype = np.dtype(self.dtype).str
        except TypeError as exc:
            raise OptionError(f"dtype must be one of {', '.join(_DTYPES)}; got {self.dtype!r}") from exc
        if dtype not in _DTYPES:
            raise OptionError(f"dtype must be one of {', '.join(_DTYPES)}; got {self.dtype!r}")
        object.__setattr__(self, "dtype", dtype)
        if self.max_pixels <= 0:
            raise OptionError(f"max_pixels must be > 0, got {self.max_pixels}")

    def geometry(self, height: int, width: int) -> Geometry:
        """Where a ``height x width`` (upright) image goes; raises :class:`UpscaleError` if it would be enlarged."""
        return plan_geometry(height, width, self.mode, self.size, self.max_side, self.allow_upscale)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``size`` as a list)."""
        return {
            "mode": self.mode,
            "size": list(self.size) if self.size is not None else None,
            "max_side": self.max_side,
            "allow_upscale": self.allow_upscale,
            "channels": self.channels,
            "dtype": self.dtype,
            "max_pixels": self.max_pixels,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TargetSpec:
        """Inverse of :meth:`to_dict`."""
        size = d.get("size")
        return cls(**{**d, "size": tuple(size) if size is not None else None})


@dataclass(frozen=True)
class PreparedImage:
    """A decoded, oriented, resized and converted image.

    Attributes
    ----------
    pixels : numpy.ndarray
        H x W x C, C-contiguous, RGB (or gray), of the target's dtype and channels.
    original_size : tuple of int
        ``(height, width)`` of the decoded image after orientation, before resizing.
    geometry : Geometry
        Where the original lies in ``pixels`` (scale and offset, for labels that follow the image).
    conversions : tuple of str
        Channel and depth conversions applied, e.g. ``("gray->rgb", "16bit->8bit")``.
    """

    pixels: np.ndarray
    original_size: tuple[int, int]
    geometry: Geometry
    conversions: tuple[str, ...]


def prepare_image(data: bytes, target: TargetSpec, header: ImageHeader | None = None) -> PreparedImage:
    """Decode -> orient -> resize -> convert one file's bytes into ``target``'s form.

    Parameters
    ----------
    data : bytes
        The whole file.
    target : TargetSpec
        Geometry, channels, dtype and pixel limit.
    header : ImageHeader, optional
        The file's probed header, when the caller has it (saves probing again).

    Returns
    -------
    PreparedImage

    Raises
    ------
    DecodeError
        The bytes are not a usable image (empty, truncated, corrupt, too many pixels, an unsupported
        pixel type), or the image would be enlarged and ``target.allow_upscale`` is false.
    """
    import cv2

    if not data:
        raise DecodeError("empty file (0 bytes)")
    # Colour order is swapped after resizing: the same result on fewer pixels.
    img = decode_image(data, header, target.max_pixels, rgb=False)
    h, w = img.shape[:2]
    try:
        g = target.geometry(h, w)
    except UpscaleError as exc:
        raise DecodeError(str(exc)) from exc
    img = resize_image(img, g)
    if img.shape[2] == 3:
        img = cv2.cvtColor(img, cv2.COLOR_BGR2RGB)
    conversions: list[str] = []
    if img.shape[2] != target.channels:
        conversions.append(f"{'gray' if img.shape[2] == 1 else 'rgb'}->{'rgb' if target.channels == 3 else 'gray'}")
        img = convert_channels(img, target.channels)
    if img.dtype != np.dtype(target.dtype):
        conversions.append(f"{img.dtype.itemsize * 8}bit->{np.dtype(target.dtype).itemsize * 8}bit")
        # The one 16 <-> 8-bit rule (exact scaling by 257) for every caller.
        img = convert_depth(img, target.dtype)
    return PreparedImage(np.ascontiguousarray(img), (h, w), g, tuple(conversions))
