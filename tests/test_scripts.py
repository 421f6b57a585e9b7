"""Smoke runs of every script in examples/ and benchmarks/ on tiny inputs, as a user would start them.

The figures they print are not checked (speed is measured by hand); only that each script runs to
the end and reports what it measured. Every script must have an entry in ``RUNS``, so a new one
cannot slip past.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import dlpack
from dlpack.sample import make_sample

ROOT = Path(__file__).resolve().parents[1]
#: A hang guard, not a speed check: each run takes a few seconds.
TIMEOUT_S = 300
#: Peers that benchmarks/peers.py compares against, by the module each one imports.
PEER_MODULES = ("webdataset", "litdata", "streaming", "ffcv")


@dataclass(frozen=True)
class Run:
    """One smoke run: the arguments and what the output must show."""

    args: tuple[str, ...]
    check: Callable[[str, Path], None]
    needs: tuple[str, ...] = ()
    setup: Callable[[Path], None] | None = None  # makes extra inputs in the work folder
    unless: tuple[str, ...] = ()  # skipped where one of these modules imports (the run checks their absence)
    code: int = 0  # the exit status the run must end with


def _check_build(out: str, work: Path) -> None:
    assert "variant       median s  CPU s  CPU/bare  efficiency" in out
    assert "zarr-j1: CPU " in out and "efficiency" in out
    doc = json.loads((work / "build.json").read_text())
    assert {name: [r["images"] for r in runs] for name, runs in doc["runs"].items()} == {
        "bare": [8],
        "zarr-j1": [8],
        "hdf5-j1": [8],
        "zarr-j1-warm": [8],
        "hdf5-j1-warm": [8],
    }
    # The whole command's CPU is its process tree's: more than the in-process build with a warm pool.
    whole, warm = (doc["median_cpu_seconds"][k] for k in ("zarr-j1", "zarr-j1-warm"))
    assert whole > warm >= 0
    assert set(doc["ratios"]) == {"zarr-j1", "hdf5-j1", "zarr-j1-warm", "hdf5-j1-warm"}


def _check_build_pinned(out: str, work: Path) -> None:
    doc = json.loads((work / "build-pinned.json").read_text())
    assert doc["cpus"] == sorted(os.sched_getaffinity(0))[:1] and doc["machine"]["cores_usable"] == 1
    assert {k: len(v) for k, v in doc["runs"].items()} == {"bare": 1, "zarr-j2": 1}
    assert doc["runs"]["zarr-j2"][0]["own_cpu_seconds"] > 0


def _check_build_breakdown(out: str, work: Path) -> None:
    doc = json.loads((work / "build-breakdown.json").read_text())
    parts = doc["parts_cpu_seconds"]
    assert doc["images"] == 24 and sorted(doc["whole_cpu_seconds"]) == ["jobs 1", "jobs 2"]
    assert parts["interpreter start + CLI imports (one process)"] > 0
    assert "worker start-up, 2 workers (spawn, imports, preload)" in parts
    assert any(k.startswith("write of the pixels") for k in parts) and parts["  fsync of those pixels alone"] >= 0
    assert "whole command, jobs 2" in out and "not in the parts above" in out


def _check_build_cli(out: str, work: Path) -> None:
    assert "jobs 1: median" in out and "jobs 2: median" in out and "jobs 2 / jobs 1:" in out
    doc = json.loads((work / "build-cli.json").read_text())
    assert {k: len(v) for k, v in doc["runs"].items()} == {"j1": 2, "j2": 2}
    assert all(r["seconds"] > 0 and r["images"] == 6 for v in doc["runs"].values() for r in v)
    assert sorted(doc["median_cpu_seconds_per_image"]) == ["j1", "j2"]
    assert all(v > 0 for v in doc["median_cpu_seconds_per_image"].values())


def _check_build_cli_code(out: str, work: Path) -> None:
    doc = json.loads((work / "build-cli-code.json").read_text())
    assert doc["code"] == [str(ROOT)]
    assert {k: len(v) for k, v in doc["runs"].items()} == {"c0-j1": 1, "c0-j2": 1}
    assert f"{ROOT}: jobs 1: median" in out and "ms CPU/image" in out


def _check_build_rss(out: str, work: Path) -> None:
    runs = json.loads((work / "build-rss.json").read_text())["runs"]
    assert sorted(runs) == ["20-j1", "50-j1"]
    for r in runs.values():
        # A store of that many 8x8x3 images, and at least an interpreter's worth of memory measured.
        assert r["store_bytes"] >= r["images"] * 8 * 8 * 3
        assert r["peak_tree_rss_mib"] >= 10 and r["max_process_rss_mib"] >= 10


def _check_build_records(out: str, work: Path) -> None:
    runs = json.loads((work / "build-records.json").read_text())["runs"]
    assert sorted(runs) == ["30-records"] and runs["30-records"]["images"] == 30
    stages = runs["30-records"]["stages"]
    assert sorted(stages) == sorted(["start", "scan", "probe", "plan", "samples", "manifest"])
    assert all(v["rss_mib"] >= 10 and v["peak_mib"] >= 10 for v in stages.values())
    assert "30 images, records only" in out


def _check_compression(out: str, work: Path) -> None:
    assert "## raw at 32x32: 8 images" in out and "random warm" in out and "block cold" in out
    doc = json.loads((work / "compression.json").read_text())
    rows = doc["rows"]
    assert sorted((r["format"], r["codec"]) for r in rows) == sorted(
        (f, c) for f in ("zarr", "hdf5") for c in ("none", "lz4", "zstd")
    )
    for r in rows:
        assert r["count"] == 8 and r["bytes"] > 0 and r["source_bytes"] > 0 and r["build_images_per_s"] > 0
        assert all(r[f"{order}_{cache}"] > 0 for order in ("random", "block") for cache in ("warm", "cold"))
    assert len(doc["summary"]) == 6 and doc["machine"]["cores"] >= 1


def _check_scale(out: str, work: Path) -> None:
    res = json.loads((work / "scale.json").read_text())
    assert [r["client"] for r in res["clients"]][:2] == ["obstore", "obstore"]
    rows = {r["row"]: r for r in res["loader"]}
    for order in ("block", "sequential", "random"):
        for cache in ("cold", "warm"):
            assert rows[f"remote {order} {cache}"]["img_s"] > 0
    assert rows["remote block cold"]["fetched_per_used"] >= 1.0  # every shard fetched at least once, cold
    assert rows["remote block warm"]["fetched_per_used"] == 0  # warm: nothing fetched
    assert all(r["open_requests"] < 10 for r in res["open"])
    assert "## loader" in out


def _check_scale_dask(out: str, work: Path) -> None:
    res = json.loads((work / "scale-dask.json").read_text())
    build = {r["row"]: r for r in res["build"]}
    for pool in ("local jobs=1", "local jobs=2", "dask 1 worker", "dask 2 workers"):
        for out_ in ("local", "bucket"):
            assert build[f"{pool} -> {out_} OUT"]["img_s"] > 0
    assert build["dask 2 workers -> local OUT"]["vs_local"] > 0
    assert len(build["dask 2 worker(s): peak RSS per worker, MiB"]["rss"]) == 2
    source = {r["row"]: r for r in res["source"]}
    for jobs in (1, 2):
        for arm in ("local folder", "bucket, ahead=8", "bucket, ahead=0"):
            assert source[f"{arm}, jobs={jobs}"]["img_s"] > 0
    assert source["loopback server, one request at a time"]["get_image_ms"] > 0
    tasks = {r["row"]: r for r in res["tasks"]}
    assert tasks["dask 2 workers"]["ms_per_task"] > 0 and tasks["local jobs=2"]["round_trip_ms"] > 0
    assert "## build" in out and "## tasks" in out


def _check_loader(out: str, work: Path) -> None:
    assert "16 images of 512x512x3" in out and "ratios (targets:" in out
    res = json.loads((work / "loader.json").read_text())
    for backend in ("zarr", "hdf5"):
        for order in ("random", "sequential", "block"):
            assert res[f"dlpack {backend} {order} w2 p4"]["median_images_per_s"] > 0
    assert res["step_ms"] == [1.0]


def _check_loader_small(out: str, work: Path) -> None:
    assert "32x32x1 x600 batch 64 (fits the CPU cache)" in out and "workers=auto->" in out
    doc = json.loads((work / "small.json").read_text())
    assert doc["command"].startswith("python benchmarks/loader.py --small")
    for case in doc["small"].values():
        assert case["ceiling"].startswith("gather:") and case["ceiling_images_per_s"] > 0
        ratios = case["ratios"]
        assert ratios[case["ceiling"]] == 1.0
        for backend in ("zarr", "hdf5"):
            for w in ("auto", "0", "1", "2"):
                assert ratios[f"dlpack {backend} workers={w}"] > 0
        assert ratios["dlpack zarr workers=auto, maps each"] > 0 and ratios["dlpack zarr workers=0, maps each"] > 0


def _check_loader_steps(out: str, work: Path) -> None:
    assert "simulated 5 ms steps" in out
    doc = json.loads((work / "steps.json").read_text())["steps"]
    assert len(doc) == 4  # two shapes x two step kinds
    for row in doc.values():
        assert row["default"].startswith("<dlpack.Loader") and "workers=auto->" in row["default"]
        for w in ("auto", "0", "1", "2", "auto, no read-ahead across epochs"):
            assert 0 < row[w]["busy_stats"] <= 1 and 0 < row[w]["busy_own_clock"] <= 1


def _check_loader_torch(out: str, work: Path) -> None:
    assert "16 images of 256x256x3" in out and "float32 new / before (target >= 3)" in out
    res = json.loads((work / "torch.json").read_text())
    assert all(len(runs) == 4 and min(runs) > 0 for runs in res["runs"].values())  # medians of >= 4 epochs
    assert "TorchDataset + DataLoader(num_workers=2)" in res["runs"] and set(res["conversion_ms"]) == {
        "before",
        "fused",
        "fused NCHW",
        "table",
    }
    paired = res["paired"]  # the uint8 target on its own: ds.loader, the adapter, the baseline adapter file
    assert paired["rounds"] == 60 and "uint8 paired with ds.loader, 60 rounds in random order, workers auto" in out
    assert list(paired["ratio_to_ds_loader"]) == ["torch_loader uint8", "baseline torch_loader uint8 (torch.py)"]
    assert all(len(v) == 60 and min(v) > 0 for v in paired["runs"].values())
    assert all(v > 0 for v in paired["cpu_us_per_batch"].values())
    prof = res["profile_workers0"]  # workers=0: the source's read, the adapter's finisher, the rest
    assert set(prof) == {"ds.loader uint8", "torch_loader uint8", "baseline torch_loader uint8"}
    assert prof["ds.loader uint8"]["finisher_us"] == 0 < prof["torch_loader uint8"]["finisher_us"]
    assert all(v["get_batch_us"] > 0 and v["next_us"] >= v["get_batch_us"] for v in prof.values())


def _check_peers(out: str, work: Path) -> None:
    doc = json.loads((work / "peers.json").read_text())
    assert sorted(doc["cases"]) == ["32x32x1-64 random", "64x64x3-64 random"]
    for res in doc["cases"].values():
        rows = res["rows"]
        for name in ("ceiling, np.take mode='clip'", "2-thread gather, np.take mode='clip'", "dlpack Zarr, defaults"):
            assert rows[name]["images_per_s"] > 0 and rows[name]["failures"] == [], name
        for store in ("dlpack Zarr", "dlpack HDF5"):
            for w in (0, 1, 2):
                assert rows[f"{store}, workers={w}"]["epochs_checked"] == 2
        assert {t["target"] for t in res["targets"]} >= {"dlpack Zarr workers=0 / ceiling"}
        assert all(isinstance(t["met"], bool) for t in res["targets"])
    missing = [m for m in PEER_MODULES if importlib.util.find_spec(m) is None]
    for module in missing:
        assert f"No module named '{module}'" in out
    assert doc["failed_rows"] == []


def _peers_module() -> Any:
    spec = importlib.util.spec_from_file_location("peers", ROOT / "benchmarks" / "peers.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("peers", module)  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("fault", ["none", "repeat", "drop", "pixel", "shape"])
def test_peers_check_fails_an_epoch_that_is_not_every_sample_once(tmp_path: Path, fault: str) -> None:
    """benchmarks/peers.py fails a row whose timed epoch repeats, drops or alters a sample."""
    peers = _peers_module()
    case = peers.Case(8, 3, 40)
    raw = np.stack([peers.make_image(case, i) for i in range(case.count)])
    raw.tofile(tmp_path / "raw.u8")
    images = peers.RawImages(tmp_path / "raw.u8", case)
    epoch = {"n": 0}

    def run(add: Callable[[Any, Any], None]) -> None:
        epoch["n"] += 1
        idx = np.random.default_rng(epoch["n"]).permutation(case.count)
        if epoch["n"] == 2 and fault == "repeat":
            idx[5] = idx[6]
        if epoch["n"] == 2 and fault == "drop":
            idx = idx[:-1]
        for s in range(0, len(idx), 16):
            b = idx[s : s + 16]
            imgs = raw[b].copy()
            if epoch["n"] == 2 and fault == "pixel" and s == 16:
                imgs[3] = 255 - imgs[3]  # every byte differs, so the sampled bytes see it
            if epoch["n"] == 2 and fault == "shape":
                imgs = imgs[:, :, :4]
            add(imgs, b)

    res = peers.measure(peers.Epochs(run=run), images, 2, 0.0, 1.0, 1)
    assert res["epochs_checked"] == 3 and res["displacement"] > 0 and res["epochs_differ"] is True
    if fault == "none":
        assert res["failures"] == []
    else:
        assert len(res["failures"]) == 1 and res["failures"][0].startswith("timed epoch 1:"), res["failures"]


def _check_import_time(out: str, work: Path) -> None:
    runs = json.loads((work / "import.json").read_text())["runs_us"]
    assert set(runs) >= {"import numpy", "import dlpack"} and all(len(v) == 1 and v[0] > 0 for v in runs.values())
    assert "import dlpack" in out and "x import numpy" in out


def _check_versions(out: str, work: Path) -> None:
    assert "after/before" in out
    doc = json.loads((work / "versions.json").read_text())
    assert {k: len(r) for k, r in doc["runs"].items()} == {
        f"{k} {v}": 1 for k in ("build j1", "build j2", "loader") for v in ("before", "after")
    }
    assert all(rate > 0 for rate in doc["medians"].values()) and set(doc["ratios"]) == {
        "build j1",
        "build j2",
        "loader",
    }


def _check_labels(out: str, work: Path) -> None:
    assert "48 images of 16x16x3 and 24 of 32x32x3" in out and "ratios (targets:" in out
    assert "build throughput with labels (12 sample images of 64 px stored at 32 px" in out
    res = json.loads((work / "labels.json").read_text())
    for backend in ("zarr", "hdf5"):
        for kind in ("plain", "boxes"):
            assert res["medians"][f"16 {backend} {kind} w2 p4"] > 0 and res["medians"][f"32 {backend} {kind} w0"] > 0
        assert res["medians"][f"32 {backend} mask w2 p4"] > 0
        assert "boxes_share" in res["ratios"][f"16 {backend} boxes share of batch time (w2 p4)"]
        assert "ratio" in res["ratios"][f"32 {backend} mask / memmap images+mask (w2 p4)"]
    assert res["medians"]["32 memmap images+mask"] > 0
    assert set(res["get_batch_boxes_share"]) == {"zarr", "hdf5"}
    assert all(0 < row["share_min"] < 1 for row in res["get_batch_boxes_share"].values())
    built = res["build_with_labels"]
    assert set(built["median_images_per_s"]) == {"folders", "coco", "masks"}
    assert all(rate > 0 for rate in built["median_images_per_s"].values())
    with dlpack.open(work / "work" / "built-coco.zarr") as ds:
        assert ds.task == "detection" and len(ds) == 12 and "boxes" in ds.manifest.arrays
    stores = {p.name for p in (work / "work").glob("s*-*")}
    assert {"s16-boxes.zarr", "s16-boxes.h5", "s32-mask.zarr", "s32-mask.h5"} <= stores
    assert {"boxes", "box_labels"} <= set(dlpack.open(work / "work" / "s16-boxes.h5").manifest.arrays)


def _check_load(out: str, work: Path) -> None:
    assert "40 PNGs of 32x32x3" in out and "peak RSS MB" in out
    doc = json.loads((work / "load.json").read_text())
    assert set(doc["builds"]) == set(doc["loader"]) == {"zarr", "hdf5"}
    for build in doc["builds"].values():
        assert build["images"] == 40 and build["summary"]["count"] == 40
        assert build["peak_rss_bytes"] > 0 and 0 < build["files"] < 40
    for run in doc["loader"].values():
        assert [row["epoch"] for row in run["epochs"]] == [None, 0, 1]
        assert all(row["images"] == 40 and row["resident_bytes"] > 0 for row in run["epochs"][1:])


def _check_train(out: str, work: Path) -> None:
    assert "training on cpu from dlpack store" in out
    assert "epoch 0: 8 images in" in out and "waiting for data" in out
    assert "  loader: epoch 0: " in out and "% of the time (p99" in out  # the loader's own line


def _check_train_halcon(out: str, work: Path) -> None:
    assert "HALCON is not available, nothing was trained" in out and "dlpack-datasets[halcon]" in out
    assert "Traceback" not in out


def _model_file(work: Path) -> None:
    (work / "model.hdl").write_bytes(b"")  # the example checks that the model file exists before HALCON


def _split_store(work: Path) -> None:
    """``split.zarr``: the sample images twice, under ``train/`` and under ``test/``."""
    for split in ("train", "test"):
        shutil.copytree(work / "raw", work / "split" / split)
    dlpack.build(work / "split", work / "split.zarr", size=(32, 32), quiet=True, jobs=1)


def _check_train_split(out: str, work: Path) -> None:
    assert "from dlpack store split.zarr (split train)" in out and "epoch 0: 8 images in" in out
    assert "epoch 0: validation on test: accuracy" in out and "of 8 images)" in out
    assert "epoch 1: validation on test: accuracy" in out


def _augmented_store(work: Path) -> None:
    """``aug.zarr``: the sample images with 2 cached variants each (a mirror or a brightness change)."""
    config = work / "aug.json"
    config.write_text('{"augmentation_percentage": 100, "mirror": "c", "brightness_variation": 40}')
    dlpack.build(
        work / "raw", work / "aug.zarr", size=(32, 32), quiet=True, jobs=1, augment=2, augment_config=str(config)
    )


def _check_train_cached(out: str, work: Path) -> None:
    import re

    assert "from dlpack store aug.zarr with its cached augmentation variants" in out
    served = [int(m) for m in re.findall(r"epoch \d: (\d) of 8 images served as cached variants", out)]
    # Each image gets every one of its 3 views once in 3 epochs: 2 of them variants.
    assert len(served) == 3 and sum(served) == 16, out


def _check_train_folder(out: str, work: Path) -> None:
    assert "training on cpu from folder" in out and "epoch 0: 8 images in" in out


def _check_augment_speed(out: str, work: Path) -> None:
    doc = json.loads((work / "speed.json").read_text())["speed"]
    assert doc["images"] == 96 and doc["k"] == 2
    assert set(doc["build_median_variants_per_s"]) == {"jobs 1", "jobs 2"}
    assert {"originals", "cached", "cached + online", "on the fly, dlpack threads"} <= set(
        doc["loader_median_images_per_s"]
    )
    assert all(v > 0 for v in doc["loader_median_images_per_s"].values())
    assert "jobs 2 / jobs 1" in out and "x originals" in out


def _check_augment_views_speed(out: str, work: Path) -> None:
    doc = json.loads((work / "views.json").read_text())["views"]
    assert doc["k"] == 2 and [(r["size"], r["batch"]) for r in doc["rows"][::2]] == [(256, 4), (64, 256)]
    assert {r["workers"] for r in doc["rows"]} == {"auto", "0"}
    assert all(r["time_ratio"] > 0 and r["median"]["cached"]["images_per_s"] > 0 for r in doc["rows"])
    assert "cached views / originals" in out and "time" in out


def _fmnist_like(work: Path) -> None:
    """Two tiny splits of 28x28 gray PNGs in three class folders, laid out like Fashion-MNIST's."""
    import cv2
    import numpy as np

    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        for c in range(3):
            d = work / "fm" / split / f"{c}_class"
            d.mkdir(parents=True)
            for i in range(8):
                img = np.full((28, 28), 40 + 80 * c, np.uint8) + rng.integers(0, 20, (28, 28), dtype=np.uint8)
                cv2.imwrite(str(d / f"{i}.png"), img)


