"""Direct reads of Zarr v3 sharded arrays through the shard index.

zarr-python costs 0.4-1 ms per ``array[i]`` call (docs/benchmarks.md); reading the shard file
ourselves through its index (the ``sharding_indexed`` codec: a table of little-endian uint64
``(offset, nbytes)`` pairs per inner chunk, at the end of each shard file, followed by a CRC32C)
costs one memory copy. The store stays standard: zarr-python and tensorstore read it too.
"""

from __future__ import annotations

import json
import math
import mmap
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .._files import open_regular, read_regular
from .._maps import Arena, huge_pages, map_consecutive
from ..errors import StoreError
from ._watch import WATCH

__all__ = [
    "ShardedArray", "check_ratio", "decode_chunk_into", "parse_array_meta", "parse_shard_index", "shard_key",
]  # fmt: skip

_MISSING = np.uint64(2**64 - 1)
#: An inner chunk of one sample may be this large (a 2**28-pixel RGB uint16 image is 1.5 GiB) ...
_MAX_CHUNK = 2**31
#: ... one of several rows (small values, ragged data) this large (dlpack writes about 1-2 MiB).
_MAX_MULTIROW_CHUNK = 2**26
#: A compressed chunk may decode to at most this many times its stored bytes, or _RATIO_FLOOR.
_MAX_RATIO = 2**16
_RATIO_FLOOR = 2**22
_MAX_DIMS = 32
#: Shards are placed a whole number of rows apart in their address range when that costs at most
#: this much padding per shard (address space only: a 300-byte row needs steps of 75 pages, 300 KiB).
_MAX_ALIGN = 2**26


def _ints(value: Any, what: str, where: object, minimum: int) -> list[int]:
    if not isinstance(value, list) or not 1 <= len(value) <= _MAX_DIMS:
        raise StoreError(f"{where}: {what} must be a list of 1-{_MAX_DIMS} integers, got {value!r}")
    for v in value:
        if not isinstance(v, int) or isinstance(v, bool) or not minimum <= v < 2**53:
            raise StoreError(f"{where}: {what} must hold integers >= {minimum}, got {value!r}")
    return list(value)


def _obj(value: Any, what: str, where: object) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise StoreError(f"{where}: {what} must be an object, got {value!r}")
    return value


