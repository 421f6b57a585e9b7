"""The journal of a build into an object store is written by the block tasks: each pooled task PUTs
its block's journal object right after its shard, the build's process PUTs none per block; a task
run twice writes the same objects; a failed build resumes from the objects the tasks wrote."""

from __future__ import annotations

import copyreg
import pickle
import re
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import _s3
import numpy as np
import pytest

import dlpack
from dlpack import _parallel
from dlpack.errors import StoreError
from dlpack.storage import site as site_mod
from dlpack.storage.location import Location
from dlpack.storage.objects import ObjectInfo, ObjectStorage

MakeTree = Callable[..., Path]
LocalPool = _parallel.LocalPool
#: 16x16 RGB images in 65536-byte shards: 85 images a shard; 200 images, 3 blocks.
SHARD = 65536
N = 200
BLOCK_KEY = re.compile(r"\.dlpack-journal/\d{12}\.json")


@pytest.fixture(autouse=True)
def _needs_s3() -> None:
    _s3.skip_without_s3()


@pytest.fixture
def src(make_tree: MakeTree, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return make_tree({f"c{k % 3}/{k:03d}.png": "rgb" for k in range(N)})


def _build(src: Path, out: str, jobs: int = 1, **kw: Any) -> dlpack.BuildResult:
    return dlpack.build(src, out, size=(16, 16), shard_bytes=SHARD, jobs=jobs, quiet=True, **kw)


def _storage(url: str) -> ObjectStorage:
    return ObjectStorage(Location.parse(url))


def _objects(url: str) -> dict[str, tuple[int, str]]:
    return {o.key: (o.size, o.etag) for o in _storage(url).list()}


def _equals_local(url: str, src: Path, tmp_path: Path) -> None:
    _build(src, str(tmp_path / "local.zarr"))
    with dlpack.open(url) as remote, dlpack.open(tmp_path / "local.zarr") as local:
        assert len(remote) == len(local) == N
        for i in range(N):
            assert np.array_equal(remote[i]["image"], local[i]["image"])
            assert remote[i]["label"] == local[i]["label"]
        assert remote.check().ok
    keys = _objects(url)
    assert "manifest.json" in keys and not [k for k in keys if k.startswith(".dlpack")]


class _Recording(ObjectStorage):
    """The real storage of the build's process, noting the key of each PUT it makes (``puts``) and
    failing the manifest's PUT when ``fail_manifest`` is set; it reaches a worker as a plain
    :class:`ObjectStorage` (what a worker does is not this process's)."""

    puts: list[str] = []
    fail_manifest = False

    def put(self, key: str, data: Any, *, create: bool = False, if_match: str | None = None) -> ObjectInfo:
        type(self).puts.append(key)
        if key == "manifest.json" and type(self).fail_manifest:
            raise StoreError("injected: the manifest's PUT failed")
        return super().put(key, data, create=create, if_match=if_match)

    def __reduce__(self) -> tuple[Any, ...]:
        return copyreg._reconstructor, (ObjectStorage, object, None), self.__getstate__()


@pytest.fixture
def recording(monkeypatch: pytest.MonkeyPatch) -> type[_Recording]:
    cls = type("Recording", (_Recording,), {"puts": [], "fail_manifest": False})
    monkeypatch.setattr(site_mod, "ObjectStorage", cls)
    return cls


class _TwiceInProcess:
    """A pool that runs every task twice in this process, each run on its own unpickled copy of the
    task's arguments (the writer among them): two workers given the same block, as a retry or a
    lost worker's rerun does. It notes each run's result and the store's objects after it."""

    n_jobs = 2

    def __init__(self, url: str) -> None:
        self.url = url
        self.runs: list[dict[str, Any]] = []

    def __enter__(self) -> _TwiceInProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def pooled(self, n_calls: int) -> bool:
        return True

    def imap(self, calls: Iterable[Any], count: int) -> Iterator[Any]:
        for fn, args, kw in calls:
            sent = pickle.dumps((args, kw))
            run: dict[str, Any] = {"start": args[3], "before": _objects(self.url), "args": pickle.loads(sent)[0]}
            for which in ("first", "second"):
                a, k = pickle.loads(sent)
                run[which] = fn(*a, **k)
                run[which + " objects"] = _objects(self.url)
                journal = f".dlpack-journal/{args[3]:012d}.json"
                run[which + " journal"] = _storage(self.url).get(journal)
            self.runs.append(run)
            yield run["second"]

    def progress(self, total: int, desc: str, quiet: bool, blocks: int) -> AbstractContextManager[Any]:
        return LocalPool(1).progress(total, desc, quiet, blocks)


def test_a_block_task_run_twice_writes_the_same_shard_and_one_journal_object(
    src: Path, tmp_path: Path, s3: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = s3.url("twice.zarr")
    pool = _TwiceInProcess(url)
    monkeypatch.setattr(_parallel, "LocalPool", lambda n_jobs: pool)
    _build(src, url, jobs=2)
    assert [r["start"] for r in pool.runs] == [0, 85, 170]
    for run in pool.runs:
        start, (block1, _, landed1, journalled1), (block2, _, landed2, journalled2) = (
            run["start"],
            run["first"],
            run["second"],
        )
        key = f".dlpack-journal/{start:012d}.json"
        shard = f"images/c/{start // 85}/0/0/0"
        assert key not in run["before"] and shard not in run["before"]  # written by the task, not before it
        assert journalled1 and journalled2
        # The same shard object (size, ETag) and rows digest; the same records.
        assert landed1 == landed2 and landed1["images"][start // 85].etag == run["first objects"][shard][1]
        assert run["first objects"][shard] == run["second objects"][shard]
        assert [r.record() for r in block1.samples()] == [r.record() for r in block2.samples()]
        # Exactly one journal object for the block, the same after both runs, and the body the
        # build's process would have PUT from what the task returned.
        journals = [k for k in run["second objects"] if k.startswith(".dlpack-journal/0")]
        assert [k for k in journals if k == key] == [key]
        assert run["first journal"] == run["second journal"]
        writer = run["args"][0]
        records = [r.record() for r in block2.samples()]
        assert site_mod.block_object(writer, start, records, landed2) == (key, run["second journal"])
    monkeypatch.setattr(_parallel, "LocalPool", LocalPool)
    _equals_local(url, src, tmp_path)


@pytest.mark.slow
def test_a_pooled_build_puts_no_journal_object_per_block_from_the_build_process(
    src: Path, tmp_path: Path, s3: Any, recording: type[_Recording]
) -> None:
    url = s3.url("pooled.zarr")
    _build(src, url, jobs=2)
    puts = recording.puts
    # This process wrote the journal's header and the manifest; the workers wrote every shard and
    # every block's journal object.
    assert ".dlpack-journal/header.json" in puts and "manifest.json" in puts
    assert not [k for k in puts if k.startswith("images/c/")]
    assert not [k for k in puts if BLOCK_KEY.fullmatch(k)]
    _equals_local(url, src, tmp_path)


@pytest.mark.slow
def test_a_failed_pooled_build_resumes_from_the_journal_objects_its_tasks_wrote(
    src: Path, tmp_path: Path, s3: Any, recording: type[_Recording]
) -> None:
    url = s3.url("x.zarr")
    recording.fail_manifest = True
    with pytest.raises(StoreError, match="injected"):
        _build(src, url, jobs=2)
    keys = _objects(url)
    written = sorted(k for k in keys if BLOCK_KEY.fullmatch(k))
    assert written == [f".dlpack-journal/{s:012d}.json" for s in (0, 85, 170)]
    assert not [k for k in recording.puts if BLOCK_KEY.fullmatch(k)]  # none of them by this process
    assert "manifest.json" not in keys
    recording.fail_manifest = False
    result = _build(src, url, jobs=2)
    assert result.resume == "resumed: 3 of 3 blocks already written"
    _equals_local(url, src, tmp_path)
