"""Store backends behind one interface, and the small registry that picks one.

Capability flags (``supports_write``, ``supports_random_access``) are checked here and only here.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import OptionError, StoreError, StoreNotFoundError
from ._hdf5 import Hdf5Backend
from ._zarr import ZarrBackend
from .base import Backend, StorePlan, StoreReader, StoreWriter

__all__ = [
    "Backend",
    "StorePlan",
    "StoreReader",
    "StoreWriter",
    "ZarrBackend",
    "Hdf5Backend",
    "register_backend",
    "get_backend",
    "detect_backend",
    "BACKENDS",
]

BACKENDS: dict[str, type[Backend]] = {}


def register_backend(backend: type[Backend]) -> None:
    """Add a backend under its ``name`` (later registrations replace earlier ones)."""
    BACKENDS[backend.name] = backend


register_backend(ZarrBackend)
register_backend(Hdf5Backend)


def get_backend(name: str, *, write: bool = False, random_access: bool = False) -> type[Backend]:
    """The backend called ``name``, checked for the capabilities the caller needs."""
    try:
        backend = BACKENDS[name]
    except KeyError:
        raise OptionError(f"unknown store format {name!r}; choose one of {', '.join(sorted(BACKENDS))}") from None
    if write and not backend.supports_write:
        raise OptionError(f"the {name} backend cannot write stores")
    if random_access and not backend.supports_random_access:
        raise OptionError(f"the {name} backend does not support random access")
    return backend


def detect_backend(path: str | os.PathLike[str]) -> type[Backend]:
    """The backend whose store is at ``path``."""
    p = Path(path)
    if not p.exists():
        raise StoreNotFoundError(f"no store at {os.fspath(path)!r}")
    for backend in BACKENDS.values():
        if backend.detect(p):
            return backend
    raise StoreError(f"{os.fspath(path)!r} is not a dlpack store (not a Zarr group or HDF5 file)")
