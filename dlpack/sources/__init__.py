"""Sources: readers that turn a user's raw data into an ordered list of samples.

:class:`Source` is what a build reads; :class:`FolderSource` is the folder-tree implementation, and
the label sources (:class:`CocoSource`, :class:`MaskFolderSource`, :class:`AnomalyFolderSource`,
:class:`CsvSource`, and HALCON's :class:`~dlpack.halcon.source.DLDatasetSource`) read labels from
annotation files and label folders; :func:`label_source` picks one for a ``--labels KIND[:PATH]`` value.
:func:`prepare_image` is the one decode -> orient -> resize -> convert function.
"""

from .anomaly import AnomalyFolderSource
from .base import Source, SourceItem, SourceScan
from .coco import CocoSource
from .csv import CsvSource
from .decode import DecodeError, PreparedImage, TargetSpec, decode_image, prepare_image, read_source_file
from .folder import FolderSource
from .labels import LabelOutputs, prepare_labels
from .labels_kind import label_source, parse_labels
from .masks import MaskFolderSource

__all__ = [
    "Source",
    "SourceItem",
    "SourceScan",
    "FolderSource",
    "CocoSource",
    "MaskFolderSource",
    "AnomalyFolderSource",
    "CsvSource",
    "LabelOutputs",
    "prepare_labels",
    "label_source",
    "parse_labels",
    "TargetSpec",
    "PreparedImage",
    "prepare_image",
    "decode_image",
    "read_source_file",
    "DecodeError",
]


def __getattr__(name: str) -> object:
    # HALCON's DLDataset source lives with HALCON (dlpack.halcon.source), which imports this package:
    # named here too, it is loaded on first use so that either package may be imported first.
    if name == "DLDatasetSource":
        from ..halcon.source import DLDatasetSource

        return DLDatasetSource
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
