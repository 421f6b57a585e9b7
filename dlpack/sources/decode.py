"""Decoding: file bytes -> oriented pixels -> resized -> converted, in one function.

:func:`prepare_image` is the one place a source file becomes stored pixels; the build, the bench's
folder reader and the examples call it, so they agree on every rule (docs/format.md, "Decoding
rules"). Decoding reads bytes and calls ``cv2.imdecode`` (``cv2.imread`` cannot open non-ASCII
paths on every platform).

The C libraries behind ``cv2.imdecode`` report some damage only as a line on file descriptor 2:
libjpeg decodes a JPEG whose scan data is cut short or garbled, fills the rest with gray and prints
"Corrupt JPEG data: ...", libtiff prints an error and returns the pixels it could read. Each decode
therefore runs with descriptor 2 sent to a private file (:func:`library_messages`); the lines it
catches decide whether the file is damaged, and never reach the user's terminal.
"""

from __future__ import annotations

import functools
import os
import re
import struct
import sys
import tempfile
import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import numpy as np

from .._interrupt import InterruptsHeld
from ..errors import DlpackError, OptionError
from ..transforms.functional import (
    Geometry,
    UpscaleError,
    apply_orientation,
    convert_channels,
    convert_depth,
    plan_geometry,
    resize_image,
)
from .probe import MAX_TIFF_PAGES, ImageHeader, container_orientation, probe_header, tiff_pages, unsupported_reason

__all__ = [
    "DecodeError",
    "NOT_AN_IMAGE",
    "no_header_reason",
    "TargetSpec",
    "PreparedImage",
    "prepare_image",
    "decode_image",
    "read_source_file",
    "check_header",
    "normalise_header",
    "incomplete_reason",
    "library_messages",
    "damage_reason",
]

T = TypeVar("T")


class DecodeError(DlpackError, ValueError):
    """A file is not a usable image; the message is the reason shown to the user."""


#: The reason given for a file whose header is none of the formats dlpack reads.
NOT_AN_IMAGE = "not an image: the header is not PNG, JPEG, BMP, TIFF, WebP or PNM"


def no_header_reason(data: bytes) -> str:
    """The reason for a file :func:`~dlpack.sources.probe.probe_header` found no usable header in.

    A float or signed TIFF is an image, only one dlpack cannot store: it is named as such rather
    than called "not an image".
    """
    return unsupported_reason(data) or NOT_AN_IMAGE


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
    """Refuse images whose header promises more pixels than ``max_pixels`` (decompression bombs), and
    multi-page TIFFs."""
    if header is None:
        return
    if header.width * header.height > max_pixels:
        raise DecodeError(
            f"image is {header.width}x{header.height} = {header.width * header.height:,} pixels, over the "
            f"limit of {max_pixels:,} (raise max_pixels if this is intended)"
        )
    _check_pages(header.pages)


def _check_pages(pages: int) -> None:
    """Refuse a TIFF of more than one page: packing only the first would drop the rest silently."""
    if pages > MAX_TIFF_PAGES:
        raise DecodeError(f"TIFF with more than {MAX_TIFF_PAGES:,} pages; dlpack packs single images: split the pages")
    if pages > 1:
        raise DecodeError(f"TIFF with {pages} pages; dlpack packs single images: split the pages")


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


# ---------------------------------------------------------------- what the C libraries print

