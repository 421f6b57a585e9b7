"""Store backends behind one interface, and the small registry that picks one.

The registry is the one place that knows the formats: their names, their path suffixes, and
their capability flags (``supports_write``, ``supports_random_access``), checked here and only here.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from .._files import file_kind
from ..errors import OptionError, StoreError, StoreNotFoundError
from ._hdf5 import Hdf5Backend
from ._zarr import ZarrBackend
from .base import DEFAULT_SHARD_BYTES, ArraySpec, Backend, Mode, is_remote, remote_opener
from .reader import StoreReader
from .writer import StoreWriter

__all__ = [
    "ArraySpec",
    "Backend",
    "Mode",
    "StoreReader",
    "StoreWriter",
    "ZarrBackend",
    "Hdf5Backend",
    "register_backend",
    "get_backend",
    "detect_backend",
    "backend_for_path",
    "format_names",
    "open_reader",
    "open_writer",
    "owned_store",
    "remove_store",
    "foreign_reason",
    "BACKENDS",
    "DEFAULT_FORMAT",
]

BACKENDS: dict[str, type[Backend]] = {}
#: The format of a new store whose path has no registered suffix.
DEFAULT_FORMAT = "zarr"


def register_backend(backend: type[Backend]) -> None:
    """Add a backend under its ``name`` (later registrations replace earlier ones)."""
    BACKENDS[backend.name] = backend


register_backend(ZarrBackend)
register_backend(Hdf5Backend)


def format_names() -> tuple[str, ...]:
    """The registered format names, sorted."""
    return tuple(sorted(BACKENDS))


def get_backend(name: str, *, write: bool = False, random_access: bool = False) -> type[Backend]:
    """The backend called ``name``, checked for the capabilities the caller needs."""
    try:
        backend = BACKENDS[name]
    except KeyError:
        raise OptionError(f"unknown store format {name!r}; choose one of {', '.join(format_names())}") from None
    if write and not backend.supports_write:
        raise OptionError(f"the {name} backend cannot write stores")
    if random_access and not backend.supports_random_access:
        raise OptionError(f"the {name} backend does not support random access")
    return backend


def backend_for_path(path: str | os.PathLike[str], format: str | None = None, *, write: bool = False) -> type[Backend]:
    """The backend for a new store at ``path``: ``format`` if given, else the one owning its suffix."""
    if format is not None:
        return get_backend(format, write=write)
    suffix = os.path.splitext(os.fspath(path).rstrip("/\\"))[1].lower()
    for backend in BACKENDS.values():
        if suffix in backend.suffixes:
            return get_backend(backend.name, write=write)
    return get_backend(DEFAULT_FORMAT, write=write)


def detect_backend(path: str | os.PathLike[str]) -> type[Backend]:
    """The backend whose store is at ``path`` (a store in an object store is a Zarr store)."""
    if is_remote(path):
        return ZarrBackend
    p = Path(path)
    if not p.exists():
        raise StoreNotFoundError(f"no store at {os.fspath(path)!r}")
    for backend in BACKENDS.values():
        if backend.detect(p):
            return backend
    mode = p.stat().st_mode
    if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
        raise StoreError(f"{os.fspath(path)!r} is {file_kind(mode)}, not a dlpack store (a folder or a regular file)")
    kinds = ", ".join(f"{b.name} ({'/'.join(b.suffixes) or 'any name'})" for b in BACKENDS.values())
    raise StoreError(f"{os.fspath(path)!r} is not a dlpack store (none of: {kinds})")


def owned_store(path: str | os.PathLike[str]) -> type[Backend] | None:
    """The backend whose dlpack marker ``path`` carries (a complete or partial dlpack store), else None."""
    if is_remote(path):
        return ZarrBackend if remote_opener("owned", path)(path) else None
    p = Path(path)
    for backend in BACKENDS.values():
        if backend.is_own(p):
            return backend
    return None


def open_reader(path: str | os.PathLike[str], mode: Mode = "r", *, check_labels: bool = True) -> StoreReader:
    """A reader for the store at ``path``, whatever its backend.

    ``check_labels=False`` reads a store whose labels fall outside its classes (a damaged or
    mislabelled store) instead of refusing it, so that it can be repaired.
    """
    backend = get_backend(detect_backend(path).name, random_access=True)
    reader = backend.open_reader(path if is_remote(path) else Path(path), mode)  # type: ignore[arg-type]
    reader.check_labels = check_labels
    return reader


def open_writer(
    path: str | os.PathLike[str],
    mode: Mode = "r+",
    *,
    format: str | None = None,
    shard_bytes: int = DEFAULT_SHARD_BYTES,
) -> StoreWriter:
    """An opened writer for the store at ``path``, whatever its backend.

    ``r+`` and ``a`` open an existing dlpack store to add or replace arrays (``a`` creates it when
    missing); ``w-`` creates a new one. The backend of an existing store is detected; a new one
    takes ``format`` or the one owning the path's suffix.
    """
    if is_remote(path):
        remote = ZarrBackend.open_writer(path, mode, shard_bytes)  # type: ignore[arg-type]
        remote.open()
        return remote
    p = Path(path)
    if mode != "w-" and (p.exists() or p.is_symlink()):
        backend = get_backend(detect_backend(p).name, write=True)
    else:
        backend = backend_for_path(p, format, write=True)
    writer = backend.open_writer(p, mode, shard_bytes)
    writer.open()
    return writer


def remove_store(path: str | os.PathLike[str]) -> None:
    """Remove the store or partial store at ``path`` (or whatever is there) the way its backend
    removes its stores, so that a removal cut short leaves what readers call incomplete."""
    p = Path(path)
    backend = next((b for b in BACKENDS.values() if not p.is_symlink() and b.detect(p)), Backend)
    backend.remove(p)


def foreign_reason(path: str | os.PathLike[str]) -> str | None:
    """Why ``path`` (a folder, or a regular file with one name, without dlpack's marker) cannot be
    proven to be a store that a killed build left half-created; None when some backend recognises it."""
    p = Path(path)
    reasons = [b.foreign_reason(p) for b in BACKENDS.values()]
    if None in reasons:
        return None
    plain = Backend.foreign_reason(p)
    return next((r for r in reasons if r != plain), plain)
