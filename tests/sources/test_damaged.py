"""Damaged and multi-page inputs: refused with a reason, never packed as gray, and silent on the terminal.

libjpeg decodes a JPEG whose scan data is cut short or garbled, fills the rest with gray and only
prints a warning; libtiff and libpng do the same for some damage. Every file here is generated
with OpenCV and damaged by hand.
"""

from __future__ import annotations

import os
import struct
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import cv2
import numpy as np
import pytest
from _tiff import multipage_tiff

import dlpack
from dlpack.errors import BadInputsError
from dlpack.sources import DecodeError, TargetSpec, decode_image, prepare_image
from dlpack.sources.decode import check_header, library_messages
from dlpack.sources.probe import probe_header


def _texture(width: int = 64, height: int = 48, seed: int = 1) -> np.ndarray:
    """Smooth noise (BGR): compresses like a photo, so the entropy-coded data is long enough to damage."""
    rng = np.random.default_rng(seed)
    return cv2.GaussianBlur(rng.integers(0, 256, (height, width, 3), dtype=np.uint8), (5, 5), 0)


def _encode(ext: str, img: np.ndarray, params: list[int] | None = None) -> bytes:
    ok, buf = cv2.imencode(ext, img, params or [])
    assert ok
    return buf.tobytes()


def _jpeg() -> bytes:
    return _encode(".jpg", _texture(), [cv2.IMWRITE_JPEG_QUALITY, 90])


def _scan_span(data: bytes) -> tuple[int, int]:
    """Start and end of a baseline JPEG's entropy-coded data (after the SOS header, before EOI)."""
    sos = data.index(b"\xff\xda")
    return sos + 2 + int.from_bytes(data[sos + 2 : sos + 4], "big"), len(data) - 2


def truncated_with_end_marker() -> bytes:
    data = _jpeg()
    start, end = _scan_span(data)
    return data[: (start + end) // 2] + b"\xff\xd9"


def overwritten_mid_scan(seed: int = 1) -> bytes:
    data = bytearray(_jpeg())
    start, end = _scan_span(bytes(data))
    at = (start + end) // 2
    # Bytes 0..254: no 0xFF, so no marker is made and only the decoder can notice the damage.
    data[at : at + 32] = np.random.default_rng(seed).integers(0, 255, 32, dtype=np.uint8).tobytes()
    return bytes(data)


def _png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png_with_bad_idat_crc() -> bytes:
    data = bytearray(_encode(".png", _texture()))
    idat = data.index(b"IDAT")
    length = int.from_bytes(data[idat - 4 : idat], "big")
    data[idat + 4 + length] ^= 0xFF  # first byte of the chunk's CRC
    return bytes(data)


def png_with_bad_text_crc() -> bytes:
    data = _encode(".png", _texture())
    text = bytearray(_png_chunk(b"tEXt", b"Comment\x00scanned 2021"))
    text[-1] ^= 0x01
    return data[:33] + bytes(text) + data[33:]


def tiff_with_garbled_strip() -> bytes:
    data = bytearray(_encode(".tiff", _texture()))  # LZW-compressed by OpenCV
    at = len(data) // 3
    data[at : at + 50] = b"\xff" * 50
    return bytes(data)


def two_page_tiff() -> bytes:
    return multipage_tiff([_texture(seed=1), _texture(seed=2)])


DAMAGED = {
    "jpeg-truncated-with-end-marker": (truncated_with_end_marker, "corrupt JPEG data"),
    "jpeg-overwritten-1": (lambda: overwritten_mid_scan(1), "corrupt JPEG data"),
    "jpeg-overwritten-2": (lambda: overwritten_mid_scan(2), "corrupt JPEG data"),
    "png-idat-crc": (png_with_bad_idat_crc, "CRC error"),
    "png-text-crc": (png_with_bad_text_crc, "CRC error"),
    "tiff-garbled-strip": (tiff_with_garbled_strip, "corrupt TIFF data"),
    "tiff-two-pages": (two_page_tiff, "TIFF with 2 pages"),
}


@pytest.mark.parametrize("name", sorted(DAMAGED))
def test_damaged_file_is_refused_with_its_reason(name: str, capfd: pytest.CaptureFixture[str]) -> None:
    make, reason = DAMAGED[name]
    if name == "tiff-garbled-strip":
        data = make()
        _, lines = library_messages(lambda: cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED))
        if not lines:  # OpenCV 4.8 decodes this strip without a word: nothing to detect it by
            pytest.skip(f"OpenCV {cv2.__version__} reports no libtiff error for a garbled strip")
    with pytest.raises(DecodeError, match=reason):
        prepare_image(make(), TargetSpec())
    # The library's own warning is turned into the reason above, not printed.
    assert capfd.readouterr().err == ""