# Every warning libjpeg(-turbo) prints while decoding (jerror.h's JWRN_* texts); its errors end the
# decode through OpenCV and are not printed. Only the first warning of a decode is printed.
_LIBJPEG = re.compile(
    r"(Corrupt JPEG data|Premature end of JPEG file|Inconsistent progression sequence|Invalid SOS parameters"
    r"|Unknown Adobe color transform|Warning: unknown JFIF revision|Application transferred too many scanlines)"
)
# The ones about the pixel data; the rest describe metadata dlpack does not use.
_LIBJPEG_DAMAGE = re.compile(
    r"(Corrupt JPEG data|Premature end of JPEG file|Inconsistent progression sequence|Invalid SOS parameters)"
)
_LIBPNG = re.compile(r"libpng (warning|error): (.*)")
# OpenCV's own log lines ("[ WARN:0@1.2] global grfmt_png.cpp:834 read_chunk ..."), which also carry
# libtiff's messages, and the text of a cv::Exception logged with them.
_OPENCV_LOG = re.compile(r"\[ ?(FATAL|ERROR|WARN|INFO|DEBUG|VERBOSE)[:\]][^\]]*\] (?:global \S+ )?(.*)")
_OPENCV_TEXT = re.compile(r"OpenCV\(\d")


def _is_library_line(line: str) -> bool:
    """Whether a line on descriptor 2 comes from the image libraries (the rest belongs to someone else)."""
    return bool(_LIBJPEG.match(line) or _LIBPNG.match(line) or _OPENCV_LOG.match(line) or _OPENCV_TEXT.match(line))


def damage_reason(messages: list[str]) -> str | None:
    """The reason a decode that printed ``messages`` read a damaged file, or None when they are harmless.

    Parameters
    ----------
    messages : list of str
        The lines the image libraries printed while decoding one file (see :func:`library_messages`).

    Returns
    -------
    str or None
        Any libjpeg warning about the pixel data, any libpng error, a libpng CRC error or a warning about
        the image data, and any error OpenCV logs (libtiff's errors among them) make the file damaged.
        Other warnings (an unusable colour profile, an unknown tag) are harmless.
    """
    for line in messages:
        if _LIBJPEG_DAMAGE.match(line):
            return f"corrupt JPEG data (libjpeg: {line})"
        png = _LIBPNG.match(line)
        if png:
            kind, text = png.groups()
            if kind == "error" or "CRC" in text or text.startswith("IDAT") or "image data" in text:
                return f"corrupt PNG data (libpng: {text})"
            continue
        log = _OPENCV_LOG.match(line)
        if log and log.group(1) in ("FATAL", "ERROR"):
            text = log.group(2).strip()
            if text.startswith("TIFF_Error"):
                return f"corrupt TIFF data (libtiff: {text[len('TIFF_Error') :].strip()})"
            return f"not an image or corrupt (OpenCV: {text})"
    return None


