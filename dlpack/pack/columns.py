"""The workers' per-sample records as columns (the probes' are :class:`~dlpack.pack.inputs.ProbeTable`).

Every stage of a build used to keep one Python object per image until the manifest was written
(a :class:`~dlpack.pack.inputs.Probe` with its header, a :class:`~dlpack.pack.workers.Sample`, a
job tuple): about 1.3 KB per image, 1.3 GB for a million small images. Here the same records are
fixed-width columns (about 115 bytes per image), and an object is made only for the one record
being read. The manifest's arrays are built from these columns directly, so the store's bytes are
those the objects gave.

Each column is a :class:`~dlpack.storage.spill.Column` of the table's length: a large build's columns
spill into anonymous files beside the output (:func:`~dlpack.storage.spill.spilling_to`), written by
position as the blocks land, and the commit reads them back a part at a time. What stays in
memory is the spans of samples put and the rare labelled samples. Nothing of them has a name, so
nothing is left to clear: a resumed build rebuilds them from its journal.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, overload

import numpy as np

from ..errors import InputFileError
from ..storage.spill import PART, Column
from .workers import Sample

__all__ = ["SampleBlock", "SampleTable"]

#: The columns, by name: dtype and per-sample shape (``conv`` indexes the table's conversion lists).
_COLUMNS: dict[str, tuple[str, tuple[int, ...]]] = {
    "original_size": ("<i4", (2,)),
    "shape": ("<i4", (3,)),
    "transform": ("<f8", (4,)),
    "checksum": ("<u4", ()),
    "stat": ("<i8", (2,)),
    "sha256": ("|u1", (32,)),
    "conv": ("<i4", ()),
}


class _Spans:
    """Which samples were put, as sorted disjoint ``[start, stop)`` spans: one per run of blocks
    put in order, not a flag per sample."""

    __slots__ = ("_spans",)

    def __init__(self) -> None:
        self._spans: list[list[int]] = []

    def add(self, start: int, stop: int) -> None:
        spans = [*self._spans, [start, stop]]
        spans.sort()
        merged: list[list[int]] = []
        for a, b in spans:
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        self._spans = merged

    def covers(self, start: int, stop: int) -> bool:
        return stop <= start or any(a <= start and stop <= b for a, b in self._spans)

    @property
    def spans(self) -> list[tuple[int, int]]:
        return [(a, b) for a, b in self._spans]

    def mask(self, start: int, stop: int) -> np.ndarray:
        """Whether each of samples ``start .. stop`` was put."""
        out = np.zeros(max(0, stop - start), dtype=bool)
        for a, b in self._spans:
            if a < stop and b > start:
                out[max(a, start) - start : min(b, stop) - start] = True
        return out


class SampleTable(Sequence[Sample]):
    """The samples of a build, in sample order, as the columns of the manifest's arrays.

    Its columns are :class:`~dlpack.storage.spill.Column` s of ``n`` rows, in memory while small, else in
    anonymous files (``spill``: from the start; ``in_memory``: never, as for a worker's block). A sample with labels (boxes, masks, defects) is kept whole besides, in
    memory, with neither pixels nor mask: its ragged label fields have no fixed width.
    """

    __slots__ = ("_n", "_filled", "_cols", "_conv_names", "_labelled")

    def __init__(self, n: int, *, spill: bool = False, in_memory: bool = False) -> None:
        self._n = n
        self._filled = _Spans()
        self._cols = {
            name: Column(dtype, row, length=n, spill=spill, in_memory=in_memory)
            for name, (dtype, row) in _COLUMNS.items()
        }
        self._conv_names: dict[tuple[str, ...], int] = {(): 0}
        self._labelled: dict[int, Sample] = {}

    def close(self) -> None:
        """Give back the columns' files now (they go by themselves when the table is collected)."""
        for col in self._cols.values():
            col.close()

    @classmethod
    def of(cls, samples: Sequence[Sample]) -> SampleTable:
        """``samples`` as a table (a SampleTable is returned as it is)."""
        if isinstance(samples, SampleTable):
            return samples
        table = cls(len(samples))
        table.put(0, samples)
        return table

    # The columns the manifest's arrays are written from.
    original_size = property(lambda self: self._cols["original_size"])
    shape = property(lambda self: self._cols["shape"])
    transform = property(lambda self: self._cols["transform"])
    checksum = property(lambda self: self._cols["checksum"])
    stat = property(lambda self: self._cols["stat"])
    sha256 = property(lambda self: self._cols["sha256"])

    def put(self, start: int, samples: Sequence[Sample]) -> None:
        """Samples ``start .. start + len(samples)`` (their pixels and masks are not kept)."""
        m = len(samples)
        if not m:
            return
        codes = self._conv_names
        block = {
            "original_size": np.array([s.original_size for s in samples], dtype="<i4").reshape(m, 2),
            "shape": np.array([s.shape for s in samples], dtype="<i4").reshape(m, 3),
            "transform": np.array([s.transform for s in samples], dtype="<f8").reshape(m, 4),
            "checksum": np.array([s.checksum for s in samples], dtype="<u4"),
            "stat": np.array([s.stat for s in samples], dtype="<i8").reshape(m, 2),
            "sha256": np.frombuffer(b"".join(bytes.fromhex(s.sha256) for s in samples), np.uint8).reshape(m, 32),
            "conv": np.array([codes.setdefault(tuple(s.conversions), len(codes)) for s in samples], dtype="<i4"),
        }
        for name, rows in block.items():
            self._cols[name].write(start, rows)
        for k, s in enumerate(samples, start):
            if s.labelled:
                self._labelled[k] = Sample(
                    s.original_size, s.shape, s.transform, s.checksum, s.conversions, None, s.stat, s.sha256,
                    s.orientation, s.boxes, s.box_labels, s.box_crowd, s.mask_crc, s.label_sha256, s.clipped,
                    s.dropped,
                )  # fmt: skip
        self._filled.add(start, start + m)

    def put_table(self, start: int, other: SampleTable) -> None:
        """The samples ``other`` holds, as samples ``start ..`` of this table (column by column)."""
        m = len(other)
        if not m:
            return
        codes = self._conv_names
        by_code = sorted(other._conv_names.items(), key=lambda kv: kv[1])
        remap = np.array([codes.setdefault(names, len(codes)) for names, _ in by_code], dtype="<i4")
        for name in _COLUMNS:
            rows = np.asarray(other._cols[name])
            if name == "conv":
                rows = remap[rows]
            self._cols[name].write(start, rows)
        for k, sample in other._labelled.items():
            self._labelled[start + k] = sample
        for a, b in other._filled.spans:
            self._filled.add(start + a, start + b)

    def put_results(self, start: int, results: Sequence[Sample | InputFileError]) -> dict[int, InputFileError]:
        """The samples among ``results`` (samples ``start ..``) put; the failures returned by position."""
        failed: dict[int, InputFileError] = {}
        run: list[Sample] = []
        run_start = start
        for k, r in enumerate(results, start):
            if isinstance(r, InputFileError):
                failed[k] = r
                self.put(run_start, run)
                run, run_start = [], k + 1
            else:
                run.append(r)
        self.put(run_start, run)
        return failed

    @property
    def complete(self) -> bool:
        """Whether every sample was put."""
        return self._filled.covers(0, self._n)

    def _rows(self, name: str, start: int, stop: int) -> np.ndarray:
        return self._cols[name].read(start, stop)

    def conversion_counts(self) -> dict[str, int]:
        """How many samples each conversion was applied to."""
        per_code = np.zeros(len(self._conv_names), dtype=np.int64)
        for a in range(0, self._n, PART):
            per_code += np.bincount(self._rows("conv", a, a + PART), minlength=len(self._conv_names))
        out: dict[str, int] = {}
        for names, code in self._conv_names.items():
            for name in names:
                out[name] = out.get(name, 0) + int(per_code[code])
        return {k: v for k, v in out.items() if v}

    def __len__(self) -> int:
        return self._n

    def with_failures(self, failed: dict[int, InputFileError]) -> list[Sample | InputFileError]:
        """Every position's sample, or its failure from ``failed`` (a block that failed to decode)."""
        out: list[Sample | InputFileError] = []
        for a in range(0, self._n, PART):
            out.extend(self._part(a, min(self._n, a + PART), failed))
        return out

    def _part(self, start: int, stop: int, failed: dict[int, InputFileError] | None = None) -> Iterator[Any]:
        """Samples ``start .. stop``, their columns read once for all of them (a position in
        ``failed`` gives its failure instead)."""
        names = {code: c for c, code in self._conv_names.items()}
        cols = {name: self._rows(name, start, stop).tolist() for name in _COLUMNS}
        filled = self._filled.mask(start, stop)
        for j in range(stop - start):
            k = start + j
            if failed is not None and k in failed:
                yield failed[k]
                continue
            if k in self._labelled:
                yield self._labelled[k]
                continue
            if not filled[j]:
                raise IndexError(f"sample {k} was not written")
            size, mtime = cols["stat"][j]
            yield Sample(
                tuple(cols["original_size"][j]),
                tuple(cols["shape"][j]),
                tuple(cols["transform"][j]),
                int(cols["checksum"][j]),
                names[cols["conv"][j]],
                None,
                (size, mtime),
                bytes(cols["sha256"][j]).hex(),
            )

    def _sample(self, k: int) -> Sample:
        sample: Sample = next(self._part(k, k + 1))
        return sample

    @overload
    def __getitem__(self, k: int) -> Sample: ...

    @overload
    def __getitem__(self, k: slice) -> list[Sample]: ...

    def __getitem__(self, k: int | slice) -> Sample | list[Sample]:
        if isinstance(k, slice):
            start, stop, step = k.indices(self._n)
            if step == 1:
                return list(self._part(start, max(start, stop)))
            return [self._sample(j) for j in range(start, stop, step)]
        j = k + self._n if k < 0 else k
        if not 0 <= j < self._n:
            raise IndexError(f"sample {k} of {self._n}")
        return self._sample(j)

    def __iter__(self) -> Iterator[Sample]:
        for a in range(0, self._n, PART):
            yield from self._part(a, min(self._n, a + PART))


class SampleBlock:
    """A block of worker results as columns: what a worker sends back for a block it wrote,
    instead of one :class:`Sample` object per image (about 1 KB each for small images; 43,000 of
    them in one 32 MiB block of 16x16 images), so the blocks in flight from the pool stay small.

    ``failed`` holds the files that failed, by position in the block.
    """

    __slots__ = ("table", "failed")

    def __init__(self, results: Sequence[Sample | InputFileError]) -> None:
        self.table = SampleTable(len(results), in_memory=True)
        self.failed = self.table.put_results(0, results)

    def __len__(self) -> int:
        return len(self.table)

    def samples(self) -> Iterator[Sample]:
        """The block's samples, in order, the failed files left out (made one at a time)."""
        for r in self.table._part(0, len(self.table), self.failed):
            if isinstance(r, Sample):
                yield r

    def results(self) -> list[Sample | InputFileError]:
        """Every position's sample or failure."""
        return list(self.table._part(0, len(self.table), self.failed))
