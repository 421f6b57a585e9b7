"""A new per-sample array added to a built store by one backend-agnostic call, then read back
through ``ds[i]``, ``get_batch`` and the loader, on every backend."""

from __future__ import annotations

import errno
import itertools
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import dlpack
from dlpack import ArraySpec, Dataset
from dlpack.errors import OptionError, SampleIndexError, StoreError, StoreExistsError, StoreLockedError

TREE = {f"{c}/{k}.png": "rgb" for c in ("ok", "bad") for k in range(5)}


@pytest.fixture
def store(make_tree: Callable[..., Path], tmp_path: Path, backend: str) -> Path:
    out = tmp_path / backend
    dlpack.build(make_tree(TREE), out, size=(16, 12), quiet=True, jobs=1, shard_bytes=2**16)
    return out


def _weights(n: int) -> np.ndarray:
    return np.linspace(0.5, 2.0, n).astype(np.float32)


def _boxes(n: int) -> list[np.ndarray]:
    return [np.full((i % 3, 4), i, dtype=np.float32) for i in range(n)]


def test_added_arrays_appear_in_samples_batches_and_the_loader(store: Path) -> None:
    n = len(dlpack.open(store))
    masks = np.stack([np.full((12, 16), i, dtype=np.uint8) for i in range(n)])
    dlpack.add_array(store, "weights", _weights(n), key="weight")
    dlpack.add_array(store, "masks", masks, key="mask")
    dlpack.add_array(store, "boxes", _boxes(n), ragged=True)

    with dlpack.open(store) as ds:
        s = ds[3]
        assert s["weight"] == pytest.approx(_weights(n)[3])
        assert np.array_equal(s["mask"], masks[3])
        assert np.array_equal(s["boxes"], _boxes(n)[3])
        assert {"image", "label", "index", "source"} <= set(s)

        batch = ds.get_batch([4, 0, 4])
        assert np.array_equal(batch["weight"], _weights(n)[[4, 0, 4]])
        assert np.array_equal(batch["mask"], masks[[4, 0, 4]])
        assert [b.shape[0] for b in batch["boxes"]] == [1, 0, 1]

        seen = {}
        for b in ds.loader(batch_size=3, shuffle=True, seed=1, workers=2, prefetch=2):
            for k, i in enumerate(b["index"].tolist()):
                seen[i] = (b["weight"][k], b["mask"][k], b["boxes"][k])
        assert sorted(seen) == list(range(n))
        for i, (w, m, bx) in seen.items():
            assert (
                w == pytest.approx(_weights(n)[i]) and np.array_equal(m, masks[i]) and np.array_equal(bx, _boxes(n)[i])
            )


def test_adding_keeps_everything_else_intact(store: Path) -> None:
    with dlpack.open(store) as ds:
        before = [ds[i] for i in range(len(ds))]
        fingerprint = ds.fingerprint()
    dlpack.add_array(store, "weights", _weights(len(before)))
    with dlpack.open(store) as ds:
        assert ds.fingerprint() == fingerprint
        assert ds.verify() == []
        for old, new in zip(before, (ds[i] for i in range(len(ds))), strict=True):
            assert np.array_equal(old["image"], new["image"])
            assert (old["label"], old["source"]) == (new["label"], new["source"])


def test_replacing_needs_consent_and_never_touches_images(store: Path) -> None:
    n = len(dlpack.open(store))
    dlpack.add_array(store, "weights", _weights(n))
    with pytest.raises(StoreExistsError, match="replace=True"):
        dlpack.add_array(store, "weights", _weights(n))
    dlpack.add_array(store, "weights", np.zeros(n, np.float32), replace=True)
    assert dlpack.open(store)[2]["weights"] == 0
    with pytest.raises(OptionError, match="cannot be replaced"):
        dlpack.add_array(store, "checksum", np.zeros(n, np.uint32), replace=True)


def test_wrong_length_and_taken_keys_are_refused(store: Path) -> None:
    n = len(dlpack.open(store))
    with pytest.raises(OptionError, match="samples"):
        dlpack.add_array(store, "weights", _weights(n + 1))
    with pytest.raises(OptionError, match="key"):
        dlpack.add_array(store, "extra", _weights(n), key="image")
    with pytest.raises(OptionError, match="key"):
        dlpack.add_array(store, "other_labels", _weights(n), key="label")


def test_sample_index_must_be_an_integer(store: Path) -> None:
    ds: Dataset = dlpack.open(store)
    assert ds[np.int64(1)]["index"] == 1
    with pytest.raises(SampleIndexError, match="integer"):
        ds[1.7]  # type: ignore[index]
    with pytest.raises(SampleIndexError, match="integers"):
        ds.get_batch(np.array([0.5, 1.0]))


