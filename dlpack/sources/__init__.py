"""Sources: readers that turn a user's raw data into an ordered list of samples.

:class:`Source` is what a build reads; :class:`FolderSource` is the folder-tree implementation.
:func:`prepare_image` is the one decode -> orient -> resize -> convert function.
"""

from .base import Source, SourceItem, SourceScan
from .decode import DecodeError, PreparedImage, TargetSpec, decode_image, prepare_image, read_source_file
from .folder import FolderSource, scan_folder

__all__ = [
    "Source",
    "SourceItem",
    "SourceScan",
    "FolderSource",
    "scan_folder",
    "TargetSpec",
    "PreparedImage",
    "prepare_image",
    "decode_image",
    "read_source_file",
    "DecodeError",
]
