"""What a build reads: the :class:`Source` protocol and the items a source lists.

A source turns the user's input (a folder tree, later a COCO file, a CSV, a mask folder or a
DLDataset) into an ordered list of :class:`SourceItem`. The build decodes each item's file at
``source.root / item.rel`` and stores the samples in the order the source gives; it knows nothing
else about where the items came from, so a new source plugs in without touching the build (:mod:`dlpack.pack`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from ..errors import InputFileError

__all__ = ["Source", "SourceItem", "SourceScan"]


@dataclass(frozen=True)
class SourceItem:
    """One input sample.

    Attributes
    ----------
    rel : str
        The image file's path relative to the source root, with ``/`` separators.
    label : str or None
        The sample's class name (one of :attr:`SourceScan.classes`), or None when unlabelled.
    annotations : Mapping or None
        Per-sample annotations of label sources (boxes, mask paths, ...); None for folders.
    split : str or None
        The split the source assigns (``"train"``, ``"test"``, ...), or None.
    """

    rel: str
    label: str | None = None
    # Excluded from hashing: a mapping is not hashable, and items are compared, not hashed.
    annotations: Mapping[str, Any] | None = field(default=None, hash=False)
    split: str | None = None


@dataclass(frozen=True)
class SourceScan:
    """The result of :meth:`Source.scan`.

    Attributes
    ----------
    items : sequence of SourceItem
        Every usable input, in sample order: a tuple, or (for a folder) an
        :class:`~dlpack.sources._items.ItemTable` that keeps them as columns and makes each item
        when it is read, so a million-image scan does not hold a million objects.
    classes : tuple of str
        Class names; a stored label ``k`` means ``classes[k]``. Empty when unlabelled.
    errors : tuple of InputFileError
        Inputs the scan found but cannot use (the build fails on them or skips them, per ``on_error``).
    labels : str
        Where the labels come from, as recorded in the manifest: ``"folders"``, ``"none"``, ...
    excluded : tuple of str
        Paths left out by an exclude pattern (a folder with a trailing ``/``, for everything under it).
    ignored : tuple of str
        Files found that are not images (``.txt``, ``.pdf``, ...): not packed, listed for the summary.
    class_ids : tuple of int
        The original id of each class in ``classes`` (COCO category id, HALCON class id, mask pixel
        value), aligned with ``classes``. Empty means ``0 .. len(classes) - 1``.
    task : str
        ``"classification"``, ``"detection"``, ``"segmentation"``, ``"anomaly"`` or ``"none"``: which
        label arrays the build writes.
    label_root : str or None
        The folder the items' ``mask`` / ``anomaly_mask`` paths are relative to, when not ``root``.
    notes : tuple of str
        One line each for the summary about labels the source changed or did not use, e.g. "clipped
        3 boxes that stuck out of their image (...)"; nothing in a note stops the build.
    """

    items: Sequence[SourceItem]
    classes: tuple[str, ...] = ()
    errors: tuple[InputFileError, ...] = ()
    labels: str = "none"
    excluded: tuple[str, ...] = ()
    ignored: tuple[str, ...] = ()
    class_ids: tuple[int, ...] = ()
    task: str = "classification"
    label_root: str | None = None
    notes: tuple[str, ...] = ()


@runtime_checkable
class Source(Protocol):
    """What :func:`dlpack.build` reads.

    ``root`` is the folder that item paths are relative to; ``scan()`` lists the items. A scan
    raises :class:`~dlpack.errors.SourceError` when the input is unusable as a whole (missing,
    empty), and reports single unusable inputs in :attr:`SourceScan.errors`.
    """

    @property
    def root(self) -> Path:
        """The folder item paths are relative to."""
        ...

    def scan(self) -> SourceScan:
        """Every item, with the single inputs that could not be used in ``errors``."""
        ...