def parse_array_meta(meta: Any, where: object) -> dict[str, Any]:
    """Check a sharded array's ``zarr.json`` (types, ranges, dlpack's layout) and return the facts
    the reader needs; anything else is a StoreError naming the file. ``where`` is the array's
    folder or URL (for messages)."""
    where = f"{where}/zarr.json"
    meta = _obj(meta, "the metadata", where)
    if meta.get("zarr_format") != 3 or meta.get("node_type") != "array":
        raise StoreError(f"{where}: not Zarr v3 array metadata")
    shape = _ints(meta.get("shape"), "shape", where, 0)
    try:
        dtype = np.dtype(meta.get("data_type"))
    except (TypeError, ValueError) as exc:
        raise StoreError(f"{where}: data_type {meta.get('data_type')!r} is not a NumPy dtype") from exc
    if dtype.kind not in "biuf" or dtype.hasobject:
        raise StoreError(f"{where}: data_type {meta.get('data_type')!r} is not a plain numeric type")
    grid = _obj(meta.get("chunk_grid"), "chunk_grid", where)
    if grid.get("name") != "regular":
        raise StoreError(f"{where}: only a regular chunk grid is supported")
    shard_shape = _ints(
        _obj(grid.get("configuration"), "chunk_grid configuration", where).get("chunk_shape"), "chunk_shape", where, 1
    )
    codecs = meta.get("codecs")
    if not isinstance(codecs, list) or len(codecs) != 1 or not isinstance(codecs[0], dict):
        raise StoreError(f"{where}: expected one sharding_indexed codec, found {codecs!r}")
    if codecs[0].get("name") != "sharding_indexed":
        raise StoreError(f"{where}: expected one sharding_indexed codec, found {codecs[0].get('name')!r}")
    conf = _obj(codecs[0].get("configuration"), "sharding configuration", where)
    inner = _ints(conf.get("chunk_shape"), "inner chunk_shape", where, 1)
    if not (len(shard_shape) == len(inner) == len(shape)):
        raise StoreError(f"{where}: shape, shard shape and chunk shape have different lengths")
    if shard_shape[1:] != shape[1:] or inner[1:] != shape[1:]:
        raise StoreError(f"{where}: only arrays sharded and chunked along the first axis are supported")
    if shard_shape[0] % inner[0]:
        raise StoreError(f"{where}: the shard length {shard_shape[0]} is not a multiple of the chunk length {inner[0]}")
    if conf.get("index_location", "end") != "end":
        raise StoreError(f"{where}: shard index at the start is not supported")
    inner_codecs = conf.get("codecs")
    if not isinstance(inner_codecs, list) or not all(
        isinstance(c, dict) and isinstance(c.get("name"), str) for c in inner_codecs
    ):
        raise StoreError(f"{where}: the inner codecs must be a list of named codecs, got {inner_codecs!r}")
    cke = _obj(meta.get("chunk_key_encoding", {"name": "default"}), "chunk_key_encoding", where)
    if cke.get("name") != "default":
        raise StoreError(f"{where}: chunk key encoding {cke.get('name')!r} is not supported (dlpack writes 'default')")
    sep = _obj(cke.get("configuration", {}), "chunk_key_encoding configuration", where).get("separator", "/")
    if sep not in ("/", "."):  # anything else could name a file outside the array's folder
        raise StoreError(f"{where}: chunk key separator must be '/' or '.', got {sep!r}")
    chunk_nbytes = math.prod(inner) * dtype.itemsize
    if chunk_nbytes > (_MAX_CHUNK if inner[0] == 1 else _MAX_MULTIROW_CHUNK):
        raise StoreError(
            f"{where}: an inner chunk of {inner} {dtype} ({chunk_nbytes} bytes) is larger than dlpack reads"
        )
    cps = shard_shape[0] // inner[0]
    if cps * 16 + 4 > 2**40:
        raise StoreError(f"{where}: a shard of {cps} chunks would need an index larger than any file")
    return {
        "shape": tuple(shape), "dtype": dtype.newbyteorder("<"), "chunk_len": inner[0], "chunks_per_shard": cps,
        "chunk_nbytes": chunk_nbytes, "codecs": inner_codecs, "sep": sep,
    }  # fmt: skip


def shard_key(s: int, sep: str, ndim: int) -> str:
    """The key of shard ``s`` of an array of ``ndim`` dimensions sharded along axis 0 only, relative
    to the array's folder (default chunk keys: ``c/S/0/0`` with separator ``/``)."""
    return sep.join(["c", str(s), *("0" for _ in range(ndim - 1))])


def parse_shard_index(tail: bytes | np.ndarray | mmap.mmap, chunks: int, size: int, where: object) -> np.ndarray:
    """The ``(offset, nbytes)`` table of a shard of ``size`` bytes from its last ``16 * chunks + 4``
    bytes (``tail``), checked: its CRC-32C, and every entry inside the shard's data."""
    table = 16 * chunks
    if size < table + 4 or len(tail) != table + 4:
        raise StoreError(f"shard {where} is truncated ({size} bytes)")
    view = np.frombuffer(tail, dtype=np.uint8)
    if crc32c(view[:table]) != int.from_bytes(view[table:].tobytes(), "little"):
        raise StoreError(
            f"shard {where} is corrupt or truncated (its index checksum does not match); rebuild the store"
        )
    part = view[:table].view("<u8").reshape(-1, 2).astype(np.uint64)
    ok = part[:, 0] != _MISSING
    end = np.uint64(size - table - 4)
    off, nb = part[ok, 0], part[ok, 1]
    if np.any(off > end) or np.any(nb > end - np.minimum(off, end)):  # no uint64 wrap-around
        raise StoreError(f"shard {where} is corrupt: its index points past the data")
    return part


