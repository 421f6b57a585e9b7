"""The variant build: K augmented variants of every stored image, computed in parallel, switched in at once.

Under the store's build lock: read what the variants are made from, plan them, then write them
through an :class:`~dlpack.storage.transaction.ArrayTransaction` (Zarr: the next generation beside
the store; HDF5: staged arrays in the file), one shard block of one variant per worker call, each
block journalled once written (``.NAME.dlpack-augment-journal``); the small per-sample outputs are
written as arrays at commit, with the manifest's ``augment`` record. A failed run leaves the store
as it was; a killed or interrupted one leaves its blocks and journal, which the same command run
again continues (docs/format.md, "Augmentation variants").
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .. import _parallel, schema
from ..backends import ArraySpec, StoreReader, detect_backend, open_reader, remove_store
from ..backends.base import DEFAULT_SHARD_BYTES
from ..errors import (
    ClusterError,
    ConfigError,
    DlpackError,
    OptionError,
    StoreError,
    StoreExistsError,
    StoreNotFoundError,
)
from ..manifest import Manifest
from ..options import available_cores
from ..storage.journal import Journal, Restart, is_journal, read_journal
from ..storage.lock import BuildLock, augment_journal_path, augment_stage_path
from ..storage.publish import PublishedInterrupt, clear_leftovers
from ..storage.runner import Call, Pool, block_checks_out, resume_journal, run_blocks
from ..storage.transaction import ArrayTransaction
from .plan import (
    VariantPlan,
    check_arguments,
    input_arrays,
    journal_header,
    manifest_record,
    resolve_config,
    same_variants,
    store_identity,
    variant_specs,
)
from .result import AugmentResult
from .workers import LabelRows, VariantRecord, distinct_variant, variant_block, view_key

__all__ = ["augment_store", "augment_locked"]

#: The bases of the arrays written block by block (by the workers); the rest are written at commit.
_BLOCK_BASES = (schema.IMAGES, schema.MASK)


def augment_store(
    store: str | os.PathLike[str],
    k: int,
    config: Any,
    *,
    seed: int = 0,
    jobs: int = -1,
    engine: str = "dlpack",
    replace: bool = False,
    quiet: bool = False,
    no_resume: bool = False,
    scheduler: str | None = None,
) -> AugmentResult:
    """:func:`dlpack.variants.augment`: take the store's lock (refusing while another dlpack process
    holds it, naming the holder) and run :func:`augment_locked`."""
    check_arguments(k, seed, jobs, engine)
    out = Path(store)
    if out.is_symlink():  # the store the link names is the one changed (and locked)
        out = out.resolve()
    if not out.exists():
        raise StoreNotFoundError(f"no store at {out} to augment")
    with BuildLock(out):
        return augment_locked(out, k, config, seed, jobs, engine, replace, quiet, no_resume, scheduler=scheduler)


def _shared_store(scheduler: str | None, out: Path) -> dict[str, tuple[str, str | None, int | None]]:
    """What the workers of an existing Dask scheduler must see: the store's folder (a token file
    goes beside it); nothing for this machine's pools."""
    if scheduler is None or scheduler == "local":
        return {}
    return {"OUT": (str(out.parent), None, None)}


def _n_jobs(jobs: int) -> int:
    cores = available_cores()
    return cores if jobs == -1 else min(jobs, cores)


