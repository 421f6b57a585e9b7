"""What a build allocates, opens and starts is bounded: sizes checked before anything is allocated, only
regular files opened, worker processes capped at the core count and gone with a killed build."""

from __future__ import annotations

import importlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import dlpack
from dlpack.cli import main
from dlpack.errors import OptionError
from dlpack.options import BuildOptions

MakeTree = Callable[..., Path]
Capsys = pytest.CaptureFixture[str]
build_module = importlib.import_module("dlpack.building")


def siblings(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


# ---------------------------------------------------------------- sizes are checked before anything is allocated


def test_a_planned_size_above_max_pixels_is_refused_before_anything_is_written(
    make_tree: MakeTree, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = make_tree({"a/0.png": ("rgb", 4, 4)})

    def no_allocation(*args: Any) -> Any:
        raise AssertionError("a block was allocated")

    monkeypatch.setattr(importlib.import_module("dlpack.pack.workers"), "fixed_block", no_allocation)
    monkeypatch.setattr(importlib.import_module("dlpack.pack.write"), "fixed_block", no_allocation)
    monkeypatch.setattr(importlib.import_module("dlpack.pack.write"), "write_images", no_allocation)
    with pytest.raises(OptionError, match="max_pixels"):
        dlpack.build(src, tmp_path / "o.zarr", size=(100, 100), allow_upscale=True, max_pixels=1000, quiet=True, jobs=1)
    assert siblings(tmp_path) == ["src"]


def test_a_fit_box_above_max_pixels_is_refused(make_tree: MakeTree, tmp_path: Path) -> None:
    """``--resize fit --max-side N`` pads every image to N x N, even a tiny one."""
    src = make_tree({"a/0.png": ("rgb", 4, 4)})
    with pytest.raises(OptionError, match="max_pixels"):
        dlpack.build(src, tmp_path / "o.zarr", resize="fit", max_side=100, max_pixels=1000, quiet=True, jobs=1)
    assert siblings(tmp_path) == ["src"]


def test_a_huge_size_exits_2_at_once(make_tree: MakeTree, tmp_path: Path, capsys: Capsys) -> None:
    src = make_tree({"a/0.png": ("rgb", 4, 4)})
    argv = ["build", str(src), str(tmp_path / "o.zarr"), "--size", "99999x99999", "--allow-upscale", "--jobs", "1"]
    assert main([*argv, "--quiet"]) == 2
    assert "max-pixels" in capsys.readouterr().err
    assert siblings(tmp_path) == ["src"]


def test_shard_bytes_above_2_gib_is_refused() -> None:
    with pytest.raises(OptionError, match="at most 2147483648"):
        BuildOptions(shard_bytes=2**31 + 1)


def test_a_write_block_above_the_bound_is_refused_before_it_is_allocated(
    make_tree: MakeTree, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = make_tree({f"a/{i}.png": "rgb" for i in range(30)})
    monkeypatch.setattr(
        importlib.import_module("dlpack.pack.plan"), "MAX_BLOCK_BYTES", 10_000
    )  # a block of 18 images of 3600 bytes is more
    monkeypatch.setattr(
        importlib.import_module("dlpack.pack.write"), "write_images", lambda *args: pytest.fail("the store was written")
    )
    with pytest.raises(OptionError, match="write block"):
        dlpack.build(src, tmp_path / "o.zarr", shard_bytes=2**16, quiet=True, jobs=1)
    assert siblings(tmp_path) == ["src"]


def test_a_size_within_max_pixels_still_builds(make_tree: MakeTree, tmp_path: Path) -> None:
    src = make_tree({"a/0.png": ("rgb", 4, 4)})
    dlpack.build(src, tmp_path / "o.zarr", size=(40, 25), allow_upscale=True, max_pixels=1000, quiet=True, jobs=1)
    assert dlpack.open(tmp_path / "o.zarr")[0]["image"].shape == (25, 40, 3)


# ---------------------------------------------------------------- only regular files are opened

FIFO_BUILD = """
import sys
import dlpack
from dlpack.errors import BadInputsError
try:
    r = dlpack.build(sys.argv[1], sys.argv[2], on_error=sys.argv[3], quiet=True, jobs=1)
except BadInputsError as exc:
    print("refused:", exc)
else:
    print("packed", r.count, "skipped", [str(e) for e in r.skipped])
"""


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
@pytest.mark.parametrize("on_error", ["fail", "skip"])
def test_a_fifo_named_png_is_a_bad_input_not_a_hang(make_tree: MakeTree, tmp_path: Path, on_error: str) -> None:
    src = make_tree({"a/0.png": "rgb"})
    os.mkfifo(src / "a" / "pipe.png")
    # In a child process, so that a regression fails the test instead of hanging the suite.
    proc = subprocess.run(
        [sys.executable, "-c", FIFO_BUILD, str(src), str(tmp_path / "o.zarr"), on_error],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "a/pipe.png: " in out and "not a regular file" in out, out  # reported by the scan, never opened
    if on_error == "skip":
        assert out.startswith("packed 1 ")
    else:
        assert out.startswith("refused:")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_opening_a_fifo_fails_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "x.png"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="not a regular file"):
        importlib.import_module("dlpack.pack.inputs").open_input(fifo)


# ---------------------------------------------------------------- workers die with the build

JOBS_BUILD = """
import sys
import dlpack
dlpack.build(sys.argv[1], sys.argv[2], jobs=2, force_jobs=True, quiet=True, on_error="skip")
"""


def _children(pid: int) -> set[int]:
    """Live descendants of ``pid`` (from /proc)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z":
                parents[int(entry)] = int(fields[1])
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {p for p, pp in parents.items() if pp in frontier and p not in found}
        found |= frontier
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.fixture
def killed_procs() -> Iterator[list[int]]:
    pids: list[int] = []
    yield pids
    for pid in pids:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
def test_workers_die_with_a_killed_build(make_tree: MakeTree, tmp_path: Path, killed_procs: list[int]) -> None:
    # Enough files for several probe calls, so that two worker processes start.
    src = make_tree({f"a/{i:04d}.png": ("rgb", 8, 8) for i in range(1200)})
    proc = subprocess.Popen([sys.executable, "-c", JOBS_BUILD, str(src), str(tmp_path / "o.zarr")])
    try:
        workers: set[int] = set()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None and len(workers) < 2:
            workers = _children(proc.pid)
            time.sleep(0.05)
        assert len(workers) >= 2, "the build finished or failed before its workers could be seen"
        killed_procs.extend(workers)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # Liveness bound, not a speed figure: without the fix idle workers wait out a 300 s timeout.
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and any(_alive(p) for p in workers):
        time.sleep(0.2)
    assert not [p for p in workers if _alive(p)]


def test_worker_watchdog_is_not_started_in_the_main_process() -> None:
    parallel = importlib.import_module("dlpack._parallel")
    parallel.start_watchdog(os.getpid())
    assert not parallel._WATCHDOG_STARTED


# ---------------------------------------------------------------- --jobs is capped


def test_jobs_are_capped_at_the_core_count() -> None:
    from dlpack.options import available_cores

    cores = available_cores()
    assert BuildOptions(jobs=cores + 50).n_jobs == cores
    assert BuildOptions(jobs=-1).n_jobs == cores
    assert BuildOptions(jobs=1).n_jobs == 1
    assert BuildOptions(jobs=cores + 50, force_jobs=True).n_jobs == cores + 50


def test_force_jobs_is_a_cli_flag(make_tree: MakeTree, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[BuildOptions] = []

    def record(src: Any, out: Any, opts: BuildOptions) -> Any:
        seen.append(opts)
        raise dlpack.errors.SourceError("stop here")

    monkeypatch.setattr(build_module, "build", record)
    assert main(["build", "x", str(tmp_path / "o.zarr"), "--jobs", "500", "--force-jobs"]) == 2
    assert main(["build", "x", str(tmp_path / "o.zarr"), "--jobs", "500"]) == 2
    from dlpack.options import available_cores

    assert [o.n_jobs for o in seen] == [500, min(500, available_cores())]
