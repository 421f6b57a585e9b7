"""The ``dlpack`` command, called in-process through ``main(argv)``."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from _procs import INTERNAL_ERROR_MAIN

import dlpack
from dlpack.cli import main

Capsys = pytest.CaptureFixture[str]


@pytest.fixture
def src(make_tree: Callable[..., Path]) -> Path:
    return make_tree({"cat/0.png": "rgb", "cat/1.jpg": "rgb", "dog/2.png": "rgb"})


@pytest.fixture
def store(src: Path, tmp_path: Path) -> Path:
    out = tmp_path / "out.zarr"
    assert main(["build", str(src), str(out), "--size", "20x15", "--quiet", "--jobs", "1"]) == 0
    return out


def flip_image_byte(out: Path, index: int) -> None:
    """Flip one byte of image ``index`` (8 x 10 x 3) of the uncompressed HDF5 store ``out``."""
    import h5py

    with h5py.File(out, "r") as f:
        offset = f["images"].id.get_offset()
    data = bytearray(out.read_bytes())
    data[offset + 8 * 10 * 3 * index + 5] ^= 0xFF
    out.write_bytes(bytes(data))


def test_build_returns_0_and_writes_an_openable_store(store: Path) -> None:
    with dlpack.open(store) as ds:
        assert (len(ds), ds.classes, ds[0]["image"].shape) == (3, ("cat", "dog"), (15, 20, 3))


def test_build_prints_a_summary_unless_quiet(src: Path, tmp_path: Path, capsys: Capsys) -> None:
    assert main(["build", str(src), str(tmp_path / "o.h5"), "--jobs", "1"]) == 0
    assert "packed 3 images" in capsys.readouterr().out


def test_quiet_build_prints_nothing(src: Path, tmp_path: Path, capsys: Capsys) -> None:
    assert main(["build", str(src), str(tmp_path / "o.zarr"), "--quiet", "--jobs", "1"]) == 0
    assert capsys.readouterr().out == ""


def test_build_format_flag_overrides_suffix(src: Path, tmp_path: Path) -> None:
    out = tmp_path / "store.bin"
    assert main(["build", str(src), str(out), "--format", "hdf5", "--quiet", "--jobs", "1"]) == 0
    assert dlpack.open(out).backend == "hdf5"


def test_build_flags_reach_the_options(src: Path, tmp_path: Path) -> None:
    out = tmp_path / "o.zarr"
    argv = ["--size", "20x20", "--resize", "fit", "--channels", "1", "--labels", "none", "--compression", "zstd"]
    assert main(["build", str(src), str(out), *argv, "--quiet", "--jobs", "1"]) == 0
    m = dlpack.open(out).manifest
    assert (m.image.shape, m.classes, m.compression, m.resize["mode"]) == ((20, 20, 1), (), "zstd", "fit")


def test_info_text_describes_the_store(store: Path, capsys: Capsys) -> None:
    capsys.readouterr()
    assert main(["info", str(store)]) == 0
    lines = dict(line.split(None, 1) for line in capsys.readouterr().out.splitlines())
    assert lines["images"].strip() == "3"
    assert lines["resolution"].startswith("20x15 x 3 channel(s)")
    assert lines["classes"].strip() == "cat, dog"


def test_info_json_is_parseable(store: Path, capsys: Capsys) -> None:
    capsys.readouterr()
    assert main(["info", str(store), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert (info["count"], info["classes"], info["resolution"], info["backend"]) == (
        3,
        ["cat", "dog"],
        [20, 15],
        "zarr",
    )
    assert info["skipped"] == [] and info["bytes_on_disk"] > 0


def test_missing_source_exits_2_with_message_and_no_traceback(tmp_path: Path, capsys: Capsys) -> None:
    assert main(["build", str(tmp_path / "nowhere"), str(tmp_path / "o.zarr")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dlpack: error: ") and "nowhere" in err
    assert "Traceback" not in err


def test_bad_size_exits_2_with_option_message(src: Path, tmp_path: Path, capsys: Capsys) -> None:
    assert main(["build", str(src), str(tmp_path / "o.zarr"), "--size", "0x512"]) == 2
    assert "dlpack: error: size must be WIDTHxHEIGHT with both > 0, got '0x512'" in capsys.readouterr().err


def test_existing_out_exits_2(store: Path, src: Path, capsys: Capsys) -> None:
    assert main(["build", str(src), str(store), "--quiet", "--jobs", "1"]) == 2
    assert "--overwrite" in capsys.readouterr().err


def test_bad_inputs_exit_2_and_list_files(make_tree: Callable[..., Path], tmp_path: Path, capsys: Capsys) -> None:
    bad = make_tree({"a/0.png": "rgb", "a/empty.png": b""}, "bad")
    assert main(["build", str(bad), str(tmp_path / "o.zarr"), "--quiet", "--jobs", "1"]) == 2
    err = capsys.readouterr().err
    assert "a/empty.png: empty file" in err and "Traceback" not in err


@pytest.mark.parametrize("on_error", ["skip", "fail"])
def test_an_all_bad_folder_says_nothing_could_be_packed_and_never_suggests_skip(
    make_tree: Callable[..., Path], tmp_path: Path, capsys: Capsys, on_error: str
) -> None:
    bad = make_tree({"a/empty.png": b"", "a/text.jpg": b"not a picture", "b/cut.png": b"\x89PNG\r\n\x1a\n"}, "bad")
    out = tmp_path / "o.zarr"
    assert main(["build", str(bad), str(out), "--on-error", on_error, "--quiet", "--jobs", "1"]) == 2
    err = capsys.readouterr().err
    assert "no input could be packed: all 3 input file(s) in " in err
    assert "a/empty.png: empty file" in err and "a/text.jpg: not an image" in err and "b/cut.png" in err
    # Skipping would leave nothing: the option is never offered (under skip it is the one given).
    assert "--on-error" not in err and "pack the rest" not in err
    assert "skipping the bad inputs would leave nothing to pack" in err
    assert "Traceback" not in err and not out.exists()


def test_info_on_missing_store_exits_2(tmp_path: Path, capsys: Capsys) -> None:
    assert main(["info", str(tmp_path / "none.zarr")]) == 2
    assert capsys.readouterr().err.startswith("dlpack: error: ")


@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_shows_the_traceback_and_keeps_the_exit_code(tmp_path: Path, capsys: Capsys, where: str) -> None:
    """``--debug`` before or after the command adds the traceback; the exit code is the one without it."""
    argv = ["info", str(tmp_path / "missing.zarr")]
    argv = ["--debug", *argv] if where == "before" else [*argv, "--debug"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and "StoreNotFoundError" in err
    assert err.rstrip("\n").splitlines()[-1].startswith("dlpack: error: no store at")


@pytest.mark.parametrize("argv", [["--help"], ["build", "--help"], ["info", "--help"]])
def test_help_returns_0(argv: list[str], capsys: Capsys) -> None:
    assert main(argv) == 0
    assert "usage: dlpack" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["--help"], ["build", "--help"], ["info", "--help"], ["verify", "--help"]])
def test_help_lists_the_internal_error_exit_code(argv: list[str], capsys: Capsys) -> None:
    assert main(argv) == 0
    assert "3 internal error" in " ".join(capsys.readouterr().out.split())


@pytest.mark.slow
def test_an_internal_error_in_a_subprocess_exits_3_not_1(src: Path, tmp_path: Path) -> None:
    """The exit status the shell sees, through ``python -m dlpack``: 1 means "skipped inputs" only."""
    code = INTERNAL_ERROR_MAIN
    argv = ["build", str(src), str(tmp_path / "o.zarr"), "--quiet", "--jobs", "1"]
    proc = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stderr
    assert "dlpack: internal error: KeyError" in proc.stderr and "Traceback" not in proc.stderr


def test_unknown_command_is_a_usage_error(capsys: Capsys) -> None:
    assert main(["pack"]) == 2
    assert "invalid choice" in capsys.readouterr().err


@pytest.mark.slow
def test_module_prints_version() -> None:
    proc = subprocess.run([sys.executable, "-m", "dlpack", "--version"], capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout.strip()) == (0, f"dlpack {dlpack.__version__}")


def test_verify_passes_on_an_intact_store_and_names_a_damaged_image(tmp_path, capsys):
    import cv2
    import numpy as np

    src = tmp_path / "src" / "a"
    src.mkdir(parents=True)
    for i in range(3):
        img = np.full((8, 10, 3), 40 * i + 10, np.uint8)
        (src / f"{i}.png").write_bytes(cv2.imencode(".png", img)[1].tobytes())
    out = tmp_path / "s.h5"
    assert main(["build", str(tmp_path / "src"), str(out), "--quiet", "--jobs", "1"]) == 0
    assert main(["verify", str(out)]) == 0
    assert "all 3 images match" in capsys.readouterr().out
    flip_image_byte(out, 1)
    assert main(["verify", str(out)]) == 4
    err = capsys.readouterr().err
    assert "1 of 3 images" in err and "a/1.png" in err


def test_an_unwritable_output_folder_is_an_error_not_a_traceback(tmp_path, capsys):
    import os

    import cv2
    import numpy as np

    if os.geteuid() == 0:
        # root ignores permissions: use a path under a regular file instead
        out = tmp_path / "file.txt" / "s.zarr"
        (tmp_path / "file.txt").write_text("x")
    else:
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        out = locked / "s.zarr"
    src = tmp_path / "src" / "a"
    src.mkdir(parents=True)
    (src / "0.png").write_bytes(cv2.imencode(".png", np.zeros((4, 4, 3), np.uint8))[1].tobytes())
    assert main(["build", str(tmp_path / "src"), str(out), "--quiet", "--jobs", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dlpack: error:") and "Traceback" not in err


def test_a_newline_in_a_name_is_escaped_in_the_summary_info_and_errors(
    make_tree: Callable[..., Path], tmp_path: Path, capsys: Capsys
) -> None:
    r"""A folder named ``new<newline>line`` cannot fake a line of output: it prints as ``new\nline``."""
    src = make_tree({"new\nline/0.png": "rgb", "b/1.png": "rgb", "new\nline/bad\n.png": b""})
    out = tmp_path / "o.zarr"
    assert main(["build", str(src), str(out), "--on-error", "skip", "--jobs", "1"]) == 1
    captured = capsys.readouterr()
    assert "classes (2): b, new\\nline" in captured.out
    assert "  new\\nline/bad\\n.png: empty file" in captured.err
    printed = captured.out.splitlines() + captured.err.splitlines()
    assert not [line for line in printed if line.startswith(("line", ".png"))]
    assert main(["info", str(out)]) == 0
    text = capsys.readouterr().out
    assert "b, new\\nline" in text and "skipped new\\nline/bad\\n.png: empty file" in text
    assert not [line for line in text.splitlines() if line.startswith(("line", ".png"))]
    assert main(["build", str(src), str(tmp_path / "p.zarr"), "--jobs", "1"]) == 2
    err = capsys.readouterr().err
    assert "  new\\nline/bad\\n.png: empty file" in err
    assert not [line for line in err.splitlines() if line.startswith(("line", ".png"))]
    with dlpack.open(out) as ds:  # the names themselves are kept exact
        assert ds.classes == ("b", "new\nline") and ds.manifest.skipped[0].path == "new\nline/bad\n.png"


def test_class_folders_differing_only_in_normalisation_exit_2_showing_both(
    make_tree: Callable[..., Path], tmp_path: Path, capsys: Capsys
) -> None:
    src = make_tree({"caf\u00e9/0.png": "rgb", "cafe\u0301/1.png": "rgb"})
    if len(list(src.iterdir())) != 2:
        pytest.skip("this file system normalises names itself")
    assert main(["build", str(src), str(tmp_path / "o.zarr"), "--jobs", "1"]) == 2
    err = capsys.readouterr().err
    assert "differ only in Unicode normalisation" in err and "(caf\\xe9)" in err and "(cafe\\u0301)" in err
    assert "Traceback" not in err


def test_verify_escapes_a_newline_in_the_name_of_a_damaged_image(tmp_path: Path, capsys: Capsys) -> None:
    import cv2
    import numpy as np

    src = tmp_path / "src" / "a"
    src.mkdir(parents=True)
    for name in ("0.png", "x\n  sample 9 (fake).png"):
        (src / name).write_bytes(cv2.imencode(".png", np.full((8, 10, 3), 7, np.uint8))[1].tobytes())
    out = tmp_path / "s.h5"
    assert main(["build", str(tmp_path / "src"), str(out), "--quiet", "--jobs", "1"]) == 0
    flip_image_byte(out, 1)
    assert main(["verify", str(out)]) == 4
    err = capsys.readouterr().err
    assert "  sample 1 (a/x\\n  sample 9 (fake).png)" in err
    assert "sample 9" not in err.replace("a/x\\n  sample 9", "")


@pytest.mark.parametrize("how", ["update", "overwrite"])
def test_a_full_disk_names_the_store_and_keeps_it(
    make_tree: Callable[..., Path],
    tmp_path: Path,
    backend: str,
    how: str,
    capsys: Capsys,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import errno
    import os

    import dlpack.backends._zarr as zarr_backend

    src = make_tree({"cat/0.png": "rgb", "dog/1.png": "rgb"})
    out = tmp_path / backend
    assert main(["build", str(src), str(out), "--quiet", "--jobs", "1"]) == 0
    (src / "cat" / "2.png").write_bytes((src / "cat" / "0.png").read_bytes())
    before = dlpack.open(out).fingerprint()

    def full(*args: object) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    class FullFile:
        def __init__(self, *args: object, **kwargs: object) -> None:
            pass

        def __enter__(self) -> FullFile:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        write = full

    # The disk fills while image data is written: a Zarr shard file, or the HDF5 file's raw bytes.
    monkeypatch.setattr(zarr_backend, "open", FullFile, raising=False)
    monkeypatch.setattr(os, "pwrite", full)
    flag = "--update" if how == "update" else "--overwrite"
    rc = main(["build", str(src), str(out), flag, "--quiet", "--jobs", "1"])
    monkeypatch.undo()
    err = capsys.readouterr().err
    assert rc == 2
    assert "the disk is full" in err and backend in err and "[Errno 28]" not in err, err
    assert dlpack.open(out).fingerprint() == before  # the store is as it was
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([backend, "src"])
