"""The build pipeline: scan (-> split) -> probe -> plan -> decode/resize -> write -> manifest -> publish.

Each stage is a module-level function of its inputs that returns new values; nothing is shared
between stages but what one returns and the next takes. The plan is a frozen :class:`BuildPlan`,
recorded in the manifest. Workers receive paths, indices and frozen plans, never open handles; they
open what they need themselves. Every call into the store writer lives in the write stage.

A build holds the lock on its output path (:mod:`dlpack.storage.lock`) from before it looks at any earlier
partial until the store is published, so two builds never write the same partial, and a partial
found while holding the lock is a dead build's.

The stages live in this package's modules, in the order they run: :mod:`.inputs` (scan, split,
probe, path checks), :mod:`.plan`, :mod:`.workers` (decoding, in worker processes), :mod:`.write`
(with :mod:`.journal`, which makes a killed build resumable), :mod:`.arrays` (metadata arrays and
the manifest), :mod:`.publish`, and :mod:`.update` (``build --update``, with :mod:`.changes`).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from .. import _parallel
from ..backends import Backend, backend_for_path, owned_store
from ..errors import OptionError, StoreError, StoreExistsError
from ..options import BuildOptions, with_keywords
from ..sources.base import LocalFiles, Source, SourceFiles, SourceScan, files_of
from ..storage.location import Location, is_url
from ..storage.publish import PublishedInterrupt, check_replaceable
from ..storage.runner import Pool
from ..storage.site import BuildSite, LocalSite, ObjectSite, site_for
from ..storage.spill import give_back_freed
from .arrays import manifest_stage
from .columns import SampleTable
from .inputs import (
    PROBE_STEP,
    Probe,
    Selection,
    as_source,
    bad_inputs,
    check_given,
    check_out_suffix,
    check_paths,
    check_remote_options,
    probe_stage,
    probed,
    scan_stage,
    source_options,
    split_stage,
)
from .plan import BuildPlan, plan_stage
from .result import BuildResult, label_summary
from .update import recorded_label_options, update_stage
from .workers import jobs_of, preload, validate_stage
from .write import Partial, WriteOptions, commit_store, discard_partial, pack_stage

__all__ = ["AfterBuild", "build", "BuildResult", "BuildPlan", "PublishedInterrupt"]


class AfterBuild(Protocol):
    """A step run on the published store once its images are built (``--augment``'s variants).

    The build asks it for its config before anything is packed (a bad config costs nothing), and
    runs it on the store it published, or on the store a stopped run of this build had published
    (``finish``), on the build's Dask pool (``pool``, None without ``scheduler``: one cluster serves
    both). It is passed in by the caller, so the build pipeline imports none of its users.
    """

    def config(self, opts: BuildOptions, plan: BuildPlan, scan: SourceScan) -> Any:
        """The step's config for this build, checked before anything is packed (None: no step)."""
        ...

    def run(
        self,
        result: BuildResult,
        out: Path,
        opts: BuildOptions,
        config: Any,
        t0: float,
        finish: bool = False,
        pool: Pool | None = None,
    ) -> BuildResult:
        """Run the step on the published store ``out``; the build's result, with the step's."""
        ...


def published_by_killed_build(backend: type[Backend], out: Path, plan: BuildPlan, published: str | None) -> bool:
    """Whether ``out`` is the store a killed build of this very ``plan`` committed and published
    (``published``: its journal's fingerprint, from :func:`clear_leftovers`)."""
    return published == plan.fingerprint() and built_by_plan(backend, out, plan)


def built_by_plan(backend: type[Backend], out: Path, plan: BuildPlan) -> bool:
    """Whether the complete store ``out`` records ``plan`` as the plan it was built by: the same
    source listing, geometry and layout, so building it again would write the same store."""
    try:
        with backend.open_reader(out) as reader:
            recorded = reader.manifest.plan
        return bool(recorded) and BuildPlan.from_dict(recorded).fingerprint() == plan.fingerprint()
    except StoreError:
        return False


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


