"""CPU accounting shared by the benchmarks: how much of the machine others used during a run."""

from __future__ import annotations

import os
from pathlib import Path


def busy_cpu_s() -> float | None:
    """CPU seconds all cores have been busy since boot (/proc/stat), or None off Linux."""
    try:
        v = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    except (OSError, ValueError):
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = v
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def own_cpu_s() -> float:
    """CPU seconds of this process and of every live process below it (joblib's workers, a Dask
    LocalCluster's nannies and their worker processes), plus the children it waited for; 10 ms resolution."""
    t = os.times()
    own = t.user + t.system + t.children_user + t.children_system
    parent: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            pid = int(stat.parent.name)
        except (OSError, IndexError, ValueError):
            continue
        parent[pid] = int(fields[1])  # fields: state, ppid, ..., utime (12th), stime (13th)
        ticks[pid] = int(fields[11]) + int(fields[12])
    below, todo = set(), [os.getpid()]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p and c not in below]
        below.update(kids)
        todo += kids
    return own + sum(ticks[p] for p in below) / os.sysconf("SC_CLK_TCK")
