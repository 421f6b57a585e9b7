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
- ``peers``: LitData and Mosaic Streaming reading the loader section's images (decoded to uint8
  arrays, chunks of about ``--shard-mb``) from their own format in a bucket of the same server,
  unshuffled, through a torch DataLoader (``--batch``, no workers, like the loader rows): cold (a
  new dataset on an empty local cache folder) and warm, median of ``--repeat`` epochs. A peer that
  is not installed is reported as such (benchmarks/peers-requirements.txt says how to install them:
  run this script with that venv's python, ``PYTHONPATH`` at the repository root); one that fails
  is reported with its error, and the run goes on.
- ``build``: build images/s of ``--build-count`` generated images (benchmarks/build.py's
  ``dlpack.sample`` source) on the local pool (``jobs`` 1, 2) and on a Dask ``LocalCluster`` of 1
  and 2 workers (started once, connected over tcp), into a local OUT and into the bucket; the
  Dask/local ratio, CPU per image (all processes, and the client's alone), workers' peak memory.
- ``source``: the same build from the local folder and from the tree in the bucket, the decode
  loop's read-ahead on (8) and off (0); and one GET, PUT and LIST at a time on the server.
- ``tasks``: ``--tasks`` trivial calls through the Dask pool's and the local pool's ``imap``, ms
  per task, and the round trip of one call.

    python benchmarks/scale.py --sections build,source,tasks --repeat 5 --json scale-dask.json
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
import warnings
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

        fs = s3fs.S3FileSystem(
            endpoint_url=endpoint, key=os.environ["AWS_ACCESS_KEY_ID"], secret=os.environ["AWS_SECRET_ACCESS_KEY"]
        )
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

                def all_whole(pool: Any = pool, whole: Any = whole) -> int:
                    return sum(pool.map(whole, keys)) // 2**20

                def all_ranged(pool: Any = pool, ranged: Any = ranged) -> int:
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
    p.add_argument("--build-count", type=int, default=3000, help="images of the build sections' source")
    p.add_argument("--build-image", type=int, default=256, help="their typical side, px (dlpack.sample)")
    p.add_argument("--build-side", type=int, default=128, help="the side they are resized to (fit)")
    p.add_argument("--build-shard-mb", type=float, default=4.0, help="shard size of the build sections' stores")
    p.add_argument("--tasks", type=int, default=500, help="trivial calls of the tasks section")
    a = p.parse_args(argv)
    os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", "warning")  # a LocalCluster's start and stop are not news
    warnings.filterwarnings("ignore", message="Port .* is already in use")
    if a.quick:
        a.count, a.open_shards, a.repeat = 512, 300, 2
        a.build_count, a.build_image, a.build_side, a.build_shard_mb, a.tasks = 24, 64, 32, 0.0625, 40
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
        for name in ("loader", "open", "peers", "build", "source", "tasks"):
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


# ------------------------------------------------------------------------------------------ loader


def _stores(server: Any, work: Path, a: argparse.Namespace) -> tuple[Path, str]:
    """The local store (built once, kept in ``work``) and the same store built into a new bucket."""
    from _images import make_pngs

    import dlpack

    tag = f"{a.count}-{a.side}-{a.shard_mb}"
    src, local = work / f"src-{tag}", work / f"local-{tag}.zarr"
    if not src.exists():
        make_pngs(src, a.count, a.side)
    opts = {"size": (a.side, a.side), "shard_bytes": int(a.shard_mb * 2**20), "quiet": True}
    if not local.exists():
        dlpack.build(src, local, **opts)
    url = f"s3://{server.new_bucket('loader')}/store.zarr"
    dlpack.build(src, url, **opts)
    return local, url


def _epoch(ds: Any, order: str, batch: int, epoch: int) -> int:
    n = 0
    loader = ds.loader(batch_size=batch, order=order, seed=1, drop_last=False)
    loader.set_epoch(epoch)
    for b in loader:
        n += len(b["image"])
    return n


def loader_section(server: Any, work: Path, a: argparse.Namespace) -> list[dict[str, Any]]:
    """Images/s of the loader on the remote store (cold, warm) and the local one, and the raw ceiling.

    Every arm runs one epoch per round, the arms' order rotated between rounds (so a slow phase of
    the machine or of the server hits every arm alike); figures are medians over ``--repeat`` rounds.
    """
    import dlpack
    from dlpack.storage.location import Location
    from dlpack.storage.objects import ObjectStorage
    from dlpack.storage.remote import DEFAULT_THREADS

    local, url = _stores(server, work, a)
    store = ObjectStorage(Location.parse(url))
    shards = sorted((o.key, o.size) for o in store.list("images/c/"))
    nbytes = sum(size for _, size in shards)
    local_ds = dlpack.open(local)
    n_images = len(local_ds)
    used = n_images * int(local_ds[0]["image"].nbytes)
    cold = dlpack.open(url, cache_bytes=4 * nbytes + 2**20)
    warm = dlpack.open(url, cache_bytes=4 * nbytes + 2**20)
    _epoch(warm, "sequential", a.batch, 0)  # fills its cache: the whole store fits
    for order in ("block", "sequential", "random"):
        _epoch(local_ds, order, a.batch, 0)  # page cache warm
    epoch = [0]

    def raw() -> int:
        with ThreadPoolExecutor(DEFAULT_THREADS) as pool:
            got = sum(pool.map(lambda k: len(store.get(k)), [k for k, _ in shards]))
        assert got == nbytes
        return n_images

    def loader_arm(ds: Any, order: str, clear: bool) -> Callable[[], int]:
        def run() -> int:
            if clear:
                ds._reader.cache.clear()
            epoch[0] += 1
            return _epoch(ds, order, a.batch, epoch[0])

        return run

    arms: list[tuple[str, Callable[[], int], Any]] = [(f"raw fetch ({DEFAULT_THREADS} in flight)", raw, None)]
    for order in ("block", "sequential", "random"):
        arms.append((f"remote {order} cold", loader_arm(cold, order, True), cold))
        arms.append((f"remote {order} warm", loader_arm(warm, order, False), warm))
        arms.append((f"local {order} (warm page cache)", loader_arm(local_ds, order, False), None))
    rates: dict[str, list[float]] = {name: [] for name, _, _ in arms}
    others: dict[str, list[float]] = {name: [] for name, _, _ in arms}
    fetched: dict[str, list[int]] = {name: [] for name, _, _ in arms}
    for r in range(a.repeat):
        for name, run, ds in arms[r % len(arms) :] + arms[: r % len(arms)]:
            before = ds._reader.cache.stats["fetched_bytes"] if ds is not None else 0
            rate, _, other = _median_rate(run, 1)
            rates[name].append(rate)
            others[name].append(other)
            if ds is not None:
                fetched[name].append(ds._reader.cache.stats["fetched_bytes"] - before)
    for ds in (cold, warm, local_ds):
        ds.close()
    med = {name: statistics.median(v) for name, v in rates.items()}
    ceiling = med[arms[0][0]]
    rows: list[dict[str, Any]] = []
    for name, _, _ds in arms:
        row: dict[str, Any] = {"row": name, "img_s": round(med[name]), "other_cpu": round(max(others[name]), 2)}
        if name.startswith("remote"):
            row["vs_raw"] = round(med[name] / ceiling, 2)
            row["fetched_per_used"] = round(statistics.median(fetched[name]) / used, 2)
            if name.endswith("warm"):
                order = name.split()[1]
                row["vs_local"] = round(med[name] / med[f"local {order} (warm page cache)"], 2)
        rows.append(row)
    rows.append({"row": "store", "images": n_images, "shards": len(shards), "MiB": round(nbytes / 2**20, 1)})
    return rows


def open_section(server: Any, work: Path, a: argparse.Namespace) -> list[dict[str, Any]]:
    """Requests and seconds of ``dlpack.open`` + one sample of a store of ``--open-shards`` shards."""
    from _images import make_pngs

    import dlpack

    src = work / f"open-src-{a.open_shards}-148"
    if not src.exists():
        make_pngs(src, a.open_shards, 148)
    url = f"s3://{server.new_bucket('open')}/store.zarr"
    # One 148x148x3 image (65,712 bytes) per shard of the smallest shard size (64 KiB).
    dlpack.build(src, url, size=(148, 148), shard_bytes=2**16, quiet=True)
    rows = []
    for _ in range(a.repeat):
        t0 = time.perf_counter()
        ds = dlpack.open(url)
        opened = time.perf_counter() - t0
        open_requests = sum(ds._reader.storage.requests.values())
        ds[len(ds) // 2]
        first = time.perf_counter() - t0
        total = dict(ds._reader.storage.requests)
        ds.close()
        rows.append(
            {
                "shards": a.open_shards,
                "open_requests": open_requests,
                "open_s": round(opened, 3),
                "open_plus_one_sample_requests": sum(total.values()),
                "open_plus_one_sample_s": round(first, 3),
                "by_kind": json.dumps(total),
            }
        )
    return rows


# ------------------------------------------------------------------------------------------ peers

#: Writes one peer's format of the PNG folder into a local folder. Run as a script of its own: LitData's
#: optimize() leaves state behind that slows its own loader in the same process, and its workers are
#: spawned, so they import the function they run from this file.
_PEER_WRITE = r"""
import sys
from pathlib import Path

import cv2


def item(f):
    img = cv2.cvtColor(cv2.imread(f, cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
    return {"image": img, "label": int(Path(f).parent.name.removeprefix("class"))}


def main(kind, src, out, chunk):
    files = sorted(str(p) for p in Path(src).rglob("*.png"))
    if kind == "litdata":
        from litdata import optimize

        optimize(fn=item, inputs=files, output_dir=out, chunk_bytes=int(chunk), num_workers=1, verbose=False)
    else:
        from streaming import MDSWriter

        side = item(files[0])["image"].shape[0]
        columns = {"image": f"ndarray:uint8:{side},{side},3", "label": "int"}
        with MDSWriter(out=out, columns=columns, size_limit=int(chunk)) as w:
            for f in files:
                w.write(item(f))


if __name__ == "__main__":
    main(*sys.argv[1:])
"""

#: Peer name -> the module its reader needs (all imported lazily: the peers are no dependencies).
PEERS = {"litdata": "litdata", "mosaic": "streaming"}


def _peer_epochs(peer: str, url: str, cache: Path, batch: int) -> tuple[Callable[[], int], Callable[[], None]]:
    """(one epoch through a torch DataLoader -> images read, close) of ``peer``'s streaming dataset on ``url``."""
    from torch.utils.data import DataLoader

    ds: Any
    if peer == "litdata":
        from litdata import StreamingDataset
        from litdata.streaming import downloader

        # LitData's obstore client refuses plain http, which the loopback server speaks.
        options = getattr(downloader, "_OBSTORE_CLIENT_OPTIONS", None)
        if isinstance(options, dict):
            options["allow_http"] = "true"
        ds = StreamingDataset(
            input_dir=url, cache_dir=str(cache), storage_options={"endpoint_url": os.environ["AWS_ENDPOINT_URL"]}
        )
    else:
        from streaming import StreamingDataset as MosaicDataset

        ds = MosaicDataset(remote=url, local=str(cache), shuffle=False, batch_size=batch)
    loader: Any = DataLoader(ds, batch_size=batch, num_workers=0)

    def epoch() -> int:
        return sum(len(b["image"]) for b in loader)

    def close() -> None:  # Mosaic holds its local folder in shared memory until the dataset is gone
        nonlocal ds, loader
        del ds, loader
        import gc

        gc.collect()

    return epoch, close


def _one_peer(peer: str, server: Any, work: Path, a: argparse.Namespace, src: Path) -> list[dict[str, Any]]:
    """Write ``peer``'s format of the PNG folder, upload it to a new bucket, read it cold and warm."""
    import shutil
    import subprocess

    from _s3 import upload

    tag = f"{a.count}-{a.side}-{a.shard_mb}"
    local = work / f"{peer}-{tag}"
    done = work / f"{peer}-{tag}.done"
    if not done.exists():
        shutil.rmtree(local, ignore_errors=True)
        script = work / "peer_write.py"
        script.write_text(_PEER_WRITE)
        chunk = str(int(a.shard_mb * 2**20))
        subprocess.run([sys.executable, str(script), peer, str(src), str(local), chunk], check=True)
        done.touch()
    url = f"s3://{server.new_bucket(peer)}/data"
    objects = upload(local, url)
    mib = sum(p.stat().st_size for p in local.rglob("*") if p.is_file()) / 2**20
    rows: list[dict[str, Any]] = []
    caches = work / f"{peer}-cache"
    shutil.rmtree(caches, ignore_errors=True)
    tries = [0]

    def cold() -> int:  # a new dataset on an empty cache folder: every chunk fetched
        tries[0] += 1
        epoch, close = _peer_epochs(peer, url, caches / f"cold-{tries[0]}", a.batch)
        try:
            return epoch()
        finally:
            close()

    rate, _, other = _median_rate(cold, a.repeat)
    rows.append({"row": f"{peer} block cold", "img_s": round(rate), "other_cpu": round(other, 2)})
    epoch, close = _peer_epochs(peer, url, caches / "warm", a.batch)
    n = epoch()  # fills the cache folder
    rate, _, other = _median_rate(epoch, a.repeat)
    close()
    rows.append({"row": f"{peer} block warm", "img_s": round(rate), "other_cpu": round(other, 2)})
    rows.append({"row": f"{peer} store", "images": n, "objects": objects, "MiB": round(mib, 1)})
    if n != a.count:
        rows[-1]["note"] = f"read {n} images of {a.count}"
    shutil.rmtree(caches, ignore_errors=True)
    return rows


def peers_section(server: Any, work: Path, a: argparse.Namespace) -> list[dict[str, Any]]:
    """Images/s of LitData and Mosaic Streaming (where installed) on the loader section's images."""
    import importlib

    from _images import make_pngs

    src = work / f"src-{a.count}-{a.side}-{a.shard_mb}"
    if not src.exists():
        make_pngs(src, a.count, a.side)
    os.environ["S3_ENDPOINT_URL"] = server.endpoint  # Mosaic's S3 client reads this one
    import warnings

    warnings.filterwarnings("ignore", message="The given NumPy array is not writable")  # Mosaic's arrays
    rows: list[dict[str, Any]] = []
    for peer, module in PEERS.items():
        try:
            importlib.import_module(module)
            importlib.import_module("torch")
        except ImportError:
            rows.append({"row": peer, "note": "not installed"})
            continue
        try:
            rows += _one_peer(peer, server, work, a, src)
        except Exception as exc:  # a peer that fails is reported; the run goes on
            line = f"{type(exc).__name__}: {exc}".strip().splitlines()[0][:300]
            rows.append({"row": peer, "note": f"failed: {line}"})
    return rows


# ------------------------------------------------------------------------------------------ build on Dask


def _build_source(work: Path, a: argparse.Namespace) -> Path:
    """The build sections' source: benchmarks/build.py's generated images (``dlpack.sample``)."""
    from dlpack.sample import make_sample

    src = work / f"sample-{a.build_count}-{a.build_image}-0"
    if not src.exists():
        make_sample(src, a.build_count, size=a.build_image, seed=0)
    return src


def _build_options(a: argparse.Namespace) -> dict[str, Any]:
    return {
        "size": (a.build_side, a.build_side),
        "resize": "fit",
        "shard_bytes": int(a.build_shard_mb * 2**20),
        "quiet": True,
        "overwrite": True,
    }


def _rotated(
    arms: list[tuple[str, Callable[[], int]]], repeat: int, tidy: Callable[[], None] = lambda: None
) -> tuple[dict[str, list[float]], dict[str, list[float]], dict[str, list[float]], dict[str, list[float]]]:
    """Every arm once per round, the order rotated each round: (rates, other processes' CPU share,
    CPU seconds per unit of this process and all below it, of this process alone) per arm; ``tidy``
    runs after each timed run, outside the timing."""
    rates: dict[str, list[float]] = {n: [] for n, _ in arms}
    others: dict[str, list[float]] = {n: [] for n, _ in arms}
    cpu: dict[str, list[float]] = {n: [] for n, _ in arms}
    main: dict[str, list[float]] = {n: [] for n, _ in arms}
    for r in range(repeat):
        for name, run in arms[r % len(arms) :] + arms[: r % len(arms)]:
            own0, t0, me0 = own_cpu_s(), time.perf_counter(), time.process_time()
            busy0 = busy_cpu_s()
            units = run()
            dt = time.perf_counter() - t0
            busy1, own1, me1 = busy_cpu_s(), own_cpu_s(), time.process_time()
            rates[name].append(units / dt)
            cpu[name].append((own1 - own0) / max(1, units))
            main[name].append((me1 - me0) / max(1, units))
            if busy0 is not None and busy1 is not None:
                others[name].append(max(0.0, (busy1 - busy0) - (own1 - own0)) / (dt * (os.cpu_count() or 1)))
            tidy()
    return rates, others, cpu, main


def _peak_rss_mib(client: Any) -> dict[str, float]:
    """Each worker process's peak resident memory so far (VmHWM of /proc/self/status), MiB."""

    def hwm() -> float:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    return {w: round(v, 1) for w, v in client.run(hwm).items()}


def build_section(server: Any, work: Path, a: argparse.Namespace) -> list[dict[str, Any]]:
    """Build images/s of the local pool (``jobs`` 1, 2) against a Dask cluster of 1 and 2 workers.

    Two LocalClusters (1 and 2 single-threaded worker processes on 127.0.0.1, as ``--scheduler local``
    starts them: ``dlpack._dask.local_cluster``) are started once
    for the section, outside the timings; each Dask build connects to one (``scheduler=tcp://...``).
    Each arm builds the same source into a local OUT and into a new prefix of a bucket; the arms'
    order is rotated every round, figures are medians of ``--repeat`` rounds after one untimed
    build per pool (workers started, imports done). CPU ms per image counts this process and every
    process below it (the workers, and the loopback server when OUT is in the bucket); the client's
    counts this process alone: the build's own work and, on Dask, the LocalCluster's scheduler,
    which runs in it (with ``jobs=1`` everything runs in it).
    """
    import shutil

    from distributed import Client

    import dlpack
    from dlpack._dask import local_cluster
    from dlpack.storage.location import Location
    from dlpack.storage.objects import ObjectStorage

    src = _build_source(work, a)
    opts = _build_options(a)
    n_images = len(dlpack.open(dlpack.build(src, work / "build-check.zarr", **opts).path))
    bucket = server.new_bucket("build")
    clusters = {w: local_cluster(w) for w in (1, 2)}
    count = [0]
    written: list[str] = []

    def tidy() -> None:  # the loopback server keeps objects in memory: each bucket OUT is deleted after its run
        while written:
            store = ObjectStorage(Location.parse(written.pop()))
            store.delete([o.key for o in store.list()])

    def arm(jobs: int, dask: bool, remote: bool) -> Callable[[], int]:
        def run() -> int:
            count[0] += 1
            if remote:
                out: Any = f"s3://{bucket}/b{count[0]:04d}.zarr"
                written.append(out)
            else:
                out = work / f"build-{jobs}-{int(dask)}.zarr"
                shutil.rmtree(out, ignore_errors=True)
            sched = clusters[jobs].scheduler_address if dask else None
            dlpack.build(src, out, jobs=jobs, scheduler=sched, **opts)
            return n_images

        return run

    try:
        arms = []
        for remote in (False, True):
            for dask in (False, True):
                for jobs in (1, 2):
                    pool = f"dask {jobs} worker{'s' if jobs > 1 else ''}" if dask else f"local jobs={jobs}"
                    arms.append((f"{pool} -> {'bucket' if remote else 'local'} OUT", arm(jobs, dask, remote)))
        for name, run in arms:
            if name.endswith("local OUT"):
                run()  # untimed: workers started, imports and page cache warm
        rates, others, cpu, main = _rotated(arms, a.repeat, tidy)
        rss = {w: _peak_rss_mib(Client(c, set_as_default=False)) for w, c in clusters.items()}
    finally:
        for c in clusters.values():
            c.close()
    med = {n: statistics.median(v) for n, v in rates.items()}
    rows: list[dict[str, Any]] = []
    for name, _ in arms:
        row: dict[str, Any] = {
            "row": name,
            "img_s": round(med[name], 1),
            "cpu_ms_per_img": round(1000 * statistics.median(cpu[name]), 2),
            "client_cpu_ms_per_img": round(1000 * statistics.median(main[name]), 3),
            "other_cpu": round(max(others[name]) if others[name] else float("nan"), 2),
            "rates": [round(x, 1) for x in rates[name]],
        }
        if name.startswith("dask"):
            jobs = int(name.split()[1])
            local = name.replace(name.split(" -> ")[0], f"local jobs={jobs}")
            row["vs_local"] = round(med[name] / med[local], 2)
        rows.append(row)
    for w, peaks in rss.items():
        rows.append({"row": f"dask {w} worker(s): peak RSS per worker, MiB", "rss": sorted(peaks.values())})
    rows.append(
        {
            "row": "source",
            "images": n_images,
            "image_px": a.build_image,
            "side": a.build_side,
            "shard_MiB": a.build_shard_mb,
        }
    )
    return rows


def source_section(server: Any, work: Path, a: argparse.Namespace) -> list[dict[str, Any]]:
    """A build from a local folder against the same tree in a bucket, with the decode loop's
    read-ahead on (``ahead=8``, the default) and off (``ahead=0``); local pool, local OUT. Also the
    loopback server's latency of one image GET and one shard-sized PUT (inputs of the scale estimate)."""
    import shutil

    from _s3 import upload

    import dlpack
    from dlpack.sources.remote import AHEAD, BucketFolderSource
    from dlpack.storage.location import Location
    from dlpack.storage.objects import ObjectStorage

    src = _build_source(work, a)
    opts = _build_options(a)
    n_images = len(dlpack.open(dlpack.build(src, work / "source-check.zarr", **opts).path))
    url = f"s3://{server.new_bucket('source')}/raw"
    upload(src, url)
    loc = Location.parse(url)

    def arm(jobs: int, ahead: int | None) -> Callable[[], int]:
        def run() -> int:
            out = work / f"source-{jobs}-{ahead}.zarr"
            shutil.rmtree(out, ignore_errors=True)
            source: Any = src if ahead is None else BucketFolderSource(loc, ahead=ahead)
            dlpack.build(source, out, jobs=jobs, **opts)
            return n_images

        return run

    arms = []
    for jobs in (1, 2):
        arms.append((f"local folder, jobs={jobs}", arm(jobs, None)))
        arms.append((f"bucket, ahead={AHEAD}, jobs={jobs}", arm(jobs, AHEAD)))
        arms.append((f"bucket, ahead=0, jobs={jobs}", arm(jobs, 0)))
    for _, run in arms:
        run()  # untimed warm-up
    rates, others, cpu, _ = _rotated(arms, a.repeat)
    med = {n: statistics.median(v) for n, v in rates.items()}
    rows: list[dict[str, Any]] = []
    for name, _ in arms:
        jobs = int(name.rsplit("=", 1)[1])
        rows.append(
            {
                "row": name,
                "img_s": round(med[name], 1),
                "vs_local_folder": round(med[name] / med[f"local folder, jobs={jobs}"], 2),
                "cpu_ms_per_img": round(1000 * statistics.median(cpu[name]), 2),
                "other_cpu": round(max(others[name]) if others[name] else float("nan"), 2),
            }
        )
    # One request at a time on the loopback server: an image GET, a shard-sized PUT, a LIST page.
    store = ObjectStorage(loc)
    keys = sorted(o.key for o in store.list())
    sizes = sorted(p.stat().st_size for p in src.rglob("*") if p.is_file())
    gets, puts, lists = [], [], []
    shard = os.urandom(int(a.build_shard_mb * 2**20))
    for k in keys[: 20 if a.quick else 200]:
        t0 = time.perf_counter()
        store.get(k)
        gets.append(time.perf_counter() - t0)
    for i in range(5 if a.quick else 20):
        t0 = time.perf_counter()
        store.put(f"put-probe/{i}", shard)
        puts.append(time.perf_counter() - t0)
    for _ in range(3 if a.quick else 10):
        t0 = time.perf_counter()
        sum(1 for _ in store.list())
        lists.append(time.perf_counter() - t0)
    rows.append(
        {
            "row": "loopback server, one request at a time",
            "get_image_ms": round(1000 * statistics.median(gets), 2),
            "image_KiB_median": round(sizes[len(sizes) // 2] / 1024, 1),
            "put_shard_ms": round(1000 * statistics.median(puts), 2),
            "shard_MiB": a.build_shard_mb,
            "list_all_ms": round(1000 * statistics.median(lists), 2),
            "objects_listed": len(keys),
        }
    )
    return rows


def tasks_section(server: Any, work: Path, a: argparse.Namespace) -> list[dict[str, Any]]:
    """The pool's cost per task: ``--tasks`` trivial calls through ``imap`` (a window of tasks in
    flight, results in order) on the Dask pool (a LocalCluster of 2 workers, connected over tcp) and
    the local pool (``jobs=2``, joblib's loky workers), ms per task; and the round trip of one call
    at a time (submit, run, result back)."""
    from dlpack._dask import DaskPool, local_cluster
    from dlpack._parallel import LocalPool

    n = a.tasks
    calls = [(abs, (-i,), {}) for i in range(n)]
    rows: list[dict[str, Any]] = []
    cluster = local_cluster(2)
    try:
        pools: list[tuple[str, Any]] = [
            ("local jobs=2", LocalPool(2)),
            ("dask 2 workers", DaskPool(cluster.scheduler_address, 2)),
        ]
        for name, pool in pools:
            with pool:
                list(pool.imap(calls[:4], 4))  # warm: workers up, client connected

                def many(pool: Any = pool) -> int:
                    assert list(pool.imap(calls, n)) == list(range(n))
                    return n

                def one(pool: Any = pool) -> int:
                    assert list(pool.imap(calls[1:2], 2)) == [1]  # count 2: the local pool sends it to a worker
                    return 1

                rate, _, other = _median_rate(many, a.repeat)
                trips = [1 / _median_rate(one, 1)[0] for _ in range(20 if a.quick else 100)]
                rows.append(
                    {
                        "row": name,
                        "tasks": n,
                        "ms_per_task": round(1000 / rate, 3),
                        "round_trip_ms": round(1000 * statistics.median(trips), 2),
                        "other_cpu": round(other, 2),
                    }
                )
    finally:
        cluster.close()
    return rows


SECTIONS: dict[str, Callable[[Any, Path, argparse.Namespace], list[dict[str, Any]]]] = {
    "loader": loader_section,
    "open": open_section,
    "peers": peers_section,
    "build": build_section,
    "source": source_section,
    "tasks": tasks_section,
}

if __name__ == "__main__":
    threading.excepthook = lambda args: None  # a server stopping under an idle keep-alive thread is not news
    raise SystemExit(main())
