"""Faults of a build on a Dask cluster (2 worker processes on 127.0.0.1, the loopback bucket): a
source in a bucket gives the local pool's bytes; a worker killed mid-build, a task run twice, the
scheduler or the build's process gone mid-build, and a source object that cannot be read all end
as on this machine's pool: the same bytes, or a clear error that keeps the partial store to resume."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import _s3
import pytest
from test_dask_build import _bucket_files, _local_files, _shards

import dlpack
from dlpack import _parallel
from dlpack import pack as pack_mod
from dlpack.errors import BadInputsError, ClusterError
from dlpack.pack.write import _write_block_packed
from dlpack.storage.location import Location
from dlpack.storage.objects import ObjectStorage

distributed = pytest.importorskip("distributed", reason="the dask extra (distributed) is not installed")

MakeTree = Callable[..., Path]
#: 64x64 RGB images in 65536-byte shards: 5 images a shard.
SMALL = {f"c{k % 2}/{k:03d}.png": ("rgb", 64 + k % 5, 66 + k % 3) for k in range(20)}
#: 60 larger images (decoded and resized: a block takes a while) in 12 shards of 5 images.
MANY = {f"c{k % 3}/{k:03d}.png": ("rgb", 320, 240) for k in range(60)}
LAYOUT: dict[str, Any] = {"size": (64, 64), "shard_bytes": 65536}
JOURNAL = ".dlpack-journal/"
# The tests that kill a worker, the scheduler or the build's process start processes of their own
# (seconds each): marked slow; the others share the session's cluster and take about a second.


@pytest.fixture(autouse=True)
def _needs_s3() -> None:
    _s3.skip_without_s3()


def _options(s3: Any) -> dict[str, str]:
    """The storage options a worker gets (workers started before the test's AWS environment have none)."""
    env = _s3.client_env(s3.endpoint)
    return {
        "endpoint_url": s3.endpoint,
        "access_key_id": env["AWS_ACCESS_KEY_ID"],
        "secret_access_key": env["AWS_SECRET_ACCESS_KEY"],
        "region": env["AWS_REGION"],
    }


def _bucket_source(make_tree: MakeTree, s3: Any, spec: dict[str, Any], name: str = "raw") -> str:
    """``spec`` as a class-folder tree under ``s3://BUCKET/<name>/``."""
    _s3.upload(make_tree(spec, name), s3.url(name))
    return s3.url(name) + "/"


def _build(src: str, out: Path | str, s3: Any, **kw: Any) -> dlpack.BuildResult:
    return dlpack.build(src, out, quiet=True, storage_options=_options(s3), **LAYOUT, **kw)


def _keys(url: str, s3: Any) -> list[str]:
    return sorted(o.key for o in ObjectStorage(Location.parse(url, _options(s3))).list())


def _files_of(out: Path | str, s3: Any) -> dict[str, bytes]:
    return _local_files(out) if isinstance(out, Path) else _bucket_files(out, _options(s3))


def _shards_now(out: Path | str, s3: Any) -> list[str]:
    """The shard files or objects a build has written so far (its partial folder, for a local OUT)."""
    if isinstance(out, Path):
        return [p.name for part in out.parent.glob(f".{out.name}*") for p in part.glob("images/c/*/0/0/0")]
    return [k for k in _keys(out, s3) if k.startswith("images/c/")]


def _own_cluster() -> Any:
    return distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None
    )


class _When(threading.Thread):
    """Polls ``ready()`` every few milliseconds; once true, runs ``act()`` once and keeps its value (``done``)."""

    def __init__(self, ready: Callable[[], bool], act: Callable[[], Any], timeout: float = 60) -> None:
        super().__init__(daemon=True)
        self.ready, self.act, self.timeout = ready, act, timeout
        self.done: Any = None
        self.fired = threading.Event()

    def run(self) -> None:
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            try:
                if self.ready():
                    self.done = self.act()
                    self.fired.set()
                    return
            except Exception:  # a listing while the build makes the folder: try again
                pass
            time.sleep(0.01)


# ---------------------------------------------------------------- 1. a source in a bucket