# ---------------------------------------------------------------- one locked, checked, all-or-nothing step


def _files(store: Path) -> dict[str, bytes]:
    """Every file of a store (a Zarr folder, or an HDF5 file under '') and the dlpack siblings next to it."""
    found = {p.name: b"" for p in store.parent.iterdir() if p.name.startswith(f".{store.name}.dlpack-")}
    if store.is_file():
        return {"": store.read_bytes(), **found}
    return {p.relative_to(store).as_posix(): p.read_bytes() for p in sorted(store.rglob("*")) if p.is_file()} | found


def _bad_labels(store: Path, value: int) -> None:
    """Give every sample label ``value`` through the low-level writer, which does not check labels."""
    from dlpack.backends import open_reader, open_writer

    reader = open_reader(store)
    manifest, n = reader.manifest, len(reader)
    reader.close()
    writer = open_writer(store, "r+")
    writer.delete_array("labels")
    writer.create_array(manifest.arrays["labels"], n)
    writer.write_block("labels", 0, np.full(n, value, np.int32))
    writer.commit(manifest)


def test_labels_and_split_are_checked_against_the_classes_and_splits(
    make_tree: Callable[..., Path], tmp_path: Path, backend: str
) -> None:
    src = make_tree({f"{s}/{c}/{k}.png": "rgb" for s in ("train", "val") for c in ("a", "b") for k in range(2)})
    out = tmp_path / backend
    dlpack.build(src, out, size=(8, 6), quiet=True, jobs=1)
    n, before = 8, _files(out)
    with pytest.raises(OptionError, match=r"labels.*-1\.\.1.*2 classes.*sample 0 holds 7"):
        dlpack.add_array(out, "labels", np.full(n, 7, np.int32), replace=True)
    with pytest.raises(OptionError, match=r"split.*-1\.\.1.*2 splits.*train, val.*sample 3 holds 2"):
        dlpack.add_array(out, "split", np.array([0, 0, 1, 2, 0, 0, 0, 0]), replace=True)
    with pytest.raises(OptionError, match="integer codes"):
        dlpack.add_array(out, "labels", np.zeros(n, np.float32), replace=True)
    assert _files(out) == before
    dlpack.add_array(out, "labels", np.arange(n) % 2, replace=True)  # int64 codes in range: stored as <i4
    with dlpack.open(out) as ds:
        assert [ds[i]["label"] for i in range(n)] == [i % 2 for i in range(n)]
        assert ds.manifest.arrays["labels"].key == "label" and ds.manifest.arrays["labels"].dtype == "<i4"


@pytest.mark.parametrize("name", ["source_stat", "source_sha256", "transform", "original_size", "images", "source"])
def test_arrays_the_update_trusts_cannot_be_replaced(store: Path, name: str) -> None:
    before = _files(store)
    with pytest.raises(OptionError, match="cannot be replaced"):
        dlpack.add_array(store, name, np.zeros((10, 2), np.int64), replace=True)
    assert _files(store) == before


def test_a_store_whose_labels_are_out_of_range_can_be_repaired(store: Path) -> None:
    from dlpack.backends import open_reader

    _bad_labels(store, 7)
    with pytest.raises(StoreError, match="holds 7 at sample 0"):
        dlpack.open(store)
    with open_reader(store, check_labels=False) as reader:  # what a repair reads the store with
        assert reader.read_all("labels").tolist() == [7] * 10
    dlpack.add_array(store, "labels", np.zeros(10, np.int32), replace=True)
    with dlpack.open(store) as ds:
        assert ds.verify() == [] and [ds[i]["label"] for i in range(10)] == [0] * 10


def test_values_are_checked_before_anything_is_written(store: Path) -> None:
    n, before = 10, _files(store)
    cases: list[tuple[dict[str, Any], str]] = [
        ({"name": "w6", "values": np.zeros(n, np.complex64)}, "complex"),
        ({"name": "r2", "values": [np.zeros((1, 4 if i < 5 else 3), np.float32) for i in range(n)], "ragged": True},
         r"sample 5 has rows of shape \(3,\)"),
        ({"name": "r3", "values": [np.full((1, 2), 1.5 if i else 1, np.float32 if i else np.int64) for i in range(n)],
          "ragged": True}, "does not cast"),
        ({"name": "r4", "values": [np.zeros(2 if i < 5 else (2, 2), np.uint8) for i in range(n)], "ragged": True},
         "sample 5 has rows"),
        ({"name": "w7", "values": _weights(n), "key": ""}, "non-empty string"),
        ({"name": "w8", "values": [np.zeros(i) for i in range(n)]}, "ragged=True"),
        ({"name": "w9_data", "values": _weights(n)}, "ends in"),
    ]  # fmt: skip
    for kwargs, match in cases:
        with pytest.raises(OptionError, match=match):
            dlpack.add_array(store, **kwargs)
        assert _files(store) == before, kwargs["name"]
    spec = dlpack.add_array(store, "w6", _weights(n))  # the retry of a refused name just works
    assert spec.dtype == "<f4" and dlpack.open(store)[1]["w6"] == pytest.approx(_weights(n)[1])


