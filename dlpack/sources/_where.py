"""Where label files are: a local folder or an object-store prefix, as :class:`~dlpack.sources.base.SourceFiles`."""

from __future__ import annotations

import os

from ..storage.location import Location, is_url
from .base import LocalFiles, SourceFiles
from .remote import ObjectFiles

__all__ = ["files_at"]


def files_at(where: str | os.PathLike[str] | Location, like: SourceFiles | None = None) -> SourceFiles:
    """The files of the folder or bucket prefix ``where`` (a label folder beside a source's images).

    A URL is read with the storage options of ``like`` when it is a bucket's files (the label files
    of a bucket source come from the same store, with the same credentials); a local path is a
    :class:`LocalFiles` as given, so local label files are read exactly as before.
    """
    if isinstance(where, Location) or is_url(where):
        like = getattr(like, "files", like)  # a read-ahead view: the files it reads
        location = Location.parse(where)
        if isinstance(like, ObjectFiles) and like.location.options:
            location = Location(location.url, like.location.options)
        return ObjectFiles(location)
    return LocalFiles(os.fspath(where))
