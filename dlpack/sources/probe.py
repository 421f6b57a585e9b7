"""Read image headers from the leading bytes of a file, without decoding any pixels.

A build probes every file before decoding it: the size lets it refuse decompression bombs, and the
channel count and bit depth let it choose the majority layout. Each field describes what
``cv2.imdecode(data, cv2.IMREAD_UNCHANGED)`` returns, which is not always what the file stores; the
comments in each format's reader say where the two differ and why.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

__all__ = [
    "HEADER_BYTES",
    "MAX_TIFF_PAGES",
    "ImageHeader",
    "probe_header",
    "tiff_pages",
    "container_orientation",
    "unsupported_reason",
]

HEADER_BYTES = 65536
#: How many IFDs (pages) of a TIFF chain are walked at most; a longer chain counts as one more.
MAX_TIFF_PAGES = 10_000

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_PNG_BIT_DEPTHS = {0: (1, 2, 4, 8, 16), 2: (8, 16), 3: (1, 2, 4, 8), 4: (8, 16), 6: (8, 16)}
# SOF0..SOF15 less DHT (C4), JPG (C8) and DAC (CC), which share the range.
_JPEG_FRAME_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_TIFF_TYPES = {1: "B", 3: "H", 4: "I"}
_TIFF_TAGS = frozenset({256, 257, 258, 262, 274, 277, 339})
_PNM_WHITESPACE = b" \t\n\r\v\f"
_PNM_DIGITS = b"0123456789"


@dataclass(frozen=True)
class ImageHeader:
    """What an image file's header says about the array ``cv2.imdecode`` will return.

    Attributes
    ----------
    format : str
        One of ``"png"``, ``"jpeg"``, ``"bmp"``, ``"tiff"``, ``"webp"``, ``"pnm"``.
    width, height : int
        Size as stored in the file, before any EXIF rotation.
    channels : int
        Colour channels once alpha is dropped: 1 (gray) or 3 (colour). Palette images count as 3.
    has_alpha : bool
        Whether the decoded array carries a fourth (alpha) channel.
    bit_depth : int
        8 or 16: the decoded array is ``uint8`` or ``uint16``.
    orientation : int
        EXIF orientation 1..8 (JPEG APP1 Exif, PNG ``eXIf``, WebP ``EXIF``, TIFF tag 274); 1 when absent.
    pages : int
        Pages (IFDs) of a TIFF found in the bytes given, at most ``MAX_TIFF_PAGES + 1``; more may
        follow beyond them. 1 for every other format.
    """

    format: str
    width: int
    height: int
    channels: int
    has_alpha: bool
    bit_depth: int
    orientation: int = 1
    pages: int = 1

    @property
    def oriented_size(self) -> tuple[int, int]:
        """``(width, height)`` once the EXIF orientation is applied; orientations 5 to 8 swap the axes."""
        if self.orientation >= 5:
            return (self.height, self.width)
        return (self.width, self.height)


def probe_header(data: bytes) -> ImageHeader | None:
    """Parse the leading bytes of an image file into an :class:`ImageHeader`.

    Parameters
    ----------
    data : bytes
        The first bytes of the file; :data:`HEADER_BYTES` of them are enough for all but unusual files.

    Returns
    -------
    ImageHeader or None
        ``None`` when the format is not recognised, the header is malformed, or it lies beyond the bytes
        given (a TIFF whose first IFD follows the pixel data, a JPEG whose frame header follows large
        metadata segments), and for pixels cv2 returns as neither ``uint8`` nor ``uint16`` (float or
        signed TIFF). Callers fall back to decoding in that case. Never raises on bad input.
    """
    try:
        if data.startswith(_PNG_SIGNATURE):
            return _probe_png(data)
        if data.startswith(b"\xff\xd8\xff"):
            return _probe_jpeg(data)
        if data.startswith(b"BM"):
            return _probe_bmp(data)
        if data.startswith((b"II*\x00", b"MM\x00*")):
            return _probe_tiff(data)
        if data.startswith(b"RIFF") and data[8:12] == b"WEBP":
            return _probe_webp(data)
        if len(data) >= 2 and data[0:1] == b"P" and data[1:2] in (b"1", b"2", b"3", b"4", b"5", b"6"):
            return _probe_pnm(data)
    except (struct.error, IndexError, ValueError):
        return None
    return None


def _header(
    fmt: str,
    width: int,
    height: int,
    channels: int,
    has_alpha: bool,
    bit_depth: int,
    orientation: int = 1,
    pages: int = 1,
) -> ImageHeader | None:
    """Build an :class:`ImageHeader`, or return ``None`` for an empty image."""
    if width <= 0 or height <= 0:
        return None
    if not 1 <= orientation <= 8:
        orientation = 1
    return ImageHeader(fmt, width, height, channels, has_alpha, bit_depth, orientation, pages)


def _probe_png(data: bytes) -> ImageHeader | None:
    """Read a PNG's IHDR chunk, then walk its chunks for tRNS (before the first IDAT) and eXIf."""
    length, kind, width, height, depth, colour_type = struct.unpack_from(">I4sIIBB", data, 8)
    if length != 13 or kind != b"IHDR" or depth not in _PNG_BIT_DEPTHS.get(colour_type, ()):
        return None
    trns, orientation = _png_chunks(data)
    # cv2 expands gray+alpha to BGRA, and gives any colour image (RGB or palette) with a tRNS chunk an
    # alpha channel, but ignores tRNS on plain gray images.
    if colour_type in (4, 6):
        has_alpha = True
    elif colour_type in (2, 3):
        has_alpha = trns
    else:
        has_alpha = False
    channels = 1 if colour_type == 0 else 3
    return _header("png", width, height, channels, has_alpha, 16 if depth == 16 else 8, orientation)


