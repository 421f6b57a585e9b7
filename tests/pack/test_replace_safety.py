"""What a build refuses to replace or write into: what is not a dlpack store, SRC itself, an empty path;
and publishing, which never leaves OUT missing nor replaces what appeared there."""

from __future__ import annotations

import importlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import dlpack
from dlpack.cli import main
from dlpack.errors import OptionError, SourceError, StoreError, StoreExistsError
from dlpack.storage.lock import old_path

MakeTree = Callable[..., Path]
Capsys = pytest.CaptureFixture[str]
build_module = importlib.import_module("dlpack.pack")
publish_module = importlib.import_module("dlpack.storage.publish")


def files_of(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` by relative path, with its bytes."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def siblings(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


# ---------------------------------------------------------------- never delete what is not dlpack's


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


# ---------------------------------------------------------------- empty paths


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


# ---------------------------------------------------------------- publishing never leaves OUT missing


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
