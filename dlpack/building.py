"""``dlpack.build``: the build pipeline (``dlpack.pack``), with the steps that stand on it.

``build(augment=K)`` runs the variants' step (``dlpack.variants``) on the published store, and
``format="dldataset"`` packs a hidden store and exports it as a HALCON DLDataset
(``dlpack.halcon.build``). Composed here, above all three, so that none of them imports the others'
users: the pipeline takes the step it runs after publishing as an argument.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from .errors import OptionError
from .options import BuildOptions, with_keywords
from .pack import BuildResult
from .pack import build as build_store
from .pack.inputs import check_given
from .sources.base import Source
from .storage.location import is_url

__all__ = ["build"]


def build(
    src: Source | str | os.PathLike[str],
    out: str | os.PathLike[str],
    options: BuildOptions | None = None,
    **kwargs: Any,
) -> BuildResult:
    """Pack the images a source lists into one store at ``out`` (see :func:`dlpack.pack.build`),
    with the variants of ``augment``, or as a HALCON DLDataset folder with ``format="dldataset"``."""
    opts = with_keywords(options, BuildOptions, kwargs, "build")
    from .halcon.build import DLDATASET_FORMAT, build_dldataset

    if opts.format == DLDATASET_FORMAT:
        check_given(src, out, opts.storage_options)
        if isinstance(src, (str, os.PathLike)) and is_url(src):
            raise OptionError(
                f"--format dldataset from a source in a bucket ({src}) is not supported: build a store from it, "
                "then export that store (dlpack export STORE --to dldataset OUT)"
            )
        if is_url(out):
            raise OptionError(
                f"--format dldataset writes a local folder of files, not {out}; build it into a local folder "
                "(and copy that folder to the object store if it must live there)"
            )
        return build_dldataset(src, Path(out), opts, time.perf_counter(), build)
    after = None
    if opts.augment:
        from .variants.after_build import VariantsStep

        after = VariantsStep()
    return build_store(src, out, opts, after=after)
