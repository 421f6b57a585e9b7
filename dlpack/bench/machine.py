"""Facts about the machine a benchmark ran on: CPU, cores, memory, disks, OS and library versions."""

from __future__ import annotations

import os
import platform
import shutil
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = ["machine_info", "disk_info", "mount_of", "cpu_model", "memory_bytes", "load_average"]

#: Distributions whose versions change benchmark figures; absent ones are reported as None.
_LIBRARIES = (
    "dlpack-datasets",
    "numpy",
    "zarr",
    "numcodecs",
    "h5py",
    "hdf5plugin",
    "opencv-python-headless",
    "opencv-python",
    "tqdm",
    "matplotlib",
)


def cpu_model() -> str:
    """The CPU's marketing name, or the best the platform says."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith(("model name", "hardware", "cpu model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    if sys.platform == "darwin":
        import subprocess

        try:
            out = subprocess.run(
                ["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True, timeout=5, check=False
            )
            if out.stdout.strip():
                return out.stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    return platform.processor() or platform.machine() or "unknown"


def _virtualized() -> bool | None:
    """True when the CPU flags say a hypervisor runs this OS (its host page cache is then invisible)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return "hypervisor" in line.split()
    except OSError:
        pass
    return None


def memory_bytes() -> int | None:
    """Physical memory in bytes, or None when the platform does not say."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages, or None (Windows)."""
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except (OSError, AttributeError):
        return None


def _mounts() -> list[tuple[str, str, str]]:
    """(device, mount point, file system type) from /proc/mounts; empty elsewhere."""
    out = []
    try:
        with open("/proc/mounts", encoding="utf-8", errors="replace") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 3:
                    # /proc/mounts escapes spaces in mount points as \040
                    out.append((parts[0], parts[1].replace("\\040", " "), parts[2]))
    except OSError:
        pass
    return out


def mount_of(path: str | os.PathLike[str]) -> dict[str, str] | None:
    """The mount holding ``path``: ``{"device", "mount", "fstype"}``, or None when unknown."""
    real = os.path.realpath(path)
    best: tuple[str, str, str] | None = None
    for dev, mnt, fs in _mounts():
        inside = real == mnt or real.startswith(mnt.rstrip("/") + "/")
        if inside and (best is None or len(mnt) >= len(best[1])):
            best = (dev, mnt, fs)
    if best is None:
        return None
    return {"device": best[0], "mount": best[1], "fstype": best[2]}


def _rotational(device: str) -> bool | None:
    """Whether a block device is a spinning disk (Linux sysfs), or None."""
    if not device.startswith("/dev/"):
        return None
    block = Path("/sys/class/block") / Path(device).name
    try:
        if (block / "partition").exists():
            block = block.resolve().parent
        return (block / "queue" / "rotational").read_text().strip() == "1"
    except OSError:
        return None


def disk_info(path: str | os.PathLike[str]) -> dict[str, Any]:
    """What ``df`` says about the file system holding ``path``, plus its device and type."""
    info: dict[str, Any] = {"path": os.fspath(path)}
    try:
        usage = shutil.disk_usage(path)
        info.update(total_gb=round(usage.total / 1e9, 1), free_gb=round(usage.free / 1e9, 1))
    except OSError:
        info.update(total_gb=None, free_gb=None)
    m = mount_of(path)
    info.update(device=m["device"] if m else None, mount=m["mount"] if m else None, fstype=m["fstype"] if m else None)
    info["rotational"] = _rotational(m["device"]) if m else None
    return info


def _versions() -> dict[str, str | None]:
    from importlib import metadata  # costs ~30 ms: only when a report is made

    out: dict[str, str | None] = {}
    for name in _LIBRARIES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def machine_info(paths: Iterable[str | os.PathLike[str]] = ()) -> dict[str, Any]:
    """CPU model, cores, RAM, OS, Python and library versions, and ``df`` of each of ``paths``."""
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = os.cpu_count() or 1
    mem = memory_bytes()
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "cores_usable": usable,
        "memory_gb": round(mem / 2**30, 1) if mem else None,
        "virtualized": _virtualized(),
        "os": platform.platform(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "libraries": _versions(),
        "disks": [disk_info(p) for p in paths],
    }
