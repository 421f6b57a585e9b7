r"""Benchmark ``dlpack build``: the whole command's CPU and wall time against a bare decode + resize loop.

Run by hand (not part of the tests)::

    python benchmarks/build.py --shape seed --repeat 3 --formats zarr --max-other 0.3 --json build-seed.json
    python benchmarks/build.py --shape small --repeat 3 --formats zarr --max-other 0.3 --json build-small.json
    python benchmarks/build.py --shape seed --cpus 1 --jobs 1 --formats zarr     # pinned to one core
    python benchmarks/build.py --shape seed --breakdown --formats zarr            # where the CPU goes

Shapes: ``seed`` (default) is 600 scattered images of about 1024x1024 (``make_sample``: PNG, JPEG,
TIFF, BMP in nested class folders) packed at 512x512; ``small`` is 2,000 PNGs of 300x300
(``_images.make_pngs``) packed at 256x256, where start-up weighs most. ``--count``,
``--image-size`` and ``--size`` override a shape's figures; ``--images DIR`` packs a real folder.

Each repeat runs every variant once, the order rotated each repeat, medians over the repeats:

- ``bare``: read the bytes, ``cv2.imdecode(IMREAD_UNCHANGED)``, ``cv2.resize(INTER_AREA)``, keep
  nothing; OpenCV on one thread (``cv2.setNumThreads(1)``), in this process.
- ``zarr-j1``, ``zarr-j2``, ...: the WHOLE command as a user runs it, ``python -m dlpack build SRC
  OUT --jobs J`` in a new process (interpreter start, imports, worker start-up, scan, probe,
  decode, write, commit). Its CPU is that of the process and all its descendants (a wrapper
  process that is their child subreaper waits for every one and reads ``RUSAGE_CHILDREN``); its
  wall time ends when the command exits. Bytecode is cached as in an installed package (the
  command runs without ``PYTHONDONTWRITEBYTECODE``; an untimed run first writes the caches).
- ``zarr-j1-warm``, ...: ``dlpack.build`` called in this process with the worker pool already
  started (the figure of earlier rounds: no start-up, no imports).

Reported per variant: CPU seconds, CPU over the bare loop's CPU, and for a build with ``--jobs N``
the efficiency ``(bare CPU / N) / wall``: 1.0 is the bare loop spread over N cores with nothing
lost. ``--cpus N`` pins this process, the bare loop and every build to N cores
(``os.sched_setaffinity``), so the scaling to fewer cores than the machine has is visible.

Other processes on the machine distort wall times (CPU seconds hardly): every run records the
share of the CPUs others used meanwhile (/proc/stat minus this process tree), and ``--max-other
0.3`` re-runs a repeat in which it was exceeded.

``--breakdown`` measures the parts of the whole command alone on the same files, each as the build
runs it (interpreter and imports, worker start-up, scan and probe, dlpack's decode path and its
hashes, pixel statistics, pickling of results, the in-order digest, writes and syncs), and prints
them beside the whole command's CPU.

Other modes: ``--cli`` times the whole command only, per job count (``--code OLD,NEW`` compares
source trees); ``--rss 100000,1000000`` measures the peak memory of command-line builds of that
many tiny images, and with ``--rss-records`` the memory of the build's per-image records alone::

    python benchmarks/build.py --cli --images DIR --size 256x256 --repeat 5
    python benchmarks/build.py --cli --images DIR --size 256x256 --repeat 3 --code OLD_TREE,NEW_TREE
    python benchmarks/build.py --rss 10000,100000 --jobs 1,2
    python benchmarks/build.py --rss 100000,1000000 --rss-records
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np

import dlpack
from dlpack.options import BuildOptions, parse_size
from dlpack.sources.folder import FolderSource

sys.path.insert(0, str(Path(__file__).parent))
from _cpu import busy_cpu_s as _busy_cpu_s  # noqa: E402
from _cpu import own_cpu_s as _own_cpu_s  # noqa: E402

TARGET_SPEEDUP = 1.7
TARGET_OVERHEAD = 0.15
TARGET_EFFICIENCY = 0.85


@dataclass(frozen=True)
class Variant:
    """One timed thing: the bare loop, or a build with a format and a job count."""

    name: str
    fmt: str | None = None
    jobs: int | None = None
    whole: bool = True  # the whole command in a new process; False: dlpack.build here, pool warm


#: Generated image sets: (generator, image count, image side, target size).
SHAPES: dict[str, tuple[str, int, int, str]] = {
    "seed": ("sample", 600, 1024, "512x512"),
    "small": ("pngs", 2000, 300, "256x256"),
}


# ---------------------------------------------------------------- machine


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _ram_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def _version(module: str) -> str:
    try:
        mod = __import__(module)
    except ImportError:
        return "not installed"
    return str(getattr(mod, "__version__", "?"))


def _source_digest() -> str:
    """sha256 of dlpack's .py files: ties figures to the exact code measured (the tree may be uncommitted)."""
    root = Path(dlpack.__file__).parent
    h = hashlib.sha256()
    for p in sorted(root.rglob("*.py")):
        h.update(p.relative_to(root).as_posix().encode() + b"\0" + p.read_bytes())
    return h.hexdigest()[:16]


def machine_info(workdir: Path) -> dict[str, Any]:
    """CPU, cores, RAM, OS and library versions: what a reader needs to compare figures."""
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "cores_usable": affinity,
        "ram_gib": _ram_gib(),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "numpy": np.__version__,
        "cv2": cv2.__version__,
        "cv2_threads": cv2.getNumThreads(),
        "zarr": _version("zarr"),
        "h5py": _version("h5py"),
        "joblib": _version("joblib"),
        "dlpack": dlpack.__version__,
        "dlpack_source_sha256": _source_digest(),
        "workdir": str(workdir),
        "loadavg_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


# ---------------------------------------------------------------- the bare loop


