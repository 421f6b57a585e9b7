"""``build --format dldataset``: a store packed beside OUT, exported to OUT as a HALCON DLDataset,
then removed; resumable and safe to kill like any build."""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..backends import backend_for_path, remove_store
from ..errors import OptionError, StoreError, StoreExistsError
from ..exports import export_from
from ..exports._common import clear_export_leftovers, export_marker
from ..options import BuildOptions
from ..pack import BuildResult
from ..pack.inputs import as_source, probe_stage, probed, scan_stage, source_options, split_stage
from ..pack.plan import plan_stage
from ..sources.base import Source, files_of
from ..storage.lock import BuildLock, journal_path, lock_path, old_path, partial_path
from ..storage.publish import clear_leftovers, not_ours

__all__ = ["DLDATASET_FORMAT", "build_dldataset", "dldataset_staging"]

#: ``format`` value that builds a HALCON DLDataset folder instead of a store.
DLDATASET_FORMAT = "dldataset"

#: How a store is built: :func:`dlpack.build` (with the variants of ``augment``).
Build = Callable[[Any, Path, BuildOptions], BuildResult]


def dldataset_staging(out: Path) -> Path:
    """The hidden store a ``format="dldataset"`` build packs into before exporting it to ``out``."""
    return out.parent / f".{out.name}.dlpack-stage.zarr"


def build_dldataset(
    src: Source | str | os.PathLike[str], out: Path, opts: BuildOptions, t0: float, build: Build
) -> BuildResult:
    """Build into a hidden store beside ``out``, export it as a DLDataset to ``out``, remove the store.

    The export is written beside ``out`` and renamed into place when complete, so a failed build or
    export leaves no ``out`` that looks complete. The whole build holds the lock on ``out``, so a
    staging store found while holding it is a killed build's: a rerun resumes it (like any build),
    and once ``out`` is there, every later build into ``out`` removes it. The export's marker records
    the plan's fingerprint: a build killed after its export reached ``out`` (its staging store not yet
    removed), run again with the same plan, says it is complete instead of "already exists".
    """
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
        reason = not_ours(stage)
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
    probes = probe_stage(files_of(source), scan.items, max_pixels=opts.max_pixels, n_jobs=opts.n_jobs, quiet=opts.quiet)
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
