"""The training loader: exact per-epoch shuffles, rank shards, read-ahead on threads, exact resume.

Why threads: image bytes come from memory maps and numpy copies release the GIL, so threads
read at memory speed with no copy between processes; worker processes would have to pickle every
batch (25 MB at 32 x 512x512x3), which caps a PyTorch DataLoader near 2.8k images/s on 2 cores
(docs/benchmarks.md, "Loader").

The order of an epoch depends only on (seed, epoch, order options, rank, world_size) and the
selection of samples (a split, or any indices), never on worker count or timing, so any
worker/prefetch setting yields the same batches. The loader reads
any :class:`BatchSource` (a store, the bench's folder reader, a view of either) and passes it the
epoch, so per-epoch views and online augmentation draw their randomness from
:func:`sample_rng` (seed, epoch, index) without touching the threading here.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import sys
import threading
import weakref
from collections import deque
from collections.abc import Callable, Generator, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np

from .errors import OptionError, StateError
from .timing import EpochStats, PassTimer, batch_nbytes

__all__ = ["BatchSource", "Loader", "LoaderOptions", "epoch_order", "rank_indices", "sample_rng"]


@runtime_checkable
class BatchSource(Protocol):
    """What the loader reads: a store, a folder read on the fly, or a view over either.

    ``get_batch`` receives validated indices (``0 <= i < len``) and the epoch, and returns at least
    ``{"image": B x H x W x C array (a list for variable sizes), "index": indices}``; when ``out``
    is given (fixed sizes only) the images are written into it. ``warm`` builds lazy maps and
    indexes before reader threads start; ``fingerprint`` identifies the content, so a loader state
    is never restored onto other data; ``image_layout`` is ``((H, W, C), dtype)`` when every image
    has that shape (the loader then recycles batch arrays), else None.
    """

    def __len__(self) -> int: ...

    def get_batch(self, indices: np.ndarray, epoch: int = 0, out: np.ndarray | None = None) -> dict[str, Any]: ...

    def warm(self) -> None: ...

    def fingerprint(self) -> str: ...

    def image_layout(self) -> tuple[tuple[int, ...], str] | None: ...


#: Tags keep the loader's random streams independent of each other.
_ORDER_TAG = 0x646C70
_SAMPLE_TAG = 0x736D70


def sample_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    """The random generator of one sample in one epoch: a pure function of its arguments.

    Never of the worker, thread, batch composition or timing, so online augmentation and
    per-epoch views give the same result with any number of workers and after a resume.
    """
    return np.random.default_rng([int(seed), int(epoch), int(index), _SAMPLE_TAG])


#: 2: states record the selection of samples (version 1 states, which have none, mean every sample).
STATE_VERSION = 2
Order = Literal["random", "sequential", "block"]


@dataclass(frozen=True)
class LoaderOptions:
    """How a :class:`Loader` walks a store.

    ``order=None`` means ``"random"`` when ``shuffle`` else ``"sequential"``. ``prefetch`` is the
    number of batches read ahead (4 by default: a read-ahead 3-6 batches deep keeps a GPU fed;
    0 reads each batch when asked). ``workers`` threads share that read-ahead.

    Augmentation (docs/loader.md, "Cached augmentation views"): ``augment="cached"`` serves each
    sample the stored view (original or variant) its schedule picks for the epoch;
    ``original_rate`` serves the original with that probability per epoch instead;
    ``views_per_batch=m`` puts m different views of each image into one batch (``batch_size``
    rows, ``batch_size / m`` images); ``online`` (True, a dict or a
    :class:`~dlpack.transforms.online.OnlineAugment`, kept as its dict) re-applies a cheap seeded
    layer (flips, quarter turns, brightness/contrast) on the reader threads. All off by default.

    ``report=True`` prints one line per pass to stderr (:meth:`Loader.stats` keeps them all):
    ``epoch 3: 41,212 img/s, waited 2.1 % of the time (p99 0.4 ms)``.
    """

    batch_size: int = 32
    shuffle: bool = True
    seed: int = 0
    drop_last: bool = False
    prefetch: int = 4
    workers: int = 2
    rank: int = 0
    world_size: int = 1
    order: Order | None = None
    # Block order for cold storage: runs of consecutive samples are shuffled, then samples are
    # shuffled inside windows of runs; 64 x 16 keeps reads sequential-ish and mixing wide.
    block_size: int = 64
    window: int = 16
    augment: Literal["cached"] | None = None
    original_rate: float | None = None
    views_per_batch: int = 1
    online: dict[str, Any] | None = None
    report: bool = False

    def __post_init__(self) -> None:
        def positive(name: str, value: int, minimum: int = 1) -> None:
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < minimum:
                raise OptionError(f"{name} must be an integer >= {minimum}, got {value!r}")
            object.__setattr__(self, name, int(value))  # NumPy integers would break JSON states

        positive("seed", self.seed, 0)
        positive("batch_size", self.batch_size)
        positive("prefetch", self.prefetch, 0)
        positive("workers", self.workers, 0)
        positive("world_size", self.world_size)
        positive("block_size", self.block_size)
        positive("window", self.window)
        rank = self.rank
        if not isinstance(rank, (int, np.integer)) or isinstance(rank, bool) or not 0 <= rank < self.world_size:
            raise OptionError(
                f"rank must be in 0..{self.world_size - 1} for world_size {self.world_size}, got {rank!r}"
            )
        object.__setattr__(self, "rank", int(rank))
        if self.order is not None and self.order not in ("random", "sequential", "block"):
            raise OptionError(f"order must be random, sequential or block, got {self.order!r}")
        self._check_augment(positive)

    def _check_augment(self, positive: Callable[[str, int, int], None]) -> None:
        if self.augment not in (None, "cached"):
            raise OptionError(
                f"augment must be None or 'cached' (serve the store's augmentation variants), got {self.augment!r}"
            )
        positive("views_per_batch", self.views_per_batch, 1)
        m = self.views_per_batch
        if m > 1 and self.augment != "cached":
            raise OptionError(
                f"views_per_batch={m} serves {m} stored views of each image in a batch; pass augment='cached' "
                "(a store with variants), or views_per_batch=1"
            )
        if self.batch_size % m:
            raise OptionError(
                f"views_per_batch={m} must divide batch_size={self.batch_size}: a batch holds batch_size / "
                f"views_per_batch images, {m} rows each"
            )
        if self.original_rate is not None:
            from .variants.schedule import check_rate

            object.__setattr__(self, "original_rate", check_rate(self.original_rate))
            if self.augment != "cached":
                raise OptionError(
                    "original_rate chooses between the original and the cached variants; pass augment='cached'"
                )
        object.__setattr__(self, "online", online_dict(self.online))

    @property
    def effective_order(self) -> Order:
        if self.order is not None:
            return self.order
        return "random" if self.shuffle else "sequential"


def online_layer(value: Any) -> Any:
    """The :class:`~dlpack.transforms.online.OnlineAugment` that ``online=`` names (imported on first use)."""
    try:
        from .transforms.online import OnlineAugment
    except ImportError as exc:
        raise OptionError(f"online= needs dlpack.transforms.online, which cannot be imported: {exc}") from exc
    try:
        return OnlineAugment.from_value(value)
    except OptionError as exc:
        if "online" in str(exc):
            raise
        raise OptionError(f"online: {exc}") from exc
    except (TypeError, ValueError, KeyError) as exc:
        raise OptionError(f"online must be True, a dict of OnlineAugment fields or an OnlineAugment: {exc}") from exc


def online_dict(value: Any) -> dict[str, Any] | None:
    """``online=`` in the form states keep: None when off, else the layer's JSON-ready dict."""
    if value is None or value is False:
        return None
    out = online_layer(value).to_dict()
    if not isinstance(out, dict):
        raise OptionError(f"online: OnlineAugment.to_dict() gave {type(out).__name__}, not a dict")
    return dict(out)


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


