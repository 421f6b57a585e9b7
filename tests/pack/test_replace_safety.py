"""What a build refuses to touch, hostile inputs, exit codes, and what a kill leaves behind."""

from __future__ import annotations

import importlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import dlpack
from dlpack._lock import old_path
from dlpack.cli import main
from dlpack.errors import BadInputsError, OptionError, SourceError, StoreError, StoreExistsError
from dlpack.options import BuildOptions

MakeTree = Callable[..., Path]
Capsys = pytest.CaptureFixture[str]
build_module = importlib.import_module("dlpack.pack")
publish_module = importlib.import_module("dlpack.pack.publish")


def files_of(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` by relative path, with its bytes."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def siblings(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


# ---------------------------------------------------------------- finding 1: never delete what is not dlpack's


def test_out_equal_to_src_is_refused_and_keeps_every_source_file(
    make_tree: MakeTree, tmp_path: Path, capsys: Capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    raw = make_tree({"cat/0.png": "rgb", "dog/1.png": "rgb"}, "raw")
    before = files_of(raw)
    monkeypatch.chdir(tmp_path)
    assert main(["build", "raw", "raw", "--overwrite", "--quiet", "--jobs", "1"]) == 2
    err = capsys.readouterr().err
    assert "is SRC" in err and str(raw) in err
    assert files_of(raw) == before
    assert siblings(tmp_path) == ["raw"]


def test_out_equal_to_src_through_another_spelling_is_refused(make_tree: MakeTree, tmp_path: Path) -> None:
    raw = make_tree({"a/0.png": "rgb"}, "raw")
    (tmp_path / "link").symlink_to(raw)
    before = files_of(raw)
    with pytest.raises(OptionError, match="is SRC"):
        dlpack.build(raw, tmp_path / "link" / ".." / "raw", overwrite=True, quiet=True, jobs=1)
    with pytest.raises(OptionError, match="is SRC"):
        dlpack.build(tmp_path / "link", raw, overwrite=True, quiet=True, jobs=1)
    assert files_of(raw) == before


def test_out_an_ancestor_of_src_is_refused_and_keeps_everything(make_tree: MakeTree, tmp_path: Path) -> None:
    parent = tmp_path / "data"
    src = make_tree({"cat/0.png": "rgb", "dog/1.png": "rgb"}, "data/raw")
    (parent / "notes.txt").write_text("weeks of labelling")
    before = files_of(parent)
    for out in (parent, tmp_path):
        with pytest.raises(OptionError, match="contains SRC") as info:
            dlpack.build(src, out, overwrite=True, quiet=True, jobs=1)
        assert str(src) in str(info.value) and str(out) in str(info.value)
    assert files_of(parent) == before


def test_out_inside_src_is_refused(make_tree: MakeTree, tmp_path: Path) -> None:
    src = make_tree({"cat/0.png": "rgb", "dog/1.png": "rgb"}, "raw")
    before = files_of(src)
    with pytest.raises(OptionError, match="inside SRC"):
        dlpack.build(src, src / "cat" / "out.zarr", quiet=True, jobs=1)
    assert files_of(src) == before
    assert sorted(p.name for p in (src / "cat").iterdir()) == ["0.png"]


@pytest.mark.parametrize("kind", ["folder", "file", "zarr-group", "empty-folder", "symlink"])
def test_overwrite_refuses_what_is_not_a_dlpack_store(
    make_tree: MakeTree, tmp_path: Path, capsys: Capsys, kind: str
) -> None:
    src = make_tree({"a/0.png": "rgb"})
    out = tmp_path / "out.zarr"
    if kind == "folder":
        out.mkdir()
        (out / "thesis.tex").write_text("chapter 1")
    elif kind == "file":
        out.write_bytes(b"not a store")
    elif kind == "zarr-group":
        import zarr

        zarr.open_group(str(out), mode="w", zarr_format=3).create_array("x", shape=(3,), dtype="u1")
    elif kind == "empty-folder":
        out.mkdir()
    else:
        target = tmp_path / "elsewhere.zarr"
        dlpack.build(make_tree({"b/0.png": "rgb"}, "other"), target, quiet=True, jobs=1)
        out.symlink_to(target)
    before = files_of(tmp_path)
    assert main(["build", str(src), str(out), "--overwrite", "--quiet", "--jobs", "1"]) == 2
    err = capsys.readouterr().err
    assert "not a dlpack store" in err and str(out) in err, err
    assert files_of(tmp_path) == before
    assert out.is_symlink() == (kind == "symlink")


def test_overwrite_replaces_a_dlpack_store_of_the_other_format(make_tree: MakeTree, tmp_path: Path) -> None:
    out = tmp_path / "store"
    dlpack.build(make_tree({"a/0.png": "rgb"}), out, format="hdf5", quiet=True, jobs=1)
    dlpack.build(make_tree({"b/0.png": "rgb", "b/1.png": "rgb"}, "new"), out, overwrite=True, quiet=True, jobs=1)
    assert len(dlpack.open(out)) == 2 and dlpack.open(out).backend == "zarr"


def test_a_non_dlpack_out_appearing_during_the_build_is_not_replaced(
    make_tree: MakeTree, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out.zarr"
    real = build_module.commit_store

    def commit_then_someone_writes_out(*args: Any) -> None:
        real(*args)
        out.mkdir()
        (out / "mine.txt").write_text("keep me")

    monkeypatch.setattr(build_module, "commit_store", commit_then_someone_writes_out)
    with pytest.raises(StoreExistsError, match="not a dlpack store"):
        dlpack.build(make_tree({"a/0.png": "rgb"}), out, overwrite=True, quiet=True, jobs=1)
    assert (out / "mine.txt").read_text() == "keep me"
    assert siblings(tmp_path) == ["out.zarr", "src"]


# ---------------------------------------------------------------- finding 10e: empty paths


def test_an_empty_source_path_is_refused(make_tree: MakeTree, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make_tree({"a/0.png": "rgb"}, "cwd")
    monkeypatch.chdir(tmp_path / "cwd")
    with pytest.raises(SourceError, match="empty"):
        dlpack.build("", tmp_path / "out.zarr", quiet=True, jobs=1)
    assert not (tmp_path / "out.zarr").exists()


def test_an_empty_source_path_exits_2_from_the_cli(make_tree: MakeTree, tmp_path: Path, capsys: Capsys) -> None:
    assert main(["build", "", str(tmp_path / "out.zarr"), "--quiet", "--jobs", "1"]) == 2
    assert "empty" in capsys.readouterr().err


def test_an_empty_output_path_is_refused(make_tree: MakeTree, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = make_tree({"a/0.png": "rgb"})
    monkeypatch.chdir(tmp_path)
    with pytest.raises(OptionError, match="empty"):
        dlpack.build(src, "", overwrite=True, quiet=True, jobs=1)
    assert siblings(tmp_path) == ["src"]


# ---------------------------------------------------------------- finding 8: exit codes


@pytest.mark.parametrize("exc", [RuntimeError("boom"), KeyError("gone"), ZeroDivisionError("x")])
def test_unexpected_exceptions_exit_3_with_a_hint(
    make_tree: MakeTree, tmp_path: Path, capsys: Capsys, monkeypatch: pytest.MonkeyPatch, exc: Exception
) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise exc

    monkeypatch.setattr(build_module, "scan_stage", broken)
    src = make_tree({"a/0.png": "rgb"})
    assert main(["build", str(src), str(tmp_path / "o.zarr"), "--quiet", "--jobs", "1"]) == 3
    err = capsys.readouterr().err
    assert "internal error" in err and type(exc).__name__ in err and "report" in err and "--debug" in err
    assert "Traceback" not in err


def test_unexpected_exceptions_in_info_exit_3(tmp_path: Path, capsys: Capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("reader blew up")

    monkeypatch.setattr(importlib.import_module("dlpack.dataset"), "open", broken)
    assert main(["info", str(tmp_path / "x.zarr")]) == 3
    assert "reader blew up" in capsys.readouterr().err


def test_debug_shows_the_traceback_of_an_unexpected_exception(
    make_tree: MakeTree, tmp_path: Path, capsys: Capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("boom")

    monkeypatch.setattr(build_module, "scan_stage", broken)
    src = make_tree({"a/0.png": "rgb"})
    assert main(["--debug", "build", str(src), str(tmp_path / "o.zarr"), "--quiet", "--jobs", "1"]) == 3
    err = capsys.readouterr().err
    assert "Traceback" in err and "RuntimeError: boom" in err and "dlpack: internal error: RuntimeError" in err


# ---------------------------------------------------------------- finding 9: bounded allocations


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


# ---------------------------------------------------------------- finding 10a: only regular files are opened

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


# ---------------------------------------------------------------- finding 10b: publishing never leaves OUT missing


@pytest.fixture
def watch_out(monkeypatch: pytest.MonkeyPatch) -> Callable[[Path], list[tuple[str, bool]]]:
    """``watch_out(out)``: after every rename the build makes, whether ``out`` holds a store."""
    seen: list[tuple[str, bool]] = []

    def start(out: Path) -> list[tuple[str, bool]]:
        real_replace, real_exchange = os.replace, publish_module._exchange

        def replace(a: Any, b: Any) -> None:
            real_replace(a, b)
            seen.append((f"replace {Path(a).name} -> {Path(b).name}", out.exists()))

        def exchange(a: Path, b: Path) -> bool:
            done = real_exchange(a, b)
            seen.append((f"exchange {a.name} <-> {b.name} ({done})", out.exists()))
            return done

        monkeypatch.setattr(publish_module.os, "replace", replace)
        monkeypatch.setattr(publish_module, "_exchange", exchange)
        return seen

    return start


def test_overwrite_never_leaves_out_missing(
    make_tree: MakeTree, tmp_path: Path, backend: str, watch_out: Callable[[Path], list[tuple[str, bool]]]
) -> None:
    out = tmp_path / backend
    dlpack.build(make_tree({"a/0.png": "rgb"}), out, quiet=True, jobs=1)
    seen = watch_out(out)
    dlpack.build(make_tree({"b/0.png": "gray", "b/1.png": "gray"}, "new"), out, overwrite=True, quiet=True, jobs=1)
    if not any(step.startswith("exchange") and step.endswith("(True)") for step, _ in seen):
        pytest.skip("no atomic exchange on this platform or file system: publishing takes two renames")
    assert seen and all(present for _, present in seen), seen
    assert len(dlpack.open(out)) == 2
    assert siblings(tmp_path) == sorted([backend, "new", "src"])


@pytest.mark.parametrize("exchange", [True, False])
def test_a_foreign_out_swapped_in_after_the_check_is_put_back(
    make_tree: MakeTree, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exchange: bool
) -> None:
    out = tmp_path / "out.zarr"
    dlpack.build(make_tree({"a/0.png": "rgb"}), out, quiet=True, jobs=1)
    real_check = build_module.check_replaceable
    swapped: list[bool] = []

    def check_then_swap(path: Path) -> None:
        real_check(path)
        swapped.append(True)
        if len(swapped) == 2:  # at publishing, another process replaces OUT between the check and the rename
            shutil.rmtree(path)
            path.mkdir()
            (path / "mine.txt").write_text("keep me")

    # Checked once by the build before it starts, once more by publishing.
    monkeypatch.setattr(build_module, "check_replaceable", check_then_swap)
    monkeypatch.setattr(publish_module, "check_replaceable", check_then_swap)
    if not exchange:
        monkeypatch.setattr(publish_module, "_exchange", lambda a, b: False)
    with pytest.raises(StoreExistsError, match="not a dlpack store"):
        dlpack.build(make_tree({"b/0.png": "rgb"}, "b"), out, overwrite=True, quiet=True, jobs=1)
    assert (out / "mine.txt").read_text() == "keep me"
    assert siblings(tmp_path) == ["b", "out.zarr", "src"]


def test_publishing_a_new_out_never_replaces_one_that_appeared(tmp_path: Path) -> None:
    new, out = tmp_path / "partial", tmp_path / "out.h5"
    new.write_bytes(b"new store")
    out.write_bytes(b"someone else's file")
    try:
        moved = publish_module._rename_noreplace(new, out)
    except StoreExistsError:
        moved = None
    if moved is False:
        pytest.skip("no atomic no-replace rename on this platform or file system")
    assert moved is None, "the file at OUT was replaced"
    assert out.read_bytes() == b"someone else's file" and new.read_bytes() == b"new store"


def test_publish_without_exchange_still_replaces(
    make_tree: MakeTree, tmp_path: Path, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(publish_module, "_exchange", lambda a, b: False)
    out = tmp_path / backend
    dlpack.build(make_tree({"a/0.png": "rgb"}), out, quiet=True, jobs=1)
    dlpack.build(make_tree({"b/0.png": "gray", "b/1.png": "gray"}, "new"), out, overwrite=True, quiet=True, jobs=1)
    assert len(dlpack.open(out)) == 2
    assert siblings(tmp_path) == sorted([backend, "new", "src"])


def test_a_kill_after_staging_keeps_the_published_store(
    make_tree: MakeTree, tmp_path: Path, backend: str, snapshot: Any
) -> None:
    """A kill after the new store reached ``.NAME.dlpack-old`` but before the exchange: OUT is kept."""
    out = tmp_path / backend
    dlpack.build(make_tree({"a/0.png": "rgb"}), out, quiet=True, jobs=1)
    before = snapshot(out)
    staged = tmp_path / "staged" / backend
    dlpack.build(make_tree({"b/0.png": "gray"}, "new"), staged, quiet=True, jobs=1)
    os.replace(staged, old_path(out))
    # The next build into OUT clears the leftover first, then refuses (no --overwrite).
    with pytest.raises(StoreExistsError):
        dlpack.build(make_tree({"c/0.png": "rgb"}, "third"), out, quiet=True, jobs=1)
    assert snapshot(out) == before
    assert not old_path(out).exists()


def test_a_half_removed_old_store_is_cleared(make_tree: MakeTree, tmp_path: Path) -> None:
    """A kill while the replaced store was being removed: its marker goes last, so it is still recognised."""
    out = tmp_path / "out.zarr"
    dlpack.build(make_tree({"a/0.png": "rgb"}), out, quiet=True, jobs=1)
    old = old_path(out)
    dlpack.build(make_tree({"b/0.png": "rgb"}, "b"), old, format="zarr", quiet=True, jobs=1)  # a name of no format
    (old / "manifest.json").unlink()
    next(p for p in sorted(old.rglob("*")) if p.is_file() and p.name != "zarr.json").unlink()
    dlpack.build(make_tree({"c/0.png": "rgb"}, "c"), out, overwrite=True, quiet=True, jobs=1)
    assert not old.exists()


def test_a_foreign_file_at_the_old_name_is_not_deleted(make_tree: MakeTree, tmp_path: Path) -> None:
    out = tmp_path / "out.zarr"
    dlpack.build(make_tree({"a/0.png": "rgb"}), out, quiet=True, jobs=1)
    old = old_path(out)
    old.mkdir()
    (old / "mine.txt").write_text("keep me")
    with pytest.raises(StoreError, match="not a dlpack store"):
        dlpack.build(make_tree({"b/0.png": "rgb"}, "b"), out, overwrite=True, quiet=True, jobs=1)
    assert (old / "mine.txt").read_text() == "keep me"


def test_remove_takes_the_zarr_marker_last(
    make_tree: MakeTree, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = tmp_path / "s.zarr"
    dlpack.build(make_tree({"a/0.png": "rgb", "a/1.png": "rgb"}), store, quiet=True, jobs=1)
    removed: list[str] = []
    real_unlink = Path.unlink

    def unlink(self: Path, missing_ok: bool = False) -> None:
        removed.append(self.relative_to(store).as_posix())
        real_unlink(self, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", unlink)
    importlib.import_module("dlpack.backends").remove_store(store)
    assert not store.exists()
    assert removed[0] == "manifest.json" and removed[-1] == "zarr.json"


# ---------------------------------------------------------------- finding 10c: workers die with the build

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


# ---------------------------------------------------------------- finding 10d: --jobs is capped


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


# ---------------------------------------------------------------- finding 11: not dlpack's, and hostile names


def test_a_plain_zarr_group_is_not_called_an_incomplete_dlpack_store(tmp_path: Path, capsys: Capsys) -> None:
    import zarr

    group = tmp_path / "theirs.zarr"
    zarr.open_group(str(group), mode="w", zarr_format=3).create_array("x", shape=(3,), dtype="u1")
    with pytest.raises(dlpack.errors.DlpackError, match="not a dlpack store") as info:
        dlpack.open(group)
    assert "overwrite" not in str(info.value) and "incomplete" not in str(info.value)
    assert main(["info", str(group)]) == 2
    err = capsys.readouterr().err
    assert "not a dlpack store" in err and "overwrite" not in err


RED = "\x1b[31m"


def test_control_characters_in_names_are_escaped_by_build(make_tree: MakeTree, tmp_path: Path, capsys: Capsys) -> None:
    src = make_tree({"a/0.png": "rgb", f"a/{RED}evil\u202e.png": b""})
    out = tmp_path / "o.zarr"
    assert main(["build", str(src), str(out), "--on-error", "skip", "--jobs", "1"]) == 1
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\u202e" not in err
    assert "\\x1b[31mevil\\u202e.png" in err
    capsys.readouterr()
    assert main(["info", str(out)]) == 0
    text = capsys.readouterr().out
    assert "\x1b" not in text and "\\x1b[31mevil" in text


def test_control_characters_in_error_messages_are_escaped(make_tree: MakeTree, tmp_path: Path, capsys: Capsys) -> None:
    src = make_tree({"a/0.png": "rgb", f"a/{RED}bad.png": b""})
    assert main(["build", str(src), str(tmp_path / "o.zarr"), "--jobs", "1"]) == 2
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\\x1b[31mbad.png" in err
    assert "\n" in err.strip()  # multi-line messages keep their line breaks


def test_json_output_keeps_names_exact(make_tree: MakeTree, tmp_path: Path, capsys: Capsys) -> None:
    import json

    src = make_tree({"a/0.png": "rgb", f"a/{RED}bad.png": b""})
    out = tmp_path / "o.zarr"
    assert main(["build", str(src), str(out), "--on-error", "skip", "--jobs", "1", "--json", "--quiet"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert [e["path"] for e in doc["skipped"]] == [f"a/{RED}bad.png"]


def test_bad_inputs_error_is_still_raised_by_the_library(make_tree: MakeTree, tmp_path: Path) -> None:
    src = make_tree({"a/0.png": "rgb", f"a/{RED}bad.png": b""})
    with pytest.raises(BadInputsError) as info:
        dlpack.build(src, tmp_path / "o.zarr", quiet=True, jobs=1)
    assert info.value.errors[0].path == f"a/{RED}bad.png"  # the library keeps the exact name