def test_damaged_jpeg_is_refused_by_decode_image_too() -> None:
    with pytest.raises(DecodeError, match="premature end of data segment"):
        decode_image(truncated_with_end_marker())


def test_undamaged_files_still_decode(capfd: pytest.CaptureFixture[str]) -> None:
    for ext in (".jpg", ".png", ".tiff", ".webp", ".bmp"):
        img = decode_image(_encode(ext, _texture()), rgb=False)
        assert img.shape == (48, 64, 3)
        if ext in (".png", ".tiff", ".bmp"):
            assert np.array_equal(img, _texture())
    assert capfd.readouterr().err == ""


def test_harmless_png_warning_is_silenced_and_not_a_damage(capfd: pytest.CaptureFixture[str]) -> None:
    # An iCCP chunk whose profile is too short: libpng warns and ignores the chunk; the pixels are whole.
    data = _encode(".png", _texture())
    iccp = _png_chunk(b"iCCP", b"icc\x00\x00" + zlib.compress(b"short profile"))
    img = decode_image(data[:33] + iccp + data[33:], rgb=False)
    assert np.array_equal(img, _texture())
    assert capfd.readouterr().err == ""


def test_warnings_are_attributed_to_their_own_file_across_threads() -> None:
    good = [_encode(".jpg", _texture(seed=s), [cv2.IMWRITE_JPEG_QUALITY, 90]) for s in range(3, 9)]
    bad = [truncated_with_end_marker(), overwritten_mid_scan(1), overwritten_mid_scan(2)]
    expected = [decode_image(g) for g in good]
    files = (good + bad) * 8  # a multiple of the 4 threads: every wave meets at the barrier
    barrier = threading.Barrier(4)

    def decode(data: bytes) -> np.ndarray | str:
        try:
            barrier.wait(timeout=5)
        except threading.BrokenBarrierError:
            pass
        try:
            return decode_image(data)
        except DecodeError as exc:
            return str(exc)

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(decode, files))
    for k, result in enumerate(results):
        if k % len(good + bad) < len(good):
            assert isinstance(result, np.ndarray), result
            assert np.array_equal(result, expected[k % len(good + bad)])
        else:
            assert isinstance(result, str) and "corrupt JPEG data" in result


def test_other_output_on_stderr_during_a_decode_is_passed_through(capfd: pytest.CaptureFixture[str]) -> None:
    def noisy() -> int:
        os.write(2, b"a line from elsewhere\n")
        os.write(2, b"Corrupt JPEG data: premature end of data segment\n")
        return 7

    from dlpack.sources.decode import library_messages

    value, messages = library_messages(noisy)
    assert value == 7
    assert messages == ["Corrupt JPEG data: premature end of data segment"]
    assert capfd.readouterr().err == "a line from elsewhere\n"


@pytest.mark.parametrize("at", [1, 2])
def test_a_ctrl_c_inside_the_capture_gives_descriptor_2_back(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str], at: int
) -> None:
    """Ctrl-C lands at the capture's first or second look at its file (before the decode, or after
    it and before descriptor 2 is given back): it is raised once the capture is undone, so the
    "interrupted" line a command prints next reaches the terminal and the next decode is captured."""
    import signal

    from dlpack.sources import decode

    calls = [0]
    size = decode._Fd2Capture._size

    def interrupted_size(self: decode._Fd2Capture) -> int:
        calls[0] += 1
        if calls[0] == at:
            signal.raise_signal(signal.SIGINT)  # its handler runs at the next bytecode, in here
        return size(self)

    def noisy() -> int:
        os.write(2, b"Corrupt JPEG data: premature end of data segment\n")
        return 1

    monkeypatch.setattr(decode._Fd2Capture, "_size", interrupted_size)
    with pytest.raises(KeyboardInterrupt):
        decode.library_messages(noisy)
    monkeypatch.setattr(decode._Fd2Capture, "_size", size)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    os.write(2, b"dlpack: interrupted\n")
    assert capfd.readouterr().err == "dlpack: interrupted\n"
    # The capture's count of running decodes is back at zero: the next decode is captured again.
    assert decode.library_messages(noisy) == (1, ["Corrupt JPEG data: premature end of data segment"])
    assert capfd.readouterr().err == ""


