"""The shared backend conformance suite (dlpack.testing.BackendTests) against the object-store Zarr
store: every store of the suite lives under a prefix of a bucket on the loopback server, written by
the object-store writer and read by the object-store reader, through the same registry calls."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import _s3
import pytest

from dlpack.storage.location import Location
from dlpack.storage.objects import ObjectStorage
from dlpack.testing import BackendTests


class _Folder:
    """What the suite does with a store path's parent (``mkdir``): nothing to make in a bucket."""

    def mkdir(self, parents: bool = False, exist_ok: bool = False) -> None:
        """A prefix needs no folder."""


class RemotePath(str):
    """A store's URL, with the little of ``Path`` the suite uses on a store path: its parent (made
    by ``mkdir``: nothing to do), a foreign object written at the store's own key, and removal of the
    store (``is_dir`` false, so the suite calls :meth:`unlink`)."""

    @property
    def parent(self) -> _Folder:
        return _Folder()

    def _storage(self) -> ObjectStorage:
        return ObjectStorage(Location.parse(str(self)))

    def write_bytes(self, data: bytes) -> int:
        self._storage().put("", data)
        return len(data)

    def read_bytes(self) -> bytes:
        return self._storage().get("")

    def is_dir(self) -> bool:
        """Not a folder: the suite then removes the store with :meth:`unlink`."""
        return False

    def unlink(self) -> None:
        """Delete every object of the store (the suite rewrites it under readers that pinned it)."""
        storage = self._storage()
        storage.delete([o.key for o in storage.list()])


class TestObjectZarr(BackendTests):
    backend = "zarr"
    compressions = ("lz4", "zstd")

    @pytest.fixture(autouse=True)
    def _bucket(self, s3: Any) -> None:
        self.s3 = s3

    def store_path(self, tmp_path: Path, name: str = "store") -> Path:
        """A prefix of the test's bucket named after ``tmp_path`` (so the suite's sub-folders stay apart)."""
        key = f"{tmp_path.name}-{uuid.uuid5(uuid.NAMESPACE_URL, str(tmp_path)).hex[:8]}/{name}.zarr"
        return RemotePath(self.s3.url(key))  # type: ignore[return-value]


@pytest.fixture(autouse=True)
def _needs_s3() -> None:
    _s3.skip_without_s3()