@pytest.mark.parametrize("where", ["folder", "bucket"])
def test_a_bucket_source_on_a_dask_cluster_writes_the_local_pools_bytes(
    make_tree: MakeTree, tmp_path: Path, s3: Any, dask_cluster: Any, where: str
) -> None:
    src = _bucket_source(make_tree, s3, SMALL)
    local: Path | str = tmp_path / "local.zarr" if where == "folder" else s3.url("local.zarr")
    dask: Path | str = tmp_path / "dask.zarr" if where == "folder" else s3.url("dask.zarr")
    _build(src, local, s3, jobs=1)
    result = _build(src, dask, s3, scheduler=dask_cluster.scheduler_address)
    expected = _files_of(local, s3)
    assert result.count == len(SMALL) and len(_shards(expected)) >= 3
    assert _files_of(dask, s3) == expected


# ---------------------------------------------------------------- 2. a worker killed mid-build


@pytest.mark.slow
def test_a_worker_killed_mid_build_still_writes_the_local_builds_bytes(
    make_tree: MakeTree, tmp_path: Path, s3: Any
) -> None:
    src = _bucket_source(make_tree, s3, MANY)
    out = s3.url("dask.zarr")
    with _own_cluster() as cluster, distributed.Client(cluster, set_as_default=False) as client:
        victim = next(iter(client.run(os.getpid).values()))

        def kill() -> int:
            os.kill(victim, signal.SIGKILL)
            return len(_shards_now(out, s3))

        watcher = _When(lambda: any(k.startswith(JOURNAL + "0") for k in _keys(out, s3)), kill)
        watcher.start()
        result = _build(src, out, s3, scheduler=cluster.scheduler_address)
        watcher.join(5)
        assert watcher.fired.is_set(), "the worker was not killed"
        # The kill landed mid-build: most shards were still to be written.
        assert 1 <= watcher.done < 12, watcher.done
        assert victim not in client.run(os.getpid).values()  # the nanny started a new worker
    _build(src, s3.url("local.zarr"), s3, jobs=1)
    expected = _bucket_files(s3.url("local.zarr"), _options(s3))
    assert result.count == len(MANY) and len(_shards(expected)) == 12
    assert _bucket_files(out, _options(s3)) == expected


# ---------------------------------------------------------------- 3. a task run twice


class _TwiceOnTheCluster:
    """The build's Dask pool, each block task submitted twice at once (``pure=False``, the same
    arguments) to the cluster's 2 workers: what a retry or a lost worker's rerun does. It keeps both
    results and the store's objects after both ran."""

    def __init__(self, inner: Any, url: str, s3: Any) -> None:
        self.inner, self.url, self.s3 = inner, url, s3
        self.n_jobs = inner.n_jobs
        self.runs: list[dict[str, Any]] = []

    def __enter__(self) -> _TwiceOnTheCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.inner.close()

    def pooled(self, n_calls: int) -> bool:
        return True

    def imap(self, calls: Iterable[Any], count: int) -> Iterator[Any]:
        client = self.inner.client()
        for fn, args, kw in calls:
            if fn is not _write_block_packed:  # the probe's tasks: once
                yield client.submit(fn, *args, pure=False, **kw).result()
                continue
            twice = [client.submit(fn, *args, pure=False, **kw) for _ in range(2)]
            first, second = client.gather(twice)
            storage = ObjectStorage(Location.parse(self.url, _options(self.s3)))
            objects = {o.key: o.etag for o in storage.list()}
            self.runs.append({"start": args[3], "first": first, "second": second, "objects": objects})
            yield second

    def progress(self, total: int, desc: str, quiet: bool, blocks: int) -> AbstractContextManager[Any]:
        return self.inner.progress(total, desc, quiet, blocks)


