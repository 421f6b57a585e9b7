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


@dataclass(frozen=True)
class BuildResult:
    """What a build did: where the store is, how many images it holds, what was skipped, how fast,
    its classes and how many samples each split holds."""

    path: Path
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

    @property
    def images_per_s(self) -> float:
        return self.count / self.seconds if self.seconds > 0 else float("inf")

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
        lines = [
            f"packed {self.count} images{skipped}: {self.input_bytes / 1e6:.1f} MB in -> "
            f"{self.output_bytes / 1e6:.1f} MB out in {self.seconds:.1f} s ({self.images_per_s:.0f} images/s) "
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


def label_summary(plan: BuildPlan, scan: SourceScan, samples: Sequence[Sample]) -> dict[str, Any]:
    """The label fields of a :class:`BuildResult`: task, boxes clipped and dropped, the source's notes."""
    return {
        "task": plan.labels.task if plan.labels is not None else "",
        "boxes_clipped": sum(s.clipped for s in samples),
        "boxes_dropped": sum(s.dropped for s in samples),
        "label_notes": tuple(scan.notes),
    }
