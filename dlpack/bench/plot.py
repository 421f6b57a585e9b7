"""The bar chart of a :class:`~dlpack.bench.BenchReport` (extra ``[plot]``; matplotlib is imported here only when used).

No pyplot: a ``Figure`` on the Agg canvas needs no display and leaves no global state.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import MissingExtraError
from .results import format_ratio

if TYPE_CHECKING:
    from .report import BenchReport

__all__ = ["plot_report", "require_matplotlib"]


def require_matplotlib() -> Any:
    """The Figure and Agg canvas classes of matplotlib, or a MissingExtraError naming the [plot] extra."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise MissingExtraError("matplotlib", "plot", "dlpack bench --plot") from exc
    return Figure, FigureCanvasAgg


_COLOURS = {
    ("warm", "sequential"): "#1f4e79",
    ("warm", "random"): "#5b9bd5",
    ("warm", "block"): "#a9cbe8",
    ("cold", "sequential"): "#a14600",
    ("cold", "random"): "#ed7d31",
    ("cold", "block"): "#f6bf93",
}


def _short(v: float) -> str:
    """Compact images/s for bar labels and axis ticks: 950, 1.2k, 23k, 1.5M."""
    if v >= 1e6:
        return f"{v / 1e6:.1f}".removesuffix(".0") + "M"
    if v >= 1e4:
        return f"{v / 1e3:.0f}k"
    if v >= 1e3:
        return f"{v / 1e3:.1f}".removesuffix(".0") + "k"
    return f"{v:.0f}"


def plot_report(report: BenchReport, path: Path) -> None:
    """Draw ``report`` as grouped bars (and the step panel, with step figures) into the PNG ``path``."""
    Figure, FigureCanvasAgg = require_matplotlib()
    o = report.options
    targets = list(dict.fromkeys(c.target for c in report.cells))
    series = [(cache, order) for cache in o.caches for order in o.orders]
    step = any(c.busy_fraction is not None for c in report.cells)
    n_t, n_s = len(targets), len(series)
    width = max(7.0, 1.3 + n_t * (0.55 * n_s + 0.6)) + (4.0 if step else 0.0)
    fig = Figure(figsize=(width, 5.6), layout="constrained")
    FigureCanvasAgg(fig)
    if step:
        ax, ax2 = fig.subplots(1, 2, width_ratios=[2.2, 1])
    else:
        ax, ax2 = fig.subplots(1, 1), None
    bar_w = 0.8 / n_s
    values = [c.images_per_s for c in report.cells if c.images_per_s > 0]
    log = bool(values) and max(values) / min(values) > 20
    ymax = max((c.images_per_s_max for c in report.cells), default=1.0) or 1.0
    kind = {c.target: c.kind for c in report.cells}
    for k, (cache, order) in enumerate(series):
        xs, ys, lo, hi = [], [], [], []
        for t, name in enumerate(targets):
            c = report.cell(name, order, cache)
            if c is None:
                continue
            xs.append(t - 0.4 + bar_w * (k + 0.5))
            ys.append(c.images_per_s)
            lo.append(c.images_per_s - c.images_per_s_min)
            hi.append(c.images_per_s_max - c.images_per_s)
        label = f"{cache} cache, {order}"
        if cache == "cold" and any(
            (c := report.cell(n, order, cache)) is not None and not c.eviction_verified for n in targets
        ):
            label += " (eviction not verified)"
        ax.bar(
            xs,
            ys,
            bar_w * 0.92,
            label=label,
            color=_COLOURS.get((cache, order)),
            yerr=[lo, hi] if o.repeat > 1 else None,
            capsize=2,
            ecolor="#333333",
            error_kw={"lw": 0.8},
        )
        for x, y, h in zip(xs, ys, hi, strict=True):
            # Above the whisker, so the value never sits on the error bar.
            top = (y + h) * 1.12 if log else y + h + 0.012 * ymax
            ax.text(x, top, _short(y), ha="center", va="bottom", fontsize=8, rotation=90 if n_s > 4 else 0)
    ax.set_xticks(range(n_t))
    ax.set_xticklabels([f"{t}\n({'folder, decoded' if kind[t] == 'folder' else kind[t]})" for t in targets])
    ax.set_xlim(-0.6, n_t - 0.4)
    ax.set_ylabel(f"images/s (median of {o.repeat}; whiskers: min-max)" if o.repeat > 1 else "images/s")
    if log:
        ax.set_yscale("log")
        ax.set_ylim(min(values) / 2.5, ymax * 4)
        ax.set_ylabel(ax.get_ylabel() + ", log scale")
    else:
        ax.set_ylim(0, ymax * 1.15)
    from matplotlib.ticker import FuncFormatter

    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: _short(v) if v >= 1 else f"{v:g}"))
    ax.grid(axis="y", alpha=0.3, which="major")
    ax.set_axisbelow(True)
    fig.legend(
        *ax.get_legend_handles_labels(), loc="outside lower center", ncols=min(n_s, 4), fontsize=8, frameon=False
    )
    ratios = [c for c in report.cells if c.vs_folder is not None and c.order == "random"]
    if ratios:
        best = max(ratios, key=lambda c: c.vs_folder or 0.0)
        ax.set_title(
            f"read throughput; best store vs folder, random order: {best.target} {best.cache} {format_ratio(best.vs_folder)}",
            fontsize=10,
        )
    else:
        ax.set_title("read throughput", fontsize=10)
    if ax2 is not None:
        for k, (cache, order) in enumerate(series):
            xs, ys = [], []
            for t, name in enumerate(targets):
                c = report.cell(name, order, cache)
                if c is None or c.busy_fraction is None:
                    continue
                xs.append(t - 0.4 + bar_w * (k + 0.5))
                ys.append(100 * c.busy_fraction)
            bars = ax2.bar(xs, ys, bar_w * 0.92, color=_COLOURS.get((cache, order)))
            ax2.bar_label(bars, labels=[f"{y:.0f}" for y in ys], padding=2, fontsize=8)
        ax2.set_xticks(range(n_t))
        ax2.set_xticklabels(targets)
        ax2.set_xlim(-0.6, n_t - 0.4)
        ax2.set_ylim(0, 112)
        ax2.set_ylabel("% of time the step is busy (not waiting for data)")
        ax2.set_title(f"simulated {o.step_ms:g} ms training step per batch", fontsize=10)
        ax2.grid(axis="y", alpha=0.3)
        ax2.set_axisbelow(True)
    loaded = ""
    la = report.load_average_before
    cores = report.machine.get("cores") or 1
    if la and la[0] > 0.5 * cores:
        loaded = f"; load avg {la[0]:.1f} at start"
    fig.suptitle(
        f"dlpack bench: batch {o.batch_size}, {o.workers} workers, prefetch {o.prefetch}{loaded}\n{report.machine_line()}",
        fontsize=10,
    )
    import io

    from .._output import write_atomic

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    write_atomic(path, buf.getvalue())  # a reader never sees half a chart
