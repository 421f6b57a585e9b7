"""The build pipeline: scan (-> split) -> probe -> plan -> decode/resize -> write -> manifest -> publish.

Each stage is a module-level function of its inputs that returns new values; nothing is shared
between stages but what one returns and the next takes. The plan is a frozen :class:`BuildPlan`,
recorded in the manifest. Workers receive paths, indices and frozen plans, never open handles; they
open what they need themselves. Every call into the store writer lives in the write stage.

A build holds the lock on its output path (:mod:`dlpack._lock`) from before it looks at any earlier
partial until the store is published, so two builds never write the same partial, and a partial
found while holding the lock is a dead build's.

The stages live in this package's modules, in the order they run: :mod:`.inputs` (scan, split,
probe, path checks), :mod:`.plan`, :mod:`.workers` (decoding, in worker processes), :mod:`.write`
(with :mod:`.journal`, which makes a killed build resumable), :mod:`.arrays` (metadata arrays and
the manifest), :mod:`.publish`, and :mod:`.update` (``build --update``, with :mod:`.changes`).
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .. import _parallel
from .._lock import BuildLock, journal_path, lock_path, old_path, partial_path
from .._spill import give_back_freed, spilling_to
from ..backends import Backend, backend_for_path, owned_store, remove_store
from ..errors import DlpackError, OptionError, SourceError, StoreError, StoreExistsError
from ..options import BuildOptions, with_keywords
from ..sources.base import Source, SourceScan
from .arrays import manifest_stage
from .columns import SampleTable
from .inputs import (
    PROBE_STEP,
    Probe,
    Selection,
    as_source,
    bad_inputs,
    check_out_suffix,
    check_paths,
    probe_stage,
    probed,
    scan_stage,
    source_options,
    split_stage,
)
from .plan import BuildPlan, plan_stage
from .publish import (
    PublishedInterrupt,
    UnfinishedInterrupt,
    _not_ours,
    built_by_plan,
    check_replaceable,
    clear_leftovers,
    publish,
    published_by_killed_build,
)
from .result import BuildResult, label_summary
from .update import recorded_label_options, update_stage
from .workers import jobs_of, preload, validate_stage
from .write import Partial, commit_store, discard_partial, pack_stage

__all__ = ["build", "BuildResult", "BuildPlan", "PublishedInterrupt"]

#: ``format`` value that builds a HALCON DLDataset folder instead of a store.
DLDATASET_FORMAT = "dldataset"


def dldataset_staging(out: Path) -> Path:
    """The hidden store a ``format="dldataset"`` build packs into before exporting it to ``out``."""
    return out.parent / f".{out.name}.dlpack-stage.zarr"


def _build_dldataset(src: Source | str | os.PathLike[str], out: Path, opts: BuildOptions, t0: float) -> BuildResult:
    """Build into a hidden store beside ``out``, export it as a DLDataset to ``out``, remove the store.

    The export is written beside ``out`` and renamed into place when complete, so a failed build or
    export leaves no ``out`` that looks complete. The whole build holds the lock on ``out``, so a
    staging store found while holding it is a killed build's: a rerun resumes it (like any build),
    and once ``out`` is there, every later build into ``out`` removes it. The export's marker records
    the plan's fingerprint: a build killed after its export reached ``out`` (its staging store not yet
    removed), run again with the same plan, says it is complete instead of "already exists".
    """
    from dataclasses import replace

    from ..exports import export_from

    if opts.update:
        raise OptionError(
            "update applies to a store; a DLDataset folder is written whole: build it again with --overwrite, "
            "or --update a store and export it (dlpack export STORE --to dldataset OUT)"
        )
    stage = dldataset_staging(out)
    origin = os.path.abspath(src if isinstance(src, (str, os.PathLike)) else src.root)
    stage_opts = replace(opts, format="zarr", overwrite=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    with BuildLock(out):
        killed = _stage_left(stage)  # refuses anything at the staging names that is not dlpack's
        if (out.exists() or out.is_symlink()) and not opts.overwrite and (not out.is_dir() or any(out.iterdir())):
            exists = StoreExistsError(f"{out} already exists; pass overwrite=True to replace it")
            from ..exports._common import clear_export_leftovers, export_marker

            try:
                clear_export_leftovers(out)
                marker = export_marker(out) if killed and out.is_dir() and not out.is_symlink() else None
                if marker is None or marker.get("to") != DLDATASET_FORMAT or marker.get("built_from") != origin:
                    raise exists
                done = _exported_result(src, out, stage_opts, marker.get("plan"), t0)
                if done is None:
                    raise exists
            finally:
                _discard_stage(stage)  # resumable only into an OUT this build may replace
            return done
        if os.path.lexists(stage):
            # Published (or half removed) before a kill: rebuilt all the same (overwrite), so removed
            # first; a partial store of it and its journal stay, for the build to resume.
            with BuildLock(stage):
                remove_store(stage)
        result = build(src, stage, stage_opts)
        try:
            exported = export_from(
                stage, DLDATASET_FORMAT, out, overwrite=opts.overwrite, built_from=origin,
                plan=result.plan.fingerprint() if result.plan is not None else None, locked=True,
            )  # fmt: skip
        finally:
            _discard_stage(stage)
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file() and not f.is_symlink())
    return replace(
        result,
        path=out,
        seconds=time.perf_counter() - t0,
        output_bytes=size,
        label_notes=(*result.label_notes, *exported.notes),
        dldataset=True,
    )


def _stage_names(stage: Path) -> tuple[Path, ...]:
    """The staging store of a DLDataset build and what a killed build of it leaves beside it."""
    return (stage, partial_path(stage), journal_path(stage), old_path(stage))


def _stage_left(stage: Path) -> bool:
    """Whether a killed DLDataset build left its staging store (or part of it); raises when
    something at the staging store's name cannot be proven dlpack's (it is kept)."""
    if os.path.lexists(stage):
        reason = _not_ours(stage)
        if reason is not None:
            raise StoreError(
                f"{stage} is where a DLDataset build keeps its staging store, but it is not a dlpack store "
                f"({reason}); it was left untouched: remove or rename it, then build again"
            )
    return any(os.path.lexists(p) for p in _stage_names(stage))


def _discard_stage(stage: Path) -> None:
    """Remove the staging store and a killed build's leftovers of it, each proven dlpack's first
    (:func:`clear_leftovers` refuses what is not; it keeps a resumable partial, removed here)."""
    if not any(os.path.lexists(p) for p in (*_stage_names(stage), lock_path(stage))):
        return
    with BuildLock(stage):
        clear_leftovers(stage)
        tmp = partial_path(stage)
        if os.path.lexists(tmp):  # proven dlpack's by clear_leftovers, which kept it for its journal
            remove_store(tmp)
        remove_store(journal_path(stage))
        if os.path.lexists(stage):
            _stage_left(stage)
            remove_store(stage)


def _exported_result(
    src: Source | str | os.PathLike[str], out: Path, opts: BuildOptions, recorded: Any, t0: float
) -> BuildResult | None:
    """The result of a DLDataset build whose export a killed run of the same plan had put at
    ``out`` (``recorded``: the plan fingerprint its marker holds), else None."""
    if not isinstance(recorded, str):
        return None
    backend = backend_for_path(dldataset_staging(out), opts.format, write=True)
    source = as_source(src, opts)
    if not isinstance(src, (str, os.PathLike)):
        opts = source_options(source, opts)
    scan = scan_stage(source)
    if opts.split:
        scan = split_stage(scan, opts.split, opts.split_seed or 0, os.fspath(source.root))
    probes = probe_stage(source.root, scan.items, opts)
    plan, sel = plan_stage(scan, probes, probed(scan, probes), opts, backend.name, os.fspath(source.root))
    if plan.fingerprint() != recorded:
        return None
    return BuildResult(
        path=out,
        count=plan.count,
        skipped=(),
        seconds=time.perf_counter() - t0,
        input_bytes=0,
        output_bytes=sum(f.stat().st_size for f in out.rglob("*") if f.is_file() and not f.is_symlink()),
        plan=plan,
        resume="exported already: the stopped build had finished it",
        classes=scan.classes,
        splits=dict(Counter(s for k in sel.keep if (s := scan.items[k].split) is not None)),
        dldataset=True,
    )


def _existing_result(
    backend: type[Backend],
    out: Path,
    plan: BuildPlan,
    scan: SourceScan,
    sel: Selection,
    probes: Sequence[Probe],
    t0: float,
    resume: str = "published already: the stopped build had finished it",
) -> BuildResult:
    """The result of a build whose store a killed run of the same build had already published."""
    with backend.open_reader(out) as reader:
        m = reader.manifest
        nbytes = reader.nbytes_on_disk()
    return BuildResult(
        path=out,
        count=m.count,
        skipped=m.skipped,
        seconds=time.perf_counter() - t0,
        input_bytes=0,
        output_bytes=nbytes,
        conversions=dict(m.conversions),
        plan=plan,
        resume=resume,
        classes=m.classes,
        splits=dict(Counter(s for k in sel.keep if (s := scan.items[k].split) is not None)),
    )


def _variant_config(opts: BuildOptions, plan: BuildPlan, scan: SourceScan) -> Any:
    """The augmentation config of a build with ``augment`` (read before anything is packed, so a bad
    config costs nothing), or None without."""
    if not opts.augment:
        return None
    if plan.image.layout != "fixed":
        raise OptionError(
            "augment needs one stored size: the images would be stored at their own sizes; pass --size WxH "
            "(or --max-side N with --resize fit)"
        )
    from ..variants.plan import resolve_config

    task = plan.labels.task if plan.labels is not None else ("classification" if scan.classes else "none")
    return resolve_config(opts.augment_config, opts.augment_engine, task)


def _with_variants(
    result: BuildResult, out: Path, opts: BuildOptions, config: Any, t0: float, finish: bool = False
) -> BuildResult:
    """``result`` once the published store ``out`` has its variants (``--augment``). The store is
    complete without them; a stopped or failed variant run says how to add them (it resumes).

    ``finish``: ``out`` was there before this run (a stopped run of this build published it), so
    variants of this very request already there are the result, and other variants are refused.
    """
    if config is None:
        return result
    from dataclasses import replace

    from ..variants.run import augment_locked

    command = f"dlpack augment {out} --augment {opts.augment} --augment-config {opts.augment_config}"
    if opts.augment_seed:
        command += f" --augment-seed {opts.augment_seed}"
    if opts.augment_engine != "dlpack":
        command += f" --augment-engine {opts.augment_engine}"
    hint = f"{out} was built, but not its augmentation variants: run {command} to add them (it resumes)"
    try:
        done = augment_locked(
            out, opts.augment, config, opts.augment_seed, opts.jobs, opts.augment_engine, False, opts.quiet,
            opts.no_resume, finish,
        )  # fmt: skip
    except PublishedInterrupt:
        raise
    except KeyboardInterrupt:
        raise UnfinishedInterrupt(hint) from None
    except DlpackError as exc:
        if finish and isinstance(exc, StoreExistsError):  # other variants: not this build's store to finish
            raise
        text = f"{hint}; the variants failed: {exc}"
        try:
            wrapped = type(exc)(text)
        except TypeError:  # an error class with its own arguments
            wrapped = DlpackError(text)
        raise wrapped from exc
    note = f"{done.k} augmentation variants per image: {done.variants} variants"
    if done.written:  # none computed: a stopped run had finished them all (the resume note says so)
        note += f" ({done.variants_per_s:.0f} variants/s)"
    if done.resume:
        note += f" ({done.resume})"
    return replace(result, seconds=time.perf_counter() - t0, augment=note)


def build(
    src: Source | str | os.PathLike[str],
    out: str | os.PathLike[str],
    options: BuildOptions | None = None,
    **kwargs: Any,
) -> BuildResult:
    """Pack the images a source lists into one store at ``out``.

    Parameters
    ----------
    src
        A folder tree of images (class sub-folders become labels with ``labels="auto"``), or any
        :class:`~dlpack.sources.Source`; a Source lists its own items, so ``labels``,
        ``follow_symlinks`` and ``exclude`` given with another value than its own are refused.
    out
        Store path: a ``.zarr`` folder (default) or a ``.h5``/``.hdf5`` file.
    options
        A :class:`~dlpack.BuildOptions`; keyword arguments override its fields
        (``build("raw", "train.zarr", size=(512, 512), jobs=2)``); an unknown one is an
        :class:`~dlpack.OptionError` naming the fields it may mean.

    Returns
    -------
    BuildResult
        With ``skipped`` listing inputs left out under ``on_error="skip"``, and the ``plan``.

    Raises
    ------
    BadInputsError
        Unreadable inputs under ``on_error="fail"`` (every one found is listed).
    StoreExistsError
        ``out`` exists and ``overwrite`` is false.
    StoreLockedError
        Another build into ``out`` is running (the message names it).
    """
    opts = with_keywords(options, BuildOptions, kwargs, "build")
    t0 = time.perf_counter()
    if isinstance(src, (str, os.PathLike)) and not os.fspath(src):
        raise SourceError("the source path is empty; give the folder of images (use '.' for the current folder)")
    if not os.fspath(out):
        raise OptionError("the output path is empty; give the store to write, e.g. train.zarr")
    out_path = Path(out)
    if opts.format == DLDATASET_FORMAT:
        return _build_dldataset(src, out_path, opts, t0)
    check_out_suffix(out_path, opts)
    backend = backend_for_path(out_path, opts.format, write=True)
    from_path = isinstance(src, (str, os.PathLike))
    if from_path and opts.update:
        opts = recorded_label_options(out_path, opts)
    source = as_source(src, opts)
    if not from_path:
        opts = source_options(source, opts)
    check_paths(source, out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    # The per-image records a large build keeps in files (dlpack._spill) go beside OUT, on its disk.
    with BuildLock(out_path), spilling_to(out_path.parent):
        published = clear_leftovers(out_path)
        if opts.update:
            return update_stage(source, out_path, backend, opts, t0)
        # The CLI names its flag instead (dlpack.cli): the keyword is the library's word for it.
        exists = f"{out_path} already exists; pass overwrite=True to replace it"
        # A store of this very build without (all) its variants: a run stopped while computing them.
        finishing = False
        if out_path.exists() or out_path.is_symlink():
            if opts.overwrite:
                check_replaceable(out_path)
                published = None
            elif published is None:
                if not (opts.augment and not out_path.is_symlink() and owned_store(out_path) is backend):
                    raise StoreExistsError(exists)
                finishing = True  # once the plan is known: the same plan, or refused as existing
        root = source.root
        scan = scan_stage(source)
        if _parallel.pooled(opts.n_jobs, -(-len(scan.items) // PROBE_STEP)):
            # Workers start (about a second) while this process probes, plans and opens the store.
            _parallel.warm_pool(opts.n_jobs, preload)
        if opts.split:
            scan = split_stage(scan, opts.split, opts.split_seed or 0, os.fspath(root))
        give_back_freed()  # what the scan's sort freed, before the stages that hold large blocks
        probes = probe_stage(root, scan.items, opts)
        give_back_freed()
        plan, sel = plan_stage(scan, probes, probed(scan, probes), opts, backend.name, os.fspath(root))
        variants = _variant_config(opts, plan, scan)
        if published is not None:
            # The same build was killed just after it published OUT: it is done.
            if not published_by_killed_build(backend, out_path, plan, published):
                raise StoreExistsError(exists)
            return _with_variants(
                _existing_result(backend, out_path, plan, scan, sel, probes, t0), out_path, opts, variants, t0
            )
        if finishing:
            # Its images are built: only the variants are left (resumed from their journal, if any).
            if not built_by_plan(backend, out_path, plan):
                raise StoreExistsError(exists)
            built = "built already: a stopped run of this build had published it"
            existing = _existing_result(backend, out_path, plan, scan, sel, probes, t0, built)
            return _with_variants(existing, out_path, opts, variants, t0, finish=True)
        if sel.errors and opts.on_error == "fail":
            pairs = jobs_of(scan.items, probes, sel.keep)
            found = validate_stage(os.fspath(root), plan, pairs, opts)
            raise bad_inputs([*sel.errors, *found], root, nothing_left=len(found) == len(pairs))
        tmp = partial_path(out_path)
        plan, sel, samples, partial, resume = pack_stage(backend, out_path, root, scan, probes, plan, sel, opts)
        try:
            result = _finish(backend, out_path, tmp, opts, t0, scan, probes, plan, sel, samples, partial, resume)
        finally:
            samples.close()  # the spilled records' files, with the partial store they describe
        return _with_variants(result, out_path, opts, variants, t0)


def _finish(
    backend: type[Backend],
    out_path: Path,
    tmp: Path,
    opts: BuildOptions,
    t0: float,
    scan: SourceScan,
    probes: Any,
    plan: BuildPlan,
    sel: Selection,
    samples: SampleTable,
    partial: Partial,
    resume: str,
) -> BuildResult:
    """6-7. The manifest, the commit and the publication of a written partial store, and the result."""
    try:
        arrays, manifest = manifest_stage(plan, scan, sel, samples)
    except BaseException as exc:
        discard_partial(partial, out_path, exc)
        raise
    commit_store(partial, out_path, arrays, manifest)
    try:
        publish(tmp, out_path, opts.overwrite)
    finally:
        remove_store(journal_path(out_path))
    try:
        result = BuildResult(
            path=out_path,
            count=plan.count,
            skipped=manifest.skipped,
            seconds=time.perf_counter() - t0,
            input_bytes=probes.nbytes(sel.keep),
            output_bytes=backend.open_reader(out_path).nbytes_on_disk(),
            conversions=dict(manifest.conversions),
            plan=plan,
            resume=resume,
            classes=manifest.classes,
            splits=dict(Counter(s for k in sel.keep if (s := scan.items[k].split) is not None)),
            excluded=scan.excluded,
            ignored=scan.ignored,
            distinct_sizes=len({s.shape[:2] for s in samples}) if plan.image.layout == "variable" else 0,
            **label_summary(plan, scan, samples),
        )
    except KeyboardInterrupt:
        raise PublishedInterrupt(out_path) from None
    return result
