"""Sources: readers that turn a user's raw data into an ordered list of samples.

:class:`Source` is what a build reads; :class:`FolderSource` is the folder-tree implementation, and
the label sources (:class:`CocoSource`, :class:`MaskFolderSource`, :class:`AnomalyFolderSource`,
:class:`CsvSource`, :class:`DLDatasetSource`) read labels from annotation files and label folders; :func:`label_source` picks one
for a ``--labels KIND[:PATH]`` value.
:func:`prepare_image` is the one decode -> orient -> resize -> convert function.
"""

from ..halcon.source import DLDatasetSource
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
    "DLDatasetSource",
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
