"""What ``dlpack augment`` did, as its summary and ``--json`` report it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .._names import shown

__all__ = ["AugmentResult"]


@dataclass(frozen=True)
class AugmentResult:
    """The variants a store holds after ``augment``, and how this run made them.

    ``written`` counts the variant images this run computed (a resumed run skips the blocks it
    kept); ``variants_per_s`` is their rate. ``resume`` says what became of a stopped run:
    ``"resumed: a of b blocks already written"``, ``"started over: <why>"``, ``"published already:
    ..."``, or ``""``. ``replaced`` is the K of the variants the store held before (0: none).
    ``copies`` counts the variants left equal to their original or to another variant of the same
    image because no redraw made a new view (a config with few possible outcomes for K).
    """

    path: Path
    k: int
    count: int
    seconds: float
    written: int
    blocks: int
    blocks_written: int
    resume: str = ""
    replaced: int = 0
    copies: int = 0
    seed: int = 0
    engine: str = "dlpack"
    config: str = ""

    @property
    def variants(self) -> int:
        """Variant images the store holds: K per image."""
        return self.k * self.count

    @property
    def variants_per_s(self) -> float:
        """Variant images this run computed, per wall second (infinite when nothing took time)."""
        return self.written / self.seconds if self.seconds > 0 else float("inf")

    def summary(self) -> str:
        """One line: the variants, the rate, the store (and the resume note, and what was replaced)."""
        line = (
            f"augmented {self.count} images x {self.k} variant{'s' if self.k != 1 else ''} "
            f"({self.variants} variants, {self.written} computed) "
            f"in {self.seconds:.1f} s ({self.variants_per_s:.0f} variants/s) -> {shown(self.path)}"
        )
        notes = [self.resume] if self.resume else []
        if self.replaced:
            notes.append(f"replaced its {self.replaced} variants per image")
        if self.copies:
            notes.append(
                f"{self.copies} variant{'s are copies' if self.copies != 1 else ' is a copy'} of another view of "
                "the same image: the config cannot make that many distinct views of them"
            )
        return line + "".join(f" ({note})" for note in notes)