def _png_chunks(data: bytes) -> tuple[bool, int]:
    """Whether a non-empty tRNS chunk precedes the first IDAT, and the orientation of the first eXIf chunk.

    The chunks before IDAT may run past the bytes given (a large iCCP or text chunk); a tRNS beyond
    them is missed, which only costs a channel that gets dropped later. An eXIf chunk belongs before
    IDAT, but readers (libpng, PIL) also honour one after it, so the walk goes on to IEND: IDAT
    chunks are skipped by their length, never read.
    """
    trns: bool | None = None
    orientation = 0
    pos = 33
    while pos + 8 <= len(data):
        length, kind = struct.unpack_from(">I4s", data, pos)
        if kind == b"IEND":
            break
        if kind in (b"IDAT", b"fdAT") and trns is None:
            trns = False
        elif kind == b"tRNS" and trns is None:
            trns = bool(length)
        elif kind == b"eXIf" and not orientation:
            if pos + 8 + length > len(data):
                break
            orientation = _exif_orientation(data[pos + 8 : pos + 8 + length])
        pos += 12 + length
    return bool(trns), orientation or 1


def _probe_jpeg(data: bytes) -> ImageHeader | None:
    """Walk JPEG markers to the frame header, reading the Exif orientation on the way."""
    orientation = 0
    pos = 2
    while True:
        if data[pos] != 0xFF:
            return None
        while data[pos] == 0xFF:  # fill bytes may pad any marker
            pos += 1
        marker = data[pos]
        pos += 1
        if marker == 0x01 or 0xD0 <= marker <= 0xD8:  # standalone markers carry no length
            continue
        if marker in (0xD9, 0xDA):  # end of image or start of scan before any frame header
            return None
        (length,) = struct.unpack_from(">H", data, pos)
        if length < 2:
            return None
        if marker in _JPEG_FRAME_MARKERS:
            precision, height, width, components = struct.unpack_from(">BHHB", data, pos + 2)
            # 12-bit JPEGs decode to uint8 in cv2; CMYK/YCCK (4 components) decode to BGR.
            if precision not in (8, 12) or components not in (1, 3, 4):
                return None
            channels = 1 if components == 1 else 3
            return _header("jpeg", width, height, channels, False, 8, orientation or 1)
        if marker == 0xE1 and not orientation and data[pos + 2 : pos + 8] == b"Exif\x00\x00":
            orientation = _exif_orientation(data[pos + 8 : pos + length])
        pos += length


def _exif_orientation(tiff: bytes) -> int:
    r"""Return the orientation tag of an Exif TIFF block, or 1 when it is absent or unreadable.

    PNG ``eXIf`` and WebP ``EXIF`` chunks hold the TIFF block itself; some writers put JPEG's
    ``Exif\0\0`` prefix before it, which is skipped.
    """
    if tiff.startswith(b"Exif\x00\x00"):
        tiff = tiff[6:]
    try:
        order = {b"II": "<", b"MM": ">"}.get(tiff[:2])
        if order is None:
            return 1
        magic, ifd = struct.unpack_from(order + "HI", tiff, 2)
        if magic != 42:
            return 1
        return _read_ifd(tiff, ifd, order, frozenset({274})).get(274, 1)
    except (struct.error, IndexError):
        return 1