def _label_rows(reader: StoreReader, inputs: Mapping[str, ArraySpec]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The stored label rows the variants move, each ragged array read whole once: ``(data, offsets)``."""
    rows = {}
    for base in ("boxes", "box_labels", "box_crowd"):
        if base in inputs:
            rows[base] = (reader.meta(base + "_data"), reader.meta(base + "_offsets"))
    if "boxes" in rows:
        for base in ("box_labels", "box_crowd"):
            if base in rows and not np.array_equal(rows[base][1], rows["boxes"][1]):
                raise StoreError(f"{base} of {reader.path} has other row counts than boxes; the store is damaged")
    return rows


def _block_labels(rows: Mapping[str, tuple[np.ndarray, np.ndarray]], start: int, stop: int) -> list[LabelRows]:
    def take(base: str, i: int) -> np.ndarray | None:
        if base not in rows:
            return None
        data, off = rows[base]
        return np.asarray(data[int(off[i]) : int(off[i + 1])])

    return [(take("boxes", i), take("box_labels", i), take("box_crowd", i)) for i in range(start, stop)]


def _check_journal_path(path: Path) -> None:
    """Refuse anything at the journal's names that is not a dlpack journal (it is left alone)."""
    for p in (path, path.with_name(path.name + ".tmp")):
        if (p.exists() or p.is_symlink()) and not is_journal(p):
            raise StoreError(
                f"{p} is where dlpack augment keeps its journal, but it is not a dlpack journal; it was left "
                "untouched: remove or rename it, then run the command again"
            )
    remove_store(path.with_name(path.name + ".tmp"))


def _changed(old: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    keys = sorted(key for key in new if key != "fingerprint" and old.get(key) != new[key])
    if "store" in keys:
        return "the store changed since it was stopped"
    return f"the variants changed ({', '.join(keys) or 'fingerprint'})"


def _published_by_stopped_run(path: Path, m: Manifest, record: Mapping[str, Any]) -> bool:
    """Whether the store holds the variants a stopped run of this very request committed and
    published (it was killed before it removed its journal)."""
    if not path.exists():
        return False
    try:
        state = read_journal(path, VariantRecord.from_record)
    except Restart:
        return False
    header = state.header
    return (
        state.commit
        and header.get("store") != store_identity(m)
        and same_variants(header, m.augment)
        and same_variants(header, record)
    )


def _verified(
    txn: ArrayTransaction,
    plan: VariantPlan,
    blocks: Mapping[int, list[VariantRecord]],
    fixed: Mapping[int, tuple[str, str | None]],
) -> dict[int, list[VariantRecord]]:
    """The journalled blocks still good: whole aligned blocks whose variant images (and masks)
    read back with their recorded CRC-32."""
    done = {}
    for unit, records in sorted(blocks.items()):
        if not 0 <= unit < plan.k * plan.count:
            continue
        v, start = plan.of_unit(unit)
        if start % plan.block_len or len(records) != plan.rows(start):
            continue
        image_name, mask_name = fixed[v]
        if block_checks_out(
            txn.writer, start, records, txn.name(image_name), None if mask_name is None else txn.name(mask_name)
        ):
            done[unit] = records
    return done


def _commit_arrays(
    txn: ArrayTransaction,
    plan: VariantPlan,
    specs: Sequence[tuple[int, ArraySpec]],
    done: Mapping[int, list[VariantRecord]],
) -> None:
    """Write every array that is not written block by block: checksums, records and moved labels."""
    for v, spec in specs:
        base = schema.variant_of(spec.name)
        assert base is not None
        if base[0] in _BLOCK_BASES:
            continue
        recs = [r for s in range(0, plan.count, plan.block_len) for r in done[plan.unit(v, s)]]
        values: np.ndarray | list[np.ndarray]
        if base[0] == schema.CHECKSUM:
            values = np.array([r.checksum for r in recs], dtype="<u4")
        elif base[0] == schema.AUGMENT:
            values = [np.frombuffer(r.applied.encode("utf-8"), dtype=np.uint8) for r in recs]
        elif base[0] == "boxes":
            values = [np.array(r.boxes or (), dtype="<f4").reshape(-1, 4) for r in recs]
        elif base[0] == "box_labels":
            values = [np.array(r.box_labels or (), dtype="<i4") for r in recs]
        else:
            values = [np.array(r.box_crowd or (), dtype="|u1") for r in recs]
        txn.write_values(spec, values)


def _distinct_views(
    txn: ArrayTransaction,
    plan: VariantPlan,
    rows: Mapping[str, tuple[np.ndarray, np.ndarray]],
    names: Mapping[int, tuple[str, str | None]],
    done: dict[int, list[VariantRecord]],
    journal: Journal[VariantRecord] | None,
) -> int:
    """Redraw each variant equal to an earlier variant of its sample (the workers already redrew
    those equal to the original), in order v = 1..K, so the choice is the same for any ``--jobs``;
    patch the blocks that changed (journalled again) and return how many variants stay copies."""
    writer = txn.writer
    copies = 0
    for s in range(0, plan.count, plan.block_len):
        n = plan.rows(s)
        recs = {v: list(done[plan.unit(v, s)]) for v in range(1, plan.k + 1)}
        redo = [k for k in range(n) if len({recs[v][k].key() for v in recs}) < plan.k]
        if redo:
            originals = writer.read_block(schema.IMAGES, s, s + n)
            masks = None if plan.mask_dtype is None else writer.read_block(schema.MASK, s, s + n)
            labels = _block_labels(rows, s, s + n)
            changed: dict[int, dict[int, tuple[np.ndarray, np.ndarray | None]]] = {}
            for k in redo:
                mask = None if masks is None else masks[k]
                avoid = {view_key(originals[k], mask, labels[k], plan)}
                for v in range(1, plan.k + 1):
                    rec = recs[v][k]
                    if not rec.copy and rec.key() in avoid:
                        img, m, rec = distinct_variant(
                            plan, s + k, v, originals[k], mask, labels[k], avoid, first=rec.attempt + 1
                        )
                        recs[v][k] = rec
                        changed.setdefault(v, {})[k] = (img, m)
                    avoid.add(rec.key())
            for v, patched in changed.items():
                image_name, mask_name = names[v]
                block = np.array(writer.read_block(image_name, s, s + n))
                mblock = None if mask_name is None else np.array(writer.read_block(mask_name, s, s + n))
                for k, (img, m) in patched.items():
                    block[k] = img
                    if mblock is not None and m is not None:
                        mblock[k] = m
                writer.write_block(image_name, s, block)
                if mblock is not None and mask_name is not None:
                    writer.write_block(mask_name, s, mblock)
                done[plan.unit(v, s)] = recs[v]
                if journal is not None:
                    journal.append_block(plan.unit(v, s), recs[v])
        copies += sum(r.copy for v in recs for r in recs[v])
    return copies


def _read_store(
    out: Path,
) -> tuple[Manifest, Any, dict[str, ArraySpec], dict[str, tuple[np.ndarray, np.ndarray]], int, int]:
    """What the variants of ``out`` are made from: its manifest, its reader pin, the input arrays,
    the label rows, the shard bytes and the images' block length; the reader is closed again."""
    reader = open_reader(out)
    try:
        m = reader.manifest
        pin = reader.pin
        inputs = input_arrays(m, out)
        rows = _label_rows(reader, inputs)
        shard_bytes = int((m.plan or {}).get("shard_bytes") or DEFAULT_SHARD_BYTES)
        block_len = reader.shard_len(schema.IMAGES) or detect_backend(out).shard_rows(
            inputs[schema.IMAGES], m.count, shard_bytes
        )
        return m, pin, inputs, rows, shard_bytes, block_len
    finally:
        reader.close()  # an HDF5 store is written next, which HDF5 refuses while a reader has it open


def augment_locked(
    out: Path,
    k: int,
    config: Any,
    seed: int,
    jobs: int,
    engine: str,
    replace: bool,
    quiet: bool,
    no_resume: bool,
    finish: bool = False,
    *,
    scheduler: str | None = None,
    pool: Pool | None = None,
) -> AugmentResult:
    """Compute and switch in K variants of every image of the complete store ``out``; call only
    while holding its build lock (``dlpack build --augment`` calls it right after publishing, with
    the build's Dask ``pool``: used, not closed; else one is made for ``scheduler``).

    ``finish``: the caller finishes a stopped ``build --augment`` of ``out``, so a store that
    already holds these very variants is done, and one with other variants is not its to change.
    The stages: read the store -> resolve the config -> plan -> open (or continue) the
    transaction -> write the blocks -> make variants distinct -> commit -> close the journal.
    """
    t0 = time.perf_counter()
    check_arguments(k, seed, jobs, engine)
    # Absolute: the pool's worker processes outlive a call, in the working folder they started in.
    out = Path(os.path.abspath(out))
    clear_leftovers(out)  # a killed publish of an earlier run is finished or undone first
    m, pin, inputs, rows, shard_bytes, block_len = _read_store(out)
    cfg, fill, record = _resolve_variants(config, engine, m, k, seed)
    header = journal_header(m, record, block_len)
    jpath = augment_journal_path(out)
    _check_journal_path(jpath)
    config_name = str(record["config"].get("name", "")) if isinstance(record["config"], dict) else ""

    def result(**fields: Any) -> AugmentResult:
        return AugmentResult(
            path=out, k=k, count=m.count, seed=seed, engine=engine, config=config_name,
            seconds=time.perf_counter() - t0, **fields,
        )  # fmt: skip

    existing = _existing_variants(jpath, out, m, record, finish, replace)
    if existing is not None:
        blocks = len(range(0, m.count, block_len)) * k
        return result(written=0, blocks=blocks, blocks_written=0, resume=existing)
    plan = _variant_plan(out, pin, m, inputs, cfg.augmenter, k, seed, fill, block_len)
    specs = variant_specs(m, inputs, k)
    fixed_specs = [s for _, s in specs if (schema.variant_of(s.name) or ("",))[0] in _BLOCK_BASES]
    fixed = {
        v: (
            schema.variant_array(schema.IMAGES, v),
            schema.variant_array(schema.MASK, v) if plan.mask_dtype is not None else None,
        )
        for v in range(1, k + 1)
    }
    units = plan.blocks()
    txn, journal, done, note = _open_variants(
        out, m, shard_bytes, jpath, header, plan, fixed_specs, fixed, no_resume, len(units)
    )
    try:
        made = (
            contextlib.nullcontext(pool)
            if pool is not None
            else _parallel.pool_for(scheduler, _n_jobs(jobs), shared=_shared_store(scheduler, out))
        )
        with made as running:
            todo, names = _write_variants(txn, plan, journal, done, units, rows, fixed, running, quiet)
        copies = _distinct_views(txn, plan, rows, names, done, journal)
        _commit_variants(txn, plan, specs, done, journal, dataclasses.replace(m, augment=record))
    except BaseException as exc:
        _abandon(exc, txn, journal, jpath)
        raise
    try:
        if journal is not None:
            journal.close()
        remove_store(jpath)
        return result(
            written=sum(plan.rows(s) for _, s in todo),
            blocks=len(units),
            blocks_written=len(todo),
            resume=note,
            replaced=m.variants,
            copies=copies,
        )
    except KeyboardInterrupt:
        raise PublishedInterrupt(out) from None


def _resolve_variants(config: Any, engine: str, m: Manifest, k: int, seed: int) -> tuple[Any, int, dict[str, Any]]:
    """The resolved config, the mask fill and the manifest's ``augment`` record of the variants:
    a bad config, or one whose output size differs from the images', is refused before anything is written."""
    cfg = resolve_config(config, engine, m.resolved_task)
    assert m.image.shape is not None  # a fixed layout: input_arrays refuses others
    from ..transforms.sizes import output_size_problem  # imported on first use, as configs are

    wrong = output_size_problem(cfg.augmenter, m.image.shape[0], m.image.shape[1])
    if wrong is not None:  # before any worker makes (and allocates) a variant of that size
        raise ConfigError(f"{getattr(cfg, 'name', '') or 'the augmentation config'}: {wrong}")
    fill = m.mask_ignore if m.mask_ignore is not None else 0
    return cfg, fill, manifest_record(cfg, k, seed, engine, fill)


def _existing_variants(
    jpath: Path, out: Path, m: Manifest, record: Mapping[str, Any], finish: bool, replace: bool
) -> str | None:
    """What to do with the variants ``out`` already has: None to compute these, or the result's
    ``resume`` note when they are these very ones (a stopped run published them, or ``finish``
    finds them complete); other variants are refused unless ``replace``."""
    old = [name for name in m.arrays if schema.variant_of(name) is not None]
    if m.augment is None and not old:
        return None
    if _published_by_stopped_run(jpath, m, record):
        remove_store(jpath)
        return "published already: the stopped run had finished it"
    if finish and same_variants(m.augment, record):
        return "complete already"
    if finish:
        raise StoreExistsError(
            f"{out} already exists with other augmentation variants ({m.variants} per image); pass "
            "overwrite=True to replace the store"
        )
    if not replace:
        raise StoreExistsError(
            f"{out} already has {m.variants} augmentation variants per image; pass replace=True to replace them"
        )
    return None


def _variant_plan(
    out: Path,
    pin: Any,
    m: Manifest,
    inputs: Mapping[str, ArraySpec],
    augmenter: Any,
    k: int,
    seed: int,
    fill: int,
    block_len: int,
) -> VariantPlan:
    """The frozen plan the workers compute the variants of ``out`` by."""
    mask = inputs.get(schema.MASK)
    shape = m.image.shape
    assert shape is not None  # a fixed layout: input_arrays refuses others
    return VariantPlan(
        store=os.fspath(out),
        pin=pin,
        k=k,
        seed=seed,
        augmenter=augmenter,
        shape=shape,
        dtype=m.image.dtype,
        mask_dtype=None if mask is None else mask.dtype,
        boxes="boxes" in inputs,
        box_labels="box_labels" in inputs,
        box_crowd="box_crowd" in inputs,
        fill_mask=fill,
        count=m.count,
        block_len=block_len,
    )


def _abandon(exc: BaseException, txn: ArrayTransaction, journal: Journal[VariantRecord] | None, jpath: Path) -> None:
    """Undo the transaction after ``exc``; an interrupted run, or one whose Dask cluster failed,
    keeps its blocks for the next run, while a journal describes them."""
    keep = isinstance(exc, (KeyboardInterrupt, ClusterError)) and jpath.is_file()
    if journal is not None:
        journal.close()
    txn.abort(keep=keep)
    if not keep:
        remove_store(jpath)


def _open_variants(
    out: Path,
    m: Manifest,
    shard_bytes: int,
    jpath: Path,
    header: dict[str, Any],
    plan: VariantPlan,
    fixed_specs: Sequence[ArraySpec],
    fixed: Mapping[int, tuple[str, str | None]],
    no_resume: bool,
    n_units: int,
) -> tuple[ArrayTransaction, Journal[VariantRecord] | None, dict[int, list[VariantRecord]], str]:
    """The transaction the variants are written in, with its journal (None when its blocks cannot
    be continued), the blocks already written and what became of a stopped run.

    A stopped run of this very request (its journal's fingerprint) is continued unless
    ``no_resume``: its journalled blocks that still check out are kept. Otherwise the variant
    arrays are created anew, each sharded like the images.
    """
    old = [name for name in m.arrays if schema.variant_of(name) is not None]
    stage = augment_stage_path(out)
    txn = ArrayTransaction(out, m, old, stage, shard_bytes)
    journal: Journal[VariantRecord] | None = None
    done: dict[int, list[VariantRecord]] = {}
    note = ""
    try:
        if os.path.lexists(jpath):
            try:
                state = resume_journal(
                    jpath, header, VariantRecord.from_record, no_resume, lambda old: _changed(old, header)
                )
                if state.commit:
                    raise Restart("it was stopped while committing")
                try:
                    txn.begin(resume=fixed_specs)
                    if not all(txn.writer.parallel_safe(txn.name(s.name)) for s in fixed_specs):
                        raise StoreError("its blocks were not written as independent units")
                except (StoreError, OptionError) as exc:
                    txn.abort()
                    raise Restart(f"its variant arrays cannot be continued ({exc})") from exc
                done = _verified(txn, plan, state.blocks, fixed)
                # Rewritten without the lines that did not hold up, so it says exactly what the arrays hold.
                journal = Journal.create(jpath, header, done)
                note = f"resumed: {len(done)} of {n_units} blocks already written"
            except Restart as exc:
                note = f"started over: {exc}"
                txn = ArrayTransaction(out, m, old, stage, shard_bytes)
        if journal is None:
            remove_store(jpath)
            txn.begin()
            for spec in fixed_specs:
                txn.create(spec, rows=plan.block_len)  # sharded like images: a worker writes whole shards
            if all(txn.writer.parallel_safe(txn.name(s.name)) for s in fixed_specs):
                # Created after the arrays: a journal always describes a transaction that holds them.
                journal = Journal.create(jpath, header)
        if txn.writer.shard_rows(txn.name(fixed_specs[0].name)) != plan.block_len:  # pragma: no cover
            raise DlpackError(f"the variant arrays of {out} were laid out in other blocks than its images")
    except BaseException as exc:
        _abandon(exc, txn, journal, jpath)
        raise
    return txn, journal, done, note


def _write_variants(
    txn: ArrayTransaction,
    plan: VariantPlan,
    journal: Journal[VariantRecord] | None,
    done: dict[int, list[VariantRecord]],
    units: Sequence[tuple[int, int]],
    rows: Mapping[str, tuple[np.ndarray, np.ndarray]],
    fixed: Mapping[int, tuple[str, str | None]],
    pool: Pool,
    quiet: bool,
) -> tuple[list[tuple[int, int]], dict[int, tuple[str, str | None]]]:
    """Write every block of ``units`` not ``done`` through :func:`run_blocks`, journalled as each lands;
    returns the blocks written and the transaction's names of each variant's image and mask arrays.

    With a journal the workers write their blocks themselves; without one the store's only handle
    is this process's writer, which reads the originals here and writes what the workers computed.
    """
    writer = txn.writer
    in_workers = journal is not None
    todo = [(v, s) for v, s in units if plan.unit(v, s) not in done]
    names = {v: (txn.name(a), None if b is None else txn.name(b)) for v, (a, b) in fixed.items()}
    pooled = pool.pooled(len(todo))

    def work(unit: tuple[int, int], ticks: Any) -> Call:
        v, s = unit
        labels = _block_labels(rows, s, s + plan.rows(s))
        if in_workers:
            return (variant_block, (plan, v, s, labels, writer, names[v], None, ticks, pooled), {})
        # The store's only handle is this process's writer: read here, compute there.
        e = s + plan.rows(s)
        originals = writer.read_block(schema.IMAGES, s, e)
        masks = None if plan.mask_dtype is None else writer.read_block(schema.MASK, s, e)
        return (variant_block, (plan, v, s, labels, None, names[v], (originals, masks), ticks, pooled), {})

    def land(unit: tuple[int, int], landed: Any) -> tuple[list[VariantRecord], int]:
        (v, s), (records, block, masks) = unit, landed
        image_name, mask_name = names[v]
        if block is not None:
            writer.write_block(image_name, s, block)
        if masks is not None and mask_name is not None:
            writer.write_block(mask_name, s, masks)
        done[plan.unit(v, s)] = records
        return records, len(records)

    already = sum(len(r) for r in done.values())
    run_blocks(
        pool, todo, work, land, journal=journal, unit=lambda u: plan.unit(*u),
        progress=(plan.k * plan.count, "augmenting", quiet, already),
    )  # fmt: skip
    return todo, names


def _commit_variants(
    txn: ArrayTransaction,
    plan: VariantPlan,
    specs: Sequence[tuple[int, ArraySpec]],
    done: Mapping[int, list[VariantRecord]],
    journal: Journal[VariantRecord] | None,
    manifest: Manifest,
) -> None:
    """Commit the variants: the journal marked first (a kill from here on is not continued), then
    the arrays written at commit and the transaction with ``manifest``."""
    if journal is not None:
        journal.mark_commit()
    _commit_arrays(txn, plan, specs, done)
    txn.commit(manifest)
