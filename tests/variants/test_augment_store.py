"""Augmentation variants in a store (``dlpack augment``, ``build --augment``): what is written, that
it is the same for any ``--jobs``, that labels follow, and that a failed, killed or replaced run
never loses the store. One suite for both backends (the ``backend`` fixture)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _augment as aug
import numpy as np
import pytest

import dlpack
from dlpack.errors import OptionError, SampleIndexError, StoreExistsError, StoreLockedError
from dlpack.transforms.base import Targets, variant_rng

MakeTree = Callable[..., Path]
K = 3


def leftovers(out: Path) -> list[str]:
    return sorted(p.name for p in out.parent.glob(f".{out.name}.dlpack-*"))


def journal_lines(out: Path) -> list[dict[str, Any]]:
    try:
        text = (out.parent / f".{out.name}.dlpack-augment-journal").read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\n")]


@pytest.fixture
def store(make_tree: MakeTree, tmp_path: Path, backend: str) -> Path:
    """A detection store (boxes, box labels, crowd flags, a mask) of 40 images in 3 shard blocks."""
    return aug.detection_store(make_tree, tmp_path, backend)


def _copy(store: Path, to: Path) -> Path:
    to.parent.mkdir(parents=True, exist_ok=True)
    (shutil.copytree if store.is_dir() else shutil.copy2)(store, to)
    return to


# ---------------------------------------------------------------- what is written


def same_view(a: Targets, b: Targets) -> bool:
    return all(
        (x is None and y is None) or (x is not None and y is not None and np.array_equal(x, y))
        for x, y in ((a.image, b.image), (a.mask, b.mask), (a.boxes, b.boxes), (a.box_labels, b.box_labels),
                     (a.box_crowd, b.box_crowd))
    )  # fmt: skip


def expected_views(augmenter: Any, t: Targets, seed: int, i: int, k: int) -> list[tuple[Targets, Any]]:
    """The K variants of one sample by the documented rule, computed here: variant v is the first
    draw a (variant_rng(seed, i, v, a), a < MAX_ATTEMPTS) that equals neither the original nor an
    earlier variant, else draw 0."""
    from dlpack.variants.workers import MAX_ATTEMPTS

    seen, out = [t], []
    for v in range(1, k + 1):
        for a in range(MAX_ATTEMPTS):
            view, record = augmenter(t, variant_rng(seed, i, v, a))
            if not any(same_view(view, s) for s in seen):
                break
        else:
            view, record = augmenter(t, variant_rng(seed, i, v))
        seen.append(view)
        out.append((view, record))
    return out


@pytest.mark.parametrize("jobs", [1, 2])
def test_variants_are_a_pure_function_of_seed_index_variant_and_the_stored_original(
    store: Path, tmp_path: Path, jobs: int
) -> None:
    """Bit-identical for --jobs 1 and 2, and equal to recomputing variant_rng(seed, i, v) here."""
    other = _copy(store, tmp_path / "other" / store.name)
    cfg = aug.config()
    result = dlpack.augment(store, K, cfg, seed=7, jobs=jobs, quiet=True)
    assert (result.k, result.count, result.written, result.blocks) == (K, aug.N_IMAGES, K * aug.N_IMAGES, 3 * K)
    dlpack.augment(other, K, cfg, seed=7, jobs=3 - jobs, quiet=True)
    assert aug.content(store) == aug.content(other)
    with dlpack.open(store) as ds:
        assert ds.variants == K and ds.verify() == []
        fill = ds.manifest.mask_ignore
        flipped = 0
        for i in range(len(ds)):
            original = ds[i]
            t = Targets(
                original["image"],
                original["boxes"],
                original["box_labels"],
                original["box_crowd"],
                original["mask"],
                fill_mask=fill or 0,
            )
            views = expected_views(cfg.augmenter, t, 7, i, K)
            for v in range(1, K + 1):
                want, record = views[v - 1]
                got = ds.variant(i, v)
                assert np.array_equal(got["image"], want.image), (i, v)
                assert np.array_equal(got["mask"], want.mask), (i, v)
                assert np.array_equal(got["boxes"], want.boxes) and got["boxes"].dtype == np.float32
                assert np.array_equal(got["box_labels"], want.box_labels)
                assert np.array_equal(got["box_crowd"], want.box_crowd)
                assert ds.augmentation(i, v) == json.loads(json.dumps(record))
                assert (got["label"], got["source"], got["index"], got["variant"]) == (
                    original["label"], original["source"], i, v,
                )  # fmt: skip
                flipped += any(e["op"] == "TestStoreFlip" for e in record)
        assert 0 < flipped < K * len(ds)  # both kinds of variants occur


def test_boxes_masks_and_labels_follow_the_flip(store: Path) -> None:
    dlpack.augment(store, 2, aug.config(flip=1.0, brightness=0.0), jobs=1, quiet=True)
    with dlpack.open(store) as ds:
        w = aug.WIDTH
        seen_boxes = 0
        for i in range(len(ds)):
            original, variant = ds[i], ds.variant(i, 2)
            assert ds.augmentation(i, 2) == [{"op": "TestStoreFlip"}]
            assert np.array_equal(variant["image"], original["image"][:, ::-1])
            assert np.array_equal(variant["mask"], original["mask"][:, ::-1])
            b = original["boxes"]
            assert np.array_equal(variant["boxes"], np.stack([w - b[:, 2], b[:, 1], w - b[:, 0], b[:, 3]], axis=1))
            assert np.array_equal(variant["box_labels"], original["box_labels"])
            assert np.array_equal(variant["box_crowd"], original["box_crowd"])
            seen_boxes += len(b)
        assert seen_boxes > 20


def test_the_manifest_records_the_config_operations_k_seed_and_versions(store: Path) -> None:
    cfg = aug.config(flip=0.25)
    dlpack.augment(store, K, cfg, seed=3, jobs=1, quiet=True)
    with dlpack.open(store) as ds:
        rec = ds.manifest.augment
        assert rec is not None
        assert {k: rec[k] for k in ("format", "k", "seed", "engine", "fill_mask")} == {
            "format": 1, "k": K, "seed": 3, "engine": "dlpack", "fill_mask": ds.manifest.mask_ignore,
        }  # fmt: skip
        assert rec["config"] == cfg.manifest_record()  # the file's text verbatim
        assert rec["operations"] == json.loads(json.dumps(cfg.operations()))
        assert set(rec["versions"]) == {"dlpack", "numpy", "opencv"}
        names = {n for n in ds.manifest.arrays if "_v" in n}
        bases = ("images", "mask", "boxes", "box_labels", "box_crowd", "checksum", "augment")
        assert names == {f"{b}_v{v}" for b in bases for v in range(1, K + 1)}
        for name in names:  # no sample shows them: ds[i] and batches are the originals'
            assert ds.manifest.arrays[name].key is None
        assert set(ds[0]) == {"image", "label", "index", "source", "boxes", "box_labels", "box_crowd", "mask"}
        assert ds.reader.shard_len("images_v1") == ds.reader.shard_len("images")


def test_zarr_python_and_h5py_alone_read_a_variant(store: Path) -> None:
    """docs/format.md, "Augmentation variants": images_v{v} is [N, H, W, C], augment_v{v} JSON text."""
    dlpack.augment(store, 2, aug.config(), seed=1, jobs=1, quiet=True)
    with dlpack.open(store) as ds:
        want = [(ds.variant(i, 1)["image"], ds.augmentation(i, 1), ds.variant(i, 1)["boxes"]) for i in range(len(ds))]
    if store.is_dir():
        import zarr

        g = zarr.open_group(str(store), mode="r")
        images, data, off = g["images_v1"][:], g["augment_v1_data"][:], g["augment_v1_offsets"][:]
        boxes, boff = g["boxes_v1_data"][:], g["boxes_v1_offsets"][:]
        meta = json.loads((store / "manifest.json").read_text())
    else:
        import h5py

        with h5py.File(store, "r") as f:
            images, data, off = f["images_v1"][:], f["augment_v1_data"][:], f["augment_v1_offsets"][:]
            boxes, boff = f["boxes_v1_data"][:], f["boxes_v1_offsets"][:]
            meta = json.loads(f["manifest"][()])
    assert meta["augment"]["k"] == 2
    for i, (img, record, bx) in enumerate(want):
        assert np.array_equal(images[i], img)
        assert json.loads(bytes(data[off[i] : off[i + 1]]).decode("utf-8")) == record
        assert np.array_equal(boxes[boff[i] : boff[i + 1]], bx)


# ---------------------------------------------------------------- reading back


def test_variant_and_augmentation_of_the_original_and_out_of_range(store: Path) -> None:
    with dlpack.open(store) as ds:
        assert ds.variants == 0
        with pytest.raises(SampleIndexError, match="no augmentation variants"):
            ds.variant(0, 1)
        assert ds.variant(3, 0)["variant"] == 0
    dlpack.augment(store, 2, aug.config(), jobs=1, quiet=True)
    with dlpack.open(store) as ds:
        original, zero = ds[3], ds.variant(3, 0)
        assert zero.pop("variant") == 0
        assert set(zero) == set(original) and all(np.array_equal(zero[k], original[k]) for k in original)
        assert ds.augmentation(3, 0) == []
        assert ds.variant(-1, 2)["index"] == len(ds) - 1
        for bad in (3, -1):
            with pytest.raises(SampleIndexError, match=r"K=2 variants per image \(0 is the original\)"):
                ds.variant(0, bad)
        with pytest.raises(SampleIndexError, match="out of range"):
            ds.variant(len(ds), 1)


def test_verify_names_a_damaged_variant(store: Path) -> None:
    dlpack.augment(store, 2, aug.config(), jobs=1, quiet=True)
    with dlpack.open(store) as ds:
        assert ds.verify() == []
        pixel = ds.variant(5, 2)["image"][3, 4, 0]
    # One pixel of variant 2 of sample 5, changed behind dlpack's back (its checksums untouched).
    if store.is_dir():
        shard = store / "images_v2" / "c" / "0" / "0" / "0" / "0"
        data = bytearray(shard.read_bytes())
        at = 5 * aug.WIDTH * aug.HEIGHT * 3 + (3 * aug.WIDTH + 4) * 3
        data[at] = (data[at] + 1) % 256
        shard.write_bytes(bytes(data))
    else:
        import h5py

        with h5py.File(store, "r+") as f:
            f["images_v2"][5, 3, 4, 0] = (int(pixel) + 1) % 256
    report = dlpack.read.dataset.verify_store(store)
    assert report.mismatched == []  # every original is intact
    named = [(name, why) for name, why in report.damaged if name == "images_v2"]
    assert named and any("variant 2" in why and "5 (img/005.png)" in why for _, why in named), report.damaged
    assert not [name for name, _ in report.damaged if name and name.endswith("_v1")]
    from dlpack.cli import main

    assert main(["verify", str(store)]) == 4


def test_info_shows_the_variants(store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from dlpack.cli import main

    dlpack.augment(store, 2, aug.Config(aug.pipeline(), name="mine.json"), seed=5, jobs=1, quiet=True)
    assert main(["info", str(store)]) == 0
    assert "variants     2 per image (seed 5, engine dlpack, config mine.json)" in capsys.readouterr().out
    assert main(["info", str(store), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["augment"] == {
        "k": 2, "seed": 5, "engine": "dlpack", "config": "mine.json", "kind": "albumentations", "operations": 2,
    }  # fmt: skip


# ---------------------------------------------------------------- replace, refusals


def test_variants_are_replaced_only_when_asked(store: Path) -> None:
    dlpack.augment(store, 3, aug.config(), jobs=1, quiet=True)
    with pytest.raises(StoreExistsError, match=r"already has 3 augmentation variants per image; pass replace=True"):
        dlpack.augment(store, 3, aug.config(), seed=1, jobs=1, quiet=True)
    result = dlpack.augment(store, 1, aug.config(flip=1.0), jobs=1, quiet=True, replace=True)
    assert result.replaced == 3 and "replaced its 3 variants per image" in result.summary()
    with dlpack.open(store) as ds:
        assert ds.variants == 1 and ds.verify() == []
        assert sorted(n for n in ds.manifest.arrays if "_v" in n) == sorted(
            f"{b}_v1" for b in ("images", "mask", "boxes", "box_labels", "box_crowd", "checksum", "augment")
        )
        assert ds.augmentation(0, 1)[0]["op"] == "TestStoreFlip"
    assert leftovers(store) == []


def test_a_variable_size_store_is_refused(make_tree: MakeTree, tmp_path: Path) -> None:
    src = make_tree({"a/0.png": ("rgb", 40, 30), "a/1.png": ("rgb", 30, 40)})
    out = tmp_path / "var.zarr"
    dlpack.build(src, out, quiet=True, jobs=1)
    with pytest.raises(OptionError, match=r"variable-size images; .* rebuild it with --size WxH"):
        dlpack.augment(out, 2, aug.config(), jobs=1, quiet=True)
    aug.write_config(tmp_path / "c.json")
    with pytest.raises(OptionError, match="augment needs one stored size"):
        dlpack.build(src, tmp_path / "var2.zarr", augment=2, augment_config=str(tmp_path / "c.json"), quiet=True)
    assert not (tmp_path / "var2.zarr").exists()


def test_bad_arguments_are_refused_before_anything_is_written(store: Path, tmp_path: Path) -> None:
    before = aug.content(store)
    for kwargs, match in [
        ({"k": 0}, "integer >= 1"),
        ({"seed": -1}, "augment_seed"),
        ({"jobs": 0}, "jobs"),
        ({"engine": "torch"}, "augment_engine"),
        ({"config": tmp_path / "missing.json"}, "is not a file"),
        ({"config": object()}, "config must be the path"),
    ]:
        args = {"k": 2, "config": aug.config(), "jobs": 1, "quiet": True, **kwargs}
        with pytest.raises(OptionError, match=match):
            dlpack.augment(store, args.pop("k"), args.pop("config"), **args)
    assert aug.content(store) == before and leftovers(store) == []


def test_add_array_refuses_the_names_of_variant_arrays(store: Path) -> None:
    n = len(dlpack.open(store))
    for name in ("images_v1", "boxes_v2", "augment_v12", "checksum_v3"):
        with pytest.raises(OptionError, match="variant arrays are written only by dlpack augment"):
            dlpack.add_array(store, name, np.zeros(n, np.float32))
    dlpack.add_array(store, "images_v0", np.zeros(n, np.float32))  # not a variant's name (v starts at 1)


def test_a_second_process_holding_the_lock_is_named(store: Path) -> None:
    from dlpack.storage.lock import BuildLock

    with BuildLock(store), pytest.raises(StoreLockedError):
        dlpack.augment(store, 2, aug.config(), jobs=1, quiet=True)


# ---------------------------------------------------------------- failures and kills


def test_a_failure_mid_run_leaves_the_store_and_its_old_variants(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dlpack.augment(store, 2, aug.config(), jobs=1, quiet=True)
    before = aug.content(store)
    import dlpack.variants.workers as workers

    real = workers._variant

    def failing(plan: Any, i: int, v: int, *args: Any) -> Any:
        if (i, v) == (20, 2):
            raise OptionError("simulated failure in a worker")
        return real(plan, i, v, *args)

    monkeypatch.setattr(workers, "_variant", failing)
    with pytest.raises(OptionError, match="simulated failure"):
        dlpack.augment(store, 3, aug.config(flip=1.0), jobs=1, quiet=True, replace=True)
    assert aug.content(store) == before
    assert leftovers(store) == []  # a failed run removes what it wrote: no stage, no journal
    with dlpack.open(store) as ds:
        assert ds.variants == 2 and ds.verify() == []


#: Runs the CLI (with the test config reader) paused for good once its journal has K block lines.
PAUSED = r"""
import importlib, sys, threading
sys.path.insert(0, sys.argv[1])
import _augment
_augment.install_loader()
journal = importlib.import_module("dlpack.storage.journal")
k = int(sys.argv[2])
append = journal.Journal.append_block
def paused(self, *args, **kwargs):
    append(self, *args, **kwargs)
    if self.blocks >= k:
        threading.Event().wait()