def _read_ifd(data: bytes, offset: int, order: str, wanted: frozenset[int]) -> dict[int, int]:
    """Read the first value of each wanted tag in the TIFF IFD at ``offset``."""
    (count,) = struct.unpack_from(order + "H", data, offset)
    tags: dict[int, int] = {}
    for index in range(count):
        entry = offset + 2 + 12 * index
        tag, kind, n = struct.unpack_from(order + "HHI", data, entry)
        code = _TIFF_TYPES.get(kind)
        # Only wanted tags are dereferenced: others (strip offsets, colour maps) may point anywhere.
        if tag not in wanted or code is None or n == 0:
            continue
        value_pos = entry + 8
        if struct.calcsize(code) * n > 4:
            (value_pos,) = struct.unpack_from(order + "I", data, entry + 8)
        tags[tag] = int(struct.unpack_from(order + code, data, value_pos)[0])
    return tags


def _probe_bmp(data: bytes) -> ImageHeader | None:
    """Read a BMP's info header and, for palette images, its palette."""
    (info_size,) = struct.unpack_from("<I", data, 14)
    if info_size == 12:
        width, height, _planes, bits = struct.unpack_from("<HHHH", data, 18)
        if bits not in (1, 4, 8, 24, 32):
            return None
        # cv2 decodes OS/2 core-header bitmaps as gray whatever their palette or depth.
        return _header("bmp", width, height, 1, False, 8)
    if info_size < 40:
        return None
    width, height, _planes, bits, compression = struct.unpack_from("<iiHHI", data, 18)
    (colours_used,) = struct.unpack_from("<I", data, 46)
    height = abs(height)  # negative heights mark top-down rows
    supported = (
        (compression == 0 and bits in (1, 4, 8, 16, 24, 32))
        or (compression == 3 and bits in (16, 32))
        or (compression == 1 and bits == 8)
        or (compression == 2 and bits == 4)
    )
    if not supported:
        return None
    if bits <= 8:
        if colours_used > 256:
            return None
        count = colours_used or 1 << bits
        palette = data[14 + info_size : 14 + info_size + 4 * count]
        if len(palette) < 4 * count:
            return None
        # cv2 expands palettes to BGR unless every entry it checks (the first 2**bits; entries past
        # colours_used read as black) is gray, in which case it returns a gray image.
        entries = [palette[i : i + 3] for i in range(0, min(count, 1 << bits) * 4, 4)]
        gray = all(entry[0] == entry[1] == entry[2] for entry in entries)
        return _header("bmp", width, height, 1 if gray else 3, False, 8)
    # cv2 returns BGRA for every 32-bit BITFIELDS bitmap, alpha mask or not, and BGR for 32-bit BI_RGB.
    has_alpha = bits == 32 and compression == 3
    return _header("bmp", width, height, 3, has_alpha, 8)


def _probe_tiff(data: bytes) -> ImageHeader | None:
    """Read the first IFD of a classic TIFF; BigTIFF is not recognised."""
    order = "<" if data.startswith(b"II") else ">"
    (ifd,) = struct.unpack_from(order + "I", data, 4)
    tags = _read_ifd(data, ifd, order, _TIFF_TAGS)
    if 256 not in tags or 257 not in tags:
        return None
    samples = tags.get(277, 1)
    bits = tags.get(258, 1)  # bilevel images may omit BitsPerSample
    photometric = tags.get(262, 2 if samples >= 3 else 1)
    # cv2 returns float or signed arrays for these; LogL/LogLuv decode to float.
    if tags.get(339, 1) != 1 or not 1 <= bits <= 16 or photometric in (32844, 32845):
        return None
    # cv2 reads more-than-8-bit palette, CMYK, YCbCr and gray+alpha images through its 8-bit RGBA path.
    if bits > 8 and (photometric > 2 or samples not in (1, 3, 4)):
        bits = 8
    # ExtraSamples (338) is not consulted: cv2 decides from SamplesPerPixel alone (its own writer
    # omits the tag), drops the extra samples of gray images and returns 4 channels for CMYK.
    if photometric == 3:
        channels, has_alpha = 3, False
    elif photometric in (0, 1) or samples == 1:
        channels, has_alpha = 1, False
    elif samples in (3, 4):
        channels, has_alpha = 3, samples == 4
    else:
        return None
    bit_depth = 16 if bits > 8 else 8
    pages = _tiff_chain(data, ifd, order)
    return _header("tiff", tags[256], tags[257], channels, has_alpha, bit_depth, tags.get(274, 1), pages)


