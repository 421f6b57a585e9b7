"""Reading a Zarr store at an object-store location (``s3://bucket/x.zarr``), and the routing of
a store's location to its reader.

The rules are the local reader's (:mod:`dlpack.backends._zarr`, :mod:`dlpack.backends._shard`):
the manifest checked against the group marker's ``manifest_sha256`` and pinned, each array's
``zarr.json`` checked against the digest the manifest lists, the same shard index and chunk
decoders. What differs is how bytes arrive:

- Opening costs two requests (the group's ``zarr.json`` and ``manifest.json``), and one more per
  array at its first use (its ``zarr.json``), never one per shard. The index of a raw (uncompressed)
  shard as dlpack writes it is computed (chunk ``j`` at ``j * chunk_nbytes``, chunks past the
  array's end missing) and checked against the shard's own index and CRC-32C whenever the shard is
  fetched whole, and against its size at first touch; a compressed shard's index is fetched by one
  ranged GET of its tail at first touch.
- Rows are read by ranged GETs (the rows of one shard coalesced), or from the
  :class:`~dlpack.storage.shardcache.ShardCache` when the shard is resident.
- Pinning: besides the manifest, the ETag of each shard object at its first touch; every later
  read of that shard carries ``If-Match``, so a shard rewritten while the store is open is a
  :func:`~dlpack.backends.base.changed_error`, never a mix of two versions' bytes.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from ..backends import BACKENDS, StoreReader, ZarrBackend
from ..backends import detect_backend as detect_local
from ..backends import open_reader as open_local
from ..backends._shard import (
    check_ratio,
    decode_chunk_into,
    decoder_for,
    parse_array_meta,
    parse_shard_index,
    shard_key,
)
from ..backends._zarr import MANIFEST, _json, array_digest_attr, is_sharded, manifest_of
from ..backends.base import Backend, Mode, changed_error, check_mode, register_remote
from ..errors import OptionError, StoreError, StoreNotFoundError
from ..manifest import Manifest
from .location import Location, is_url
from .objects import ConditionFailed, Storage, storage_for
from .shardcache import DEFAULT_CACHE_BYTES, DEFAULT_READAHEAD, ShardCache, store_id

__all__ = ["ObjectZarrReader", "detect_backend", "open_reader", "refuse_remote_hdf5"]

_MISSING = np.uint64(2**64 - 1)
#: Whole-shard fetches in flight (verify, prefetch): the loopback measurements saturate at 2-4.
DEFAULT_THREADS = 4
#: Ranges of one shard closer than this are read in one request.
_GAP = 2**16


def refuse_remote_hdf5(location: Location) -> None:
    """An HDF5 store is one local file: on a URL it is an OptionError saying what to do instead."""
    suffixes = {s for b in BACKENDS.values() if b.name != ZarrBackend.name for s in b.suffixes}
    if location.suffix in suffixes:
        raise OptionError(
            f"{location}: HDF5 stores are local files; build a .zarr store for object storage, "
            "or copy the .h5 file to local disk"
        )


def detect_backend(where: str | os.PathLike[str] | Location, storage_options: Any = None) -> type[Backend]:
    """The backend of the store at ``where``: a local path as :func:`dlpack.backends.detect_backend`
    does; a URL is a Zarr store (an HDF5 suffix is refused)."""
    if not is_url(where):
        if storage_options:
            Location.parse(where, storage_options)  # the OptionError for options with a local path
        return detect_local(where.url if isinstance(where, Location) else where)
    loc = Location.parse(where, storage_options)
    refuse_remote_hdf5(loc)
    return ZarrBackend


def open_reader(
    where: str | os.PathLike[str] | Location,
    mode: Mode = "r",
    *,
    storage_options: Mapping[str, object] | Iterable[str] | None = None,
    check_labels: bool = True,
    cache_bytes: int | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
) -> StoreReader:
    """A reader of the store at ``where``: a local path (exactly :func:`dlpack.backends.open_reader`)
    or an object-store URL or :class:`Location` (:class:`ObjectZarrReader`)."""
    if not is_url(where):
        detect_backend(where, storage_options)
        return open_local(where.url if isinstance(where, Location) else where, mode, check_labels=check_labels)
    loc = Location.parse(where, storage_options)
    refuse_remote_hdf5(loc)
    reader = ObjectZarrReader(loc, mode, cache_bytes=cache_bytes, cache_dir=cache_dir)
    reader.check_labels = check_labels
    return reader


class ObjectZarrReader(StoreReader):
    """Reads a dlpack Zarr store at an object-store location (see the module docstring).

    ``cache_bytes`` (default 1 GiB) bounds the whole shards kept in memory; ``cache_dir`` is a
    local folder the processes of one machine share shards through. Pickles without handles: the
    location (with its storage options), the manifest pin and the cache settings travel; each
    process makes its own client and memory cache.
    """

    streamed = True  # a shard costs about what one of its rows costs: read in shard runs, fetch ahead

    def __init__(
        self,
        location: Location,
        mode: Mode = "r",
        *,
        cache_bytes: int | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        threads: int = DEFAULT_THREADS,
    ) -> None:
        check_mode(mode, ("r",))
        super().__init__(".", mode)
        # Messages print the URL; nothing of the base class opens ``path`` as a file for this reader.
        self.path = location  # type: ignore[assignment]
        self.location = location
        self.storage: Storage = storage_for(location)
        self.cache_bytes = DEFAULT_CACHE_BYTES if cache_bytes is None else int(cache_bytes)
        self.cache_dir = cache_dir
        self.threads = max(1, int(threads))
        self.cache = ShardCache(self.cache_bytes, cache_dir, readahead=max(DEFAULT_READAHEAD, 2 * self.threads))
        endpoint = str(getattr(self.storage, "endpoint", ""))
        self.store_id = store_id(location.url, endpoint)
        self._manifest: Manifest | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        #: Whole-shard fetches queued or running (by array and shard): a read of such a shard waits
        #: for it instead of asking the server a second time.
        self._inflight: dict[tuple[str, int], Future[bytes]] = {}

    @property
    def manifest(self) -> Manifest:
        """The manifest, read once (two GETs), checked against the group marker and pinned."""
        if self._manifest is None:
            group = self._json_or_none("zarr.json")
            try:
                text: str | None = self.storage.get(MANIFEST).decode("utf-8")
            except StoreNotFoundError:
                text = None
            except UnicodeDecodeError as exc:
                raise StoreError(f"cannot read {self.storage.where(MANIFEST)}: {exc}") from exc
            self._manifest = manifest_of(group, text, self.location, self._pin_manifest)
        return self._manifest

    def _json_or_none(self, key: str) -> Any:
        try:
            raw = self.storage.get(key)
        except StoreNotFoundError:
            return None
        return _json(raw, self.storage.where(key))

    def _open_array(self, stored_name: str) -> RemoteArray:
        _ = self.manifest
        meta = self._json_or_none(f"{stored_name}/zarr.json")
        if meta is None:
            raise StoreError(
                f"store {self.location} has no array {stored_name!r} "
                f"(missing {self.storage.where(stored_name + '/zarr.json')})"
            )
        self.check_generation(stored_name, array_digest_attr(meta))
        if not is_sharded(meta):
            raise StoreError(
                f"array {stored_name!r} of {self.location} is not sharded; dlpack reads only sharded arrays "
                "from object storage (rebuild the store with this version)"
            )
        return RemoteArray(self, stored_name, meta)

    def pool(self) -> ThreadPoolExecutor:
        """The threads whole shards are fetched on (made at first use, never pickled)."""
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="dlpack-shards")
            return self._pool

    def prefetch(self, positions: Sequence[int] | np.ndarray) -> None:
        """Queue whole-shard fetches of the shards samples ``positions`` lie in, of every per-sample
        array opened so far that is read from its shards (not the small ones, read whole), at most
        ``threads`` in flight; what does not fit the resident set goes to the read-ahead buffer."""
        idx = np.unique(np.asarray(positions, dtype=np.int64).reshape(-1))
        if not len(idx):
            return
        for name, spec in self.arrays.items():
            acc = self._access.get(name)
            if spec.ragged or self._small(spec) or not isinstance(acc, RemoteArray):
                continue
            for s in np.unique(idx // acc.shard_rows).tolist():
                acc.prefetch_shard(int(s))

    def nbytes_on_disk(self) -> int:
        """Bytes of every object of the store (one listing)."""
        return sum(info.size for info in self.storage.list())

    def close(self) -> None:
        """Release what the arrays hold and the fetch threads (the memory cache stays)."""
        super().close()
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)  # outside the lock: a finishing fetch takes it to say it is done

    def __getstate__(self) -> dict[str, Any]:
        return {
            "location": self.location, "mode": self.mode, "pin": self.pin, "cache_bytes": self.cache_bytes,
            "cache_dir": self.cache_dir, "threads": self.threads, "check_labels": self.check_labels,
        }  # fmt: skip

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(  # type: ignore[misc]
            state["location"], state["mode"], cache_bytes=state["cache_bytes"], cache_dir=state["cache_dir"],
            threads=state["threads"],
        )  # fmt: skip
        self.pin_to(state.get("pin"))
        self.check_labels = state.get("check_labels", True)


#: Rows at least this large are copied out of a whole shard one by one (one copy each); smaller
#: ones by fancy indexing (a copy into a temporary, then into the batch), whose per-row cost is lower.
_ROW_LOOP_BYTES = 16384


class RemoteArray:
    """One sharded array of a remote store (an :class:`~dlpack.backends.base.ArrayAccess`)."""

    def __init__(self, reader: ObjectZarrReader, name: str, meta: Any) -> None:
        self.reader = reader
        self.name = name
        self.storage = reader.storage
        where = self.storage.where(name)
        facts = parse_array_meta(meta, where)
        self.where = where
        self.shape: tuple[int, ...] = facts["shape"]
        self.dtype: np.dtype[Any] = facts["dtype"]
        self.chunk_len: int = facts["chunk_len"]
        self.chunks_per_shard: int = facts["chunks_per_shard"]
        self.chunk_nbytes: int = facts["chunk_nbytes"]
        self.chunk_shape = (self.chunk_len, *self.shape[1:])
        self.shard_rows = self.chunk_len * self.chunks_per_shard
        self.n_chunks = -(-self.shape[0] // self.chunk_len) if self.shape[0] else 0
        self.n_shards = -(-self.n_chunks // self.chunks_per_shard) if self.n_chunks else 0
        self.decoder = decoder_for(facts["codecs"], where)
        self._sep: str = facts["sep"]
        self._row_items = int(np.prod(self.shape[1:], dtype=np.int64))
        #: Every row in one contiguous array once the whole (raw) array is resident, and the cache
        #: generation it was made in (see :meth:`row_source`).
        self._arena: np.ndarray | None = None
        self._arena_gen = -1
        self._ordered: dict[int, bool] = {}
        self._table = 16 * self.chunks_per_shard + 4
        #: Per shard touched: the ETag and size of the object first read (the pin), and its index.
        self._etags: dict[int, str] = {}
        self._sizes: dict[int, int] = {}
        self._index: dict[int, np.ndarray] = {}
        self._listed = False
        self._lock = threading.Lock()

    # ---------------------------------------------------------------- shards

    def key(self, s: int) -> str:
        """The object key of shard ``s`` (relative to the store)."""
        return f"{self.name}/{shard_key(s, self._sep, len(self.shape))}"

    def _chunks_in(self, s: int) -> int:
        return max(0, min(self.chunks_per_shard, self.n_chunks - s * self.chunks_per_shard))

    def _computed(self, s: int) -> np.ndarray:
        """The index dlpack writes into a raw shard: chunk ``j`` at ``j * chunk_nbytes``."""
        part = np.full((self.chunks_per_shard, 2), _MISSING, dtype=np.uint64)
        n = self._chunks_in(s)
        part[:n, 0] = np.arange(n, dtype=np.uint64) * np.uint64(self.chunk_nbytes)
        part[:n, 1] = self.chunk_nbytes
        return part

    def _raw_size(self, s: int) -> int:
        return int(self._chunks_in(s) * self.chunk_nbytes + self._table)

    def _pin(self, s: int, etag: str, size: int) -> None:
        with self._lock:
            old = self._etags.get(s)
            if old is not None and old != etag:
                raise changed_error(self.reader.location, f"shard {self.storage.where(self.key(s))} was rewritten")
            self._etags[s], self._sizes[s] = etag, size

    def _list(self) -> None:
        """Pin every shard's ETag and size from one listing (what a disk cache needs to name a
        shard before reading it)."""
        if self._listed:
            return
        found = {info.key: info for info in self.storage.list(self.name + "/c")}
        for s in range(self.n_shards):
            info = found.get(self.key(s))
            if info is not None:
                self._pin(s, info.etag, info.size)
        self._listed = True

    def _fetch(self, s: int, start: int | None = None, stop: int | None = None) -> bytes:
        key = self.key(s)
        try:
            data, info = self.storage.fetch(key, start, stop, if_match=self._etags.get(s))
        except ConditionFailed:
            raise changed_error(self.reader.location, f"shard {self.storage.where(key)} was rewritten") from None
        except StoreNotFoundError:
            raise StoreError(
                f"shard {self.storage.where(key)} is missing; the store is damaged or was replaced"
            ) from None
        self._pin(s, info.etag, info.size)
        return data

    def _checked(self, s: int, part: np.ndarray) -> np.ndarray:
        """The strict checks of a shard's index that the local reader makes."""
        n = self._chunks_in(s)
        if bool(np.any(part[:n, 0] == _MISSING)):
            c = s * self.chunks_per_shard + int(np.flatnonzero(part[:n, 0] == _MISSING)[0])
            raise StoreError(f"chunk {c} of {self.where} is missing from its shard; the store is damaged")
        if self.decoder is None and bool(np.any(part[:n, 1] != self.chunk_nbytes)):
            raise StoreError(
                f"{self.where}: an uncompressed chunk is not {self.chunk_nbytes} bytes; the store is damaged"
            )
        return part

    def _cache_key(self, s: int) -> tuple[str, str, int, str] | None:
        if s not in self._etags and self.reader.cache.folder is not None:
            self._list()
        etag = self._etags.get(s)
        return None if etag is None else (self.reader.store_id, self.name, s, etag)

    def whole(self, s: int, *, ahead: bool = False, look: bool = True) -> bytes:
        """Shard ``s`` whole, from the cache (unless the caller just looked: ``look`` False) or
        fetched and offered to the cache. Its index is checked against its CRC-32C tail and kept:
        ranged reads of the shard use it from then on, also where it is not the computed one (a
        raw shard zarr-python wrote in another order)."""
        ck = self._cache_key(s) if look else None
        data = self.reader.cache.get(ck, self._sizes.get(s)) if ck is not None else None
        fetched = data is None
        if data is None:
            data = self._fetch(s)
        self._index[s] = self._checked(
            s, parse_shard_index(data[-self._table :], self.chunks_per_shard, len(data), self.where)
        )
        if fetched:
            ck = self._cache_key(s)
            if ck is not None:
                self.reader.cache.offer(ck, data, ahead=ahead)
        return data

    def prefetch_shard(self, s: int) -> None:
        """Queue a whole fetch of shard ``s`` unless it is in memory or on its way."""
        if not 0 <= s < self.n_shards or (self._arena is not None and self._arena_gen == self.reader.cache.generation):
            return
        ck = self._cache_key(s)
        if ck is not None and self.reader.cache.resident(ck):
            return
        job = (self.name, s)
        reader = self.reader
        pool = reader.pool()
        with reader._pool_lock:
            if job in reader._inflight:
                return
            fut = pool.submit(self.whole, s, ahead=True)
            reader._inflight[job] = fut

        def done(_: Future[bytes]) -> None:
            # The shard is in the cache by now (whole() offers it before it returns), or the read
            # that wanted it raises the fetch's error itself.
            with reader._pool_lock:
                if reader._inflight.get(job) is fut:
                    del reader._inflight[job]

        fut.add_done_callback(done)

    def _on_its_way(self, s: int) -> Future[bytes] | None:
        with self.reader._pool_lock:
            return self.reader._inflight.get((self.name, s))

    def _index_of(self, s: int) -> np.ndarray:
        """Shard ``s``'s index for ranged reads: computed for a raw shard of the size dlpack writes,
        else read from the shard's tail by one ranged GET."""
        part = self._index.get(s)
        if part is not None:
            return part
        size = self._sizes.get(s)
        if self.decoder is None and (size is None or size == self._raw_size(s)):
            return self._computed(s)
        tail = self._fetch(s, -self._table)
        part = self._checked(s, parse_shard_index(tail, self.chunks_per_shard, self._sizes[s], self.where))
        self._index[s] = part
        return part

    def _chunk_bytes(self, s: int, chunks: list[int], data: bytes | None) -> dict[int, np.ndarray]:
        """The stored bytes of chunks ``chunks`` (numbers within shard ``s``), from ``data`` (the
        whole shard) or by ranged reads, neighbours merged into one request."""
        part = self._index_of(s) if data is None else self._index[s]
        for j in chunks:
            if part[j, 0] == _MISSING:
                c = s * self.chunks_per_shard + j
                raise StoreError(f"chunk {c} of {self.where} is missing from its shard; the store is damaged")
        if self.decoder is not None:
            check_ratio(part[chunks, 1], self.chunk_nbytes, self.where)
        if data is not None:
            buf = np.frombuffer(data, dtype=np.uint8)
            return {j: buf[int(part[j, 0]) : int(part[j, 0] + part[j, 1])] for j in chunks}
        spans = sorted((int(part[j, 0]), int(part[j, 0] + part[j, 1]), j) for j in chunks)
        runs: list[list[tuple[int, int, int]]] = []
        for span in spans:
            if runs and span[0] - runs[-1][-1][1] <= _GAP:
                runs[-1].append(span)
            else:
                runs.append([span])
        out: dict[int, np.ndarray] = {}
        guessed = s not in self._index  # the computed index of a raw shard, not yet checked against its size
        for k, run in enumerate(runs):
            lo, hi = run[0][0], max(b for _, b, _ in run)
            buf = np.frombuffer(self._fetch(s, lo, hi), dtype=np.uint8)
            if k == 0 and guessed and self._sizes[s] != self._raw_size(s):
                return self._chunk_bytes(s, chunks, None)  # not the size dlpack writes: read its own index
            for a, b, j in run:
                out[j] = buf[a - lo : b - lo]
        return out

    def _shard_into(self, s: int, rows: list[int], dest: list[int], out: np.ndarray, data: bytes | None) -> None:
        """Rows ``rows`` (within shard ``s``) into ``out[dest[k]]``."""
        per = self.chunk_len
        if data is not None and self.decoder is None and self._in_order(s):
            # A whole raw shard whose chunks are its rows in order: one vectorised gather.
            n = self._chunks_in(s) * per
            view = np.frombuffer(data, dtype=self.dtype, count=n * self._row_items).reshape(n, *self.shape[1:])
            if self._row_items * self.dtype.itemsize >= _ROW_LOOP_BYTES:
                for r, d in zip(rows, dest, strict=True):  # one copy per row (fancy indexing makes two)
                    out[d] = view[r]
            else:
                out[dest] = view[rows]
            return
        chunks = sorted({r // per for r in rows})
        got = self._chunk_bytes(s, chunks, data)
        base = s * self.chunks_per_shard
        if per == 1:
            for r, d in zip(rows, dest, strict=True):
                decode_chunk_into(got[r], out[d : d + 1], self.decoder, self.chunk_nbytes, self._what(base + r))
            return
        decoded: dict[int, np.ndarray] = {}
        for j in chunks:
            buf = np.empty(self.chunk_shape, dtype=self.dtype)
            decode_chunk_into(got[j], buf, self.decoder, self.chunk_nbytes, self._what(base + j))
            decoded[j] = buf
        for r, d in zip(rows, dest, strict=True):
            out[d] = decoded[r // per][r % per]

    def _in_order(self, s: int) -> bool:
        """Whether shard ``s``'s (checked) index is the one dlpack writes: chunk j at j * chunk_nbytes."""
        known = self._ordered.get(s)
        if known is None:
            part = self._index.get(s)
            if part is None:
                return False
            known = self._ordered[s] = bool(np.array_equal(part, self._computed(s)))
        return known

    def _what(self, c: int) -> str:
        return f"chunk {c} of {self.where}"

    def read_into(self, positions: list[int], out: np.ndarray, rows: Sequence[int] | None = None) -> np.ndarray:
        """Rows ``positions`` into ``out`` (row k, or ``rows[k]``): shard by shard, each from the
        cache, fetched whole (when most of it is wanted, or the cache has room), or by ranged reads."""
        arena = self._arena
        if arena is not None and self._arena_gen == self.reader.cache.generation:  # warm: every row here
            if rows is None:
                np.take(arena, positions, axis=0, out=out[: len(positions)])
            else:
                out[np.asarray(rows, dtype=np.int64)] = arena[np.asarray(positions, dtype=np.int64)]
            return out
        dest = list(range(len(positions))) if rows is None else list(rows)
        groups: dict[int, tuple[list[int], list[int]]] = {}
        rps = self.shard_rows
        for p, d in zip(positions, dest, strict=True):
            g = groups.setdefault(p // rps, ([], []))
            g[0].append(p % rps)
            g[1].append(d)
        cache = self.reader.cache
        whole: dict[int, bytes] = {}
        want = []
        for s, (rs, _) in groups.items():
            ck = self._cache_key(s)
            data = cache.get(ck, self._sizes.get(s)) if ck is not None else None
            if data is not None:
                whole[s] = data
                if s not in self._index:
                    self._index[s] = self._checked(
                        s, parse_shard_index(data[-self._table :], self.chunks_per_shard, len(data), self.where)
                    )
                continue
            fut = self._on_its_way(s)
            if fut is not None:
                whole[s] = fut.result()  # fetched ahead: wait for it rather than fetch it twice
                continue
            if ck is None:
                cache.stats["misses"] += 1  # first touch: no tag to look the shard up by yet
            size = self._sizes.get(s, self._raw_size(s))  # a compressed shard: at most the raw size
            if 2 * len(set(rs)) > self._chunks_in(s) * self.chunk_len or cache.has_room(size):
                want.append(s)
        if len(want) > 1:
            got = self.reader.pool().map(lambda s: self.whole(s, look=False), want)
            whole.update(zip(want, got, strict=True))
        elif want:
            whole[want[0]] = self.whole(want[0], look=False)
        for s, (rs, ds) in groups.items():
            self._shard_into(s, rs, ds, out, whole.get(s))
        return out

    def read_rows(self, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` as a new array."""
        if not 0 <= start <= stop <= self.shape[0]:
            raise StoreError(
                f"rows {start}:{stop} are outside {self.where} of {self.shape[0]} rows; the store is damaged"
            )
        out = np.empty((stop - start, *self.shape[1:]), dtype=self.dtype)
        return self.read_into(list(range(start, stop)), out)

    def views_token(self) -> tuple[int, int]:
        """Changes whenever :meth:`row_source` may answer differently (a shard admitted to the
        cache, the cache cleared): the reader asks again then, and keeps its plan otherwise."""
        cache = self.reader.cache
        return cache.generation, cache.stats["admitted"]

    def row_source(self) -> tuple[list[np.ndarray], int] | None:
        """``([all rows], rows)`` once every shard of a raw array is in the memory cache and a copy
        of it fits the cache's budget too (it is counted there): the rows are copied into one
        contiguous array, so a warm batch is one gather, as from a local store's maps. None before."""
        cache = self.reader.cache
        if self._arena is not None and self._arena_gen == cache.generation:
            return [self._arena], self.shape[0]
        self._arena = None
        if self.decoder is not None or not self.n_shards or not all(self._in_order(s) for s in range(self.n_shards)):
            return None
        keys = [self._cache_key(s) for s in range(self.n_shards)]
        if any(k is None for k in keys):
            return None
        datas = cache.reserve([k for k in keys if k is not None], self.shape[0] * self._row_items * self.dtype.itemsize)
        if datas is None:
            return None
        arena = np.empty(self.shape, dtype=self.dtype)
        at = 0
        for s, data in enumerate(datas):
            n = self._chunks_in(s) * self.chunk_len
            n = min(n, self.shape[0] - at)
            arena[at : at + n] = np.frombuffer(data, dtype=self.dtype, count=n * self._row_items).reshape(
                n, *self.shape[1:]
            )
            at += n
        self._arena, self._arena_gen = arena, cache.generation
        return [arena], self.shape[0]

    def warm(self) -> None:
        """Nothing to open ahead: shards are touched as they are read."""

    def close(self) -> None:
        """Nothing held open (the cache belongs to the reader)."""

    def nbytes_on_disk(self) -> int:
        """Bytes of the array's objects (one listing)."""
        return sum(info.size for info in self.storage.list(self.name + "/"))


register_remote("reader", lambda where, mode="r": ObjectZarrReader(Location.parse(where), mode))
