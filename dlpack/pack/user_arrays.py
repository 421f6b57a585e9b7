"""``dlpack.add_array``: a per-sample array added to (or replaced in) a complete store, switched in
with its manifest in one step (:class:`~dlpack.storage.transaction.ArrayTransaction`), under the
store's lock. The write side of what ``dlpack.open`` reads."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import schema
from .._files import refuse_url
from ..backends import open_reader
from ..errors import (
    DlpackError,
    OptionError,
    StoreError,
    StoreExistsError,
    StoreLockedError,
    StoreNotFoundError,
)
from ..manifest import RAGGED_SUFFIXES, ArraySpec, Manifest

if TYPE_CHECKING:
    pass

__all__ = ["add_array", "beside_path"]

#: Keys every sample has; a stored array's ``key`` may not take them.
BASE_KEYS = schema.BASE_KEYS
#: Arrays that identify or protect the samples, or that ``--update`` trusts to know a file and
#: where its pixels came from: add_array never writes them.
PROTECTED_ARRAYS = schema.PROTECTED_ARRAYS
#: Arrays add_array may replace whose values index a manifest list: (key, stored dtype, list field).
CODED_ARRAYS = {name: (role.key, role.dtypes[0], role.codes) for name, role in schema.CODED.items()}
#: Names add_array gives the arrays it moves aside while switching one in (HDF5): users' names never start so
#: (the same as :data:`dlpack.storage.transaction.STAGED_PREFIX`).
STAGED_PREFIX = "dlpack_"


def add_array(
    path: str | os.PathLike[str],
    name: str,
    values: np.ndarray | Sequence[np.ndarray],
    *,
    key: str | None = None,
    ragged: bool = False,
    replace: bool = False,
    compression: str = "none",
    lock_timeout: float = 60.0,
) -> ArraySpec:
    """Add a per-sample array to an existing store, whatever its backend.

    Everything is checked before anything is written, and the store changes in one step: a
    failure or a kill leaves it as it was (see docs/format.md, "Adding an array").

    Parameters
    ----------
    path
        A complete dlpack store.
    name
        The array's name (lower case, digits, ``_``).
    values
        ``[N, ...]`` array with one value per sample, or, with ``ragged=True``, a sequence of ``N``
        arrays of ``[rows_i, ...]`` (boxes, polygons, variable-length data), all of one dtype and
        row shape.
    key
        The key under which ``ds[i]`` and loader batches carry it; ``None`` means the name.
    ragged
        Store rows of varying count per sample (``values`` is then a sequence of arrays).
    replace
        Replace an existing array of that name. The arrays of codes (``labels``, ``split``,
        ``defect``, ``box_labels``: :data:`dlpack.schema.CODED`) take only codes of the list they
        index (``classes``, ``splits``, ``defects``), stored with the format's dtype and key; the
        images, sources, checksums and what ``--update`` relies on (``source_stat``,
        ``source_sha256``, ``transform``, ``original_size``, ``orientation``) never.
    compression
        ``"none"``, ``"lz4"`` or ``"zstd"``: the codec of the array's stored blocks.
    lock_timeout
        Seconds to wait while another dlpack process (a build, another ``add_array``) holds the
        store's lock, before raising :class:`~dlpack.errors.StoreLockedError`.

    Returns
    -------
    ArraySpec
        What was stored.
    """
    refuse_url(
        path,
        "the store",
        "add_array writes into a store on a local path; add the array to a local build and upload the store, "
        "or build into a new prefix",
    )
    from ..storage.lock import BuildLock

    out = Path(path)
    if out.is_symlink():  # the store the link names is the one changed (and locked)
        out = out.resolve()
    if not out.exists():
        raise StoreNotFoundError(f"no store at {out} to add array {name!r} to")
    lock = BuildLock(out)
    deadline = time.monotonic() + lock_timeout
    while True:
        try:
            lock.acquire()
            break
        except StoreLockedError as exc:
            if time.monotonic() >= deadline:
                raise StoreLockedError(f"waited {lock_timeout:g} s to add array {name!r}: {exc}") from None
            time.sleep(0.05)
        except OSError as exc:  # e.g. a full disk while the holder's name was written
            lock.release()
            raise StoreError(f"cannot take the lock of {out} to add array {name!r}: {exc}") from exc
    try:
        from ..storage.publish import clear_leftovers

        clear_leftovers(out)  # a killed switch of an earlier add_array is finished or undone first
        reader = open_reader(out, check_labels=False)  # a store with bad labels can be repaired
        try:
            manifest = reader.manifest
        finally:
            reader.close()
        spec, data = _checked_array(out, manifest, name, values, key, ragged, replace, compression)
        existing = manifest.arrays.get(name)
        from ..storage.transaction import ArrayTransaction

        # Zarr: the next generation beside the store, published whole; HDF5: staged, then one switch.
        txn = ArrayTransaction(out, manifest, [existing.name] if existing is not None else [], beside_path(out))
        try:
            try:
                txn.begin()
                txn.write_values(spec, data)
                txn.commit(manifest)
            except BaseException:
                txn.abort()
                raise
        except StoreError as exc:
            if type(exc) is not StoreError or os.fspath(out) in str(exc):
                raise
            # A full disk names the file being written, which lies beside the store: name the store too.
            raise StoreError(f"cannot add array {name!r} to {out}: {exc}; the store was left as it was") from exc
        except DlpackError:
            raise
        except OSError as exc:
            raise StoreError(f"cannot add array {name!r} to {out}: {exc}; the store was left as it was") from exc
        except Exception as exc:  # zarr and h5py raise many types; none may escape as theirs
            raise StoreError(f"cannot add array {name!r} to {out}: {exc!r}; the store was left as it was") from exc
    finally:
        lock.release()
    return spec


def _checked_array(
    out: Path,
    manifest: Manifest,
    name: str,
    values: np.ndarray | Sequence[np.ndarray],
    key: str | None,
    ragged: bool,
    replace: bool,
    compression: str,
) -> tuple[ArraySpec, np.ndarray | list[np.ndarray]]:
    """The spec and values to write, after every check that can be made before writing anything."""
    n = manifest.count
    if not isinstance(name, str):
        raise OptionError(f"array name must be a string, got {name!r}")
    ArraySpec(name, "<i4")  # the name's rules, before any other message
    if name.startswith(STAGED_PREFIX):
        raise OptionError(f"array names starting with {STAGED_PREFIX!r} are dlpack's own")
    if name.endswith(RAGGED_SUFFIXES):
        raise OptionError(f"array name {name!r} ends in {' or '.join(RAGGED_SUFFIXES)}, which ragged arrays use")
    if name in PROTECTED_ARRAYS:
        raise OptionError(
            f"array {name!r} identifies or protects the samples (or --update relies on it): it cannot be replaced "
            "or written by add_array"
        )
    variant = schema.variant_of(name)
    if variant is not None:
        raise OptionError(
            f"array name {name!r} is the {variant[0]} array of augmentation variant {variant[1]}: variant arrays are "
            "written only by dlpack augment (dlpack.augment), with their checksums and records; choose another name"
        )
    existing = manifest.arrays.get(name)
    if existing is not None and not replace:
        raise StoreExistsError(f"store {out} already has an array {name!r}; pass replace=True to replace it")
    if key is not None and (not isinstance(key, str) or not key):
        raise OptionError(f"key must be a non-empty string or None (the array's name), got {key!r}")
    if name in CODED_ARRAYS:
        return _coded_array(out, manifest, name, values, key, ragged, compression)
    key = name if key is None else key
    taken = {spec.key for spec in manifest.arrays.values() if spec.key and spec.name != name}
    if key in BASE_KEYS or key in taken:
        raise OptionError(f"key {key!r} is already used by every sample or by another array; choose another key")
    data: np.ndarray | list[np.ndarray]
    if ragged:
        if isinstance(values, np.ndarray) and values.dtype != object and values.ndim < 2:
            raise OptionError(f"ragged {name!r} needs one array of rows per sample, got a {values.ndim}-D array")
        data = [np.asarray(v) for v in values]
        if len(data) != n:
            raise OptionError(f"{name!r} has {len(data)} samples, the store has {n}")
        ref = next((i for i, p in enumerate(data) if p.size), 0)
        first = data[ref] if data else np.empty((0,), np.float32)
        for i, part in enumerate(data):
            if part.dtype.hasobject or part.ndim == 0:
                raise OptionError(
                    f"ragged {name!r}: sample {i} is not an array of rows ({part.dtype}, shape {part.shape})"
                )
            if part.shape[1:] != first.shape[1:] or (part.size and part.dtype != first.dtype):
                raise OptionError(
                    f"ragged {name!r}: sample {i} has rows of shape {part.shape[1:]} {part.dtype}, sample {ref} "
                    f"{first.shape[1:]} {first.dtype}; every sample's rows must have one shape and dtype "
                    "(convert them first: dlpack does not cast)"
                )
        spec = ArraySpec(name, first.dtype.str, tuple(first.shape[1:]), True, key, compression)
    else:
        try:
            data = np.asarray(values)
        except ValueError:  # NumPy refuses samples of different shapes
            data = np.empty(0, dtype=object)
        if data.dtype.hasobject:
            raise OptionError(f"{name!r} is not one numeric array (samples of different shapes? pass ragged=True)")
        if data.ndim == 0 or len(data) != n:
            raise OptionError(f"{name!r} has {0 if data.ndim == 0 else len(data)} samples, the store has {n}")
        spec = ArraySpec(name, data.dtype.str, tuple(data.shape[1:]), False, key, compression)
    for other in manifest.arrays.values():
        clash = set(spec.stored_names()) & set(other.stored_names())
        if other.name != name and clash:
            raise OptionError(f"array {name!r} would overwrite {sorted(clash)} of array {other.name!r}")
    return spec, data


def _coded_array(
    out: Path, manifest: Manifest, name: str, values: Any, key: str | None, ragged: bool, compression: str
) -> tuple[ArraySpec, np.ndarray | list[np.ndarray]]:
    """An array of codes into a manifest list (``labels``, ``split``, ``defect``: one per sample;
    ``box_labels``: one per box), stored with the dtype, layout and key the format gives it."""
    role = schema.CODED[name]
    assert role.key is not None and role.codes is not None
    own_key, dtype, field = role.key, role.dtypes[0], role.codes
    names: tuple[str, ...] = getattr(manifest, field)
    shape = "rows of codes per sample" if role.ragged else "fixed, one code per sample"
    if ragged != role.ragged or key not in (None, own_key):
        raise OptionError(
            f"array {name!r} is {shape}, under the key {own_key!r}"
            + ("; pass ragged=True" if role.ragged and not ragged else "")
        )
    taken = [s.name for s in manifest.arrays.values() if s.key == own_key and s.name != name]
    if taken:
        raise OptionError(f"key {own_key!r} of {name!r} is taken by array {taken[0]!r}; drop or rename that one first")
    n = manifest.count
    parts: list[np.ndarray]
    if role.ragged:
        parts = [np.asarray(v) for v in values]
        if len(parts) != n:
            raise OptionError(f"{name!r} has {len(parts)} samples, the store has {n}")
        for i, p in enumerate(parts):
            if p.ndim != 1 or (p.size and p.dtype.kind not in "iu"):
                raise OptionError(
                    f"{name!r}: sample {i} must be a 1-D array of integer codes, got {p.dtype} of shape {list(p.shape)}"
                )
    else:
        data = np.asarray(values)
        if data.shape != (n,) or data.dtype.kind not in "iu":
            raise OptionError(
                f"{name!r} must be {n} integer codes (one per sample), got {data.dtype} of shape {list(data.shape)}"
            )
        parts = [data]
    for i, p in enumerate(parts):
        bad = np.flatnonzero((p < role.lowest) | (p >= len(names)))
        if len(bad):
            at = f"sample {i} holds {int(p[bad[0]])}" if role.ragged else f"sample {int(bad[0])} holds {int(p[bad[0]])}"
            raise OptionError(
                f"{name!r} of {out} must be codes {role.lowest}..{len(names) - 1} for the store's {len(names)} "
                f"{field} ({', '.join(names) or 'none'}); {at}" + ("" if role.ragged else f" ({len(bad)} such samples)")
            )
    spec = ArraySpec(name, dtype, (), role.ragged, own_key, compression)
    if role.ragged:
        return spec, [p.astype(dtype).reshape(-1) for p in parts]
    return spec, parts[0].astype(dtype)


def beside_path(out: str | os.PathLike[str]) -> Path:
    """Where ``add_array`` writes the next generation of a Zarr store: ``.NAME.dlpack-add`` next to it."""
    p = Path(out)
    return p.parent / f".{p.name}.dlpack-add"