class _Fd2Capture:
    """Sends file descriptor 2 to a private file while decodes run, and gives each decode its own lines.

    Descriptor 2 belongs to the whole process, so concurrent decodes (the bench decodes on threads,
    and OpenCV releases the GIL) share one capture: it is set up when the first decode starts and
    undone when the last one ends. A decode that ran alone owns every library line of its window; a
    decode that overlapped others and saw library lines runs again with no other decode running, so a
    warning is never pinned on the wrong file (damaged files are rare: the repeat costs nothing on
    clean data). Lines that are not the libraries' are copied to the real descriptor 2.
    """

    def __init__(self) -> None:
        self._reset()
        self._usable = hasattr(os, "pread") and hasattr(os, "register_at_fork")
        if self._usable:
            os.register_at_fork(after_in_child=self._after_fork)

    def _reset(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._active = 0  # decodes running
        self._starts = 0  # decodes started so far (tells a decode whether another began during it)
        self._alone = False  # a decode is being repeated with no other running
        self._saved: int | None = None  # the real descriptor 2 while captured
        self._file: int | None = None
        self._passed = 0  # bytes of the file already scanned for other writers' lines

    def _after_fork(self) -> None:
        """In a forked child: give descriptor 2 back and forget the parent's state (and file)."""
        if self._saved is not None:
            os.dup2(self._saved, 2)
            os.close(self._saved)
        if self._file is not None:
            os.close(self._file)
        self._reset()

    def _redirect(self) -> None:
        if self._file is None:
            if hasattr(os, "memfd_create"):
                self._file = os.memfd_create("dlpack-decode-messages", os.MFD_CLOEXEC)
            else:
                with tempfile.TemporaryFile(buffering=0) as f:
                    self._file = os.dup(f.fileno())
            import fcntl

            # O_APPEND: writers always add at the end, also after the file is emptied.
            fcntl.fcntl(self._file, fcntl.F_SETFL, fcntl.fcntl(self._file, fcntl.F_GETFL) | os.O_APPEND)
        if sys.stderr is not None:
            try:
                sys.stderr.flush()  # what Python buffered goes to the terminal, not into the capture
            except (OSError, ValueError):
                pass
        self._saved = os.dup(2)
        os.dup2(self._file, 2)

    def _restore(self, size: int) -> None:
        assert self._saved is not None and self._file is not None
        if size:
            self._pass_on(size, final=True)
        os.dup2(self._saved, 2)
        os.close(self._saved)
        self._saved = None
        if size:
            os.ftruncate(self._file, 0)
        self._passed = 0

    def _size(self) -> int:
        assert self._file is not None
        return os.fstat(self._file).st_size

    def _read(self, start: int, end: int) -> bytes:
        assert self._file is not None
        chunks = []
        while start < end:
            chunk = os.pread(self._file, end - start, start)
            if not chunk:
                break
            chunks.append(chunk)
            start += len(chunk)
        return b"".join(chunks)

    def _pass_on(self, end: int, final: bool) -> None:
        """Copy other writers' complete lines up to ``end`` (all when ``final``) to the real descriptor 2."""
        assert self._saved is not None
        if end <= self._passed:
            return
        data = self._read(self._passed, end)
        if not final:
            data = data[: data.rfind(b"\n") + 1]
        self._passed += len(data)
        keep = [
            line
            for line in data.splitlines(keepends=True)
            if line.strip() and not _is_library_line(line.decode("utf-8", "replace").strip())
        ]
        if keep:
            try:
                os.write(self._saved, b"".join(keep))
            except OSError:
                pass

    def run(self, fn: Callable[[], T]) -> tuple[T, list[str]]:
        """Call ``fn`` with descriptor 2 captured; its result and the library lines it printed."""
        if not self._usable:
            return fn(), []
        with InterruptsHeld():
            return self._run(fn)

    def _run(self, fn: Callable[[], T]) -> tuple[T, list[str]]:
        with self._cond:
            while self._alone:
                self._cond.wait()
            try:
                if self._active == 0:
                    self._redirect()
            except OSError:
                self._usable = False  # no temporary file or descriptor: decode as before
                return fn(), []
            self._active += 1
            self._starts += 1
            first, crowded, start = self._starts, self._active > 1, self._size()
        try:
            result = fn()
        finally:
            with self._cond:
                end = self._size()
                text = self._read(start, end)
                crowded = crowded or self._starts != first
                self._active -= 1
                if self._active == 0:
                    self._restore(end)
                    self._cond.notify_all()
                else:
                    self._pass_on(end, final=False)
        lines = _library_lines(text)
        if lines and crowded:
            return self._run_alone(fn)
        return result, lines

    def _run_alone(self, fn: Callable[[], T]) -> tuple[T, list[str]]:
        """Call ``fn`` again once no other decode runs, holding new ones back, so its lines are its own."""
        with self._cond:
            while self._alone:
                self._cond.wait()
            self._alone = True
            try:
                while self._active:
                    self._cond.wait()
                self._redirect()
                text = b""
                try:
                    result = fn()
                finally:
                    end = self._size()
                    text = self._read(0, end)
                    self._restore(end)
            finally:
                self._alone = False
                self._cond.notify_all()
        return result, _library_lines(text)


def _library_lines(text: bytes) -> list[str]:
    lines = (line.strip() for line in text.decode("utf-8", "replace").splitlines())
    return [line for line in lines if line and _is_library_line(line)]


_CAPTURE = _Fd2Capture()


def library_messages(fn: Callable[[], T]) -> tuple[T, list[str]]:
    """Call ``fn`` (a decode) with file descriptor 2 captured; its result and what the image libraries printed.

    Thread-safe: concurrent calls share one capture, and each gets the lines its own call printed.
    Lines on descriptor 2 that do not come from the image libraries are passed on to it. Where
    descriptors cannot be captured (no ``os.pread``, no temporary file), ``fn`` runs as is and the
    list is empty.

    Parameters
    ----------
    fn : callable
        Called once, or twice when its lines must be told apart from a concurrent call's; it must not
        itself call :func:`library_messages`.

    Returns
    -------
    tuple
        ``fn``'s result and the library lines (libjpeg and libpng messages, OpenCV's log lines).
    """
    return _CAPTURE.run(fn)


def _exif_block(orientation: int) -> bytes:
    """A little-endian Exif TIFF block holding only an Orientation (274) tag."""
    return b"II*\x00" + struct.pack("<IHHHIHHI", 8, 1, 274, 3, 1, orientation, 0, 0)


def _oriented_samples() -> dict[str, Callable[[], bytes]]:
    """A 2x1 (width x height) image with orientation 6 in each format whose orientation dlpack applies."""

    def tiff() -> bytes:
        entries = [  # tag, type (3 = SHORT, 4 = LONG), value: a 2x1 gray image
            (256, 3, 2), (257, 3, 1), (258, 3, 8), (259, 3, 1), (262, 3, 1),
            (273, 4, 8 + 2 + 10 * 12 + 4), (274, 3, 6), (277, 3, 1), (278, 3, 1), (279, 4, 2),
        ]  # fmt: skip
        ifd = len(entries).to_bytes(2, "little")
        for tag, typ, value in entries:
            ifd += struct.pack("<HHII", tag, typ, 1, value)
        return b"II*\x00" + (8).to_bytes(4, "little") + ifd + bytes(4) + bytes([10, 200])

    def png() -> bytes:
        def chunk(kind: bytes, body: bytes) -> bytes:
            return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

        ihdr = chunk(b"IHDR", struct.pack(">IIBBBBB", 2, 1, 8, 0, 0, 0, 0))
        body = chunk(b"eXIf", _exif_block(6)) + chunk(b"IDAT", zlib.compress(bytes([0, 10, 200])))
        return b"\x89PNG\r\n\x1a\n" + ihdr + body + chunk(b"IEND", b"")

    def webp() -> bytes:
        import cv2

        ok, buf = cv2.imencode(".webp", np.full((1, 2, 3), 128, np.uint8), [cv2.IMWRITE_WEBP_QUALITY, 101])
        if not ok:
            return b""
        exif = _exif_block(6)
        vp8x = b"VP8X" + struct.pack("<I", 10) + bytes([0x08, 0, 0, 0]) + (1).to_bytes(3, "little") + bytes(3)
        body = b"WEBP" + vp8x + buf.tobytes()[12:] + b"EXIF" + struct.pack("<I", len(exif)) + exif
        return b"RIFF" + struct.pack("<I", len(body)) + body

    return {"tiff": tiff, "png": png, "webp": webp}


@functools.cache
def _cv2_orients(fmt: str) -> bool:
    """Whether this OpenCV applies ``fmt``'s orientation itself under ``IMREAD_UNCHANGED``.

    OpenCV 5 turns a TIFF upright (libtiff does it, even with IMREAD_UNCHANGED) but leaves PNG and
    WebP as stored; asking a 2x1 sample keeps dlpack from turning an image twice or not at all on
    any version.
    """
    import cv2

    data = _oriented_samples()[fmt]()
    try:
        img = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED) if data else None
    except cv2.error:
        img = None
    return img is not None and img.shape[:2] == (2, 1)


