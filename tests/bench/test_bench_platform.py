"""``dlpack.bench`` imports everywhere: no matplotlib until a plot, POSIX-only modules only where used."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import dlpack
import dlpack.bench
from dlpack.bench import pagecache, run_bench

#: Modules missing on Windows (or, for ctypes and mmap, used here only for POSIX calls).
POSIX_ONLY = {"resource", "fcntl", "termios", "ctypes", "mmap"}


@pytest.mark.slow
def test_importing_the_bench_needs_neither_matplotlib_nor_posix_modules() -> None:
    """As on Windows: ``resource`` and ``fcntl`` cannot be imported, and matplotlib stays unloaded."""
    code = (
        "import json, sys\n"
        "sys.modules.update(resource=None, fcntl=None)\n"
        "import dlpack.bench\n"
        "from dlpack.bench.measure import _peak_rss_mb\n"
        "print(json.dumps({'loaded': sorted(m for m in sys.modules if m.split('.')[0] == 'matplotlib'),\n"
        "                  'rss': _peak_rss_mb(False), 'run_bench': dlpack.bench.run_bench.__module__}))\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(Path(dlpack.__file__).parent.parent), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["loaded"] == []
    assert result["rss"] is None  # no getrusage: peak RSS is unknown, not an error
    assert result["run_bench"] == "dlpack.bench.run"


def test_bench_modules_import_posix_only_modules_inside_functions() -> None:
    package = Path(dlpack.bench.__file__).parent
    offenders = []
    for path in sorted(package.glob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] in POSIX_ONLY | {"matplotlib"}]
    assert offenders == []


def test_without_fadvise_and_mincore_cold_runs_are_reported_unsupported(
    make_tree: Callable[..., Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What Windows sees: the run completes, and the table and notes say that cold was not cold."""
    src = make_tree({f"a/{i}.png": "rgb" for i in range(8)})
    store = tmp_path / "s.h5"
    dlpack.build(src, store, size=(16, 12), jobs=1, quiet=True)
    monkeypatch.delattr(os, "posix_fadvise", raising=False)
    monkeypatch.setattr(pagecache, "libc", lambda: None)
    report = run_bench([store], caches="cold", orders="sequential", samples=4, batch_size=4, repeat=1, quiet=True)
    (cell,) = report.cells
    assert cell.evicted is False and cell.eviction_verified is False and cell.resident_at_start is None
    assert cell.images >= 4
    table = report.table()
    assert any(line.split()[:3] == ["s.h5", "sequential", "cold*"] for line in table.splitlines())
    assert "cold* = eviction not verified" in table and "not supported on this platform" in table
    assert any("NOT cold" in n and "not supported on this platform" in n for n in report.notes)
