"""Building a store into an object store (``s3://``), against the loopback server: the same arrays as
a local build, readable by plain zarr-python and tensorstore; the manifest last; the lease across
hosts; faults (the server gone, wrong credentials, a failed PUT) leave nothing that opens as
complete, and the rerun resumes; ``--overwrite`` deletes only a proven dlpack store, inside its prefix."""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _s3
import numpy as np
import pytest

import dlpack
from dlpack.cli import main
from dlpack.errors import OptionError, StoreError, StoreExistsError, StoreLockedError
from dlpack.storage import lease as lease_mod
from dlpack.storage import site as site_mod
from dlpack.storage.location import Location
from dlpack.storage.objects import ObjectInfo, ObjectStorage, StorageAccessError

MakeTree = Callable[..., Path]
#: Small shards: 16x16 RGB images, 65536-byte shards -> 85 images a shard; 200 images, 3 shards.
SHARD = 65536
N = 200


@pytest.fixture(autouse=True)
def _needs_s3() -> None:
    _s3.skip_without_s3()


@pytest.fixture
def src(make_tree: MakeTree, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder of images; the test runs in tmp_path (where a URL taken for a path would make ``s3:``)."""
    monkeypatch.chdir(tmp_path)
    return make_tree({f"c{k % 3}/{k:03d}.png": "rgb" for k in range(N)})


def _build(src: Path, out: str, **kw: Any) -> dlpack.BuildResult:
    return dlpack.build(src, out, size=(16, 16), shard_bytes=SHARD, jobs=1, quiet=True, **kw)


def _storage(url: str) -> ObjectStorage:
    return ObjectStorage(Location.parse(url))


def _keys(url: str) -> list[str]:
    return sorted(o.key for o in _storage(url).list())


def _zarr_group(endpoint: str, url: str) -> Any:
    """The store opened by plain zarr-python over obstore (not dlpack's code)."""
    import zarr
    from obstore.store import S3Store

    loc = Location.parse(url)
    raw = S3Store(
        loc.bucket,
        prefix=loc.key,
        endpoint=endpoint,
        access_key_id=_s3.KEY_ID,
        secret_access_key=_s3.SECRET,
        region="us-east-1",
        client_options={"allow_http": True},
    )
    return zarr.open_group(zarr.storage.ObjectStore(raw, read_only=True), mode="r")


def _complete(url: str) -> bool:
    """The rule of docs/format.md: manifest.json exists and its SHA-256 is the group marker's."""
    st = _storage(url)
    if st.head("manifest.json") is None:
        return False
    marker = json.loads(st.get("zarr.json"))["attributes"]["dlpack"]
    return bool(marker["manifest_sha256"] == hashlib.sha256(st.get("manifest.json")).hexdigest())


def test_a_build_into_s3_equals_a_local_build_in_zarr_python_and_tensorstore(
    src: Path, tmp_path: Path, s3: Any
) -> None:
    url = s3.url("x.zarr")
    result = _build(src, url)
    local = _build(src, str(tmp_path / "local.zarr"))
    assert result.count == local.count == N
    assert result.path == url  # the URL alone: storage options (secrets) never reach a result
    assert not any(p.name.startswith("s3") for p in tmp_path.iterdir())  # nothing local for a URL
    import zarr

    mine, theirs = _zarr_group(s3.endpoint, url), zarr.open_group(str(tmp_path / "local.zarr"), mode="r")
    assert sorted(mine.array_keys()) == sorted(theirs.array_keys())
    for name in theirs.array_keys():
        assert np.array_equal(mine[name][:], theirs[name][:]), name
    # Every uncompressed image shard is the local shard's bytes, one object at the standard key.
    st = _storage(url)
    for k in range(3):
        local_shard = (tmp_path / "local.zarr" / "images" / "c" / str(k) / "0" / "0" / "0").read_bytes()
        assert st.get(f"images/c/{k}/0/0/0") == local_shard
    assert _complete(url)
    # The lease and the journal are gone once the build ends.
    assert not [k for k in _keys(url) if k.startswith(".dlpack")]
    # The digests are taken shard by shard where each shard was written.
    manifest = json.loads(st.get("manifest.json"))
    assert manifest["arrays"]["images"]["sha256"]["images"].startswith("shards:")

    import tensorstore as ts

    loc = Location.parse(url)
    spec = {
        "driver": "zarr3",
        "kvstore": {
            "driver": "s3",
            "bucket": loc.bucket,
            "path": loc.key + "/images/",
            "endpoint": s3.endpoint,
            "aws_region": "us-east-1",
            "aws_credentials": {"type": "environment"},
        },
    }
    images = ts.open(spec, read=True).result().read().result()
    assert np.array_equal(images, theirs["images"][:])


@pytest.mark.parametrize(
    "kw", [{"compression": "lz4"}, {"compression": "zstd"}, {"resize": "none"}], ids=["lz4", "zstd", "variable"]
)
def test_compressed_and_variable_size_builds_into_s3_equal_local_ones(
    make_tree: MakeTree, tmp_path: Path, s3: Any, kw: dict[str, Any]
) -> None:
    src = make_tree({f"c{k % 2}/{k:02d}.png": ("rgb", 20 + k, 18 + k % 5) for k in range(40)})
    opts = {"shard_bytes": SHARD, "jobs": 2, "quiet": True, **kw}
    if "resize" not in kw:
        opts["size"] = (16, 16)
    url = s3.url("x.zarr")
    dlpack.build(src, url, **opts)
    dlpack.build(src, tmp_path / "local.zarr", **opts)
    import zarr

    mine, theirs = _zarr_group(s3.endpoint, url), zarr.open_group(str(tmp_path / "local.zarr"), mode="r")
    assert sorted(mine.array_keys()) == sorted(theirs.array_keys())
    for name in theirs.array_keys():
        assert np.array_equal(mine[name][:], theirs[name][:]), name
    assert _complete(url)


def test_the_cli_builds_into_s3_with_storage_options(src: Path, tmp_path: Path, s3: Any, monkeypatch: Any) -> None:
    monkeypatch.delenv("AWS_ENDPOINT_URL")  # given as an option instead
    url = s3.url("cli.zarr")
    argv = ["build", str(src), url, "--size", "16x16", "--jobs", "2", "--quiet", "--shard-bytes", str(SHARD)]
    assert main([*argv, "--storage-option", f"endpoint_url={s3.endpoint}"]) == 0
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.endpoint)  # for the check below
    assert _complete(url)
    assert not any(p.name.startswith("s3") for p in tmp_path.iterdir())
    assert main([*argv, "--storage-option", "endpont=x"]) == 2  # unknown key: refused before any request


# ------------------------------------------------------------------------------------------- lease


def test_a_second_build_while_the_lease_is_held_is_refused_naming_the_holder(src: Path, s3: Any) -> None:
    url = s3.url("x.zarr")
    held = lease_mod.Lease(_storage(url))
    held.acquire()
    try:
        with pytest.raises(StoreLockedError, match=rf"pid {os.getpid()}") as info:
            _build(src, url)
        assert "host" in str(info.value) and "since" in str(info.value)
    finally:
        held.release()
    assert _build(src, url).count == N  # released: the build runs


def test_an_expired_lease_is_taken_over(src: Path, s3: Any) -> None:
    url = s3.url("x.zarr")
    dead = lease_mod.Lease(_storage(url), seconds=0.5)
    dead.acquire()
    dead._stop.set()  # a build killed while holding it: no more renewals, never released
    time.sleep(0.7)
    assert _build(src, url).count == N
    assert _storage(url).head(lease_mod.LEASE_KEY) is None


def test_without_conditional_writes_a_build_warns_of_the_single_writer_rule(src: Path, s3: Any) -> None:
    url = s3.url("x.zarr")
    with pytest.warns(UserWarning, match="one writer at a time"):
        result = _build(src, url, storage_options={"conditional_writes": "false"})
    assert result.count == N and _storage(url).head(lease_mod.LEASE_KEY) is None
    held = lease_mod.Lease(_storage(url))
    held.acquire()
    try:  # a lease written plainly still refuses a build started while it is held
        with (
            pytest.warns(UserWarning, match="one writer"),
            pytest.raises(StoreLockedError, match=rf"pid {os.getpid()}"),
        ):
            _build(src, url, overwrite=True, storage_options={"conditional_writes": "false"})
    finally:
        held.release()


# ------------------------------------------------------------------------------------------ faults


class _Faulty(ObjectStorage):
    """The real storage, with a fault at one PUT: ``fault(key, n)`` is called before the n-th PUT of a
    shard object (n from 1) and before the manifest's (n 0); what it raises is raised."""

    fault: Callable[[str, int], None] = staticmethod(lambda key, n: None)
    shard_puts = 0

    def put(self, key: str, data: Any, *, create: bool = False, if_match: str | None = None) -> ObjectInfo:
        if "/c/" in key and key.startswith("images/"):
            type(self).shard_puts += 1
            type(self).fault(key, type(self).shard_puts)
        elif key == "manifest.json":
            type(self).fault(key, 0)
        return super().put(key, data, create=create, if_match=if_match)


@pytest.fixture
def faulty(monkeypatch: pytest.MonkeyPatch) -> type[_Faulty]:
    cls = type("Faulty", (_Faulty,), {"shard_puts": 0})
    monkeypatch.setattr(site_mod, "ObjectStorage", cls)
    return cls


def _fail_at(cls: type[_Faulty], which: int, exc: BaseException) -> None:
    def fault(key: str, n: int) -> None:
        if n == which:
            cls.fault = staticmethod(lambda key, n: None)  # once
            raise exc

    cls.fault = staticmethod(fault)


@pytest.mark.parametrize(
    ("at", "stop"),
    [
        (2, StoreError("injected: the PUT failed")),
        (0, StoreError("injected: the PUT failed")),
        (2, KeyboardInterrupt()),
    ],
    ids=["second-shard", "manifest", "ctrl-c"],
)
def test_a_failed_put_leaves_nothing_complete_and_the_rerun_resumes(
    src: Path, tmp_path: Path, s3: Any, faulty: type[_Faulty], at: int, stop: BaseException
) -> None:
    url = s3.url("x.zarr")
    _fail_at(faulty, at, stop)
    with pytest.raises(type(stop)):
        _build(src, url)
    keys = _keys(url)
    assert "manifest.json" not in keys and not _complete(url)
    if at:  # a shard failed: the group marker is still the one the build began with
        assert json.loads(_storage(url).get("zarr.json"))["attributes"]["dlpack"]["complete"] is False
    result = _build(src, url)
    kept = 1 if at == 2 else 3
    assert result.resume == f"resumed: {kept} of 3 blocks already written"
    _build(src, str(tmp_path / "local.zarr"))
    import zarr

    mine, theirs = _zarr_group(s3.endpoint, url), zarr.open_group(str(tmp_path / "local.zarr"), mode="r")
    for name in theirs.array_keys():
        assert np.array_equal(mine[name][:], theirs[name][:]), name
    assert _complete(url) and not [k for k in _keys(url) if k.startswith(".dlpack")]


def test_no_resume_starts_over(src: Path, s3: Any, faulty: type[_Faulty]) -> None:
    url = s3.url("x.zarr")
    _fail_at(faulty, 2, StoreError("injected"))
    with pytest.raises(StoreError):
        _build(src, url)
    result = _build(src, url, no_resume=True)
    assert result.resume == "started over: --no-resume" and _complete(url)


def test_the_server_stopping_mid_build_is_a_clear_error_within_seconds(
    src: Path,
    tmp_path: Path,
    faulty: type[_Faulty],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with _s3.running_server() as server:
        for k, v in _s3.client_env(server.endpoint).items():
            monkeypatch.setenv(k, v)
        bucket = server.new_bucket()
        faulty.fault = staticmethod(lambda key, n: server.stop() if n == 2 else None)
        t0 = time.monotonic()
        with pytest.raises(StorageAccessError, match=server.endpoint.replace(".", r"\.")):
            _build(src, f"s3://{bucket}/x.zarr")
        assert time.monotonic() - t0 < 60
        # The same through the CLI, the server gone: a store error's exit code, the endpoint named.
        t0 = time.monotonic()
        assert main(["build", str(src), f"s3://{bucket}/y.zarr", "--size", "16x16", "--quiet"]) == 2
        assert server.endpoint in capsys.readouterr().err
        assert time.monotonic() - t0 < 60
    assert not any(p.name.startswith("s3") for p in tmp_path.iterdir())


def test_wrong_credentials_are_a_clear_error_within_seconds(src: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with _s3.running_server(check_credentials=True) as server:
        for k, v in _s3.client_env(server.endpoint).items():
            monkeypatch.setenv(k, v)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAWRONGWRONGWRONG0")
        t0 = time.monotonic()
        with pytest.raises(StorageAccessError, match="refused the credentials"):
            _build(src, "s3://some-bucket/x.zarr")
        assert time.monotonic() - t0 < 30


# --------------------------------------------------------------------------------------- overwrite


def test_overwrite_replaces_only_a_dlpack_store_and_nothing_outside_its_prefix(src: Path, s3: Any) -> None:
    url = s3.url("x.zarr")
    _build(src, url)
    root = _storage(s3.url())
    root.put("x.zarr2/keep.txt", b"a sibling prefix")
    root.put("keep-root.txt", b"in the bucket root")
    with pytest.raises(StoreExistsError, match="overwrite"):
        _build(src, url)
    _storage(url).put("notes/user.txt", b"inside the store")
    result = _build(src, url, overwrite=True)
    assert result.count == N and _complete(url)
    assert root.get("x.zarr2/keep.txt") == b"a sibling prefix"
    assert root.get("keep-root.txt") == b"in the bucket root"
    assert "notes/user.txt" not in _keys(url)  # inside a proven dlpack store's prefix: replaced with it


def test_a_prefix_that_is_not_a_dlpack_store_is_refused_naming_what_is_there(src: Path, s3: Any) -> None:
    url = s3.url("x.zarr")
    _storage(url).put("data/part-0.parquet", b"someone else's")
    for overwrite in (False, True):
        with pytest.raises(StoreExistsError, match=r"not a dlpack store \(data/part-0.parquet\)"):
            _build(src, url, overwrite=overwrite)
    assert _keys(url) == ["data/part-0.parquet"]


# --------------------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (["--format", "hdf5"], "HDF5 stores are not written to an object store"),
        (["--update"], "build locally and upload"),
        (["--augment", "2", "--augment-config", "c.json"], "build locally and upload"),
        (["--format", "dldataset"], "dldataset writes a local folder"),
    ],
)
def test_what_a_build_into_s3_does_not_do_is_refused_with_exit_2(
    src: Path, tmp_path: Path, s3: Any, capsys: pytest.CaptureFixture[str], extra: list[str], match: str
) -> None:
    (tmp_path / "c.json").write_text(json.dumps({"mirror": "c"}), encoding="utf-8")
    assert main(["build", str(src), s3.url("x.zarr"), "--size", "16x16", *extra]) == 2
    assert match in capsys.readouterr().err
    assert _keys(s3.url("x.zarr")) == []
    assert not any(p.name.startswith("s3") for p in tmp_path.iterdir())


def test_an_h5_url_is_refused(src: Path, s3: Any) -> None:
    with pytest.raises(OptionError, match="HDF5"):
        _build(src, s3.url("x.h5"))


def test_storage_options_with_a_local_store_are_refused(src: Path, tmp_path: Path) -> None:
    with pytest.raises(OptionError, match="object-store URLs"):
        _build(src, str(tmp_path / "o.zarr"), storage_options={"region": "eu-west-1"})
    assert main(["info", str(tmp_path / "o.zarr"), "--storage-option", "region=x"]) == 2


def test_augment_and_add_array_into_s3_are_refused_saying_what_to_do(
    s3: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = s3.url("x.zarr")
    with pytest.raises(OptionError, match="build locally .*or build into a new prefix"):
        dlpack.augment(url, 2, "c.json")
    with pytest.raises(OptionError, match="add the array to a local build and upload the store"):
        dlpack.add_array(url, "w", np.zeros(6, np.float32))
    (tmp_path / "c.json").write_text(json.dumps({"mirror": "c"}), encoding="utf-8")
    assert main(["augment", url, "--augment", "2", "--augment-config", str(tmp_path / "c.json")]) == 2
    assert "build into a new prefix" in capsys.readouterr().err
    assert _keys(url) == []


def test_dlpack_open_of_a_store_built_into_s3_equals_the_local_store(src: Path, tmp_path: Path, s3: Any) -> None:
    url = s3.url("x.zarr")
    _build(src, url)
    _build(src, str(tmp_path / "local.zarr"))
    with dlpack.open(url) as remote, dlpack.open(tmp_path / "local.zarr") as local:
        assert len(remote) == len(local) == N
        for i in range(N):
            mine, theirs = remote[i], local[i]
            assert mine.keys() == theirs.keys()
            for key, value in theirs.items():
                assert np.array_equal(mine[key], value), (i, key)
        assert remote.check().ok  # every image against its checksum, by whole shards


def test_a_store_in_s3_exports_as_the_local_store_does(src: Path, tmp_path: Path, s3: Any) -> None:
    url = s3.url("x.zarr")
    _build(src, url)
    _build(src, str(tmp_path / "local.zarr"))
    assert main(["export", url, "--to", "folders", str(tmp_path / "from-s3")]) == 0
    assert main(["export", str(tmp_path / "local.zarr"), "--to", "folders", str(tmp_path / "from-local")]) == 0

    def files(root: Path) -> dict[str, bytes]:
        # The export's marker names its store (a URL or a path): everything else is the same bytes.
        return {
            p.relative_to(root).as_posix(): p.read_bytes()
            for p in root.rglob("*")
            if p.is_file() and "dlpack" not in p.name
        }

    remote, local = files(tmp_path / "from-s3"), files(tmp_path / "from-local")
    assert remote and remote == local
    assert not (tmp_path / "s3:").exists()


@pytest.mark.slow
def test_a_pooled_build_into_s3_equals_the_local_build(src: Path, tmp_path: Path, s3: Any) -> None:
    # Worker processes each write their blocks' shards; the driver's record of landed shards grows
    # while the pool pickles the next tasks' writer (it is left out of what a worker gets).
    url = s3.url("pooled.zarr")
    dlpack.build(src, url, size=(16, 16), shard_bytes=SHARD, jobs=2, quiet=True)
    _build(src, str(tmp_path / "local.zarr"))
    with dlpack.open(url) as remote, dlpack.open(tmp_path / "local.zarr") as local:
        assert len(remote) == len(local) == N
        for i in range(N):
            assert np.array_equal(remote[i]["image"], local[i]["image"])
        assert remote.check().ok
