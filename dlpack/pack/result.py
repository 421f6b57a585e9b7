"""What a build did, as the summary and ``--json`` report it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._names import shown as shown_name
from ..errors import InputFileError
from ..sources.base import SourceScan
from .plan import BuildPlan
from .workers import Sample

#: Class names the summary lists before "... and N more".
_SUMMARY_CLASSES = 20
#: Per codec: what it costs, and when to choose another (docs/benchmarks.md, "Compression": on
#: real photos lz4 stores about half of none's bytes and zstd a third to a half; both read slower,
#: most of all from the page cache, where none is a copy out of a memory map).
_CODEC_NOTE = {
    "none": (
        "decoded pixels, the fastest reads",
        "for a bucket or network share --compression lz4 about halves it (zstd: less still)",
    ),
    "lz4": ("about half the bytes of none, slower reads", "--compression none reads fastest, zstd stores less"),
    "zstd": ("the fewest bytes, the slowest reads", "--compression none reads fastest, lz4 faster than zstd"),
}


@dataclass(frozen=True)
class BuildResult:
    """What a build did: where the store is, how many images it holds, what was skipped, how fast,
    its classes and how many samples each split holds."""

    #: The store: a local path, or the URL of a store in an object store (without its storage options).
    path: Path | str
    count: int
    skipped: tuple[InputFileError, ...]
    seconds: float
    input_bytes: int
    output_bytes: int
    conversions: dict[str, int] = field(default_factory=dict)
    plan: BuildPlan | None = None
    #: What became of a killed build's partial store: "resumed: k of n blocks already written",
    #: "started over: <why>", "published already: ..." (the killed build had published OUT), or
    #: "" when there was none.
    resume: str = ""
    #: What ``update`` changed: "updated: a added, r replaced, d removed; k of n blocks written", or "".
    update: str = ""
    classes: tuple[str, ...] = ()
    splits: dict[str, int] = field(default_factory=dict)
    #: Paths the exclude patterns left out (folders with a trailing "/"), and files that are not images.
    excluded: tuple[str, ...] = ()
    ignored: tuple[str, ...] = ()
    #: How many stored sizes a variable-size store holds (0 for a fixed-size store).
    distinct_sizes: int = 0
    #: The label task written (``detection``, ``segmentation``, ``anomaly``; "" for none beyond ``labels``).
    task: str = ""
    #: Boxes the resize cut to the stored image, and boxes it left without area (dropped with their labels).
    boxes_clipped: int = 0
    boxes_dropped: int = 0
    #: What the label source changed or did not use (``SourceScan.notes``).
    label_notes: tuple[str, ...] = ()
    #: ``--augment``: the variants added to the store ("K augmentation variants per image: ..."), or "".
    augment: str = ""
    #: Whether ``path`` is a HALCON DLDataset folder (``--format dldataset``) rather than a store.
    dldataset: bool = False

    @property
    def images_per_s(self) -> float:
        """Samples over wall seconds (infinite for a build that took no time: nothing to do)."""
        return self.count / self.seconds if self.seconds > 0 else float("inf")

    @property
    def size_ratio(self) -> float | None:
        """The store's bytes on disk over its source files' (a build's; None for an update, which
        decodes only the files that changed, and where no source bytes were read)."""
        if self.update or self.input_bytes <= 0:
            return None
        return self.output_bytes / self.input_bytes

    @property
    def codec_note(self) -> str:
        """One line: the store's codec, its bytes against its source files', what the codec costs and
        when to choose another ("" for a DLDataset folder, which holds PNG files, or without a plan)."""
        codec = self.plan.compression if self.plan is not None else None
        if self.dldataset or codec is None or codec not in _CODEC_NOTE:
            return ""
        what, otherwise = _CODEC_NOTE[codec]
        ratio = self.size_ratio
        size = f" (store {ratio:.2f}x its source files)" if ratio is not None else ""
        return f'compression {codec}{size}: {what}; {otherwise} (docs/benchmarks.md, "Compression")'

    @property
    def notes(self) -> list[str]:
        """What the user should know about the inputs left out and the store's shape (summary lines, ``notes`` in --json)."""
        out = []
        if self.ignored:
            n = len(self.ignored)
            out.append(f"skipped {n} non-image file{'s' if n != 1 else ''} (--verbose lists them)")
        if self.excluded:
            n = len(self.excluded)
            out.append(f"excluded {n} path{'s' if n != 1 else ''} matching --exclude (--verbose lists them)")
        if self.boxes_clipped or self.boxes_dropped:
            out.append(
                f"boxes: {self.boxes_clipped} clipped to the stored image, {self.boxes_dropped} dropped "
                "(no area left after the resize)"
            )
        out.extend(self.label_notes)
        codec_note = self.codec_note
        if codec_note:
            out.append(codec_note)
        if self.distinct_sizes > 1:
            out.append(
                f"variable-size store ({self.distinct_sizes} distinct sizes): batches are lists; "
                "pass --size WxH or --max-side N for tensors"
            )
        return out

    def summary(self, verbose: bool = False) -> str:
        """Closing lines: images, input MB, output MB, seconds, images/s; the classes; the splits and
        their sizes; the :attr:`notes`; with ``verbose``, every excluded path and non-image file.

        The classes are printed so that a wrong guess of the folder rules is visible at once.
        """
        skipped = f", {len(self.skipped)} skipped" if self.skipped else ""
        ratio = self.size_ratio
        sizes = (
            f"{_size(self.input_bytes)} in -> {_size(self.output_bytes)} out"
            if ratio is None
            else f"{_size(self.input_bytes)} of source files -> {_size(self.output_bytes)} on disk ({ratio:.2f}x)"
        )
        lines = [
            f"packed {self.count} images{skipped}: {sizes} in {self.seconds:.1f} s ({self.images_per_s:.0f} images/s) "
            f"-> {shown_name(self.path)}"
        ]
        lines[0] += "".join(f" ({note})" for note in (self.resume, self.update) if note)
        if self.classes:
            # Escaped one by one: a class folder named with a newline cannot fake a line of the summary.
            shown = ", ".join(shown_name(c) for c in self.classes[:_SUMMARY_CLASSES])
            more = (
                f", ... and {len(self.classes) - _SUMMARY_CLASSES} more" if len(self.classes) > _SUMMARY_CLASSES else ""
            )
            lines.append(f"classes ({len(self.classes)}): {shown}{more}")
        else:
            lines.append("classes: none (unlabelled)")
        if self.splits:
            lines.append("splits: " + ", ".join(f"{shown_name(name)} {n}" for name, n in sorted(self.splits.items())))
        lines += self.notes
        if self.augment:
            lines.append(self.augment)
        if verbose:
            lines += [f"  excluded {shown_name(p)}" for p in self.excluded]
            lines += [f"  not an image: {shown_name(p)}" for p in self.ignored]
        return "\n".join(lines)


def _size(nbytes: int) -> str:
    """Bytes in the unit that shows them with a few digits (kB, MB, GB; powers of 1000)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes / 1e3:.1f} kB"


def label_summary(plan: BuildPlan, scan: SourceScan, samples: Sequence[Sample]) -> dict[str, Any]:
    """The label fields of a :class:`BuildResult`: task, boxes clipped and dropped, the source's notes."""
    return {
        "task": plan.labels.task if plan.labels is not None else "",
        "boxes_clipped": sum(s.clipped for s in samples),
        "boxes_dropped": sum(s.dropped for s in samples),
        "label_notes": tuple(scan.notes),
    }