def check_ratio(nb: int | np.ndarray, chunk_nbytes: int, where: object) -> None:
    """A compressed chunk must not claim to decode to far more than it could (a bound on memory)."""
    if np.any(np.maximum(_RATIO_FLOOR, np.asarray(nb, dtype=np.float64) * _MAX_RATIO) < chunk_nbytes):
        raise StoreError(
            f"{where}: a compressed chunk would decode to {chunk_nbytes} bytes, more than "
            f"{_MAX_RATIO} times its stored size; the store is damaged"
        )


def decode_chunk_into(raw: np.ndarray, out: np.ndarray, decoder: Any, chunk_nbytes: int, what: str) -> None:
    """Chunk bytes ``raw`` (uint8) into ``out`` (one chunk, C-contiguous): copied when stored raw
    (``decoder`` None), else decompressed; a damaged chunk is a StoreError naming ``what``."""
    if decoder is None:
        if len(raw) != chunk_nbytes:
            raise StoreError(f"{what} has {len(raw)} bytes, expected {chunk_nbytes}")
        out[...] = raw.view(out.dtype).reshape(out.shape)
        return
    try:
        decoder.decode(raw, out=out.reshape(-1).view(np.uint8))
    except Exception as exc:  # codec errors come in many types; all mean a damaged chunk
        raise StoreError(f"{what} cannot be decompressed: {exc}") from exc


def crc32c(data: bytes | np.ndarray) -> int:
    import google_crc32c  # a dependency of dlpack itself (pyproject.toml)

    return int(google_crc32c.value(bytes(data)))


def decoder_for(codecs: list[dict[str, Any]], where: object) -> Any:
    """A numcodecs codec for the inner chunks' bytes-to-bytes codec, or None for raw bytes."""
    for c in codecs:
        conf = c.get("configuration") or {}
        if not isinstance(conf, dict):
            raise StoreError(f"{where}: codec {c.get('name')!r} has a configuration that is not an object")
        if c["name"] == "bytes" and conf.get("endian", "little") != "little":
            raise StoreError(f"{where}: big-endian chunks are not supported (dlpack writes little-endian)")
    extra = [c for c in codecs if c["name"] != "bytes"]
    if not extra:
        return None
    if len(extra) > 1:
        raise StoreError(f"{where}: unsupported codec chain {[c['name'] for c in codecs]}")
    name = extra[0]["name"]
    import numcodecs  # zarr's own dependency; only needed for compressed stores

    if name == "blosc":
        return numcodecs.Blosc()
    if name == "zstd":
        return numcodecs.Zstd()
    raise StoreError(f"{where}: unsupported codec {name!r}; rebuild the store with compression none, lz4 or zstd")


