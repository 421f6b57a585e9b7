"""What runs an augmentation config: dlpack's own operations, or the whole pipeline by albumentations
(installed by the user). A module of its own so that the options can name them without importing
the operations."""

from __future__ import annotations

__all__ = ["ENGINES"]

#: ``augment_engine`` values.
ENGINES = ("dlpack", "albumentations")
