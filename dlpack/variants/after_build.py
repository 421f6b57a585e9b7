"""``build --augment``: the variants of a store, computed once its images are built and published.

The build pipeline (``dlpack.pack``) knows nothing of variants; :func:`dlpack.build` passes it this
step (:class:`~dlpack.pack.AfterBuild`), which reads the config before anything is packed and runs
the augmentation on the published store.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..errors import DlpackError, OptionError, StoreExistsError
from ..options import BuildOptions
from ..pack import BuildResult
from ..pack.plan import BuildPlan
from ..sources.base import SourceScan
from ..storage.publish import PublishedInterrupt, UnfinishedInterrupt
from ..storage.runner import Pool
from . import run as variant_run
from .plan import resolve_config

__all__ = ["VariantsStep"]


class VariantsStep:
    """The variants of ``build(augment=K)``: an :class:`~dlpack.pack.AfterBuild`."""

    def config(self, opts: BuildOptions, plan: BuildPlan, scan: SourceScan) -> Any:
        """The augmentation config of a build with ``augment`` (read before anything is packed, so a bad
        config costs nothing), or None without."""
        if not opts.augment:
            return None
        if plan.image.layout != "fixed":
            raise OptionError(
                "augment needs one stored size: the images would be stored at their own sizes; pass --size WxH "
                "(or --max-side N with --resize fit)"
            )
        task = plan.labels.task if plan.labels is not None else ("classification" if scan.classes else "none")
        return resolve_config(opts.augment_config, opts.augment_engine, task)

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
        """``result`` once the published store ``out`` has its variants (``--augment``). The store is
        complete without them; a stopped or failed variant run says how to add them (it resumes).

        ``finish``: ``out`` was there before this run (a stopped run of this build published it), so
        variants of this very request already there are the result, and other variants are refused.
        ``pool``: the build's Dask pool, which computes the variants too (no second cluster).
        """
        if config is None:
            return result
        command = f"dlpack augment {out} --augment {opts.augment} --augment-config {opts.augment_config}"
        if opts.augment_seed:
            command += f" --augment-seed {opts.augment_seed}"
        if opts.augment_engine != "dlpack":
            command += f" --augment-engine {opts.augment_engine}"
        if opts.scheduler is not None:  # the variants are computed where the build ran (a store is local:
            command += f" --scheduler {opts.scheduler}"  # no --storage-option, which augment refuses)
        hint = f"{out} was built, but not its augmentation variants: run {command} to add them (it resumes)"
        try:
            done = variant_run.augment_locked(
                out, opts.augment, config, opts.augment_seed, opts.jobs, opts.augment_engine, False, opts.quiet,
                opts.no_resume, finish, scheduler=opts.scheduler, pool=pool,
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