def decode_image(
    data: bytes, header: ImageHeader | None = None, max_pixels: int = 2**28, rgb: bool = True
) -> np.ndarray:
    """Decode file bytes to H x W x C (C = 1 or 3) ``uint8``/``uint16``, RGB order (BGR when
    ``rgb=False``, for callers that resize first), upright.

    Alpha is dropped (not composited); palettes are expanded to RGB; EXIF orientation is applied
    for every format that carries one (JPEG APP1, PNG ``eXIf``, WebP ``EXIF``, TIFF tag 274).

    Raises :class:`DecodeError` for a file that is not a usable image: truncated, a TIFF of more than
    one page, or damaged by the image libraries' own account (see :func:`damage_reason`; their
    messages are caught, never printed).
    """
    return _decode_oriented(data, header, max_pixels, rgb)[0]


def _decode_oriented(data: bytes, header: ImageHeader | None, max_pixels: int, rgb: bool) -> tuple[np.ndarray, int]:
    """:func:`decode_image`, and the EXIF orientation (1..8) it applied: labels drawn on the raw
    pixel array follow the image with it."""
    import cv2  # on first use: ``import dlpack`` stays light

    if header is None:
        header = probe_header(data[:65536]) or probe_header(data)
        if header is None:
            # OpenCV decodes more formats (PAM, Sun raster, ...) than the probe reads; the pixel
            # limit is checked on the probed header, so those are refused here as the build does.
            raise DecodeError(no_header_reason(data))
        header = normalise_header(header, data[:32])
    check_header(header, max_pixels)
    fmt = header.format
    orientation = header.orientation
    if fmt in ("png", "webp"):
        # The header may come from the file's head only; an EXIF chunk can follow the image data.
        orientation = container_orientation(data, fmt)
    reason = incomplete_reason(data, fmt)
    if reason:
        raise DecodeError(reason)
    if fmt == "tiff":
        # The probe may have seen only the file's head; the whole file shows every page.
        _check_pages(tiff_pages(data))
    buf = np.frombuffer(data, dtype=np.uint8)
    # IMREAD_ANYCOLOR keeps gray as gray and, unlike IMREAD_UNCHANGED, applies EXIF orientation.
    flags = cv2.IMREAD_ANYCOLOR if fmt == "jpeg" else cv2.IMREAD_UNCHANGED

    def decode() -> np.ndarray | None | cv2.error:
        try:
            return cv2.imdecode(buf, flags)
        except cv2.error as exc:
            return exc

    img, messages = library_messages(decode)
    reason = damage_reason(messages)
    if isinstance(img, cv2.error):
        raise DecodeError(reason or f"not an image or corrupt (OpenCV: {str(img).strip().splitlines()[-1]})") from img
    if img is None:
        raise DecodeError(reason or "not an image or corrupt (OpenCV could not decode it)")
    if reason:
        raise DecodeError(reason)
    if img.dtype not in (np.uint8, np.uint16):
        raise DecodeError(f"unsupported pixel type {img.dtype}; dlpack stores 8- and 16-bit images")
    if img.ndim == 2:
        img = img[:, :, None]
    c = img.shape[2]
    gray_alpha = header.channels == 1 and header.has_alpha
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
    if fmt in ("tiff", "png", "webp") and orientation != 1 and not _cv2_orients(fmt):
        img = np.ascontiguousarray(apply_orientation(img, orientation))
    # JPEG (OpenCV's EXIF reader) and TIFF (libtiff, where it orients) are turned by OpenCV itself, the
    # others above: in every case the image is upright by the header's orientation.
    return img, orientation if fmt in ("jpeg", "tiff", "png", "webp") else 1


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
    orientation : int
        The EXIF orientation 1..8 the decode applied (1 when the file has none): labels given in the
        raw file's frame are turned with it (:func:`~dlpack.transforms.functional.orient_boxes`).
    """

    pixels: np.ndarray
    original_size: tuple[int, int]
    geometry: Geometry
    conversions: tuple[str, ...]
    orientation: int = 1


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
    img, orientation = _decode_oriented(data, header, target.max_pixels, rgb=False)
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
    return PreparedImage(np.ascontiguousarray(img), (h, w), g, tuple(conversions), orientation)
