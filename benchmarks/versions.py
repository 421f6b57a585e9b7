"""Two checkouts of dlpack side by side: build and loader images/s of each, interleaved (run by hand).

    git worktree add --detach /tmp/dlpack-before REV
    python benchmarks/versions.py --before /tmp/dlpack-before --after . --repeat 5 --json versions.json

Makes (once, in ``--work``) the built-in sample (``--count`` images of ``--image-size`` px). Each
repeat runs, for each checkout (the order swapped every repeat), in a fresh interpreter whose
``PYTHONPATH`` is that checkout: ``dlpack.build`` of the sample at ``--size`` into Zarr with jobs 1
and with jobs 2, then ``--epochs`` timed epochs of ``ds.loader(batch_size=64, order="random")``
after one untimed epoch. Prints medians and the after/before ratios; ``--json`` keeps every run.
Used to check that a refactoring leaves the build and loader figures within noise.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

BUILD = r"""
import shutil, sys, time, dlpack
out = sys.argv[2]
shutil.rmtree(out, ignore_errors=True)
t = time.perf_counter()
r = dlpack.build(sys.argv[1], out, size=(int(sys.argv[4]), int(sys.argv[4])), quiet=True, jobs=int(sys.argv[3]))
print(r.count / (time.perf_counter() - t))
"""

LOAD = r"""
import sys, time, dlpack
ds = dlpack.open(sys.argv[1])
loader = ds.loader(batch_size=64, order="random", seed=0)
for _ in loader:
    pass
n, t = 0, time.perf_counter()
for _ in range(int(sys.argv[2])):
    for b in loader:
        n += len(b["index"])
print(n / (time.perf_counter() - t))
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", required=True, help="a checkout of dlpack (the folder holding dlpack/)")
    p.add_argument("--after", required=True, help="another checkout")
    p.add_argument("--work", default="/tmp/dlpack-versions")
    p.add_argument("--count", type=int, default=480)
    p.add_argument("--image-size", type=int, default=512)
    p.add_argument("--size", type=int, default=256)
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    versions = {"before": str(Path(a.before).resolve()), "after": str(Path(a.after).resolve())}
    src = work / f"sample-{a.count}-{a.image_size}"
    env_after = {**os.environ, "PYTHONPATH": versions["after"]}
    if not src.exists():
        cmd = [sys.executable, "-m", "dlpack.sample", str(src), "--count", str(a.count), "--size", str(a.image_size)]
        subprocess.run(cmd, check=True, env=env_after, capture_output=True)
    runs: dict[str, list[float]] = {f"{k} {v}": [] for k in ("build j1", "build j2", "loader") for v in versions}

    def rate(code: str, *args: str, version: str) -> float:
        env = {**os.environ, "PYTHONPATH": versions[version]}
        done = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, check=True)
        return float(done.stdout.split()[-1])

    for rep in range(a.repeat):
        for v in list(versions) if rep % 2 == 0 else list(versions)[::-1]:
            store = str(work / f"{v}.zarr")
            for jobs in (1, 2):
                runs[f"build j{jobs} {v}"].append(rate(BUILD, str(src), store, str(jobs), str(a.size), version=v))
            runs[f"loader {v}"].append(rate(LOAD, store, str(a.epochs), version=v))
        print(f"repeat {rep + 1}: " + ", ".join(f"{k} {r[-1]:,.1f}" for k, r in runs.items()), flush=True)
    med = {k: statistics.median(r) for k, r in runs.items()}
    ratios = {k: med[f"{k} after"] / med[f"{k} before"] for k in ("build j1", "build j2", "loader")}
    print(f"\n{'images/s (medians)':<12} {'before':>10} {'after':>10} {'after/before':>13}")
    for k, r in ratios.items():
        print(f"{k:<12} {med[k + ' before']:>10,.1f} {med[k + ' after']:>10,.1f} {r:>12.2f}x")
    if a.json:
        doc = {"settings": vars(a), "versions": versions, "runs": runs, "medians": med, "ratios": ratios}
        Path(a.json).write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
