"""Augmentation variants: K deterministic augmented copies of every stored image, cached in the store.

``dlpack.augment(store, k, config)`` (``dlpack augment STORE --augment K --augment-config FILE``)
computes variant ``v`` of sample ``i`` as ``augmenter(stored original, variant_rng(seed, i, v))``
on every core and switches the arrays ``images_v{v}`` (and ``mask_v{v}``, ``boxes_v{v}``, ...,
``checksum_v{v}``, ``augment_v{v}``) into the store in one step (docs/format.md, "Augmentation
variants"). ``ds.variant(i, v)`` reads one back.

The package also serves the variants: the loader's view schedule (:mod:`.schedule`), the batch
source that reads them (:mod:`.views`), and a contact sheet to check them by eye (:mod:`.preview`).
"""

from __future__ import annotations

import os
from typing import Any

from .._files import refuse_url
from ..options import AugmentOptions, with_keywords
from .result import AugmentResult

__all__ = ["augment", "AugmentResult", "AugmentOptions"]


def augment(
    store: str | os.PathLike[str],
    k: int | None = None,
    config: Any = None,
    *,
    options: AugmentOptions | None = None,
    **keywords: Any,
) -> AugmentResult:
    """Add (or replace) ``k`` augmentation variants of every image of a store.

    Variant ``v`` of sample ``i`` is a pure function of ``(seed, i, v)``, the config and the stored
    original (at the training resolution, with its boxes and mask), so the bytes are the same for
    any ``jobs``. Everything is checked before anything is written; a failure leaves the store as
    it was, and a killed or interrupted run is continued by the same call (see ``no_resume``).

    Parameters
    ----------
    store
        A complete fixed-size dlpack store (Zarr or HDF5).
    k
        Variants per image (``--augment K``).
    config
        The path of an augmentation config (albumentations ``to_dict`` JSON/YAML, or a HALCON-style
        object of ``augment_dl_samples`` parameters), or a loaded config: anything with an
        ``augmenter``, ``manifest_record()`` and ``operations()``
        (:class:`~dlpack.variants.plan.AugmentConfigLike`).
    options
        An :class:`~dlpack.options.AugmentOptions`; ``k``, ``config`` and the keywords below replace
        its fields.
    **keywords
        Fields of :class:`~dlpack.options.AugmentOptions` by name, these:
    seed
        The variants' seed (``--augment-seed``).
    jobs
        Worker processes, -1 for every core (at most the core count).
    engine
        ``"dlpack"`` (dlpack's own operations) or ``"albumentations"`` (the whole pipeline run by an
        installed albumentations).
    replace
        Replace the variants the store has; without it such a store is refused.
    quiet
        No progress bar.
    no_resume
        Start over instead of continuing a stopped run's journalled blocks.
    scheduler
        Compute the variants on a Dask cluster: ``"local"`` (a LocalCluster of ``jobs`` workers) or
        ``"tcp://HOST:PORT"`` (a running scheduler whose workers see the store at the same path); the
        bytes are the same as on this machine's pool.

    Raises
    ------
    StoreExistsError
        The store has variants and ``replace`` is false.
    OptionError
        A variable-size store, a bad argument, or a config that cannot be read (``ConfigError``).
    StoreLockedError
        A build, update, ``add_array`` or another ``augment`` holds the store's lock.
    """
    refuse_url(
        store,
        "the store",
        "augment writes its variants into a store on a local path; build locally (with --augment) and upload "
        "the store, or build into a new prefix",
    )
    from .run import augment_store

    given = {name: v for name, v in (("k", k), ("config", config)) if v is not None}
    o = with_keywords(options, AugmentOptions, {**given, **keywords}, "augment")
    return augment_store(
        store,
        o.k,
        o.config,
        seed=o.seed,
        jobs=o.jobs,
        engine=o.engine,
        replace=o.replace,
        quiet=o.quiet,
        no_resume=o.no_resume,
        scheduler=o.scheduler,
    )
