"""The result of ``run_bench``: :class:`BenchReport` with its terminal table, JSON document and notes."""

from __future__ import annotations

import json
import math
import os
import textwrap
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .._version import __version__
from ..options import BenchOptions
from .machine import mount_of
from .results import WARM_MIN, BenchCell, format_ratio
from .targets import DECODED_KINDS, Target

__all__ = ["BenchReport", "SCHEMA", "check_outputs", "report_notes"]

SCHEMA = "dlpack-bench/1"


def check_outputs(
    json_path: str | os.PathLike[str] | None = None,
    plot_path: str | os.PathLike[str] | None = None,
    targets: Sequence[str | os.PathLike[str]] = (),
) -> None:
    """Fail before a long run, not after: the output folders exist, neither output is (or lies inside)
    a target measured (a store, or a folder of images whose next run would read a report there as
    input), and matplotlib is there for a plot."""
    from .._output import check_outputs as check
    from ..storage.location import is_url

    local = [("the bench target", t) for t in targets if not is_url(t)]  # a URL's objects are no file here
    check([("--json-file", json_path), ("--plot", plot_path)], local)
    if plot_path is not None:
        from .plot import require_matplotlib

        require_matplotlib()


@dataclass(frozen=True)
class BenchReport:
    """Everything one ``run_bench`` measured, with the machine and the exact options.

    :meth:`to_dict`/:meth:`to_json` give every figure; :meth:`table` the terminal table;
    :meth:`plot` a PNG bar chart (extra ``[plot]``).
    """

    options: BenchOptions
    targets: tuple[dict[str, Any], ...]
    cells: tuple[BenchCell, ...]
    machine: dict[str, Any]
    load_average_before: list[float] | None
    load_average_after: list[float] | None
    started: str
    seconds: float
    notes: tuple[str, ...] = ()
    peak_rss_scope: str = "cell"
    dlpack_version: str = __version__

    def cell(self, target: str, order: str, cache: str) -> BenchCell | None:
        """The cell of ``target`` (its name, as in the table), ``order`` and ``cache``, if measured."""
        for c in self.cells:
            if (c.target, c.order, c.cache) == (target, order, cache):
                return c
        return None

    def ratios(self) -> list[dict[str, Any]]:
        """The comparisons the table's ratio columns show, one entry each."""
        out: list[dict[str, Any]] = []
        for c in self.cells:
            if c.vs_sequential is not None:
                out.append(
                    {"name": f"{c.order}/sequential", "target": c.target, "cache": c.cache, "value": c.vs_sequential}
                )
        for c in self.cells:
            if c.vs_folder is not None:
                out.append(
                    {
                        "name": "store/folder",
                        "target": c.target,
                        "order": c.order,
                        "cache": c.cache,
                        "value": c.vs_folder,
                    }
                )
        return out

    def to_dict(self) -> dict[str, Any]:
        """The document ``dlpack bench --json`` prints, tagged with ``SCHEMA``."""
        return {
            "schema": SCHEMA,
            "dlpack_version": self.dlpack_version,
            "started": self.started,
            "seconds": self.seconds,
            "options": asdict(self.options),
            "machine": self.machine,
            "load_average": {"before": self.load_average_before, "after": self.load_average_after},
            "peak_rss_scope": self.peak_rss_scope,
            "targets": list(self.targets),
            "cells": [c.to_dict() for c in self.cells],
            "ratios": self.ratios(),
            "notes": list(self.notes),
        }

    def to_json(self) -> str:
        """:meth:`to_dict` as JSON text; NaN and infinity become null."""
        return json.dumps(_finite(self.to_dict()), indent=2, ensure_ascii=False, allow_nan=False) + "\n"

    def write_json(self, path: str | os.PathLike[str]) -> None:
        """Write :meth:`to_json` to ``path`` atomically."""
        from .._output import write_atomic

        write_atomic(path, self.to_json())

    def machine_line(self) -> str:
        """One line on the machine: CPU, cores, memory, the first disk's file system, VM, Python."""
        m = self.machine
        mem = f", {m['memory_gb']:.0f} GB RAM" if m.get("memory_gb") else ""
        disk = (m.get("disks") or [{}])[0]
        fs = f", {disk['fstype']} on {disk['device']}" if disk.get("fstype") else ""
        vm = " (VM)" if m.get("virtualized") else ""
        return f"{m.get('cpu', '?')}, {m.get('cores', '?')} cores{mem}{fs}{vm}; Python {m.get('python', '?')}"

    def table(self) -> str:
        """An aligned text table that fits :data:`WIDTH` columns: one row per cell, then notes and
        what the busy column means for training. The figures a terminal has no room for (MB/s
        decoded, batch p50 and p99, vs seq, peak RSS, eviction) are in :meth:`to_dict` and the plot."""
        o = self.options
        step = any(c.busy_fraction is not None for c in self.cells)
        head = ["target", "order", "cache", "images/s", "spread", "disk MB/s", "vs folder"]
        if step:
            head += [f"busy @ {o.step_ms:g} ms"]
        rows = [head]
        for c in self.cells:
            row = [
                c.target,
                c.order,
                _cache(c),
                _num(c.images_per_s),
                f"{c.spread:.0%}",
                _num(c.disk_mb_per_s),
                format_ratio(c.vs_folder),
            ]
            if step:
                row.append("-" if c.busy_fraction is None else f"{c.busy_fraction:.0%}")
            rows.append(row)
        widths = [max(len(r[k]) for r in rows) for k in range(len(head))]
        # The target's name gives way (shortened in the middle) so that a row fits the terminal.
        room = WIDTH - sum(widths[1:]) - 2 * (len(head) - 1)
        widths[0] = max(len(head[0]), min(widths[0], room))
        left = {0, 1, 2}
        lines = []
        for n, r in enumerate(rows):
            r = [_shorten(r[0], widths[0]), *r[1:]]
            cells = [r[k].ljust(widths[k]) if k in left else r[k].rjust(widths[k]) for k in range(len(head))]
            lines.append("  ".join(cells))
            if n == 0:
                lines.append("  ".join("-" * w for w in widths))
        title = (
            f"dlpack bench: batch {o.batch_size}, {o.workers} workers, prefetch {o.prefetch}, "
            f"median of {o.repeat} run(s); spread = (max-min)/median"
        )
        out = [*_wrap(title), *_wrap(f"machine: {self.machine_line()}"), ""] + lines
        more = "MB/s decoded, batch p50 and p99 ms, vs seq, peak RSS and eviction per cell: --json, --json-file"
        if any(_cache(c) == "cold*" for c in self.cells):
            more = "cold* = eviction not verified (see the notes); " + more
        out += _wrap(more)
        if self.notes:
            out.append("")
            for note in self.notes:
                out += _wrap(f"note: {note}")
        wait = self.wait_line()
        if wait is not None:
            out += ["", *_wrap(wait)]
        return "\n".join(out)

    def wait_line(self) -> str | None:
        """What the busy column means for training, in one sentence: the share of the time a training
        step of ``step_ms`` would wait for data, from the folder and from each store.

        Quoted for the order shuffled training reads in (random, else block), whichever cache came
        first; sequential only when no shuffled order was measured, and then it says so. None
        without ``step_ms``, a folder or a store. The wait is ``100 % - busy``, as in the table.
        """
        step = [c for c in self.cells if c.busy_fraction is not None]
        folders = sorted((c for c in step if c.kind in DECODED_KINDS), key=lambda c: _TRAINING_ORDERS.index(c.order))
        for folder in folders:
            stores = [
                c for c in step if c.kind not in DECODED_KINDS and (c.order, c.cache) == (folder.order, folder.cache)
            ]
            if not stores:
                continue

            def wait(c: BenchCell) -> str:
                return f"{1 - (c.busy_fraction or 0.0):.0%}".replace("%", " %")

            shown = ", ".join(f"{wait(c)} ({c.target})" for c in stores) if len(stores) > 1 else wait(stores[0])
            caveat = (
                "; shuffled training reads in random order, which this run did not measure"
                if folder.order == "sequential"
                else ""
            )
            return (
                f"training from the folder would wait {wait(folder)} of the time; from the store {shown} "
                f"(a {self.options.step_ms:g} ms step per batch, {folder.order} order, {folder.cache} cache{caveat})"
            )
        return None

    def plot(self, path: str | os.PathLike[str]) -> None:
        """Write a PNG bar chart of images/s per target, grouped by target, one bar per cache and order."""
        from .plot import plot_report

        plot_report(self, Path(path))


