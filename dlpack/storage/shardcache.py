"""Whole shards of a remote store kept in memory (bounded) and, optionally, in a local folder.

A training process reads every shard once per epoch. Least-recently-used eviction then keeps
nothing useful: with a cache holding a fraction f of the store, each shard is evicted before its
next epoch comes, and every later epoch misses everywhere. The policy here instead:

- **Resident set**: shards are admitted while there is room (``memory_bytes``), then kept for the
  cache's life: a cache holding a fraction f of the store serves about f of every later epoch.
- **Read-through** for the rest: a shard that does not fit is read (ranged, or whole) and not kept,
  except in the **read-ahead buffer**, a small FIFO of whole shards fetched ahead of the reader
  (``readahead`` shards, apart from the resident set), each kept until it is read or pushed out.
- **Disk folder** (optional, shared by the processes of one machine): every whole shard fetched is
  written as ``NAME.tmp-PID`` and renamed to ``NAME``, so a reader never sees half a file; temp
  files of processes no longer running are swept when a cache opens the folder. A disk hit is
  admitted to memory while there is room.

Keys hold a hash of the store's URL and endpoint, the array, the shard and the shard object's
ETag: a rebuilt store (new objects, new tags) never serves the old bytes. Counters in
:attr:`ShardCache.stats` (``hits``, ``disk_hits``, ``misses``, ``fetched_bytes``, ``admitted``)
say what the cache did, for tests and benchmarks.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import threading
from collections import Counter, OrderedDict
from pathlib import Path

__all__ = ["DEFAULT_CACHE_BYTES", "DEFAULT_READAHEAD", "ShardCache", "store_id"]

#: Memory a remote reader keeps whole shards in, by default.
DEFAULT_CACHE_BYTES = 2**30
#: Whole shards fetched ahead and kept apart from the resident set, by default.
DEFAULT_READAHEAD = 8
_TEMP = re.compile(r".*\.tmp-([0-9]+)")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")

Key = tuple[str, str, int, str]


def store_id(url: str, endpoint: str = "") -> str:
    """A short name for a store in a cache folder: a hash of its URL and endpoint."""
    return hashlib.sha256(f"{endpoint}\n{url}".encode()).hexdigest()[:20]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # another user's process: alive
    return True


class ShardCache:
    """Whole shards by ``(store, array, shard, etag)``; see the module docstring for the policy."""

    def __init__(
        self, memory_bytes: int = DEFAULT_CACHE_BYTES, folder: str | os.PathLike[str] | None = None,
        readahead: int = DEFAULT_READAHEAD,
    ) -> None:  # fmt: skip
        self.memory_bytes = max(0, int(memory_bytes))
        self.folder = Path(folder) if folder is not None else None
        self.readahead = max(0, int(readahead))
        self.stats: Counter[str] = Counter()
        self._resident: dict[Key, bytes] = {}
        self._used = 0
        #: Bumped by :meth:`clear`: what a caller built from resident shards is stale once it changes.
        self.generation = 0
        self._ahead: OrderedDict[Key, bytes] = OrderedDict()
        self._lock = threading.Lock()
        if self.folder is not None:
            self.folder.mkdir(parents=True, exist_ok=True)
            self.stats["swept"] = self.sweep()

    def sweep(self) -> int:
        """Remove temp files left in the folder by processes that are no longer running."""
        removed = 0
        if self.folder is None:
            return 0
        for folder, _dirs, files in os.walk(self.folder):
            for name in files:
                m = _TEMP.fullmatch(name)
                if m and not _alive(int(m.group(1))):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(os.path.join(folder, name))
                        removed += 1
        return removed

    def _file(self, key: Key) -> Path:
        assert self.folder is not None
        store, array, shard, etag = key
        return self.folder / store / _UNSAFE.sub("_", array) / f"{shard}.{_UNSAFE.sub('_', etag.strip(chr(34)))}"

    @property
    def used(self) -> int:
        """Bytes of the resident set."""
        return self._used

    def has_room(self, nbytes: int = 1) -> bool:
        """Whether a shard of ``nbytes`` would be admitted to the resident set now."""
        return self._used + nbytes <= self.memory_bytes

    def resident(self, key: Key) -> bool:
        """Whether ``key`` is in memory (resident or read ahead)."""
        return key in self._resident or key in self._ahead

    def get(self, key: Key, size: int | None = None) -> bytes | None:
        """The shard's bytes from memory or the folder (counted as a hit), or None (a miss).
        ``size``: the object's size, when known; a file of another size is not used."""
        with self._lock:
            data = self._resident.get(key)
            if data is None:
                data = self._ahead.pop(key, None)
            if data is not None:
                self.stats["hits"] += 1
                return data
        if self.folder is not None:
            try:
                data = self._file(key).read_bytes()
            except OSError:
                data = None
            if data is not None and (size is None or len(data) == size):
                self.stats["disk_hits"] += 1
                self._admit(key, data)
                return data
        self.stats["misses"] += 1
        return None

    def _admit(self, key: Key, data: bytes) -> bool:
        with self._lock:
            if key in self._resident:
                return True
            if self._used + len(data) > self.memory_bytes:
                return False
            self._resident[key] = data
            self._used += len(data)
            self.stats["admitted"] += 1
            return True

    def offer(self, key: Key, data: bytes, *, ahead: bool = False) -> None:
        """A whole shard just fetched: kept while there is room (else in the read-ahead buffer when
        fetched ``ahead``), and written to the folder."""
        self.stats["fetched_bytes"] += len(data)
        if not self._admit(key, data) and ahead and self.readahead:
            with self._lock:
                self._ahead[key] = data
                while len(self._ahead) > self.readahead:
                    self._ahead.popitem(last=False)
        if self.folder is not None:
            path = self._file(key)
            if path.exists():
                return
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
            try:
                tmp.write_bytes(data)
                os.replace(tmp, path)
            except OSError:  # a full disk: the shard is still served from memory or the store
                with contextlib.suppress(OSError):
                    tmp.unlink()

    def reserve(self, keys: list[Key], nbytes: int) -> list[bytes] | None:
        """Shards ``keys`` when all are resident and ``nbytes`` more fit the memory budget, which is
        then counted as used (the caller keeps that much, e.g. a contiguous copy of the shards,
        until :meth:`clear`); None otherwise. The shards stay resident: a read that looked them up
        a moment before finds them still."""
        with self._lock:
            if any(k not in self._resident for k in keys) or self._used + nbytes > self.memory_bytes:
                return None
            self._used += nbytes
            return [self._resident[k] for k in keys]

    def clear(self) -> None:
        """Forget what is in memory (the folder stays)."""
        with self._lock:
            self.generation += 1
            self._resident.clear()
            self._ahead.clear()
            self._used = 0