def tiff_pages(data: bytes) -> int:
    """Count the pages (IFDs) of a classic TIFF by walking its chain of IFDs.

    Parameters
    ----------
    data : bytes
        The file, or its first bytes: IFDs beyond them are not counted.

    Returns
    -------
    int
        The number of distinct IFDs reached, at most ``MAX_TIFF_PAGES + 1`` (a longer chain stops
        there); the walk also stops at an IFD seen before (a loop) or one that cannot be read. 0 when
        ``data`` is not a TIFF or its first IFD cannot be read. Never raises on bad input.
    """
    if not data.startswith((b"II*\x00", b"MM\x00*")) or len(data) < 8:
        return 0
    order = "<" if data.startswith(b"II") else ">"
    (ifd,) = struct.unpack_from(order + "I", data, 4)
    return _tiff_chain(data, ifd, order)


def _tiff_chain(data: bytes, first: int, order: str) -> int:
    """How many distinct, readable IFDs the chain starting at ``first`` holds (bounded)."""
    seen: set[int] = set()
    offset = first
    # Offset 0 ends the chain; an offset seen before is a loop (a damaged or hostile file).
    while offset and offset not in seen and len(seen) <= MAX_TIFF_PAGES:
        if offset + 2 > len(data):
            break
        (count,) = struct.unpack_from(order + "H", data, offset)
        link = offset + 2 + 12 * count
        if link + 4 > len(data):
            # The IFD's entries reach past the bytes given; it counts only if it is the first.
            if not seen:
                seen.add(offset)
            break
        seen.add(offset)
        (offset,) = struct.unpack_from(order + "I", data, link)
    return len(seen)


_TIFF_SAMPLE_FORMATS = {
    2: "signed-integer TIFF ({bits}-bit signed samples)",
    3: "float TIFF ({bits}-bit floating-point samples)",
    4: "TIFF with an undefined sample format (SampleFormat 4, {bits}-bit samples)",
    5: "complex-integer TIFF ({bits}-bit complex samples)",
    6: "complex float TIFF ({bits}-bit complex floating-point samples)",
}


def unsupported_reason(data: bytes) -> str | None:
    """Why an image in a format dlpack reads is still refused, or None when it is not one of those.

    :func:`probe_header` returns None both for bytes that are no image and for images whose pixels
    dlpack cannot store (a float TIFF decodes to ``float32``); this tells the second kind apart, so
    the user reads what is wrong with the file instead of "not an image". Never raises on bad input.
    """
    try:
        if data.startswith((b"II+\x00", b"MM\x00+")):
            return "BigTIFF is not supported; save it as a classic TIFF or as PNG"
        if data.startswith((b"II*\x00", b"MM\x00*")):
            return _tiff_unsupported(data)
    except (struct.error, IndexError, ValueError):
        return None
    return None


def _tiff_unsupported(data: bytes) -> str | None:
    order = "<" if data.startswith(b"II") else ">"
    (ifd,) = struct.unpack_from(order + "I", data, 4)
    tags = _read_ifd(data, ifd, order, _TIFF_TAGS)
    bits = tags.get(258, 1)
    what = _TIFF_SAMPLE_FORMATS.get(tags.get(339, 1))
    if what is None and tags.get(262) in (32844, 32845):
        what = "LogLuv TIFF (floating-point luminance samples)"
    if what is None and bits > 16:
        what = f"TIFF with {bits}-bit integer samples"
    if what is None:
        return None
    return (
        f"{what.format(bits=bits)} is not supported; dlpack stores 8- and 16-bit unsigned images: "
        "convert it (for example scaled to 16-bit unsigned) first"
    )


