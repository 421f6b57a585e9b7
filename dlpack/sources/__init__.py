"""Sources: readers that turn a user's raw data into an ordered list of samples."""

from .folder import SourceItem, decode_image, read_source_file, scan_folder

__all__ = ["SourceItem", "scan_folder", "decode_image", "read_source_file"]