def test_a_block_task_run_twice_on_the_cluster_writes_one_shard_and_one_journal_object(
    make_tree: MakeTree, tmp_path: Path, s3: Any, dask_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = _bucket_source(make_tree, s3, SMALL)
    url = s3.url("twice.zarr")
    pools: list[_TwiceOnTheCluster] = []
    pool_for = _parallel.pool_for

    def twice(*args: Any, **kw: Any) -> _TwiceOnTheCluster:
        pools.append(_TwiceOnTheCluster(pool_for(*args, **kw), url, s3))
        return pools[-1]

    monkeypatch.setattr(_parallel, "pool_for", twice)
    _build(src, url, s3, scheduler=dask_cluster.scheduler_address)
    monkeypatch.setattr(_parallel, "pool_for", pool_for)
    runs = pools[0].runs
    assert [r["start"] for r in runs] == [0, 5, 10, 15]
    for run in runs:
        start = run["start"]
        (block1, counts1, landed1, journalled1), (block2, counts2, landed2, journalled2) = run["first"], run["second"]
        shard, key = f"images/c/{start // 5}/0/0/0", f"{JOURNAL}{start:012d}.json"
        assert journalled1 and journalled2
        # The same shard object (its ETag) and digest from both runs, as the bucket holds it.
        assert landed1 == landed2 and landed1["images"][start // 5].etag == run["objects"][shard]
        assert [r.record() for r in block1.samples()] == [r.record() for r in block2.samples()]
        assert counts1 is not None and counts1 == counts2
        # Exactly one journal object for the block.
        assert [k for k in run["objects"] if k.startswith(JOURNAL) and k.endswith(f"{start:012d}.json")] == [key]
    _build(src, s3.url("local.zarr"), s3, jobs=1)
    assert _bucket_files(url, _options(s3)) == _bucket_files(s3.url("local.zarr"), _options(s3))


# ---------------------------------------------------------------- 4. the scheduler or the client gone

#: 100 larger images in 20 shards of 5: long enough a build for a fault to land mid-way.
LONG = {f"c{k % 3}/{k:03d}.png": ("rgb", 320, 240) for k in range(100)}


def _cli(src: str, out: Path | str, s3: Any, scheduler: str) -> subprocess.Popen[str]:
    """``dlpack build`` of ``src`` into ``out`` on ``scheduler``, in a process of its own."""
    argv = ["build", src, str(out), "--size", "64x64", "--shard-bytes", "65536", "--quiet", "--scheduler", scheduler]
    argv += [f"--storage-option={k}={v}" for k, v in _options(s3).items()]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(dlpack.__file__).parents[1]), *sys.path])}
    return subprocess.Popen(
        [sys.executable, "-m", "dlpack", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )


def _resumes_to_the_local_build(src: str, out: Path | str, tmp_path: Path, s3: Any) -> None:
    """A rerun on this machine's pool resumes from the blocks journalled before the fault (the
    shards written without their journal line are written again), then the store equals the
    local build of the same source."""
    result = _build(src, out, s3, jobs=1)
    assert result.resume.startswith("resumed: "), result.resume
    done, of = (int(n) for n in result.resume.split()[1:4:2])
    assert of == 20 and 1 <= done < of, result.resume  # the fault landed mid-build
    local: Path | str = tmp_path / "local.zarr" if isinstance(out, Path) else s3.url("local.zarr")
    _build(src, local, s3, jobs=1)
    assert _files_of(out, s3) == _files_of(local, s3)


@pytest.mark.slow
@pytest.mark.parametrize("where", ["bucket", "folder"])
def test_the_scheduler_gone_mid_build_is_a_cluster_error_and_a_rerun_resumes(
    make_tree: MakeTree, tmp_path: Path, s3: Any, where: str
) -> None:
    src = _bucket_source(make_tree, s3, LONG)
    out: Path | str = s3.url("dask.zarr") if where == "bucket" else tmp_path / "dask.zarr"
    cluster = _own_cluster()
    try:
        address = cluster.scheduler_address
        closed: list[float] = []

        def close() -> int:
            written = len(_shards_now(out, s3))
            closed.append(time.monotonic())
            cluster.close()
            return written

        # 8 shards written: with at most 4 tasks in flight, the first blocks are landed and journalled
        # (at 3, a loaded machine once closed the scheduler before any block's journal line).
        watcher = _When(lambda: len(_shards_now(out, s3)) >= 8, close)
        watcher.start()
        if where == "bucket":  # the CLI: exit 2 and one line naming the scheduler, no traceback
            proc = _cli(src, out, s3, address)
            _, err = proc.communicate(timeout=120)
            assert proc.returncode == 2, err
            lines = err.strip().splitlines()
            assert len(lines) == 1 and address in lines[0] and "Traceback" not in err, err
            assert "resumes" in lines[0]
        else:  # the library: a ClusterError naming it
            with pytest.raises(ClusterError, match=address):
                _build(src, out, s3, scheduler=address)
        failed = time.monotonic()
        watcher.join(5)
        assert watcher.fired.is_set() and watcher.done < 20, watcher.done
        assert failed - closed[0] < 30  # within seconds of the scheduler's end
    finally:
        cluster.close()
    # The partial store is kept: its shards and journal.
    if where == "bucket":
        assert [k for k in _keys(out, s3) if k.startswith(JOURNAL)] and "manifest.json" not in _keys(out, s3)
    else:
        assert not out.exists() and list(tmp_path.glob(".dask.zarr*"))
    _resumes_to_the_local_build(src, out, tmp_path, s3)


@pytest.mark.slow
def test_the_build_process_killed_mid_build_reruns_on_the_same_cluster(
    make_tree: MakeTree, tmp_path: Path, s3: Any, dask_cluster: Any
) -> None:
    # A local OUT: a killed build's lease on a bucket OUT holds the store for a lease length.
    src = _bucket_source(make_tree, s3, LONG)
    out = tmp_path / "dask.zarr"
    proc = _cli(src, out, s3, dask_cluster.scheduler_address)

    def kill() -> int:
        proc.kill()
        return len(_shards_now(out, s3))

    # 8 shards written: with at most 4 tasks in flight, the first blocks are landed and journalled.
    watcher = _When(lambda: len(_shards_now(out, s3)) >= 8, kill)
    watcher.start()
    proc.communicate(timeout=120)
    watcher.join(5)
    assert watcher.fired.is_set() and proc.returncode == -signal.SIGKILL
    assert watcher.done < 20 and not out.exists()
    # The rerun on the same cluster resumes from the killed build's blocks.
    result = _build(src, out, s3, scheduler=dask_cluster.scheduler_address)
    assert result.resume.startswith("resumed: ") and 1 <= int(result.resume.split()[1]) < 20, result.resume
    with distributed.Client(dask_cluster.scheduler_address, set_as_default=False) as client:
        # Nothing of the killed client is left to run: no stray task writes after the commit.
        deadline = time.monotonic() + 10
        while client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks)) == 0
    _build(src, tmp_path / "local.zarr", s3, jobs=1)
    assert _local_files(out) == _local_files(tmp_path / "local.zarr")
    assert sorted(p.name for p in tmp_path.iterdir() if "dask" in p.name) == ["dask.zarr"]