def _probe_webp(data: bytes) -> ImageHeader | None:
    """Read the first chunk of a WebP file (VP8, VP8L or VP8X); an extended file's EXIF chunk too."""
    # WebP has no gray mode: cv2 always returns BGR or BGRA.
    kind = data[12:16]
    if kind == b"VP8 ":
        if data[20] & 1 or data[23:26] != b"\x9d\x01\x2a":  # not a key frame, or no start code
            return None
        width, height = struct.unpack_from("<HH", data, 26)
        return _header("webp", width & 0x3FFF, height & 0x3FFF, 3, False, 8)
    if kind == b"VP8L":
        (bits,) = struct.unpack_from("<I", data, 21)
        if data[20] != 0x2F or bits >> 29:  # signature byte, then a zero version
            return None
        width = (bits & 0x3FFF) + 1
        height = (bits >> 14 & 0x3FFF) + 1
        return _header("webp", width, height, 3, bool(bits >> 28 & 1), 8)
    if kind == b"VP8X":
        flags = data[20]
        (width,) = struct.unpack_from("<I", data[24:27] + b"\x00")
        (height,) = struct.unpack_from("<I", data[27:30] + b"\x00")
        orientation = _webp_orientation(data, bool(flags & 0x08))
        if orientation is None:
            return None
        return _header("webp", width + 1, height + 1, 3, bool(flags & 0x10), 8, orientation)
    return None


def _webp_orientation(data: bytes, flagged: bool) -> int | None:
    """The orientation in an extended WebP's EXIF chunk; None when the VP8X header announces one beyond ``data``.

    The EXIF chunk follows the image data, so in a large file it lies past the probed head: the
    probe then returns None and the caller reads the whole file. A chunk the header does not
    announce is honoured where it is seen, as libwebp's demuxer does.
    """
    (riff_size,) = struct.unpack_from("<I", data, 4)
    end = min(len(data), 8 + riff_size)
    pos = 12
    while pos + 8 <= end:
        kind = data[pos : pos + 4]
        (length,) = struct.unpack_from("<I", data, pos + 4)
        if kind == b"EXIF":
            if pos + 8 + length > len(data):
                break
            return _exif_orientation(data[pos + 8 : pos + 8 + length])
        pos += 8 + length + (length & 1)  # chunks are padded to an even length
    return None if flagged and len(data) < 8 + riff_size else 1


def container_orientation(data: bytes, fmt: str) -> int:
    """The EXIF orientation a whole PNG or WebP file carries (1 for other formats, or when absent).

    The probe reads it from the file's head; the decoder asks again with every byte, so an
    ``eXIf`` chunk after a large image's data is never missed.
    """
    try:
        if fmt == "png" and data.startswith(_PNG_SIGNATURE):
            return _png_chunks(data)[1]
        if fmt == "webp" and data.startswith(b"RIFF") and data[12:16] == b"VP8X":
            return _webp_orientation(data, False) or 1
    except (struct.error, IndexError, ValueError):
        return 1
    return 1


def _probe_pnm(data: bytes) -> ImageHeader | None:
    """Read the header tokens of a PBM, PGM or PPM file, skipping ``#`` comments."""
    kind = data[1:2]
    bitmap = kind in (b"1", b"4")
    values: list[int] = []
    pos = 2
    if data[pos] not in _PNM_WHITESPACE:  # cv2 refuses a comment straight after the magic number
        return None
    while len(values) < (2 if bitmap else 3):
        if data[pos] not in _PNM_WHITESPACE and data[pos] != ord("#"):
            return None
        while data[pos] in _PNM_WHITESPACE or data[pos] == ord("#"):
            if data[pos] == ord("#"):
                while data[pos] not in b"\r\n":
                    pos += 1
            pos += 1
        start = pos
        while pos < len(data) and data[pos] in _PNM_DIGITS:
            pos += 1
        # Ten digits already exceed any sane size; int() of a long run of digits is slow.
        if not start < pos <= start + 10:
            return None
        values.append(int(data[start:pos]))
    # The last token must be terminated, or it may be the truncated prefix of a longer number.
    if data[pos] not in _PNM_WHITESPACE:
        return None
    width, height = values[0], values[1]
    maxval = 1 if bitmap else values[2]
    if not 1 <= maxval <= 65535:
        return None
    channels = 3 if kind in (b"3", b"6") else 1
    return _header("pnm", width, height, channels, False, 16 if maxval > 255 else 8)
