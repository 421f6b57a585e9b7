r"""Benchmark ``dlpack build``: images/s with --jobs 1 and 2 against a bare decode + resize loop.

Run by hand (not part of the tests)::

    python benchmarks/build.py --count 300 --size 512x512 --repeat 3 --max-other 0.15 \
        --json bench-out/build-sample.json
    python benchmarks/build.py --images /tmp/dlpack-datasets/stellarium_nebulae \
        --size 512x512 --resize fit --repeat 3 --max-other 0.15 --json bench-out/build-stellarium.json

Each repeat runs every variant once, side by side in one process: the bare loop (read bytes,
``cv2.imdecode(IMREAD_UNCHANGED)``, ``cv2.resize(INTER_AREA)``, one process, nothing else), then
``dlpack.build`` with each job count and output format. The order is rotated each repeat so no
variant always runs first; the figures are medians over the repeats. Before the first repeat an
untimed build finds the files dlpack rejects (every variant leaves them out), warms the page cache
and starts joblib's worker pool, and an untimed bare pass follows. The previous output store is
deleted before each build, outside the timed region.

Other processes on the machine distort the figures (most of all jobs 2 on a 2-core machine): every
run records the share of the CPUs that other processes used meanwhile (from /proc/stat minus this
process and its workers), and ``--max-other 0.15`` re-runs a repeat in which it was exceeded. CPU
seconds per image (this process and its workers) are reported too: they hardly depend on load.
Targets (docs/benchmarks.md): jobs 2 at least 1.7x jobs 1; jobs 1 at most 15 % slower than the
bare loop.

Two other modes: ``--cli`` times the whole ``python -m dlpack build`` command (interpreter start and
worker start-up included) per job count, interleaved; ``--rss 100000,1000000`` measures the peak
memory of command-line builds of that many tiny images (hard links of one PNG), and with
``--rss-records`` the memory of the build's per-image records alone (no decoding)::

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


@dataclass(frozen=True)
class Variant:
    """One timed thing: the bare loop, or a build with a format and a job count."""

    name: str
    fmt: str | None = None
    jobs: int | None = None


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
    """Read, decode and resize every file; return how many were decoded."""
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


def run_variant(v: Variant, src: Path, paths: list[str], opts: BuildOptions, outdir: Path) -> dict[str, Any]:
    """Time one variant once; a build's rate counts the images it packed."""
    if v.fmt is None:
        return _timed(lambda: bare_loop(paths, opts))
    out = outdir / f"bench-j{v.jobs}.{'zarr' if v.fmt == 'zarr' else 'h5'}"
    _remove(out)  # deleting the old store is not part of a build
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


