"""Stage 5: write the images into the partial store (every call into the store writer is here).

Only blocks written by worker-safe writers (Zarr shards, HDF5 contiguous raw blocks) are
journalled: ragged (variable-size) images are one stream, and compressed HDF5 blocks pass through
the HDF5 library, whose file a kill can leave inconsistent; those builds start over.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from .. import _parallel
from .._parallel import Ticks
from ..backends import ArraySpec, Backend, StoreWriter, remove_store
from ..errors import ClusterError, DlpackError, InputFileError, OptionError, StoreError
from ..manifest import Manifest
from ..sources.base import SourceFiles, SourceScan
from ..storage.journal import BuildJournal, JournalState, Restart
from ..storage.location import Location
from ..storage.runner import Pool, resume_journal, run_blocks
from ..storage.site import BuildSite, LocalSite, ObjectJournal, journal_in_task, journals_in_task
from ..storage.spill import Column
from .columns import SampleBlock, SampleTable
from .inputs import Probe, Selection, bad_inputs
from .plan import BuildPlan, image_array
from .stats import Moments, add_moments, with_pixel_stats
from .workers import (
    Job,
    Sample,
    block_counts,
    decode_block,
    decode_fixed_block,
    fixed_block,
    jobs_of,
    mask_block,
    write_block_worker,
    write_decoded,
)


def _journal_header(plan: BuildPlan, shard_rows: int) -> dict[str, Any]:
    return {
        "fingerprint": plan.fingerprint(),
        "block_len": shard_rows,  # the journal's name for it
        "plan": plan.to_dict(),
    }


def _changed_fields(old: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    keys = sorted(k for k in {*old, *new} if old.get(k) != new.get(k))
    return ", ".join(keys) or "fingerprint"


def mask_array(plan: BuildPlan) -> ArraySpec | None:
    """The ``mask`` array [N, H, W] the plan writes beside the images, or None."""
    lp, spec = plan.labels, plan.image
    if lp is None or lp.mask_dtype is None or spec.height is None or spec.width is None:
        return None
    return ArraySpec("mask", lp.mask_dtype, (spec.height, spec.width), key="mask", compression=plan.compression)


def _resumable(writer: StoreWriter, images: ArraySpec) -> bool:
    """Whether blocks of ``images`` are written as independent units that survive a kill of the build."""
    return not images.ragged and writer.parallel_safe(images.name)


def _verified_blocks(
    site: BuildSite,
    writer: StoreWriter,
    images: ArraySpec,
    state: JournalState[Sample],
    files: SourceFiles,
    pairs: Sequence[Job],
) -> dict[int, list[Sample]]:
    """The journalled blocks still good: whole aligned blocks whose source files kept their size and
    mtime and whose stored samples (and masks) read back with their recorded checksums."""
    step = writer.shard_rows(images.name)
    done: dict[int, list[Sample]] = {}
    for start, samples in sorted(state.blocks.items()):
        stop = start + len(samples)
        if start % step or start >= len(pairs) or stop != min(start + step, len(pairs)):
            continue
        try:
            stats = [files.stat(job[0]) for job in pairs[start:stop]]
        except OSError:
            continue
        if any(st != s.stat for st, s in zip(stats, samples, strict=True)):
            continue
        if site.block_intact(writer, start, samples, images.name, "mask" if "mask" in writer.arrays else None):
            done[start] = samples
    return done


@dataclass(frozen=True)
class WriteOptions:
    """What the write stage takes of the build's options: its pool, its bar, whether it may resume."""

    n_jobs: int = 1
    quiet: bool = False
    no_resume: bool = False
    #: The build's pool (a Dask cluster's with ``--scheduler``); None: this machine's, of ``n_jobs``.
    pool: Pool | None = None


@dataclass
class Partial:
    """The partial store a build writes: its open writer, its journal (None when not resumable), the
    blocks already written (first sample -> samples), and what became of a killed build's partial."""

    writer: StoreWriter
    journal: BuildJournal | None
    done: dict[int, list[Sample]]
    note: str
    #: Whether the store is already complete (a killed build's committed partial): publish it as it is.
    committed: bool = False
    #: The per-channel moments of every image, summed as the blocks were written (None: the
    #: commit reads the images back for their statistics).
    pixel_counts: Moments | None = None


