"""The training loader: exact per-epoch shuffles, rank shards, read-ahead on threads, exact resume.

Why threads: image bytes come from memory maps and numpy copies release the GIL, so threads
read at memory speed with no copy between processes; worker processes would have to pickle every
batch (25 MB at 32 x 512x512x3), which caps a PyTorch DataLoader near 2.8k images/s on 2 cores
(docs/benchmarks.md, "Loader").

The order of an epoch depends only on (seed, epoch, order options, rank, world_size) and the
selection of samples (a split, or any indices), never on worker count or timing, so any
worker/prefetch setting yields the same batches. A state saved at one world size loads at any
other: what no rank had handed out of the epoch is split over the new ranks (docs/loader.md,
"Elastic resume"). The loader reads
any :class:`BatchSource` (a store, the bench's folder reader, a view of either) and passes it the
epoch, so per-epoch views and online augmentation draw their randomness from
:func:`sample_rng` (seed, epoch, index) without touching the threading here.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import os
import sys
import threading
import weakref
from collections import deque
from collections.abc import Callable, Generator, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ..errors import OptionError, StateError
from ..options import LoaderOptions, Order, online_layer
from ..timing import EpochStats, PassTimer, batch_nbytes

__all__ = ["BatchSource", "Loader", "LoaderOptions", "auto_workers", "epoch_order", "rank_indices", "sample_rng"]


@runtime_checkable
class BatchSource(Protocol):
    """What the loader reads: a store, a folder read on the fly, or a view over either.

    ``get_batch`` receives validated indices (``0 <= i < len``) and the epoch, and returns at least
    ``{"image": B x H x W x C array (a list for variable sizes), "index": indices}``; when ``out``
    is given (fixed sizes only) the images are written into it. ``warm`` builds lazy maps and
    indexes before reader threads start; ``fingerprint`` identifies the content, so a loader state
    is never restored onto other data; ``image_layout`` is ``((H, W, C), dtype)`` when every image
    has that shape (the loader then recycles batch arrays), else None.

    Optional: ``get_valid_batch(indices, epoch, out)``, the same as ``get_batch`` for the loader's
    int64 indices, which are in range by construction: a source whose ``get_batch`` also serves
    callers and so checks its indices (a store) skips that check for the loader.

    Optional: a source whose rows depend only on (index, epoch), never on the other rows of the
    call, says so with a true ``batch_rows_independent`` attribute. The loader then reads several
    consecutive batches with one ``get_batch`` and cuts the result into per-batch views (a call
    costs tens of microseconds of Python, as much as copying a 32x32 batch).

    Optional, for a source read over the network (a store on object storage):
    ``prefetch(indices)`` is told, ahead of the reads (``LoaderOptions.fetch_ahead`` batches), the
    indices the loader will read next, in order; it starts fetching and returns at once, and never
    changes what a read returns. A source with ``streamed = False`` is never called (a local store).
    ``block_hint`` (int or None) is the run of consecutive samples the source reads best together
    (a streamed store's shard): ``order="block"`` uses it when ``block_size`` is None.
    """

    def __len__(self) -> int: ...

    def get_batch(self, indices: np.ndarray, epoch: int = 0, out: np.ndarray | None = None) -> dict[str, Any]:
        """The samples at ``indices`` of ``epoch``, at least ``image`` and ``index``; images into ``out`` when given."""
        ...

    def warm(self) -> None:
        """Build lazy maps and indexes before reader threads start."""
        ...

    def fingerprint(self) -> str:
        """An id of the content, so a loader state is never restored onto other data."""
        ...

    def image_layout(self) -> tuple[tuple[int, ...], str] | None:
        """``((H, W, C), dtype)`` when every image has that shape, else None."""
        ...


#: Tags keep the loader's random streams independent of each other.
_ORDER_TAG = 0x646C70
_SAMPLE_TAG = 0x736D70


def sample_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    """The random generator of one sample in one epoch: a pure function of its arguments.

    Never of the worker, thread, batch composition or timing, so online augmentation and
    per-epoch views give the same result with any number of workers and after a resume.
    """
    return np.random.default_rng([int(seed), int(epoch), int(index), _SAMPLE_TAG])


#: The version of :meth:`Loader.state_dict`'s states: they record the selection of samples and the
#: earlier world sizes of the current epoch (``segments``), so a state loads at any world size.
STATE_VERSION = 3


#: Keywords a ``transform`` may declare to be given them: the epoch, the batch's sample indices,
#: and ``sample_rng(index)``, the generator of one sample in this epoch (:func:`sample_rng`).
HOOK_KEYWORDS = ("epoch", "indices", "sample_rng")


def hook_keywords(transform: Callable[..., Any] | None) -> frozenset[str]:
    """Which of :data:`HOOK_KEYWORDS` ``transform`` declares by name (its first parameter, the
    batch, never counts); a callable whose signature cannot be read gets the batch alone."""
    if transform is None:
        return frozenset()
    try:
        params = list(inspect.signature(transform).parameters.values())
    except (TypeError, ValueError):
        return frozenset()
    named = [p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    if named and named[0].kind == named[0].POSITIONAL_OR_KEYWORD and named[0] is params[0]:
        named = named[1:]
    return frozenset(p.name for p in named if p.name in HOOK_KEYWORDS)


def epoch_order(
    n: int, seed: int, epoch: int, order: Order = "random", block_size: int = 64, window: int = 16
) -> np.ndarray:
    """The global sample order of one epoch: a permutation of ``range(n)``, a pure function of its arguments."""
    if order == "sequential":
        return np.arange(n, dtype=np.int64)
    rng = np.random.default_rng([seed, epoch, _ORDER_TAG])
    if order == "random":
        return rng.permutation(n).astype(np.int64)
    if order != "block":
        raise OptionError(f"unknown order {order!r}")
    starts = np.arange(0, n, block_size, dtype=np.int64)
    runs = [np.arange(s, min(s + block_size, n), dtype=np.int64) for s in rng.permutation(starts)]
    out = []
    for w in range(0, len(runs), window):
        chunk = np.concatenate(runs[w : w + window])
        out.append(rng.permutation(chunk))
    return np.concatenate(out) if out else np.empty(0, dtype=np.int64)


def selection_digest(indices: np.ndarray) -> str:
    """An id of a selection of samples, in its order: states of a loader over one selection are
    refused by a loader over another (the same positions would be other samples)."""
    return hashlib.sha256(np.ascontiguousarray(indices, dtype="<i8").tobytes()).hexdigest()[:16]


def check_selection(indices: Sequence[int] | np.ndarray, n: int, where: object) -> np.ndarray:
    """``indices`` as a 1-D int64 array of distinct sample indices in ``0..n-1``, in the order given.

    Refused: non-integers, negative or out-of-range indices (no wrap-around: ``-1`` in a list of
    samples is more likely a bug than "the last one"), repeats (an epoch covers each selected
    sample once) and an empty selection (an epoch of nothing trains on nothing, silently).
    """
    arr = np.asarray(indices)
    if arr.dtype == np.bool_ or (arr.dtype.kind not in "iu" and arr.size):
        raise OptionError(f"indices must be integer sample indices, got dtype {arr.dtype}")
    if arr.ndim != 1:
        raise OptionError(f"indices must be a 1-D sequence of sample indices, got shape {arr.shape}")
    if arr.size == 0:
        raise OptionError(f"indices select no samples of {where}")
    arr = arr.astype(np.int64)
    bad = (arr < 0) | (arr >= n)
    if bad.any():
        raise OptionError(f"index {int(arr[bad][0])} is out of range for {where} with {n} samples (0..{n - 1})")
    uniq, counts = np.unique(arr, return_counts=True)
    if len(uniq) != len(arr):
        raise OptionError(
            f"indices repeat sample {int(uniq[counts > 1][0])}; each selected sample is read once per epoch"
        )
    return arr


def _share(n: int, world_size: int, drop_last: bool) -> int:
    """Samples per rank when ``n`` samples are split over ``world_size`` ranks (:func:`rank_indices`)."""
    return n // world_size if drop_last else -(-n // world_size)


def batch_count(n: int, world_size: int, images_per_batch: int, drop_last: bool) -> int:
    """Batches per rank of an epoch of ``n`` samples: the same on every rank."""
    per = _share(n, world_size, drop_last)
    return per // images_per_batch if drop_last else -(-per // images_per_batch)


def remaining_order(
    order: np.ndarray, world_size: int, position: int, images_per_batch: int, drop_last: bool
) -> np.ndarray:
    """The samples of ``order`` that ``world_size`` ranks have not handed out after ``position``
    batches each, in ``order``'s order: what an elastic resume splits over the new ranks.

    Each rank's first ``position * images_per_batch`` samples of its :func:`rank_indices` share
    count as handed out (a padding copy counts for its sample). Samples that ``drop_last`` would
    have dropped at the end are not handed out, so they stay in the rest: mid-epoch, nothing is
    lost yet. ``position`` is the same on every rank (data-parallel ranks save at the same step).
    """
    n = len(order)
    if n == 0 or position <= 0:
        return order
    per = _share(n, world_size, drop_last)
    done = min(position * images_per_batch, per)
    taken = np.add.outer(np.arange(world_size, dtype=np.int64) * per, np.arange(done, dtype=np.int64))
    handed = np.zeros(n, dtype=bool)
    handed[taken.reshape(-1) % n] = True  # a position past n is padding: a repeat of sample pos % n
    rest: np.ndarray = order[~handed]
    return rest


def rank_indices(order: np.ndarray, rank: int, world_size: int, drop_last: bool) -> np.ndarray:
    """The contiguous share of the epoch order for ``rank``, equal in size on every rank.

    ``drop_last`` drops the last ``n % world_size`` samples of the epoch; otherwise the order is
    padded by repeating its first samples (as torch's DistributedSampler does), so shards are
    disjoint except for at most ``world_size - 1`` repeated samples.
    """
    n = len(order)
    if world_size == 1:
        return order
    if drop_last:
        per = n // world_size
    else:
        per = -(-n // world_size)
        if per * world_size > n:
            reps = -(-(per * world_size) // max(1, n))
            order = np.tile(order, reps)[: per * world_size]
    return order[rank * per : (rank + 1) * per]


#: A batch at least this large is copied by two threads where there are three cores or more: one
#: thread's copy bandwidth falls short of the memory's for multi-MB rows (512x512x3 batches of 32
#: read 1.5x the one-thread gather); on two cores one thread and the calling thread already copy.
_TWO_THREAD_BYTES = 8 * 2**20

#: The L2 cache of a core where sysfs does not say (the smallest of the x86 server cores measured).
_L2_GUESS = 2**20

#: The largest batch ``workers="auto"`` reads on the calling thread: about 250 us of copying, so a
#: 5 ms training step that could have overlapped the read stays 95 % busy.
_INLINE_MAX_BYTES = 2 * 2**20


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask, not the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def l2_cache_bytes(cpu: int = 0) -> int | None:
    """The L2 (data or unified) cache of core ``cpu`` from sysfs; None where the platform does not say."""
    base = f"/sys/devices/system/cpu/cpu{cpu}/cache"
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return None
    for name in names:
        try:
            with open(f"{base}/{name}/level") as f:
                level = f.read().strip()
            with open(f"{base}/{name}/type") as f:
                kind = f.read().strip()
            with open(f"{base}/{name}/size") as f:
                size = f.read().strip()
        except OSError:
            continue
        if level == "2" and kind in ("Data", "Unified"):
            return parse_cache_size(size)
    return None


@functools.cache
def _machine_l2() -> int | None:
    """The L2 cache per core of the machine, read from sysfs once per process."""
    return l2_cache_bytes()


def parse_cache_size(text: str) -> int | None:
    """Bytes of a sysfs cache size (``2048K``, ``1M``, ``512``); None for anything else."""
    text = text.strip().upper()
    scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
    digits = text[:-1] if text[-1:] in ("K", "M", "G") else text
    return int(digits) * scale if digits.isdigit() and int(digits) > 0 else None


def _size(nbytes: int) -> str:
    return f"{nbytes / 1e6:.1f} MB" if nbytes >= 10**5 else f"{nbytes / 1e3:.0f} kB"


def _cache(nbytes: int) -> str:
    return f"{nbytes / 2**20:g} MiB" if nbytes >= 2**20 else f"{nbytes / 2**10:g} KiB"


def auto_workers(
    source: BatchSource,
    options: LoaderOptions,
    cores: int | None = None,
    *,
    extra_work: bool = False,
    l2_bytes: int | None = None,
) -> tuple[int, str]:
    """The reader-thread count ``workers="auto"`` picks, and why (what ``repr(loader)`` shows).

    - ``prefetch=0``: none (each batch is read when asked).
    - Images of several sizes, a compressed store, or per-batch work on the reader threads (online
      augmentation, a ``transform``: ``extra_work``): one thread per core, at most 4; decoding and
      NumPy work release the GIL, so they run in parallel.
    - Uncompressed images of one size, batches of :data:`_ALONE_BYTES` up to the core's L2 cache
      (``l2_bytes``, sysfs; at most :data:`_INLINE_MAX_BYTES`), from local files: none. The caller
      copies each batch into the same block, which stays in its core's L2 cache until the step
      reads it; a reader thread writes it on the other core, from where the step fetches it again,
      and waits for the handoff (64x64x3 batches of 32: the calling thread read 1.06-1.36x a
      thread, 20,000 and 2,000 images, both backends). The read costs at most about 250 us a batch.
    - Other uncompressed images of one size: a copy out of a memory map runs at memory speed on one
      thread, so one thread, and two for batches of :data:`_TWO_THREAD_BYTES` or more on three cores
      or more. The calling thread reads the next batch itself while it waits for a thread's, so on
      two cores one thread already keeps both copying (512x512x3 batches of 32: 1.12-1.16x the
      rows per second of two threads). More threads than that only trade the GIL back and forth
      (small batches ran 1.6x slower on two threads).
      Smaller batches travel in groups of about 2 MiB, which no longer fit the L2 cache either way.

    Outside the L2 window there is at least one thread whenever there is read-ahead, also on one
    core: the reads then overlap the GIL-free part of the training step (a GPU kernel, a ``sleep``)
    instead of adding to it. A source read over the network (``streamed``) always reads ahead on threads.
    """
    cores = usable_cores() if cores is None else max(1, int(cores))
    on = f"{cores} core{'s' if cores != 1 else ''}"
    if options.prefetch == 0:
        return 0, "prefetch=0: each batch is read when asked"
    layout = source.image_layout()
    manifest = getattr(source, "manifest", None)
    compression = str(getattr(manifest, "compression", "none") or "none")
    many = min(cores, 4)
    if layout is None:
        return many, f"images of several sizes are read one by one; {on}"
    shape, dtype = layout
    nbytes = options.batch_size * int(np.prod(shape)) * np.dtype(dtype).itemsize
    what = f"{'x'.join(str(v) for v in shape)} batches of {options.batch_size}: {_size(nbytes)}"
    if compression != "none":
        return many, f"{what}, {compression}-compressed: decoding runs on every core; {on}"
    if extra_work:
        return many, f"{what}, with work per batch on the reader threads; {on}"
    if nbytes >= _TWO_THREAD_BYTES and cores >= 3:
        return 2, f"{what}, two threads copy large batches faster than one; {on}"
    l2 = l2_bytes if l2_bytes is not None and l2_bytes > 0 else _L2_GUESS
    if _ALONE_BYTES <= nbytes <= min(l2, _INLINE_MAX_BYTES) and not getattr(source, "streamed", False):
        return 0, f"{what}, read on the calling thread: the batch stays in its core's {_cache(l2)} L2 cache; {on}"
    return 1, f"{what}, one thread copies at memory speed; {on}"


#: The bytes of images a group of batches holds (one read, one block). A group amortises the
#: handoff to a thread and the per-call cost of ``get_batch``; a larger one no longer stays in the
#: CPU cache between the copy into it and the step's read (the pool rotates a few blocks).
_GROUP_BYTES = 2 * 2**20

#: Batches at least this large are read one at a time on the calling thread (``workers=0``), not
#: in groups: the caller drops each before the next, so the pool hands out the same block again,
#: which is still in the CPU's L2 cache. Grouped, 2 MiB blocks do not stay there, and the copy
#: slows by more than the per-call cost saved (``benchmarks/loader.py --small``: 32x32x1 batches of
#: 256, 256 KiB, read 0.42x the ceiling grouped and 0.50x one at a time; batches of 32 gain from groups).
_ALONE_BYTES = 192 * 2**10

#: Where in a memory page a pooled batch array starts. ``np.empty`` puts a large array 16 bytes past
#: a page boundary (the allocator's header), while image rows in memory maps mostly start on one
#: (shards of whole-page chunks, aligned HDF5 datasets): a copy whose destination sits just past its
#: source modulo 4096 runs several times slower (4K aliasing: loads wait on unrelated stores);
#: 256x256x3 rows copied 11x slower into a ``np.empty`` batch than at this offset.
_PAGE = 4096
_PAGE_OFFSET = 2048


class _BufferPool:
    """Batch arrays that are reused once nothing but the pool refers to them.

    A fresh 25 MB batch array costs page faults (glibc returns large blocks to the kernel), about
    15 % of loader throughput here. An array is recycled only when CPython's reference count says
    the caller dropped every batch, view and tensor made from it, so a batch that is still in use
    is never overwritten. Each batch is a view of a pooled byte block (which every view made from
    it refers to), placed at :data:`_PAGE_OFFSET` in its page.

    ``allocator(nbytes)`` makes each block (a 1-D uint8 array; ``np.empty`` by default): the
    PyTorch adapter passes one that returns views of pinned tensors, so batches are read straight
    into page-locked memory and no pin copy happens per batch.
    """

    def __init__(
        self, shape: tuple[int, ...], dtype: str, limit: int, allocator: Callable[[int], np.ndarray] | None = None
    ) -> None:
        self.shape, self.dtype, self.limit = shape, np.dtype(dtype), limit
        self.allocator = allocator
        self._nbytes = int(np.prod(shape)) * self.dtype.itemsize
        #: (block, offset of its batch): the offset is found once (``ctypes.data`` costs 10 us a call).
        self._bufs: list[tuple[np.ndarray, int]] = []
        self._rows = tuple(shape[1:])
        self._lock = threading.Lock()

    def use_allocator(self, allocator: Callable[[int], np.ndarray]) -> None:
        """Make the blocks from now on with ``allocator``; free blocks made otherwise are dropped
        (a block still held by a batch stays with that batch until it is dropped)."""
        with self._lock:
            self.allocator = allocator
            self._bufs.clear()

    def _batch(self, block: np.ndarray, offset: int, n: int) -> np.ndarray:
        batch: np.ndarray = np.ndarray((n, *self._rows), dtype=self.dtype, buffer=block, offset=offset)
        return batch

    def take(self, n: int) -> np.ndarray:
        """An array of ``n`` batch rows that nobody else holds."""
        with self._lock:
            for block, offset in self._bufs:
                # Referrers of a free block: its tuple, the loop variable and getrefcount's argument.
                if sys.getrefcount(block) <= 3:
                    return self._batch(block, offset, n)
            if len(self._bufs) < self.limit:
                size = self._nbytes + _PAGE
                block = np.empty(size, dtype=np.uint8) if self.allocator is None else self.allocator(size)
                offset = (_PAGE_OFFSET - block.__array_interface__["data"][0]) % _PAGE
                self._bufs.append((block, offset))
                return self._batch(block, offset, n)
        return np.empty((n, *self.shape[1:]), dtype=self.dtype)


@dataclass(frozen=True)
class _Read:
    """A group of batches submitted to the reader threads."""

    future: Future[list[dict[str, Any]]]
    group: list[np.ndarray]
    epoch: int


class _Hints:
    """Names the samples of the groups ahead of the reads to the source's ``prefetch``, in the order
    they will be read, each group once: before group ``k`` is read, every group up to ``k + lead``
    has been named (one call per group once the first ``lead`` are). A streamed store then fetches
    whole shards while the groups before them are read and used; nothing it does changes a read.
    """

    __slots__ = ("_prefetch", "_groups", "_lead", "_next")

    def __init__(
        self, prefetch: Callable[[np.ndarray], object] | None, groups: list[list[np.ndarray]], lead: int, done: int = 0
    ) -> None:
        self._prefetch = prefetch if lead > 0 else None
        self._groups, self._lead, self._next = groups, lead, done

    def reach(self, k: int) -> None:
        """Group ``k`` is about to be read: name the groups up to ``k + lead`` not named yet."""
        if self._prefetch is None:
            return
        stop = min(len(self._groups), k + self._lead)
        if stop > self._next:
            named = [ix for group in self._groups[self._next : stop] for ix in group]
            self._next = stop
            self._prefetch(np.concatenate(named))


def source_prefetch(source: object) -> Callable[[np.ndarray], object] | None:
    """The source's ``prefetch`` when calling it can help: not on a source that says it is not
    ``streamed`` (a local store, whose prefetch does nothing: the loader skips even the call)."""
    fetch: Callable[[np.ndarray], object] | None = getattr(source, "prefetch", None)
    if not callable(fetch) or getattr(source, "streamed", True) is False:
        return None
    return fetch


def split_batch(batch: dict[str, Any], sizes: Sequence[int]) -> list[dict[str, Any]] | None:
    """``batch`` of ``sum(sizes)`` rows cut into consecutive batches of ``sizes`` rows, keys in the
    same order: arrays and lists by rows (views), other values by their ``take_rows(start, stop)``
    (a :class:`~dlpack.ragged.RaggedBatch`, a batch's ``source`` paths). None when a value has
    another length or cannot be cut: the loader then reads batch by batch."""
    total = sum(sizes)
    cuts: list[slice] = []
    at = 0
    for n in sizes:
        cuts.append(slice(at, at + n))
        at += n
    columns: list[list[Any]] = []
    for value in batch.values():
        if isinstance(value, (np.ndarray, list)):
            if (isinstance(value, np.ndarray) and value.ndim == 0) or len(value) != total:
                return None
            columns.append([value[c] for c in cuts])
            continue
        cut = getattr(value, "take_rows", None)
        if cut is None or len(value) != total:
            return None
        columns.append([cut(c.start, c.stop) for c in cuts])
    keys = list(batch)
    return [dict(zip(keys, row, strict=True)) for row in zip(*columns, strict=True)]


class Loader:
    """Iterates batches of a :class:`BatchSource`; see :meth:`dlpack.Dataset.loader`.

    A batch of a store is ``{"image": B x H x W x C, "label": (B,), "index": (B,), "source": [str]}``
    plus its keyed arrays (``image`` is a list for variable-size stores). Iterating a whole epoch
    advances to the next; :meth:`set_epoch` jumps to any epoch.

    ``indices`` selects the samples an epoch covers (all of them by default): the epoch's order
    is drawn over the selection's positions and mapped to its sample indices, so ranks, drop_last
    and resume work on the selection exactly as on a whole store. ``split`` only names the
    selection in states and messages (:meth:`dlpack.Dataset.loader` resolves a split name).

    One pass at a time: the loader's epoch and position are one state, so while an iterator over
    it is live (neither exhausted, closed nor garbage-collected), a second ``iter()``,
    :meth:`set_epoch` and :meth:`load_state_dict` raise :class:`~dlpack.StateError`; make a second
    loader to read the same data twice at once.
    """

    def __init__(
        self,
        source: BatchSource,
        options: LoaderOptions | None = None,
        transform: Callable[..., dict[str, Any]] | None = None,
        *,
        indices: Sequence[int] | np.ndarray | None = None,
        split: str | None = None,
        finisher: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    ) -> None:
        if not isinstance(source, BatchSource):
            raise OptionError(
                f"a Loader reads a BatchSource (len, get_batch, warm, fingerprint, image_layout); got {type(source).__name__}"
            )
        self.options = options or LoaderOptions()
        o = self.options
        if o.augment == "cached":  # the store serves its own views (the loader knows no store)
            cached = getattr(source, "cached_views", None)
            if cached is None:
                where = getattr(source, "path", type(source).__name__)
                raise OptionError(
                    f"augment='cached' reads the variants of a dlpack store; {where} is not one (open a store with "
                    "dlpack.open)"
                )
            hint = getattr(source, "block_hint", None)
            source = cached(o.seed, original_rate=o.original_rate, views_per_batch=o.views_per_batch)
        else:
            hint = getattr(source, "block_hint", None)
        self.source = source
        #: ``order="block"``'s run length: ``block_size``, else the source's ``block_hint`` (a streamed
        #: store's shard rows), else 64; resolved once, and what states record as ``block_size``.
        self.block_size = o.block_for(hint if o.effective_order == "block" else None)
        self.transform = transform
        #: Applied to each batch after ``transform``, on the reader thread that read it (the PyTorch
        #: adapter converts there, so the caller's thread only receives finished tensors). An
        #: ``image_nbytes`` attribute (bytes per image of what it hands out) lets :meth:`stats`
        #: count bytes without looking at each finished batch.
        self.finisher = finisher
        self._hook = hook_keywords(transform)  # read once: inspecting a signature per batch costs microseconds
        self._online = online_layer(o.online) if o.online is not None else None
        where = getattr(source, "path", type(source).__name__)
        #: The sample indices an epoch covers, in the order ``sequential`` reads them; None: all.
        self.selection: np.ndarray | None = None if indices is None else check_selection(indices, len(source), where)
        if split is not None and (self.selection is None or not isinstance(split, str)):
            raise OptionError("split names a selection: pass it as a str together with indices")
        self.split = split
        self._sel_state: dict[str, Any] | None = None
        self.epoch = 0
        self._position = 0  # batches of the current epoch already handed out
        # Earlier parts of the current epoch run at other world sizes: (world_size, position) each,
        # oldest first (see load_state_dict); empty unless the epoch was resumed at a new world size.
        self._segments: tuple[tuple[int, int], ...] = ()
        self._threads: tuple[int, ThreadPoolExecutor] | None = None
        self._order_cache: tuple[int, tuple[tuple[int, int], ...], np.ndarray] | None = None
        #: The next epoch's order, drawn on a reader thread: (epoch, the options it was drawn with, future).
        self._order_ahead: tuple[int, LoaderOptions, Future[np.ndarray]] | None = None
        # The live pass, weakly: a dropped iterator frees the loader even if it never started
        # (an unstarted generator runs no ``finally``).
        self._live: weakref.ref[Generator[dict[str, Any], None, None]] | None = None
        self._live_lock = threading.Lock()
        self._stats: list[EpochStats] = []
        self._pick_workers(finisher_works=finisher is not None)
        #: The next epoch's first reads, made while the last pass ended (``read_ahead_epochs``):
        #: (epoch, reads); the next pass takes them when it starts that epoch from its first batch.
        self._carry: tuple[int, list[_Read]] | None = None
        layout = source.image_layout()
        # Batches per read: enough for about 2 MiB, so small images amortise the handoff and the
        # per-call cost of get_batch (a source with independent rows reads a group in one call).
        self._group = 1
        self._image_bytes = 0  # of one image of the source's layout (0: images of several sizes)
        self._get_batch: Callable[..., dict[str, Any]] = source.get_batch
        self._pool = None
        self._grouped = bool(getattr(source, "batch_rows_independent", False))
        if layout is not None:
            shape, dtype = layout
            self._image_bytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
            batch_bytes = self.options.batch_size * self._image_bytes
            self._group = max(1, min(64, _GROUP_BYTES // max(1, batch_bytes)))
            if self.options.prefetch == 0:  # each batch is read when asked: no group is read ahead
                self._group = 1
            elif self._workers == 0 and batch_bytes >= _ALONE_BYTES:  # also "auto" in its L2 window
                self._group = 1  # read in the calling thread alone, into the same cached block
            rows = self.options.batch_size * (self._group if self._grouped else 1)
            ahead = max(1, -(-self.options.prefetch // self._group))
            # Blocks: the groups read ahead, the one being handed out and the one the caller still holds.
            limit = ahead + 2 if self._grouped else max(self.options.prefetch, self._group) + 2 * self._group
            self._pool = _BufferPool((rows, *shape), dtype, limit)

    def _pick_workers(self, finisher_works: bool) -> None:
        """The reader-thread count (``workers="auto"``: :func:`auto_workers`) and what repr says of it."""
        o = self.options
        # A group no thread has started is read on the caller's thread (no wake-up to wait for),
        # unless per-batch work is promised to run on the reader threads.
        self._inline = not finisher_works and self.transform is None and o.online is None
        if o.workers == "auto":
            work = finisher_works or self.transform is not None or o.online is not None
            self._workers, why = auto_workers(self.source, o, extra_work=work, l2_bytes=_machine_l2())
            self._workers_why = f"workers=auto->{self._workers} ({why})"
        else:
            self._workers, self._workers_why = int(o.workers), f"workers={o.workers}"

    def set_finisher(self, finisher: Callable[[dict[str, Any]], dict[str, Any]] | None, *, works: bool) -> None:
        """Install ``finisher`` (run on the reader thread after ``transform``). ``works``: it does
        per-batch work (a float conversion, a copy), so ``workers="auto"`` reads on every core;
        a finisher that only wraps the arrays (a zero-copy tensor view) keeps the copy's count."""
        self._check_idle("set a finisher")
        self._drop_carry()  # reads made ahead were finished by the old finisher
        self.finisher = finisher
        self._pick_workers(finisher_works=works)

    # ------------------------------------------------------------------ order

    def _global(self, epoch: int) -> np.ndarray:
        """The epoch's order over the selection's sample indices, before any rank takes its share."""
        o = self.options
        sel = self.selection
        glob = epoch_order(
            len(self.source) if sel is None else len(sel), o.seed, epoch, o.effective_order, self.block_size, o.window
        )
        return glob if sel is None else sel[glob]  # the same shuffle, over the selection's positions

    def _rest(self, epoch: int, segments: Sequence[tuple[int, int]]) -> np.ndarray:
        """What is left of ``epoch``'s order after its earlier ``segments`` (each one splits what the
        one before left over its world size, as an epoch is split, and hands out its batches)."""
        o = self.options
        rest = self._global(epoch)
        for world_size, position in segments:
            rest = remaining_order(rest, world_size, position, o.batch_size // o.views_per_batch, o.drop_last)
        return rest

    def _rank_order(self, epoch: int, segments: tuple[tuple[int, int], ...]) -> np.ndarray:
        """The sample indices of ``epoch`` for this rank (a pure function: it may run on a reader thread)."""
        o = self.options
        return rank_indices(self._rest(epoch, segments), o.rank, o.world_size, o.drop_last)

    def _indices(self, epoch: int) -> np.ndarray:
        # Only the current epoch has earlier segments: every other one runs at this world size throughout.
        segments = self._segments if epoch == self.epoch else ()
        if self._order_cache is None or self._order_cache[:2] != (epoch, segments):
            ahead, self._order_ahead = self._order_ahead, None
            if ahead is not None and ahead[:2] == (epoch, self.options) and not segments and not ahead[2].cancelled():
                share = ahead[2].result()  # drawn on a reader thread while the last epoch was read
            else:
                share = self._rank_order(epoch, segments)
            self._order_cache = (epoch, segments, share)
        return self._order_cache[2]

    def batches(self, epoch: int | None = None) -> list[np.ndarray]:
        """The index batches of an epoch for this rank, in the order they are yielded.

        After a resume at another world size, the current epoch's batches are this rank's share of
        what the earlier world sizes left (``len(loader)`` counts them); other epochs are whole.
        """
        idx = self._indices(self.epoch if epoch is None else epoch)
        m = self.options.views_per_batch
        b = self.options.batch_size // m  # images per batch: m rows each
        stop = (len(idx) // b) * b if self.options.drop_last else len(idx)
        batches = [idx[s : min(s + b, stop)] for s in range(0, stop, b)]
        return batches if m == 1 else [np.repeat(x, m) for x in batches]

    def __len__(self) -> int:
        """Batches per epoch on this rank (the same on every rank)."""
        return len(self.batches())

    def stats(self) -> list[EpochStats]:
        """One :class:`~dlpack.timing.EpochStats` per pass so far, oldest first: how long the
        caller waited for batches (share, p50/p99 per batch), images/s and bytes/s. A pass that
        stopped early is marked ``complete=False``; the rest of its epoch is a pass of its own."""
        return list(self._stats)

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its first batch (its order depends only on seed and epoch)."""
        if not isinstance(epoch, (int, np.integer)) or epoch < 0:
            raise OptionError(f"epoch must be a non-negative integer, got {epoch!r}")
        self._check_idle("set_epoch")
        if self._carry is not None and self._carry[0] != int(epoch):
            self._drop_carry()
        self.epoch = int(epoch)
        self._position = 0
        self._segments = ()  # the whole epoch, at this world size

    # ------------------------------------------------------------------ reading

    def _executor(self, workers: int) -> ThreadPoolExecutor:
        """The reader threads, kept across epochs (starting threads costs as much as a small epoch)."""
        if self._threads is None or self._threads[0] != workers:
            self.close()
            self._threads = (workers, ThreadPoolExecutor(max_workers=workers, thread_name_prefix="dlpack"))
        return self._threads[1]

    def close(self) -> None:
        """Stop the reader threads (they also stop when the loader is garbage-collected)."""
        self._drop_carry()
        self._order_ahead = None  # its thread may be gone before drawing it: drawn again when needed
        if self._threads is not None:
            self._threads[1].shutdown(wait=False, cancel_futures=True)
            self._threads = None

    def __del__(self) -> None:
        threads = getattr(self, "_threads", None)
        if threads is not None:
            threads[1].shutdown(wait=False, cancel_futures=True)

    def _drop_carry(self) -> None:
        """Cancel the next epoch's reads made ahead, and wait for those already running."""
        carry, self._carry = self._carry, None
        if carry is not None:
            for r in carry[1]:
                r.future.cancel()
            wait([r.future for r in carry[1]])

    def _take_carry(self, epoch: int, start: int) -> list[_Read]:
        """The reads made ahead for this pass: when it starts ``epoch`` at its first batch, at this
        world size throughout (what the last pass read ahead for); else none, and they are dropped."""
        if self._carry is not None and self._carry[0] == epoch and start == 0 and not self._segments:
            reads = self._carry[1]
            self._carry = None
            return reads
        self._drop_carry()
        return []

    def _steal(self, pending: deque[_Read], epoch: int) -> None:
        """While the caller waits for a group a thread is reading, read the next group no thread has
        started on the caller's thread: it had nothing else to do, and both cores then read (with
        no step, one reader thread alone ran 20-45 % slower than reading in the calling thread)."""
        for i, r in enumerate(pending):
            if r.future.cancel():
                done: Future[list[dict[str, Any]]] = Future()
                try:
                    done.set_result(self._load_group(r.group, epoch))
                except Exception as exc:  # raised when the caller gets to this group, as a thread's would be
                    done.set_exception(exc)
                pending[i] = _Read(done, r.group, r.epoch)
                return

    def _load_group(self, group: list[np.ndarray], epoch: int) -> list[dict[str, Any]]:
        """The finished batches of ``group`` (consecutive batches of one epoch), in order.

        A source with independent rows reads the whole group with one ``get_batch`` into one
        pooled block; each batch is a view of its rows, and the transform, online augmentation
        and finisher still run once per batch, in order."""
        if len(group) > 1 and self._grouped:
            sizes = [len(ix) for ix in group]
            total = sum(sizes)
            out = self._pool.take(total) if self._pool is not None else None
            whole = self._get_batch(np.concatenate(group), epoch, out)
            parts = split_batch(whole, sizes)
            if parts is not None:
                return [self._finish(part, ix, epoch) for part, ix in zip(parts, group, strict=True)]
            self._grouped = False  # a value that cannot be cut by rows: read batch by batch from now on
        return [self._load(indices, epoch) for indices in group]

    def _load(self, indices: np.ndarray, epoch: int) -> dict[str, Any]:
        out = self._pool.take(len(indices)) if self._pool is not None else None
        return self._finish(self._get_batch(indices, epoch, out), indices, epoch)

    def _finish(self, batch: dict[str, Any], indices: np.ndarray, epoch: int) -> dict[str, Any]:
        batch = self._transformed(batch, indices, epoch)
        return batch if self.finisher is None else self.finisher(batch)

    def _transformed(self, batch: dict[str, Any], indices: np.ndarray, epoch: int) -> dict[str, Any]:
        if self._online is not None:
            got = self._online.apply_batch(batch, self.options.seed, epoch)
            batch = batch if got is None else got
        if self.transform is None:
            return batch
        if not self._hook:
            return self.transform(batch)
        kw: dict[str, Any] = {}
        if "epoch" in self._hook:
            kw["epoch"] = epoch
        if "indices" in self._hook:
            kw["indices"] = indices
        if "sample_rng" in self._hook:
            seed = self.options.seed
            kw["sample_rng"] = lambda index: sample_rng(seed, epoch, int(index))
        return self.transform(batch, **kw)

    def _live_pass(self) -> Generator[dict[str, Any], None, None] | None:
        """The iterator of the pass in progress, or None."""
        gen = self._live() if self._live is not None else None
        return gen if gen is not None and inspect.getgeneratorstate(gen) != inspect.GEN_CLOSED else None

    def _check_idle(self, action: str) -> None:
        if self._live_pass() is not None:
            raise StateError(
                f"cannot {action}: this loader is already being iterated; finish or close the first iterator, "
                "or make a second loader"
            )

    def __iter__(self) -> Iterator[dict[str, Any]]:
        with self._live_lock:
            self._check_idle("start a second pass")
            gen = self._pass()
            self._live = weakref.ref(gen)
        return gen

    def _pass(self) -> Generator[dict[str, Any], None, None]:
        """One pass: the rest of the current epoch, then the epoch advances."""
        batches = self.batches()
        start = self._position
        if batches and start >= len(batches):  # resumed at an epoch's end: go on with the next
            self.epoch, self._position, self._segments = self.epoch + 1, 0, ()
            batches, start = self.batches(), 0
        epoch = self.epoch
        timer = PassTimer(epoch)
        try:
            yield from self._read(batches, start, epoch, timer)
        finally:
            self._stats.append(timer.finish(complete=self._position >= len(batches)))
            if self.options.report:
                print(self._stats[-1].line(), file=sys.stderr, flush=True)
        if self._position >= len(batches):
            self.epoch += 1
            self._position = 0
            self._segments = ()

    def _read(
        self, batches: list[np.ndarray], start: int, epoch: int, timer: PassTimer
    ) -> Generator[dict[str, Any], None, None]:
        """The batches ``start..`` of ``epoch``, read ahead on the reader threads; ``timer`` is told
        when each is handed over and when the next is asked for."""
        o = self.options
        self.source.warm()  # lazy maps/indexes are built before threads race for them
        src = self.source  # looked up per pass: a benchmark may wrap the source between passes
        self._get_batch = getattr(src, "get_valid_batch", None) or src.get_batch
        # Bytes per image handed, where every batch's image is the source's own layout (nothing
        # reshapes or converts it): counted without looking at each batch (a microsecond a batch).
        # A finisher says what it hands out with an ``image_nbytes`` attribute (bytes per image,
        # 0: unknown): a torch tensor's ``nbytes`` on the calling thread cost 7-15 us a batch here.
        per = 0
        if self._image_bytes and self.transform is None and self._online is None:
            per = self._image_bytes if self.finisher is None else int(getattr(self.finisher, "image_nbytes", 0) or 0)
        g = self._group
        groups = [batches[s : s + g] for s in range(start, len(batches), g)]
        fetch = source_prefetch(src)
        lead = -(-o.fetch_ahead // g)  # groups named ahead, >= fetch_ahead batches
        if o.prefetch == 0 or self._workers == 0:
            self._drop_carry()
            k = start
            hints = _Hints(fetch, groups, lead)
            for q, group in enumerate(groups):  # prefetch=0 reads one batch at a time (groups of one)
                hints.reach(q)
                for batch in self._load_group(group, epoch):
                    n = len(batches[k])
                    timer.handed(n, n * per if per else batch_nbytes(batch))
                    k += 1
                    self._position = k
                    yield batch
                    timer.asked()
            return
        ahead = max(1, -(-o.prefetch // g))  # groups read ahead, >= prefetch batches
        pool = self._executor(min(self._workers, ahead))
        pending: deque[_Read] = deque(self._take_carry(epoch, start))
        nxt = len(pending)  # reads made ahead are this epoch's first groups
        hints = _Hints(fetch, groups, lead, done=nxt)  # the last pass named the groups it read ahead
        follow: list[_Read] = []  # the next epoch's first groups, read ahead once this one's are all submitted
        after: list[list[np.ndarray]] | None = None

        def submit(group: list[np.ndarray], e: int) -> _Read:
            return _Read(pool.submit(self._load_group, group, e), group, e)

        def top_up() -> None:
            nonlocal nxt, after
            while len(pending) + len(follow) < ahead:
                if nxt < len(groups):
                    hints.reach(nxt)
                    pending.append(submit(groups[nxt], epoch))
                    nxt += 1
                    continue
                if not o.read_ahead_epochs or self.transform is not None:  # a transform sees only its pass's batches
                    return
                if after is None:  # the natural next pass: epoch + 1 from its first batch
                    nb = self.batches(epoch + 1)
                    after = [nb[s : s + g] for s in range(0, len(nb), g)]
                if len(follow) >= len(after):
                    return
                if fetch is not None and lead > 0:  # named as it is read ahead; the next pass names the rest
                    fetch(np.concatenate(after[len(follow)]))
                follow.append(submit(after[len(follow)], epoch + 1))

        top_up()
        if self._order_ahead is None or self._order_ahead[0] != epoch + 1:
            # The next epoch's order, drawn by a reader thread after this epoch's first reads (a
            # permutation releases the GIL): 14 % of a 32x32 epoch in the calling thread here, and
            # seconds at each epoch's start for 10 million samples.
            self._order_ahead = (epoch + 1, o, pool.submit(self._rank_order, epoch + 1, ()))
        k = start
        try:
            while pending:
                r = pending.popleft()
                if self._inline and r.future.cancel():  # no thread has started it: read it here, not wait for one
                    top_up()
                    loaded = self._load_group(r.group, epoch)
                else:
                    if self._inline and pending and not r.future.done():
                        self._steal(pending, epoch)
                    loaded = r.future.result()
                    top_up()  # before yielding, so reads overlap the caller's step
                for batch in loaded:
                    n = len(batches[k])
                    timer.handed(n, n * per if per else batch_nbytes(batch))
                    k += 1
                    self._position = k
                    yield batch
                    timer.asked()
        finally:
            for r in pending:
                r.future.cancel()
            wait([r.future for r in pending])  # no read of this epoch outlives the pass
            if follow and k == len(batches):
                self._carry = (epoch + 1, follow)
            else:
                for r in follow:
                    r.future.cancel()
                wait([r.future for r in follow])  # off, or a pass stopped early: nothing read after it

    # ------------------------------------------------------------------ resume

    def _fingerprint(self) -> str:
        return self.source.fingerprint()

    def _selection_state(self) -> dict[str, Any]:
        """What a state records of the selection: a whole store is the selection ``0..N-1``, so a
        state made without ``indices`` and one made with ``indices=range(N)`` are the same."""
        if self._sel_state is None:
            sel = self.selection if self.selection is not None else np.arange(len(self.source), dtype=np.int64)
            self._sel_state = {"split": self.split, "count": len(sel), "digest": selection_digest(sel)}
        return dict(self._sel_state)

    def state_dict(self) -> dict[str, Any]:
        """A JSON-serialisable state; :meth:`load_state_dict` resumes after the last batch handed out.

        ``segments`` lists the earlier parts of the current epoch that ran at another world size
        (``world_size`` and ``position``, batches per rank), oldest first; the current part is
        ``options.world_size`` and ``position``. Every rank of a run saves the same state but its
        ``rank``, so any rank's state describes the whole run.
        """
        o = asdict(self.options)
        o["block_size"] = self.block_size  # resolved: the run length this loader's orders were drawn with
        return {
            "version": STATE_VERSION,
            "dataset": self._fingerprint(),
            "count": len(self.source),
            "epoch": self.epoch,
            "position": self._position,
            "segments": [{"world_size": w, "position": p} for w, p in self._segments],
            "options": o,
            "selection": self._selection_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`; refuses a state of another dataset, selection or order.

        A state saved at another world size (or by another rank) resumes elastically: the samples
        of the epoch that no rank of the saving run had handed out are split over this run's ranks
        as an epoch is (docs/loader.md, "Elastic resume"). This assumes every rank of the saving run
        saved at the same step, as data-parallel training does. At the same world size the run
        continues exactly. The position may be at most the epoch's number of batches per rank
        (equal to it is the "epoch just finished" state: the next pass starts the following epoch).
        """
        self._check_idle("load_state_dict")
        self._drop_carry()  # the state may start anywhere; reads made ahead are for the natural next pass
        if not isinstance(state, dict) or not isinstance(state.get("version"), int):
            raise StateError("not a dlpack loader state (no integer 'version')")
        if not isinstance(state.get("options"), dict):
            raise StateError("not a dlpack loader state (no 'options' dict)")
        if state["version"] > STATE_VERSION:
            raise StateError(f"loader state version {state['version']} is newer than this dlpack ({STATE_VERSION})")
        if state["version"] < STATE_VERSION:
            raise StateError(f"loader state version {state['version']} is not one this dlpack reads ({STATE_VERSION})")
        saved = state["options"]
        mine = asdict(self.options)
        mine["block_size"] = self.block_size
        for key in AUGMENT_OPTIONS:  # first: a state of cached views is also a state of other data
            if _json(saved.get(key, AUGMENT_OPTIONS[key])) != _json(mine[key]):
                raise StateError(
                    f"this state was saved with {key}={saved.get(key, AUGMENT_OPTIONS[key])!r} but the loader has "
                    f"{key}={mine[key]!r}; resume with the same augmentation options (they pick each epoch's views)"
                )
        if state.get("dataset") != self._fingerprint() or state.get("count") != len(self.source):
            where = getattr(self.source, "path", type(self.source).__name__)
            raise StateError(
                f"this state was saved for another dataset ({state.get('count')} samples, id {state.get('dataset')}); "
                f"this one is {where} ({len(self.source)} samples, id {self._fingerprint()})"
            )
        mine_sel = self._selection_state()
        saved_sel = state.get("selection")
        if not isinstance(saved_sel, dict):
            raise StateError("not a dlpack loader state (no 'selection' dict)")
        if saved_sel.get("digest") != mine_sel["digest"] or saved_sel.get("count") != mine_sel["count"]:
            raise StateError(
                f"this state was saved for another selection of samples ({_describe(saved_sel)}); "
                f"this loader selects {_describe(mine_sel)}; resume with the same split or indices"
            )
        for key in ("batch_size", "seed", "order", "shuffle", "drop_last", "block_size", "window"):
            if saved.get(key) != mine[key]:
                raise StateError(
                    f"this state was saved with {key}={saved.get(key)!r} but the loader has {key}={mine[key]!r}; "
                    "resume with the same options (workers, prefetch, world_size and rank may differ)"
                )
        epoch, position, world_size = state.get("epoch"), state.get("position"), saved.get("world_size")
        if not isinstance(epoch, int) or not isinstance(position, int) or epoch < 0 or position < 0:
            raise StateError(f"state has an invalid epoch/position: {epoch!r}/{position!r}")
        if not _count(world_size, 1):
            raise StateError(f"state has an invalid options.world_size: {world_size!r} (an integer >= 1)")
        segments = _segments(state)
        images, drop_last = self.options.batch_size // self.options.views_per_batch, self.options.drop_last
        rest = self._global(epoch)
        for k, (size, done) in enumerate(segments):
            count = batch_count(len(rest), size, images, drop_last)
            if not 0 < done < count:  # a segment that handed out nothing, or finished the epoch, ends no part of it
                raise StateError(
                    f"state segment {k} (world_size {size}, position {done}) is not inside epoch {epoch}, which had "
                    f"{count} batches per rank at that point; was it edited or made for another loader?"
                )
            rest = remaining_order(rest, size, done, images, drop_last)
        total = batch_count(len(rest), world_size, images, drop_last)
        if position > total:
            raise StateError(
                f"state position {position} is past the end of epoch {epoch}, which has {total} batches "
                f"per rank at world_size {world_size}; was it edited or made for another loader?"
            )
        left: np.ndarray | None = rest  # what this loader's ranks split, when it is of this epoch
        if world_size != self.options.world_size:
            if position == total and total > 0:  # the saving run finished this epoch: start the next
                epoch, position, segments, left = epoch + 1, 0, (), None
            elif position > 0:  # what the saving run left of this epoch is split over this run's ranks
                left = remaining_order(rest, world_size, position, images, drop_last)
                segments, position = (*segments, (world_size, position)), 0
        self.epoch, self._position, self._segments = epoch, position, segments
        if left is not None:  # the epoch's order is drawn once (a permutation of 10M samples takes seconds)
            o = self.options
            self._order_cache = (epoch, segments, rank_indices(left, o.rank, o.world_size, o.drop_last))

    def __repr__(self) -> str:
        sel = "" if self.selection is None else f" selection={self.split or 'indices'}:{len(self.selection)}"
        return (
            f"<dlpack.Loader epoch={self.epoch} position={self._position}{sel} {self._workers_why} "
            f"{json.dumps(asdict(self.options))}>"
        )

    @property
    def workers(self) -> int:
        """The reader threads this loader uses (what ``workers="auto"`` resolved to; 0: none)."""
        return self._workers


#: The augmentation options a state records, and what a state written before them means.
AUGMENT_OPTIONS: dict[str, Any] = {"augment": None, "original_rate": None, "views_per_batch": 1, "online": None}


def _json(value: Any) -> str:
    """``value`` as canonical JSON, so a state's option compares equal to the loader's after a JSON round trip."""
    return json.dumps(value, sort_keys=True)


def _count(value: Any, minimum: int) -> bool:
    """Whether a state field is an integer >= ``minimum`` (JSON gives plain ints; bools are refused)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def _segments(state: dict[str, Any]) -> tuple[tuple[int, int], ...]:
    """A state's ``segments`` as ``(world_size, position)`` pairs."""
    raw = state.get("segments")
    if not isinstance(raw, list):
        raise StateError("not a dlpack loader state (no 'segments' list)")
    out = []
    for k, seg in enumerate(raw):
        if not isinstance(seg, dict) or not _count(seg.get("world_size"), 1) or not _count(seg.get("position"), 0):
            raise StateError(
                f"state segment {k} is {seg!r}; each segment is {{'world_size': int >= 1, 'position': int >= 0}}"
            )
        out.append((int(seg["world_size"]), int(seg["position"])))
    return tuple(out)


def _describe(selection: dict[str, Any]) -> str:
    """``split 'train', 60000 samples, id 1a2b...`` for a state's selection record."""
    split = selection.get("split")
    name = f"split {split!r}" if isinstance(split, str) else "indices"
    return f"{name}, {selection.get('count')} samples, id {selection.get('digest')}"


class _Selectable(BatchSource, Protocol):
    def indices(self, split: str) -> np.ndarray: ...


def source_loader(
    source: _Selectable,
    options: LoaderOptions | None,
    transform: Callable[..., dict[str, Any]] | None,
    split: str | None,
    indices: Sequence[int] | np.ndarray | None,
    kwargs: dict[str, Any],
) -> Loader:
    """What ``ds.loader(...)`` of a store or a DLDataset view returns: ``kwargs`` as LoaderOptions
    fields (an unknown one an OptionError), over ``split``'s samples or ``indices``."""
    from ..options import with_keywords

    opts = with_keywords(options, LoaderOptions, kwargs, "loader", also=("transform", "split", "indices"))
    if split is not None and indices is not None:
        raise OptionError("pass split or indices, not both (ds.indices(split) gives a split's indices)")
    if split is not None:
        indices = source.indices(split)
    return Loader(source, opts, transform, indices=indices, split=split)
