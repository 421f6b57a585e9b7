"""A build and ``augment`` on a Dask cluster (``scheduler=``, ``--scheduler``) write exactly the bytes
of the same run on this machine's pool: every shard file, and the manifest apart from its times;
into a local folder and into the loopback bucket; a fixed-size store of several shards and a
variable-size one. A bad or unreachable scheduler is a clear error, at once."""

from __future__ import annotations

import re
import shutil
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _augment as aug
import pytest

import dlpack
from dlpack.cli import main
from dlpack.errors import ClusterError, OptionError
from dlpack.storage.location import Location
from dlpack.storage.objects import ObjectStorage

pytest.importorskip("distributed", reason="the dask extra (distributed) is not installed")

MakeTree = Callable[..., Path]
#: 64x64 RGB images in 65536-byte shards (the smallest): 5 images a shard, 24 images -> 5 shards.
N = 24
FIXED = {"size": (64, 64), "shard_bytes": 65536}
#: A variable-size store: the images' own sizes (about 13 kB each), several in a shard.
VARIABLE = {"shard_bytes": 65536}
#: A stored time (a build or update records when it ran) and the manifest's digest, which covers it.
_TIME = re.compile(rb'("(?:time|created|built)": ?\\?")[^"\\]*(\\?")')
_DIGEST = re.compile(rb'("manifest_sha256": ?\\?")[0-9a-f]{64}(\\?")')


def _normal(data: bytes) -> bytes:
    return _DIGEST.sub(rb"\1<digest>\2", _TIME.sub(rb"\1<time>\2", data))


def _shards(files: dict[str, bytes]) -> list[str]:
    """The image shard files of a fixed-size (``images``) or variable-size (``image_data``) store."""
    return [k for k in files if k.startswith(("images/c/", "image_data/c/"))]


def _local_files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): _normal(p.read_bytes()) for p in sorted(root.rglob("*")) if p.is_file()}


def _bucket_files(url: str, options: dict[str, str]) -> dict[str, bytes]:
    st = ObjectStorage(Location.parse(url, options))
    return {o.key: _normal(st.get(o.key)) for o in sorted(st.list(), key=lambda o: o.key)}


