"""A scan's items as columns: one bytes blob of relative paths, and integer codes for labels and splits.

A folder of a million small images listed as :class:`~dlpack.sources.base.SourceItem` objects
costs about 190 bytes per image (the object, its ``__dict__`` and the path string) for the whole
build; as columns it costs the path's UTF-8 bytes, an 8-byte offset and 5 bytes of codes. Items
are made only when asked for, one at a time.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, overload

import numpy as np

from .base import SourceItem

__all__ = ["ItemTable"]


class ItemTable(Sequence[SourceItem]):
    """Items without annotations, as columns; a read-only sequence of :class:`SourceItem`.

    Parameters
    ----------
    rels : sequence of str
        The items' relative paths, in item order.
    labels, splits : sequence of int or numpy.ndarray
        Per item, the index into ``label_names`` / ``split_names``, or -1 for none.
    label_names, split_names : tuple of str
        The names the codes index.
    """

    __slots__ = ("_blob", "_ends", "_labels", "_label_names", "_splits", "_split_names")

    def __init__(
        self,
        rels: Iterable[str],
        labels: Sequence[int] | np.ndarray,
        label_names: tuple[str, ...],
        splits: Sequence[int] | np.ndarray,
        split_names: tuple[str, ...],
    ) -> None:
        # No second object per path: the byte lengths counted, then one join and one encode.
        rels = rels if isinstance(rels, Sequence) else list(rels)
        lengths = (len(r) if r.isascii() else len(r.encode("utf-8")) for r in rels)
        self._ends = np.cumsum(np.fromiter(lengths, dtype=np.int64, count=len(rels)))
        self._blob = "".join(rels).encode("utf-8")
        self._labels = np.asarray(labels, dtype=np.int32).reshape(-1)
        self._splits = np.asarray(splits, dtype=np.int16).reshape(-1)
        self._label_names = tuple(label_names)
        self._split_names = tuple(split_names)
        n = len(self._ends)
        if len(self._labels) != n or len(self._splits) != n:
            raise ValueError(f"{n} paths but {len(self._labels)} labels and {len(self._splits)} splits")

    def __len__(self) -> int:
        return len(self._ends)

    def rel(self, k: int) -> str:
        """Item ``k``'s relative path, without making the item."""
        start = int(self._ends[k - 1]) if k else 0
        return self._blob[start : int(self._ends[k])].decode("utf-8")

    def _item(self, k: int) -> SourceItem:
        lab, spl = int(self._labels[k]), int(self._splits[k])
        return SourceItem(
            self.rel(k),
            self._label_names[lab] if lab >= 0 else None,
            split=self._split_names[spl] if spl >= 0 else None,
        )

    @overload
    def __getitem__(self, k: int) -> SourceItem: ...

    @overload
    def __getitem__(self, k: slice) -> tuple[SourceItem, ...]: ...

    def __getitem__(self, k: int | slice) -> SourceItem | tuple[SourceItem, ...]:
        if isinstance(k, slice):
            return tuple(self._item(j) for j in range(*k.indices(len(self))))
        n = len(self)
        j = k + n if k < 0 else k
        if not 0 <= j < n:
            raise IndexError(f"item {k} of {n}")
        return self._item(j)

    def __iter__(self) -> Iterator[SourceItem]:
        for k in range(len(self)):
            yield self._item(k)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"ItemTable({len(self)} items)"

    def source_bytes(self, keep: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The UTF-8 paths of items ``keep``, as one ``uint8`` array and ``len(keep) + 1`` offsets
        into it: the ``source`` array of a store, without one object per sample."""
        blob = np.frombuffer(self._blob, dtype=np.uint8)
        if isinstance(keep, range) and keep == range(len(self)):  # every item: the blob and its ends as they are
            return blob, np.concatenate((np.zeros(1, dtype=np.int64), self._ends))
        idx = np.asarray(keep, dtype=np.int64).reshape(-1)
        ends = self._ends[idx]
        starts = np.where(idx > 0, self._ends[np.maximum(idx - 1, 0)], 0)
        lengths = ends - starts
        offsets = np.zeros(len(idx) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        if len(idx) == len(self) and (len(idx) == 0 or bool(np.all(idx == np.arange(len(idx))))):
            return blob, offsets
        # Runs of consecutive items are contiguous in the blob: one slice each, no per-byte index.
        if not len(idx):
            return blob[:0].copy(), offsets
        breaks = np.flatnonzero(np.diff(idx) != 1) + 1
        firsts = np.concatenate(([0], breaks))
        lasts = np.concatenate((breaks, [len(idx)])) - 1
        parts = [blob[int(starts[a]) : int(ends[b])] for a, b in zip(firsts.tolist(), lasts.tolist(), strict=True)]
        return np.concatenate(parts), offsets

    def with_splits(self, splits: Sequence[str | None]) -> ItemTable:
        """The same items with the splits ``splits`` (one name or None per item)."""
        names = tuple(sorted({s for s in splits if s is not None}))
        code = {s: i for i, s in enumerate(names)}
        out = ItemTable.__new__(ItemTable)
        out._blob, out._ends, out._labels, out._label_names = self._blob, self._ends, self._labels, self._label_names
        out._splits = np.fromiter((code[s] if s is not None else -1 for s in splits), dtype=np.int16, count=len(self))
        out._split_names = names
        return out

    def __reduce__(self) -> tuple[Any, ...]:
        return (ItemTable, (list(self.rel(k) for k in range(len(self))), self._labels, self._label_names,
                            self._splits, self._split_names))  # fmt: skip
