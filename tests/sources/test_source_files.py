"""A source's files are read through its SourceFiles: the build never opens ``root / rel`` itself."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import dlpack
from dlpack.sources import FolderSource
from dlpack.sources.base import FileStat, LocalFiles, SourceFiles, SourceScan, files_of

MakeTree = Callable[..., Path]


@dataclass(frozen=True)
class MemoryFiles:
    """Files held in memory by relative path, each with its version."""

    root: str
    data: dict[str, tuple[bytes, int]] = field(default_factory=dict)

    def _get(self, rel: str) -> tuple[bytes, int]:
        if rel not in self.data:
            raise FileNotFoundError(2, "No such file or directory", rel)
        return self.data[rel]

    def read(self, rel: str) -> tuple[bytes, FileStat]:
        data, version = self._get(rel)
        return data, FileStat(len(data), version)

    def read_head(self, rel: str, n: int) -> tuple[bytes, int]:
        data, _ = self._get(rel)
        return data[:n], len(data)

    def read_tail(self, rel: str, n: int) -> bytes:
        data, _ = self._get(rel)
        return data[max(0, len(data) - n) :]

    def stat(self, rel: str) -> FileStat:
        data, version = self._get(rel)
        return FileStat(len(data), version)


@dataclass(frozen=True)
class MemorySource:
    """The items of a folder scan, whose files are served from memory; its root no longer exists."""

    folder: Path
    listing: SourceScan
    files: MemoryFiles

    @property
    def root(self) -> Path:
        return self.folder

    def scan(self) -> SourceScan:
        return self.listing


def _memory_copy(src: Path, gone: Path) -> MemorySource:
    listing = FolderSource(src).scan()
    # Each file's version is its mtime, as a folder's: the store records it (source_stat).
    data = {it.rel: ((src / it.rel).read_bytes(), (src / it.rel).stat().st_mtime_ns) for it in listing.items}
    return MemorySource(gone, listing, MemoryFiles(str(gone), data))


def test_a_source_with_its_own_files_builds_the_folders_store(
    make_tree: MakeTree, tmp_path: Path, snapshot: Callable[[Path], dict[str, bytes]]
) -> None:
    spec = {f"{c}/{k}.{ext}": ("rgb", 64, 48) for c in ("a", "b") for k in range(3) for ext in ("png", "jpg")}
    src = make_tree(spec)
    dlpack.build(src, tmp_path / "folder.zarr", quiet=True, jobs=1, shard_bytes=2**16)
    source = _memory_copy(src, tmp_path / "gone")
    assert isinstance(source.files, SourceFiles) and files_of(source) is source.files
    assert not source.root.exists()  # nothing can be read at root / rel
    dlpack.build(source, tmp_path / "memory.zarr", quiet=True, jobs=1, shard_bytes=2**16)
    assert snapshot(tmp_path / "memory.zarr") == snapshot(tmp_path / "folder.zarr")


def test_update_compares_and_rereads_through_the_sources_files(make_tree: MakeTree, tmp_path: Path) -> None:
    src = make_tree({"a/0.png": "rgb", "a/1.png": "rgb", "b/2.png": "rgb"})
    source = _memory_copy(src, tmp_path / "gone")
    out = tmp_path / "o.zarr"
    dlpack.build(source, out, quiet=True, jobs=1)
    assert dlpack.build(source, out, update=True, quiet=True, jobs=1).update == "up to date: nothing to do"
    # Same bytes under a new version: unchanged; new bytes: replaced.
    other = (src / "b/2.png").read_bytes()
    source.files.data["a/0.png"] = (source.files.data["a/0.png"][0], 2)
    source.files.data["a/1.png"] = (other, 3)
    result = dlpack.build(source, out, update=True, quiet=True, jobs=1)
    assert result.update.startswith("updated: 0 added, 1 replaced, 0 removed; ")
    with dlpack.open(out) as ds:
        assert (ds[1]["image"] == ds[2]["image"]).all()


def test_local_files_keep_the_input_file_rules(tmp_path: Path) -> None:
    (tmp_path / "a.png").write_bytes(b"0123456789")
    files = pickle.loads(pickle.dumps(LocalFiles(str(tmp_path))))  # what a worker gets: the root, no handle
    data, st = files.read("a.png")
    assert (data, st.size) == (b"0123456789", 10) and files.stat("a.png") == st
    assert files.read_head("a.png", 4) == (b"0123", 10)
    assert files.read_tail("a.png", 3) == b"789"
    (tmp_path / "dir.png").mkdir()
    with pytest.raises(OSError, match="not a regular file \\(a folder\\); only regular files are packed"):
        files.read("dir.png")