class ShardedArray:
    """Read-only view of one sharded Zarr v3 array whose chunk grid is sharded along axis 0 only.

    Chunk ``c`` (inner chunks counted along axis 0) lives in shard ``c // chunks_per_shard`` at
    position ``c % chunks_per_shard``. Maps are opened lazily and kept for the reader's life:
    re-mapping per epoch costs more than half the throughput.
    """

    def __init__(
        self, path: Path, strict: bool = False, meta: Any = None, dir_fd: int | None = None, arena: Arena | None = None
    ) -> None:
        self.path = path
        self.strict = strict
        #: Where the shards are mapped when the arena has room (the store's arrays of the same rows).
        self._arena = arena
        #: A handle on the array's folder: shard files are opened through it, so they come from the
        #: folder whose zarr.json was read even if the store is replaced meanwhile (POSIX).
        self._dir_fd = dir_fd
        if meta is None:
            try:
                meta = json.loads(read_regular(path / "zarr.json", follow_symlinks=False))
            except (OSError, ValueError, RecursionError) as exc:
                raise StoreError(f"cannot read array metadata {path / 'zarr.json'}: {exc}") from exc
        facts = parse_array_meta(meta, path)
        self.shape: tuple[int, ...] = facts["shape"]
        self.dtype: np.dtype[Any] = facts["dtype"]
        self.chunk_len: int = facts["chunk_len"]
        self.chunks_per_shard: int = facts["chunks_per_shard"]
        self.chunk_shape = (self.chunk_len, *self.shape[1:])
        self.chunk_nbytes: int = facts["chunk_nbytes"]
        self.shard_rows = self.chunk_len * self.chunks_per_shard
        self.n_chunks = -(-self.shape[0] // self.chunk_len) if self.shape[0] else 0
        self.n_shards = -(-self.n_chunks // self.chunks_per_shard) if self.n_chunks else 0
        self.decoder = decoder_for(facts["codecs"], path)
        self._sep: str = facts["sep"]
        # Filled as shards are mapped (a dict: its size follows the files found, not the metadata's claim).
        self._maps: dict[int, mmap.mmap | np.ndarray] = {}
        #: Per mapped shard: (device, inode, size) of the file mapped, to tell when it shrinks under the map.
        self._mapped: dict[int, tuple[int, int, int, str]] = {}  # device, inode, size, path
        self._shrunk: StoreError | None = None
        #: Per mapped shard whose file is watched (:mod:`._watch`): its watch; a shard not here is
        #: looked at by ``stat`` before every read. The process that made the watches, or -1.
        self._watches: dict[int, tuple[int, int]] = {}
        self._watch_ids: frozenset[int] = frozenset()
        self._watch_pid = -1
        self._index: np.ndarray | None = None  # [n_chunks, 2] uint64: (offset, nbytes) within its shard
        self._views: list[np.ndarray | None] | None = None

    def shard_key(self, s: int) -> str:
        """The key of shard ``s``, relative to the array's folder."""
        return shard_key(s, self._sep, len(self.shape))

    def shard_file(self, s: int) -> Path:
        """The file of shard ``s``."""
        return self.path / self.shard_key(s)

    def _open(self, s: int) -> int | None:
        """A descriptor of shard ``s``'s file, or None where it is absent (non-strict)."""
        try:
            # A regular file only (a named pipe would block forever), never through a link:
            # dlpack writes none (shards an update shares with the store before are hard links).
            if self._dir_fd is not None:
                return open_regular(self.shard_key(s), dir_fd=self._dir_fd, follow_symlinks=False)
            return open_regular(self.shard_file(s), follow_symlinks=False)
        except FileNotFoundError:
            if self.strict:  # dlpack writes every shard, so a missing one means damage (or a replaced store)
                raise StoreError(
                    f"shard file {self.shard_file(s)} is missing; the store is damaged or was replaced"
                ) from None
            return None  # an absent shard holds only fill values
        except (OSError, ValueError) as exc:
            raise StoreError(f"cannot map shard {self.shard_file(s)}: {exc}") from exc

    def _size(self, s: int, fd: int) -> int:
        try:
            size = os.fstat(fd).st_size
        except OSError as exc:
            raise StoreError(f"cannot map shard {self.shard_file(s)}: {exc}") from exc
        if not size:
            raise StoreError(f"cannot map shard {self.shard_file(s)}: the file is empty")
        return size

    def _map_shards(self) -> None:
        """Map every shard, in one gap-free address range where the platform allows (see
        :mod:`dlpack._maps`: scattered maps let the loader's batch blocks land between them), else
        one ``mmap`` each. One descriptor is open at a time (a store may have more shards than a
        process may open files): the sizes are read first, then each file is opened again and mapped."""
        sizes: dict[int, int] = {}
        for s in range(self.n_shards):  # each shard must exist (strict) before the next is looked at
            fd = self._open(s)
            if fd is not None:
                try:
                    sizes[s] = self._size(s, fd)
                finally:
                    os.close(fd)
        shards = list(sizes)

        def reopen(k: int) -> int:
            s = shards[k]
            fd = self._open(s)
            if fd is None or self._size(s, fd) != sizes[s]:
                if fd is not None:
                    os.close(fd)
                raise StoreError(f"shard {self.shard_file(s)} changed while the store was being opened; open it again")
            st = os.fstat(fd)
            path = os.fspath(self.shard_file(s))
            self._mapped[s] = (st.st_dev, st.st_ino, sizes[s], path)
            self._watch(s, path)
            return fd

        # Each shard starts a whole number of rows after the first, so that one take gathers whole
        # rows across shards (RowSpan) rather than page-sized pieces of them.
        row = math.prod(self.shape[1:]) * self.dtype.itemsize
        align = row if row > 0 and math.lcm(row, mmap.PAGESIZE) <= _MAX_ALIGN else 1
        try:
            together = map_consecutive([sizes[s] for s in shards], reopen, align, self._arena)
        except StoreError:
            raise  # a shard missing or changed (StoreError is an OSError too): mapping again would not help
        except OSError:
            together = None  # no range that large in one piece: the shards may still fit one by one
        if together is not None:
            self._maps = dict(zip(shards, together, strict=True))
            return
        for k, s in enumerate(shards):
            fd = reopen(k)
            try:
                self._maps[s] = one = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
                huge_pages(one)
            except (OSError, ValueError) as exc:
                raise StoreError(f"cannot map shard {self.shard_file(s)}: {exc}") from exc
            finally:
                os.close(fd)

    def _watch(self, s: int, path: str) -> None:
        """Watch shard ``s``'s file once it is mapped, where the path still names the file mapped at
        the size mapped (else it was replaced meanwhile: it is looked at by ``stat`` every time)."""
        token = WATCH.watch(path)
        if token is None:
            return
        dev, ino, size, _ = self._mapped[s]
        try:
            st = os.stat(path)
            same = (st.st_dev, st.st_ino, st.st_size) == (dev, ino, size)
        except OSError:
            same = False
        if not same or (self._watch_pid not in (-1, token[0])):
            WATCH.unwatch(token)
            return
        self._watch_pid = token[0]
        self._watches[s] = token
        self._watch_ids = frozenset(wd for _, wd in self._watches.values())

    def unchanged(self) -> bool:
        """Whether no mapped shard's file can have changed since it was mapped: every one is watched
        and none had an event (one non-blocking read of the process's inotify queue)."""
        return ShardedArray.all_unchanged((self,))

    @staticmethod
    def all_unchanged(arrays: Sequence[ShardedArray]) -> bool:
        """:meth:`unchanged` of every one of ``arrays`` in one read of the inotify queue (a batch of
        cached views reads the originals and K variant arrays: one system call, not K + 1)."""
        pid = None
        for a in arrays:
            if len(a._watches) != len(a._mapped) or not a._watches or pid not in (None, a._watch_pid):
                return False
            pid = a._watch_pid
        changed = WATCH.changed(pid) if pid is not None else None
        return changed is not None and (not changed or all(a._watch_ids.isdisjoint(changed) for a in arrays))

    def check_shards(self, shards: Any) -> None:
        """Refuse to read shards whose file shrank under its map (rewritten in place by another program).

        A page of a map beyond the file's current end is not data: touching it kills the process
        with SIGBUS, which Python cannot catch. So before rows are copied out of the maps, each
        shard they lie in is looked at (a ``stat``, about a microsecond): the same file (inode), now
        shorter than mapped, is a :class:`StoreError` naming it, now and for every read after. A file
        renamed over the shard's name is another file: the map still holds the old one, whole.
        """
        if self._shrunk is not None:
            raise self._shrunk
        if self.unchanged():
            return
        for s in shards:
            mapped = self._mapped.get(s)
            if mapped is None:
                continue
            try:
                st = os.stat(mapped[3])  # the path kept as text: building it per batch costs more than the stat
            except OSError:
                continue  # moved away or removed: the map keeps the file it was made of
            if (st.st_dev, st.st_ino) == mapped[:2] and st.st_size < mapped[2]:
                self._shrunk = StoreError(
                    f"shard {self.shard_file(s)} shrank from {mapped[2]} to {st.st_size} bytes while the store "
                    "was open (another program rewrote it in place); reading it would crash the process; "
                    "open the store again once it is complete, or rebuild it"
                )
                raise self._shrunk

    def check_rows(self, idx: np.ndarray) -> None:
        """:meth:`check_shards` for the shards that rows ``idx`` (int64) lie in."""
        if self.unchanged() and self._shrunk is None:
            return
        if self.n_shards <= 1:
            self.check_shards(self._mapped)
        elif len(idx):
            self.check_shards(np.flatnonzero(np.bincount(idx // self.shard_rows, minlength=self.n_shards)).tolist())

    def map_all(self) -> None:
        """Map every shard now (through the folder handle), then let the handle go: what this array
        reads afterwards cannot change when the store is replaced. Checks the index of each."""
        try:
            _ = self.index
        finally:
            self._dir_fd = None

    @property
    def index(self) -> np.ndarray:
        """Every chunk's (offset, nbytes) in its shard, read from the shard tails once."""
        if self._index is None:
            table = 16 * self.chunks_per_shard
            parts: list[np.ndarray] = []
            on_disk = 0
            if not self._maps:
                self._map_shards()
            for s in range(self.n_shards):
                m = self._maps.get(s)
                if m is None:
                    parts.append(np.full((self.chunks_per_shard, 2), _MISSING, dtype=np.uint64))
                    continue
                on_disk += len(m)
                tail = m[max(0, len(m) - table - 4) :]
                part = parse_shard_index(tail, self.chunks_per_shard, len(m), self.shard_file(s))
                parts.append(part)
            idx = np.concatenate(parts)[: self.n_chunks] if parts else np.empty((0, 2), dtype=np.uint64)
            if self.strict and bool(np.any(idx[:, 0] == _MISSING)):
                c = int(np.flatnonzero(idx[:, 0] == _MISSING)[0])
                raise StoreError(f"chunk {c} of {self.path} is missing from its shard; the store is damaged")
            if self.decoder is None and self.strict and bool(np.any(idx[:, 1] != self.chunk_nbytes)):
                raise StoreError(
                    f"{self.path}: an uncompressed chunk is not {self.chunk_nbytes} bytes; the store is damaged"
                )
            self._index = idx
        return self._index

    def _check_ratio(self, nb: int | np.ndarray) -> None:
        check_ratio(nb, self.chunk_nbytes, self.path)

    def shard_views(self) -> list[np.ndarray | None]:
        """Per shard, an array view of its chunks when they are stored raw and in order (as dlpack
        writes them), so reading chunk ``j`` of shard ``s`` is ``views[s][j]``; else None."""
        if self._views is None:
            views: list[np.ndarray | None] = []
            idx, per = self.index, self.chunks_per_shard
            for s in range(self.n_shards):
                part = idx[s * per : (s + 1) * per]
                m = self._maps.get(s)
                regular = (
                    self.decoder is None
                    and m is not None
                    and bool(np.all(part[:, 1] == self.chunk_nbytes))
                    and bool(np.all(part[:, 0] == np.arange(len(part), dtype=np.uint64) * np.uint64(self.chunk_nbytes)))
                )
                if regular:
                    arr = np.frombuffer(m, dtype=self.dtype, count=len(part) * self.chunk_nbytes // self.dtype.itemsize)  # type: ignore[arg-type]
                    views.append(arr.reshape(len(part) * self.chunk_len, *self.shape[1:]))
                else:
                    views.append(None)
            self._views = views
        return self._views

    def chunk_into(self, c: int, out: np.ndarray) -> None:
        """Decode chunk ``c`` into ``out`` (shape ``chunk_shape``, C-contiguous)."""
        off, nb = self.index[c]
        if off == _MISSING:
            out[...] = 0
            return
        m = self._maps[c // self.chunks_per_shard]
        raw = np.frombuffer(m, dtype=np.uint8, count=int(nb), offset=int(off))
        if self.decoder is not None:
            self._check_ratio(int(nb))
        decode_chunk_into(raw, out, self.decoder, self.chunk_nbytes, f"chunk {c} of {self.path}")

    def chunk(self, c: int) -> np.ndarray:
        """Chunk ``c`` as a new array; the last chunk is trimmed to the array's length."""
        out = np.empty(self.chunk_shape, dtype=self.dtype)
        self.chunk_into(c, out)
        end = min(self.chunk_len, self.shape[0] - c * self.chunk_len)
        return out[:end] if end < self.chunk_len else out

    def read_rows(self, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` along axis 0 as a new array."""
        if not 0 <= start <= stop <= self.shape[0]:
            raise StoreError(
                f"rows {start}:{stop} are outside {self.path} of {self.shape[0]} rows; the store is damaged"
            )
        views, rps = self.shard_views(), self.shard_rows
        if stop > start:
            self.check_shards(range(start // rps, (stop - 1) // rps + 1))
        if self.decoder is not None and stop > start:  # bound the allocation by what the chunks can hold
            self._check_ratio(self.index[start // self.chunk_len : -(-stop // self.chunk_len), 1])
        out = np.empty((stop - start, *self.shape[1:]), dtype=self.dtype)
        pos = start
        while pos < stop:
            view = views[pos // rps]
            if view is not None:
                base = (pos // rps) * rps
                take = min(stop, base + rps) - pos
                out[pos - start : pos - start + take] = view[pos - base : pos - base + take]
            else:
                c = pos // self.chunk_len
                base = c * self.chunk_len
                take = min(stop, base + self.chunk_len) - pos
                out[pos - start : pos - start + take] = self.chunk(c)[pos - base : pos - base + take]
            pos += take
        return out

    read_range = read_rows

    def read_into(self, positions: list[int], out: np.ndarray, rows: Sequence[int] | None = None) -> np.ndarray:
        """Gather rows ``positions`` into ``out[:len(positions)]`` (with ``rows``: row ``positions[k]``
        into ``out[rows[k]]``); rows must exist (caller-checked)."""
        views, rps = self.shard_views(), self.shard_rows
        self.check_rows(np.asarray(positions, dtype=np.int64))
        dest = range(len(positions)) if rows is None else rows
        # Sorted reads are sequential within shards when the page cache is cold, and cost nothing warm.
        for k in sorted(range(len(positions)), key=positions.__getitem__):
            i, r = positions[k], dest[k]
            view = views[i // rps]
            if view is not None:
                out[r] = view[i % rps]
            elif self.chunk_len == 1:
                self.chunk_into(i, out[r : r + 1])
            else:
                out[r] = self.chunk(i // self.chunk_len)[i % self.chunk_len]
        return out

    def row_source(self) -> tuple[list[np.ndarray], int] | None:
        """``(per-shard views, rows per shard)`` when every shard is stored raw and in order, else None."""
        views = self.shard_views()
        if any(v is None for v in views):
            return None
        return [v for v in views if v is not None], self.shard_rows

    def close(self) -> None:
        """Unmap every shard."""
        self._views = None
        for m in self._maps.values():
            if isinstance(m, mmap.mmap):  # an array of a consecutive range is unmapped with its last view
                try:
                    m.close()
                except BufferError:
                    pass  # a caller still holds a view; the map goes when it does
        self._maps = {}
        self._mapped = {}
        for token in self._watches.values():
            WATCH.unwatch(token)
        self._watches, self._watch_ids, self._watch_pid = {}, frozenset(), -1
        self._index = None

    def warm(self) -> None:
        """Read the index and map every shard now, so the first batch pays no setup."""
        self.shard_views()

    def nbytes_on_disk(self) -> int:
        """Bytes of every shard file."""
        if len(self._maps) == self.n_shards:
            return sum(len(m) for m in self._maps.values())
        return sum(os.path.getsize(self.shard_file(s)) for s in range(self.n_shards) if self.shard_file(s).exists())
