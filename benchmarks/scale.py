"""Stores on object storage: the loader streaming from a loopback S3 server, side by side (run by hand).

    python benchmarks/scale.py --work /tmp/dlpack-scale --json scale.json
    python benchmarks/scale.py --quick                        # tiny counts: a smoke run

Everything runs against one S3-compatible server (moto's server mode) started here on 127.0.0.1
and stopped at the end; its absolute rates are moto's (a single Python process sharing this
machine's cores with the client), so the figures that carry over are the ratios inside one run.

Sections, each a table (and the JSON):
- ``clients``: the object-store clients dlpack could use, on the same objects: whole-object GETs
  (4 MiB) and 64 KiB ranged GETs, 1 and 4 requests in flight, obstore against s3fs.
- ``loader``: one store (``--count`` images at ``--side`` px, RGB, ``--shard-mb`` MiB shards) built
  once locally and uploaded; per row the median images/s of ``--repeat`` epochs:
  * ``raw fetch``: every shard object of the images array fetched whole with the same client and
    the same number of requests in flight as the loader's shard cache: the ceiling the loader can
    reach on this server;
  * the dlpack loader on the remote store, orders ``block`` (shard-aligned), ``sequential`` and
    ``random``, cold (shard cache emptied before the epoch) and warm (cache holding the store);
  * the same loader on the local store (warm page cache);
  and bytes fetched per byte used for each remote row.
- ``open``: the requests and seconds ``dlpack.open`` costs for a store of ``--open-shards`` shards.
- ``peers``: LitData and Mosaic Streaming reading the same images from the same server, where
  they are installed (``--peers``; benchmarks/peers-requirements.txt says how to install them).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the tests' loopback server helper

from _cpu import busy_cpu_s, own_cpu_s  # noqa: E402
from _s3 import client_env, running_server  # noqa: E402


def _median_rate(run: Callable[[], int], repeat: int) -> tuple[float, list[float], float]:
    """(median units/s, every rate, share of the CPUs other processes used) of ``repeat`` runs."""
    rates, others = [], []
    for _ in range(repeat):
        busy0, own0, t0 = busy_cpu_s(), own_cpu_s(), time.perf_counter()
        units = run()
        dt = time.perf_counter() - t0
        busy1, own1 = busy_cpu_s(), own_cpu_s()
        rates.append(units / dt)
        if busy0 is not None and busy1 is not None:
            others.append(max(0.0, (busy1 - busy0) - (own1 - own0)) / (dt * (os.cpu_count() or 1)))
    return statistics.median(rates), rates, statistics.median(others) if others else float("nan")


# ------------------------------------------------------------------------------------------ clients


def clients_section(endpoint: str, bucket: str, repeat: int, quick: bool) -> list[dict[str, Any]]:
    """Whole-object and ranged GETs through obstore and s3fs, on the same objects of the same server."""
    from dlpack.storage.location import Location
    from dlpack.storage.objects import ObjectStorage

    n_obj = 4 if quick else 16
    size = 4 * 2**20
    store = ObjectStorage(Location.parse(f"s3://{bucket}/clients"))
    payload = os.urandom(size)
    keys = [f"o{i:03d}" for i in range(n_obj)]
    for k in keys:
        store.put(k, payload)
    rows: list[dict[str, Any]] = []

    def obstore_whole(k: str) -> int:
        return len(store.get(k))

    def obstore_range(k: str, i: int) -> int:
        return len(store.get_range(k, (i * 65536) % (size - 65536), (i * 65536) % (size - 65536) + 65536))

    fs: Any = None
    try:
        import s3fs

        fs = s3fs.S3FileSystem(endpoint_url=endpoint, key=os.environ["AWS_ACCESS_KEY_ID"], secret=os.environ["AWS_SECRET_ACCESS_KEY"])
    except ImportError:
        pass

    def s3fs_whole(k: str) -> int:
        return len(fs.cat_file(f"{bucket}/clients/{k}"))

    def s3fs_range(k: str, i: int) -> int:
        a = (i * 65536) % (size - 65536)
        return len(fs.cat_file(f"{bucket}/clients/{k}", start=a, end=a + 65536))

    n_ranges = 64 if quick else 256
    for client, whole, ranged in (("obstore", obstore_whole, obstore_range), ("s3fs", s3fs_whole, s3fs_range)):
        if client == "s3fs" and fs is None:
            rows.append({"client": client, "note": "not installed"})
            continue
        for conc in (1, 4):
            with ThreadPoolExecutor(conc) as pool:

                def all_whole() -> int:
                    return sum(pool.map(whole, keys)) // 2**20

                def all_ranged() -> int:
                    return len(list(pool.map(ranged, [keys[i % n_obj] for i in range(n_ranges)], range(n_ranges))))

                all_whole()  # warm-up: connections open
                mbps, _, other_w = _median_rate(all_whole, repeat)
                rps, _, other_r = _median_rate(all_ranged, repeat)
            rows.append(
                {
                    "client": client,
                    "in_flight": conc,
                    "whole_MiB_s": round(mbps, 1),
                    "ranged_64k_req_s": round(rps, 1),
                    "other_cpu": round(max(other_w, other_r), 2),
                }
            )
    store.delete(keys)
    return rows


# ------------------------------------------------------------------------------------------ main


def machine() -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
        "processor": platform.processor() or "",
        "load_avg": os.getloadavg(),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--work", type=Path, default=None)
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--sections", default="clients,loader,open,peers")
    p.add_argument("--count", type=int, default=4096)
    p.add_argument("--side", type=int, default=128)
    p.add_argument("--shard-mb", type=float, default=4.0)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--open-shards", type=int, default=3000)
    a = p.parse_args(argv)
    if a.quick:
        a.count, a.open_shards, a.repeat = 512, 300, 2
    work = a.work or Path(tempfile.mkdtemp(prefix="dlpack-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    sections = [s.strip() for s in a.sections.split(",") if s.strip()]
    out: dict[str, Any] = {"machine": machine(), "args": {k: str(v) for k, v in vars(a).items()}}
    with running_server() as server:
        os.environ.update(client_env(server.endpoint))
        if "clients" in sections:
            bucket = server.new_bucket("clients")
            out["clients"] = clients_section(server.endpoint, bucket, a.repeat, a.quick)
            _print_rows("clients", out["clients"])
        for name in ("loader", "open", "peers"):
            if name in sections and name in SECTIONS:
                out[name] = SECTIONS[name](server, work, a)
                _print_rows(name, out[name])
    if a.json:
        a.json.write_text(json.dumps(out, indent=2))
    return 0


def _print_rows(title: str, rows: list[dict[str, Any]]) -> None:
    print(f"\n## {title}")
    keys: list[str] = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    print(" | ".join(keys))
    for r in rows:
        print(" | ".join(str(r.get(k, "")) for k in keys))
    sys.stdout.flush()


#: The sections that need the reader and the loader (added below).
SECTIONS: dict[str, Callable[[Any, Path, argparse.Namespace], list[dict[str, Any]]]] = {}

if __name__ == "__main__":
    threading.excepthook = lambda args: None  # a server stopping under an idle keep-alive thread is not news
    raise SystemExit(main())
