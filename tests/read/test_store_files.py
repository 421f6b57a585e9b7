"""Files of a store that are not what their names say: a named pipe anywhere in a store never
hangs a command, and every reader opens only regular files."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import dlpack
from dlpack.errors import StoreError

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")

TREE = {f"a/{k}.png": ("rgb", 12, 10) for k in range(3)} | {f"b/{k}.png": ("rgb", 12, 10) for k in range(3, 5)}
#: Where a named pipe replaces a file of a Zarr store (relative to the store).
ZARR_PLACES = ["manifest.json", "zarr.json", "images/zarr.json", "images/c/0/0/0/0"]
#: A command that never finishes is killed after this long; an answer comes in about a second.
HANG = 60


class Blocked(BaseException):
    """Not an OSError (which readers turn into other errors) nor an Exception: nothing catches it."""


@pytest.fixture
def no_hang() -> Iterator[None]:
    """Fail an in-process test that blocks (on a named pipe) instead of hanging the test run."""

    def blocked(*_: object) -> None:
        raise Blocked("blocked for 20 s: a reader opened a named pipe")

    old = signal.signal(signal.SIGALRM, blocked)
    # Sent to this very thread: a blocked open() is interrupted only in the thread that receives it.
    timer = threading.Timer(20, signal.pthread_kill, (threading.get_ident(), signal.SIGALRM))
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        signal.signal(signal.SIGALRM, old)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A source tree and one small store of each backend built from it (copied per test)."""
    from conftest import write_tree

    root = tmp_path_factory.mktemp("fifo")
    src = write_tree(root / "src", TREE)
    stores = {"src": src}
    for name in ("s.zarr", "s.h5"):
        dlpack.build(src, root / name, quiet=True, jobs=1)
        stores[name] = root / name
    return stores


def copy_store(built: dict[str, Path], name: str, tmp_path: Path) -> Path:
    import shutil

    dst = tmp_path / name
    if built[name].is_dir():
        shutil.copytree(built[name], dst)
    else:
        shutil.copy2(built[name], dst)
    return dst


def put_fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def cli(*argv: str) -> tuple[int, str, float]:
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "dlpack", *argv], capture_output=True, text=True, timeout=HANG, env=os.environ.copy()
    )
    return proc.returncode, proc.stderr, time.monotonic() - t0


COMMANDS: dict[str, Callable[[Path, Path], list[str]]] = {
    "info": lambda src, out: ["info", str(out)],
    "verify": lambda src, out: ["verify", str(out)],
    "overwrite": lambda src, out: ["build", str(src), str(out), "--overwrite", "--jobs", "1", "--quiet"],
    "update": lambda src, out: ["build", str(src), str(out), "--update", "--jobs", "1", "--quiet"],
}


@pytest.mark.slow
@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("place", ZARR_PLACES)
def test_a_named_pipe_in_a_zarr_store_never_hangs_a_command(
    built: dict[str, Path], tmp_path: Path, place: str, command: str
) -> None:
    import shutil

    out = copy_store(built, "s.zarr", tmp_path)
    fifo = out / place
    put_fifo(fifo)
    src = built["src"]
    if command == "update":  # one file added: an update with nothing to do reads no image
        src = tmp_path / "src"
        shutil.copytree(built["src"], src)
        shutil.copy2(src / "a" / "0.png", src / "a" / "9.png")
    code, err, _ = cli(*COMMANDS[command](src, out))
    # A store whose marker is readable is dlpack's: --overwrite replaces it (a pipe holds no data),
    # and info reads only the manifest and the labels. Everything else refuses, naming the pipe.
    replaced = command == "overwrite" and place != "zarr.json"
    untouched = command == "info" and place.startswith("images/")
    if replaced or untouched:
        assert code == 0, err
        if replaced:
            with dlpack.open(out) as ds:
                assert ds.verify() == []
        return
    # verify: a pipe inside a dlpack store is damage (4); a pipe at the marker leaves no store to recognise (2).
    assert code == (4 if command == "verify" and place != "zarr.json" else 2), err
    assert str(fifo) in err and "named pipe" in err, err
    assert "Traceback" not in err
    assert fifo.exists() and not fifo.is_file()  # refused, and left as it was


@pytest.mark.slow
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_named_pipe_at_an_hdf5_store_path_never_hangs_a_command(
    built: dict[str, Path], tmp_path: Path, command: str
) -> None:
    out = tmp_path / "s.h5"
    os.mkfifo(out)
    code, err, _ = cli(*COMMANDS[command](built["src"], out))
    assert code == 2, err
    assert str(out) in err and "named pipe" in err, err
    assert out.exists() and not out.is_file()


