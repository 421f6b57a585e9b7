"""Shared fixtures: small generated image trees, the backend parameter, an independent reference decoder.

Every image is made here with NumPy and written with ``cv2.imencode`` (or, for PNG colour types
OpenCV cannot write, by a tiny PNG encoder below), so the suite needs no network and no data files.
"""

from __future__ import annotations

import signal
import struct
import zlib
from collections.abc import Callable, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import cv2
import numpy as np
import pytest
from hypothesis import settings

# Hypothesis fails an example that runs over 200 ms by default: a wall-clock threshold that a loaded
# machine trips. Tests here are judged on what they return, never on how fast.
settings.register_profile("dlpack", deadline=None)
settings.load_profile("dlpack")

# A test run started in the background by a non-interactive shell (`make test &` in a script)
# inherits SIGINT ignored, and Python then never raises KeyboardInterrupt: the Ctrl-C tests would
# see nothing. Delivered as at a terminal, in this process and in the commands the tests start (a
# handled signal is reset to its default at exec, which Python then handles as usual).
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

#: A tree spec value: an image kind ("rgb", "gray", "rgba", "palette", "graya", "rgb16", "gray16"),
#: a (kind, width, height) tuple, an array to encode with cv2 (BGR order), or raw file bytes.
Entry = str | tuple[str, int, int] | np.ndarray | bytes
Spec = Mapping[str, Entry]

#: Width and height of the default test image.
W, H = 40, 30

KINDS = ("rgb", "gray", "rgba", "palette", "graya", "rgb16", "gray16")


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_bytes(
    rows: np.ndarray, colour_type: int, palette: np.ndarray | None = None, trns: bytes | None = None
) -> bytes:
    """A minimal PNG (8-bit samples) for colour types OpenCV cannot write: palette (3), gray+alpha (4).

    ``rows`` is H x W (palette indices) or H x W x C samples in file order; ``trns`` is a tRNS payload.
    """
    h, w = rows.shape[:2]
    raw = b"".join(b"\x00" + rows[y].tobytes() for y in range(h))
    out = b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, colour_type, 0, 0, 0))
    if palette is not None:
        out += _png_chunk(b"PLTE", palette.astype(np.uint8).tobytes())
    if trns is not None:
        out += _png_chunk(b"tRNS", trns)
    return out + _png_chunk(b"IDAT", zlib.compress(raw)) + _png_chunk(b"IEND", b"")


def pixels(kind: str, width: int = W, height: int = H, seed: int = 0) -> np.ndarray:
    """Deterministic noise pixels of one kind, in the order cv2 writes (BGR/BGRA)."""
    rng = np.random.default_rng(seed)
    if kind == "rgb":
        return rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    if kind == "gray":
        return rng.integers(0, 256, (height, width), dtype=np.uint8)
    if kind == "rgba":
        return rng.integers(0, 256, (height, width, 4), dtype=np.uint8)
    if kind == "rgb16":
        return rng.integers(0, 65536, (height, width, 3), dtype=np.uint16)
    if kind == "gray16":
        return rng.integers(0, 65536, (height, width), dtype=np.uint16)
    raise ValueError(f"no pixels for kind {kind!r}")


