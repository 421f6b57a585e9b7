"""Zarr v3 backend: a group folder of sharded arrays and ``manifest.json`` (docs/format.md).

Every array is sharded along its first axis only. Uncompressed shards are written and read
directly in the ``sharding_indexed`` format (:mod:`._shard`); zarr-python writes compressed ones
and creates the metadata, so the store stays standard for zarr-python and tensorstore.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import stat
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .. import schema
from .._files import NotRegularFileError, file_kind, irregular_entries, open_regular, read_regular, writing
from .._maps import Arena
from ..errors import IncompleteStoreError, StoreError, StoreExistsError, StoreNotFoundError
from ..manifest import ArraySpec, Manifest, sha256_hex
from ._shard import ShardedArray, crc32c
from .base import (
    DEFAULT_SHARD_BYTES,
    DIGEST_ATTR,
    ArrayAccess,
    ArrayChange,
    Backend,
    Mode,
    changed_error,
    check_mode,
    is_remote,
    remote_opener,
)
from .reader import StoreReader
from .writer import StoreWriter

__all__ = ["ZarrBackend", "ZarrReader", "ZarrWriter", "array_digest_attr", "is_sharded", "manifest_of"]

MANIFEST = "manifest.json"
_MISSING = 2**64 - 1
#: Directory handles pin what a reader opened (POSIX); elsewhere files are opened by path.
_DIR_FD = os.open in os.supports_dir_fd and hasattr(os, "O_DIRECTORY")
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
#: zarr.json and manifest.json larger than this are refused before they are read.
_MAX_JSON = 256 * 2**20


#: What :meth:`ZarrWriter._write_raw_shard` names a shard file while writing it: ``.NAME.PID.tmp``.
_SHARD_TEMP = re.compile(r"\.[0-9]+\.[0-9]+\.tmp")
#: What :func:`_atomic_write` names a metadata file while writing it.
_META_TEMPS = ("zarr.json.tmp", MANIFEST + ".tmp")
#: What zarr-python's local store names a file while writing it: ``zarr.<uuid4 hex>.partial``.
_ZARR_PYTHON_TEMP = re.compile(r"[^/]*\.[0-9a-f]{32}\.partial")


def is_shard_temp_name(name: str) -> bool:
    """Whether ``name`` is a shard file being written (``.0.PID.tmp``, see ``_write_raw_shard``):
    what a write killed before its rename leaves beside the shard; no other file is named so."""
    return _SHARD_TEMP.fullmatch(name) is not None


def _compressors(name: str, itemsize: int) -> Any:
    import zarr.codecs as zc

    if name == "none":
        return None
    if name == "lz4":
        # Bitshuffle is what makes LZ4 compress image bytes at all (plain LZ4: 0.94-0.98x).
        return zc.BloscCodec(cname="lz4", clevel=5, shuffle=zc.BloscShuffle.bitshuffle, typesize=itemsize)
    if name == "zstd":
        return zc.ZstdCodec(level=3)
    raise ValueError(f"unknown compression {name!r}")


def array_create_args(spec: ArraySpec, rows: int, chunk: int, shard_rows: int) -> dict[str, Any]:
    """zarr-python's ``create_array`` arguments for a stored array of ``rows`` rows: sharded along
    the first axis only, its digest "" (being written: no committed manifest lists it yet)."""
    dtype = np.dtype(spec.dtype)
    return {
        "shape": (rows, *spec.shape),
        "dtype": dtype,
        "chunks": (chunk, *spec.shape),
        "shards": (shard_rows, *spec.shape),
        "compressors": _compressors(spec.compression, dtype.itemsize),
        "fill_value": 0,
        "config": {"write_empty_chunks": True},
        "attributes": {DIGEST_ATTR: ""},
    }


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with writing(path):
        tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _read_text(name: str, dir_fd: int | None, folder: Path) -> str:
    """File ``name`` of ``folder`` (opened through ``dir_fd`` when given) as UTF-8, size-bounded.

    Only a regular file is read (a named pipe would block forever), never through a symbolic link:
    dlpack's stores hold none.
    """
    if dir_fd is not None:
        fd = open_regular(name, dir_fd=dir_fd, follow_symlinks=False)
    else:
        fd = open_regular(folder / name, follow_symlinks=False)
    try:
        size = os.fstat(fd).st_size
        if size > _MAX_JSON:
            raise StoreError(f"{folder / name} is {size} bytes, too large for dlpack metadata")
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read().decode("utf-8")
    finally:
        os.close(fd)


def _json(text: str | bytes, where: object) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise StoreError(f"{where} is not valid JSON: {exc}") from exc


#: Seconds :func:`_settle_io` waits for zarr's unfinished IO: far longer than a metadata write takes.
_SETTLE_WAIT = 60.0


def _settle_io() -> None:
    """Let the IO of zarr calls cut short by Ctrl-C finish before their store is removed.

    zarr runs every read and write as a task in its own event-loop thread; the call that waits for
    it raises KeyboardInterrupt at once while the task goes on. An interrupted build that then
    removes its partial store would otherwise have that task write into the folder after the
    removal (an array's zarr.json in a folder without dlpack's marker, which the next build
    refuses). Runs a task in that loop that waits for every other one.
    """
    module = sys.modules.get("zarr.core.sync")
    loop = getattr(module, "loop", [None])[0] if module is not None else None
    if loop is None or loop.is_closed() or not loop.is_running():
        return
    import asyncio

    async def others_done() -> None:
        pending = asyncio.all_tasks() - {asyncio.current_task()}
        if pending:
            await asyncio.wait(pending, timeout=_SETTLE_WAIT)

    with contextlib.suppress(Exception):  # zarr's loop gone or changed: nothing of it to wait for
        asyncio.run_coroutine_threadsafe(others_done(), loop).result(_SETTLE_WAIT + 1)


def _marker(group_meta: Any) -> dict[str, Any] | None:
    """The dlpack marker in a group's zarr.json, or None."""
    attrs = group_meta.get("attributes") if isinstance(group_meta, dict) else None
    marker = attrs.get("dlpack") if isinstance(attrs, dict) else None
    return marker if isinstance(marker, dict) and marker.get("format") == "dlpack" else None