def _check_augment_accuracy(out: str, work: Path) -> None:
    doc = json.loads((work / "acc.json").read_text())["accuracy"]
    assert doc["train_images"] == 3 * 8 and doc["test_images"] == 3 * 8
    assert set(doc["summary"]) == {"none", "online", "cached K=4", "cached K=4 + online layer"}
    assert all(0.0 <= s["mean"] <= 100.0 for s in doc["summary"].values())
    assert "accuracy on 24 test images after 1 epochs" in out


def _check_augment_views(out: str, work: Path) -> None:
    doc = json.loads((work / "views.json").read_text())
    assert (doc["images"], doc["variants"]) == (8, 16)
    # Every variant is a real view: none equals its original or the other variant of its image.
    assert (doc["same_as_original"], doc["duplicate_pairs"]) == (0, 0)
    assert "16 variants of 8 gray 32x32 images: 0 equal to their original" in out


def _check_map_check(out: str, work: Path) -> None:
    rows = json.loads((work / "map_check.json").read_text())
    assert [(r["backend"], r["shard_mib"]) for r in rows] == [("hdf5", None), ("zarr", 1)]
    assert all(r["gather_us"] > 0 and r["check_us"] > 0 for r in rows)
    assert "gather us" in out


def _check_maps(out: str, work: Path) -> None:
    rows = json.loads((work / "maps.json").read_text())["rows"]
    assert rows["2 MiB boundary"]["starts_mod_2mib"] == [0]  # as the reader maps a store
    assert rows["one page off"]["starts_mod_2mib"] == [4096]
    assert all(r["us_per_row"] > 0 and r["rss_kib"] > 0 for r in rows.values())
    assert re.search(r"maps start one page off +: +[\d.]+ us a row \(1\.00x\)", out), out


