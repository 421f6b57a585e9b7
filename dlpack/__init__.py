"""dlpack: pack scattered training images into one store and feed the GPU at memory speed.

The public API is re-exported here lazily: ``import dlpack`` loads only the light modules
(errors, manifest, options); ``dlpack.build``, ``dlpack.open`` and the rest import their module,
and with it OpenCV, zarr, h5py or the benchmark, on first use.
"""

from __future__ import annotations

# When this process is the ``dlpack`` command, its Ctrl-C handling starts before the rest of the
# package loads (a no-op for any other program that imports dlpack).
from ._interrupt import is_the_command as _is_the_command
from ._version import __version__

if _is_the_command():
    from ._interrupt import install as _install_interrupt

    _install_interrupt()

import importlib
from typing import TYPE_CHECKING, Any

from . import errors as _errors
from .errors import *  # noqa: F403  (every public error class, as errors.__all__ lists them)
from .manifest import FORMAT_VERSION, ArraySpec, ImageSpec, Manifest
from .options import AugmentOptions, BenchOptions, BuildOptions, LoaderOptions, TuneOptions

if TYPE_CHECKING:
    from .bench import BenchReport, run_bench
    from .building import build
    from .exports import ExportResult, export
    from .pack import BuildResult
    from .pack.user_arrays import add_array
    from .ragged import RaggedBatch
    from .read.dataset import Dataset, open
    from .read.loader import BatchSource, Loader
    from .timing import EpochStats
    from .tuning import TuneResult, tune
    from .variants import AugmentResult, augment

#: Public name -> the module that defines it, for the names loaded on first use.
_LAZY: dict[str, str] = {
    "build": "building",
    "BuildResult": "pack",
    "run_bench": "bench",
    "BenchReport": "bench",
    "open": "read.dataset",
    "Dataset": "read.dataset",
    "add_array": "pack.user_arrays",
    "export": "exports",
    "ExportResult": "exports",
    "BatchSource": "read.loader",
    "Loader": "read.loader",
    "RaggedBatch": "ragged",
    "EpochStats": "timing",
    "tune": "tuning",
    "TuneResult": "tuning",
    "augment": "variants",
    "AugmentResult": "variants",
}

# Spelled out (not derived from _LAZY): type checkers and linters read __all__ and the imports above
# statically; tests/test_public_api.py checks that every name here resolves.
__all__ = [
    "__version__",
    "build",
    "BuildResult",
    "BuildOptions",
    "run_bench",
    "BenchOptions",
    "BenchReport",
    "open",
    "Dataset",
    "add_array",
    "export",
    "ExportResult",
    "BatchSource",
    "Loader",
    "LoaderOptions",
    "RaggedBatch",
    "EpochStats",
    "tune",
    "TuneOptions",
    "TuneResult",
    "augment",
    "AugmentOptions",
    "AugmentResult",
    "Manifest",
    "ImageSpec",
    "ArraySpec",
    "FORMAT_VERSION",
]
__all__ += _errors.__all__


def __getattr__(name: str) -> Any:
    """Import the module behind a public name on first access and cache the name here."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    imported = importlib.import_module(f".{module}", __name__)
    value = getattr(imported, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
