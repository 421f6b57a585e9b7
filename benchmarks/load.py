"""Load test: a build of many small images, and the loader over many epochs of its store.

Run by hand (not part of the tests; several minutes at the default count on 2 cores)::

    python benchmarks/load.py --count 100000 --work /tmp/dlpack-load --json load.json

1. **Build.** ``--count`` PNGs of 32x32 RGB (gradients plus noise, fixed seed, in 10 class folders)
   are generated into ``WORK/src`` (not timed; kept and reused by the next run with the same count).
   Then ``python -m dlpack build WORK/src WORK/load.zarr --size 32x32 --jobs J --quiet`` runs as a
   subprocess for each backend (``.zarr`` and ``.h5``), after reading every source file once,
   untimed, so the page cache is warm. Reported: wall time, images/s, the peak RSS of the build
   process (``ru_maxrss`` from ``wait4``: its own peak, or a reaped worker's if larger), the peak
   of the summed RSS of the build process and its worker processes (sampled every 0.2 s from
   /proc), the store's file count and bytes, and the share of the CPUs that other processes used
   meanwhile (/proc/stat minus the build's and this script's CPU time). The file count stays small (shards, not one file
   per image).
2. **Loader.** For each store, a fresh Python process opens it and iterates ``--epochs`` epochs
   with ``ds.loader(batch_size=B, workers=2, prefetch=4, seed=0)`` (random order), checking that
   every epoch delivers each sample once. After each epoch it records images/s and its current
   RSS from /proc/self/statm: resident, and anonymous (resident minus file-backed and shared
   pages: the heap, which is what would grow if the loader leaked; the store's memory-mapped
   pages count as file-backed, so resident rises during the first epoch as the store is mapped).

``--count 40 --epochs 2`` is the smoke run (tests/test_scripts.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import cv2
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _cpu import busy_cpu_s  # noqa: E402
from build import machine_info  # noqa: E402

SIDE = 32
CLASSES = 10
BACKENDS = {"zarr": "load.zarr", "hdf5": "load.h5"}
PAGE = os.sysconf("SC_PAGE_SIZE")


# ---------------------------------------------------------------- data


def generate(src: Path, count: int) -> float:
    """``count`` 32x32 RGB PNGs in ``src/classK/``; reused when a previous run made the same set."""
    stamp = src / ".generated"
    if stamp.is_file() and stamp.read_text().strip() == str(count):
        return 0.0
    if src.exists():
        shutil.rmtree(src)
    t0 = time.perf_counter()
    rng = np.random.default_rng(0)
    ramp = (np.add.outer(np.arange(SIDE), np.arange(SIDE)) * (255 // (2 * SIDE))).astype(np.uint8)
    for k in range(CLASSES):
        (src / f"class{k}").mkdir(parents=True)
    for i in range(count):
        noise = rng.integers(0, 256, (SIDE, SIDE), dtype=np.uint8)
        img = np.dstack([ramp + i % 61, ramp.T + (i // 61) % 61, noise])
        ok, buf = cv2.imencode(".png", img)
        if not ok:
            raise RuntimeError("PNG encoding failed")
        (src / f"class{i % CLASSES}" / f"{i:07d}.png").write_bytes(buf.tobytes())
    stamp.write_text(f"{count}\n")
    return time.perf_counter() - t0


def _warm(src: Path) -> int:
    """Read every source file once (untimed), so each build starts with a warm page cache."""
    total = 0
    for folder in sorted(src.iterdir()):
        if folder.is_dir():
            for f in folder.iterdir():
                total += len(f.read_bytes())
    return total


# ---------------------------------------------------------------- memory


def _statm() -> tuple[int, int]:
    """(resident, anonymous) bytes of this process: anonymous is resident minus file-backed/shared."""
    fields = Path("/proc/self/statm").read_text().split()
    resident, shared = int(fields[1]) * PAGE, int(fields[2]) * PAGE
    return resident, resident - shared


def _tree(root: int) -> dict[int, tuple[int, float]]:
    """Resident bytes and CPU seconds of ``root`` and each of its descendants, by pid, from /proc."""
    children: dict[int, list[int]] = {}
    cpu: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        pid = int(stat.parent.name)
        children.setdefault(int(fields[1]), []).append(pid)
        cpu[pid] = (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    out: dict[int, tuple[int, float]] = {}
    todo = [root]
    while todo:
        pid = todo.pop()
        todo.extend(children.get(pid, []))
        try:
            out[pid] = (int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE, cpu.get(pid, 0.0))
        except (OSError, IndexError, ValueError):
            pass  # the process ended between the scan and the read
    return out


# ---------------------------------------------------------------- build


def _file_count(store: Path) -> tuple[int, int]:
    """(files, bytes) of a store folder or file."""
    if store.is_file():
        return 1, store.stat().st_size
    files = [p for p in store.rglob("*") if p.is_file()]
    return len(files), sum(p.stat().st_size for p in files)


def _other_share(busy0: float | None, busy1: float | None, own_s: float, wall: float) -> float | None:
    """The share of all CPUs that other processes used during ``wall`` seconds (/proc/stat minus ours)."""
    if busy0 is None or busy1 is None:
        return None
    return max(0.0, (busy1 - busy0) - own_s) / (wall * (os.cpu_count() or 1))


def _self_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def run_build(src: Path, out: Path, jobs: int, count: int, env: dict[str, str]) -> dict[str, Any]:
    """One ``python -m dlpack build`` subprocess: wall time, peak RSS, file count."""
    if out.is_dir():
        shutil.rmtree(out)
    elif out.exists():
        out.unlink()
    summary = out.parent / f"{out.name}.build.json"
    cmd = [sys.executable, "-m", "dlpack", "build", str(src), str(out), "--size", f"{SIDE}x{SIDE}"]
    cmd += ["--jobs", str(jobs), "--quiet", "--json-file", str(summary)]
    peak_tree = 0
    tree_cpu: dict[int, float] = {}
    busy0, self0 = busy_cpu_s(), _self_cpu_s()
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL)
    done = threading.Event()

    def sample() -> None:
        nonlocal peak_tree
        while not done.wait(0.2):
            tree = _tree(proc.pid)
            peak_tree = max(peak_tree, sum(rss for rss, _ in tree.values()))
            tree_cpu.update((pid, cpu) for pid, (_, cpu) in tree.items())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - t0
    busy1 = busy_cpu_s()
    done.set()
    sampler.join()
    # wait4's usage covers the build and only the workers it reaped; the samples see every worker
    # (up to the last sample). Ours is the sampler thread.
    build_cpu = max(usage.ru_utime + usage.ru_stime, sum(tree_cpu.values()))
    own = build_cpu + _self_cpu_s() - self0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"build exited {proc.returncode}: {' '.join(cmd)}")
    packed = json.loads(summary.read_text())
    files, nbytes = _file_count(out)
    return {
        "command": " ".join(["python", "-m", "dlpack", *cmd[3:]]),
        "seconds": seconds,
        "images": count,
        "images_per_s": count / seconds,
        "peak_rss_bytes": usage.ru_maxrss * 1024,  # Linux reports KiB
        "peak_tree_rss_bytes": peak_tree,
        "files": files,
        "store_bytes": nbytes,
        "cpu_seconds": build_cpu,
        "other_cpu_share": _other_share(busy0, busy1, own, seconds),
        "summary": packed,
    }


# ---------------------------------------------------------------- loader


def loader_epochs(store: Path, epochs: int, batch_size: int, workers: int) -> dict[str, Any]:
    """Iterate ``epochs`` epochs of ``store``; images/s and RSS after each (run in a fresh process)."""
    import dlpack

    ds = dlpack.open(store)
    n = len(ds)
    loader = ds.loader(batch_size=batch_size, workers=workers, prefetch=4, seed=0)
    resident, anon = _statm()
    rows: list[dict[str, Any]] = [{"epoch": None, "resident_bytes": resident, "anon_bytes": anon}]
    for epoch in range(epochs):
        seen = np.zeros(n, dtype=np.int64)
        images = 0
        t0 = time.perf_counter()
        for batch in loader:
            images += len(batch["image"])
            np.add.at(seen, batch["index"], 1)
        seconds = time.perf_counter() - t0
        if not (seen == 1).all():
            raise SystemExit(f"epoch {epoch} of {store} did not deliver every sample exactly once")
        resident, anon = _statm()
        rows.append(
            {
                "epoch": epoch,
                "images": images,
                "seconds": seconds,
                "images_per_s": images / seconds,
                "resident_bytes": resident,
                "anon_bytes": anon,
            }
        )
    ds.close()
    return {"count": n, "batch_size": batch_size, "workers": workers, "epochs": rows}


def run_loader(store: Path, a: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    """:func:`loader_epochs` in a fresh interpreter, so one store's maps do not inflate the other's RSS."""
    cmd = [sys.executable, __file__, "--loader-only", str(store), "--epochs", str(a.epochs)]
    cmd += ["--batch-size", str(a.batch_size), "--workers", str(a.workers)]
    busy0, t0, times0 = busy_cpu_s(), time.perf_counter(), os.times()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    wall, times1, busy1 = time.perf_counter() - t0, os.times(), busy_cpu_s()
    if proc.returncode != 0:
        raise SystemExit(f"loader run failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    result: dict[str, Any] = json.loads(proc.stdout.splitlines()[-1])
    own = sum(times1[:4]) - sum(times0[:4])  # this process and the loader process (waited for)
    result["other_cpu_share"] = _other_share(busy0, busy1, own, wall)
    return result


# ---------------------------------------------------------------- report


def _mb(n: float) -> str:
    return f"{n / 1e6:,.1f}"


def _pct(share: float | None) -> str:
    return "?" if share is None else f"{100 * share:.0f} %"


def report(builds: dict[str, dict[str, Any]], loads: dict[str, dict[str, Any]]) -> None:
    print("\nbuild    seconds  images/s  peak RSS MB  peak RSS tree MB  files  store MB  CPU s  others' CPU")
    for name, b in builds.items():
        print(
            f"{name:<8} {b['seconds']:>7.1f} {b['images_per_s']:>9,.0f} {_mb(b['peak_rss_bytes']):>12}"
            f" {_mb(b['peak_tree_rss_bytes']):>17} {b['files']:>6} {_mb(b['store_bytes']):>9}"
            f" {b['cpu_seconds']:>6.1f} {_pct(b['other_cpu_share']):>12}"
        )
    for name, r in loads.items():
        print(
            f"\nloader {name}: {r['count']:,} images, batch {r['batch_size']}, {r['workers']} workers, prefetch 4; "
            f"others used {_pct(r['other_cpu_share'])} of the CPUs"
        )
        print("epoch  images/s  RSS MB  anon MB")
        for row in r["epochs"]:
            label = "open" if row["epoch"] is None else str(row["epoch"])
            rate = f"{row['images_per_s']:>9,.0f}" if "images_per_s" in row else " " * 9
            print(f"{label:>5} {rate} {_mb(row['resident_bytes']):>7} {_mb(row['anon_bytes']):>8}")
        timed = r["epochs"][1:]
        med = statistics.median(row["images_per_s"] for row in timed)
        growth = timed[-1]["anon_bytes"] - timed[0]["anon_bytes"]
        rss_growth = timed[-1]["resident_bytes"] - timed[0]["resident_bytes"]
        print(
            f"median {med:,.0f} images/s; after epoch {timed[-1]['epoch']} vs epoch 0: "
            f"anon {growth / 1e6:+.1f} MB, RSS {rss_growth / 1e6:+.1f} MB"
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--count", type=int, default=100_000, help="images to generate and pack (default 100000)")
    p.add_argument("--work", type=Path, default=Path("/tmp/dlpack-load"), help="work folder (kept)")
    p.add_argument("--jobs", type=int, default=2, help="build --jobs (default 2)")
    p.add_argument("--epochs", type=int, default=10, help="loader epochs per store (default 10)")
    p.add_argument("--batch-size", type=int, default=32, help="loader batch size (default 32)")
    p.add_argument("--workers", type=int, default=2, help="loader threads (default 2)")
    p.add_argument("--backends", default="zarr,hdf5", help="comma-separated: zarr, hdf5")
    p.add_argument("--json", type=Path, help="write every figure and the machine facts here")
    p.add_argument("--loader-only", type=Path, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.loader_only is not None:
        print(json.dumps(loader_epochs(a.loader_only, a.epochs, a.batch_size, a.workers)))
        return 0
    if a.count < 1 or a.epochs < 1:
        p.error("--count and --epochs must be at least 1")
    backends = [b.strip() for b in a.backends.split(",") if b.strip()]
    if not backends or any(b not in BACKENDS for b in backends):
        p.error(f"--backends must name some of {', '.join(BACKENDS)}")

    work = a.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    src = work / "src"
    gen_s = generate(src, a.count)
    print(
        f"{a.count:,} PNGs of {SIDE}x{SIDE}x3 in {src}" + (f" (generated in {gen_s:.0f} s)" if gen_s else " (reused)")
    )
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    info = machine_info(work)
    builds: dict[str, dict[str, Any]] = {}
    for name in backends:
        _warm(src)
        builds[name] = run_build(src, work / BACKENDS[name], a.jobs, a.count, env)
        print(f"built {name}: {builds[name]['seconds']:.1f} s, {builds[name]['files']} files", flush=True)
    loads = {name: run_loader(work / BACKENDS[name], a, env) for name in backends}
    report(builds, loads)
    info["loadavg_at_end"] = list(os.getloadavg())
    print(f"\nload average at start {info['loadavg_at_start']}, at end {info['loadavg_at_end']}")
    if a.json is not None:
        a.json.write_text(json.dumps({"machine": info, "count": a.count, "builds": builds, "loader": loads}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