def build(
    src: Source | str | os.PathLike[str],
    out: str | os.PathLike[str],
    options: BuildOptions | None = None,
    *,
    after: AfterBuild | None = None,
    **kwargs: Any,
) -> BuildResult:
    """Pack the images a source lists into one store at ``out`` (``after``: a step run on the
    published store, see :class:`AfterBuild`; :func:`dlpack.build` passes the variants' step).

    Parameters
    ----------
    src
        A folder tree of images (class sub-folders become labels with ``labels="auto"``), or any
        :class:`~dlpack.sources.Source`; a Source lists its own items, so ``labels``,
        ``follow_symlinks`` and ``exclude`` given with another value than its own are refused.
    out
        Store path: a ``.zarr`` folder (default) or a ``.h5``/``.hdf5`` file, or an object-store
        prefix ``s3://bucket/x.zarr`` (a Zarr store written in place; ``storage_options``).
    options
        A :class:`~dlpack.BuildOptions`; keyword arguments override its fields
        (``build("raw", "train.zarr", size=(512, 512), jobs=2)``); an unknown one is an
        :class:`~dlpack.OptionError` naming the fields it may mean.
    after
        A step run on the published store (:class:`AfterBuild`), or None.
    **kwargs
        Fields of :class:`~dlpack.BuildOptions`, overriding ``options``.

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
    check_given(src, out, opts.storage_options)
    # OUT is parsed once: a local path, or an object-store prefix (never a local folder named "s3:").
    # The storage options of a URL SRC with a local OUT are the source's (check_given).
    where = Location.parse(out, opts.storage_options if is_url(out) else None)
    site = site_for(where, Path(out) if where.is_local else None)
    # Local: the path as given (relative stays relative, as messages and the result show it).
    out_path = Path(out) if site.is_local else Path()
    check_out_suffix(out_path if site.is_local else where, format=opts.format, update=opts.update)
    if not site.is_local:
        check_remote_options(where, opts)
    backend = backend_for_path(out_path if site.is_local else where.name, opts.format, write=True)
    from_path = isinstance(src, (str, os.PathLike))
    # A Source object's root as a path is: a source in a bucket (a URL) is refused alike.
    src_root = src if from_path else getattr(src, "root", None)
    if opts.update and is_url(src_root):
        raise OptionError(
            f"--update of a store from a source in a bucket ({src_root}) is not supported: an update compares the "
            "source folder's files with the store's records; build again with --overwrite, or update from a "
            "local copy of the images"
        )
    if from_path and opts.update:
        opts = recorded_label_options(out_path, opts)
    source = as_source(src, opts)
    if not from_path:
        opts = source_options(source, opts)
    check_paths(source, out_path if site.is_local else where)
    # The per-image records a large build keeps in files (dlpack.storage.spill) go beside a local OUT, on its disk.
    with site.hold(), contextlib.ExitStack() as closing:
        published = site.clear_leftovers()
        if opts.update:
            return update_stage(source, out_path, backend, opts, t0)
        # The CLI names its flag instead (dlpack.cli): the keyword is the library's word for it.
        exists = f"{out_path if site.is_local else where} already exists; pass overwrite=True to replace it"
        # A store of this very build without (all) its variants: a run stopped while computing them.
        finishing = False
        if site.exists():
            if opts.overwrite:
                if site.is_local:
                    check_replaceable(out_path)
                else:
                    site.check_replaceable()
                published = None
            elif published is None:
                if not (opts.augment and not out_path.is_symlink() and owned_store(out_path) is backend):
                    raise StoreExistsError(exists)
                finishing = True  # once the plan is known: the same plan, or refused as existing
        root = source.root
        scan = scan_stage(source)
        files = files_of(source)
        # The one pool of the build (a Dask cluster's started on first use, closed with the build).
        pool = closing.enter_context(
            _parallel.pool_for(opts.scheduler, opts.n_jobs, preload, _shared_folders(opts, site, files, scan))
        )
        on_cluster = pool if opts.scheduler is not None else None
        if on_cluster is None and _parallel.pooled(opts.n_jobs, -(-len(scan.items) // PROBE_STEP)):
            # Workers start (about a second) while this process probes, plans and opens the store.
            _parallel.warm_pool(opts.n_jobs, preload)
        if opts.split:
            scan = split_stage(scan, opts.split, opts.split_seed or 0, os.fspath(root))
        give_back_freed()  # what the scan's sort freed, before the stages that hold large blocks
        probes = probe_stage(
            files, scan.items, max_pixels=opts.max_pixels, n_jobs=opts.n_jobs, quiet=opts.quiet, pool=on_cluster
        )
        give_back_freed()
        plan, sel = plan_stage(scan, probes, probed(scan, probes), opts, backend.name, os.fspath(root))
        variants = after.config(opts, plan, scan) if after is not None else None
        finish_step = after.run if after is not None else _as_built
        if published is not None:
            # The same build was killed just after it published OUT: it is done.
            if not published_by_killed_build(backend, out_path, plan, published):
                raise StoreExistsError(exists)
            return finish_step(
                _existing_result(backend, out_path, plan, scan, sel, probes, t0),
                out_path,
                opts,
                variants,
                t0,
                pool=on_cluster,
            )
        if finishing:
            # Its images are built: only the variants are left (resumed from their journal, if any).
            if not built_by_plan(backend, out_path, plan):
                raise StoreExistsError(exists)
            built = "built already: a stopped run of this build had published it"
            existing = _existing_result(backend, out_path, plan, scan, sel, probes, t0, built)
            return finish_step(existing, out_path, opts, variants, t0, finish=True, pool=on_cluster)
        if sel.errors and opts.on_error == "fail":
            pairs = jobs_of(scan.items, probes, sel.keep)
            found = validate_stage(files, plan, pairs, n_jobs=opts.n_jobs, quiet=opts.quiet, pool=on_cluster)
            raise bad_inputs([*sel.errors, *found], root, nothing_left=len(found) == len(pairs))
        plan, sel, samples, partial, resume = pack_stage(
            backend,
            site,
            root,
            scan,
            probes,
            plan,
            sel,
            WriteOptions(opts.n_jobs, opts.quiet, opts.no_resume, pool),
            on_error=opts.on_error,
            replan=lambda kept: plan_stage(scan, probes, kept, opts, backend.name, os.fspath(root)),
            files=files,
        )
        try:
            result = _finish(backend, site, out_path, opts, t0, scan, probes, plan, sel, samples, partial, resume)
        finally:
            samples.close()  # the spilled records' files, with the partial store they describe
        return finish_step(result, out_path, opts, variants, t0, pool=on_cluster)


def _shared_folders(
    opts: BuildOptions, site: BuildSite, files: SourceFiles, scan: SourceScan
) -> dict[str, tuple[str, str | None, int | None]]:
    """The local folders the workers of an existing Dask scheduler (``tcp://``) must see at the same
    paths: SRC's root with its first file (and that file's size), and the folder OUT's partial store
    is made in (a token file goes there). None for this machine's pools, or for URLs."""
    shared: dict[str, tuple[str, str | None, int | None]] = {}
    if opts.scheduler is None or opts.scheduler == "local":
        return shared
    if isinstance(files, LocalFiles) and len(scan.items):
        rel = scan.items[0].rel
        shared["SRC"] = (os.path.abspath(files.root), rel, files.stat(rel).size)
    if isinstance(site, LocalSite):
        shared["OUT"] = (os.path.abspath(site.partial.parent), None, None)
    return shared


def _as_built(
    result: BuildResult,
    out: Path,
    opts: BuildOptions,
    config: Any,
    t0: float,
    finish: bool = False,
    pool: Pool | None = None,
) -> BuildResult:
    return result


def _finish(
    backend: type[Backend],
    site: BuildSite,
    out_path: Path,
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
        discard_partial(partial, site, exc)
        raise
    commit_store(partial, out_path if site.is_local else site, arrays, manifest)
    site.publish(opts.overwrite)
    try:
        result = BuildResult(
            path=out_path if site.is_local else str(site.location),
            count=plan.count,
            skipped=manifest.skipped,
            seconds=time.perf_counter() - t0,
            input_bytes=probes.nbytes(sel.keep),
            output_bytes=site.nbytes()
            if isinstance(site, ObjectSite)
            else backend.open_reader(out_path).nbytes_on_disk(),
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
