"""What ``import dlpack`` costs, against ``import numpy`` alone (run by hand).

    python benchmarks/import_time.py --runs 10

Each statement runs ``--runs`` times, each time in a fresh interpreter (interleaved, so slow
phases of the machine hit every statement alike), timed with ``time.perf_counter`` around the
statement alone: the interpreter's own start-up is not in the figure. The figure is the median.
One untimed run first compiles and caches the bytecode. (``-X importtime`` would miss the
modules ``dlpack`` loads on first use: they are imported through ``importlib``, which it does
not instrument.)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

STATEMENTS = [
    "import numpy",
    "import dlpack",
    "import dlpack; dlpack.open",  # + the dataset, backends and loader (numpy)
    "import dlpack; dlpack.build",  # + the build (OpenCV, joblib)
]


def import_us(statement: str) -> int:
    """Wall time of ``statement`` in a fresh interpreter, in microseconds."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    code = f"import time\nt0 = time.perf_counter()\n{statement}\nprint(round((time.perf_counter() - t0) * 1e6))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    return int(proc.stdout.split()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10, help="fresh interpreters per statement (default 10)")
    ap.add_argument("--json", metavar="FILE", help="also write every run as JSON")
    a = ap.parse_args(argv)
    for statement in STATEMENTS:  # untimed: compile and cache the bytecode
        import_us(statement)
    runs: dict[str, list[int]] = {s: [] for s in STATEMENTS}
    for _ in range(a.runs):
        for statement in STATEMENTS:
            runs[statement].append(import_us(statement))
    print(f"Python {platform.python_version()} on {platform.machine()}, load average {os.getloadavg()[0]:.2f}")
    numpy_ms = statistics.median(runs["import numpy"]) / 1000
    for statement, us in runs.items():
        ms = statistics.median(us) / 1000
        print(
            f"{statement:<30} median {ms:7.1f} ms  ({ms / numpy_ms:.2f}x import numpy), runs {min(us) / 1000:.1f}-{max(us) / 1000:.1f} ms"
        )
    if a.json:
        Path(a.json).write_text(json.dumps({"runs_us": runs}, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
