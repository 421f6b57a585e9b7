"""dlpack: pack scattered training images into one store and feed the GPU at memory speed."""

from __future__ import annotations

__version__ = "0.1.0"

from .bench import BenchOptions, BenchReport, run_bench
from .build import BuildResult, build
from .dataset import Dataset, add_array, open
from .errors import (
    BadInputsError,
    DlpackError,
    FormatVersionError,
    IncompleteStoreError,
    InputFileError,
    MissingExtraError,
    OptionError,
    SourceError,
    StateError,
    StoreError,
    StoreExistsError,
    StoreNotFoundError,
)
from .loader import Loader, LoaderOptions
from .manifest import FORMAT_VERSION, ImageSpec, Manifest
from .options import BuildOptions

__all__ = [
    "__version__",
    "build",
    "BuildResult",
    "BuildOptions",
    "run_bench",
    "BenchOptions",
    "BenchReport",
    "open",
    "add_array",
    "Dataset",
    "Loader",
    "LoaderOptions",
    "Manifest",
    "ImageSpec",
    "FORMAT_VERSION",
    "DlpackError",
    "OptionError",
    "SourceError",
    "InputFileError",
    "BadInputsError",
    "StoreExistsError",
    "StoreNotFoundError",
    "StoreError",
    "IncompleteStoreError",
    "FormatVersionError",
    "StateError",
    "MissingExtraError",
]