@dataclass
class _Layout:
    """What a process needs to write one stored array without asking zarr-python."""

    rows: int
    trailing: tuple[int, ...]
    dtype: str
    chunk: int
    shard_rows: int
    compression: str

    @property
    def row_nbytes(self) -> int:
        return int(np.prod(self.trailing, dtype=np.int64)) * np.dtype(self.dtype).itemsize


def raw_shard_parts(lay: _Layout, rows: np.ndarray) -> list[Any]:
    """The bytes of an uncompressed shard of ``rows`` in the sharding format, in order: the inner
    chunks (the last padded to a whole chunk with the fill value), then the index of (offset,
    nbytes) pairs and its CRC-32C. zarr-python's codec pipeline spent a fifth of a build's time on
    the same bytes. A local shard is these parts in one file, a remote one in one object."""
    data = np.ascontiguousarray(rows, dtype=np.dtype(lay.dtype).newbyteorder("<"))
    n_chunks = -(-len(rows) // lay.chunk)
    pad = n_chunks * lay.chunk - len(rows)
    nb = lay.chunk * lay.row_nbytes
    index = np.full((lay.shard_rows // lay.chunk, 2), _MISSING, dtype="<u8")  # chunks past the end stay missing
    index[:n_chunks, 0] = np.arange(n_chunks, dtype="<u8") * np.uint64(nb)
    index[:n_chunks, 1] = nb
    table = index.tobytes()
    parts: list[Any] = [data.data.cast("B") if data.size else b""]
    if pad:
        parts.append(bytes(pad * lay.row_nbytes))
    parts += [table, crc32c(table).to_bytes(4, "little")]
    return parts


def complete_group_meta(manifest_text: str, format_version: int) -> str:
    """The group metadata of a complete store: dlpack's marker naming its manifest's SHA-256."""
    marker = {
        "format": "dlpack",
        "format_version": format_version,
        "complete": True,
        "manifest_sha256": sha256_hex(manifest_text),
    }
    return json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {"dlpack": marker}}, indent=2)


def _new_group_meta() -> str:
    """The group metadata of a store being written: dlpack's marker, not yet complete."""
    meta = {
        "zarr_format": 3,
        "node_type": "group",
        "attributes": {"dlpack": {"format": "dlpack", "complete": False}},
    }
    return json.dumps(meta, indent=2)


class ZarrWriter(StoreWriter):
    """Writes a Zarr v3 group. Aligned blocks are whole shards, so worker processes can write
    disjoint shards concurrently (concurrent writes into one shard file lose data)."""

    def __init__(self, path: str | Path, mode: Mode = "w-", shard_bytes: int = DEFAULT_SHARD_BYTES) -> None:
        super().__init__(path, mode, shard_bytes)
        self._layout: dict[str, _Layout] = {}
        self._reset_handles()

    def _reset_handles(self) -> None:
        self._h_arrays: dict[str, Any] = {}

    def _group(self, mode: str) -> Any:
        import zarr

        return zarr.open_group(str(self.path), mode=mode, zarr_format=3)  # type: ignore[arg-type]

    def open(self) -> None:
        exists = self.path.exists() or self.path.is_symlink()
        if self.mode == "w-" or (self.mode == "a" and not exists):
            if exists:
                raise StoreExistsError(f"{self.path} already exists")
            # The group's metadata is written with the marker in it from the start, so a build killed
            # later leaves a folder that is recognisably dlpack's (killed earlier: an empty folder or
            # an unreadable zarr.json, which the build's clean-up also recognises).
            self.path.mkdir()
            (self.path / "zarr.json").write_text(_new_group_meta(), encoding="utf-8")
            return
        if not exists:
            raise StoreNotFoundError(f"no store at {self.path} to open with mode {self.mode!r}")
        if not ZarrBackend.is_own(self.path):
            raise StoreError(f"{self.path} is not a dlpack store; dlpack writes only into its own stores")
        if (self.path / MANIFEST).exists():
            manifest = read_manifest(self.path)
            self.arrays = dict(manifest.arrays)
            self.count = manifest.count

    def _create_stored(self, name: str, spec: ArraySpec, rows: int, chunk: int, shard_rows: int) -> None:
        dtype = np.dtype(spec.dtype)
        self._group("r+").create_array(name, **array_create_args(spec, rows, chunk, shard_rows))
        self._layout[name] = _Layout(rows, spec.shape, dtype.str, chunk, shard_rows, spec.compression)

    def _stored_rows(self, name: str) -> int:
        return self._layout_of(name).rows

    def _read_stored(self, name: str, start: int, stop: int) -> np.ndarray:
        return ShardedArray(self.path / name, strict=True).read_rows(start, stop)

    def _set_digest(self, name: str, digest: str) -> None:
        path = self.path / name / "zarr.json"
        meta = json.loads(path.read_text(encoding="utf-8"))
        meta.setdefault("attributes", {})[DIGEST_ATTR] = digest
        _atomic_write(path, json.dumps(meta, indent=2))
        self._h_arrays.pop(name, None)

    def _layout_of(self, name: str) -> _Layout:
        lay = self._layout.get(name)
        if lay is None:
            sharded = ShardedArray(self.path / name)
            lay = self._layout[name] = _Layout(
                sharded.shape[0],
                tuple(sharded.shape[1:]),
                sharded.dtype.str,
                sharded.chunk_len,
                sharded.chunk_len * sharded.chunks_per_shard,
                "none" if sharded.decoder is None else "compressed",
            )
        return lay

    def _stored_layout(self, name: str) -> tuple[int, int]:
        lay = self._layout_of(name)
        return lay.chunk, lay.shard_rows

    def parallel_safe(self, name: str) -> bool:
        spec = self.arrays.get(name)
        return spec is not None and not spec.ragged

    def _array(self, name: str) -> Any:
        arr = self._h_arrays.get(name)
        if arr is None:
            import zarr

            # The creation-time config is not stored: without this, zarr compares every chunk with the
            # fill value before writing it (measured: 2-4x slower shard writes). A config context
            # rather than Array.with_config, which zarr 3.0.8 to 3.1.5 lack.
            with zarr.config.set({"array.write_empty_chunks": True}):
                arr = self._h_arrays[name] = zarr.open_array(str(self.path / name), mode="r+", zarr_format=3)
        return arr

    def _write_rows(self, name: str, start: int, rows: np.ndarray) -> None:
        lay = self._layout_of(name)
        stop = start + len(rows)
        if stop > lay.rows:  # growing data of a ragged array
            self._array(name).resize((stop, *lay.trailing))
            lay.rows = stop
        per = lay.shard_rows
        whole = len(rows) % per == 0 or stop == lay.rows
        if lay.compression == "none" and start % per == 0 and whole:
            for s in range(0, len(rows), per):
                self._write_raw_shard(name, lay, (start + s) // per, rows[s : s + per])
            return
        self._array(name)[start:stop] = rows

    def _shard_path(self, name: str, lay: _Layout, s: int) -> Path:
        """The file of shard ``s`` of stored array ``name`` (default chunk keys, '/' separated)."""
        path = self.path / name / "c" / str(s)
        for _ in lay.trailing:
            path = path / "0"
        return path

    def _write_raw_shard(self, name: str, lay: _Layout, s: int, rows: np.ndarray) -> None:
        """Write shard ``s`` directly in the sharding format (:func:`raw_shard_parts`)."""
        path = self._shard_path(name, lay, s)
        path.parent.mkdir(parents=True, exist_ok=True)
        # A new file renamed over the old one: a reader that mapped the old shard keeps it whole.
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            with writing(path), open(tmp, "wb") as f:
                for part in raw_shard_parts(lay, rows):
                    f.write(part)
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()  # a shard cut short by a full disk is no use to anyone
            raise
        os.replace(tmp, path)

    def _attach_stored(self, name: str, spec: ArraySpec, rows: int) -> None:
        try:
            lay = self._layout_of(name)
        except (KeyError, TypeError, ValueError) as exc:
            raise StoreError(f"cannot read the metadata of array {name!r} of {self.path}: {exc!r}") from exc
        want = (rows, spec.shape, np.dtype(spec.dtype).newbyteorder("<"))
        if (lay.rows, lay.trailing, np.dtype(lay.dtype).newbyteorder("<")) != want:
            self._layout.pop(name, None)
            raise StoreError(
                f"array {name!r} of {self.path} holds {lay.rows} x {list(lay.trailing)} {lay.dtype}, "
                f"expected {rows} x {list(spec.shape)} {spec.dtype}"
            )

    def _read_rows(self, name: str, start: int, stop: int) -> np.ndarray:
        lay = self._layout_of(name)
        for s in range(start // lay.shard_rows, -(-stop // lay.shard_rows)):
            # zarr-python reads a missing shard as fill values: a block never written must not pass for zeros.
            if not self._shard_path(name, lay, s).is_file():
                raise StoreError(f"shard {s} of array {name!r} of {self.path} is missing")
        try:
            return np.asarray(self._array(name)[start:stop])
        except Exception as exc:  # codec and index errors come in many types; all mean a damaged shard
            raise StoreError(
                f"samples {start}..{stop} of array {name!r} of {self.path} cannot be read: {exc!r}"
            ) from exc

    def read_written(self, name: str, start: int, stop: int) -> np.ndarray:
        """A whole raw shard as :meth:`_write_raw_shard` wrote it is its rows, from byte 0: read
        into one array without zarr-python's codec pipeline, which cost the build process about
        1 s of CPU per 400 MB (on a 2-core machine, taken from the workers decoding)."""
        lay = self._layout_of(name)
        per = lay.shard_rows
        aligned = start % per == 0 and (stop - start == per or (stop == lay.rows and stop - start <= per))
        if lay.compression != "none" or not aligned or stop <= start:
            return super().read_written(name, start, stop)
        import mmap

        dtype = np.dtype(lay.dtype).newbyteorder("<")
        shape = (stop - start, *lay.trailing)
        nbytes = int(np.prod(shape)) * dtype.itemsize
        path = self._shard_path(name, lay, start // per)
        # Mapped, not read: the caller hashes the shard straight from the page cache, without a copy
        # into a fresh array (a quarter of the read-back's CPU). The shard is never rewritten.
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size >= nbytes > 0 else None
        except OSError as exc:
            raise StoreError(f"shard {start // per} of array {name!r} of {self.path} cannot be read: {exc}") from exc
        if mapped is None:
            raise StoreError(f"shard {start // per} of array {name!r} of {self.path} is truncated")
        return np.frombuffer(mapped, dtype=dtype, count=nbytes // dtype.itemsize).reshape(shape)

    def share_block(self, name: str, start: int, other: Path) -> bool:
        lay = self._layout_of(name)
        if start % lay.shard_rows:
            return False
        try:
            theirs = ShardedArray(Path(other) / name)
        except (StoreError, KeyError, TypeError, ValueError):
            return False
        if (theirs.shard_rows, theirs.chunk_len, tuple(theirs.shape[1:])) != (
            lay.shard_rows,
            lay.chunk,
            lay.trailing,
        ) or (theirs.decoder is None) != (lay.compression == "none"):
            return False
        s = start // lay.shard_rows
        mine = self._shard_path(name, lay, s)
        mine.parent.mkdir(parents=True, exist_ok=True)
        try:
            if not stat.S_ISREG(os.lstat(theirs.shard_file(s)).st_mode):
                return False  # a named pipe or a link is never shared: the caller reads the block (and refuses)
            os.link(theirs.shard_file(s), mine, follow_symlinks=False)
        except OSError:  # another file system, or no hard links there: the caller writes the block
            return False
        return True

    def undo_commit(self, keep: Sequence[str]) -> bool:
        # Fixed arrays are stored under their own name, whether or not a manifest listed them.
        kept = {
            stored for name in keep for stored in (self.arrays[name].stored_names() if name in self.arrays else (name,))
        }
        self._h_arrays.clear()
        for child in self.path.iterdir():
            if child.is_dir() and not child.is_symlink() and child.name not in kept:
                shutil.rmtree(child)
                self._layout.pop(child.name, None)
        for leftover in (MANIFEST, MANIFEST + ".tmp"):
            (self.path / leftover).unlink(missing_ok=True)
        # Back to the metadata the group was created with, which the commit rewrites from.
        _atomic_write(self.path / "zarr.json", _new_group_meta())
        # Nothing is attached any more: the caller attaches the arrays it kept.
        self.arrays, self.count = {}, None
        return True

    def remove_temp_files(self) -> int:
        removed = 0
        for folder, _dirs, files in os.walk(self.path):  # never follows a link
            at_top = folder == os.fspath(self.path)
            for name in files:
                temp = _ZARR_PYTHON_TEMP.fullmatch(name) is not None or (
                    name in _META_TEMPS if at_top else is_shard_temp_name(name) or name == "zarr.json.tmp"
                )
                if temp:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(os.path.join(folder, name))
                        removed += 1
        return removed

    def _rename_stored(self, old: str, new: str) -> None:
        self._h_arrays.pop(old, None)
        if (self.path / new).exists() or (self.path / new).is_symlink():
            raise StoreError(f"{self.path / new} already exists; dlpack does not replace what it did not write")
        os.rename(self.path / old, self.path / new)
        if old in self._layout:
            self._layout[new] = self._layout.pop(old)

    def clear_debris(self) -> list[str]:
        listed = {n for spec in self.arrays.values() for n in spec.stored_names()}
        found = []
        self._h_arrays.clear()
        for child in sorted(self.path.iterdir()):
            if not child.is_dir() or child.is_symlink():
                continue
            if child.name not in listed:
                if _uncommitted_array(child):
                    shutil.rmtree(child)
                    self._layout.pop(child.name, None)
                    found.append(child.name)
                continue
            for p in sorted(child.rglob("*.tmp")):
                if p.is_file() and (is_shard_temp_name(p.name) or p.name == "zarr.json.tmp"):
                    p.unlink()
                    found.append(p.relative_to(self.path).as_posix())
        for leftover in (MANIFEST + ".tmp", "zarr.json.tmp"):
            if (self.path / leftover).is_file():
                (self.path / leftover).unlink()
                found.append(leftover)
        return found

    def _delete_stored(self, name: str) -> None:
        self._h_arrays.pop(name, None)
        self._layout.pop(name, None)
        target = self.path / name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)

    def _write_manifest(self, manifest: Manifest) -> None:
        self._h_arrays.clear()
        text = manifest.to_json()
        # The group's zarr.json is replaced whole (a new file renamed over it), never rewritten in
        # place as zarr-python 3.0 does: a store's files may be hard links shared with another store.
        # It is written from scratch, so a copy damaged by a kill is never parsed.
        _atomic_write(self.path / "zarr.json", complete_group_meta(text, manifest.format_version))
        _atomic_write(self.path / MANIFEST, text)

    def abort(self) -> None:
        self._h_arrays.clear()


_METADATA = ("zarr.json", MANIFEST)


def clear_beside(store: Path, stage: Path) -> None:
    """Remove ``stage``, left by a killed earlier call, when it is provably dlpack's (it carries the
    marker, or is an empty folder); anything else there is refused and left alone."""
    if not (stage.exists() or stage.is_symlink()):
        return
    if stage.is_symlink() or not stage.is_dir() or (any(stage.iterdir()) and not ZarrBackend.is_own(stage)):
        raise StoreError(
            f"{stage} is where dlpack prepares the next version of {store}, but it is not dlpack's; "
            "remove or rename it, then try again"
        )
    shutil.rmtree(stage)


def prepare_beside(store: Path, stage: Path, skip: Sequence[str] = ()) -> None:
    """Make ``stage`` a copy of the complete Zarr store ``store`` to write its next generation in.

    Data files (shards, and any file of the user's inside the store) are hard links to the store's
    (copies where the file system has none), never written through: dlpack replaces a file by
    renaming a new one over it. Metadata (``zarr.json``, the manifest) is copied. Left out: the
    stored arrays ``skip`` (being replaced), temporary files of dlpack's writers cut short by a
    kill, and array folders dlpack's writer created that no manifest lists.

    ``stage`` must not exist (see :func:`clear_beside`). A full disk or a folder that cannot be
    written is a :class:`StoreError` naming the path (the stage made so far is left for the
    caller's abort to remove).
    """
    try:
        with writing(stage):
            _prepare_beside(store, stage, skip)
    except PermissionError as exc:
        with contextlib.suppress(OSError):
            stage.chmod(0o700)  # the copied mode may be read-only: let the caller's cleanup remove it
        raise StoreError(
            f"cannot prepare the next version of {store} in {stage}: {exc.filename or stage} is not writable "
            "(permission denied); the store and the folder it is in must be writable by this user: "
            "change their permissions and run the command again"
        ) from exc


def _prepare_beside(store: Path, stage: Path, skip: Sequence[str]) -> None:
    manifest = read_manifest(store)
    listed = {n for spec in manifest.arrays.values() for n in spec.stored_names()}
    stage.mkdir()
    shutil.copymode(store, stage)
    shutil.copyfile(store / "zarr.json", stage / "zarr.json")  # first: the folder is recognisably dlpack's
    for entry in sorted(os.scandir(store), key=lambda e: e.name):
        name = entry.name
        if name in skip or name in _METADATA or name in (MANIFEST + ".tmp", "zarr.json.tmp"):
            continue
        if entry.is_dir(follow_symlinks=False) and name not in listed and _uncommitted_array(Path(entry.path)):
            continue
        _share(Path(entry.path), stage / name, array=name in listed)
    shutil.copyfile(store / MANIFEST, stage / MANIFEST)


def _uncommitted_array(folder: Path) -> bool:
    """Whether ``folder`` is an array dlpack's writer created (it carries the digest attribute)."""
    try:
        meta = json.loads((folder / "zarr.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return False
    attrs = meta.get("attributes") if isinstance(meta, dict) else None
    return (
        isinstance(meta, dict) and meta.get("node_type") == "array" and isinstance(attrs, dict) and DIGEST_ATTR in attrs
    )


def _share(src: Path, dst: Path, array: bool) -> None:
    """``dst`` as ``src``: folders recreated, symlinks copied as links, files hard-linked."""
    if src.is_symlink():
        os.symlink(os.readlink(src), dst)
        return
    if src.is_dir():
        dst.mkdir()
        shutil.copymode(src, dst)
        for entry in sorted(os.scandir(src), key=lambda e: e.name):
            if array and (is_shard_temp_name(entry.name) or entry.name == "zarr.json.tmp"):
                continue  # a shard or metadata write cut short by a kill
            _share(Path(entry.path), dst / entry.name, array)
        return
    if array and src.name == "zarr.json":
        shutil.copyfile(src, dst)
        return
    try:
        os.link(src, dst, follow_symlinks=False)
    except OSError:  # no hard links on this file system (or across a mount inside the store)
        shutil.copy2(src, dst, follow_symlinks=False)


def _only_regular_files(folder: Path) -> None:
    """Refuse a folder holding anything but regular files and folders (zarr-python opens every
    file by path and would block forever on a named pipe)."""
    stack = [folder]
    while stack:
        with os.scandir(stack.pop()) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(Path(entry.path))
                elif not entry.is_file(follow_symlinks=False):
                    kind = file_kind(entry.stat(follow_symlinks=False).st_mode)
                    raise StoreError(f"{entry.path} is not a regular file ({kind}); a dlpack store holds none")


class _ZarrPythonArray:
    """A stored array that is not sharded (stores written before named arrays): read by zarr-python.

    zarr-python raises many kinds of errors on damaged metadata or chunks; each becomes a StoreError.
    """

    def __init__(self, path: Path) -> None:
        import zarr

        try:
            _only_regular_files(path)
            self._arr = zarr.open_array(str(path), mode="r", zarr_format=3)
            self.shape = tuple(int(d) for d in self._arr.shape)
            self.dtype = np.dtype(self._arr.dtype)
        except StoreError:
            raise
        except Exception as exc:  # zarr's errors come in many types; all mean metadata it cannot use
            raise StoreError(f"cannot open array {path}: {exc!r}") from exc
        self.path = path

    def read_rows(self, start: int, stop: int) -> np.ndarray:
        try:
            return np.asarray(self._arr[start:stop])
        except Exception as exc:  # codec and chunk errors come in many types; all mean a damaged array
            raise StoreError(f"rows {start}..{stop} of array {self.path} cannot be read: {exc!r}") from exc

    def read_into(self, positions: list[int], out: np.ndarray, rows: Sequence[int] | None = None) -> np.ndarray:
        try:
            got = self._arr.get_orthogonal_selection((np.asarray(positions, dtype=np.int64),))
            if rows is None:
                out[: len(positions)] = got
            else:
                out[np.asarray(rows, dtype=np.int64)] = got
        except Exception as exc:  # as in read_rows
            raise StoreError(f"samples of array {self.path} cannot be read: {exc!r}") from exc
        return out

    def warm(self) -> None:
        pass

    def close(self) -> None:
        pass

    def nbytes_on_disk(self) -> int:
        return sum(p.lstat().st_size for p in self.path.rglob("*") if p.is_file() and not p.is_symlink())


def array_digest_attr(meta: Any) -> object:
    """The digest an array's ``zarr.json`` carries (``dlpack_sha256``), for ``check_generation``."""
    attrs = meta.get("attributes") if isinstance(meta, dict) else None
    return attrs.get(DIGEST_ATTR) if isinstance(attrs, dict) else None


def is_sharded(meta: Any) -> bool:
    """Whether an array's ``zarr.json`` names one ``sharding_indexed`` codec (read directly)."""
    codecs = meta.get("codecs") if isinstance(meta, dict) else None
    first = codecs[0] if isinstance(codecs, list) and len(codecs) == 1 else None
    return isinstance(first, dict) and first.get("name") == "sharding_indexed"


class ZarrReader(StoreReader):
    """Reads every array through :class:`ShardedArray` (direct shard access).

    One generation: the store folder is opened once (a directory handle) and the manifest, the
    group metadata and every array are read through that handle, so a store renamed over this path
    later (``--overwrite``) is not seen; each array's ``zarr.json`` must carry the checksum the
    manifest lists for it, and all shards of an array are mapped together when it is first used.
    """

    def __init__(self, path: str | Path, mode: Mode = "r") -> None:
        super().__init__(path, mode)
        self._manifest: Manifest | None = None
        self._fd: int | None = None
        #: Per array with variants (``images``, ``mask``): the range its arrays are mapped in.
        self._arenas: dict[str, Arena] = {}

    def _root(self) -> int | None:
        """The handle on the store folder, opened (and the manifest read and pinned) on first use."""
        if self._fd is None and _DIR_FD:
            try:
                fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY)
            except FileNotFoundError:
                raise StoreNotFoundError(f"no store at {self.path}") from None
            except OSError as exc:
                raise StoreError(f"{self.path} is not a dlpack store folder: {exc}") from exc
            try:
                manifest = _load_manifest(self.path, fd, self._pin_manifest)
            except BaseException:
                os.close(fd)
                raise
            self._fd = fd
            if self._manifest is None:
                self._manifest = manifest
        return self._fd

    @property
    def manifest(self) -> Manifest:
        if self._manifest is None:
            if _DIR_FD:
                self._root()
            else:
                self._manifest = _load_manifest(self.path, None, self._pin_manifest)
        assert self._manifest is not None
        return self._manifest

    def _open_array(self, stored_name: str) -> ArrayAccess:
        root = self._root() if _DIR_FD else None
        path = self.path / stored_name
        afd: int | None = None
        try:
            if root is not None:
                afd = os.open(stored_name, os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW, dir_fd=root)
            meta = _json(_read_text("zarr.json", afd, path), path / "zarr.json")
        except FileNotFoundError:
            if afd is not None:
                os.close(afd)
            if self._replaced():
                raise changed_error(
                    self.path, f"array {stored_name!r} is gone: the store was rebuilt or replaced"
                ) from None
            raise StoreError(f"store {self.path} has no array {stored_name!r} (missing {path / 'zarr.json'})") from None
        except (OSError, UnicodeDecodeError) as exc:
            if afd is not None:
                os.close(afd)
            raise StoreError(f"cannot read array metadata {path / 'zarr.json'}: {exc}") from exc
        try:
            self.check_generation(stored_name, array_digest_attr(meta))
            if is_sharded(meta):
                arr = ShardedArray(path, strict=True, meta=meta, dir_fd=afd, arena=self._arena_of(stored_name))
                try:
                    arr.map_all()
                except StoreError:
                    arr.close()
                    if self._replaced():
                        raise changed_error(
                            self.path, f"array {stored_name!r} lost shards: the store was replaced"
                        ) from None
                    raise
                return arr
            return _ZarrPythonArray(path)
        finally:
            if afd is not None:
                os.close(afd)

    def _arena_of(self, stored_name: str) -> Arena | None:
        """The address range shared by ``stored_name`` and its variants' arrays (``images`` and
        ``images_v1``..): a batch of cached views mixes their rows in one take, which needs no
        other memory between them (:class:`~dlpack._maps.Arena`); None for an array without variants."""
        of = schema.variant_of(stored_name)
        base = of[0] if of is not None else stored_name
        if base not in schema.VARIANT_BASES:
            return None
        names = self.manifest.arrays
        members = 1 + sum(1 for name in names if (schema.variant_of(name) or ("", 0))[0] == base)
        if members < 2:
            return None
        return self._arenas.setdefault(base, Arena(members))  # one per base, also when threads race here

    def _replaced(self) -> bool:
        """Whether the folder at this path is no longer the one this reader opened."""
        if self._fd is None:
            return False
        try:
            mine = os.fstat(self._fd)
            now = os.stat(self.path)
        except OSError:
            return True
        return (mine.st_dev, mine.st_ino) != (now.st_dev, now.st_ino) or mine.st_nlink == 0

    def close(self) -> None:
        super().close()
        self._arenas = {}  # each goes once the last of its arrays' maps is dropped
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _load_manifest(path: Path, dir_fd: int | None, pin: Any = None) -> Manifest:
    """The manifest of the Zarr store at ``path`` (read through ``dir_fd`` when given), checked
    against the checksum in the group metadata; ``pin(text)`` records or checks what was read."""
    try:
        group = _json(_read_text("zarr.json", dir_fd, path), path / "zarr.json")
    except FileNotFoundError:
        group = None
    except (OSError, UnicodeDecodeError) as exc:
        raise StoreError(f"cannot read {path / 'zarr.json'}: {exc}") from exc
    try:
        text: str | None = _read_text(MANIFEST, dir_fd, path)
    except FileNotFoundError:
        text = None
    except (OSError, UnicodeDecodeError) as exc:
        raise StoreError(f"cannot read {path / MANIFEST}: {exc}") from exc
    return manifest_of(group, text, path, pin)


def manifest_of(group: Any, text: str | None, where: object, pin: Any = None) -> Manifest:
    """The manifest ``text`` of the Zarr store at ``where`` (a folder or a URL), checked against the
    checksum in its group metadata ``group`` (parsed; None when absent); ``text`` None when there
    is no manifest (an incomplete store, or no store). ``pin(text)`` records or checks what was read.
    The rules a local and a remote reader share."""
    marker = _marker(group)
    if text is None:
        if marker is not None:
            raise IncompleteStoreError(
                f"{where} is an incomplete dlpack store (no {MANIFEST}: the build failed or was killed); "
                "run dlpack build again with --overwrite"
            )
        raise StoreNotFoundError(f"{where} is not a dlpack store (no {MANIFEST})")
    digest = marker.get("manifest_sha256") if marker is not None else None
    if digest is not None and not isinstance(digest, str):
        raise StoreError(f"{where}/zarr.json: manifest_sha256 must be a string")
    manifest = Manifest.from_json(text, str(where), sha256=digest)
    if pin is not None:
        pin(text)
    return manifest


def read_manifest(path: Path) -> Manifest:
    """The manifest of a Zarr store, with errors that say what is wrong."""
    return _load_manifest(path, None)


class ZarrBackend(Backend):
    name = "zarr"
    suffixes = (".zarr",)

    @classmethod
    def detect(cls, path: Path) -> bool:
        return path.is_dir() and any(os.path.lexists(path / name) for name in ("zarr.json", MANIFEST))

    @classmethod
    def is_own(cls, path: Path) -> bool:
        if not path.is_dir() or path.is_symlink():
            return False
        try:
            meta = json.loads(_read_text("zarr.json", None, path))
        except (OSError, ValueError, RecursionError):  # a named pipe or a link there is not dlpack's marker
            return False
        return _marker(meta) is not None

    @classmethod
    def remove(cls, path: Path) -> None:
        """Remove the store folder so that a removal cut short by a kill leaves a folder that readers
        call incomplete and that the next build still recognises as dlpack's (and removes): the
        manifest goes first, the group's zarr.json (the marker) last."""
        if not path.is_dir() or path.is_symlink():
            super().remove(path)
            return
        _settle_io()
        with contextlib.suppress(OSError):
            (path / MANIFEST).unlink()
        for child in sorted(path.iterdir()):
            if child.name == "zarr.json":
                continue
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    child.unlink()
        with contextlib.suppress(OSError):
            (path / "zarr.json").unlink()
        shutil.rmtree(path, ignore_errors=True)

    @classmethod
    def foreign_reason(cls, path: Path) -> str | None:
        """A build killed while creating its group leaves an empty folder or a bare zarr.json."""
        if not path.is_dir():
            return super().foreign_reason(path)
        entries = [p.name for p in path.iterdir()]
        if not entries or (entries == ["zarr.json"] and _bare_group(path / "zarr.json")):
            return None
        odd = irregular_entries(path)
        return "it is a folder without dlpack's marker" + (f" ({', '.join(odd)})" if odd else "")

    @classmethod
    def open_reader(cls, path: Path, mode: Mode = "r") -> StoreReader:
        """A reader of the Zarr store ``path``: a local folder, or an object-store URL or Location
        (the storage layer's reader)."""
        check_mode(mode, ("r",))
        if is_remote(path):
            reader: StoreReader = remote_opener("reader", path)(path, mode)
            return reader
        return ZarrReader(path, mode)

    @classmethod
    def open_writer(cls, path: Path, mode: Mode = "w-", shard_bytes: int = DEFAULT_SHARD_BYTES) -> StoreWriter:
        """A writer of the Zarr store ``path``: a local folder, or an object-store URL or Location
        (:class:`~dlpack.backends._object_zarr.ObjectZarrWriter`, through the storage layer)."""
        if is_remote(path):
            writer: StoreWriter = remote_opener("writer", path)(path, mode, shard_bytes)
            return writer
        return ZarrWriter(path, mode, shard_bytes)

    # A change of the arrays: the next generation is prepared beside the store (every data file a
    # hard link to the store's), written, committed, and published by the caller as a build is.

    @classmethod
    def begin_change(cls, change: ArrayChange, resume: Sequence[ArraySpec]) -> None:
        stage = change.stage
        if resume:
            if not cls.is_own(stage) or stage.is_symlink():
                raise StoreError(f"{stage} is not a dlpack store folder to continue")
            if read_manifest(stage).to_json() != change.manifest.to_json():
                raise StoreError(f"{stage} no longer holds a copy of {change.out}")
            change.own_stage = True
        else:
            clear_beside(change.out, stage)
            change.own_stage = True
            listed = change.manifest.arrays
            skip = [n for name in change.drop for n in (listed[name].stored_names() if name in listed else (name,))]
            prepare_beside(change.out, stage, skip=skip)
        writer = change.opened = cls.open_writer(stage, "r+", change.shard_bytes)
        writer.open()
        for name in change.drop:
            if name in writer.arrays:
                if resume:  # never copied into the stage: a folder of that name is a new array of this change
                    del writer.arrays[name]
                else:
                    writer.delete_array(name)
        for spec in resume:
            change.attach(spec)
        if resume:
            writer.remove_temp_files()
            writer.clear_debris()  # arrays the killed change began beside the kept ones

    @classmethod
    def check_new_array(cls, change: ArrayChange, spec: ArraySpec) -> None:
        known = change.opened.arrays if change.opened is not None else {}
        taken = [
            n
            for n in spec.stored_names()
            if ((change.stage / n).exists() or (change.stage / n).is_symlink()) and n not in known
        ]
        if taken:
            raise StoreError(
                f"{change.out} holds {', '.join(taken)}, which is not one of its arrays; choose another array name"
            )

    @classmethod
    def commit_change(cls, change: ArrayChange, after: Manifest) -> Path | None:
        assert change.opened is not None
        change.opened.commit(after)
        change.committed = True
        return change.stage

    @classmethod
    def abort_change(cls, change: ArrayChange, keep: bool) -> None:
        if change.opened is not None:
            change.opened.abort()
        if not keep and change.own_stage and change.stage.exists():
            shutil.rmtree(change.stage, ignore_errors=True)  # made by this change, under the lock

    @classmethod
    def carry_foreign(cls, store: Path, new: Path, manifest: Manifest) -> list[str]:
        """Hard-link (or copy, across file systems) every entry of the store folder that is neither
        its metadata nor a stored array of ``manifest`` into ``new``: a user's notes, annotation
        folders, anything. An entry that cannot be carried (a name ``new`` already uses, a device)
        is a StoreError naming it, before the old generation is removed."""
        ours = {"zarr.json", MANIFEST, "zarr.json.tmp", MANIFEST + ".tmp"}
        arrays = {n for spec in manifest.arrays.values() for n in spec.stored_names()}
        ours.update(arrays)
        found = [e for e in sorted(os.listdir(store)) if e not in ours]
        # Inside an array folder dlpack keeps its metadata and its chunk tree ("c") only.
        for name in sorted(arrays):
            folder = store / name
            if folder.is_dir() and not folder.is_symlink():
                found += [
                    f"{name}/{e}" for e in sorted(os.listdir(folder)) if e not in ("zarr.json", "zarr.json.tmp", "c")
                ]
        carried = []
        for entry in found:
            if os.path.lexists(new / entry) or not os.path.isdir(os.path.dirname(new / entry)):
                raise StoreError(
                    f"{store / entry} is not dlpack's, and the update's new generation of {store} cannot keep it "
                    "there; move it out of the store, then update again"
                )
            _carry_entry(store / entry, new / entry)
            carried.append(entry)
        return carried


def _bare_group(meta_path: Path) -> bool:
    """Whether ``meta_path`` is the zarr.json a build killed while creating its group leaves: cut
    short, or a group without attributes; never a named pipe or a link (not dlpack's)."""
    try:
        text = read_regular(meta_path, follow_symlinks=False)
    except NotRegularFileError:
        return False
    except OSError:
        return True
    try:
        meta = json.loads(text)
    except (ValueError, RecursionError):
        return True
    return isinstance(meta, dict) and meta.get("node_type") == "group" and not meta.get("attributes")


def _carry_entry(src: Path, dst: Path) -> None:
    """``src`` (a file, link or folder tree) at ``dst``: files hard-linked or copied, links as links."""
    import stat as st_

    mode = os.lstat(src).st_mode
    if st_.S_ISLNK(mode):
        os.symlink(os.readlink(src), dst)
    elif st_.S_ISDIR(mode):
        os.mkdir(dst)
        for child in sorted(os.listdir(src)):
            _carry_entry(src / child, dst / child)
    else:
        try:
            os.link(src, dst, follow_symlinks=False)
        except OSError as exc:
            if not st_.S_ISREG(mode):
                raise StoreError(
                    f"{src} is not dlpack's and not a regular file, and cannot be carried into the store's next "
                    f"generation ({exc.strerror or exc}); move it out of the store, then update again"
                ) from exc
            shutil.copy2(src, dst)
