"""A dlpack store as the bench reads it: a :class:`~dlpack.Dataset` with the BatchSource ``warm`` step."""

from __future__ import annotations

from ..dataset import Dataset

__all__ = ["StoreSource"]


class StoreSource(Dataset):
    """A Dataset whose lazy maps and indexes can be built ahead with :meth:`warm`, as the Loader does."""

    def warm(self) -> None:
        """Open memory maps and shard indexes now, outside any timing."""
        self.reader.warm()