def test_a_named_pipe_is_refused_within_seconds(built: dict[str, Path], tmp_path: Path, no_hang: None) -> None:
    out = copy_store(built, "s.zarr", tmp_path)
    put_fifo(out / "manifest.json")
    t0 = time.monotonic()
    with pytest.raises(StoreError, match=r"manifest\.json.*named pipe"):
        dlpack.open(out)
    assert time.monotonic() - t0 < 2


def test_a_shard_that_is_a_link_is_refused(built: dict[str, Path], tmp_path: Path, no_hang: None) -> None:
    out = copy_store(built, "s.zarr", tmp_path)
    shard = out / "images" / "c" / "0" / "0" / "0" / "0"
    aside = tmp_path / "aside"
    shard.rename(aside)
    shard.symlink_to(aside)  # the same bytes, through a link dlpack never writes
    with dlpack.open(out) as ds, pytest.raises(StoreError, match="symbolic link"):
        ds.verify()


def in_subprocess(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter: a read blocked in C (HDF5, zarr's threads) ignores signals."""
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=HANG)


CATCH = """
import sys
try:
    {call}
except dlpack.StoreError as exc:
    print("refused:", exc)
"""


@pytest.mark.slow
def test_a_hdf5_store_swapped_for_a_pipe_after_detection_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "s.h5"
    os.mkfifo(out)
    # What --update does once it recognised the store: open a reader of that backend directly.
    code = "import dlpack\nfrom dlpack.backends import Hdf5Backend\n" + CATCH.format(
        call="Hdf5Backend.open_reader(__import__('pathlib').Path(sys.argv[1])).manifest"
    )
    proc = in_subprocess(code, str(out))
    assert proc.returncode == 0 and "refused:" in proc.stdout and "named pipe" in proc.stdout, proc


@pytest.mark.slow
def test_zarr_python_is_never_handed_a_named_pipe(built: dict[str, Path], tmp_path: Path) -> None:
    """An array that is not sharded is read by zarr-python, which opens its chunks by path."""
    import hashlib
    import json

    import numpy as np
    import zarr

    out = copy_store(built, "s.zarr", tmp_path)
    arr = zarr.open_group(str(out), mode="r+", zarr_format=3).create_array(
        "plain", shape=(5,), chunks=(5,), dtype="<f4", fill_value=0
    )
    arr[:] = np.arange(5, dtype="<f4")
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["arrays"]["plain"] = {"layout": "fixed", "dtype": "<f4", "shape": [], "key": "plain"}
    (out / "manifest.json").write_text(json.dumps(manifest))
    group = json.loads((out / "zarr.json").read_text())
    group["attributes"]["dlpack"]["manifest_sha256"] = hashlib.sha256((out / "manifest.json").read_bytes()).hexdigest()
    (out / "zarr.json").write_text(json.dumps(group))
    with dlpack.open(out) as ds:
        assert float(ds[4]["plain"]) == 4.0
    chunk = next(p for p in (out / "plain" / "c").rglob("*") if p.is_file())
    put_fifo(chunk)
    code = "import dlpack, sys\n" + CATCH.format(call="dlpack.open(sys.argv[1])[0]")
    proc = in_subprocess(code, str(out))
    assert proc.returncode == 0 and "refused:" in proc.stdout and "named pipe" in proc.stdout, proc


def test_a_named_pipe_in_a_leftover_partial_is_refused_and_kept(
    built: dict[str, Path], tmp_path: Path, no_hang: None
) -> None:
    from dlpack.storage.lock import partial_path

    out = tmp_path / "new.zarr"
    partial = partial_path(out)
    partial.mkdir()
    os.mkfifo(partial / "zarr.json")  # what a killed build leaves is a regular file or nothing
    with pytest.raises(StoreError, match=r"zarr\.json is a named pipe"):
        dlpack.build(built["src"], out, quiet=True, jobs=1)
    assert (partial / "zarr.json").exists() and not out.exists()


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["lock", "journal", "partial"])
def test_a_named_pipe_at_a_build_path_is_refused_and_kept(built: dict[str, Path], tmp_path: Path, kind: str) -> None:
    """The lock, journal and partial beside OUT are dlpack's names; a named pipe there never blocks a build."""
    out = tmp_path / "n.zarr"
    pipe = tmp_path / f".n.zarr.dlpack-{kind}"
    os.mkfifo(pipe)
    rc, err, took = cli("build", str(built["src"]), str(out), "--jobs", "1", "--quiet")
    assert rc == 2 and str(pipe) in err and "Traceback" not in err, err
    assert took < HANG and pipe.is_fifo() and not out.exists()