def _target_size(h: int, w: int, opts: BuildOptions) -> tuple[int, int]:
    """(width, height) the bare loop resizes to: the image part of what dlpack stores, no padding."""
    mode = opts.resize_mode
    if mode == "stretch" and opts.size is not None:
        return opts.size
    if mode == "fit":
        side = opts.max_side or 0
        box_w, box_h = opts.size if opts.size is not None else (side, side)
        s = min(1.0, box_w / w, box_h / h)
        return min(box_w, max(1, round(w * s))), min(box_h, max(1, round(h * s)))
    if opts.max_side is not None and max(h, w) > opts.max_side:
        s = opts.max_side / max(h, w)
        return max(1, round(w * s)), max(1, round(h * s))
    return w, h


def bare_loop(paths: list[str], opts: BuildOptions) -> int:
    """Read, decode and resize every file, OpenCV on one thread; return how many were decoded."""
    threads = cv2.getNumThreads()
    cv2.setNumThreads(1)
    try:
        return _bare(paths, opts)
    finally:
        cv2.setNumThreads(threads)  # the in-process builds run with OpenCV's own setting


def _bare(paths: list[str], opts: BuildOptions) -> int:
    n = 0
    for p in paths:
        with open(p, "rb") as f:
            data = f.read()
        img = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
        if img is None:
            continue
        h, w = img.shape[:2]
        tw, th = _target_size(h, w, opts)
        if (tw, th) != (w, h):
            img = cv2.resize(img, (tw, th), interpolation=cv2.INTER_AREA)
        n += 1
    return n


# ---------------------------------------------------------------- runs


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()


def _timed(fn: Callable[[], int]) -> dict[str, Any]:
    """Time ``fn``; also measure how much CPU other processes on the machine took meanwhile."""
    b0, o0 = _busy_cpu_s(), _own_cpu_s()
    c0, t0 = time.process_time(), time.perf_counter()
    n = fn()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    b1, o1 = _busy_cpu_s(), _own_cpu_s()
    r: dict[str, Any] = {"seconds": wall, "cpu_seconds": cpu, "images": n}
    if b0 is not None and b1 is not None:
        own = o1 - o0
        other = max(0.0, (b1 - b0) - own)
        r["own_cpu_seconds"] = own  # this process and its workers
        r["other_cpu_share"] = other / (wall * (os.cpu_count() or 1))  # share of the machine others used
    return r


#: Runs a command as its child subreaper (Linux): every process the command starts (its workers,
#: loky's resource tracker) is waited for, so ``RUSAGE_CHILDREN`` holds the CPU of all of them.
#: Prints ``wall_seconds cpu_seconds``; the wall time ends when the command itself exits.
WHOLE_SCRIPT = r"""
import ctypes, os, resource, subprocess, sys, time
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
t0 = time.perf_counter()
rc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL).returncode
wall = time.perf_counter() - t0
while True:
    try:
        os.waitpid(-1, 0)
    except ChildProcessError:
        break
r = resource.getrusage(resource.RUSAGE_CHILDREN)
print(wall, r.ru_utime + r.ru_stime)
sys.exit(rc)
"""


def _command_env() -> dict[str, str]:
    """The environment of a timed command: bytecode cached, as an installed package's is."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def whole_command(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the command and all its descendants) of one run of ``cmd``."""
    import subprocess

    r = subprocess.run([sys.executable, "-c", WHOLE_SCRIPT, *cmd], capture_output=True, text=True,
                       env=env or _command_env())  # fmt: skip
    if r.returncode not in (0, 1):  # 1: finished with skipped inputs
        raise SystemExit(f"{' '.join(cmd)} failed with exit status {r.returncode}:\n{r.stderr[-2000:]}")
    wall, cpu = r.stdout.split()[-2:]
    return float(wall), float(cpu)


def build_command(src: Path, out: Path, opts: BuildOptions, jobs: int) -> list[str]:
    """``python -m dlpack build`` with the benchmark's options, as a user types it."""
    cmd = [sys.executable, "-m", "dlpack", "build", str(src), str(out), "--jobs", str(jobs), "--force-jobs"]
    if opts.size is not None:
        cmd += ["--size", f"{opts.size[0]}x{opts.size[1]}"]
    if opts.max_side is not None:
        cmd += ["--max-side", str(opts.max_side)]
    if opts.resize is not None:
        cmd += ["--resize", opts.resize]
    return cmd + ["--on-error", "skip", "--quiet", "--overwrite"]


def run_variant(
    v: Variant, src: Path, paths: list[str], opts: BuildOptions, outdir: Path, count: int
) -> dict[str, Any]:
    """Time one variant once; a build's rate counts the images it packed (``count`` for the whole command)."""
    if v.fmt is None:
        r = _timed(lambda: bare_loop(paths, opts))
        r["own_cpu_seconds"] = r["cpu_seconds"]  # one thread of this process: process_time's resolution
        return r
    out = outdir / f"bench-j{v.jobs}.{'zarr' if v.fmt == 'zarr' else 'h5'}"
    _remove(out)  # deleting the old store is not part of a build
    if v.whole:
        got: list[tuple[float, float]] = []
        r = _timed(lambda: got.append(whole_command(build_command(src, out, opts, v.jobs or 1))) or count)
        r["seconds"], r["cpu_seconds"] = got[0]
        r["own_cpu_seconds"] = got[0][1]  # the command's process tree, not this process's
        r["output_bytes"] = sum(f.stat().st_size for f in out.rglob("*") if f.is_file()) if out.is_dir() else (
            out.stat().st_size if out.exists() else 0)  # fmt: skip
        _remove(out)
        return r
    result: list[dlpack.BuildResult] = []

    def go() -> int:
        result.append(dlpack.build(src, out, opts, jobs=v.jobs, overwrite=True, quiet=True))
        return result[0].count

    r = _timed(go)
    r.update(skipped=len(result[0].skipped), output_bytes=result[0].output_bytes)
    return r


def _median_rate(runs: list[dict[str, Any]]) -> float:
    return float(statistics.median(r["images"] / r["seconds"] for r in runs))