def test_a_ctrl_c_held_by_the_capture_goes_to_the_handler_the_caller_installed() -> None:
    """A caller's own SIGINT handler is called once for a signal held during a decode, and put back;
    an ignored SIGINT stays ignored."""
    import signal

    from dlpack.sources import decode

    def interrupted() -> int:
        signal.raise_signal(signal.SIGINT)
        return 3

    seen: list[int] = []
    before = signal.signal(signal.SIGINT, lambda signum, frame: seen.append(signum))
    try:
        mine = signal.getsignal(signal.SIGINT)
        assert decode.library_messages(interrupted) == (3, [])
        assert seen == [signal.SIGINT] and signal.getsignal(signal.SIGINT) is mine
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        assert decode.library_messages(interrupted) == (3, [])
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN and seen == [signal.SIGINT]
    finally:
        signal.signal(signal.SIGINT, before)


# --- multi-page TIFF ---------------------------------------------------------------------------------


def test_probe_counts_tiff_pages() -> None:
    header = probe_header(two_page_tiff())
    assert header is not None and header.pages == 2
    single = probe_header(_encode(".tiff", _texture()))
    assert single is not None and single.pages == 1
    with pytest.raises(DecodeError, match="TIFF with 2 pages; dlpack packs single images: split the pages"):
        check_header(header, 2**28)


def _ifd_chain_tiff(links: list[int]) -> bytes:
    """A little-endian TIFF of len(links) 1x1 gray IFDs; IFD k's next-IFD field points at IFD links[k]."""
    ifd_size = 2 + 8 * 12 + 4
    first = 16
    offsets = [first + k * ifd_size for k in range(len(links))]
    pixel = first + len(links) * ifd_size
    out = bytearray(b"II*\x00" + struct.pack("<I", first) + bytes(8))
    for nxt in links:
        entries = [(256, 3, 1), (257, 3, 1), (258, 3, 8), (259, 3, 1), (262, 3, 1), (273, 4, pixel), (277, 3, 1)]
        entries.append((279, 4, 1))
        out += struct.pack("<H", len(entries))
        for tag, kind, value in entries:
            out += struct.pack("<HHII", tag, kind, 1, value)
        out += struct.pack("<I", offsets[nxt] if nxt >= 0 else 0)
    return bytes(out) + b"\x80"


@pytest.mark.parametrize(
    ("links", "pages"),
    [
        pytest.param([-1], 1, id="one"),
        pytest.param([1, -1], 2, id="two"),
        pytest.param([0], 1, id="self-loop"),
        pytest.param([1, 2, 0], 3, id="loop-of-three"),
    ],
)
def test_tiff_page_chain_is_walked_with_loops_detected(links: list[int], pages: int) -> None:
    header = probe_header(_ifd_chain_tiff(links))
    assert header is not None and header.pages == pages


def test_long_tiff_page_chain_is_bounded() -> None:
    links = [k + 1 for k in range(20_000)] + [-1]
    header = probe_header(_ifd_chain_tiff(links))
    assert header is not None and header.pages == 10_001


def test_second_page_beyond_the_probed_bytes_is_found_at_decode() -> None:
    data = _ifd_chain_tiff([1, -1])
    head = probe_header(data[:130])  # the first IFD (bytes 16..117) and its link, not the second IFD
    assert head is not None and head.pages == 1
    with pytest.raises(DecodeError, match="TIFF with 2 pages"):
        prepare_image(data, TargetSpec(), head)


# --- the build -----------------------------------------------------------------------------------


