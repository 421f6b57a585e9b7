"""The ragged arrays of a batch (``boxes``, ``box_labels``, ...): B samples' rows in one array.

A batch of 256 small images with boxes spent more time making 512 per-sample array objects than
reading the boxes themselves (docs/benchmarks.md, "Labels"). :class:`RaggedBatch` keeps the rows of
the whole batch in one array and cuts a sample's rows out only when it is asked for, so a batch costs
one gather whatever its size. It behaves as a read-only sequence of B arrays: ``len``, indexing,
iteration, ``list(batch)``; ``data`` and ``offsets`` give every row at once (sample ``i`` is
``data[offsets[i]:offsets[i + 1]]``), which is what a vectorised consumer (the PyTorch adapter) uses.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, overload

import numpy as np

__all__ = ["RaggedBatch"]


class RaggedBatch(Sequence[np.ndarray]):
    """B samples' rows of one ragged array: ``batch[i]`` is sample ``i``'s ``[k_i, ...]`` rows (a view).

    Parameters
    ----------
    data : numpy.ndarray
        Every row of the batch, sample after sample (``[sum k_i, ...]``).
    offsets : numpy.ndarray
        ``B + 1`` rising int64 bounds into ``data``, starting at 0 and ending at ``len(data)``.
    """

    __slots__ = ("data", "offsets", "_bounds")

    def __init__(self, data: np.ndarray, offsets: np.ndarray) -> None:
        offsets = np.asarray(offsets, dtype=np.int64)
        if offsets.ndim != 1 or not offsets.size or offsets[0] != 0 or offsets[-1] != len(data):
            raise ValueError(f"offsets must rise from 0 to {len(data)} (the rows), got {offsets[:4]}...")
        self.data = data
        self.offsets = offsets
        self._bounds: list[int] | None = None

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def _b(self) -> list[int]:
        if self._bounds is None:
            self._bounds = self.offsets.tolist()
        return self._bounds

    @overload
    def __getitem__(self, i: int) -> np.ndarray: ...

    @overload
    def __getitem__(self, i: slice) -> list[np.ndarray]: ...

    def __getitem__(self, i: int | slice) -> np.ndarray | list[np.ndarray]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        j = i + n if i < 0 else i
        if not 0 <= j < n:
            raise IndexError(f"sample {i} of a batch of {n}")
        b = self._b()
        return self.data[b[j] : b[j + 1]]

    def __iter__(self) -> Iterator[np.ndarray]:
        b, data = self._b(), self.data
        for j in range(len(b) - 1):
            yield data[b[j] : b[j + 1]]

    def take_rows(self, start: int, stop: int) -> RaggedBatch:
        """Samples ``start..stop`` as a RaggedBatch of their rows (a view, no copy): how the loader
        cuts a batch out of several read at once."""
        off = self.offsets
        lo = int(off[start])
        return RaggedBatch(self.data[lo : int(off[stop])], off[start : stop + 1] - lo)

    def counts(self) -> np.ndarray:
        """Rows per sample (``[B]`` int64)."""
        return np.diff(self.offsets)

    def __eq__(self, other: object) -> bool:
        """Equal to a sequence of as many arrays with equal rows (dtype and shape included)."""
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)) or len(other) != len(self):
            return NotImplemented if not isinstance(other, Sequence) else False
        return all(
            isinstance(o, np.ndarray) and o.dtype == s.dtype and o.shape == s.shape and np.array_equal(o, s)
            for s, o in zip(self, other, strict=True)
        )

    __hash__ = None  # type: ignore[assignment]  # mutable rows: not hashable, like a list

    def __repr__(self) -> str:
        return f"RaggedBatch({len(self)} samples, {len(self.data)} rows of {self.data.shape[1:]} {self.data.dtype})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (RaggedBatch, (self.data, self.offsets))