# ---------------------------------------------------------------- 5. a source object that cannot be read

PNG = Path("c1/007.png")


@pytest.mark.parametrize("fault", ["corrupt", "deleted"])
def test_an_unreadable_source_object_on_the_cluster_is_named_or_skipped_as_locally(
    make_tree: MakeTree, tmp_path: Path, s3: Any, dask_cluster: Any, monkeypatch: pytest.MonkeyPatch, fault: str
) -> None:
    src = _bucket_source(make_tree, s3, SMALL)
    raw = ObjectStorage(Location.parse(src, _options(s3)))
    good = raw.get(PNG.as_posix())
    if fault == "corrupt":
        raw.put(PNG.as_posix(), good[:40] + b"\0" * 200)  # a PNG header, then garbage
    else:  # listed by the scan, gone before its first read
        scan_stage = pack_mod.scan_stage

        def scan_then_delete(source: Any) -> Any:
            scan = scan_stage(source)
            raw.delete([PNG.as_posix()])
            return scan

        monkeypatch.setattr(pack_mod, "scan_stage", scan_then_delete)
    errors = {}
    for run, kw in (("local", {"jobs": 1}), ("dask", {"scheduler": dask_cluster.scheduler_address})):
        if fault == "deleted":
            raw.put(PNG.as_posix(), good)
        with pytest.raises(BadInputsError) as caught:
            _build(src, tmp_path / f"{run}.zarr", s3, **kw)
        errors[run] = str(caught.value)
        assert not (tmp_path / f"{run}.zarr").exists()
    assert PNG.as_posix() in errors["dask"] and errors["dask"] == errors["local"]
    for run, kw in (("local", {"jobs": 1}), ("dask", {"scheduler": dask_cluster.scheduler_address})):
        if fault == "deleted":
            raw.put(PNG.as_posix(), good)
        result = _build(src, tmp_path / f"{run}-skip.zarr", s3, on_error="skip", **kw)
        assert result.count == len(SMALL) - 1 and [PNG.as_posix() in str(s) for s in result.skipped] == [True]
    assert _local_files(tmp_path / "dask-skip.zarr") == _local_files(tmp_path / "local-skip.zarr")
