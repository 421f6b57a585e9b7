"""The Source protocol: the folder source implements it, and any source builds through ``dlpack.build``."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import dlpack
from dlpack.errors import InputFileError, OptionError, SourceError
from dlpack.sources import FolderSource, Source, SourceItem, SourceScan

MakeTree = Callable[..., Path]


@dataclass(frozen=True)
class ListSource:
    """A source that lists given items: labels that no folder name gives, in an order of its own."""

    folder: Path
    items: tuple[SourceItem, ...]
    classes: tuple[str, ...]
    errors: tuple[InputFileError, ...] = ()

    @property
    def root(self) -> Path:
        return self.folder

    def scan(self) -> SourceScan:
        return SourceScan(self.items, self.classes, self.errors, labels="list")


def test_folder_source_is_a_source_and_lists_sorted_items(make_tree: MakeTree) -> None:
    src = make_tree({"b/1.png": "rgb", "a/0.png": "rgb", "a/deep/2.jpg": "rgb", "a/notes.txt": b"x"})
    source = FolderSource(src)
    assert isinstance(source, Source)
    assert source.root == src
    scan = source.scan()
    assert scan == SourceScan(
        (SourceItem("a/0.png", "a"), SourceItem("a/deep/2.jpg", "a"), SourceItem("b/1.png", "b")),
        ("a", "b"),
        (),
        "folders",
        ignored=("a/notes.txt",),  # not packed, and listed for the summary
    )


def test_folder_source_refuses_unknown_label_mode(tmp_path: Path) -> None:
    with pytest.raises(OptionError, match="labels must be one of auto, folders, none; got 'dirs'"):
        FolderSource(tmp_path, labels="dirs")


def test_custom_source_builds_with_its_own_order_and_labels(make_tree: MakeTree, tmp_path: Path, backend: str) -> None:
    root = make_tree({"x/1.png": ("rgb", 20, 10), "x/2.png": ("rgb", 20, 10), "y/3.png": ("rgb", 20, 10)})
    items = (
        SourceItem("y/3.png", "zebra", split="train"),
        SourceItem("x/1.png", None, annotations={"boxes": [[1, 2, 3, 4]]}, split="test"),
        SourceItem("x/2.png", "ant", split="train"),
    )
    source = ListSource(root, items, ("zebra", "ant"), (InputFileError("gone.png", "listed but missing"),))
    assert isinstance(source, Source)
    result = dlpack.build(source, tmp_path / backend, on_error="skip", quiet=True, jobs=1)
    with dlpack.open(tmp_path / backend) as ds:
        assert ds.classes == ("zebra", "ant")
        assert [(ds[i]["source"], ds[i]["label"]) for i in range(3)] == [
            ("y/3.png", 0),
            ("x/1.png", -1),
            ("x/2.png", 1),
        ]
        assert ds.manifest.labels == "list"
        assert [e.path for e in ds.manifest.skipped] == ["gone.png"]
        assert [e.path for e in result.skipped] == ["gone.png"]


def test_a_path_still_means_a_folder_source_with_the_options(make_tree: MakeTree, tmp_path: Path) -> None:
    src = make_tree({"a/0.png": "rgb", "b/1.png": "rgb"})
    dlpack.build(src, tmp_path / "path.zarr", labels="none", quiet=True, jobs=1)
    dlpack.build(FolderSource(src, labels="none"), tmp_path / "source.zarr", quiet=True, jobs=1)
    with dlpack.open(tmp_path / "path.zarr") as a, dlpack.open(tmp_path / "source.zarr") as b:
        assert a.classes == b.classes == ()
        assert a.manifest.plan == b.manifest.plan
        assert all(np.array_equal(a[i]["image"], b[i]["image"]) for i in range(2))


@pytest.mark.parametrize(
    ("items", "classes", "message"),
    [
        ((SourceItem("a.png"), SourceItem("a.png")), (), "lists 'a.png' twice"),
        ((SourceItem("../a.png"),), (), "no empty, '.' or '..' parts"),
        ((SourceItem("/abs/a.png"),), (), "relative to the source root"),
        ((SourceItem("a.png", "cat"),), ("dog",), "labels 'a.png' 'cat', which is not one of its classes"),
        ((SourceItem("a.png", "dog"),), ("dog", "dog"), "lists a class name twice"),
        ((), (), "lists no items"),
    ],
)
def test_unusable_listing_is_a_source_error(
    make_tree: MakeTree, tmp_path: Path, items: tuple[SourceItem, ...], classes: tuple[str, ...], message: str
) -> None:
    root = make_tree({"a.png": "rgb"})
    with pytest.raises(SourceError, match=re.escape(message)):
        dlpack.build(ListSource(root, items, classes), tmp_path / "o.zarr", quiet=True, jobs=1)
    assert not (tmp_path / "o.zarr").exists()


def test_unsupported_src_type_is_an_option_error(tmp_path: Path) -> None:
    bad: Any = 42
    with pytest.raises(OptionError, match="src must be a folder path or a dlpack.sources.Source, got int"):
        dlpack.build(bad, tmp_path / "o.zarr", quiet=True, jobs=1)


@pytest.mark.parametrize(
    ("option", "value"), [("labels", "folders"), ("labels", "none"), ("follow_symlinks", True), ("exclude", ("b",))]
)
def test_folder_options_with_a_source_object_are_refused_not_ignored(
    make_tree: MakeTree, tmp_path: Path, option: str, value: Any
) -> None:
    """A Source object lists its own items: a folder option given with it would be silently ignored."""
    root = make_tree({"a/0.png": "rgb"})
    source = ListSource(root, (SourceItem("a/0.png", "x"),), ("x",))
    with (
        pytest.raises(OptionError, match=f"^{option}=")
        if option != "exclude"
        else pytest.raises(OptionError, match="exclude applies to a folder source")
    ):
        dlpack.build(source, tmp_path / "o.zarr", quiet=True, jobs=1, **{option: value})
    assert not (tmp_path / "o.zarr").exists()
    # The defaults are no request: the same source builds with them spelled out.
    dlpack.build(source, tmp_path / "o.zarr", quiet=True, jobs=1, labels="auto", follow_symlinks=False, exclude=())


@pytest.mark.parametrize(("option", "value"), [("labels", "none"), ("follow_symlinks", True)])
def test_a_folder_source_refuses_another_folder_rule_than_its_own(
    make_tree: MakeTree, tmp_path: Path, option: str, value: Any
) -> None:
    root = make_tree({"a/0.png": "rgb"})
    with pytest.raises(OptionError, match=f"the FolderSource has {option}=.* but {option}=.* was given"):
        dlpack.build(FolderSource(root), tmp_path / "o.zarr", quiet=True, jobs=1, **{option: value})
    # The source's own value, given again, is no conflict.
    own = FolderSource(root, **{option: value})
    result = dlpack.build(own, tmp_path / "o.zarr", quiet=True, jobs=1, **{option: value})
    assert result.classes == (() if value == "none" else ("a",))