def palette_image(width: int = W, height: int = H, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(indices H x W, palette 16 x 3 RGB) for a palette PNG."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 16, (height, width), dtype=np.uint8), rng.integers(0, 256, (16, 3), dtype=np.uint8)


def gray_alpha_image(width: int = W, height: int = H, seed: int = 0) -> np.ndarray:
    """H x W x 2 (gray, alpha) samples for a gray+alpha PNG."""
    return np.random.default_rng(seed).integers(0, 256, (height, width, 2), dtype=np.uint8)


def encode(suffix: str, img: np.ndarray) -> bytes:
    """File bytes of ``img`` (BGR order) in the format ``suffix`` names, written by OpenCV."""
    ok, buf = cv2.imencode(suffix, img)
    if not ok:
        raise ValueError(f"cv2 cannot write {img.shape} {img.dtype} as {suffix}")
    return buf.tobytes()


def file_bytes(rel: str, entry: Entry) -> bytes:
    """The bytes to write for one spec entry; the pixels' seed is a function of the path."""
    if isinstance(entry, bytes):
        return entry
    suffix = Path(rel).suffix.lower()
    if isinstance(entry, np.ndarray):
        return encode(suffix, entry)
    kind, width, height = (entry, W, H) if isinstance(entry, str) else entry
    seed = zlib.crc32(rel.encode("utf-8"))
    if kind == "palette":
        assert suffix == ".png", "palette images are PNG only"
        idx, pal = palette_image(width, height, seed)
        return png_bytes(idx, 3, pal)
    if kind == "graya":
        assert suffix == ".png", "gray+alpha images are PNG only"
        return png_bytes(gray_alpha_image(width, height, seed), 4)
    return encode(suffix, pixels(kind, width, height, seed))


def write_tree(root: Path, spec: Spec) -> Path:
    """Write every ``spec`` entry under ``root`` (parents created) and return ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    for rel, entry in spec.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as f:
            f.write(file_bytes(rel, entry))
    return root


def reference(path: str | Path, size: tuple[int, int] | None = None, interpolation: int = cv2.INTER_AREA) -> np.ndarray:
    """Decode ``path`` independently of dlpack: H x W x C RGB (alpha dropped), resized to ``size`` (W, H)."""
    img = cv2.imdecode(np.fromfile(path, np.uint8), cv2.IMREAD_UNCHANGED)
    assert img is not None, f"cv2 could not decode {path}"
    if img.ndim == 2:
        img = img[:, :, None]
    elif img.shape[2] == 4:
        img = cv2.cvtColor(img, cv2.COLOR_BGRA2RGB)
    else:
        img = cv2.cvtColor(img, cv2.COLOR_BGR2RGB)
    if size is not None:
        channels = img.shape[2]
        img = cv2.resize(img, size, interpolation=interpolation).reshape(size[1], size[0], channels)
    return img


def store_files(path: Path) -> dict[str, bytes]:
    """Every file of a store (a Zarr folder, or the one HDF5 file under the key '') by relative path."""
    if path.is_file():
        return {"": path.read_bytes()}
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def interrupt_build(monkeypatch: pytest.MonkeyPatch, blocks: int, build: Callable[[], Any]) -> None:
    """Run ``build`` with Ctrl-C arriving once ``blocks`` blocks are journalled (the partial and its
    journal are kept, as after a real interrupt); the journal works normally again afterwards."""
    import importlib

    journal = importlib.import_module("dlpack.storage.journal")
    append = journal.Journal.append_block

    def interrupted(self: Any, *args: Any, **kwargs: Any) -> None:
        append(self, *args, **kwargs)
        if self.blocks >= blocks:
            raise KeyboardInterrupt

    monkeypatch.setattr(journal.Journal, "append_block", interrupted)
    with pytest.raises(KeyboardInterrupt):
        build()
    monkeypatch.undo()


@pytest.fixture
def images() -> Any:
    """The image helpers above, for tests: ``images.reference(path, size)``, ``images.encode(...)``, ..."""
    return SimpleNamespace(
        pixels=pixels,
        palette_image=palette_image,
        gray_alpha_image=gray_alpha_image,
        png_bytes=png_bytes,
        encode=encode,
        file_bytes=file_bytes,
        reference=reference,
        W=W,
        H=H,
    )


@pytest.fixture
def snapshot() -> Callable[[Path], dict[str, bytes]]:
    """``snapshot(store)``: every file's bytes, to compare stores or check one was left untouched."""
    return store_files


@pytest.fixture
def make_tree(tmp_path: Path) -> Callable[..., Path]:
    """Factory: ``make_tree(spec, name="src")`` writes ``spec`` into ``tmp_path / name`` and returns it."""

    def make(spec: Spec, name: str = "src") -> Path:
        return write_tree(tmp_path / name, spec)

    return make


@pytest.fixture(params=["zarr", "hdf5"])
def backend(request: pytest.FixtureRequest) -> str:
    """The output store name for each backend: ``out.zarr`` or ``out.h5``."""
    return {"zarr": "out.zarr", "hdf5": "out.h5"}[request.param]


@pytest.fixture
def spill_everything(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every spill column of a build in a file from its first row, read back 5 rows at a time, and
    a folder scan sorted in runs of 7 paths merged 3 at a time: what a build of millions of images
    does, on a handful of images (dlpack.storage.spill, dlpack.sources.folder)."""
    import sys

    from dlpack.sources import folder
    from dlpack.storage import spill as _spill

    part = _spill.PART
    for module in list(sys.modules.values()):
        name = getattr(module, "__name__", "")
        if name.startswith("dlpack") and getattr(module, "PART", None) is part:
            monkeypatch.setattr(module, "PART", 5)
    monkeypatch.setattr(_spill, "SPILL_BYTES", 0)
    monkeypatch.setattr(folder, "RUN", 7)
    monkeypatch.setattr(folder, "_MERGE_STEP", 3)


# Object storage: a loopback S3-compatible server (moto) per test process, started on first use on
# 127.0.0.1 and stopped at the end of the session; each test gets its own bucket and the AWS
# environment pointing at that server (tests/_s3.py). Skipped with the reason where the s3 extra or
# moto is not installed (`make install` and .ci/run install both).


@pytest.fixture(scope="session")
def s3_server() -> Any:
    from _s3 import running_server, skip_without_s3

    skip_without_s3()
    with running_server() as server:
        yield server


@pytest.fixture
def s3(s3_server: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """``s3.url(name)``: ``s3://BUCKET/name`` in a new bucket of the loopback server, its AWS
    environment set for this test (``s3.endpoint``, ``s3.bucket``, ``s3.server``)."""
    from _s3 import client_env

    for k, v in client_env(s3_server.endpoint).items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    bucket = s3_server.new_bucket()
    return SimpleNamespace(
        server=s3_server,
        endpoint=s3_server.endpoint,
        bucket=bucket,
        url=lambda name="": f"s3://{bucket}/{name}".rstrip("/"),
    )


# A Dask cluster on this machine: two single-threaded worker processes on 127.0.0.1, shared by the
# tests of a session (starting one takes seconds). Skipped with the reason where the dask extra
# (distributed) is not installed.


@pytest.fixture(scope="session")
def dask_cluster() -> Any:
    """A running ``distributed.LocalCluster`` of 2 worker processes; ``dask_cluster.scheduler_address``
    is the ``tcp://127.0.0.1:PORT`` a build's ``scheduler=`` takes."""
    distributed = pytest.importorskip("distributed", reason="the dask extra (distributed) is not installed")
    from dlpack._dask import NO_DASHBOARD

    cluster = distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", **NO_DASHBOARD
    )
    try:
        yield cluster
    finally:
        cluster.close()
