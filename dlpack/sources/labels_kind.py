"""Which :class:`~dlpack.sources.Source` a ``--labels KIND[:PATH]`` value means.

``parse_labels`` (the syntax, in :mod:`dlpack.options` so options are checked where they are made)
splits the value; :func:`label_source` builds the source for a source folder and the build options.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import OptionError
from ..options import LABEL_KINDS, BuildOptions, parse_labels
from ._entries import place
from .anomaly import AnomalyFolderSource
from .base import Source
from .coco import CocoSource
from .csv import CsvSource
from .folder import FolderSource
from .masks import MaskFolderSource

__all__ = ["LABEL_KINDS", "parse_labels", "label_source"]


def label_source(src_folder: str | os.PathLike[str], opts: BuildOptions) -> Source:
    """The source that reads ``src_folder`` with the labels ``opts.labels`` names.

    ``src_folder`` is the folder of the images (the build's SRC). Paths in ``opts.labels`` and
    ``opts.anomaly_masks`` are as given (relative to the working folder); any of them may be an
    ``s3://`` URL, read with ``opts.storage_options`` (the options of OUT's URL).
    """
    kind, path = parse_labels(opts.labels)
    src = Path(src_folder)
    if kind in ("auto", "folders", "none"):
        return FolderSource(src, kind, opts.follow_symlinks, opts.exclude, class_folder=opts.class_folder)
    where, options = place(src_folder), opts.storage_options
    assert path is not None or kind == "anomaly"  # parse_labels gives a path to every kind that needs one
    if kind == "coco":
        return CocoSource(where, str(path), opts.instance_masks, storage_options=options)
    if kind == "masks":
        return MaskFolderSource(where, str(path), opts.follow_symlinks, opts.exclude, storage_options=options)
    if kind == "anomaly":
        return AnomalyFolderSource(
            where, opts.anomaly_masks, opts.follow_symlinks, opts.exclude, storage_options=options
        )
    if kind == "csv":
        return CsvSource(where, str(path), storage_options=options)
    try:
        from ..halcon.source import DLDatasetSource
    except ImportError as exc:
        raise OptionError(f"--labels dldataset is not available in this version of dlpack ({exc})") from None
    source: Source = DLDatasetSource(str(path), images_root=where, storage_options=options)
    return source
