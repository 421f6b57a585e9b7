"""The public surface: ``dlpack.__all__`` and what ``import dlpack`` pulls in."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import dlpack

PUBLIC = {
    "__version__",
    "build",
    "BuildResult",
    "BuildOptions",
    "run_bench",
    "BenchOptions",
    "BenchReport",
    "open",
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
}


def test_all_matches_the_checked_list() -> None:
    assert sorted(dlpack.__all__) == sorted(PUBLIC)
    assert len(dlpack.__all__) == len(set(dlpack.__all__))


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_every_public_name_exists(name: str) -> None:
    assert getattr(dlpack, name, None) is not None


@pytest.mark.parametrize(
    "name, builtin",
    [
        ("OptionError", ValueError),
        ("SourceError", FileNotFoundError),
        ("BadInputsError", ValueError),
        ("StoreExistsError", FileExistsError),
        ("StoreNotFoundError", FileNotFoundError),
        ("StoreError", OSError),
        ("FormatVersionError", OSError),
        ("MissingExtraError", ImportError),
    ],
)
def test_errors_subclass_dlpack_error_and_a_builtin(name: str, builtin: type) -> None:
    cls = getattr(dlpack, name)
    assert issubclass(cls, dlpack.DlpackError) and issubclass(cls, builtin)


def test_import_pulls_in_no_heavy_optional_package() -> None:
    code = "import json, sys, dlpack; print(json.dumps(sorted(sys.modules)))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    loaded = json.loads(proc.stdout)
    heavy = [m for m in loaded if m.split(".")[0] in {"torch", "matplotlib", "dask", "halcon", "mvtec"}]
    assert heavy == []
    assert "dlpack" in loaded
