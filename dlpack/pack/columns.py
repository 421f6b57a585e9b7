"""The workers' per-sample records as columns (the probes' are :class:`~dlpack.pack.inputs.ProbeTable`).

Every stage of a build used to keep one Python object per image until the manifest was written
(a :class:`~dlpack.pack.inputs.Probe` with its header, a :class:`~dlpack.pack.workers.Sample`, a
job tuple): about 1.3 KB per image, 1.3 GB for a million small images. Here the same records are
fixed-width NumPy columns (about 140 bytes per image), and an object is made only for the one
record being read. The manifest's arrays are built from these columns directly, so the store's
bytes are those the objects gave.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import overload

import numpy as np

from ..errors import InputFileError
from .workers import Sample

__all__ = ["SampleTable"]


class SampleTable(Sequence[Sample]):
    """The samples of a build, in sample order, as the columns of the manifest's arrays.

    A sample with labels (boxes, masks, defects) is kept whole besides, with neither pixels nor
    mask: its ragged label fields have no fixed width.
    """

    __slots__ = ("_n", "_filled", "original_size", "shape", "transform", "checksum", "stat", "sha256",
                 "_conv", "_conv_names", "_labelled")  # fmt: skip

    def __init__(self, n: int) -> None:
        self._n = n
        self._filled = np.zeros(n, dtype=bool)
        self.original_size = np.zeros((n, 2), dtype="<i4")
        self.shape = np.zeros((n, 3), dtype="<i4")
        self.transform = np.zeros((n, 4), dtype="<f8")
        self.checksum = np.zeros(n, dtype="<u4")
        self.stat = np.zeros((n, 2), dtype="<i8")
        self.sha256 = np.zeros((n, 32), dtype=np.uint8)
        self._conv = np.zeros(n, dtype=np.int32)
        self._conv_names: dict[tuple[str, ...], int] = {(): 0}
        self._labelled: dict[int, Sample] = {}

    @classmethod
    def of(cls, samples: Sequence[Sample]) -> SampleTable:
        if isinstance(samples, SampleTable):
            return samples
        table = cls(len(samples))
        table.put(0, samples)
        return table

    def put(self, start: int, samples: Sequence[Sample]) -> None:
        """Samples ``start .. start + len(samples)`` (their pixels and masks are not kept)."""
        for k, s in enumerate(samples, start):
            self.original_size[k] = s.original_size
            self.shape[k] = s.shape
            self.transform[k] = s.transform
            self.checksum[k] = s.checksum
            self.stat[k] = s.stat
            self.sha256[k] = np.frombuffer(bytes.fromhex(s.sha256), dtype=np.uint8)
            self._conv[k] = self._conv_names.setdefault(tuple(s.conversions), len(self._conv_names))
            if s.labelled:
                self._labelled[k] = Sample(
                    s.original_size, s.shape, s.transform, s.checksum, s.conversions, None, s.stat, s.sha256,
                    s.orientation, s.boxes, s.box_labels, s.box_crowd, s.mask_crc, s.label_sha256, s.clipped,
                    s.dropped,
                )  # fmt: skip
            self._filled[k] = True

    def put_results(self, start: int, results: Sequence[Sample | InputFileError]) -> dict[int, InputFileError]:
        """The samples among ``results`` (samples ``start ..``) put; the failures returned by position."""
        failed: dict[int, InputFileError] = {}
        for k, r in enumerate(results, start):
            if isinstance(r, InputFileError):
                failed[k] = r
            else:
                self.put(k, (r,))
        return failed

    @property
    def complete(self) -> bool:
        """Whether every sample was put."""
        return bool(self._filled.all())

    def conversion_counts(self) -> dict[str, int]:
        """How many samples each conversion was applied to."""
        per_code = np.bincount(self._conv, minlength=len(self._conv_names))
        out: dict[str, int] = {}
        for names, code in self._conv_names.items():
            for name in names:
                out[name] = out.get(name, 0) + int(per_code[code])
        return {k: v for k, v in out.items() if v}

    def __len__(self) -> int:
        return self._n

    def _sample(self, k: int) -> Sample:
        if k in self._labelled:
            return self._labelled[k]
        if not self._filled[k]:
            raise IndexError(f"sample {k} was not written")
        conv = next(c for c, code in self._conv_names.items() if code == self._conv[k])
        h, w = self.original_size[k].tolist()
        a, b, c = self.shape[k].tolist()
        sy, sx, oy, ox = self.transform[k].tolist()
        size, mtime = self.stat[k].tolist()
        return Sample((h, w), (a, b, c), (sy, sx, oy, ox), int(self.checksum[k]), conv, None, (size, mtime),
                      self.sha256[k].tobytes().hex())  # fmt: skip

    @overload
    def __getitem__(self, k: int) -> Sample: ...

    @overload
    def __getitem__(self, k: slice) -> list[Sample]: ...

    def __getitem__(self, k: int | slice) -> Sample | list[Sample]:
        if isinstance(k, slice):
            return [self._sample(j) for j in range(*k.indices(self._n))]
        j = k + self._n if k < 0 else k
        if not 0 <= j < self._n:
            raise IndexError(f"sample {k} of {self._n}")
        return self._sample(j)

    def __iter__(self) -> Iterator[Sample]:
        for k in range(self._n):
            yield self._sample(k)