def test_debris_of_killed_writers_is_removed_and_other_files_kept(store: Path, backend: str) -> None:
    from dlpack.backends import open_writer

    writer = open_writer(store, "r+")  # a writer that never committed: its array is "being written"
    writer.create_array(ArraySpec("junk", "<f4"), 10)
    writer.write_block("junk", 0, np.ones(10, np.float32))
    writer.abort()
    if backend.endswith(".zarr"):
        temp = next((store / "labels").rglob("c/*")).with_name(".0.4242.tmp")  # a shard write cut short
        temp.write_bytes(b"\0" * 8)
        (store / "NOTES.md").write_text("mine")
        (store / "notes").mkdir()
        (store / "notes" / ".0.1.tmp").write_text("also mine")  # not inside an array: not dlpack's
    dlpack.add_array(store, "junk", np.zeros(10, np.float32))
    with dlpack.open(store) as ds:
        assert ds.verify() == [] and ds[3]["junk"] == 0
    if backend.endswith(".zarr"):
        assert not temp.exists()
        assert (store / "NOTES.md").read_text() == "mine" and (store / "notes" / ".0.1.tmp").read_text() == "also mine"
    else:
        import h5py

        with h5py.File(store, "r") as f:
            assert sorted(n for n in f if n.startswith("dlpack_")) == []


# ---------------------------------------------------------------- concurrent calls

_RACER = """
import os, sys, time
import numpy as np
import dlpack
from dlpack.backends.writer import StoreWriter

commit = StoreWriter.commit

def slow_commit(self, manifest):
    time.sleep(0.5)  # widen the time between reading the store's manifest and writing the new one
    commit(self, manifest)

StoreWriter.commit = slow_commit
store, name, go = sys.argv[1:]
while not os.path.exists(go):
    time.sleep(0.005)
dlpack.add_array(store, name, np.full(10, len(name), np.float32))
"""


@pytest.mark.slow
def test_two_add_arrays_at_once_keep_both_arrays(store: Path, tmp_path: Path) -> None:
    go = tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    procs = [
        subprocess.Popen([sys.executable, "-c", _RACER, str(store), name, str(go)], env=env, stderr=subprocess.PIPE)
        for name in ("aaa", "bbbb")
    ]
    time.sleep(0.3)
    go.touch()
    for p in procs:
        _, err = p.communicate(timeout=60)
        assert p.returncode == 0, err.decode()
    with dlpack.open(store) as ds:
        assert {"aaa", "bbbb"} <= set(ds.manifest.arrays)
        assert (ds[0]["aaa"], ds[0]["bbbb"]) == (3, 4) and ds.verify() == []


@pytest.mark.slow
def test_add_array_waits_for_the_lock_then_refuses_naming_the_holder(store: Path) -> None:
    from dlpack.storage.lock import BuildLock

    lock = BuildLock(store)
    lock.acquire()
    try:
        with pytest.raises(StoreLockedError, match=rf"waited 0.2 s.*pid {os.getpid()}"):
            dlpack.add_array(store, "w", _weights(10), lock_timeout=0.2)
        timer = threading.Timer(0.3, lock.release)
        timer.start()
        dlpack.add_array(store, "w", _weights(10), lock_timeout=30)  # waits until the lock is free
        timer.join()
    finally:
        lock.release()
    assert dlpack.open(store)[0]["w"] == pytest.approx(0.5)


# ---------------------------------------------------------------- kills and a full disk

ACTIONS: dict[str, Callable[[Path], Any]] = {
    "replace": lambda s: dlpack.add_array(s, "w", np.arange(10, dtype=np.float32), replace=True),
    "ragged": lambda s: dlpack.add_array(s, "boxes", _boxes(10), ragged=True),
}