#: The widest line :meth:`BenchReport.table` prints: a terminal's width, with room to spare.
WIDTH = 100
#: The orders the wait sentence prefers, most like shuffled training first.
_TRAINING_ORDERS = ("random", "block", "sequential")


def _wrap(text: str) -> list[str]:
    """``text`` as lines of at most :data:`WIDTH` characters, the later ones indented; a percentage
    stays on one line with its number."""
    lines = textwrap.wrap(text.replace(" %", "\0%"), WIDTH, subsequent_indent="  ", break_on_hyphens=False)
    return [line.replace("\0", " ") for line in lines] or [""]


def _shorten(name: str, width: int) -> str:
    """``name`` cut in the middle to ``width`` characters: both ends tell targets apart."""
    if len(name) <= width:
        return name
    keep = width - 3
    return name[: keep - keep // 2] + "..." + name[len(name) - keep // 2 :]


def _cache(c: BenchCell) -> str:
    """The cache of a cell; a cold cell whose eviction was not verified gets a star."""
    return "cold*" if c.cache == "cold" and not c.eviction_verified else c.cache


def _finite(x: Any) -> Any:
    """JSON has no NaN or infinity: map them to null."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def _num(v: float) -> str:
    if v >= 100:
        return f"{v:,.0f}"
    if v >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def report_notes(
    report_cells: list[BenchCell],
    targets: list[Target],
    options: BenchOptions,
    machine: dict[str, Any],
    before: list[float] | None,
    after: list[float] | None,
    scoped: bool,
) -> list[str]:
    """What the figures cannot show by themselves: unverified eviction, a busy machine, a VM."""
    notes: list[str] = []
    for t in targets:
        cold = [c for c in report_cells if c.target == t.name and c.cache == "cold"]
        warm = [c for c in report_cells if c.target == t.name and c.cache == "warm"]
        if t.remote:
            if cold or warm:
                notes.append(
                    f"{t.name}: remote (object storage): page-cache residency does not apply; cold runs start with an "
                    "empty shard cache (a fresh reader), warm runs after one untimed epoch fetched every shard a "
                    "batch reads into it (a store larger than the reader's shard cache stays partly cold)"
                )
            continue
        if cold:
            if not all(c.evicted for c in cold):
                if hasattr(os, "posix_fadvise"):
                    notes.append(
                        f"{t.name}: cold runs were NOT cold: some of its files could not be opened or advised "
                        "out of the page cache - check their permissions, or drop caches by hand"
                    )
                else:
                    notes.append(
                        f"{t.name}: cold runs were NOT cold: a cold cache is not supported on this platform "
                        "(no posix_fadvise) - drop caches by hand or reboot between runs"
                    )
            elif any(c.resident_at_start is None for c in cold):
                notes.append(
                    f"{t.name}: eviction could not be verified (no mincore here); cold figures may include cached data"
                )
            elif not all(c.eviction_verified for c in cold):
                worst = max(c.resident_at_start or 0.0 for c in cold)
                m = mount_of(t.path)
                why = (
                    f"its file system ({m['fstype']}) keeps files in memory"
                    if m and m["fstype"] in ("tmpfs", "ramfs")
                    else "another process maps or locks its files, or the file system ignores the advice"
                )
                notes.append(
                    f"{t.name}: {worst:.0%} of its pages stayed cached after eviction ({why}); cold figures are partly warm"
                )
        if warm:
            low = [
                c.resident_at_start for c in warm if c.resident_at_start is not None and c.resident_at_start < WARM_MIN
            ]
            if low:
                notes.append(
                    f"{t.name}: only {min(low):.0%} of its bytes stayed in the page cache (larger than free memory?); "
                    "warm figures are partly cold"
                )
        if cold and options.samples is not None and options.samples > t.count:
            notes.append(
                f"{t.name}: cold runs read one epoch ({t.count} images), not {options.samples}: after that the data is cached"
            )
    if any(c.cache == "cold" for c in report_cells) and machine.get("virtualized"):
        notes.append(
            "this OS runs in a VM: a page cache on the host is invisible from here, so 'cold' means not in this "
            "OS's cache; a truly cold disk may be slower"
        )
    cores = machine.get("cores") or 1
    busy = [la[0] for la in (before, after) if la]
    if busy and max(busy) > 0.5 * cores:
        notes.append(
            f"the machine was busy (load average {before[0] if before else '?'} before, {after[0] if after else '?'} after, "
            f"on {cores} cores): absolute figures are low and noisy, compare ratios"
        )
    if not scoped:
        notes.append("peak RSS is this process's peak so far (per-cell reset needs Linux)")
    if any(c.kind in DECODED_KINDS for c in report_cells):
        notes.append(
            "folder targets are decoded and resized on the fly, as a training script would; stores are read as stored"
        )
    return notes
