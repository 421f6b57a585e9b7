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
import os
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..errors import OptionError, SourceNotFoundError, StoreError, StoreNotFoundError
from ..storage.location import Location
from ..storage.objects import ObjectInfo, ObjectStorage, StorageAccessError
from .base import FileStat, SourceScan
from .folder import CLASS_FOLDERS, listing_walk, walked

__all__ = ["AHEAD", "BucketFolderSource", "ObjectFiles", "version_of"]

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

    A missing object (deleted since the listing) reads as a missing local file does (the same
    reason, recorded the same in the manifest's ``skipped``); refused
    credentials and an unreachable endpoint are not the file's fault and stay a
    :class:`~dlpack.storage.objects.StorageAccessError` (the build stops on them).
    """
    if isinstance(exc, StorageAccessError):
        return exc
    if isinstance(exc, StoreNotFoundError):
        return OSError(errno.ENOENT, os.strerror(errno.ENOENT))
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
            raise OSError(errno.ENOENT, os.strerror(errno.ENOENT))
        return _stat(info)


#: The labels a bucket prefix is read with: a folder's own (class folders, or none).
_LABELS = ("auto", "folders", "none")


@dataclass(frozen=True)
class BucketFolderSource:
    """The images under an object-store prefix, by the rules of a
    :class:`~dlpack.sources.folder.FolderSource`: the listing's keys are the paths (``/`` separators),
    their ``/``-separated parts the folders. Class and split folders, hidden names, ``exclude``
    patterns, refused label folders and image suffixes are the folder source's own functions,
    applied to the listed keys; a bucket has no links and no irregular files.

    The listing is one paginated LIST of the prefix (1,000 keys a request); sizes and versions come
    with it, so the scan sends no request per object.
    """

    location: Location
    labels: str = "auto"
    exclude: tuple[str, ...] = ()
    class_folder: str = "top"
    check_labels: bool = True
    #: files the decode loop fetches ahead (:attr:`ObjectFiles.ahead`)
    ahead: int = AHEAD
    #: a bucket has no symbolic links; kept for the folder options a build records
    follow_symlinks: bool = False

    def __post_init__(self) -> None:
        if self.location.is_local:
            raise ValueError(f"{self.location} is a local path; a folder is read by FolderSource")
        if self.labels not in _LABELS:
            raise OptionError(f"labels must be one of {', '.join(_LABELS)}; got {self.labels!r}")
        if self.class_folder not in CLASS_FOLDERS:
            raise OptionError(f"class_folder must be one of {', '.join(CLASS_FOLDERS)}; got {self.class_folder!r}")
        exclude: Sequence[str] = self.exclude
        if isinstance(exclude, str) or not all(isinstance(p, str) and p for p in exclude):
            raise OptionError(f"exclude must be a list of non-empty glob patterns, got {exclude!r}")
        object.__setattr__(self, "exclude", tuple(exclude))

    @property
    def root(self) -> str:
        """The prefix's URL: item paths are relative to it, and messages name it."""
        return self.location.url

    @property
    def files(self) -> ObjectFiles:
        """How the build reads the images: one GET each, ``ahead`` fetched ahead by the decode loop."""
        return ObjectFiles(self.location, self.ahead)

    def scan(self) -> SourceScan:
        """List the prefix and apply the folder rules to its keys.

        Raises
        ------
        SourceNotFoundError
            The prefix holds no object (a missing bucket is the storage's error, naming it).
        SourceError
            As for a folder: no images, label folders, images both in and outside class folders.
        """
        walk = listing_walk(self.exclude, self.check_labels)
        storage = ObjectStorage(self.location)
        n = 0
        try:
            for info in storage.list():
                n += 1
                walk.key(info.key)
        except StoreNotFoundError as exc:
            raise SourceNotFoundError(f"source {self.root!r}: {exc}") from None
        if not n:
            raise SourceNotFoundError(f"source {self.root!r} holds no objects: check the bucket and prefix")
        return walked(walk, self.root, self.labels, self.class_folder)