def summarise(variants: list[Variant], runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    rates = {v.name: _median_rate(runs[v.name]) for v in variants}
    out: dict[str, Any] = {"images_per_s": rates, "ratios": {}}
    bare = rates["bare"]
    for fmt in sorted({v.fmt for v in variants if v.fmt}):
        j1, j2 = rates.get(f"{fmt}-j1"), rates.get(f"{fmt}-j2")
        r: dict[str, Any] = {}
        if j1 and j2:
            r["jobs2_over_jobs1"] = j2 / j1
            r["speedup_met"] = j2 / j1 >= TARGET_SPEEDUP
        if j1:
            r["overhead_jobs1_vs_bare"] = bare / j1 - 1
            r["overhead_met"] = bare / j1 - 1 <= TARGET_OVERHEAD
            # CPU seconds per image hardly change when other processes share the machine.
            cpu_j1, cpu_bare = _median_cpu_per_image(runs[f"{fmt}-j1"]), _median_cpu_per_image(runs["bare"])
            if cpu_j1 is not None and cpu_bare:  # a tiny run can measure 0 CPU seconds
                r["overhead_jobs1_vs_bare_cpu"] = cpu_j1 / cpu_bare - 1
        out["ratios"][fmt] = r
    return out


def print_table(variants: list[Variant], runs: dict[str, list[dict[str, Any]]], summary: dict[str, Any]) -> None:
    rows = [("variant", "median img/s", "runs (img/s)", "median s", "CPU ms/img", "others' CPU share")]
    for v in variants:
        rs = runs[v.name]
        cpu = _median_cpu_per_image(rs)
        shares = [r["other_cpu_share"] for r in rs if "other_cpu_share" in r]
        rows.append(
            (
                v.name,
                f"{summary['images_per_s'][v.name]:.1f}",
                " ".join(f"{r['images'] / r['seconds']:.1f}" for r in rs),
                f"{statistics.median(r['seconds'] for r in rs):.2f}",
                f"{1000 * cpu:.1f}" if cpu is not None else "-",
                " ".join(f"{100 * x:.0f}%" for x in shares) or "-",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for k, r in enumerate(rows):
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))))
        if k == 0:
            print("  ".join("-" * w for w in widths))
    print()
    for fmt, r in summary["ratios"].items():
        parts = []
        if "jobs2_over_jobs1" in r:
            ok = "met" if r["speedup_met"] else "NOT met"
            parts.append(f"jobs2/jobs1 = {r['jobs2_over_jobs1']:.2f}x (target >= {TARGET_SPEEDUP}x: {ok})")
        if "overhead_jobs1_vs_bare" in r:
            ok = "met" if r["overhead_met"] else "NOT met"
            parts.append(
                f"jobs1 overhead over bare = {100 * r['overhead_jobs1_vs_bare']:+.1f} % "
                f"(target <= {100 * TARGET_OVERHEAD:.0f} %: {ok})"
            )
        if "overhead_jobs1_vs_bare_cpu" in r:
            parts.append(f"in CPU time {100 * r['overhead_jobs1_vs_bare_cpu']:+.1f} %")
        print(f"{fmt}: " + "; ".join(parts))


# ---------------------------------------------------------------- the whole command (--cli)


def cli_mode(
    src: Path, size: str, jobs: list[int], repeat: int, workdir: Path, code: list[Path] | None = None
) -> dict[str, Any]:
    """``python -m dlpack build SRC OUT --size S --jobs J`` as a user runs it (interpreter start,
    scan, probe, worker start-up, pack, publish), the job counts interleaved, rotated each repeat.

    ``code``: source trees of dlpack to compare (each run's ``PYTHONPATH``), interleaved with the
    job counts in one run, so that two versions see the same load. Each run also reports the CPU
    seconds per image of the build process and its workers, which load distorts far less than the
    wall time."""
    import subprocess

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
            env = None if tree is None else {**os.environ, "PYTHONPATH": str(tree)}

            def go(cmd: list[str] = cmd, env: dict[str, str] | None = env) -> int:
                subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=env)
                return 1

            t = _timed(go)
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
        description="images/s of dlpack build (jobs 1 and 2) versus a bare decode+resize loop",
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument("--images", type=Path, help="a real folder of images (default: generate --count images)")
    src.add_argument("--count", type=int, default=300, help="images to generate with dlpack.sample (default 300)")
    p.add_argument("--image-size", type=int, default=1024, help="side of generated images (default 1024)")
    p.add_argument("--seed", type=int, default=0, help="seed of generated images (default 0)")
    tgt = p.add_mutually_exclusive_group()
    tgt.add_argument("--size", default="512x512", help="target WxH (default 512x512)")
    tgt.add_argument("--max-side", type=int, help="longest side instead of --size")
    p.add_argument("--resize", choices=("stretch", "fit", "none"), help="resize mode (dlpack's default if omitted)")
    p.add_argument("--repeat", type=int, default=3, help="timed runs of every variant (default 3)")
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


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
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

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="dlpack-bench-build-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        if args.images is not None:
            src = args.images
        else:
            from dlpack.sample import make_sample

            src = workdir / f"sample-{args.count}-{args.image_size}-{args.seed}"
            if not src.exists():
                print(f"generating {args.count} images of {args.image_size} px into {src} ...", file=sys.stderr)
                make_sample(src, args.count, size=args.image_size, seed=args.seed)
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
                one[v.name] = r = run_variant(v, src, paths, opts, workdir)
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
                "targets": {"jobs2_over_jobs1_min": TARGET_SPEEDUP, "overhead_max": TARGET_OVERHEAD},
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