journal.Journal.append_block = paused
from dlpack.cli import main
sys.exit(main(sys.argv[3:]))
"""


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(dlpack.__file__).parents[1]), *sys.path])}


def _kill_after_blocks(args: list[str], out: Path, k: int) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", PAUSED, str(Path(__file__).parents[1]), str(k), *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
        env=_env(),
    )
    try:
        deadline = time.monotonic() + 120
        while len([line for line in journal_lines(out) if "start" in line]) < k:
            if proc.poll() is not None:
                pytest.fail(f"the run ended (rc {proc.returncode}) before the kill: {proc.stderr.read()!r}")  # type: ignore[union-attr]
            if time.monotonic() > deadline:
                pytest.fail("the run did not reach the kill point within 120 s")
            time.sleep(0.005)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stderr.close()  # type: ignore[union-attr]
    assert proc.returncode == -signal.SIGKILL


def _cli(args: list[str]) -> dict[str, Any]:
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import _augment; _augment.install_loader(); "
        "from dlpack.cli import main; sys.exit(main(sys.argv[2:]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(Path(__file__).parents[1]), *args, "--json"],
        capture_output=True,
        text=True,
        env=_env(),
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


@pytest.mark.slow
@pytest.mark.parametrize("jobs", [1, 2])
def test_a_killed_run_leaves_the_old_variants_and_resumes_to_the_same_bytes(
    store: Path, tmp_path: Path, snapshot: Any, jobs: int
) -> None:
    config = aug.write_config(tmp_path / "flip.json")
    dlpack.augment(store, 2, aug.load_config(config), seed=4, jobs=1, quiet=True)  # the old variants
    ref = _copy(store, tmp_path / "ref" / store.name)
    old = aug.content(store)
    args = ["augment", str(store), "--augment", str(K), "--augment-config", str(config), "--augment-seed", "9",
            "--replace", "--jobs", str(jobs), "--quiet"]  # fmt: skip
    _cli([*(a if a != str(store) else str(ref) for a in args)])  # the uninterrupted run
    _kill_after_blocks(args, store, 4)
    done = [line["start"] for line in journal_lines(store) if "start" in line]
    assert len(done) >= 4
    assert aug.content(store) == old  # killed: the store still holds its old variants, readable
    with dlpack.open(store) as ds:
        assert ds.variants == 2 and ds.verify() == []
    result = _cli(args)
    assert result["resume"] == f"resumed: {len(done)} of {3 * K} blocks already written"
    rows = {0: 14, 14: 14, 28: 12}  # the samples of each block of a variant
    assert result["written"] == sum(rows[s] for v in range(K) for s in rows if v * aug.N_IMAGES + s not in done)
    assert aug.content(store) == aug.content(ref)
    if store.is_dir():
        assert snapshot(store) == snapshot(ref)  # the same files, byte for byte
    assert leftovers(store) == []
    # Killed again, and run with --no-resume: it starts over, to the same store.
    _kill_after_blocks(args, store, 2)
    result = _cli([*args, "--no-resume"])
    assert result["resume"] == "started over: --no-resume" and result["written"] == K * aug.N_IMAGES
    assert aug.content(store) == aug.content(ref) and leftovers(store) == []


@pytest.mark.slow
def test_a_stopped_run_with_other_variants_starts_over(store: Path, tmp_path: Path) -> None:
    config = aug.write_config(tmp_path / "flip.json")
    args = ["augment", str(store), "--augment", "2", "--augment-config", str(config), "--jobs", "1", "--quiet"]
    _kill_after_blocks(args, store, 2)
    assert leftovers(store) == sorted(
        [f".{store.name}.dlpack-augment-journal", f".{store.name}.dlpack-lock"]
        + ([f".{store.name}.dlpack-augment"] if store.is_dir() else [])
    )
    result = _cli([*args[:-1], "--augment-seed", "1"])
    assert result["resume"] == "started over: the variants changed (seed)"
    with dlpack.open(store) as ds:
        assert ds.variants == 2 and ds.manifest.augment["seed"] == 1 and ds.verify() == []  # type: ignore[index]
    assert leftovers(store) == []


# ---------------------------------------------------------------- build --augment, update


def test_build_with_augment_builds_the_store_then_its_variants(
    make_tree: MakeTree, tmp_path: Path, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    aug.install_loader(monkeypatch.setitem)
    config = aug.write_config(tmp_path / "c.json", flip=1.0, brightness=0.0)
    src = make_tree({f"c{k % 2}/{k}.png": ("rgb", 24, 16) for k in range(10)})
    result = dlpack.build(src, tmp_path / backend, augment=2, augment_config=config, augment_seed=2, jobs=1, quiet=True)
    assert result.augment.startswith("2 augmentation variants per image: 20 variants")
    assert result.augment in result.summary()
    with dlpack.open(tmp_path / backend) as ds:
        assert ds.variants == 2 and ds.manifest.augment["seed"] == 2  # type: ignore[index]
        assert np.array_equal(ds.variant(4, 1)["image"], ds[4]["image"][:, ::-1])
        assert ds.manifest.augment["config"]["name"] == "c.json"  # type: ignore[index]


def test_build_with_augment_needs_a_config_that_reads_before_anything_is_packed(
    make_tree: MakeTree, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = make_tree({f"c{k % 2}/{k}.png": ("rgb", 24, 16) for k in range(4)})
    out = tmp_path / "out.zarr"
    with pytest.raises(OptionError, match=r"needs augment_config \(--augment-config FILE\)"):
        dlpack.build(src, out, augment=2)
    with pytest.raises(OptionError, match=r"augment_config only applies with augment=K"):
        dlpack.build(src, out, augment_config="c.json")
    with pytest.raises(OptionError, match="export it"):
        dlpack.build(src, tmp_path / "dl", augment=2, augment_config="c.json", format="dldataset")
    with pytest.raises(OptionError, match="is not a file"):
        dlpack.build(src, out, augment=2, augment_config=str(tmp_path / "missing.json"), quiet=True)

    def broken(path: Any, **kwargs: Any) -> Any:
        raise dlpack.ConfigError(f"{path}: transform[0]: unknown transform 'Foo'")

    aug.install_loader(monkeypatch.setitem)
    monkeypatch.setattr(sys.modules["dlpack.transforms.config"], "load_config", broken)
    with pytest.raises(dlpack.ConfigError, match="unknown transform 'Foo'"):
        dlpack.build(src, out, augment=2, augment_config=str(aug.write_config(tmp_path / "c.json")), quiet=True)
    assert not out.exists() and leftovers(out) == []


def test_a_failed_variant_run_of_a_build_keeps_the_store_and_names_the_command(
    make_tree: MakeTree, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dlpack.variants.workers as workers

    aug.install_loader(monkeypatch.setitem)
    config = aug.write_config(tmp_path / "c.json")
    src = make_tree({f"c{k % 2}/{k}.png": ("rgb", 24, 16) for k in range(6)})
    out = tmp_path / "out.zarr"

    def failing(*args: Any) -> Any:
        raise OptionError("simulated")

    monkeypatch.setattr(workers, "_variant", failing)
    with pytest.raises(OptionError) as info:
        dlpack.build(src, out, augment=2, augment_config=str(config), jobs=1, quiet=True)
    assert f"{out} was built, but not its augmentation variants: run dlpack augment {out} --augment 2" in str(
        info.value
    )
    assert "simulated" in str(info.value)
    with dlpack.open(out) as ds:
        assert len(ds) == 6 and ds.variants == 0 and ds.verify() == []
    monkeypatch.undo()
    aug.install_loader(monkeypatch.setitem)
    assert dlpack.augment(out, 2, str(config), jobs=1, quiet=True).written == 12


def test_an_update_keeps_variants_while_no_sample_changes_and_drops_them_saying_so(
    make_tree: MakeTree, tmp_path: Path, backend: str
) -> None:
    src = make_tree({f"c{k % 2}/{k:02d}.png": ("rgb", 24, 16) for k in range(10)})
    out = tmp_path / backend
    dlpack.build(src, out, jobs=1, quiet=True, shard_bytes=2**16)
    dlpack.augment(out, 2, aug.Config(aug.pipeline(), name="c.json"), seed=3, jobs=1, quiet=True)
    before = aug.content(out)
    touched = src / "c1" / "01.png"  # the same bytes, a newer mtime: every sample keeps its pixels
    os.utime(touched, ns=(touched.stat().st_atime_ns, touched.stat().st_mtime_ns + 10**9))
    result = dlpack.build(src, out, update=True, jobs=1, quiet=True)
    assert "kept its 2 augmentation variants per image" in result.update
    after = aug.content(out)
    assert {k: v for k, v in after["arrays"].items() if "_v" in k} == {
        k: v for k, v in before["arrays"].items() if "_v" in k
    }
    assert after["manifest"]["augment"] == before["manifest"]["augment"]
    with dlpack.open(out) as ds:
        assert ds.variants == 2 and ds.verify() == []
    shutil.copy2(src / "c0" / "00.png", src / "c0" / "10.png")  # one file added: indices and pixels move on
    result = dlpack.build(src, out, update=True, jobs=1, quiet=True)
    assert (
        "dropped its 2 augmentation variants per image (made from samples this update changed); run dlpack augment "
        f"{out} --augment 2 --augment-config c.json --augment-seed 3 to compute them again"
    ) in result.update
    assert result.update in result.summary()
    with dlpack.open(out) as ds:
        assert len(ds) == 11 and ds.variants == 0 and ds.manifest.augment is None
        assert not [n for n in ds.manifest.arrays if "_v" in n] and ds.verify() == []
    dlpack.augment(out, 1, aug.config(), jobs=1, quiet=True)
    with pytest.raises(OptionError, match="belongs to its augmentation variants"):
        dlpack.build(src, out, update=True, drop_array="images_v1", jobs=1, quiet=True)


# ---------------------------------------------------------------- the CLI


def test_cli_augment_exit_codes_and_messages(
    store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from dlpack.cli import main

    aug.install_loader(monkeypatch.setitem)
    config = str(aug.write_config(tmp_path / "c.json"))
    assert main(["augment", str(tmp_path / "none.zarr"), "--augment", "2", "--augment-config", config]) == 2
    assert "no store at" in capsys.readouterr().err
    assert main(["augment", str(store), "--augment-config", config]) == 2
    assert "needs --augment K" in capsys.readouterr().err
    assert main(["augment", str(store), "--augment", "2"]) == 2
    assert "needs augment_config (--augment-config FILE)" in capsys.readouterr().err
    assert main(["augment", str(store), "--augment", "2", "--augment-config", config, "--jobs", "1"]) == 0
    out = capsys.readouterr().out
    assert f"augmented {aug.N_IMAGES} images x 2 variants" in out and "variants/s" in out
    assert main(["augment", str(store), "--augment", "2", "--augment-config", config]) == 2
    assert "already has 2 augmentation variants per image; pass --replace to replace them" in capsys.readouterr().err
    assert main(["augment", str(store), "--augment", "1", "--augment-config", config, "--replace", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["k"], doc["variants"], doc["replaced"], doc["resume"]) == (1, aug.N_IMAGES, 2, "")
    assert doc["variants_per_s"] > 0


@pytest.mark.slow
def test_compressed_stores_get_compressed_variants_written_the_same_for_any_jobs(
    make_tree: MakeTree, tmp_path: Path, backend: str
) -> None:
    """Compressed HDF5 arrays are written through the HDF5 library by this process alone (the workers
    compute from blocks it reads); such a run keeps no journal, as a compressed HDF5 build keeps none."""
    pytest.importorskip("hdf5plugin")
    one = aug.detection_store(make_tree, tmp_path / "a", backend, compression="lz4")
    two = _copy(one, tmp_path / "b" / backend)
    dlpack.augment(one, 2, aug.config(), jobs=1, quiet=True)
    dlpack.augment(two, 2, aug.config(), jobs=2, quiet=True)
    assert aug.content(one) == aug.content(two)
    with dlpack.open(one) as ds:
        assert ds.manifest.arrays["images_v2"].compression == "lz4" and ds.verify() == []
        assert ds.manifest.arrays["mask_v1"].compression == ds.manifest.arrays["mask"].compression
    assert leftovers(one) == []


def test_ctrl_c_during_the_variants_of_a_build_says_how_to_add_them(
    make_tree: MakeTree, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import dlpack.variants.run as run
    from dlpack.cli import main

    aug.install_loader(monkeypatch.setitem)
    config = aug.write_config(tmp_path / "c.json")
    src = make_tree({f"c{k % 2}/{k}.png": ("rgb", 24, 16) for k in range(4)})
    out = tmp_path / "out.zarr"

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(run, "augment_locked", interrupted)
    args = ["build", str(src), str(out), "--augment", "2", "--augment-config", str(config), "--quiet", "--jobs", "1"]
    assert main(args) == 130
    err = capsys.readouterr().err
    assert f"dlpack: interrupted; {out} was built, but not its augmentation variants: run dlpack augment {out}" in err
    with dlpack.open(out) as ds:
        assert len(ds) == 4 and ds.variants == 0


@pytest.mark.slow
def test_dlpack_augment_killed_at_every_durable_step_reruns_to_the_same_store(
    make_tree: MakeTree, tmp_path: Path, backend: str
) -> None:
    """SIGKILL right after each rename, replace and fsync of a replacing ``dlpack augment`` (one point per
    run), then the same command again: it ends with what an uninterrupted run writes (Zarr: the same files)."""
    from _kills import drive

    template = tmp_path / "template"
    src = make_tree({f"c{k % 2}/{k:02d}.png": ("rgb", aug.WIDTH, aug.HEIGHT) for k in range(20)})  # 2 blocks
    dlpack.build(src, template / backend, jobs=1, quiet=True, shard_bytes=2**16)
    dlpack.augment(template / backend, 1, aug.config(), seed=1, jobs=1, quiet=True)  # the variants it replaces
    aug.write_config(template / "c.json")
    args = ["augment", "{work}/" + backend, "--augment", "2", "--augment-config", "{work}/c.json", "--replace",
            "--jobs", "1", "--quiet"]  # fmt: skip
    preload = f"sys.path.insert(0, {str(Path(__file__).parents[1])!r}); import _augment; _augment.install_loader()"
    result = drive(tmp_path, template, backend, args, content=True, preload=preload)
    ref = result["ref"]
    assert ref["rc"] == 0 and ref["calls"] >= 5, ref
    assert ref["content"]["manifest"]["augment"]["k"] == 2
    assert [p["n"] for p in result["points"]] == list(range(1, ref["calls"] + 1))
    for p in result["points"]:
        where = f"killed after durable step {p['n']} of {ref['calls']} ({ref['steps'][p['n'] - 1]})"
        assert p["killed"], f"{where}: not killed there ({p['kill']})"
        assert p["rerun"].get("rc") == 0, f"{where}: the rerun failed: {p['rerun_log']}"
        assert p["siblings"] == ref["siblings"], f"{where}: leftovers {p['siblings']}"
        assert p["content"] == ref["content"], f"{where}: other content"
        if backend.endswith(".zarr"):
            assert p["files"] == ref["files"], f"{where}: not the same files"


def test_ctrl_c_keeps_the_written_blocks_and_the_same_command_resumes(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import dlpack.storage.journal as journal
    from dlpack.cli import main

    aug.install_loader(monkeypatch.setitem)
    config = aug.write_config(tmp_path / "c.json")
    append = journal.Journal.append_block

    def interrupted_at_the_third(self: Any, *args: Any, **kwargs: Any) -> None:
        append(self, *args, **kwargs)
        if self.blocks == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(journal.Journal, "append_block", interrupted_at_the_third)
    args = ["augment", str(store), "--augment", "2", "--augment-config", str(config), "--jobs", "1", "--quiet"]
    assert main(args) == 130
    assert "dlpack: interrupted; run the same command again to resume" in capsys.readouterr().err
    with dlpack.open(store) as ds:
        assert ds.variants == 0
    monkeypatch.setattr(journal.Journal, "append_block", append)
    assert main([*args, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["resume"] == "resumed: 3 of 6 blocks already written" and doc["blocks_written"] == 3
    assert leftovers(store) == []
    with dlpack.open(store) as ds:
        assert ds.variants == 2 and ds.verify() == []


def test_samples_batches_and_the_loader_of_a_store_with_variants_are_the_originals(store: Path) -> None:
    with dlpack.open(store) as ds:
        plain = ds.get_batch([0, 5, 9])
    dlpack.augment(store, 2, aug.config(flip=1.0), jobs=1, quiet=True)
    with dlpack.open(store) as ds:
        batch = ds.get_batch([0, 5, 9])
        assert set(batch) == set(plain) and np.array_equal(batch["image"], plain["image"])
        assert [b.tolist() for b in batch["boxes"]] == [b.tolist() for b in plain["boxes"]]
        ds.warm()  # what a plain loader opens: never the variants (K times the images)
        opened = {*ds.reader._access, *ds.reader._whole}
        assert opened and not [name for name in opened if "_v" in name]
        seen = sorted(i for b in ds.loader(batch_size=8, workers=2) for i in b["index"].tolist())
        assert seen == list(range(len(ds)))


@pytest.mark.parametrize("kind", ["gray", "gray16", "rgb16"])
def test_gray_and_16_bit_stores_get_variants_of_their_own_type(
    make_tree: MakeTree, tmp_path: Path, backend: str, kind: str
) -> None:
    src = make_tree({f"c{k % 2}/{k}.png": (kind, 20, 12) for k in range(6)})
    out = tmp_path / backend
    dlpack.build(src, out, jobs=1, quiet=True)
    dlpack.augment(out, 2, aug.config(flip=1.0, brightness=1.0), jobs=1, quiet=True)
    with dlpack.open(out) as ds:
        assert ds.verify() == []
        for i in range(len(ds)):
            original, variant = ds[i]["image"], ds.variant(i, 1)["image"]
            assert variant.shape == original.shape and variant.dtype == original.dtype
            (offset,) = [e["offset"] for e in ds.augmentation(i, 1) if e["op"] == "TestStoreBrightness"]
            top = np.iinfo(original.dtype).max
            want = np.clip(original[:, ::-1].astype(np.int64) + offset, 0, top).astype(original.dtype)
            assert np.array_equal(variant, want)


def test_augment_takes_an_options_object_and_names_an_unknown_keyword(tmp_path: Path) -> None:
    opts = dlpack.AugmentOptions(k=2, config="aug.json", seed=3)
    with pytest.raises(dlpack.OptionError, match="unknown keyword 'sede'; did you mean 'seed'"):
        dlpack.augment(tmp_path / "none.zarr", options=opts, sede=4)
    with pytest.raises(dlpack.StoreNotFoundError, match="no store at"):
        dlpack.augment(tmp_path / "none.zarr", options=opts, jobs=1)
