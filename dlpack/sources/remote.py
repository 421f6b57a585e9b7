"""Sources in a bucket: the files of an object-store prefix (:class:`ObjectFiles`), read as a build reads a folder.

A build of ``s3://bucket/raw/`` reads each image with one GET (:meth:`ObjectFiles.read`), probes its
header with two ranged GETs (:meth:`ObjectFiles.read_head`, :meth:`ObjectFiles.read_tail`) and never
asks for an object's size or version separately: they come with the listing and with each GET.

An object's version is an integer made from its ETag (:func:`version_of`), recorded per sample as
a local file's modification time is: the same bytes uploaded again keep their ETag, and so their
version, on every S3-compatible server that makes ETags from content (AWS S3 for single-part
uploads, MinIO, moto).
"""

from __future__ import annotations

import errno
import hashlib
from dataclasses import dataclass, field

from ..errors import StoreError, StoreNotFoundError
from ..storage.location import Location
from ..storage.objects import ObjectInfo, ObjectStorage, StorageAccessError
from .base import FileStat

__all__ = ["AHEAD", "ObjectFiles", "version_of"]

#: Files a block's decode loop fetches ahead of the one it decodes (:func:`~dlpack.sources.base.reading_ahead`).
AHEAD = 8


#: What a request for one object raises (a missing object is a StoreNotFoundError, not a StoreError).
_FAILED = (StoreError, StoreNotFoundError)


def version_of(etag: str) -> int:
    """The version of an object with ETag ``etag``: the first 63 bits of the SHA-256 of the ETag
    without its quotes, so that it fits the store's signed 64-bit ``stat`` column and is the same
    integer in every process and on every run."""
    digest = hashlib.sha256(etag.strip('"').encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def _stat(info: ObjectInfo) -> FileStat:
    return FileStat(info.size, version_of(info.etag))


def _oserror(exc: StoreError | StoreNotFoundError) -> OSError:
    """A failed request for one object as the ``OSError`` a build names the file with.

    A missing object (deleted since the listing) reads as a missing local file does; refused
    credentials and an unreachable endpoint are not the file's fault and stay a
    :class:`~dlpack.storage.objects.StorageAccessError` (the build stops on them).
    """
    if isinstance(exc, StorageAccessError):
        return exc
    if isinstance(exc, StoreNotFoundError):
        return OSError(errno.ENOENT, "No such file or directory (the object is gone from the bucket)")
    return OSError(errno.EIO, str(exc))


@dataclass(frozen=True)
class ObjectFiles:
    """The files of an object-store prefix, as a :class:`~dlpack.sources.base.SourceFiles`.

    Picklable: the location (with its storage options) and ``ahead`` travel to workers, never a
    client (each process makes its own). ``ahead`` is how many files a block's decode loop fetches
    ahead of the one it decodes (0: none, one GET at a time). ``storage.requests`` counts this
    process's requests by kind.
    """

    location: Location
    ahead: int = AHEAD
    storage: ObjectStorage = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.ahead < 0:
            raise ValueError(f"ahead must be 0 or more, got {self.ahead}")
        object.__setattr__(self, "storage", ObjectStorage(self.location))

    @property
    def root(self) -> str:
        """The prefix's URL (label files are named relative to it)."""
        return self.location.url

    def read(self, rel: str) -> tuple[bytes, FileStat]:
        """The whole object and its size and version, from one GET."""
        try:
            data, info = self.storage.fetch(rel)
        except _FAILED as exc:
            raise _oserror(exc) from None
        return data, _stat(info)

    def _empty(self, rel: str, exc: StoreError | StoreNotFoundError) -> bool:
        """Whether a ranged GET failed because the object is empty (a range of 0 bytes cannot be satisfied)."""
        if isinstance(exc, (StorageAccessError, StoreNotFoundError)):
            return False
        try:
            info = self.storage.head(rel)
        except _FAILED:
            return False
        return info is not None and info.size == 0

    def read_head(self, rel: str, n: int) -> tuple[bytes, int]:
        """The first ``n`` bytes and the object's size, from one ranged GET."""
        try:
            data, info = self.storage.fetch(rel, 0, n)
        except _FAILED as exc:
            if self._empty(rel, exc):
                return b"", 0
            raise _oserror(exc) from None
        return data, info.size

    def read_tail(self, rel: str, n: int) -> bytes:
        """The last ``n`` bytes, from one ranged GET (a suffix range)."""
        try:
            return self.storage.fetch(rel, -n)[0]
        except _FAILED as exc:
            if self._empty(rel, exc):
                return b""
            raise _oserror(exc) from None

    def stat(self, rel: str) -> FileStat:
        """The object's size and version, from one HEAD."""
        try:
            info = self.storage.head(rel)
        except _FAILED as exc:
            raise _oserror(exc) from None
        if info is None:
            raise OSError(errno.ENOENT, "No such file or directory (the object is gone from the bucket)")
        return _stat(info)
