"""``dlpack.exports``: :func:`dlpack.export` writes a store out as a HALCON DLDataset, COCO, or HALCON's reader folders.

The store is read through :func:`dlpack.open` only. The export is written into a folder beside
``out`` (``.OUT.dlpack-export-partial``) and renamed to ``out`` when complete, so a failed or
killed export leaves nothing at ``out`` that looks finished (docs/export.md).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._files import refuse_url
from .._version import __version__
from ..errors import OptionError
from ._common import Notes, describe, note_classes, staged_output

__all__ = ["export", "ExportResult", "FORMATS"]

#: The formats ``export`` writes.
FORMATS = ("dldataset", "coco", "folders")


@dataclass(frozen=True)
class ExportResult:
    """What an export wrote: the folder, the format and task, counts, and notes worth reading
    (samples left out, a missing HALCON binding), each said once."""

    out: str
    store: str
    to: str
    task: str
    samples: int
    counts: dict[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    def summary(self) -> str:
        """The one line the CLI prints: what was exported where, and the counts that are not zero."""
        extra = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in self.counts.items() if k != "samples" and v)
        head = f"exported {self.samples} sample(s) of {self.store} ({self.task}) as {self.to} to {self.out}"
        return head + (f" ({extra})" if extra else "")


def export(
    store: str | os.PathLike[str],
    to: str,
    out: str | os.PathLike[str],
    *,
    overwrite: bool = False,
    include_variants: bool = False,
    storage_options: Any = None,
) -> ExportResult:
    """Write the store at ``store`` to the folder ``out`` in the format ``to``.

    Parameters
    ----------
    store
        A dlpack store (Zarr folder or HDF5 file), or a Zarr store's ``s3://`` URL.
    to
        ``"dldataset"`` (HALCON's DLDataset as JSON, plus ``to_hdict.py``; ``dataset.hdict`` too
        where ``import halcon`` works), ``"coco"``, or ``"folders"`` (the layout HALCON's
        ``read_dl_dataset_*`` procedure for the store's task reads).
    out
        A new or empty folder, or a previous dlpack export with ``overwrite=True``.
    overwrite
        Replace ``out`` when it holds a previous dlpack export; anything else there is still refused.
    include_variants
        ``dldataset`` only: the store's augmentation variants of its training samples become extra
        samples, each pointing back at its original (docs/export.md).
    storage_options
        Options of an object-store location (:func:`dlpack.open`'s): endpoint, credentials, ...

    Raises
    ------
    OptionError
        An unknown format, a layout the store's task has not, a split HALCON does not know.
    StoreExistsError
        ``out`` holds something else, or a previous export without ``overwrite``.
    """
    refuse_url(out, "the output")
    return export_from(
        store, to, out, overwrite=overwrite, include_variants=include_variants, storage_options=storage_options
    )


def export_from(
    store: str | os.PathLike[str],
    to: str,
    out: str | os.PathLike[str],
    *,
    overwrite: bool = False,
    include_variants: bool = False,
    built_from: str | None = None,
    plan: str | None = None,
    locked: bool = False,
    storage_options: Any = None,
) -> ExportResult:
    """:func:`export`; with ``built_from`` (a build's source, for ``build --format dldataset``), the
    marker names that source instead of ``store``, a staging store removed once exported, and
    ``plan``, the fingerprint of the plan that store was built by (so that the same build run
    again knows this export for its own); ``locked``: the caller holds the lock on ``out``."""
    if to not in FORMATS:
        raise OptionError(f"export format must be one of {', '.join(FORMATS)}, got {to!r}")
    if include_variants and to != "dldataset":
        raise OptionError(
            f"--include-variants (include_variants=True) applies to --to dldataset only, not {to}: a {to} "
            "export has no key to point a variant back at its original"
        )
    from ..read.dataset import open as open_store
    from ..storage.location import is_url

    remote = is_url(store)
    with open_store(store, storage_options) as ds:
        if include_variants and not getattr(ds, "variants", 0):
            raise OptionError(
                f"store {store} has no augmentation variants to include; add them with "
                "dlpack augment STORE --augment K --augment-config FILE, or export without --include-variants"
            )
        view = describe(ds)
        notes = Notes()
        final = Path(os.path.abspath(out))
        where = str(store) if remote else os.path.abspath(store)
        origin = {"store": where} if built_from is None else {"built_from": built_from}
        if plan is not None:
            origin["plan"] = plan
        marker = {"to": to, "task": view.task, **origin, "dlpack_version": __version__}
        # A store in a bucket cannot overlap a local folder: the overlap check is for local stores.
        with staged_output(final, None if remote else Path(store), overwrite, marker, locked) as stage:
            note_classes(view, notes)
            counts = _write(ds, view, to, stage, final, notes, include_variants)
    return ExportResult(
        out=str(final),
        store=str(store),
        to=to,
        task=view.task,
        samples=int(counts.get("samples", 0)),
        counts=counts,
        notes=tuple(notes.items),
    )


def _write(
    ds: Any, view: Any, to: str, stage: Path, final: Path, notes: Notes, include_variants: bool
) -> dict[str, Any]:
    if to == "dldataset":
        from ..halcon.export import export_dldataset

        return export_dldataset(ds, view, stage, final, notes, include_variants)
    if to == "coco":
        from .coco import export_coco

        return export_coco(ds, view, stage, notes)
    from .folders import export_folders

    return export_folders(ds, view, stage, notes)
