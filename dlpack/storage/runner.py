"""The one block runner of build, ``build --update`` and ``augment``: fan blocks out, land them, journal them.

A block is a whole shard (of one variant, for ``augment``): one task of the pool, which computes
(and may write) it; the driver then lands it (writes what the task did not, records its samples)
and journals it, in block order, so the bytes written never depend on the pool. Opening a partial
store, verifying its journalled blocks and committing it stay with the callers, which hand the
runner only the blocks still to do. The pool is passed in (:class:`Pool`): today the local
worker processes of :class:`dlpack._parallel.LocalPool`; it also owns the progress bar, whose
ticks travel with each task.
"""

from __future__ import annotations

import threading
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np

from .._interrupt import InterruptsHeld
from ..backends import StoreWriter
from ..errors import StoreError
from .journal import BuildJournal, JournalState, Record, Restart, read_journal

__all__ = ["Call", "Checked", "Pool", "Progress", "block_checks_out", "resume_journal", "run_blocks"]

#: One task: a module-level (picklable) function with its arguments, as ``joblib.delayed`` makes them.
Call = tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]

B = TypeVar("B")
R = TypeVar("R", bound="Record")


class Progress(Protocol):
    """A progress bar over blocks: ``ticks(slot)`` goes with block ``slot``'s task, ``finished`` when it lands."""

    bar: Any

    def ticks(self, slot: int) -> Any:
        """What block ``slot``'s task tells the bar by as it works (picklable)."""
        ...

    def finished(self, slot: int, n: int) -> None:
        """Block ``slot`` landed, with ``n`` samples."""
        ...


class Pool(Protocol):
    """Where the tasks of a block run: results come back in the order of the calls."""

    n_jobs: int

    def pooled(self, n_calls: int) -> bool:
        """Whether ``n_calls`` calls run elsewhere (else one by one in this process, as they are drawn)."""
        ...

    def imap(self, calls: Iterable[Call], count: int) -> Iterator[Any]:
        """Run ``calls`` (drawn only as the pool takes them), yielding each result in call order."""
        ...

    def progress(self, total: int, desc: str, quiet: bool, blocks: int) -> AbstractContextManager[Progress]:
        """A bar over ``total`` samples in ``blocks`` blocks, told by the tasks' ticks as they work."""
        ...


def run_blocks(
    pool: Pool,
    blocks: Sequence[B],
    work: Callable[[B, Any], Call],
    land: Callable[[B, Any], tuple[Sequence[Any] | None, int]],
    *,
    journal: BuildJournal | None = None,
    unit: Callable[[B], int] | None = None,
    progress: tuple[int, str, bool, int | None] = (0, "", True, None),
    behind: bool = False,
) -> None:
    """Run ``work(block, ticks)`` for every block through ``pool``, then ``land(block, result)`` here.

    ``land`` returns the records to journal for the block (None: not journalled) and its sample
    count for the bar; the journal line is written only once the block is landed, as ``unit(block)``
    (the block itself by default). ``progress`` is (samples, label, quiet, samples already done, told to the bar first unless None).
    ``behind``: when the tasks run in this process, each block is landed (and journalled) in a
    writing thread while the next one is computed, so a write that waits on the disk does not hold
    up the decode; the bytes and their order do not change, and a stop while computing still lands
    the block already handed to the thread.
    """
    total, desc, quiet, already = progress
    key: Callable[[B], Any] = unit or (lambda b: b)

    def landed(slot: int, block: B, result: Any, bar: Progress) -> None:
        records, n = land(block, result)
        if journal is not None and records is not None:
            journal.append_block(key(block), records)
        bar.finished(slot, n)

    with pool.progress(total, desc, quiet, len(blocks)) as bar:
        if already is not None:
            bar.bar.update(already)
        calls = (work(b, bar.ticks(j)) for j, b in enumerate(blocks))
        results = pool.imap(calls, len(blocks))
        # next() by hand below: zip and enumerate keep their last items until they make the next,
        # which would keep one more block of pixels alive while the next one is computed.
        if not (behind and not pool.pooled(len(blocks))):
            for slot, block in enumerate(blocks):
                result = next(results)
                landed(slot, block, result, bar)
                del result
            return
        # Set once a land failed or was stopped: the block queued after it is not landed, so the
        # journal ends at the block that failed.
        stop = threading.Event()

        def land_behind(slot: int, block: B, result: Any) -> None:
            if stop.is_set():
                return
            try:
                landed(slot, block, result, bar)
            except BaseException:
                stop.set()
                raise

        # A build stopped while computing still lands the block handed to the writing thread.
        with ThreadPoolExecutor(1, thread_name_prefix="dlpack-write") as writer:
            # The thread is started now and each block handed over with Ctrl-C held: one raised
            # while ``submit`` starts the thread leaves one the executor never tells to stop, which
            # waits for work forever and keeps the process from exiting.
            with InterruptsHeld():
                writer.submit(int).result()
            pending: Future[None] | None = None
            for slot, block in enumerate(blocks):
                result = next(results)
                with InterruptsHeld():
                    queued = writer.submit(land_behind, slot, block, result)
                del result  # the thread holds it until landed: two blocks in memory at most
                if pending is not None:
                    pending.result()  # a failed land (or journal line) raises here
                pending = queued
            if pending is not None:
                pending.result()


def resume_journal(
    path: Path | None,
    header: dict[str, Any],
    from_record: Callable[[Sequence[Any]], R],
    no_resume: bool,
    changed: Callable[[dict[str, Any]], str],
    read: Callable[[Any, Callable[[Sequence[Any]], R]], JournalState[R]] = read_journal,
) -> JournalState[R]:
    """The state of the journal at ``path`` (read by ``read``: a site's journal need not be a file)
    when it records this very run (``header``'s fingerprint), else :class:`Restart` saying why not
    (``changed(old header)`` when the fingerprint differs)."""
    if no_resume:
        raise Restart("--no-resume")
    state = read(path, from_record)
    if state.header.get("fingerprint") != header.get("fingerprint"):
        raise Restart(changed(state.header))
    return state


class Checked(Protocol):
    """A journalled row's record: the CRC-32 of its stored image and, beside a mask array, of its mask."""

    @property
    def checksum(self) -> int:
        """CRC-32 of the row's stored image bytes."""
        ...

    @property
    def mask_crc(self) -> int | None:
        """CRC-32 of the row's stored mask bytes (None without masks)."""
        ...


def block_checks_out(writer: StoreWriter, start: int, records: Sequence[Checked], image: str, mask: str | None) -> bool:
    """Whether the journalled block of ``records`` at ``start`` reads back from ``writer`` with their
    CRC-32s: array ``image`` and, when named, array ``mask``. A block that cannot be read does not:
    a resume writes it again."""
    stop = start + len(records)
    try:
        stored = writer.read_block(image, start, stop)
        masks = None if mask is None else writer.read_block(mask, start, stop)
    except StoreError:
        return False
    return all(
        zlib.crc32(np.ascontiguousarray(row).data) == r.checksum for row, r in zip(stored, records, strict=True)
    ) and (
        masks is None
        or all(zlib.crc32(np.ascontiguousarray(m).data) == r.mask_crc for m, r in zip(masks, records, strict=True))
    )