def _build_small_shards(work: Path) -> None:
    dlpack.build(work / "raw", work / "shards.zarr", size=(48, 48), shard_bytes=2**16, quiet=True, jobs=1)


def _check_strict_json(out: str) -> None:
    assert re.search(r"MB COCO: json\.loads [\d.]+ s, strict reader [\d.]+ s \([\d.]+x\)", out), out


RUNS: dict[str, list[Run]] = {
    "benchmarks/augment.py": [
        Run(("speed", "--quick", "--work", "work", "--json", "speed.json"), _check_augment_speed),
        Run(("views", "--quick", "--work", "work", "--json", "views.json"), _check_augment_views_speed),
        Run(
            ("accuracy", "--quick", "--data", "fm", "--work", "work", "--json", "acc.json"),
            _check_augment_accuracy,
            needs=("torch",),
            setup=_fmnist_like,
        ),
    ],
    "benchmarks/build.py": [
        Run(
            ("--count", "8", "--image-size", "64", "--size", "32x32", "--repeat", "1", "--jobs", "1")
            + ("--max-tries", "1", "--workdir", "work", "--json", "build.json"),
            _check_build,
        ),
        Run(
            ("--count", "8", "--image-size", "64", "--size", "32x32", "--repeat", "1", "--jobs", "2", "--cpus", "1")
            + ("--formats", "zarr", "--no-warm", "--workdir", "work", "--json", "build-pinned.json"),
            _check_build_pinned,
        ),
        Run(
            ("--breakdown", "--count", "24", "--image-size", "64", "--size", "32x32", "--formats", "zarr")
            + ("--workdir", "work", "--json", "build-breakdown.json"),
            _check_build_breakdown,
        ),
        Run(
            ("--cli", "--count", "6", "--image-size", "64", "--size", "32x32", "--repeat", "2")
            + ("--workdir", "work", "--json", "build-cli.json"),
            _check_build_cli,
        ),
        Run(
            ("--cli", "--count", "6", "--image-size", "64", "--size", "32x32", "--repeat", "1", "--code", str(ROOT))
            + ("--workdir", "work", "--json", "build-cli-code.json"),
            _check_build_cli_code,
        ),
        Run(
            ("--rss", "20,50", "--rss-side", "8", "--jobs", "1", "--workdir", "work", "--json", "build-rss.json"),
            _check_build_rss,
        ),
        Run(
            ("--rss", "30", "--rss-side", "8", "--rss-records", "--workdir", "work", "--json", "build-records.json"),
            _check_build_records,
        ),
    ],
    "benchmarks/compression.py": [
        Run(
            ("raw", "--size", "32x32", "--repeat", "1", "--seconds", "0.05", "--work", "work")
            + ("--json", "compression.json"),
            _check_compression,
        )
    ],
    "benchmarks/augment_views.py": [
        Run(
            ("--count", "8", "--size", "32", "--k", "2", "--jobs", "1", "--config", "examples_config.json")
            + ("--json", "views.json"),
            _check_augment_views,
            setup=lambda work: shutil.copy(ROOT / "examples" / "augment_halcon.json", work / "examples_config.json"),
        )
    ],
    "benchmarks/map_check.py": [
        Run(
            ("--count", "64", "--size", "16", "--batch", "8", "--shard-mib", "1", "--repeat", "1", "--inner", "2")
            + ("--json", "map_check.json"),
            _check_map_check,
        )
    ],
    "benchmarks/maps.py": [
        Run(
            ("shards.zarr", "--batch", "4", "--batches", "20", "--repeat", "1", "--json", "maps.json"),
            _check_maps,
            setup=_build_small_shards,
        )
    ],
    "benchmarks/strict_json.py": [
        Run(("--images", "40", "--boxes", "2", "--repeat", "1"), lambda out, _: _check_strict_json(out)),
    ],
    "benchmarks/import_time.py": [Run(("--runs", "1", "--json", "import.json"), _check_import_time)],
    "benchmarks/labels.py": [Run(("--quick", "--work", "work", "--json", "labels.json"), _check_labels)],
    "benchmarks/load.py": [
        Run(("--count", "40", "--epochs", "2", "--work", "work", "--json", "load.json"), _check_load),
    ],
    "benchmarks/loader.py": [
        Run(
            ("--work", "work", "--count", "16", "--batch-size", "8", "--repeat", "1", "--folder-samples", "8")
            + ("--step-ms", "1", "--json", "loader.json"),
            _check_loader,
        ),
        Run(("--small", "--quick", "--repeat", "1", "--work", "work", "--json", "small.json"), _check_loader_small),
        Run(("--steps", "--quick", "--repeat", "1", "--work", "work", "--json", "steps.json"), _check_loader_steps),
        Run(
            ("--torch-only", "--work", "work", "--count", "16", "--batch-size", "8", "--repeat", "1")
            + ("--torch-workers", "auto", "--torch-baseline", str(ROOT / "dlpack" / "torch.py"))
            + ("--json", "torch.json"),
            _check_loader_torch,
            needs=("torch",),
        ),
    ],
    "benchmarks/versions.py": [
        Run(
            ("--before", str(ROOT), "--after", str(ROOT), "--work", "work", "--count", "4", "--image-size", "64")
            + ("--size", "32", "--epochs", "1", "--repeat", "1", "--json", "versions.json"),
            _check_versions,
        )
    ],
    "benchmarks/scale.py": [
        Run(("--quick", "--work", "work", "--json", "scale.json"), _check_scale, needs=("obstore", "moto")),
        Run(
            ("--quick", "--sections", "build,source,tasks", "--work", "work", "--json", "scale-dask.json"),
            _check_scale_dask,
            needs=("obstore", "moto", "distributed"),
        ),
    ],
    "benchmarks/peers.py": [
        Run(
            ("--quick", "--work", "work", "--json", "peers.json"),
            _check_peers,
        )
    ],
    "examples/train_halcon.py": [
        # Where HALCON imports, tests/halcon/test_feeder.py runs its training loop against a stand-in.
        # Without HALCON it exits 2, once the store and the model path are checked.
        Run(
            ("train.zarr", "--model", "model.hdl", "--epochs", "1"),
            _check_train_halcon,
            setup=_model_file,
            unless=("halcon",),
            code=2,
        ),
    ],
    "examples/train_torch.py": [
        Run(
            ("train.zarr", "--epochs", "1", "--batch-size", "4", "--workers", "0", "--max-steps", "2")
            + ("--device", "cpu"),
            _check_train,
            needs=("torch",),
        ),
        Run(
            ("split.zarr", "--split", "train", "--val-split", "test", "--epochs", "2", "--batch-size", "4")
            + ("--workers", "0", "--device", "cpu"),
            _check_train_split,
            needs=("torch",),
            setup=_split_store,
        ),
        Run(
            ("aug.zarr", "--augment", "cached", "--epochs", "3", "--batch-size", "4", "--workers", "0")
            + ("--device", "cpu"),
            _check_train_cached,
            needs=("torch",),
            setup=_augmented_store,
        ),
        Run(
            ("raw", "--folder", "--size", "32x32", "--epochs", "1", "--batch-size", "4", "--workers", "0")
            + ("--max-steps", "2", "--device", "cpu"),
            _check_train_folder,
            needs=("torch",),
        ),
    ],
}