def rank_indices(order: np.ndarray, rank: int, world_size: int, drop_last: bool) -> np.ndarray:
    """This rank's contiguous share of the epoch order, equal in size on every rank.

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
        self._bufs: list[np.ndarray] = []
        self._lock = threading.Lock()

    def use_allocator(self, allocator: Callable[[int], np.ndarray]) -> None:
        """Make the blocks from now on with ``allocator``; free blocks made otherwise are dropped
        (a block still held by a batch stays with that batch until it is dropped)."""
        with self._lock:
            self.allocator = allocator
            self._bufs.clear()

    def _batch(self, block: np.ndarray, n: int) -> np.ndarray:
        offset = (_PAGE_OFFSET - block.ctypes.data) % _PAGE
        batch: np.ndarray = np.ndarray((n, *self.shape[1:]), dtype=self.dtype, buffer=block, offset=offset)
        return batch

    def take(self, n: int) -> np.ndarray:
        """An array of ``n`` batch rows that nobody else holds."""
        with self._lock:
            for block in self._bufs:
                # Referrers of a free block: the list, the loop variable and getrefcount's argument.
                if sys.getrefcount(block) <= 3:
                    return self._batch(block, n)
            if len(self._bufs) < self.limit:
                size = self._nbytes + _PAGE
                block = np.empty(size, dtype=np.uint8) if self.allocator is None else self.allocator(size)
                self._bufs.append(block)
                return self._batch(block, n)
        return np.empty((n, *self.shape[1:]), dtype=self.dtype)


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
            source = cached(o.seed, original_rate=o.original_rate, views_per_batch=o.views_per_batch)
        self.source = source
        self.transform = transform
        #: Applied to each batch after ``transform``, on the reader thread that read it (the PyTorch
        #: adapter converts there, so the caller's thread only receives finished tensors).
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
        self._threads: tuple[int, ThreadPoolExecutor] | None = None
        self._order_cache: tuple[int, np.ndarray] | None = None
        # The live pass, weakly: a dropped iterator frees the loader even if it never started
        # (an unstarted generator runs no ``finally``).
        self._live: weakref.ref[Generator[dict[str, Any], None, None]] | None = None
        self._live_lock = threading.Lock()
        self._stats: list[EpochStats] = []
        layout = source.image_layout()
        # Batches per worker task: enough for about 2 MiB, so small images amortise the handoff.
        self._group = 1
        self._pool = None
        if layout is not None:
            shape, dtype = layout
            batch_bytes = self.options.batch_size * int(np.prod(shape)) * np.dtype(dtype).itemsize
            self._group = max(1, min(64, (2 * 2**20) // max(1, batch_bytes)))
            limit = max(self.options.prefetch, self._group) + 2 * self._group
            self._pool = _BufferPool((self.options.batch_size, *shape), dtype, limit)

    @property
    def dataset(self) -> BatchSource:
        """The source read (kept under its first name)."""
        return self.source

    # ------------------------------------------------------------------ order

    def _indices(self, epoch: int) -> np.ndarray:
        if self._order_cache is None or self._order_cache[0] != epoch:
            o = self.options
            sel = self.selection
            glob = epoch_order(
                len(self.source) if sel is None else len(sel), o.seed, epoch, o.effective_order, o.block_size, o.window
            )
            if sel is not None:
                glob = sel[glob]  # the same shuffle, over the selection's positions
            self._order_cache = (epoch, rank_indices(glob, o.rank, o.world_size, o.drop_last))
        return self._order_cache[1]

    def batches(self, epoch: int | None = None) -> list[np.ndarray]:
        """The index batches of an epoch for this rank, in the order they are yielded."""
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
        self.epoch = int(epoch)
        self._position = 0

    # ------------------------------------------------------------------ reading

    def _executor(self, workers: int) -> ThreadPoolExecutor:
        """The reader threads, kept across epochs (starting threads costs as much as a small epoch)."""
        if self._threads is None or self._threads[0] != workers:
            self.close()
            self._threads = (workers, ThreadPoolExecutor(max_workers=workers, thread_name_prefix="dlpack"))
        return self._threads[1]

    def close(self) -> None:
        """Stop the reader threads (they also stop when the loader is garbage-collected)."""
        if self._threads is not None:
            self._threads[1].shutdown(wait=False, cancel_futures=True)
            self._threads = None

    def __del__(self) -> None:
        threads = getattr(self, "_threads", None)
        if threads is not None:
            threads[1].shutdown(wait=False, cancel_futures=True)

    def _load_group(self, group: list[np.ndarray], epoch: int) -> list[dict[str, Any]]:
        return [self._load(indices, epoch) for indices in group]

    def _load(self, indices: np.ndarray, epoch: int) -> dict[str, Any]:
        batch = self._transformed(indices, epoch)
        return batch if self.finisher is None else self.finisher(batch)

    def _transformed(self, indices: np.ndarray, epoch: int) -> dict[str, Any]:
        out = self._pool.take(len(indices)) if self._pool is not None else None
        batch = self.source.get_batch(indices, epoch, out)
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
            self.epoch, self._position = self.epoch + 1, 0
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

    def _read(
        self, batches: list[np.ndarray], start: int, epoch: int, timer: PassTimer
    ) -> Generator[dict[str, Any], None, None]:
        """The batches ``start..`` of ``epoch``, read ahead on the reader threads; ``timer`` is told
        when each is handed over and when the next is asked for."""
        o = self.options
        self.source.warm()  # lazy maps/indexes are built before threads race for them
        if o.prefetch == 0 or o.workers == 0:
            for k in range(start, len(batches)):
                batch = self._load(batches[k], epoch)
                self._position = k + 1
                timer.handed(len(batches[k]), batch_nbytes(batch))
                yield batch
                timer.asked()
        else:
            # Small batches travel in groups: handing one batch to a thread costs more than
            # reading 400 KB (64x64 images ran at 0.13x the memmap gather one batch per task).
            g = self._group
            groups = [batches[s : s + g] for s in range(start, len(batches), g)]
            ahead = max(1, -(-o.prefetch // g))  # groups read ahead, >= prefetch batches
            pool = self._executor(min(o.workers, ahead))
            pending: deque[Future[list[dict[str, Any]]]] = deque()
            nxt = 0

            def top_up() -> None:
                nonlocal nxt
                while nxt < len(groups) and len(pending) < ahead:
                    pending.append(pool.submit(self._load_group, groups[nxt], epoch))
                    nxt += 1

            top_up()
            try:
                k = start
                for _ in range(len(groups)):
                    loaded = pending.popleft().result()
                    top_up()  # before yielding, so reads overlap the caller's step
                    for batch in loaded:
                        timer.handed(len(batches[k]), batch_nbytes(batch))
                        k += 1
                        self._position = k
                        yield batch
                        timer.asked()
            finally:
                for f in pending:
                    f.cancel()
                wait(pending)  # no read outlives the iteration (bench evicts files right after)

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
        """A JSON-serialisable state; :meth:`load_state_dict` resumes after the last batch handed out."""
        o = asdict(self.options)
        return {
            "version": STATE_VERSION,
            "dataset": self._fingerprint(),
            "count": len(self.source),
            "epoch": self.epoch,
            "position": self._position,
            "options": o,
            "selection": self._selection_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`; refuses a state of another dataset, world size or order.

        The position may be at most the epoch's number of batches on this rank (equal to it is the
        "epoch just finished" state: the next pass starts the following epoch).
        """
        self._check_idle("load_state_dict")
        if not isinstance(state, dict) or not isinstance(state.get("version"), int):
            raise StateError("not a dlpack loader state (no integer 'version')")
        if not isinstance(state.get("options"), dict):
            raise StateError("not a dlpack loader state (no 'options' dict)")
        if state["version"] > STATE_VERSION:
            raise StateError(f"loader state version {state['version']} is newer than this dlpack ({STATE_VERSION})")
        saved = state["options"]
        mine = asdict(self.options)
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
        if state["version"] < 2:  # made before selections: it walked the whole store
            whole = np.arange(len(self.source), dtype=np.int64)
            saved_sel: Any = {"split": None, "count": len(whole), "digest": selection_digest(whole)}
        else:
            saved_sel = state.get("selection")
            if not isinstance(saved_sel, dict):
                raise StateError("not a dlpack loader state (no 'selection' dict)")
        if saved_sel.get("digest") != mine_sel["digest"] or saved_sel.get("count") != mine_sel["count"]:
            raise StateError(
                f"this state was saved for another selection of samples ({_describe(saved_sel)}); "
                f"this loader selects {_describe(mine_sel)}; resume with the same split or indices"
            )
        for key in (
            "world_size",
            "rank",
            "batch_size",
            "seed",
            "order",
            "shuffle",
            "drop_last",
            "block_size",
            "window",
        ):
            if saved.get(key) != mine[key]:
                raise StateError(
                    f"this state was saved with {key}={saved.get(key)!r} but the loader has {key}={mine[key]!r}; "
                    "resume with the same options (workers and prefetch may differ)"
                )
        epoch, position = state.get("epoch"), state.get("position")
        if not isinstance(epoch, int) or not isinstance(position, int) or epoch < 0 or position < 0:
            raise StateError(f"state has an invalid epoch/position: {epoch!r}/{position!r}")
        total = len(self.batches(epoch))
        if position > total:
            raise StateError(
                f"state position {position} is past the end of epoch {epoch}, which has {total} batches "
                f"on rank {self.options.rank} of {self.options.world_size}; was it edited or made for another loader?"
            )
        self.epoch, self._position = epoch, position

    def __repr__(self) -> str:
        sel = "" if self.selection is None else f" selection={self.split or 'indices'}:{len(self.selection)}"
        return f"<dlpack.Loader epoch={self.epoch} position={self._position}{sel} {json.dumps(asdict(self.options))}>"


#: The augmentation options a state records, and what a state written before them means.
AUGMENT_OPTIONS: dict[str, Any] = {"augment": None, "original_rate": None, "views_per_batch": 1, "online": None}


def _json(value: Any) -> str:
    """``value`` as canonical JSON, so a state's option compares equal to the loader's after a JSON round trip."""
    return json.dumps(value, sort_keys=True)


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
    from .options import with_keywords

    opts = with_keywords(options, LoaderOptions, kwargs, "loader", also=("transform", "split", "indices"))
    if split is not None and indices is not None:
        raise OptionError("pass split or indices, not both (ds.indices(split) gives a split's indices)")
    if split is not None:
        indices = source.indices(split)
    return Loader(source, opts, transform, indices=indices, split=split)
