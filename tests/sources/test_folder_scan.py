"""The folder source's scan: every input it does not pack is reported, labels and splits come from
documented folder rules, and links, loops, odd names and unsupported formats never crash it."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import dlpack
from dlpack.errors import BadInputsError, SourceError
from dlpack.pack import BuildResult
from dlpack.sample import make_sample
from dlpack.sources import FolderSource

MakeTree = Callable[..., Path]


def build(src: Path, out: Path, **kwargs: Any) -> BuildResult:
    return dlpack.build(src, out, quiet=True, jobs=1, **kwargs)


def reported(src: Path, **kwargs: Any) -> dict[str, str]:
    """``{path: reason}`` of the inputs the scan reports."""
    return {e.path: e.reason for e in FolderSource(src, **kwargs).scan().errors}


def sources(out: Path) -> list[str]:
    with dlpack.open(out) as ds:
        return [ds[i]["source"] for i in range(len(ds))]


# ---------------------------------------------------------------- nothing vanishes silently


def test_symlinked_class_folder_is_reported_without_follow(make_tree: MakeTree, tmp_path: Path) -> None:
    src = make_tree({"a/0.png": "rgb", ".pool/c/2.png": "rgb"})
    outside = make_tree({"1.png": "rgb"}, name="elsewhere")
    (src / "b").symlink_to(outside, target_is_directory=True)
    (src / "c").symlink_to(src / ".pool/c", target_is_directory=True)
    errors = reported(src)
    assert sorted(errors) == ["b/", "c/"]
    assert "leaves the source folder" in errors["b/"]
    assert "--follow-symlinks" in errors["c/"]
    with pytest.raises(BadInputsError) as info:
        build(src, tmp_path / "o.zarr")
    assert [e.path for e in info.value.errors] == ["b/", "c/"]
    result = build(src, tmp_path / "o.zarr", on_error="skip")
    assert (result.count, [e.path for e in result.skipped]) == (1, ["b/", "c/"])


@pytest.fixture
def unreadable(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[Path], None]]:
    """``unreadable(folder)``: listing ``folder`` fails with EACCES (tests run as root, where chmod 000 does not)."""
    blocked: set[str] = set()
    real_scandir = os.scandir

    def scandir(path: Any = ".") -> Any:
        if os.fspath(path) in blocked:
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    return lambda folder: blocked.add(os.fspath(folder))


def test_unreadable_sub_folder_is_reported(
    make_tree: MakeTree, tmp_path: Path, unreadable: Callable[[Path], None]
) -> None:
    src = make_tree({"a/0.png": "rgb", "b/1.png": "rgb", "b/2.png": "rgb", "c/deep/3.png": "rgb"})
    unreadable(src / "b")
    unreadable(src / "c" / "deep")
    errors = reported(src)
    assert sorted(errors) == ["b/", "c/deep/"]
    assert all("cannot read folder" in r and "Permission denied" in r for r in errors.values())
    with pytest.raises(BadInputsError, match=re.escape("b/: cannot read folder")):
        build(src, tmp_path / "o.zarr")
    result = build(src, tmp_path / "o.zarr", on_error="skip")
    assert [e.path for e in result.skipped] == ["b/", "c/deep/"]
    assert sources(tmp_path / "o.zarr") == ["a/0.png"]


def test_unreadable_source_folder_is_a_source_error(make_tree: MakeTree, unreadable: Callable[[Path], None]) -> None:
    src = make_tree({"a/0.png": "rgb"})
    unreadable(src)
    with pytest.raises(SourceError, match="cannot read the source folder .*Permission denied"):
        FolderSource(src).scan()


# ---------------------------------------------------------------- --follow-symlinks stays inside SRC


def test_follow_does_not_leave_the_source_folder(make_tree: MakeTree, tmp_path: Path) -> None:
    src = make_tree({"a/0.png": "rgb"})
    outside = make_tree({"1.png": "rgb", "2.png": "rgb"}, name="elsewhere")
    (src / "b").symlink_to(outside, target_is_directory=True)
    errors = reported(src, follow_symlinks=True)
    assert list(errors) == ["b/"]
    assert "leaves the source folder" in errors["b/"]
    result = build(src, tmp_path / "o.zarr", follow_symlinks=True, on_error="skip")
    assert result.count == 1
    assert sources(tmp_path / "o.zarr") == ["a/0.png"]


def test_follow_stops_at_loops(make_tree: MakeTree, tmp_path: Path) -> None:
    src = make_tree({"a/0.png": "rgb", "b/1.png": "rgb"})
    (src / "a/tob").symlink_to("../b", target_is_directory=True)  # a -> b -> a
    (src / "b/toa").symlink_to("../a", target_is_directory=True)
    (src / "a/self").symlink_to(".", target_is_directory=True)
    (src / "b/root").symlink_to("..", target_is_directory=True)
    errors = reported(src, follow_symlinks=True)
    assert sorted(errors) == ["a/self/", "a/tob/", "b/root/", "b/toa/"]
    assert "symlink loop" in errors["a/self/"] and "symlink loop" in errors["b/root/"]
    assert "'b'" in errors["a/tob/"] and "'a'" in errors["b/toa/"]
    result = build(src, tmp_path / "o.zarr", follow_symlinks=True, on_error="skip")
    assert result.count == 2
    assert sources(tmp_path / "o.zarr") == ["a/0.png", "b/1.png"]


def test_follow_link_to_a_sibling_folder_packs_each_image_once(make_tree: MakeTree, tmp_path: Path) -> None:
    src = make_tree({"b/0.png": "rgb", "b/1.png": "rgb"})
    (src / "a").symlink_to("b", target_is_directory=True)  # sorts first, but the real path wins
    with pytest.raises(BadInputsError, match=re.escape("a/: links to the folder 'b'")):
        build(src, tmp_path / "o.zarr", follow_symlinks=True)
    build(src, tmp_path / "o.zarr", follow_symlinks=True, on_error="skip")
    assert sources(tmp_path / "o.zarr") == ["b/0.png", "b/1.png"]
    with dlpack.open(tmp_path / "o.zarr") as ds:
        assert ds.classes == ("b",)


def test_follow_packs_linked_hidden_folders_and_files_once(make_tree: MakeTree, tmp_path: Path) -> None:
    src = make_tree({"a/0.png": "rgb", ".pool/x/1.png": "rgb", ".pool/2.png": "rgb"})
    (src / "b").symlink_to(".pool/x", target_is_directory=True)  # reachable only through the link
    (src / "c").mkdir()
    (src / "c/2.png").symlink_to("../.pool/2.png")
    (src / "c/3.png").symlink_to("../.pool/2.png")  # the same file again: c/2.png sorts first and wins
    (src / "c/4.png").symlink_to("../a/0.png")  # a file packed from its real path
    errors = reported(src, follow_symlinks=True)
    assert errors == {
        "c/3.png": "the same file as 'c/2.png', which is packed; not packed twice",
        "c/4.png": "the same file as 'a/0.png', which is packed; not packed twice",
    }
    items = FolderSource(src, follow_symlinks=True).scan().items
    assert [(i.rel, i.label) for i in items] == [("a/0.png", "a"), ("b/1.png", "b"), ("c/2.png", "c")]


# ---------------------------------------------------------------- labels and splits


def test_stray_images_at_the_root_refuse_auto_labels(make_tree: MakeTree, tmp_path: Path) -> None:
    spec = {"a/0.png": "rgb", "b/1.png": "rgb", **{f"stray{k}.png": "rgb" for k in range(7)}}
    src = make_tree(spec)
    with pytest.raises(SourceError) as info:
        build(src, tmp_path / "o.zarr")
    message = str(info.value)
    assert "7 images sit directly in" in message
    assert "stray0.png, stray1.png, stray2.png, stray3.png, stray4.png and 2 more" in message
    assert "--labels none" in message and "move them into class folders" in message.lower()
    assert not (tmp_path / "o.zarr").exists()
    # The documented ways out: an unlabelled store, or a flat folder with no class folders at all.
    assert build(src, tmp_path / "none.zarr", labels="none").count == 9
    assert FolderSource(make_tree({"0.png": "rgb", "1.png": "rgb"}, name="flat")).scan().classes == ()


def fashion_like(make_tree: MakeTree, train: str = "train", test: str = "test") -> Path:
    """A tiny Fashion-MNIST-like tree: SPLIT/CLASS/n.png, 3 classes, 3 train and 2 test images each."""
    spec: dict[str, Any] = {}
    for c in ("Bag", "Coat", "Shirt"):
        spec.update({f"{train}/{c}/{n}.png": ("gray", 8, 8) for n in range(3)})
        spec.update({f"{test}/{c}/{n}.png": ("gray", 8, 8) for n in range(2)})
    return make_tree(spec)


def test_split_folders_above_class_folders(make_tree: MakeTree, tmp_path: Path, backend: str) -> None:
    src = fashion_like(make_tree)
    scan = FolderSource(src).scan()
    assert scan.classes == ("Bag", "Coat", "Shirt")
    assert {(i.rel.split("/")[0], i.split, i.label) for i in scan.items} == {
        (s, s, c) for s in ("train", "test") for c in ("Bag", "Coat", "Shirt")
    }
    result = build(src, tmp_path / backend)
    summary = result.summary()
    assert "classes (3): Bag, Coat, Shirt" in summary
    assert "splits: test 6, train 9" in summary
    with dlpack.open(tmp_path / backend) as ds:
        assert ds.classes == ("Bag", "Coat", "Shirt")
        assert ds.manifest.splits == ("test", "train")
        got = [(ds[i]["source"], ds[i]["split"], ds.classes[ds[i]["label"]]) for i in range(len(ds))]
        assert got == [(i.rel, i.split, i.label) for i in scan.items]
        batch = ds.get_batch(np.arange(len(ds)))
        assert batch["split"].dtype == np.int8
        assert batch["split"].tolist() == [ds.manifest.splits.index(str(i.split)) for i in scan.items]


def test_split_names_are_case_insensitive(make_tree: MakeTree) -> None:
    src = fashion_like(make_tree, train="Train", test="VALIDATION")
    (src / "val" / "Bag").mkdir(parents=True)
    (src / "val" / "Bag" / "9.png").write_bytes((src / "Train/Bag/0.png").read_bytes())
    scan = FolderSource(src).scan()
    assert {i.split for i in scan.items} == {"train", "validation", "val"}
    assert scan.classes == ("Bag", "Coat", "Shirt")


def test_split_folders_with_images_directly_inside_are_unlabelled(make_tree: MakeTree) -> None:
    scan = FolderSource(make_tree({"train/0.png": "rgb", "test/1.png": "rgb"})).scan()
    assert [(i.rel, i.split, i.label) for i in scan.items] == [
        ("test/1.png", "test", None),
        ("train/0.png", "train", None),
    ]
    assert scan.classes == ()


def test_flat_class_layout_is_unchanged_and_has_no_split_array(make_tree: MakeTree, tmp_path: Path) -> None:
    src = make_tree({"cat/0.png": "rgb", "dog/1.png": "rgb", "test/2.png": "rgb"})
    scan = FolderSource(src).scan()
    assert [(i.rel, i.label, i.split) for i in scan.items] == [
        ("cat/0.png", "cat", None),
        ("dog/1.png", "dog", None),
        ("test/2.png", "test", None),  # "test" is a class here: not every top folder is a split
    ]
    result = build(src, tmp_path / "o.zarr")
    assert "classes (3): cat, dog, test" in result.summary()
    assert "splits" not in result.summary()
    with dlpack.open(tmp_path / "o.zarr") as ds:
        assert "split" not in ds.manifest.arrays
        assert ds.manifest.splits == ()


def test_deeper_trees_take_the_top_folder_below_the_split(make_tree: MakeTree) -> None:
    spec = {"a/b/c.png": "rgb", "a/d.png": "rgb", "e/lot 7/night/f.png": "rgb"}
    scan = FolderSource(make_tree(spec)).scan()
    assert [(i.rel, i.label) for i in scan.items] == [
        ("a/b/c.png", "a"),
        ("a/d.png", "a"),
        ("e/lot 7/night/f.png", "e"),
    ]
    scan = FolderSource(make_tree({"train/x/y/z.png": "rgb", "test/w/v.png": "rgb"}, name="split")).scan()
    assert [(i.rel, i.split, i.label) for i in scan.items] == [
        ("test/w/v.png", "test", "w"),
        ("train/x/y/z.png", "train", "x"),
    ]


def test_built_in_sample_keeps_its_four_classes(tmp_path: Path) -> None:
    # Its lots, cameras and shifts are sub-folders of a class, not classes.
    scan = FolderSource(make_sample(tmp_path / "raw", count=24, size=16)).scan()
    assert scan.classes == ("crack", "good", "scratch", "spot")
    assert any(i.rel.count("/") > 1 for i in scan.items)


def test_summary_says_when_a_store_is_unlabelled(make_tree: MakeTree, tmp_path: Path) -> None:
    result = build(make_tree({"0.png": "rgb", "1.png": "rgb"}), tmp_path / "o.zarr")
    assert "unlabelled" in result.summary()


def test_summary_shortens_a_long_class_list(make_tree: MakeTree, tmp_path: Path) -> None:
    src = make_tree({f"c{k:02d}/0.png": ("rgb", 8, 8) for k in range(30)})
    summary = build(src, tmp_path / "o.zarr").summary()
    assert "classes (30): c00, c01," in summary
    assert "c19, ... and 10 more" in summary


# ---------------------------------------------------------------- links and names that crashed the scan


@pytest.mark.parametrize("follow", [False, True])
def test_symlink_loop_between_two_files_is_a_bad_input(make_tree: MakeTree, tmp_path: Path, follow: bool) -> None:
    src = make_tree({"a/0.png": "rgb"})
    (src / "a/x.png").symlink_to("y.png")
    (src / "a/y.png").symlink_to("x.png")
    errors = reported(src, follow_symlinks=follow)
    assert sorted(errors) == ["a/x.png", "a/y.png"]
    assert all("symlink loop" in r for r in errors.values())
    result = build(src, tmp_path / "o.zarr", follow_symlinks=follow, on_error="skip")
    assert (result.count, [e.path for e in result.skipped]) == (1, ["a/x.png", "a/y.png"])


def test_broken_symlink_is_a_bad_input(make_tree: MakeTree) -> None:
    src = make_tree({"a/0.png": "rgb"})
    (src / "a/gone.png").symlink_to("missing.png")
    (src / "b").symlink_to("missing-folder")
    for follow in (False, True):
        errors = reported(src, follow_symlinks=follow)
        assert sorted(errors) == ["a/gone.png", "b"]
        assert all("broken symlink" in r for r in errors.values())


def test_non_utf8_file_name_is_a_bad_input(make_tree: MakeTree, tmp_path: Path) -> None:
    src = make_tree({"a/0.png": "rgb"})
    data = (src / "a/0.png").read_bytes()
    fd = os.open(os.fsencode(src) + b"/a/\xff.png", os.O_WRONLY | os.O_CREAT, 0o644)
    os.write(fd, data)
    os.close(fd)
    os.mkdir(os.fsencode(src) + b"/\xfe")
    fd = os.open(os.fsencode(src) + b"/\xfe/1.png", os.O_WRONLY | os.O_CREAT, 0o644)
    os.write(fd, data)
    os.close(fd)
    errors = reported(src)
    assert sorted(errors) == ["\\xfe/1.png", "a/\\xff.png"]
    assert all("not valid UTF-8" in r for r in errors.values())
    with pytest.raises(BadInputsError, match=re.escape("a/\\xff.png: the file name is not valid UTF-8")):
        build(src, tmp_path / "o.zarr")
    result = build(src, tmp_path / "o.zarr", on_error="skip")
    assert result.count == 1
    with dlpack.open(tmp_path / "o.zarr") as ds:
        assert [e.path for e in ds.manifest.skipped] == ["\\xfe/1.png", "a/\\xff.png"]


def test_fifo_named_like_an_image_is_a_bad_input(make_tree: MakeTree) -> None:
    src = make_tree({"a/0.png": "rgb"})
    os.mkfifo(src / "a/pipe.png")
    assert reported(src) == {"a/pipe.png": "not a regular file (a FIFO, socket or device); not read"}


# ---------------------------------------------------------------- unsupported image formats


@pytest.mark.parametrize(
    ("name", "fmt"),
    [("x.gif", "GIF"), ("x.GIF", "GIF"), ("x.jp2", "JPEG 2000"), ("x.heic", "HEIF"), ("x.avif", "AVIF"),
     ("x.exr", "OpenEXR"), ("x.hdr", "Radiance HDR"), ("x.ico", "ICO"), ("x.svg", "SVG")],
)  # fmt: skip
def test_unsupported_image_formats_are_reported(make_tree: MakeTree, tmp_path: Path, name: str, fmt: str) -> None:
    src = make_tree({"a/0.png": "rgb", f"a/{name}": b"GIF89a"})
    assert reported(src) == {f"a/{name}": f"unsupported format {fmt}; convert it to PNG"}
    result = build(src, tmp_path / "o.zarr", on_error="skip")
    assert [(e.path, e.reason) for e in result.skipped] == [
        (f"a/{name}", f"unsupported format {fmt}; convert it to PNG")
    ]


def test_non_image_files_stay_ignored(make_tree: MakeTree) -> None:
    src = make_tree({"a/0.png": "rgb", "a/notes.txt": b"x", "a/meta.json": b"{}", "labels.csv": b"a,b", "README": b""})
    scan = FolderSource(src).scan()
    assert (scan.errors, [i.rel for i in scan.items], scan.classes) == ((), ["a/0.png"], ("a",))


# ---------------------------------------------------------------- names that differ only in Unicode normalisation

NFC, NFD = "caf\u00e9", "cafe\u0301"


@pytest.mark.parametrize(
    ("spec", "what"),
    [
        ({f"{NFC}/0.png": "rgb", f"{NFD}/1.png": "rgb"}, "two folders in "),
        ({f"a/{NFC}.png": "rgb", f"a/{NFD}.png": "rgb"}, "two files in "),
        ({f"train/{NFC}/0.png": "rgb", f"val/{NFD}/1.png": "rgb"}, "two class folders in "),
        ({f"a/{NFC}/0.png": "rgb", f"a/{NFD}/1.png": "rgb"}, "two folders in "),
    ],
    ids=["class-folders", "files", "classes-under-splits", "sub-folders"],
)
def test_names_that_differ_only_in_unicode_normalisation_are_refused(
    make_tree: MakeTree, tmp_path: Path, spec: dict[str, str], what: str
) -> None:
    probe = tmp_path / "forms"
    probe.mkdir()
    (probe / NFC).touch()
    (probe / NFD).touch()
    if len(os.listdir(probe)) != 2:
        pytest.skip("this file system normalises names itself")
    src = make_tree(spec)
    with pytest.raises(SourceError) as info:
        build(src, tmp_path / "o.zarr")
    message = str(info.value)
    assert what in message and "differ only in Unicode normalisation" in message
    # Both names, with their code points, so the difference is visible.
    assert "(caf\\xe9" in message and "(cafe\\u0301" in message
    assert not (tmp_path / "o.zarr").exists()


def test_the_same_name_in_both_normal_forms_in_different_folders_is_packed(make_tree: MakeTree, tmp_path: Path) -> None:
    # Different folders, or a twin that is not an input (a notes file beside a class folder): no clash.
    src = make_tree(
        {f"a/{NFC}.png": "rgb", f"b/{NFD}.png": "rgb", "b/x.png": "rgb", f"{NFC}/y.png": "rgb", NFD: b"notes"}
    )
    build(src, tmp_path / "o.zarr")
    assert sources(tmp_path / "o.zarr") == [f"a/{NFC}.png", f"b/{NFD}.png", "b/x.png", f"{NFC}/y.png"]
