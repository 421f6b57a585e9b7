"""What a measurement yields: :class:`BenchRun` (one timed pass) and :class:`BenchCell` (a cell's medians)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from .targets import DECODED_KINDS, Target

__all__ = ["BenchRun", "BenchCell", "EVICTED_MAX", "WARM_MIN", "format_ratio", "summarise_cell", "with_ratios"]

#: A cold run counts as verified when at most this fraction of the target's pages is still cached.
EVICTED_MAX = 0.02
#: Below this cached fraction after priming, a "warm" run is partly cold and the report says so.
WARM_MIN = 0.95


@dataclass(frozen=True)
class BenchRun:
    """One timed pass: what was read, how long it took, how long each batch kept the consumer waiting."""

    images: int
    batches: int
    seconds: float
    decoded_bytes: int
    disk_bytes: float
    latency_ms_p50: float
    latency_ms_p99: float
    resident_at_start: float | None
    evicted: bool | None = None
    step_ms: float | None = None
    busy_seconds: float | None = None
    wait_seconds: float = 0.0

    @property
    def images_per_s(self) -> float:
        """Images over wall seconds (0.0 for a run that took no time)."""
        return self.images / self.seconds if self.seconds > 0 else 0.0

    @property
    def busy_fraction(self) -> float | None:
        """The share of wall time spent in the simulated training step; None without ``step_ms``."""
        if self.busy_seconds is None or self.seconds <= 0:
            return None
        return min(1.0, self.busy_seconds / self.seconds)

    @property
    def wait_fraction(self) -> float:
        """The share of wall time the consuming loop was blocked waiting for a batch."""
        return min(1.0, self.wait_seconds / self.seconds) if self.seconds > 0 else 0.0

    @property
    def eviction_verified(self) -> bool:
        """Whether a cold run really started cold (at most EVICTED_MAX of the pages still cached)."""
        return self.resident_at_start is not None and self.resident_at_start <= EVICTED_MAX

    def to_dict(self) -> dict[str, Any]:
        """The fields, plus the derived rates and fractions."""
        d = asdict(self)
        d["images_per_s"] = self.images_per_s
        d["busy_fraction"] = self.busy_fraction
        d["wait_fraction"] = self.wait_fraction
        return d


@dataclass(frozen=True)
class BenchCell:
    """One (target, cache, order) combination: medians over the runs, and the runs themselves.

    ``latency_ms_*`` is how long the consuming loop was blocked waiting for each batch (with
    read-ahead, the gap between batches). ``vs_sequential`` is this cell's images/s over the
    sequential cell of the same target and cache; ``vs_folder`` over the first folder target's
    cell with the same order and cache. ``busy_fraction`` (with ``step_ms``): the share of wall time a
    simulated training step of that length was running rather than waiting for data, i.e. the
    GPU-Util such a step would see; ``wait_fraction``, measured separately, the share the loop was
    blocked waiting for a batch (the two add up to about 1; the rest is the loop's own overhead).
    """

    target: str
    path: str
    kind: str
    order: str
    cache: str
    repeats: int
    images: int
    seconds: float
    images_per_s: float
    images_per_s_min: float
    images_per_s_max: float
    spread: float
    decoded_mb_per_s: float
    disk_mb_per_s: float
    latency_ms_p50: float
    latency_ms_p99: float
    peak_rss_mb: float | None
    resident_at_start: float | None
    evicted: bool | None
    eviction_verified: bool | None
    step_ms: float | None = None
    busy_fraction: float | None = None
    wait_fraction: float | None = None
    step_images_per_s: float | None = None
    wait_ms_p50: float | None = None
    wait_ms_p99: float | None = None
    vs_sequential: float | None = None
    vs_folder: float | None = None
    runs: tuple[BenchRun, ...] = ()
    step_runs: tuple[BenchRun, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """The fields with each run as its own ``to_dict``."""
        d = {k: v for k, v in asdict(self).items() if k not in ("runs", "step_runs")}
        d["runs"] = [r.to_dict() for r in self.runs]
        d["step_runs"] = [r.to_dict() for r in self.step_runs]
        return d


def _median(values: Sequence[float]) -> float:
    return float(np.median(np.asarray(values, dtype=np.float64))) if len(values) else 0.0


def summarise_cell(
    target: Target, order: str, cache: str, runs: list[BenchRun], step_runs: list[BenchRun], rss: float | None
) -> BenchCell:
    """Summarise the runs of one cell by their medians."""
    ips = [r.images_per_s for r in runs]
    med = _median(ips)
    cold = cache == "cold"
    residents = [r.resident_at_start for r in runs + step_runs]
    known = [x for x in residents if x is not None]
    if len(known) < len(residents) or not known:
        resident = None
    else:
        resident = max(known) if cold else min(known)
    cell = BenchCell(
        target=target.name,
        path=str(target.path),
        kind=target.kind,
        order=order,
        cache=cache,
        repeats=len(runs),
        images=int(_median([r.images for r in runs])),
        seconds=_median([r.seconds for r in runs]),
        images_per_s=med,
        images_per_s_min=min(ips),
        images_per_s_max=max(ips),
        spread=(max(ips) - min(ips)) / med if med > 0 else 0.0,
        decoded_mb_per_s=_median([r.decoded_bytes / r.seconds / 1e6 for r in runs if r.seconds > 0]),
        disk_mb_per_s=_median([r.disk_bytes / r.seconds / 1e6 for r in runs if r.seconds > 0]),
        latency_ms_p50=_median([r.latency_ms_p50 for r in runs]),
        latency_ms_p99=_median([r.latency_ms_p99 for r in runs]),
        peak_rss_mb=rss,
        resident_at_start=resident,
        evicted=all(bool(r.evicted) for r in runs + step_runs) if cold else None,
        eviction_verified=all(r.eviction_verified for r in runs + step_runs) if cold else None,
        runs=tuple(runs),
        step_runs=tuple(step_runs),
    )
    if step_runs:
        busy = _median([r.busy_fraction or 0.0 for r in step_runs])
        cell = replace(
            cell,
            step_ms=step_runs[0].step_ms,
            busy_fraction=busy,
            wait_fraction=_median([r.wait_fraction for r in step_runs]),
            step_images_per_s=_median([r.images_per_s for r in step_runs]),
            wait_ms_p50=_median([r.latency_ms_p50 for r in step_runs]),
            wait_ms_p99=_median([r.latency_ms_p99 for r in step_runs]),
        )
    return cell


def with_ratios(cells: list[BenchCell], targets: list[Target]) -> list[BenchCell]:
    """The cells with ``vs_sequential`` and ``vs_folder`` filled in."""
    by_key = {(c.target, c.order, c.cache): c for c in cells}
    folder = next((t.name for t in targets if t.is_folder), None)
    out = []
    for c in cells:
        seq = by_key.get((c.target, "sequential", c.cache))
        vs_seq = c.images_per_s / seq.images_per_s if seq and c.order != "sequential" and seq.images_per_s > 0 else None
        base = by_key.get((folder, c.order, c.cache)) if folder is not None and c.kind not in DECODED_KINDS else None
        vs_folder = c.images_per_s / base.images_per_s if base and base.images_per_s > 0 else None
        out.append(replace(c, vs_sequential=vs_seq, vs_folder=vs_folder))
    return out


def format_ratio(v: float | None) -> str:
    """A quotient as the table shows it: ``-``, ``0.93x``, ``41x``."""
    if v is None:
        return "-"
    return f"{v:,.0f}x" if v >= 10 else f"{v:.2f}x"