def _median_cpu_per_image(runs: list[dict[str, Any]]) -> float | None:
    vals = [r["own_cpu_seconds"] / r["images"] for r in runs if "own_cpu_seconds" in r and r["images"]]
    return float(statistics.median(vals)) if vals else None


def _median_cpu(runs: list[dict[str, Any]]) -> float | None:
    vals = [r["own_cpu_seconds"] for r in runs if "own_cpu_seconds" in r]
    return float(statistics.median(vals)) if vals else None


def summarise(variants: list[Variant], runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Medians per variant, and per build: CPU over the bare loop's and the efficiency on its cores.

    Efficiency of ``--jobs N`` = (bare CPU / N) / wall: the bare loop's work spread over N cores
    with nothing lost is 1.0. CPU ratios are per image (every variant handles the same images)."""
    rates = {v.name: _median_rate(runs[v.name]) for v in variants}
    out: dict[str, Any] = {"images_per_s": rates, "ratios": {}, "median_seconds": {}, "median_cpu_seconds": {}}
    for v in variants:
        out["median_seconds"][v.name] = float(statistics.median(r["seconds"] for r in runs[v.name]))
        out["median_cpu_seconds"][v.name] = _median_cpu(runs[v.name])
    bare = rates["bare"]
    bare_cpu = _median_cpu_per_image(runs["bare"])
    for v in variants:
        if v.fmt is None:
            continue
        r: dict[str, Any] = {"wall_over_bare": bare / rates[v.name]}
        cpu = _median_cpu_per_image(runs[v.name])
        if cpu is not None and bare_cpu:  # a tiny run can measure 0 CPU seconds
            r["cpu_over_bare"] = cpu / bare_cpu
            r["cpu_met"] = cpu / bare_cpu <= 1 + TARGET_OVERHEAD
            # images/s of the bare loop's CPU alone spread over N cores, against the build's.
            r["efficiency"] = rates[v.name] * bare_cpu / (v.jobs or 1)
            r["efficiency_met"] = r["efficiency"] >= TARGET_EFFICIENCY
        out["ratios"][v.name] = r
    for fmt in sorted({v.fmt for v in variants if v.fmt}):
        j1, j2 = rates.get(f"{fmt}-j1"), rates.get(f"{fmt}-j2")
        if j1 and j2:
            out["ratios"][f"{fmt}-j2"]["jobs2_over_jobs1"] = j2 / j1
    return out


def print_table(variants: list[Variant], runs: dict[str, list[dict[str, Any]]], summary: dict[str, Any]) -> None:
    rows = [("variant", "median s", "CPU s", "CPU/bare", "efficiency", "img/s", "runs (s)", "others' CPU share")]
    for v in variants:
        rs = runs[v.name]
        ratio = summary["ratios"].get(v.name, {})
        cpu = summary["median_cpu_seconds"][v.name]
        rows.append(
            (
                v.name,
                f"{summary['median_seconds'][v.name]:.2f}",
                f"{cpu:.2f}" if cpu is not None else "-",
                f"{ratio['cpu_over_bare']:.2f}x" if "cpu_over_bare" in ratio else "-",
                f"{ratio['efficiency']:.2f}" if "efficiency" in ratio else "-",
                f"{summary['images_per_s'][v.name]:.1f}",
                " ".join(f"{r['seconds']:.2f}" for r in rs),
                " ".join(f"{100 * r['other_cpu_share']:.0f}%" for r in rs if "other_cpu_share" in r) or "-",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for k, r in enumerate(rows):
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))))
        if k == 0:
            print("  ".join("-" * w for w in widths))
    print()
    print(
        f"targets: whole command CPU/bare <= {1 + TARGET_OVERHEAD:.2f}x; efficiency = (bare CPU / jobs) / wall "
        f">= {TARGET_EFFICIENCY}"
    )
    for v in variants:
        r = summary["ratios"].get(v.name, {})
        if v.whole and "cpu_over_bare" in r:
            print(
                f"  {v.name}: CPU {r['cpu_over_bare']:.2f}x bare ({'met' if r['cpu_met'] else 'NOT met'}), "
                f"efficiency {r['efficiency']:.2f} ({'met' if r['efficiency_met'] else 'NOT met'})"
                + (f", jobs 2 / jobs 1 {r['jobs2_over_jobs1']:.2f}x" if "jobs2_over_jobs1" in r else "")
            )


# ---------------------------------------------------------------- the whole command (--cli)


def cli_mode(
    src: Path, size: str, jobs: list[int], repeat: int, workdir: Path, code: list[Path] | None = None
) -> dict[str, Any]:
    """``python -m dlpack build SRC OUT --size S --jobs J`` as a user runs it (interpreter start,
    scan, probe, worker start-up, pack, publish), the job counts interleaved, rotated each repeat.

    ``code``: source trees of dlpack to compare (each run's ``PYTHONPATH``), interleaved with the
    job counts in one run, so that two versions see the same load. Each run also reports the CPU
    seconds per image of the build process and all its descendants, which load distorts far less
    than the wall time."""
    count = len(FolderSource(src).scan().items)
    trees: list[Path | None] = list(code) if code else [None]
    arms = [(c, j) for c in range(len(trees)) for j in jobs]
    name = {arm: (f"c{arm[0]}-" if code else "") + f"j{arm[1]}" for arm in arms}
    runs: dict[str, list[dict[str, Any]]] = {name[arm]: [] for arm in arms}
    for r in range(repeat):
        for c, j in arms[r % len(arms) :] + arms[: r % len(arms)]:
            out = workdir / f"bench-cli-j{j}.zarr"
            _remove(out)
            cmd = [sys.executable, "-m", "dlpack", "build", str(src), str(out), "--size", size, "--jobs", str(j)]
            cmd += ["--force-jobs", "--quiet"]
            tree = trees[c]
            env = _command_env() if tree is None else {**_command_env(), "PYTHONPATH": str(tree)}
            if r == 0:  # untimed: the tree's bytecode caches are written, the files are in the page cache
                whole_command(cmd, env)
                _remove(out)
            got: list[tuple[float, float]] = []
            t = _timed(lambda cmd=cmd, env=env, got=got: got.append(whole_command(cmd, env)) or 1)
            # The command's own wall time and the CPU of its whole process tree (whole_command).
            t["seconds"], t["own_cpu_seconds"] = got[0]
            t["images"] = count
            load = os.getloadavg()[0]
            t["load_average"] = load
            runs[name[(c, j)]].append(t)
            share = t.get("other_cpu_share")
            own = t.get("own_cpu_seconds")
            print(
                f"  repeat {r + 1}: {'' if tree is None else f'{tree} '}jobs {j}: {t['seconds']:.2f} s"
                + (f", {1e3 * own / count:.2f} ms CPU/image" if own is not None else "")
                + (f" (others used {100 * share:.0f} % of the CPUs" if share is not None else " (")
                + f", load average {load:.2f})",
                file=sys.stderr,
            )
            _remove(out)
    med = {k: statistics.median(x["seconds"] for x in v) for k, v in runs.items()}
    cpu = {
        k: statistics.median(x["own_cpu_seconds"] / count for x in v)
        for k, v in runs.items()
        if all("own_cpu_seconds" in x for x in v)
    }
    for c, tree in enumerate(trees):
        pre = f"c{c}-" if code else ""
        print(
            (f"{tree}: " if tree is not None else "")
            + "  ".join(
                f"jobs {j}: median {med[pre + f'j{j}']:.2f} s"
                + (f" ({1e3 * cpu[pre + f'j{j}']:.2f} ms CPU/image)" if pre + f"j{j}" in cpu else "")
                for j in jobs
            )
        )
        if pre + "j1" in med and pre + "j2" in med:
            print(f"  jobs 2 / jobs 1: {med[pre + 'j1'] / med[pre + 'j2']:.2f}x (target >= {TARGET_SPEEDUP}x)")
    return {
        "runs": runs,
        "median_seconds": med,
        "median_cpu_seconds_per_image": cpu,
        "code": [str(t) for t in trees if t is not None],
    }


# ---------------------------------------------------------------- where the CPU goes (--breakdown)


#: What every process of a build imports before its work: the command line's modules.
IMPORTS_SCRIPT = "import dlpack.cli"
#: The build process's imports with the pool's: the base that worker start-up is measured against.
POOL_BASE_SCRIPT = "import joblib; import dlpack.cli; from dlpack.pack.workers import preload; preload()"
#: The same, then a pool of N workers started as a build starts it (spawn, imports, ``preload``).
POOL_SCRIPT = (
    POOL_BASE_SCRIPT
    + "; from dlpack import _parallel; _parallel.warm_pool({n}, preload); _parallel.wait_for_warm_pool()"
)


def _cpu_of(fn: Callable[[], Any]) -> tuple[float, Any]:
    c0 = time.process_time()
    out = fn()
    return time.process_time() - c0, out


def _sha256_cpu(paths: list[str]) -> float:
    """CPU seconds of hashing the files' bytes alone (read outside the timed part)."""
    data = [Path(p).read_bytes() for p in paths]
    return _cpu_of(lambda: [hashlib.sha256(d).hexdigest() for d in data])[0]


def breakdown_mode(src: Path, opts: BuildOptions, jobs: list[int], workdir: Path) -> dict[str, Any]:
    """The parts of the whole command, each measured alone on the same files as the build runs it
    (CPU seconds), beside the whole command's CPU for each job count; the rest is what no part
    accounts for (Python between the parts, the writer's own work, the commit)."""
    import pickle

    from dlpack.pack.inputs import probe_stage, probed, scan_stage
    from dlpack.pack.plan import plan_stage
    from dlpack.pack.workers import block_counts, decode_block, fixed_block, jobs_of
    from dlpack.sources.base import files_of

    py = [sys.executable, "-c"]
    parts: dict[str, float] = {}
    # Imports first in every process: the bytecode caches are written before the timed runs.
    whole_command([*py, POOL_BASE_SCRIPT])
    parts["interpreter start + CLI imports (one process)"] = whole_command([*py, IMPORTS_SCRIPT])[1]
    base = whole_command([*py, POOL_BASE_SCRIPT])[1]
    for n in sorted({j for j in jobs if j > 1}):
        parts[f"worker start-up, {n} workers (spawn, imports, preload)"] = max(
            0.0, whole_command([*py, POOL_SCRIPT.format(n=n)])[1] - base
        )
    source = FolderSource(src)

    def scan_probe() -> Any:
        scan = scan_stage(source)
        files = files_of(source)
        probes = probe_stage(files, scan.items, max_pixels=opts.max_pixels, n_jobs=1, quiet=True)
        plan, sel = plan_stage(scan, probes, probed(scan, probes), opts, "zarr", str(src))
        return scan, files, probes, plan, sel

    parts["scan + probe + plan"], (scan, files, probes, plan, sel) = _cpu_of(scan_probe)
    pairs = jobs_of(scan.items, probes, sel.keep)
    paths = [os.path.join(src, rel) for rel, _, _ in pairs]
    bare_loop(paths, opts)  # page cache warm
    parts["bare loop (decode + resize, one thread)"] = _cpu_of(lambda: bare_loop(paths, opts))[0]
    parts["  source SHA-256 alone"] = _sha256_cpu(paths)
    step = 64
    acc = dict.fromkeys(("decode", "crc", "stats", "pickle", "digest", "write", "fsync"), 0.0)
    digest = hashlib.sha256()
    sink = workdir / "breakdown-store.bin"
    import zlib

    from dlpack import _parallel

    # OpenCV on one thread, as the build decodes and counts (dlpack._parallel.opencv_threads).
    with _parallel.opencv_threads(True), open(sink, "wb") as f:
        for s in range(0, len(pairs), step):
            block = fixed_block(plan, min(step, len(pairs) - s))
            dt, res = _cpu_of(lambda block=block, s=s: decode_block(files, plan, pairs[s : s + step], out=block))
            acc["decode"] += dt
            acc["crc"] += _cpu_of(lambda block=block: [zlib.crc32(row.data) for row in block])[0]
            acc["stats"] += _cpu_of(lambda block=block: block_counts(plan, block))[0]
            acc["pickle"] += _cpu_of(lambda res=res: pickle.loads(pickle.dumps(res, pickle.HIGHEST_PROTOCOL)))[0]
            acc["digest"] += _cpu_of(lambda block=block: digest.update(block.data))[0]
            acc["write"] += _cpu_of(lambda block=block: f.write(block.data))[0]
        acc["write"] += _cpu_of(f.flush)[0]
        acc["fsync"] = _cpu_of(lambda: os.fsync(f.fileno()))[0]
    written = sink.stat().st_size
    sink.unlink()
    parts["dlpack's decode path (read, decode, resize, to RGB, CRC-32, source SHA-256)"] = acc["decode"]
    parts["  pixel CRC-32 alone"] = acc["crc"]
    parts["pixel statistics (per-channel moments per block)"] = acc["stats"]
    parts["pickling a block's results (dumps + loads)"] = acc["pickle"]
    parts["in-order digest (SHA-256 of the stored pixels)"] = acc["digest"]
    parts[f"write of the pixels into the page cache ({written / 1e6:.0f} MB)"] = acc["write"]
    # The build does not sync its shards (the kernel writes them back later, in its own threads).
    parts["  fsync of those pixels alone"] = acc["fsync"]
    whole: dict[str, float] = {}
    for j in jobs:
        out = workdir / f"bench-breakdown-j{j}.zarr"
        whole[f"jobs {j}"] = whole_command(build_command(src, out, opts, j))[1]
        _remove(out)
    bare = parts["bare loop (decode + resize, one thread)"]
    counted = [k for k in parts if not k.startswith("  ") and not k.startswith("bare")]
    print(f"{len(pairs)} images of {src}; CPU seconds, each part alone (one run each):")
    width = max(len(k) for k in [*parts, *whole]) + 2
    for k, v in parts.items():
        print(f"  {k:<{width}} {v:7.2f} s  {100 * v / bare:6.1f} % of the bare loop")
    rest: dict[str, float] = {}
    for name, cpu in whole.items():
        n = int(name.split()[1])
        used = [k for k in counted if not k.startswith("worker") or k.startswith(f"worker start-up, {n} ")]
        if n == 1:  # no workers: nothing pickled
            used = [k for k in used if not k.startswith(("worker", "pickling"))]
        # the decode path stands for the bare loop's work plus its own extras
        rest[name] = cpu - sum(parts[k] for k in used)
        print(f"  whole command, {name:<{width - 15}} {cpu:7.2f} s  {cpu / bare:6.2f}x the bare loop; "
              f"not in the parts above: {rest[name]:+.2f} s")  # fmt: skip
    return {"images": len(pairs), "parts_cpu_seconds": parts, "whole_cpu_seconds": whole,
            "rest_cpu_seconds": rest, "pixels_bytes": written}  # fmt: skip


# ---------------------------------------------------------------- peak memory (--rss)


def tiny_tree(root: Path, count: int, side: int = 16) -> Path:
    """``count`` files of one ``side`` x ``side`` PNG in 4 class folders (1,000 per sub-folder),
    made as hard links (to one original per 60,000): a million files cost directory entries, not a
    million writes."""
    marker = root / f".complete-{count}"
    if marker.exists():
        return root
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    rng = np.random.default_rng(0)
    png = cv2.imencode(".png", rng.integers(0, 256, (side, side, 3), dtype=np.uint8))[1].tobytes()
    one = root / "one.png"
    for i in range(count):
        if i % 60000 == 0:  # a new original before a file system's link limit (ext4: 65,000)
            one = root / f"one-{i // 60000}.png"
            one.write_bytes(png)
        d = root / "data" / f"c{i % 4}" / f"{i // 4000:04d}"
        if i % 4000 < 4:
            d.mkdir(parents=True, exist_ok=True)
        os.link(one, d / f"{i:07d}.png")
    marker.touch()
    return root


def _child_rss_kib(pid: int) -> int:
    """RSS (KiB) of the first child of process ``pid`` now (the build under the wrapper), 0 if none."""
    try:
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        for line in Path(f"/proc/{kids[0]}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (OSError, IndexError, ValueError):
        pass
    return 0


def _tree_rss_kib(pid: int) -> int:
    """RSS (KiB) of process ``pid`` and all its descendants now (from /proc)."""
    kids: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            p = int(stat.parent.name)
        except (OSError, IndexError, ValueError):
            continue
        kids.setdefault(int(fields[1]), []).append(p)
        rss[p] = int(fields[21]) * (os.sysconf("SC_PAGE_SIZE") // 1024)
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        total += rss.get(p, 0)
        todo.extend(kids.get(p, []))
    return total


def rss_run(src: Path, out: Path, jobs: int, side: int) -> dict[str, Any]:
    """One command-line build of ``src``: wall time, the peak RSS of its largest process
    (``getrusage`` of the waited-for children) and the peak summed RSS of the process tree
    (parent + workers, sampled every 20 ms)."""
    import subprocess
    import threading

    _remove(out)
    wrapper = (
        "import resource, subprocess, sys; r = subprocess.run(sys.argv[1:]); "
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(r.returncode)"
    )
    cmd = [sys.executable, "-c", wrapper, sys.executable, "-m", "dlpack", "build", str(src / "data"), str(out)]
    cmd += ["--size", f"{side}x{side}", "--jobs", str(jobs), "--force-jobs", "--quiet", "--overwrite"]
    peak = [0]
    per_second: dict[int, int] = {}  # the build process's largest RSS in each second of the build
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.02):
            peak[0] = max(peak[0], _tree_rss_kib(proc.pid))
            second = int(time.perf_counter() - t0)
            per_second[second] = max(per_second.get(second, 0), _child_rss_kib(proc.pid))

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    stdout, _ = proc.communicate()
    done.set()
    th.join()
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"build of {src} failed with exit status {proc.returncode}")
    largest = int(stdout.strip().splitlines()[-1])
    store = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    _remove(out)
    trace = [[t, round(kib / 1024)] for t, kib in sorted(per_second.items())]
    return {"seconds": wall, "max_process_rss_mib": largest / 1024, "peak_tree_rss_mib": peak[0] / 1024,
            "store_bytes": store, "build_rss_mib_per_second": trace}  # fmt: skip


#: The build's per-image records alone, stage by stage, in a child process (``--rss-records``):
#: scan, probe and plan as the build runs them, then one worker result per image put where the
#: build keeps them (a list of ``Sample`` objects before the columns existed) and the manifest's
#: arrays. It prints ``stage rss_mib peak_mib seconds`` lines.
RECORDS_SCRIPT = r"""
import hashlib, os, resource, sys, time
from dlpack.options import BuildOptions
from dlpack.sources import FolderSource
from dlpack.pack.inputs import scan_stage, probe_stage, probed
from dlpack.pack.plan import plan_stage
from dlpack.pack.arrays import manifest_stage
from dlpack.pack.workers import Sample
src, side = sys.argv[1], int(sys.argv[2])
t0 = time.perf_counter()
def say(stage):
    with open("/proc/self/statm") as f:
        rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(stage, rss, peak, time.perf_counter() - t0, flush=True)
say("start")
opts = BuildOptions(size=(side, side), jobs=1, quiet=True)
try:  # as the build does: freed memory handed back after the scan and the probe
    from dlpack.storage.spill import give_back_freed
except ImportError:  # a checkout from before it
    def give_back_freed(): pass
scan = scan_stage(FolderSource(src)); say("scan")
give_back_freed()
try:  # the probe reads through the source's files
    from dlpack.sources.base import files_of
    where = files_of(FolderSource(src))
except ImportError:  # a checkout from before: the root folder
    where = FolderSource(src).root
try:  # the probe takes the option fields it uses
    probes = probe_stage(where, scan.items, max_pixels=opts.max_pixels, n_jobs=1, quiet=True)
except TypeError:  # a checkout from before: the whole options
    probes = probe_stage(FolderSource(src).root, scan.items, opts)
say("probe")
give_back_freed()
plan, sel = plan_stage(scan, probes, probed(scan, probes), opts, "zarr", src); say("plan")
def one(k):  # what a worker returns for one image: its own tuples and digest
    return Sample(tuple([side, side]), tuple([side, side, 3]), tuple([1.0, 1.0, 0.0, 0.0]), k, (), None,
                  tuple([100, 1_700_000_000_000_000_000 + k]), hashlib.sha256(str(k).encode()).hexdigest())
try:
    from dlpack.pack.columns import SampleTable
except ImportError:  # before the columns: the build held every Sample until the manifest
    samples = [one(k) for k in range(plan.count)]
else:
    samples = SampleTable(plan.count)
    for s in range(0, plan.count, 4096):
        samples.put(s, [one(k) for k in range(s, min(s + 4096, plan.count))])
say("samples")
arrays, manifest = manifest_stage(plan, scan, sel, samples); say("manifest")
"""


def records_run(src: Path, side: int) -> dict[str, Any]:
    """The per-image records of a build of ``src`` (``RECORDS_SCRIPT``): RSS and peak after each stage."""
    import subprocess

    out = subprocess.run([sys.executable, "-c", RECORDS_SCRIPT, str(src / "data"), str(side)], check=True,
                         capture_output=True, text=True).stdout  # fmt: skip
    stages = {}
    for line in out.splitlines():
        stage, rss, peak, seconds = line.split()
        stages[stage] = {"rss_mib": float(rss), "peak_mib": float(peak), "seconds": float(seconds)}
    return stages


def rss_mode(
    counts: list[int], jobs: list[int], workdir: Path, side: int, records: bool = False, trace: bool = False
) -> dict[str, Any]:
    """Peak build memory against the image count: tiny images, so what grows is per-image state."""
    rows: dict[str, Any] = {}
    for n in counts:
        print(f"making {n} files of {side}x{side} ...", file=sys.stderr)
        src = tiny_tree(workdir / f"tiny-{n}", n, side)
        if records:
            stages = records_run(src, side)
            rows[f"{n}-records"] = {"images": n, "stages": stages}
            line = ", ".join(f"{k} {v['rss_mib']:.0f}" for k, v in stages.items())
            print(f"  {n:>9,} images, records only: RSS MiB after {line}; peak {stages['manifest']['peak_mib']:.0f} MiB",
                  file=sys.stderr)  # fmt: skip
            continue
        for j in jobs:
            r = rss_run(src, workdir / f"rss-{n}-j{j}.zarr", j, side)
            rows[f"{n}-j{j}"] = {"images": n, "jobs": j, **r}
            print(
                f"  {n:>9,} images, jobs {j}: {r['seconds']:7.1f} s, largest process {r['max_process_rss_mib']:6.0f} MiB, "
                f"process tree {r['peak_tree_rss_mib']:6.0f} MiB, store {r['store_bytes'] / 2**20:6.1f} MiB",
                file=sys.stderr,
            )
            if trace:  # where in the build the peak is: the build process's largest RSS per second, MiB
                print("    " + " ".join(f"{t}s:{mib}" for t, mib in r["build_rss_mib_per_second"]), file=sys.stderr)
    return rows


# ---------------------------------------------------------------- CLI


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python benchmarks/build.py",
        description="CPU and wall time of the whole dlpack build command (jobs 1 and 2) versus a bare decode+resize loop",
    )
    p.add_argument("--shape", choices=sorted(SHAPES), default="seed",
                   help="generated set: seed = 600 sample images of 1024 px packed at 512x512 (default); "
                   "small = 2,000 PNGs of 300 px packed at 256x256")  # fmt: skip
    src = p.add_mutually_exclusive_group()
    src.add_argument("--images", type=Path, help="a real folder of images (default: generate the --shape's set)")
    src.add_argument("--count", type=int, help="images to generate (default: the shape's)")
    p.add_argument("--image-size", type=int, help="side of generated images (default: the shape's)")
    p.add_argument("--seed", type=int, default=0, help="seed of generated images (default 0)")
    tgt = p.add_mutually_exclusive_group()
    tgt.add_argument("--size", help="target WxH (default: the shape's)")
    tgt.add_argument("--max-side", type=int, help="longest side instead of --size")
    p.add_argument("--resize", choices=("stretch", "fit", "none"), help="resize mode (dlpack's default if omitted)")
    p.add_argument("--repeat", type=int, default=3, help="timed runs of every variant (default 3)")
    p.add_argument("--cpus", type=int, help="pin this process, the bare loop and every build to this many cores")
    p.add_argument("--no-warm", action="store_true", help="leave out the in-process builds with a warm pool")
    p.add_argument(
        "--breakdown",
        action="store_true",
        help="instead: the parts of the whole command measured alone on the same files, beside its CPU",
    )
    p.add_argument("--jobs", default="1,2", help="comma-separated job counts (default 1,2)")
    p.add_argument("--formats", default="zarr,hdf5", help="comma-separated output formats (default zarr,hdf5)")
    p.add_argument(
        "--max-other",
        type=float,
        default=1.0,
        help="re-run a repeat when other processes used more than this share of the CPUs during any "
        "variant (0..1; default 1: keep every repeat)",
    )
    p.add_argument("--max-tries", type=int, default=3, help="attempts per wanted repeat with --max-other (default 3)")
    p.add_argument("--workdir", type=Path, help="where generated images and stores go (default: a temp folder)")
    p.add_argument("--keep", action="store_true", help="keep the work folder")
    p.add_argument("--json", type=Path, help="write all runs, medians, ratios and machine details here")
    p.add_argument(
        "--rss",
        help="instead of timing: peak build memory for these comma-separated image counts of tiny "
        "(--rss-side) images, one command-line build per count and job count",
    )
    p.add_argument(
        "--cli",
        action="store_true",
        help="instead: time the whole command-line build of --images (or the generated set) per job count",
    )
    p.add_argument(
        "--code",
        help="with --cli: comma-separated dlpack source trees to compare (each run's PYTHONPATH), "
        "interleaved with the job counts",
    )
    p.add_argument("--rss-side", type=int, default=16, help="side of the --rss images (default 16)")
    p.add_argument(
        "--rss-trace",
        action="store_true",
        help="with --rss: print the build process's RSS, the largest in each second (always in --json)",
    )
    p.add_argument(
        "--rss-records",
        action="store_true",
        help="with --rss: only the per-image records (scan, probe, plan, one sample per image, the manifest "
        "arrays) in one process, no decoding: the memory that grows with the count, in minutes at 1,000,000",
    )
    args = p.parse_args(argv)
    if args.repeat < 1 or args.max_tries < 1:
        p.error("--repeat and --max-tries must be >= 1")
    gen, count, side, size = SHAPES[args.shape]
    args.generator = gen
    args.count = count if args.count is None else args.count
    args.image_size = side if args.image_size is None else args.image_size
    if args.size is None and args.max_side is None:
        args.size = size
    if args.cpus is not None:
        usable = sorted(os.sched_getaffinity(0))
        if not 1 <= args.cpus <= len(usable):
            p.error(f"--cpus must be between 1 and the {len(usable)} usable cores, got {args.cpus}")
        args.cpus = usable[: args.cpus]
    try:
        args.jobs = [int(j) for j in args.jobs.split(",") if j]
    except ValueError:
        p.error(f"--jobs must be comma-separated integers, got {args.jobs!r}")
    if not args.jobs or min(args.jobs) < 1:
        p.error("--jobs needs at least one job count, each >= 1")
    args.formats = [f for f in args.formats.split(",") if f]
    if not args.formats or not set(args.formats) <= {"zarr", "hdf5"}:
        p.error(f"--formats must be zarr, hdf5 or both, got {','.join(args.formats)!r}")
    if args.max_side is not None:
        args.size = None
    if args.rss is not None:
        try:
            args.rss = [int(c) for c in args.rss.split(",") if c]
        except ValueError:
            p.error(f"--rss must be comma-separated image counts, got {args.rss!r}")
        if not args.rss or min(args.rss) < 1:
            p.error("--rss needs at least one image count, each >= 1")
    return args


def make_images(args: argparse.Namespace, workdir: Path) -> Path:
    """The folder to pack: ``--images``, or the shape's generated set (kept in ``workdir``)."""
    if args.images is not None:
        return Path(args.images)
    src = workdir / f"{args.generator}-{args.count}-{args.image_size}-{args.seed}"
    if not src.exists() or not any(src.iterdir()):
        print(f"generating {args.count} images of {args.image_size} px into {src} ...", file=sys.stderr)
        if args.generator == "pngs":
            from _images import make_pngs

            make_pngs(src, args.count, args.image_size, seed=(args.seed,))
        else:
            from dlpack.sample import make_sample

            make_sample(src, args.count, size=args.image_size, seed=args.seed)
    return src


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.cpus is not None:
        os.sched_setaffinity(0, args.cpus)  # inherited by every build and its workers
    if args.rss is not None:
        workdir = args.workdir or Path(tempfile.mkdtemp(prefix="dlpack-bench-rss-"))
        try:
            rows = rss_mode(args.rss, args.jobs, workdir, args.rss_side, args.rss_records, args.rss_trace)
            if args.json:
                args.json.parent.mkdir(parents=True, exist_ok=True)
                rss_doc: dict[str, Any] = {"benchmark": "build-rss", "command": " ".join(sys.argv), "machine": machine_info(workdir),
                       "runs": rows}  # fmt: skip
                args.json.write_text(json.dumps(rss_doc, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        finally:
            if not args.keep and args.workdir is None:
                shutil.rmtree(workdir, ignore_errors=True)
        return 0
    # on_error=skip: files dlpack rejects are found once and left out of every variant (below).
    opts = BuildOptions(
        size=parse_size(args.size) if args.size else None,
        max_side=args.max_side,
        resize=args.resize,
        on_error="skip",
    )
    jobs: list[int] = args.jobs
    formats: list[str] = args.formats
    variants = [Variant("bare")] + [Variant(f"{f}-j{j}", f, j) for f in formats for j in jobs]
    if not args.no_warm:
        variants += [Variant(f"{f}-j{j}-warm", f, j, whole=False) for f in formats for j in jobs]

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="dlpack-bench-build-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        src = make_images(args, workdir)
        if args.breakdown:
            bd = breakdown_mode(src, opts, jobs, workdir)
            if args.json:
                args.json.parent.mkdir(parents=True, exist_ok=True)
                bd.update(benchmark="build-breakdown", command=" ".join(sys.argv), machine=machine_info(workdir))
                args.json.write_text(json.dumps(bd, indent=2, sort_keys=True) + "\n", encoding="utf-8")
            return 0
        if args.cli:
            code = [Path(c) for c in args.code.split(",") if c] if args.code else None
            cli_doc = cli_mode(src, args.size or "512x512", jobs, args.repeat, workdir, code)
            if args.json:
                args.json.parent.mkdir(parents=True, exist_ok=True)
                cli_doc.update(benchmark="build-cli", command=" ".join(sys.argv), machine=machine_info(workdir))
                args.json.write_text(json.dumps(cli_doc, indent=2, sort_keys=True) + "\n", encoding="utf-8")
            return 0
        items = list(FolderSource(src).scan().items)
        # An untimed build finds the files dlpack rejects; the bare loop leaves them out too, so every
        # variant handles the same images. It also warms the page cache and the imports, and starts
        # joblib's worker pool (reused by later builds: worker start-up is not in the figures).
        warm = dlpack.build(src, workdir / "bench-warmup.zarr", opts, jobs=max(jobs), overwrite=True, quiet=True)
        _remove(workdir / "bench-warmup.zarr")
        rejected = {e.path: e.reason for e in warm.skipped}
        if rejected:
            print(
                f"warning: dlpack rejects {len(rejected)} of {len(items)} files; all variants leave them out:",
                file=sys.stderr,
            )
            for rel, why in sorted(rejected.items())[:5]:
                print(f"  {rel}: {why}", file=sys.stderr)
        paths = [os.path.join(src, it.rel) for it in items if it.rel not in rejected]
        # Untimed whole commands: the bytecode caches are written, the command's files are in the page cache.
        for j in sorted(set(jobs)):
            for f in formats:
                out = workdir / f"bench-j{j}.{'zarr' if f == 'zarr' else 'h5'}"
                whole_command(build_command(src, out, opts, j))
                _remove(out)
        in_bytes = sum(os.path.getsize(p) for p in paths)
        info = machine_info(workdir)
        print(
            f"{len(paths)} files ({in_bytes / 1e6:.0f} MB) in {src}; target "
            f"{args.size or f'max side {args.max_side}'} resize={opts.resize_mode}; "
            f"{args.repeat} repeats; {info['cpu']}, {info['cores_usable']} cores, cv2 threads {info['cv2_threads']}",
            file=sys.stderr,
        )
        # Warm the page cache: every variant then reads the files from memory, not disk.
        bare_loop(paths, opts)
        runs: dict[str, list[dict[str, Any]]] = {v.name: [] for v in variants}
        discarded: list[dict[str, dict[str, Any]]] = []
        attempt = 0
        while len(runs["bare"]) < args.repeat and attempt < args.repeat * args.max_tries:
            order = variants[attempt % len(variants) :] + variants[: attempt % len(variants)]
            attempt += 1
            one: dict[str, dict[str, Any]] = {}
            for v in order:
                one[v.name] = r = run_variant(v, src, paths, opts, workdir, len(paths))
                share = r.get("other_cpu_share")
                busy = f" (others used {100 * share:.0f} % of the CPUs)" if share is not None else ""
                print(
                    f"  attempt {attempt}: {v.name:8s} {r['images'] / r['seconds']:7.1f} img/s{busy}", file=sys.stderr
                )
            worst = max((r.get("other_cpu_share") or 0.0) for r in one.values())
            if worst > args.max_other:
                # The whole repeat goes, so the variants of every kept repeat ran side by side.
                print(
                    f"  attempt {attempt} discarded: others used up to {100 * worst:.0f} % of the CPUs", file=sys.stderr
                )
                discarded.append(one)
                continue
            for name, r in one.items():
                runs[name].append(r)
        if len(runs["bare"]) < args.repeat:
            print(
                f"warning: only {len(runs['bare'])} of {args.repeat} repeats ran on a quiet enough machine; "
                "keeping the least disturbed of the discarded ones",
                file=sys.stderr,
            )
            discarded.sort(key=lambda one: max((r.get("other_cpu_share") or 0.0) for r in one.values()))
            while len(runs["bare"]) < args.repeat and discarded:
                for name, r in discarded.pop(0).items():
                    r["disturbed"] = True
                    runs[name].append(r)
        counts = {r["images"] for rs in runs.values() for r in rs}
        if len(counts) != 1:
            print(f"warning: variants processed different image counts {sorted(counts)}", file=sys.stderr)
        info["loadavg_at_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
        summary = summarise(variants, runs)
        print()
        print_table(variants, runs, summary)
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            doc = {
                "benchmark": "build",
                "command": " ".join([Path(sys.argv[0]).as_posix(), *(argv if argv is not None else sys.argv[1:])]),
                "source": str(src),
                "files": len(paths),
                "rejected_by_dlpack": rejected,
                "input_bytes": in_bytes,
                "options": {"size": args.size, "max_side": args.max_side, "resize": opts.resize_mode},
                "repeat": args.repeat,
                "cpus": args.cpus,
                "targets": {"cpu_over_bare_max": 1 + TARGET_OVERHEAD, "efficiency_min": TARGET_EFFICIENCY},
                "machine": info,
                "runs": runs,
                "discarded_repeats": discarded,
                **summary,
            }
            args.json.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    finally:
        if not args.keep and args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
        elif not args.keep:
            for p in workdir.glob("bench-j*"):
                _remove(p)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
