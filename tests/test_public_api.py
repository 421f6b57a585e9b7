"""The public surface: ``dlpack.__all__`` and what ``import dlpack`` pulls in."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import dlpack
from dlpack import errors

# Everything public that is not an error; the errors come from errors.__all__.
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
}

# Loaded on first use only: heavy (OpenCV, plotting, torch, the storage libraries and the
# process-pool/progress helpers) or POSIX-only (the benchmark and its page-cache and machine probes).
NOT_AT_IMPORT = {
    "cv2",
    "matplotlib",
    "torch",
    "h5py",
    "hdf5plugin",
    "zarr",
    "numcodecs",
    "google_crc32c",
    "joblib",
    "tqdm",
    "dask",
    "resource",
    "dlpack.bench",
    "dlpack.bench.pagecache",
    "dlpack.bench.machine",
    "dlpack.pack",
    "dlpack._parallel",
    "dlpack.backends",
    "dlpack.export",
    "dlpack.tuning",
}


def _fresh_python(code: str) -> str:
    """Run ``code`` in a new interpreter that imports this checkout's dlpack; return its stdout."""
    root = str(Path(dlpack.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_all_is_the_checked_list_plus_every_error() -> None:
    assert len(dlpack.__all__) == len(set(dlpack.__all__))
    assert set(dlpack.__all__) == PUBLIC | set(errors.__all__)


def test_every_public_error_is_exported_and_a_dlpack_error() -> None:
    assert set(errors.__all__) <= set(dlpack.__all__)
    for name in errors.__all__:
        obj = getattr(dlpack, name)
        assert obj is getattr(errors, name)
        assert isinstance(obj, type) and issubclass(obj, dlpack.DlpackError), name


def test_every_exception_defined_in_errors_is_in_its_all() -> None:
    defined = {
        name
        for name, obj in vars(errors).items()
        if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == errors.__name__
    }
    assert defined - set(errors.__all__) == set()


@pytest.mark.slow
def test_every_public_name_resolves_in_a_fresh_interpreter() -> None:
    code = "import json, dlpack\nprint(json.dumps({n: getattr(dlpack, n) is not None for n in dlpack.__all__}))\n"
    resolved = json.loads(_fresh_python(code))
    assert resolved == {name: True for name in dlpack.__all__}


@pytest.mark.parametrize("name", sorted(PUBLIC | set(errors.__all__)))
def test_every_public_name_is_listed_by_dir(name: str) -> None:
    assert name in dir(dlpack)


def test_unknown_attribute_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'nonexistent'"):
        dlpack.nonexistent  # noqa: B018


@pytest.mark.parametrize(
    ("name", "builtin"),
    [
        ("OptionError", ValueError),
        ("SourceNotFoundError", FileNotFoundError),
        ("LabelFileError", ValueError),
        ("BadInputsError", ValueError),
        ("StoreExistsError", FileExistsError),
        ("StoreNotFoundError", FileNotFoundError),
        ("StoreError", OSError),
        ("FormatVersionError", OSError),
        ("SampleIndexError", IndexError),
        ("MissingExtraError", ImportError),
    ],
)
def test_errors_subclass_dlpack_error_and_a_builtin(name: str, builtin: type) -> None:
    cls = getattr(dlpack, name)
    assert issubclass(cls, dlpack.DlpackError) and issubclass(cls, builtin)


def test_a_malformed_label_file_is_a_source_error_but_no_missing_file() -> None:
    assert issubclass(dlpack.LabelFileError, dlpack.SourceError)
    assert issubclass(dlpack.SourceNotFoundError, dlpack.SourceError)
    assert not issubclass(dlpack.LabelFileError, FileNotFoundError)


def test_the_decode_and_upscale_errors_are_dlpack_errors() -> None:
    from dlpack.sources.decode import DecodeError
    from dlpack.transforms.functional import UpscaleError

    for cls in (DecodeError, UpscaleError):
        assert issubclass(cls, dlpack.DlpackError) and issubclass(cls, ValueError)


def test_every_option_class_lives_in_dlpack_options() -> None:
    from dlpack import options

    for name in ("BuildOptions", "AugmentOptions", "LoaderOptions", "BenchOptions", "TuneOptions"):
        assert getattr(dlpack, name) is getattr(options, name) and name in options.__all__


@pytest.mark.slow
def test_import_loads_no_heavy_or_posix_only_module() -> None:
    loaded = set(json.loads(_fresh_python("import json, sys, dlpack; print(json.dumps(sorted(sys.modules)))")))
    assert "dlpack" in loaded
    assert sorted(m for m in loaded if m in NOT_AT_IMPORT or m.split(".")[0] in NOT_AT_IMPORT) == []


@pytest.mark.slow
def test_first_use_loads_the_module_behind_a_name() -> None:
    code = (
        "import sys, dlpack; dlpack.Dataset; print('dlpack.read.dataset' in sys.modules, 'dlpack.bench' in sys.modules)"
    )
    assert _fresh_python(code).split() == ["True", "False"]


@pytest.mark.slow
def test_build_stays_the_function_when_its_package_is_imported_first() -> None:
    # dlpack.build lives in dlpack.building (the pipeline in dlpack.pack): importing them binds the
    # attributes "building" and "pack", never "build".
    code = (
        "import dlpack.pack, dlpack.building, dlpack; from dlpack.pack import BuildResult; "
        "print(callable(dlpack.build), dlpack.build is dlpack.building.build, dlpack.BuildResult is BuildResult)"
    )
    assert _fresh_python(code).split() == ["True", "True", "True"]


def test_an_unknown_keyword_is_an_option_error_with_close_matches(make_tree: Any, tmp_path: Path) -> None:
    """A misspelt option names itself and what it may have meant, not a dataclass TypeError."""
    src = make_tree({"a/0.png": "rgb", "a/1.png": "rgb"})
    with pytest.raises(
        dlpack.OptionError, match=r"build\(\) got an unknown keyword 'shard_byte'; did you mean 'shard_bytes'"
    ):
        dlpack.build(src, tmp_path / "o.zarr", shard_byte=2**16, quiet=True, jobs=1)
    assert not (tmp_path / "o.zarr").exists()
    store = dlpack.build(src, tmp_path / "o.zarr", quiet=True, jobs=1).path
    ds = dlpack.open(store)
    with pytest.raises(
        dlpack.OptionError, match=r"loader\(\) got an unknown keyword 'batch_sise'; did you mean 'batch_size'"
    ):
        ds.loader(batch_sise=2)
    with pytest.raises(dlpack.OptionError, match=r"did you mean 'split'"):
        ds.loader(splits="train")
    with pytest.raises(
        dlpack.OptionError, match=r"run_bench\(\) got an unknown keyword 'repaet'; did you mean 'repeat'"
    ):
        dlpack.run_bench([store], repaet=1)
    with pytest.raises(dlpack.OptionError, match=r"unknown keyword 'zzz' \(its keywords are BuildOptions fields\)$"):
        dlpack.build(src, tmp_path / "p.zarr", zzz=1)
    assert len(ds.loader(batch_size=2)) == 1  # a known keyword still works


@pytest.mark.slow
def test_tune_is_the_function_after_the_cli_imports_it() -> None:
    # It lives in dlpack.tuning, so importing that module never rebinds dlpack.tune to a module.
    code = (
        "import types, dlpack, dlpack.cli, dlpack.tuning; from dlpack.tuning import TuneResult, tune; "
        "print(isinstance(dlpack.tune, types.FunctionType), dlpack.tune is tune, dlpack.TuneResult is TuneResult)"
    )
    assert _fresh_python(code).split() == ["True", "True", "True"]


@pytest.mark.slow
def test_augment_stays_the_function_whichever_module_is_imported_first() -> None:
    # The variants live in dlpack.variants, so importing its modules never rebinds dlpack.augment.
    code = (
        "import inspect, types, dlpack.variants.workers, dlpack.read.views, dlpack; "
        "from dlpack.variants import AugmentResult, augment; print(isinstance(dlpack.augment, types.FunctionType), "
        "dlpack.augment is augment, dlpack.AugmentResult is AugmentResult, list(inspect.signature(dlpack.augment).parameters)[:3])"
    )
    assert _fresh_python(code).split() == ["True", "True", "True", "['store',", "'k',", "'config']"]


@pytest.mark.slow
def test_importing_dlpack_from_another_python_m_program_keeps_its_ctrl_c(tmp_path: Path) -> None:
    """Only the ``dlpack`` command installs dlpack's Ctrl-C handler; ``python -m mytrainer`` importing
    dlpack (argv[0] is ``-m`` while its package loads) keeps Python's own."""
    pkg = tmp_path / "mytrainer"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("import signal\nimport dlpack\nHANDLER = signal.getsignal(signal.SIGINT)\n")
    (pkg / "__main__.py").write_text(
        "import signal\nfrom mytrainer import HANDLER\nprint(HANDLER is signal.default_int_handler)\n"
    )
    root = str(Path(dlpack.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, str(tmp_path)])}
    out = subprocess.run([sys.executable, "-m", "mytrainer"], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True"
