"""What a training loop waited for: the loader's per-epoch statistics (``loader.stats()``).

The one number a starving GPU needs to see is the share of the step loop spent waiting for the
next batch. A loader measures it where the consumer blocks: from the moment it asks for a batch
(``next()``) until the batch is handed over. Everything else of the epoch's wall time is the
caller's own step.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

__all__ = ["EpochStats"]


@dataclass(frozen=True)
class EpochStats:
    """One epoch (or the part of it one pass handed out) as the consumer saw it.

    ``seconds`` runs from the first request of the pass to the end of its last batch's step (the
    request that found the epoch over, or the pass's end); ``wait_seconds`` is the part of it spent
    inside ``next()``. ``complete`` is False for a pass stopped early (a ``break``, a resume point).
    """

    epoch: int
    batches: int
    images: int
    bytes: int
    seconds: float
    wait_seconds: float
    wait_p50_ms: float
    wait_p99_ms: float
    complete: bool

    @property
    def wait_share(self) -> float:
        """Waited / wall time: 0 means the caller never waited for data."""
        return self.wait_seconds / self.seconds if self.seconds > 0 else 0.0

    @property
    def busy_share(self) -> float:
        """1 - :attr:`wait_share`: the share of the epoch spent in the caller's own step."""
        return 1.0 - self.wait_share

    @property
    def images_per_s(self) -> float:
        """Images over wall seconds (0.0 for an epoch that took no time)."""
        return self.images / self.seconds if self.seconds > 0 else 0.0

    @property
    def bytes_per_s(self) -> float:
        """Decoded bytes over wall seconds."""
        return self.bytes / self.seconds if self.seconds > 0 else 0.0

    def line(self) -> str:
        """``epoch 3: 41,212 img/s, waited 2.1 % of the time (p99 0.4 ms)``: what ``report=True`` prints."""
        part = "" if self.complete else f", partial ({self.batches} batches)"
        return (
            f"epoch {self.epoch}: {self.images_per_s:,.0f} img/s, waited {100 * self.wait_share:.1f} % of the time "
            f"(p99 {self.wait_p99_ms:.1f} ms){part}"
        )

    def to_dict(self) -> dict[str, float | int | bool]:
        """The fields and the derived rates, JSON-ready."""
        return {
            "epoch": self.epoch,
            "batches": self.batches,
            "images": self.images,
            "bytes": self.bytes,
            "seconds": self.seconds,
            "wait_seconds": self.wait_seconds,
            "wait_share": self.wait_share,
            "wait_p50_ms": self.wait_p50_ms,
            "wait_p99_ms": self.wait_p99_ms,
            "images_per_s": self.images_per_s,
            "bytes_per_s": self.bytes_per_s,
            "complete": self.complete,
        }


@dataclass
class PassTimer:
    """The clock of one pass: :meth:`asked` when the consumer asks, :meth:`handed` when a batch
    leaves; :meth:`finish` gives the :class:`EpochStats`. Two ``perf_counter`` calls per batch."""

    epoch: int
    _start: float = field(default_factory=time.perf_counter)
    _asked: float = 0.0
    _waits: list[float] = field(default_factory=list)
    _images: int = 0
    _bytes: int = 0

    def __post_init__(self) -> None:
        self._asked = self._start

    def asked(self) -> None:
        self._asked = time.perf_counter()

    def handed(self, images: int, nbytes: int) -> None:
        self._waits.append(time.perf_counter() - self._asked)
        self._images += images
        self._bytes += nbytes

    def finish(self, complete: bool) -> EpochStats:
        seconds = time.perf_counter() - self._start
        waits = sorted(self._waits)
        p50, p99 = _percentile(waits, 0.5) * 1e3, _percentile(waits, 0.99) * 1e3
        return EpochStats(
            epoch=self.epoch,
            batches=len(self._waits),
            images=self._images,
            bytes=self._bytes,
            seconds=seconds,
            wait_seconds=float(math.fsum(waits)),
            wait_p50_ms=float(p50),
            wait_p99_ms=float(p99),
            complete=complete,
        )


def _percentile(ordered: list[float], q: float) -> float:
    """``np.percentile(..., 100 * q)`` (linear) of a sorted list, in Python: NumPy's costs 0.2-0.3 ms a
    call, as much as a whole epoch of a small in-cache set, and a pass ends with two."""
    if not ordered:
        return 0.0
    pos = (len(ordered) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def batch_nbytes(batch: dict[str, object]) -> int:
    """The image bytes of a batch (an array, a tensor, or a list of either)."""
    image = batch.get("image")
    items = image if isinstance(image, list) else [image]
    return sum(int(getattr(x, "nbytes", 0)) for x in items)