def _continue_partial(
    backend: type[Backend],
    site: BuildSite,
    plan: BuildPlan,
    images: ArraySpec,
    files: SourceFiles,
    pairs: Sequence[Job],
    no_resume: bool,
) -> Partial:
    """Reopen a killed build's partial store to continue it, or raise :class:`Restart` saying why not."""

    def changed(old: Mapping[str, Any]) -> str:
        fields = old.get("plan")
        return f"the plan changed ({_changed_fields(fields, plan.to_dict()) if isinstance(fields, dict) else 'fingerprint'})"

    header = {"fingerprint": plan.fingerprint()}
    state = resume_journal(
        None, header, Sample.from_record, no_resume, changed, read=lambda _path, rebuild: site.read_journal(rebuild)
    )
    if images.ragged:
        raise Restart("variable-size images are written as one stream")
    writer = site.open_writer(backend, "r+", plan.shard_bytes)
    try:
        writer.open()
        # Temporary files of writes the kill cut short are not part of any block.
        writer.remove_temp_files()
        n_blocks = -(-len(pairs) // max(1, int(state.header.get("block_len") or 1)))
        if writer.arrays and isinstance(
            site, LocalSite
        ):  # its manifest was written: the killed build had finished the store
            complete = _complete_partial(site, writer, backend, plan, images, state, files, pairs)
            if complete is not None:
                journal = site.create_journal(state.header, complete, writer)
                journal.mark_commit()
                note = f"resumed: {n_blocks} of {n_blocks} blocks already written (the store was complete)"
                return Partial(writer, journal, complete, note, committed=True)
        masks = mask_array(plan)
        kept = [images.name] + ([masks.name] if masks is not None else [])
        if (state.commit or writer.arrays) and not writer.undo_commit(kept):
            raise Restart(f"it was killed while the {backend.name} library wrote the store's metadata")
        writer.attach_array(images, plan.count)
        if masks is not None:
            writer.attach_array(masks, plan.count)
        if not _resumable(writer, images) or writer.shard_rows(images.name) != state.header.get("block_len"):
            raise Restart(f"its {backend.name} image blocks cannot be continued")
        done = _verified_blocks(site, writer, images, state, files, pairs)
    except Restart:
        writer.abort()
        raise
    except (StoreError, OptionError) as exc:
        writer.abort()
        raise Restart(f"its partial store cannot be reopened ({exc})") from exc
    except BaseException:
        writer.abort()
        raise
    # Rewritten without the lines that did not hold up, so it says exactly what the partial holds.
    journal = site.create_journal(state.header, done, writer)
    n_blocks = -(-len(pairs) // writer.shard_rows(images.name))
    return Partial(writer, journal, done, f"resumed: {len(done)} of {n_blocks} blocks already written")


def _complete_partial(
    site: LocalSite,
    writer: StoreWriter,
    backend: type[Backend],
    plan: BuildPlan,
    images: ArraySpec,
    state: JournalState[Sample],
    files: SourceFiles,
    pairs: Sequence[Job],
) -> dict[int, list[Sample]] | None:
    """The blocks of a partial store that a killed build had committed, when it is exactly what this
    build would publish: its manifest records this plan, every array matches its checksum, and every
    journalled block's source files are unchanged. None when it is not (it is then taken back or
    started over)."""
    try:
        with backend.open_reader(site.partial) as reader:
            manifest = reader.manifest
            recorded = BuildPlan.from_dict(manifest.plan).fingerprint() if manifest.plan else None
            if recorded != plan.fingerprint() or set(manifest.arrays) != set(writer.arrays) or reader.verify_arrays():
                return None
    except StoreError:
        return None
    spec = writer.arrays.get(images.name)
    if spec is None or (spec.dtype, spec.shape, spec.ragged) != (images.dtype, images.shape, images.ragged):
        return None
    if not _resumable(writer, spec) or writer.shard_rows(images.name) != state.header.get("block_len"):
        return None
    done = _verified_blocks(site, writer, spec, state, files, pairs)
    step = writer.shard_rows(images.name)
    return done if len(done) == -(-len(pairs) // step) else None


def open_partial(
    backend: type[Backend],
    site: BuildSite,
    plan: BuildPlan,
    files: SourceFiles,
    pairs: Sequence[Job],
    no_resume: bool,
) -> Partial:
    """5a. The partial store to write ``plan`` into, with the image array created or reopened.

    A partial left by a killed build of ``out`` (kept by :func:`clear_leftovers` because it has a
    journal) is continued when its journal records this very plan (same fingerprint) and
    ``no_resume`` is off: its journalled blocks that still check out are kept. Otherwise it is
    removed and a new partial created, with a journal when its blocks can be continued later.
    """
    images = image_array(plan.image, plan.compression)
    note = ""
    if site.partial_exists():
        try:
            return _continue_partial(backend, site, plan, images, files, pairs, no_resume)
        except Restart as exc:
            note = f"started over: {exc}"
    site.remove_journal()
    site.remove_partial()
    writer = site.open_writer(backend, "w-", plan.shard_bytes)
    try:
        writer.open()
        writer.create_array(images, plan.count)
        masks = mask_array(plan)
        if masks is not None and not images.ragged:
            # In the images' block layout: a worker writes an image block and its masks as one unit.
            writer.create_array(masks, plan.count, rows=writer.shard_rows(images.name))
        journal: BuildJournal | None = None
        if _resumable(writer, images):
            # Created after the image array: a journal always describes a partial that holds it.
            journal = site.create_journal(_journal_header(plan, writer.shard_rows(images.name)), {}, writer)
    except BaseException:
        abort_store(writer, site)
        site.remove_journal()
        raise
    return Partial(writer, journal, {}, note)


def _keep_for_resume(exc: BaseException, partial: Partial, site: BuildSite) -> bool:
    """Whether a build stopped by ``exc`` keeps its partial store to continue later: when it was
    interrupted (Ctrl-C) or its Dask cluster failed, and has a journal; a build that failed on its own removes it, except in an
    object store, where a failed request (a server gone, a network down) keeps it for the rerun."""
    resumable = isinstance(exc, (KeyboardInterrupt, ClusterError)) or (
        not site.is_local and isinstance(exc, StoreError)
    )
    return resumable and partial.journal is not None


def as_site(out: Path | BuildSite) -> BuildSite:
    """The build site of ``out``: a local path's (:class:`LocalSite`), or the site itself."""
    return LocalSite(Location.parse(out), Path(out)) if isinstance(out, (str, os.PathLike)) else out


def discard_partial(partial: Partial, out: Path | BuildSite, exc: BaseException | None = None) -> None:
    """Close the partial's writer and journal after ``exc``, and remove both unless they are kept for a resume."""
    site = as_site(out)
    keep = exc is not None and _keep_for_resume(exc, partial, site)
    if partial.journal is not None:
        partial.journal.close()
    if keep:
        with contextlib.suppress(Exception):
            partial.writer.abort()
        return
    abort_store(partial.writer, site)
    site.remove_journal()


def write_images(
    backend: type[Backend],
    out: BuildSite,
    plan: BuildPlan,
    files: SourceFiles,
    pairs: Sequence[Job],
    opts: WriteOptions,
) -> tuple[Sequence[Sample | InputFileError], Partial | None, str]:
    """5. Write every image into the partial store of ``out``, decoded by workers.

    Blocks a killed build already wrote are kept (see :func:`open_partial`); every other block is
    decoded and written, and journalled once written. Returns the per-sample results, the open
    partial, and what became of an earlier partial (for the summary). When any file failed to
    decode, the partial is removed and None returned in its place.
    """
    partial = open_partial(backend, out, plan, files, pairs, opts.no_resume)
    writer, journal = partial.writer, partial.journal
    try:
        images = writer.arrays[image_array(plan.image, plan.compression).name]
        fixed = not images.ragged
        in_workers = fixed and writer.parallel_safe(images.name)
        step = writer.shard_rows(images.name) if fixed else 16
        starts = [s for s in range(0, len(pairs), step) if s not in partial.done]
        # Each block's records are written as it lands (spilled beside OUT when many, dlpack.storage.spill).
        table = SampleTable(len(pairs))
        errors: dict[int, InputFileError] = {}
        for s, v in partial.done.items():
            table.put(s, v)
        already = sum(len(v) for v in partial.done.values())
        pool = opts.pool if opts.pool is not None else _parallel.LocalPool(opts.n_jobs)
        digest = _InOrderDigest(images.dtype)
        # A writer that hashes each shard where it writes it (an object store) is never read back.
        digest.on = in_workers and not partial.done and not writer.shard_digests
        counts = _PixelCounts()
        counts.on = fixed and not partial.done
        # A pooled task into an object store PUTs its block's journal object itself (ObjectJournal).
        task_journal = journal if journals_in_task(journal) else None
        by_task = task_journal is not None
        state = _Landing(writer, plan, images.name, table, errors, digest, counts, task_journal)
        behind = in_workers and not pool.pooled(len(starts))
        # A block's jobs are made when the pool takes its call, not all before the first.
        work: Callable[[int, Ticks | None], Any] = (
            (lambda s, ticks: (decode_fixed_block, (files, plan, pairs[s : s + step], ticks), {}))
            if behind
            else (
                lambda s, ticks: (
                    _write_block_packed,
                    (writer, files, plan, s, pairs[s : s + step], ticks, by_task),
                    {},
                )
            )
            if in_workers
            else (lambda s, ticks: (decode_block, (files, plan, pairs[s : s + step], None, True, ticks), {}))
        )
        land = state.decoded_fixed if behind else state.packed if in_workers else state.decoded
        # Decoding in this process (no pool): OpenCV on one thread, as in a worker (_parallel.start_worker).
        with _parallel.opencv_threads(not pool.pooled(len(starts))):
            run_blocks(
                pool,
                starts,
                work,
                land,
                journal=journal,
                progress=(len(pairs), "packing", opts.quiet, already if behind or starts else None),
                behind=behind,
            )
        failed = state.failed
        if not failed:
            digest.record(writer, images.name, len(pairs))
            if fixed:
                h, w = plan.image.height or 0, plan.image.width or 0
                partial.pixel_counts = counts.total(len(pairs) * h * w)
    except BaseException as exc:
        discard_partial(partial, out, exc)
        raise
    if failed:
        try:
            results = table.with_failures(errors)
        finally:
            discard_partial(partial, out)
        return results, None, partial.note
    return table, partial, partial.note


def _write_block_packed(
    writer: StoreWriter,
    files: SourceFiles,
    plan: BuildPlan,
    start: int,
    pairs: Sequence[Job],
    ticks: Ticks | None = None,
    journal: bool = False,
) -> tuple[SampleBlock, Moments | None, Any, bool]:
    """:func:`write_block_worker` in a worker, its results sent back as columns (a :class:`SampleBlock`),
    with what its copy of the writer reports it wrote (:meth:`~dlpack.backends.StoreWriter.take_landed`),
    and whether it journalled the block.

    ``journal`` (an object store): the block's journal object is PUT here, right after its shards,
    when no file of the block failed (:func:`~dlpack.storage.site.journal_in_task`), so the build's
    process makes no request per block. Both are whole objects at fixed keys, of bytes that depend
    only on the block: a task run twice (a retry, a lost worker's rerun) writes the same objects."""
    results, counts = write_block_worker(writer, files, plan, start, pairs, ticks)
    block, landed = SampleBlock(results), writer.take_landed()
    journalled = journal and not block.failed
    if journalled:
        journal_in_task(writer, start, [r.record() for r in block.samples()], landed)
    return block, counts, landed, journalled


class _InOrderDigest:
    """The SHA-256 of the images array, taken block by block as the blocks land in order, so the
    commit does not read the whole array back and hash it while nothing else runs.

    The bytes hashed are :func:`~dlpack.backends.base.array_digest`'s: rows in order, C order,
    little-endian. A block out of order (a resumed build's kept blocks) switches it off, and the
    commit hashes the array as before.
    """

    def __init__(self, dtype: str) -> None:
        self.h: Any = hashlib.sha256()
        self.rows = 0
        self.dtype = np.dtype(dtype).newbyteorder("<")
        self.on = True

    def add(self, start: int, rows: np.ndarray) -> None:
        if not self.on:
            return
        if start != self.rows:
            self.on = False
            return
        block = np.ascontiguousarray(rows, dtype=self.dtype)
        self.h.update(block.data.cast("B") if block.size else b"")
        self.rows += len(block)

    def record(self, writer: StoreWriter, name: str, count: int) -> None:
        """Hand the digest to ``writer`` when every one of ``count`` rows was hashed."""
        if self.on and self.rows == count:
            writer.set_written_digest(name, self.h.hexdigest())


class _PixelCounts:
    """The images' per-channel moments (:func:`~dlpack.pack.workers.block_counts`), summed as
    the blocks are written, so the commit's statistics need no second pass over the images.

    A block without counts (a failed block, a ragged store) switches it off, and so does a resumed
    build (its kept blocks were written by another run): the commit then reads the images back.
    """

    def __init__(self) -> None:
        self.sum: Moments | None = None
        self.on = True

    def add(self, counts: Moments | None) -> None:
        if counts is None:
            self.on = False
        if not self.on or counts is None:
            return
        self.sum = add_moments(self.sum, counts)

    def total(self, pixels: int) -> Moments | None:
        """The summed moments when all ``pixels`` pixels (of every image) were counted, else None."""
        return self.sum if self.on and self.sum is not None and self.sum[0][0] == pixels else None


class _Landing:
    """What the driver does with each block of :func:`write_images` once its task returns, for
    :func:`~dlpack.storage.runner.run_blocks`: write what the task did not, put the samples' records
    in the table, and return the records to journal (None when a file of the block failed)."""

    def __init__(
        self,
        writer: StoreWriter,
        plan: BuildPlan,
        name: str,
        table: SampleTable,
        errors: dict[int, InputFileError],
        digest: _InOrderDigest,
        counts: _PixelCounts,
        journal: ObjectJournal[Sample] | None = None,
    ) -> None:
        self.writer, self.plan, self.name, self.table, self.errors = writer, plan, name, table, errors
        self.digest, self.counts = digest, counts
        #: The journal that pooled tasks write to themselves (told of each block a task journalled).
        self.journal = journal
        self.fixed = not writer.arrays[name].ragged
        self.appended = 0  # ragged images: one stream, in block order
        self.failed = False

    def packed(self, s: int, landed: tuple[SampleBlock, Moments | None, Any, bool]) -> tuple[list[Sample] | None, int]:
        """A block a worker wrote (and, into an object store, journalled) itself (:func:`_write_block_packed`)."""
        packed, written, shards, journalled = landed
        self.writer.note_landed(shards)
        if journalled and self.journal is not None:
            self.journal.journalled_by_task(s)
        self.counts.add(written)
        bad = bool(packed.failed)
        self.failed = self.failed or bad
        if not self.failed and self.digest.on:
            # Read back while the workers decode the next blocks (it is in the page cache).
            self.digest.add(s, self.writer.read_written(self.name, s, s + len(packed)))
        self.table.put_table(s, packed.table)
        self.errors.update({s + k: e for k, e in packed.failed.items()})
        return (None if bad else list(packed.samples())), len(packed)

    def decoded_fixed(
        self, s: int, landed: tuple[np.ndarray, np.ndarray | None, list[Sample | InputFileError]]
    ) -> tuple[list[Sample] | None, int]:
        """A block decoded in this process (:func:`decode_fixed_block`), written as a worker writes it;
        hashed and counted here, from memory, while the next block decodes."""
        block, masks, results = landed
        records = None
        if write_decoded(self.writer, s, block, masks, results):
            self.digest.add(s, block)
            self.counts.add(block_counts(self.plan, block))
            records = [r for r in results if isinstance(r, Sample)]
        self.failed = self.failed or any(isinstance(r, InputFileError) for r in results)
        self.errors.update(self.table.put_results(s, results))
        return records, len(results)

    def decoded(self, s: int, block: list[Sample | InputFileError]) -> tuple[list[Sample] | None, int]:
        """A block decoded by a worker (:func:`decode_block`) for a store only this process writes."""
        bad = any(isinstance(r, InputFileError) for r in block)
        self.failed = self.failed or bad
        plan, writer = self.plan, self.writer
        if not self.failed and self.fixed:
            arr = fixed_block(plan, len(block))
            masks = mask_block(plan, len(block))
            for k, r in enumerate(block):
                if isinstance(r, Sample) and r.pixels is not None:
                    arr[k] = r.pixels
                if masks is not None and isinstance(r, Sample) and r.mask is not None:
                    masks[k] = r.mask
            writer.write_block(self.name, s, arr)
            if masks is not None:
                writer.write_block("mask", s, masks)
            self.counts.add(block_counts(plan, arr))
        elif not self.failed:
            pixels = [r.pixels for r in block if isinstance(r, Sample) and r.pixels is not None]
            writer.write_block(self.name, self.appended, pixels)
            self.appended += len(pixels)
        block = [replace(r, pixels=None, mask=None) if isinstance(r, Sample) else r for r in block]
        self.errors.update(self.table.put_results(s, block))
        return (None if bad else [r for r in block if isinstance(r, Sample)]), len(block)


#: Samples of a ragged per-sample array (``source``, ``boxes``) handed to the writer at once.
RAGGED_PART = 65536

#: About the bytes of a shard of the per-sample arrays the commit writes (``labels``,
#: ``transform``, ``source`` ...): the commit holds at most a shard of one of them at a time, so
#: 4 MiB (131,072 SHA-256 digests) rather than the images' 32 MiB keeps it small at any count.
METADATA_SHARD_BYTES = 4 << 20


def commit_store(
    partial: Partial, out: Path | BuildSite, arrays: dict[str, tuple[ArraySpec, Any]], manifest: Manifest
) -> None:
    """Write the per-sample arrays, then the manifest: the partial store is complete after this."""
    writer = partial.writer
    if partial.committed:
        if partial.journal is not None:
            partial.journal.close()
        writer.abort()
        return
    try:
        as_site(out).before_commit()
        if partial.journal is not None:
            partial.journal.mark_commit()
        for spec, values in arrays.values():
            writer.create_array(spec, manifest.count, shard_bytes=min(writer.shard_bytes, METADATA_SHARD_BYTES))
            # A ragged array in parts: the writer holds one object per sample of a part until it is written.
            # A spilled column (columns.py, dlpack.storage.spill) in whole shards of its stored array: the rows
            # of one shard in memory at a time (at most --shard-bytes), each written once, as from one array.
            if spec.ragged:
                step = RAGGED_PART
            elif isinstance(values, Column) and values.spilled:
                step = writer.shard_rows(spec.name)
            else:
                step = max(1, len(values))
            for start in range(0, len(values), step):
                writer.write_block(spec.name, start, values[start : start + step])
            if not len(values):
                writer.write_block(spec.name, 0, values[0:0])  # an empty slice of whatever holds the values
        # The written pixels' statistics (pack/stats.py), from the counts taken as the blocks were written.
        writer.commit(with_pixel_stats(manifest, writer, partial.pixel_counts))
    except BaseException as exc:
        discard_partial(partial, out, exc)
        raise
    if partial.journal is not None:
        partial.journal.close()


def abort_store(writer: StoreWriter, tmp: Path | BuildSite) -> None:
    """Close the writer after a failure and remove its partial store (``tmp``, or a site's)."""
    with contextlib.suppress(Exception):
        writer.abort()
    if isinstance(tmp, (str, os.PathLike)):
        remove_store(tmp)
    else:
        tmp.remove_partial()


def pack_stage(
    backend: type[Backend],
    out: BuildSite,
    root: Path | str,
    scan: SourceScan,
    probes: Sequence[Probe],
    plan: BuildPlan,
    sel: Selection,
    opts: WriteOptions,
    *,
    on_error: str,
    replan: Callable[[Selection], tuple[BuildPlan, Selection]],
    files: SourceFiles,
) -> tuple[BuildPlan, Selection, SampleTable, Partial, str]:
    """4-5. Decode and write the selected items under ``plan`` into the partial store of ``out``.

    Files that pass the probe but fail to decode (damage inside the compressed data) are rare:
    under ``on_error="skip"`` they leave the selection and the store is planned again
    (``replan``, the plan stage) and written without them, so the result is byte-identical to a
    build of the good files alone. Also returns what became of a killed build's partial store
    ("" when there was none).
    """
    note = ""
    for _attempt in range(3):
        if not sel.keep:
            raise bad_inputs(sel.errors, root, nothing_left=True)
        pairs = jobs_of(scan.items, probes, sel.keep)
        results, partial, found = write_images(backend, out, plan, files, pairs, opts)
        note = note or found
        if partial is not None:
            assert isinstance(results, SampleTable)
            return plan, sel, results, partial, note
        sel = sel.drop({k: r for k, r in zip(sel.keep, results, strict=True) if isinstance(r, InputFileError)})
        if on_error == "fail":
            raise bad_inputs(sel.errors, root, nothing_left=not sel.keep)
        plan, sel = replan(sel)
    # Decoding is deterministic: a second pass finds nothing new.
    raise DlpackError("files kept failing to decode; rerun with --on-error fail to see them")  # pragma: no cover