def _prepared(store: Path, tmp_path: Path, action: str) -> tuple[Path, Path]:
    """Give the store an array ``w`` of ones and save a copy of it; return the copy and a reference
    copy on which ``action`` ran uninterrupted."""
    dlpack.add_array(store, "w", np.ones(10, np.float32))
    copies = []
    for folder in ("saved", "ref"):
        (tmp_path / folder).mkdir()
        copy = tmp_path / folder / store.name
        (shutil.copytree if store.is_dir() else shutil.copy2)(store, copy)
        copies.append(copy)
    ACTIONS[action](copies[1])
    return copies[0], copies[1]


def _content(store: Path) -> dict[str, Any]:
    """What a store holds for its users: every array of every sample, and its manifest. An HDF5
    call killed between its two commits leaves the new array listed under a temporary name without
    a key (no sample shows it; the next call removes it), and so another generation."""
    with dlpack.open(store) as ds:
        assert ds.verify() == []
        staged = [n for n, spec in ds.manifest.arrays.items() if n.startswith("dlpack_")]
        assert all(ds.manifest.arrays[n].key is None for n in staged)
        names = [n for n in ds.manifest.arrays if n not in staged]
        arrays = {n: [ds.reader.read(n, i).tolist() for i in range(len(ds))] for n in names}
        manifest = ds.manifest.to_dict()
        manifest["arrays"] = {n: manifest["arrays"][n] for n in names}
        if staged:
            del manifest["generation"]
        return {"manifest": manifest, "arrays": arrays}


def _without_generation(content: dict[str, Any]) -> dict[str, Any]:
    return {**content, "manifest": {k: v for k, v in content["manifest"].items() if k != "generation"}}


