"""What ``dlpack bench`` measures: :class:`BenchOptions`, one field per CLI flag."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ..errors import OptionError
from ..options import parse_size
from ..read.loader import LoaderOptions, Order

__all__ = ["BenchOptions", "ORDERS", "CACHES"]

ORDERS: tuple[Order, ...] = ("sequential", "random", "block")
CACHES: tuple[str, ...] = ("warm", "cold")


def _choices(name: str, flag: str, value: str | Sequence[str], allowed: tuple[str, ...]) -> tuple[str, ...]:
    """A comma list or sequence of ``allowed`` values, each at most once, as a tuple."""
    items = value.split(",") if isinstance(value, str) else list(value)
    items = [str(v).strip() for v in items if str(v).strip()]
    bad = [v for v in items if v not in allowed]
    if bad or not items:
        raise OptionError(f"{name} ({flag}) must be a comma-separated list of {', '.join(allowed)}; got {value!r}")
    if len(set(items)) != len(items):
        raise OptionError(f"{name} ({flag}) lists a value twice: {value!r}")
    return tuple(items)


def _int(name: str, value: object, minimum: int) -> None:
    """Refuse anything but an integer >= ``minimum`` (bools included)."""
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < minimum:
        raise OptionError(f"{name} must be an integer >= {minimum}, got {value!r}")


@dataclass(frozen=True)
class BenchOptions:
    """What ``dlpack bench`` measures; each field is one CLI flag (its help is in the field's metadata).

    ``orders`` and ``caches`` accept tuples or comma-separated strings (``"sequential,random"``).
    ``samples`` (images per run) and ``seconds`` (per run) are exclusive; with neither, a run
    reads one epoch, at most 10 s, and a warm run keeps reading for at least 1 s. Cold runs read at
    most one epoch (after that the data is cached). ``repeat`` runs per cell give the median and
    the spread. ``step_ms`` adds, per run, a second run that sleeps that long per batch, as a
    training step would, and reports how much of the time the step was busy. ``size`` (W, H) is
    the resolution folder targets are resized to (default: the first store target's).
    ``batch_size``, ``workers`` and ``prefetch`` are the loader's, with its defaults.
    """

    orders: tuple[str, ...] = field(
        default=("sequential", "random"),
        metadata={"help": "comma list of sequential, random, block", "metavar": "LIST", "flag": "--order"},
    )
    caches: tuple[str, ...] = field(
        default=("warm", "cold"),
        metadata={
            "help": "comma list of warm, cold (cold evicts the target first)",
            "metavar": "LIST",
            "flag": "--cache",
        },
    )
    batch_size: int = field(default=LoaderOptions.batch_size, metadata={"help": "images per batch", "metavar": "B"})
    workers: str | int = field(  # "auto" or a count; the CLI passes the text, parsed below
        default=LoaderOptions.workers, metadata={"help": "loader threads, or auto", "metavar": "W"}
    )
    prefetch: int = field(default=LoaderOptions.prefetch, metadata={"help": "batches read ahead", "metavar": "P"})
    samples: int | None = field(
        default=None,
        metadata={"help": "images per run (default: one epoch, 1-10 s; not with --seconds)", "metavar": "N"},
    )
    seconds: float | None = field(
        default=None, metadata={"help": "seconds per run (not with --samples)", "metavar": "T"}
    )
    repeat: int = field(default=3, metadata={"help": "runs per cell; the median is reported", "metavar": "R"})
    step_ms: float | None = field(
        default=None, metadata={"help": "simulate a training step of MS per batch", "metavar": "MS"}
    )
    size: tuple[int, int] | None = field(
        default=None,
        metadata={"help": "resolution for folder targets (default: the first store's)", "metavar": "WxH"},
    )
    seed: int = field(default=0, metadata={"help": "seed of the random and block orders", "metavar": "S"})
    quiet: bool = field(default=False, metadata={"help": "no progress bar"})

    def __post_init__(self) -> None:
        object.__setattr__(self, "orders", _choices("order", "--order", self.orders, ORDERS))
        object.__setattr__(self, "caches", _choices("cache", "--cache", self.caches, CACHES))
        _int("batch_size", self.batch_size, 1)
        if self.workers != "auto":
            if isinstance(self.workers, str):  # the CLI passes the text given
                try:
                    object.__setattr__(self, "workers", int(self.workers))
                except ValueError:
                    raise OptionError(f"workers must be 'auto' or an integer >= 0, got {self.workers!r}") from None
            _int("workers", self.workers, 0)
        _int("prefetch", self.prefetch, 0)
        _int("repeat", self.repeat, 1)
        _int("seed", self.seed, 0)
        if self.samples is not None and self.seconds is not None:
            raise OptionError("give either samples (--samples N) or seconds (--seconds T) per run, not both")
        if self.samples is not None:
            _int("samples", self.samples, 1)
        if self.seconds is not None and (not isinstance(self.seconds, (int, float)) or not self.seconds > 0):
            raise OptionError(f"seconds must be a number > 0, got {self.seconds!r}")
        if self.step_ms is not None and (
            not isinstance(self.step_ms, (int, float)) or not math.isfinite(self.step_ms) or self.step_ms < 0
        ):
            raise OptionError(f"step_ms must be a number of milliseconds >= 0, got {self.step_ms!r}")
        if self.size is not None:
            object.__setattr__(self, "size", parse_size(self.size))

    def loader_options(self, order: str) -> LoaderOptions:
        """The loader settings of one cell: these options, read in ``order``."""
        loader_order = next((o for o in ORDERS if o == order), None)
        if loader_order is None:
            raise OptionError(f"order must be one of {', '.join(ORDERS)}, got {order!r}")
        return LoaderOptions(
            batch_size=self.batch_size,
            shuffle=loader_order != "sequential",
            seed=self.seed,
            prefetch=self.prefetch,
            workers="auto" if self.workers == "auto" else int(self.workers),
            order=loader_order,
        )
