"""The Zarr v3 writer of a store in an object store: every file of the local layout as one object.

An object store has no rename, no append and no partial write: a shard is PUT whole at its
standard key (``images/c/<s>/0/0/0``), metadata objects are PUT whole, and ``manifest.json`` is PUT
last, after the group's ``zarr.json`` that records its SHA-256: the manifest is the commit point
(docs/format.md, "Stores in an object store"). Array metadata is what zarr-python writes (made in
a memory store, then PUT), uncompressed shards are the bytes of :func:`raw_shard_parts` (the local
writer's), compressed ones are encoded by zarr-python in memory, one shard at a time.

Each shard's rows are hashed where the shard is written (:func:`~dlpack.backends.base.rows_sha256`),
so an array's digest is :func:`~dlpack.backends.base.shard_digest` of them and no process reads the
store back. A worker's copy of the writer hands what it wrote to the driver (:meth:`take_landed`),
which records it (:meth:`note_landed`) and journals it.

The writer is given its :class:`~dlpack.storage.objects.Storage` (the storage layer opens it), so
this package needs no object-store client of its own.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from .. import schema
from ..errors import StoreError, StoreExistsError, StoreNotFoundError
from ..manifest import ArraySpec, Manifest
from ._zarr import MANIFEST, _Layout, _marker, _new_group_meta, array_create_args, complete_group_meta, raw_shard_parts
from .base import DEFAULT_SHARD_BYTES, DIGEST_ATTR, Mode, rows_sha256, shard_digest
from .writer import StoreWriter

if TYPE_CHECKING:
    from ..storage.objects import Storage

__all__ = ["GROUP_META", "MANIFEST", "ObjectZarrWriter", "ShardInfo", "dlpack_marker"]

GROUP_META = "zarr.json"
#: What a build keeps in a store's prefix beside the store (its lease, its journal): never someone else's.
_OWN_PREFIX = ".dlpack-"
#: Arrays whose digest is always taken shard by shard (a build's workers write their shards), so a
#: store's bytes do not depend on how many processes wrote it.
_BY_SHARD = (*schema.PIXEL_ARRAYS, schema.MASK)


@dataclass(frozen=True)
class ShardInfo:
    """One written shard object: its size and version tag (what a resume checks against a listing)
    and the SHA-256 of its rows (what the array's digest is made of)."""

    size: int
    etag: str
    sha256: str

    def record(self) -> list[Any]:
        """As a JSON list."""
        return [self.size, self.etag, self.sha256]

    @classmethod
    def from_record(cls, r: Any) -> ShardInfo:
        """From :meth:`record`'s list."""
        return cls(int(r[0]), str(r[1]), str(r[2]))


def dlpack_marker(group_meta: bytes) -> dict[str, Any] | None:
    """The dlpack marker of a group ``zarr.json``'s bytes, or None (not dlpack's, or unreadable)."""
    try:
        return _marker(json.loads(group_meta))
    except (ValueError, RecursionError):
        return None


@dataclass
class _RemoteLayout(_Layout):
    """A stored array's layout, with the ``zarr.json`` zarr-python made for it (rewritten on resize)."""

    meta: dict[str, Any]


def _zarr_python_meta(spec: ArraySpec, rows: int, chunk: int, shard_rows: int) -> dict[str, Any]:
    """The ``zarr.json`` zarr-python writes for this array (made in a memory store)."""
    import zarr

    store = zarr.storage.MemoryStore()
    zarr.create_array(store, **array_create_args(spec, rows, chunk, shard_rows))
    meta: dict[str, Any] = json.loads(store._store_dict["zarr.json"].to_bytes())
    return meta


class ObjectZarrWriter(StoreWriter):
    """Writes a Zarr v3 group into an object-store prefix (``storage``), in place: there is no
    partial folder to rename, the manifest written last is the commit."""

    #: Array digests are taken shard by shard where the shards are written (never read back).
    shard_digests: ClassVar[bool] = True

    def __init__(self, storage: Storage, mode: Mode = "w-", shard_bytes: int = DEFAULT_SHARD_BYTES) -> None:
        super().__init__(".", mode, shard_bytes)
        # Messages name the URL (str of a Location); never a local path.
        self.path = storage.location  # type: ignore[assignment]
        self.storage = storage
        self._layout: dict[str, _RemoteLayout] = {}
        #: Shards written and recorded here (the driver's copy): stored array -> shard -> info.
        self.shards: dict[str, dict[int, ShardInfo]] = {}
        #: Shards this copy wrote since :meth:`take_landed` (a worker hands them to the driver).
        self._landed: dict[str, dict[int, ShardInfo]] = {}
        #: The listing of a reopened partial store: key -> (size, etag).
        self.listed: dict[str, tuple[int, str]] = {}
        self._reset_handles()

    def _reset_handles(self) -> None:
        #: Per stored array: the next shard in order and the SHA-256 of the rows written in order so far.
        self._h_running: dict[str, tuple[int, Any]] = {}

    # ------------------------------------------------------------------ store

    def open(self) -> None:
        """Create the group (its marker first) or reopen a partial store of ours."""
        group = self.storage.head(GROUP_META)
        # Objects there without the group: someone else's (a file named like the store, or a prefix of objects).
        foreign = group is None and (
            self.storage.head("") is not None or any(not o.key.startswith(_OWN_PREFIX) for o in self.storage.list())
        )
        if self.mode == "w-" or (self.mode == "a" and group is None and not foreign):
            if group is not None or foreign:
                raise StoreExistsError(f"{self.path} already exists")
            self.storage.put(GROUP_META, _new_group_meta().encode("utf-8"))
            return
        if group is None:
            if foreign:
                raise StoreError(f"{self.path} is not a dlpack store; dlpack writes only into its own stores")
            raise StoreNotFoundError(f"no store at {self.path} to open with mode {self.mode!r}")
        if dlpack_marker(self.storage.get(GROUP_META)) is None:
            raise StoreError(f"{self.path} is not a dlpack store; dlpack writes only into its own stores")
        self.listed = {o.key: (o.size, o.etag) for o in self.storage.list()}
        if MANIFEST in self.listed:
            manifest = Manifest.from_json(self.storage.get(MANIFEST).decode("utf-8"), str(self.path))
            self.arrays = dict(manifest.arrays)
            self.count = manifest.count

    def _shard_key(self, name: str, lay: _RemoteLayout, s: int) -> str:
        return "/".join([name, "c", str(s), *("0" for _ in lay.trailing)])

    def _create_stored(self, name: str, spec: ArraySpec, rows: int, chunk: int, shard_rows: int) -> None:
        meta = _zarr_python_meta(spec, rows, chunk, shard_rows)
        lay = _RemoteLayout(rows, spec.shape, np.dtype(spec.dtype).str, chunk, shard_rows, spec.compression, meta)
        self._layout[name] = lay
        self._put_meta(name, lay)

    def _put_meta(self, name: str, lay: _RemoteLayout) -> None:
        lay.meta["shape"] = [lay.rows, *lay.trailing]
        self.storage.put(f"{name}/zarr.json", json.dumps(lay.meta, indent=2).encode("utf-8"))

    def _layout_of(self, name: str) -> _RemoteLayout:
        lay = self._layout.get(name)
        if lay is None:
            try:
                meta = json.loads(self.storage.get(f"{name}/zarr.json"))
                codecs = meta["codecs"]
                sharding = codecs[0]["configuration"]
                inner = sharding["codecs"]
                compressed = any(c.get("name") not in ("bytes", "transpose") for c in inner)
                lay = _RemoteLayout(
                    int(meta["shape"][0]),
                    tuple(int(x) for x in meta["shape"][1:]),
                    _dtype_of(meta),
                    int(sharding["chunk_shape"][0]),
                    int(meta["chunk_grid"]["configuration"]["chunk_shape"][0]),
                    "compressed" if compressed else "none",
                    meta,
                )
            except StoreNotFoundError:
                raise StoreError(f"store {self.path} has no array {name!r}") from None
            except (KeyError, TypeError, ValueError, IndexError) as exc:
                raise StoreError(f"cannot read the metadata of array {name!r} of {self.path}: {exc!r}") from exc
            self._layout[name] = lay
        return lay

    def _stored_layout(self, name: str) -> tuple[int, int]:
        lay = self._layout_of(name)
        return lay.chunk, lay.shard_rows

    def _stored_rows(self, name: str) -> int:
        return self._layout_of(name).rows

    def parallel_safe(self, name: str) -> bool:
        """Fixed arrays: each block is one whole shard object, so workers may write disjoint ones."""
        spec = self.arrays.get(name)
        return spec is not None and not spec.ragged

    def _attach_stored(self, name: str, spec: ArraySpec, rows: int) -> None:
        lay = self._layout_of(name)
        want = (rows, spec.shape, np.dtype(spec.dtype).newbyteorder("<"))
        if (lay.rows, lay.trailing, np.dtype(lay.dtype).newbyteorder("<")) != want:
            self._layout.pop(name, None)
            raise StoreError(
                f"array {name!r} of {self.path} holds {lay.rows} x {list(lay.trailing)} {lay.dtype}, "
                f"expected {rows} x {list(spec.shape)} {spec.dtype}"
            )

    # ------------------------------------------------------------------ shards

    def _write_rows(self, name: str, start: int, rows: np.ndarray) -> None:
        lay = self._layout_of(name)
        stop = start + len(rows)
        per = lay.shard_rows
        if start % per:
            raise StoreError(
                f"array {name!r} of {self.path}: an object store is written in whole shards, "
                f"and row {start} does not start one"
            )
        if stop > lay.rows:  # growing data of a ragged array: its shape is recorded at commit
            lay.rows = stop
        for s in range(0, len(rows), per):
            self._put_shard(name, lay, (start + s) // per, rows[s : s + per])

    def _put_shard(self, name: str, lay: _RemoteLayout, s: int, rows: np.ndarray) -> None:
        if lay.compression == "none":
            data: Any = b"".join(raw_shard_parts(lay, rows))
        else:
            data = _encoded_shard(lay, s, rows)
        info = self.storage.put(self._shard_key(name, lay, s), data)
        got = ShardInfo(info.size, info.etag, rows_sha256(rows, lay.dtype).hex())
        nxt, h = self._h_running.get(name, (0, hashlib.sha256()))
        if s == nxt:  # in order from the first shard: the whole-array digest a local store records
            block = np.ascontiguousarray(rows, dtype=np.dtype(lay.dtype).newbyteorder("<"))
            h.update(block.data.cast("B") if block.size else b"")
            self._h_running[name] = (nxt + 1, h)
        else:
            self._h_running[name] = (-1, h)
        self._landed.setdefault(name, {})[s] = got
        self.shards.setdefault(name, {})[s] = got

    def __getstate__(self) -> dict[str, Any]:
        # What the driver records of landed shards stays with it: a worker's copy reports its own
        # (take_landed). Sending it would also race with the driver adding to it while a pool's
        # feeder thread pickles the next task.
        state = super().__getstate__()
        state.update(shards={}, listed={}, _landed={})
        return state

    def take_landed(self) -> dict[str, dict[int, ShardInfo]]:
        """The shards this copy wrote since the last call (a worker's, for the driver)."""
        landed, self._landed = self._landed, {}
        return landed

    def note_landed(self, landed: dict[str, dict[int, ShardInfo]]) -> None:
        """Record shards written by a worker's copy (or kept from a killed build's journal)."""
        for name, shards in landed.items():
            self.shards.setdefault(name, {}).update(shards)

    def shard_intact(self, name: str, s: int) -> bool:
        """Whether shard ``s`` of ``name`` is in the reopened store's listing with the size and version
        tag recorded for it (:meth:`note_landed`): how a resume keeps a block without reading it."""
        info = self.shards.get(name, {}).get(s)
        if info is None:
            return False
        lay = self._layout_of(name)
        return self.listed.get(self._shard_key(name, lay, s)) == (info.size, info.etag)

    def set_written_digest(self, name: str, digest: str) -> None:
        """Ignored: the digest of an array in an object store is taken shard by shard."""

    def _read_stored(self, name: str, start: int, stop: int) -> np.ndarray:
        """Rows read back by GETs of whole shards: only where nothing else has them (the pixel
        statistics of a resumed build, whose kept blocks were written by the killed run)."""
        import zarr

        lay = self._layout_of(name)
        per = lay.shard_rows
        store = zarr.storage.MemoryStore()
        meta = json.dumps(lay.meta | {"shape": [lay.rows, *lay.trailing]}).encode("utf-8")
        store._store_dict["zarr.json"] = zarr.core.buffer.cpu.Buffer.from_bytes(meta)
        for s in range(start // per, -(-stop // per)):
            key = self._shard_key(name, lay, s)
            store._store_dict[key.split("/", 1)[1]] = zarr.core.buffer.cpu.Buffer.from_bytes(self.storage.get(key))
        return np.asarray(zarr.open_array(store, mode="r", zarr_format=3)[start:stop])

    def _delete_stored(self, name: str) -> None:
        keys = [o.key for o in self.storage.list(name + "/")]
        self.storage.delete(keys)
        self._layout.pop(name, None)
        self.shards.pop(name, None)

    def _rename_stored(self, old: str, new: str) -> None:
        """Copy every object of stored array ``old`` to ``new`` (an object store has no rename), then
        delete the old ones."""
        keys = [o.key for o in self.storage.list(old + "/")]
        if next(iter(self.storage.list(new + "/")), None) is not None:
            raise StoreError(f"{self.path}/{new} already exists; dlpack does not replace what it did not write")
        for key in keys:
            self.storage.put(new + key[len(old) :], self.storage.get(key))
        self.storage.delete(keys)
        if old in self._layout:
            self._layout[new] = self._layout.pop(old)
        if old in self.shards:
            self.shards[new] = self.shards.pop(old)

    def clear_debris(self) -> list[str]:
        """Delete the arrays a killed writer began that no manifest lists (their ``zarr.json`` still
        says "being written"); returns their names."""
        listed = {n for spec in self.arrays.values() for n in spec.stored_names()}
        tops = sorted({o.key.split("/", 1)[0] for o in self.storage.list() if "/" in o.key})
        found = []
        for name in tops:
            if name in listed or name.startswith("."):
                continue
            try:
                meta = json.loads(self.storage.get(f"{name}/zarr.json"))
            except (StoreNotFoundError, ValueError):
                continue
            if meta.get("attributes", {}).get(DIGEST_ATTR) == "":
                self.storage.delete([o.key for o in self.storage.list(name + "/")])
                self._layout.pop(name, None)
                found.append(name)
        return found

    def _set_digest(self, name: str, digest: str) -> None:
        lay = self._layout_of(name)
        lay.meta.setdefault("attributes", {})[DIGEST_ATTR] = digest
        self._put_meta(name, lay)

    def commit(self, manifest: Manifest) -> None:
        """Flush ragged rows, take every array's digest from its shards' hashes, then the manifest."""
        for name, buf in self._ragged.items():
            if buf.samples != self.count:
                raise StoreError(f"ragged array {name!r} has {buf.samples} of {self.count} samples written")
            self._flush_ragged(name, final=True)
        self._ragged.clear()
        for name in sorted(self._touched):
            lay = self._layout_of(name)
            n = -(-lay.rows // lay.shard_rows)
            nxt, h = self._h_running.get(name, (0, hashlib.sha256()))
            if nxt == n and name not in _BY_SHARD:
                # Written whole, in order, by this process: the digest a local store of it records.
                self._written_digests[name] = h.hexdigest()
                continue
            got = self.shards.get(name, {})
            per = lay.shard_rows
            # A shard written by a copy of this writer that did not report it (take_landed) is read back.
            hashes = [
                bytes.fromhex(got[s].sha256)
                if s in got
                else rows_sha256(self._read_stored(name, s * per, min(lay.rows, (s + 1) * per)), lay.dtype)
                for s in range(n)
            ]
            self._written_digests[name] = shard_digest(hashes)
        super().commit(manifest)

    def _write_manifest(self, manifest: Manifest) -> None:
        text = manifest.to_json()
        self.storage.put(GROUP_META, complete_group_meta(text, manifest.format_version).encode("utf-8"))
        # Last: the commit point. A reader finds no manifest, or the one the marker names.
        self.storage.put(MANIFEST, text.encode("utf-8"))

    def undo_commit(self, keep: Any) -> bool:
        """Back to holding only arrays ``keep`` (a build killed while committing): every other
        array's objects and the manifest deleted, the group marker as created."""
        kept = {
            stored for name in keep for stored in (self.arrays[name].stored_names() if name in self.arrays else (name,))
        }
        self.storage.delete([MANIFEST])
        self.storage.put(GROUP_META, _new_group_meta().encode("utf-8"))
        drop = [o.key for o in self.storage.list() if "/" in o.key and not o.key.startswith(".")]
        self.storage.delete([k for k in drop if k.split("/", 1)[0] not in kept])
        for name in list(self._layout):
            if name not in kept:
                self._layout.pop(name)
        self.listed = {o.key: (o.size, o.etag) for o in self.storage.list()}
        self.arrays, self.count = {}, None
        return True


def _dtype_of(meta: dict[str, Any]) -> str:
    """A zarr v3 ``data_type`` as a NumPy dtype string."""
    return str(np.dtype(str(meta["data_type"])).newbyteorder("<").str)


def _encoded_shard(lay: _RemoteLayout, s: int, rows: np.ndarray) -> bytes:
    """Shard ``s`` of rows ``rows`` as zarr-python encodes it (compressed), made in a memory store."""
    import zarr

    store = zarr.storage.MemoryStore()
    store._store_dict["zarr.json"] = zarr.core.buffer.cpu.Buffer.from_bytes(json.dumps(lay.meta).encode("utf-8"))
    with zarr.config.set({"array.write_empty_chunks": True}):
        arr = zarr.open_array(store, mode="r+", zarr_format=3)
        start = s * lay.shard_rows
        if start + len(rows) > arr.shape[0]:
            arr.resize((start + len(rows), *lay.trailing))
        arr[start : start + len(rows)] = rows
    key = "c/" + "/".join([str(s), *("0" for _ in lay.trailing)])
    return bytes(store._store_dict[key].to_bytes())