def _scripts() -> list[str]:
    return sorted(
        p.relative_to(ROOT).as_posix()
        for folder in ("examples", "benchmarks")
        for p in (ROOT / folder).glob("*.py")
        if not p.name.startswith("_")
    )


def test_every_script_has_a_smoke_run() -> None:
    assert _scripts() == sorted(RUNS)


def _imports(module: str) -> bool:
    """Whether ``import module`` works (HALCON's binding fails at import, not at lookup, without its runtime)."""
    proc = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, timeout=TIMEOUT_S)
    return proc.returncode == 0


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """A folder with ``raw/`` (8 sample images in class folders) and ``train.zarr`` built from it."""
    make_sample(tmp_path / "raw", 8, size=64, seed=0)
    dlpack.build(tmp_path / "raw", tmp_path / "train.zarr", size=(32, 32), quiet=True, jobs=1)
    return tmp_path


@pytest.mark.slow
@pytest.mark.parametrize(
    ("script", "run"), [pytest.param(s, r, id=f"{s}-{i}") for s, runs in RUNS.items() for i, r in enumerate(runs)]
)
def test_script_runs_on_tiny_inputs(script: str, run: Run, work: Path) -> None:
    for module in run.needs:
        pytest.importorskip(module)
    for module in run.unless:
        if _imports(module):
            pytest.skip(f"{module} imports here; this run checks the message given without it")
    if run.setup is not None:
        run.setup(work)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(
        [sys.executable, str(ROOT / script), *run.args],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert proc.returncode == run.code, (
        f"{script} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    run.check(proc.stdout + proc.stderr, work)


def _train_main() -> Callable[[list[str]], int]:
    """``examples/train_torch.py``'s ``main``, loaded in this process."""
    pytest.importorskip("torch")
    spec = importlib.util.spec_from_file_location("train_torch", ROOT / "examples" / "train_torch.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    main: Callable[[list[str]], int] = module.main
    return main


def test_train_example_refuses_a_variable_size_store(work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dlpack.build(work / "raw", work / "var.zarr", quiet=True, jobs=1)  # no --size: the sample's sizes vary
    assert dlpack.open(work / "var.zarr").image_layout() is None
    args = [str(work / "var.zarr"), "--epochs", "1", "--batch-size", "2", "--workers", "0", "--device", "cpu"]
    assert _train_main()(args) == 2
    err = capsys.readouterr().err
    assert (
        "variable-size store (" in err and "distinct sizes): batches are lists; pass --size WxH or --max-side N" in err
    )
    assert "Traceback" not in err


def test_train_example_names_the_splits_of_a_wrong_split(work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _split_store(work)
    main = _train_main()
    assert main([str(work / "split.zarr"), "--split", "valid", "--device", "cpu"]) == 2
    assert "no split 'valid'; its splits are: test, train" in capsys.readouterr().err
    assert main([str(work / "train.zarr"), "--split", "train", "--device", "cpu"]) == 2
    assert "has no splits" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main([str(work / "raw"), "--folder", "--split", "train"])
    assert exit_info.value.code == 2