def _killed_after(k: int, backend: str, action: Callable[[], Any]) -> bool:
    """Run ``action`` in a forked child that SIGKILLs itself right after its ``k``-th rename (Zarr)
    or HDF5 file close (when the HDF5 library writes the file); True when it was killed."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            import importlib

            import dlpack.backends._hdf5 as h5

            publish = importlib.import_module("dlpack.storage.publish")

            calls = [0]

            def then_kill(fn: Callable[..., Any]) -> Callable[..., Any]:
                def wrapped(*args: Any, **kwargs: Any) -> Any:
                    result = fn(*args, **kwargs)
                    calls[0] += 1
                    if calls[0] == k:
                        os.kill(os.getpid(), signal.SIGKILL)
                    return result

                return wrapped

            if backend.endswith(".zarr"):
                os.replace = then_kill(os.replace)  # type: ignore[assignment]
                os.rename = then_kill(os.rename)  # type: ignore[assignment]
                publish._renameat2 = then_kill(publish._renameat2)  # type: ignore[assignment]
            else:
                h5.Hdf5Writer._close = then_kill(h5.Hdf5Writer._close)  # type: ignore[method-assign]
            action()
        except BaseException:
            import traceback

            traceback.print_exc()
            os._exit(1)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) or os.WEXITSTATUS(status) == 0, f"the child failed after {k} steps"
    return os.WIFSIGNALED(status)


@pytest.mark.slow
@pytest.mark.parametrize("action", sorted(ACTIONS))
def test_a_kill_at_any_step_leaves_the_old_or_the_new_store_and_the_rerun_succeeds(
    store: Path, tmp_path: Path, backend: str, action: str
) -> None:
    saved, ref = _prepared(store, tmp_path, action)
    old, new = _content(store), _content(ref)
    for k in itertools.count(1):
        killed = _killed_after(k, backend, lambda: ACTIONS[action](store))
        got = _content(store)  # the store opens and verifies after every kill
        assert got in (old, new) or _without_generation(got) in (_without_generation(old), _without_generation(new)), (
            f"killed after step {k}: neither the old nor the new store"
        )
        if _without_generation(got) == _without_generation(old) or action == "replace":
            ACTIONS[action](store)  # the rerun of the killed call
        else:  # killed after its switch: the next build or add_array clears what is left
            from dlpack.storage.lock import BuildLock
            from dlpack.storage.publish import clear_leftovers

            with BuildLock(store):
                clear_leftovers(store)
        assert _content(store) == new  # with the same generation, so no temporary array is left
        if backend.endswith(".zarr"):  # and nothing is left of the killed call: the same files as the reference
            assert _files(store) == _files(ref), f"killed after step {k}"
        if not killed:
            break
        shutil.rmtree(store) if store.is_dir() else store.unlink()
        (shutil.copytree if saved.is_dir() else shutil.copy2)(saved, store)
    assert k > 3, "the action was killed at every step it takes"


def _full_disk_at(monkeypatch: pytest.MonkeyPatch, backend: str, k: int) -> None:
    """Make the ``k``-th write step of an add_array fail as a full disk does (Zarr: every file
    created, linked, copied or renamed; HDF5: every free-space check before the library writes)."""
    import importlib

    import dlpack.backends._hdf5 as h5
    import dlpack.backends._zarr as zarr_backend

    calls = [0]

    def failing(fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            calls[0] += 1
            if calls[0] == k:
                if fn is h5.ensure_space:
                    raise StoreError(f"not enough free space in {args[0]} (simulated)")
                raise OSError(errno.ENOSPC, "No space left on device (simulated)", str(args[0]))
            return fn(*args, **kwargs)

        return wrapped

    if backend.endswith(".zarr"):
        publish = importlib.import_module("dlpack.storage.publish")
        for owner, attr in [(os, "replace"), (os, "rename"), (os, "link"), (os, "mkdir"), (shutil, "copyfile"),
                            (Path, "write_text"), (publish, "_renameat2")]:  # fmt: skip
            monkeypatch.setattr(owner, attr, failing(getattr(owner, attr)))
        monkeypatch.setattr(zarr_backend, "open", failing(open), raising=False)  # shard files
    else:
        monkeypatch.setattr(h5, "ensure_space", failing(h5.ensure_space))


@pytest.mark.parametrize("action", sorted(ACTIONS))
def test_a_full_disk_at_any_write_leaves_the_store_as_it_was(
    store: Path, tmp_path: Path, backend: str, action: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, ref = _prepared(store, tmp_path, action)
    old, new = _content(store), _content(ref)
    files = _files(store)
    for k in itertools.count(1):
        with monkeypatch.context() as m:
            _full_disk_at(m, backend, k)
            try:
                ACTIONS[action](store)
            except StoreError as exc:
                said = ("No space", "free space", "the disk is full")
                assert str(store) in str(exc) and any(text in str(exc) for text in said)  # noqa: PT017 - the call may also succeed
                failed = True
            else:
                failed = False
        if not failed:
            break
        assert _content(store) == old, f"a full disk at write {k} changed the store"
        if backend.endswith(".zarr"):
            assert _files(store) == files, f"a full disk at write {k} left files behind"
    assert k > 3 and _content(store) == new


@pytest.mark.slow
def test_a_real_full_disk_leaves_the_store_readable(make_tree: Callable[..., Path], tmp_path: Path) -> None:
    """On a small tmpfs (needs the right to mount), an add_array at every few KiB of free space."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        saved = tmp_path / "saved.zarr"
        dlpack.build(make_tree(TREE), saved, size=(16, 12), quiet=True, jobs=1, shard_bytes=2**16)
        for k in range(12):  # a manifest of several KiB, which a full disk could cut short
            dlpack.add_array(saved, f"extra_{k}", _weights(10))
        old = _content(saved)
        store, filler = mnt / "s.zarr", mnt / "filler"
        outcomes = set()
        for free_kib in range(0, 400, 12):
            filler.unlink(missing_ok=True)
            shutil.rmtree(store, ignore_errors=True)
            shutil.copytree(saved, store)
            st = os.statvfs(mnt)
            with open(filler, "wb") as f:
                f.write(b"\0" * max(0, st.f_bavail * st.f_frsize - free_kib * 1024))
            try:
                dlpack.add_array(store, "w", np.zeros((10, 64), np.float32), lock_timeout=1)
                outcomes.add("added")
            except StoreError as exc:
                assert str(store) in str(exc)  # noqa: PT017 - the call may also succeed
                outcomes.add("refused")
            filler.unlink()
            got = _content(store)
            if "w" in got["arrays"]:
                assert got["arrays"]["w"] == [[0.0] * 64] * 10
                del got["arrays"]["w"], got["manifest"]["arrays"]["w"]
                got["manifest"]["generation"] = old["manifest"]["generation"]
            assert got == old, f"{free_kib} KiB free"
        assert outcomes == {"added", "refused"}
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_store_reached_through_a_symlink_is_changed_where_it_lies(store: Path, tmp_path: Path) -> None:
    link = tmp_path / ("link" + store.suffix)
    link.symlink_to(store)
    dlpack.add_array(link, "w", _weights(10))
    assert link.is_symlink() and dlpack.open(store)[0]["w"] == pytest.approx(0.5)


def test_a_foreign_file_where_add_array_prepares_is_refused_and_kept(store: Path) -> None:
    if store.is_file():
        pytest.skip("an HDF5 store changes in place")
    stage = store.parent / f".{store.name}.dlpack-add"
    stage.mkdir()
    (stage / "mine.txt").write_text("keep me")
    with pytest.raises(StoreError, match="not dlpack's"):
        dlpack.add_array(store, "w", _weights(10))
    assert (stage / "mine.txt").read_text() == "keep me" and "w" not in dlpack.open(store).manifest.arrays