@pytest.fixture
def damaged_tree(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    for cls in ("a", "b"):
        (src / cls).mkdir(parents=True)
        for k in range(2):
            (src / cls / f"ok{k}.png").write_bytes(_encode(".png", _texture(seed=10 * k + ord(cls))))
    (src / "a" / "cut.jpg").write_bytes(truncated_with_end_marker())
    (src / "a" / "garbled.jpg").write_bytes(overwritten_mid_scan(1))
    (src / "b" / "pages.tiff").write_bytes(two_page_tiff())
    return src


def test_build_refuses_damaged_and_multi_page_inputs(
    damaged_tree: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(BadInputsError) as info:
        dlpack.build(damaged_tree, tmp_path / "o.zarr", quiet=True, jobs=1)
    reasons = {e.path: e.reason for e in info.value.errors}
    assert set(reasons) == {"a/cut.jpg", "a/garbled.jpg", "b/pages.tiff"}
    assert "corrupt JPEG data" in reasons["a/cut.jpg"]
    assert "corrupt JPEG data" in reasons["a/garbled.jpg"]
    assert "TIFF with 2 pages" in reasons["b/pages.tiff"]
    assert not (tmp_path / "o.zarr").exists()
    assert "Corrupt JPEG data" not in capfd.readouterr().err


def test_build_skips_and_lists_them_under_on_error_skip(
    damaged_tree: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    result = dlpack.build(damaged_tree, tmp_path / "o.zarr", on_error="skip", quiet=True, jobs=1)
    assert sorted(e.path for e in result.skipped) == ["a/cut.jpg", "a/garbled.jpg", "b/pages.tiff"]
    ds = dlpack.open(tmp_path / "o.zarr")
    assert len(ds) == 4
    assert "Corrupt JPEG data" not in capfd.readouterr().err


# --- images whose pixel type dlpack cannot store ----------------------------------------------------


def _tiff_of(dtype: str) -> bytes:
    """A 4 x 3 gray TIFF of ``dtype`` samples as OpenCV writes it; float16 and uint32 by hand (OpenCV
    writes float16 as 8-bit, and OpenCV 4.8 cannot write uint32)."""
    if dtype in ("float16", "uint32"):
        pixels = np.ones((3, 4), np.dtype(dtype)).tobytes()
        bits, sample_format = (16, 3) if dtype == "float16" else (32, 1)
        tags = [(256, 4), (257, 3), (258, bits), (259, 1), (262, 1), (273, 8 + 2 + 9 * 12 + 4),
                (277, 1), (279, len(pixels)), (339, sample_format)]  # fmt: skip
        ifd = struct.pack("<H", len(tags)) + b"".join(struct.pack("<HHIHH", t, 3, 1, v, 0) for t, v in tags[:5])
        ifd += struct.pack("<HHII", 273, 4, 1, tags[5][1])
        ifd += b"".join(struct.pack("<HHIHH", t, 3, 1, v, 0) for t, v in tags[6:])
        return b"II*\x00" + struct.pack("<I", 8) + ifd + bytes(4) + pixels
    return _encode(".tiff", np.ones((3, 4), np.dtype(dtype)))


@pytest.mark.parametrize(
    ("dtype", "reason"),
    [
        ("float32", "float TIFF (32-bit floating-point samples) is not supported"),
        ("float64", "float TIFF (64-bit floating-point samples) is not supported"),
        ("float16", "float TIFF (16-bit floating-point samples) is not supported"),
        ("int16", "signed-integer TIFF (16-bit signed samples) is not supported"),
        ("int32", "signed-integer TIFF (32-bit signed samples) is not supported"),
        ("uint32", "TIFF with 32-bit integer samples is not supported"),
    ],
)
def test_tiff_of_a_pixel_type_dlpack_cannot_store_is_named_as_such(
    dtype: str, reason: str, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    data = _tiff_of(dtype)
    with pytest.raises(DecodeError) as info:
        decode_image(data)
    assert reason in str(info.value) and "not an image" not in str(info.value)
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    (src / "a" / "ok.png").write_bytes(_encode(".png", _texture()))
    (src / "a" / "x.tif").write_bytes(data)
    with pytest.raises(BadInputsError) as failed:
        dlpack.build(src, tmp_path / "o.zarr", quiet=True, jobs=1)
    assert [(e.path, reason in e.reason) for e in failed.value.errors] == [("a/x.tif", True)]
    assert "8- and 16-bit unsigned" in str(failed.value)
    capfd.readouterr()


def test_float_tiff_past_the_probed_head_is_named_too(tmp_path: Path) -> None:
    # OpenCV writes the TIFF directory after the pixels: the reason must come from the whole file.
    data = _encode(".tiff", np.ones((200, 200), np.float32))
    assert len(data) > 65536
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    (src / "a" / "big.tif").write_bytes(data)
    with pytest.raises(BadInputsError) as failed:
        dlpack.build(src, tmp_path / "o.zarr", quiet=True, jobs=1)
    assert "float TIFF (32-bit floating-point samples)" in failed.value.errors[0].reason
