"""Direct reads of Zarr v3 sharded arrays through the shard index.

zarr-python costs 0.4-1 ms per ``array[i]`` call (docs/benchmarks.md); reading the shard file
ourselves through its index (the ``sharding_indexed`` codec: a table of little-endian uint64
``(offset, nbytes)`` pairs per inner chunk, at the end of each shard file, followed by a CRC32C)
costs one memory copy. The store stays standard: zarr-python and tensorstore read it too.
"""

from __future__ import annotations

import json
import mmap
import os
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import StoreError

__all__ = ["ShardedArray"]

_MISSING = np.uint64(2**64 - 1)


def crc32c(data: bytes) -> int:
    import google_crc32c  # a dependency of zarr itself

    return int(google_crc32c.value(bytes(data)))


def _decoder(codecs: list[dict[str, Any]], where: Path) -> Any:
    """A numcodecs codec for the inner chunks' bytes-to-bytes codec, or None for raw bytes."""
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

    def __init__(self, path: Path, strict: bool = False) -> None:
        self.path = path
        self.strict = strict
        try:
            meta = json.loads((path / "zarr.json").read_text())
        except (OSError, ValueError) as exc:
            raise StoreError(f"cannot read array metadata {path / 'zarr.json'}: {exc}") from exc
        self.shape = tuple(meta["shape"])
        self.dtype = np.dtype(meta["data_type"]).newbyteorder("<")
        codecs = meta["codecs"]
        if len(codecs) != 1 or codecs[0]["name"] != "sharding_indexed":
            raise StoreError(f"{path}: expected one sharding_indexed codec, found {[c['name'] for c in codecs]}")
        conf = codecs[0]["configuration"]
        shard_shape = meta["chunk_grid"]["configuration"]["chunk_shape"]
        inner = conf["chunk_shape"]
        if list(shard_shape[1:]) != list(self.shape[1:]) or list(inner[1:]) != list(self.shape[1:]):
            raise StoreError(f"{path}: only arrays sharded and chunked along the first axis are supported")
        if conf.get("index_location", "end") != "end":
            raise StoreError(f"{path}: shard index at the start is not supported")
        self.chunk_len = int(inner[0])
        self.chunks_per_shard = int(shard_shape[0]) // self.chunk_len
        self.chunk_shape = (self.chunk_len, *self.shape[1:])
        self.chunk_nbytes = int(np.prod(self.chunk_shape)) * self.dtype.itemsize
        self.rows_per_shard = self.chunk_len * self.chunks_per_shard
        self.n_chunks = -(-self.shape[0] // self.chunk_len) if self.shape[0] else 0
        self.n_shards = -(-self.n_chunks // self.chunks_per_shard) if self.n_chunks else 0
        self.decoder = _decoder(conf["codecs"], path)
        sep = meta["chunk_key_encoding"].get("configuration", {}).get("separator", "/")
        self._key_tail: str = sep.join("0" for _ in self.shape[1:])
        self._sep: str = str(sep)
        self._maps: list[mmap.mmap | None] = [None] * self.n_shards
        self._index: np.ndarray | None = None  # [n_chunks, 2] uint64: (offset, nbytes) within its shard
        self._views: list[np.ndarray | None] | None = None

    def shard_file(self, s: int) -> Path:
        """The file of shard ``s``."""
        key = self._sep.join(["c", str(s)] + ([self._key_tail] if self._key_tail else []))
        return self.path / key

    def _map(self, s: int) -> mmap.mmap | None:
        m = self._maps[s]
        if m is None:
            try:
                with open(self.shard_file(s), "rb") as f:
                    m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            except FileNotFoundError:
                if self.strict:  # dlpack writes every shard, so a missing one means damage
                    raise StoreError(f"shard file {self.shard_file(s)} is missing; rebuild the store") from None
                return None  # an absent shard holds only fill values
            except (OSError, ValueError) as exc:
                raise StoreError(f"cannot map shard {self.shard_file(s)}: {exc}") from exc
            self._maps[s] = m
        return m

    @property
    def index(self) -> np.ndarray:
        """Every chunk's (offset, nbytes) in its shard, read from the shard tails once."""
        if self._index is None:
            idx = np.full((self.n_shards * self.chunks_per_shard, 2), _MISSING, dtype=np.uint64)
            table = 16 * self.chunks_per_shard
            for s in range(self.n_shards):
                m = self._map(s)
                if m is None:
                    continue
                if len(m) < table + 4:
                    raise StoreError(f"shard {self.shard_file(s)} is truncated ({len(m)} bytes)")
                tail = m[len(m) - table - 4 :]
                if crc32c(tail[:table]) != int.from_bytes(tail[table:], "little"):
                    raise StoreError(
                        f"shard {self.shard_file(s)} is corrupt or truncated (its index checksum does not match); "
                        "rebuild the store"
                    )
                part = np.frombuffer(tail, dtype="<u8", count=2 * self.chunks_per_shard).reshape(-1, 2)
                ok = part[:, 0] != _MISSING
                end = np.uint64(len(m) - table - 4)
                off, nb = part[ok, 0], part[ok, 1]
                if np.any(off > end) or np.any(nb > end - np.minimum(off, end)):  # no uint64 wrap-around
                    raise StoreError(f"shard {self.shard_file(s)} is corrupt: its index points past the data")
                idx[s * self.chunks_per_shard : (s + 1) * self.chunks_per_shard] = part
            self._index = idx[: self.n_chunks]
        return self._index

    def shard_views(self) -> list[np.ndarray | None]:
        """Per shard, an array view of its chunks when they are stored raw and in order (as dlpack
        writes them), so reading chunk ``j`` of shard ``s`` is ``views[s][j]``; else None."""
        if self._views is None:
            views: list[np.ndarray | None] = []
            idx, per = self.index, self.chunks_per_shard
            for s in range(self.n_shards):
                part = idx[s * per : (s + 1) * per]
                m = self._maps[s]
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
        raw = np.frombuffer(m, dtype=np.uint8, count=int(nb), offset=int(off))  # type: ignore[arg-type]
        if self.decoder is None:
            if nb != self.chunk_nbytes:
                raise StoreError(f"chunk {c} of {self.path} has {nb} bytes, expected {self.chunk_nbytes}")
            out[...] = raw.view(self.dtype).reshape(out.shape)
        else:
            try:
                self.decoder.decode(raw, out=out.reshape(-1).view(np.uint8))
            except Exception as exc:  # codec errors come in many types; all mean a damaged chunk
                raise StoreError(f"chunk {c} of {self.path} cannot be decompressed: {exc}") from exc

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
        out = np.empty((stop - start, *self.shape[1:]), dtype=self.dtype)
        views, rps = self.shard_views(), self.rows_per_shard
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

    def read_into(self, positions: list[int], out: np.ndarray) -> np.ndarray:
        """Gather rows ``positions`` into ``out[:len(positions)]``; rows must exist (caller-checked)."""
        views, rps = self.shard_views(), self.rows_per_shard
        # Sorted reads are sequential within shards when the page cache is cold, and cost nothing warm.
        for k in sorted(range(len(positions)), key=positions.__getitem__):
            i = positions[k]
            view = views[i // rps]
            if view is not None:
                out[k] = view[i % rps]
            elif self.chunk_len == 1:
                self.chunk_into(i, out[k : k + 1])
            else:
                out[k] = self.chunk(i // self.chunk_len)[i % self.chunk_len]
        return out

    def close(self) -> None:
        """Unmap every shard."""
        self._views = None
        for m in self._maps:
            if m is not None:
                try:
                    m.close()
                except BufferError:
                    pass  # a caller still holds a view; the map goes when it does
        self._maps = [None] * self.n_shards

    def warm(self) -> None:
        """Read the index and map every shard now, so the first batch pays no setup."""
        self.shard_views()

    def nbytes_on_disk(self) -> int:
        """Bytes of every shard file."""
        return sum(os.path.getsize(self.shard_file(s)) for s in range(self.n_shards) if self.shard_file(s).exists())
