"""Packaging: every imported third-party module is declared, every extra is used, the lowest-versions pins
match the bounds, and the licence the metadata declares ships with its text."""

from __future__ import annotations

import ast
import hashlib
import re
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "dlpack"
CONSTRAINTS = ROOT / ".ci" / "constraints-min.txt"

# Import names whose distribution is named differently; any other import is its own distribution name.
DISTRIBUTION_OF = {
    "cv2": "opencv-python-headless",
    "google_crc32c": "google-crc32c",
    "halcon": "mvtec-halcon",
    "yaml": "pyyaml",
}
#: SHA-256 of the Apache License 2.0 text exactly as the ASF publishes it (LICENSE-2.0.txt, 202 lines).
APACHE_2_SHA256 = "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _split(requirement: str) -> tuple[str, str]:
    """``"zarr>=3.1.6,<4"`` -> ``("zarr", ">=3.1.6,<4")``; extras and markers dropped."""
    m = re.match(r"\s*([A-Za-z0-9_.-]+)\s*(\[[^\]]*\])?\s*([^;]*)", requirement)
    assert m is not None, requirement
    return _norm(m.group(1)), m.group(3).strip()


def _project() -> dict[str, object]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        project: dict[str, object] = tomllib.load(f)["project"]
    return project


def _core() -> dict[str, str]:
    deps = _project()["dependencies"]
    assert isinstance(deps, list)
    return dict(_split(r) for r in deps)


def _declared() -> set[str]:
    optional = _project()["optional-dependencies"]
    assert isinstance(optional, dict)
    names = set(_core())
    for reqs in optional.values():
        names |= {_split(r)[0] for r in reqs}
    return names


def _third_party_imports() -> dict[str, str]:
    """Top-level name of every non-stdlib, non-dlpack module imported in dlpack/ -> one file importing it."""
    found: dict[str, str] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top != "dlpack" and top not in sys.stdlib_module_names:
                    found.setdefault(top, str(path.relative_to(ROOT)))
    return found


def test_the_import_scan_sees_the_known_dependencies() -> None:
    assert {"numpy", "cv2", "zarr", "h5py", "google_crc32c", "numcodecs", "joblib", "tqdm"} <= set(
        _third_party_imports()
    )


def test_every_imported_third_party_module_is_declared() -> None:
    declared = _declared()
    undeclared = {
        module: where
        for module, where in _third_party_imports().items()
        if _norm(DISTRIBUTION_OF.get(module, module)) not in declared
    }
    assert undeclared == {}


def test_constraints_min_pins_every_core_dependency_at_its_lower_bound() -> None:
    pins = {}
    for line in CONSTRAINTS.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, spec = _split(line)
            assert spec.startswith("=="), line
            pins[name] = spec[2:]
    bounds = {}
    for name, spec in _core().items():
        lower = [part[2:].strip() for part in spec.split(",") if part.strip().startswith(">=")]
        assert len(lower) == 1, f"{name} needs one lower bound (>=), got {spec!r}"
        bounds[name] = lower[0]
    assert set(pins) == set(bounds)
    # "numpy>=2.0" is pinned as 2.0.0: compare release numbers padded with zeros.
    pad = lambda v: tuple(int(x) for x in v.split(".")) + (0,) * (4 - len(v.split(".")))  # noqa: E731
    assert {n: pad(v) for n, v in pins.items()} == {n: pad(v) for n, v in bounds.items()}


def test_every_extra_installs_something_dlpack_imports() -> None:
    optional = _project()["optional-dependencies"]
    assert isinstance(optional, dict)
    imported = {_norm(DISTRIBUTION_OF.get(module, module)) for module in _third_party_imports()}
    unused = {
        extra: reqs
        for extra, reqs in optional.items()
        if extra != "test" and not {_split(r)[0] for r in reqs} & imported
    }
    assert unused == {}


def test_the_declared_licence_ships_with_its_full_text() -> None:
    project = _project()
    assert project["license"] == "Apache-2.0"
    # license-files is what setuptools puts in the wheel (.dist-info/licenses/) and the sdist.
    assert project["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_bytes()
    assert text.startswith(b"\n                                 Apache License\n")
    assert hashlib.sha256(text).hexdigest() == APACHE_2_SHA256


def test_the_readme_says_how_to_install_every_extra() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    m = re.search(r"^## Install\n(.*?)^## ", readme, re.S | re.M)
    assert m is not None, "README.md has no '## Install' section"
    section = m.group(1)
    assert "pip install dlpack-datasets " in section
    optional = _project()["optional-dependencies"]
    assert isinstance(optional, dict)
    for extra in optional:
        if extra != "test":
            assert f'pip install "dlpack-datasets[{extra}]"' in section, extra
    assert "download.pytorch.org/whl/cpu" in section and "CUDA" in section  # the CPU wheel goes first
    assert "python -m dlpack.sample" in section