@pytest.fixture
def src(make_tree: MakeTree, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A source of N images of a few sizes in 2 classes; the test runs in tmp_path."""
    monkeypatch.chdir(tmp_path)
    return make_tree({f"c{k % 2}/{k:03d}.png": ("rgb", 64 + k % 5, 66 + k % 3) for k in range(N)})


def _build(src: Path, out: Path | str, layout: dict[str, Any], **kw: Any) -> dlpack.BuildResult:
    return dlpack.build(src, out, quiet=True, **layout, **kw)


@pytest.mark.parametrize("layout", [FIXED, VARIABLE], ids=["fixed", "variable"])
def test_a_build_on_a_dask_cluster_writes_the_local_builds_bytes(
    src: Path, tmp_path: Path, dask_cluster: Any, layout: dict[str, Any]
) -> None:
    _build(src, tmp_path / "jobs1.zarr", layout, jobs=1)
    _build(src, tmp_path / "jobs2.zarr", layout, jobs=2, force_jobs=True)
    result = _build(src, tmp_path / "dask.zarr", layout, scheduler=dask_cluster.scheduler_address)
    expected = _local_files(tmp_path / "jobs1.zarr")
    assert len(_shards(expected)) >= 2
    assert _local_files(tmp_path / "jobs2.zarr") == expected
    assert _local_files(tmp_path / "dask.zarr") == expected
    assert result.count == N
    # Nothing of the run is left beside OUT: no partial, journal, lock or visibility token.
    assert sorted(p.name for p in tmp_path.iterdir() if "dask" in p.name) == ["dask.zarr"]
    assert not list(tmp_path.glob(".dlpack-visible-*"))


@pytest.mark.parametrize(("layout", "workers"), [(FIXED, 1), (VARIABLE, 2)], ids=["fixed-1", "variable-2"])
def test_a_build_on_its_own_local_cluster_writes_the_local_builds_bytes(
    src: Path, tmp_path: Path, layout: dict[str, Any], workers: int
) -> None:
    _build(src, tmp_path / "local.zarr", layout, jobs=workers, force_jobs=True)
    _build(src, tmp_path / "dask.zarr", layout, jobs=workers, force_jobs=True, scheduler="local")
    assert _local_files(tmp_path / "dask.zarr") == _local_files(tmp_path / "local.zarr")


@pytest.mark.parametrize("layout", [FIXED, VARIABLE], ids=["fixed", "variable"])
def test_a_build_into_a_bucket_on_a_dask_cluster_writes_the_local_pools_bytes(
    src: Path, s3: Any, dask_cluster: Any, layout: dict[str, Any]
) -> None:
    # The workers were started before this test's AWS environment: they get the storage options only.
    import _s3

    env = _s3.client_env(s3.endpoint)
    options = {
        "endpoint_url": s3.endpoint,
        "access_key_id": env["AWS_ACCESS_KEY_ID"],
        "secret_access_key": env["AWS_SECRET_ACCESS_KEY"],
        "region": env["AWS_REGION"],
    }
    _build(src, s3.url("local.zarr"), layout, jobs=1, storage_options=options)
    _build(src, s3.url("dask.zarr"), layout, scheduler=dask_cluster.scheduler_address, storage_options=options)
    expected = _bucket_files(s3.url("local.zarr"), options)
    assert len(_shards(expected)) >= 2
    assert _bucket_files(s3.url("dask.zarr"), options) == expected


def test_augment_on_a_dask_cluster_writes_the_local_augments_bytes(
    make_tree: MakeTree, tmp_path: Path, dask_cluster: Any
) -> None:
    local = aug.classification_store(make_tree, tmp_path, "local.zarr")
    dask = tmp_path / "dask.zarr"
    shutil.copytree(local, dask)
    dlpack.augment(local, 2, aug.config(), seed=3, jobs=1, quiet=True)
    result = dlpack.augment(dask, 2, aug.config(), seed=3, quiet=True, scheduler=dask_cluster.scheduler_address)
    assert result.written == 2 * aug.N_IMAGES
    assert _local_files(dask) == _local_files(local)


def test_the_scheduler_flag_builds_on_the_cluster(src: Path, tmp_path: Path, dask_cluster: Any) -> None:
    _build(src, tmp_path / "api.zarr", FIXED, jobs=1)
    argv = ["build", str(src), str(tmp_path / "cli.zarr"), "--size", "64x64", "--shard-bytes", "65536", "--quiet"]
    assert main([*argv, "--scheduler", dask_cluster.scheduler_address]) == 0
    assert _local_files(tmp_path / "cli.zarr") == _local_files(tmp_path / "api.zarr")


@pytest.mark.parametrize("value", ["tcp://host", "http://127.0.0.1:8786", "tcp://127.0.0.1:99999", "", 8786])
def test_a_bad_scheduler_is_an_option_error(src: Path, tmp_path: Path, value: Any) -> None:
    with pytest.raises(OptionError, match="tcp://HOST:PORT"):
        _build(src, tmp_path / "out.zarr", FIXED, scheduler=value)
    assert not (tmp_path / "out.zarr").exists()


def test_a_bad_scheduler_flag_exits_2(src: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["build", str(src), str(tmp_path / "out.zarr"), "--scheduler", "dask://x:1"]) == 2
    assert "tcp://HOST:PORT" in capsys.readouterr().err


def test_an_unreachable_scheduler_is_a_cluster_error_naming_it_at_once(
    src: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        address = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    t0 = time.monotonic()
    with pytest.raises(ClusterError, match=re.escape(address)):
        _build(src, tmp_path / "out.zarr", FIXED, scheduler=address)
    assert main(["build", str(src), str(tmp_path / "out.zarr"), "--scheduler", address, "--quiet"]) == 2
    assert address in capsys.readouterr().err
    assert time.monotonic() - t0 < 40
    assert not (tmp_path / "out.zarr").exists()


def test_scheduler_with_update_is_refused(src: Path, tmp_path: Path) -> None:
    with pytest.raises(OptionError, match="--scheduler"):
        _build(src, tmp_path / "out.zarr", FIXED, update=True, scheduler="local")


def test_without_distributed_a_scheduler_says_how_to_install_it(
    src: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "distributed", None)  # import distributed fails, as when not installed
    with pytest.raises(OptionError, match=re.escape("pip install 'dlpack-datasets[dask]'")):
        _build(src, tmp_path / "out.zarr", FIXED, scheduler="local")
    with pytest.raises(OptionError, match=re.escape("pip install 'dlpack-datasets[dask]'")):
        dlpack.augment(tmp_path / "out.zarr", 2, aug.config(), scheduler="local")


def _released() -> tuple[bool, bool]:
    """On a worker: whether the running task is long-running (seceded) before and after release_slot."""
    from distributed import get_worker

    from dlpack._dask import release_slot

    worker = get_worker()
    key = worker.get_current_task()

    def seceded() -> bool:
        return any(ts.key == key for ts in worker.state.long_running)

    before = seceded()
    release_slot()
    release_slot()  # a second call does nothing more
    deadline = time.monotonic() + 10  # the worker's event loop takes the secession in a moment
    while not seceded() and time.monotonic() < deadline:
        time.sleep(0.01)
    return before, seceded()


def test_a_task_waiting_on_its_writes_leaves_its_workers_slot(dask_cluster: Any) -> None:
    from dlpack._dask import DaskPool, release_slot

    release_slot()  # outside a Dask task: nothing to leave
    with DaskPool(dask_cluster.scheduler_address, 2) as pool:
        assert list(pool.imap([(_released, (), {})], 1)) == [(False, True)]
