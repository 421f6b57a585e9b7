"""A build or an update killed (SIGKILL, or Ctrl-C) at any of its durable steps, then run again, ends as if never killed.

The durable steps are every ``os.replace``, ``os.rename``, ``renameat2`` and ``os.fsync`` call: a
kill right after one leaves the files exactly as the step made them. A driver process imports
dlpack once, then per kill point forks a child that counts those calls and kills itself right
after the N-th, forks a plain child that reruns the same command, and records the result. Every
point of the command is covered, one per run, numbered in call order.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _kills import drive

import dlpack

# Every durable step of a command killed and rerun, a subprocess pair per step: minutes in all.
# `make test-fast` leaves them out.
pytestmark = pytest.mark.slow

MakeTree = Callable[..., Path]


def check_every_point(result: dict[str, Any], out_name: str, exact: bool, sig: str = "KILL") -> None:
    ref = result["ref"]
    assert ref["rc"] == 0 and ref["files"], ref
    assert ref["calls"] >= 2, ref  # the command has durable steps to kill at
    points = result["points"]
    assert [p["n"] for p in points] == list(range(1, ref["calls"] + 1))
    # Publishing is the step that moves the partial store to OUT.
    publish = 1 + next(i for i, step in enumerate(ref["steps"]) if step[0] == "_renameat2" and step[2] == ref["out"])
    for p in points:
        where = f"{sig} after durable step {p['n']} of {ref['calls']}"
        if sig == "KILL":
            assert p["killed"], f"{where}: the run was not killed there ({p['kill']})"
        elif p["n"] < publish:
            assert p["kill"].get("rc") == 130 and "dlpack: interrupted" in p["kill_log"], f"{where}: {p['kill_log']}"
        else:  # Ctrl-C once the store is in place: the command is complete
            assert p["kill"].get("rc") == 0 and "already published" in p["kill_log"], f"{where}: {p['kill_log']}"
        if sig == "INT" and p["n"] >= publish and "--update" not in ref["args"]:
            # A build that completed: running it again finds the store there, as after any build.
            assert p["rerun"].get("rc") == 2 and "already exists" in p["rerun_log"], f"{where}: {p['rerun_log']}"
        else:
            assert p["rerun"].get("rc") == 0, f"{where}: the rerun failed: {p['rerun_log']}"
        assert p["siblings"] == ref["siblings"], f"{where}: leftovers {p['siblings']}"
        extra, missing = sorted(set(p["files"]) - set(ref["files"])), sorted(set(ref["files"]) - set(p["files"]))
        assert not extra and not missing, f"{where}: {out_name} has {extra} more and {missing} fewer files"
        if exact:
            assert p["files"] == ref["files"], f"{where}: not byte-identical"
        else:
            assert p["content"] == ref["content"], f"{where}: other content"


#: 12 noise PNGs of 96x64x3 (18 KiB stored) in 64 KiB shards: 3 images a block, 4 blocks.
SPEC = {f"c{k % 2}/{k:02d}.png": ("rgb", 96, 64) for k in range(12)}
BUILD = ["build", "{work}/src", "{work}/OUT", "--jobs", "1", "--shard-bytes", "65536", "--quiet"]


@pytest.mark.parametrize("sig", ["KILL", "INT"])
def test_a_build_killed_at_every_durable_step_reruns_to_the_same_store(
    make_tree: MakeTree, tmp_path: Path, backend: str, sig: str
) -> None:
    template = tmp_path / "template"
    make_tree(SPEC, "template/src")
    args = [a.replace("OUT", backend) for a in BUILD]
    check_every_point(drive(tmp_path, template, backend, args, sig), backend, exact=True, sig=sig)


@pytest.mark.parametrize("sig", ["KILL", "INT"])
def test_an_update_killed_at_every_durable_step_reruns_to_the_same_store(
    make_tree: MakeTree, tmp_path: Path, backend: str, sig: str
) -> None:
    template = tmp_path / "template"
    src = make_tree(SPEC, "template/src")
    args = [a.replace("OUT", backend) for a in BUILD]
    built = subprocess.run(
        [sys.executable, "-m", "dlpack", *(a.replace("{work}", str(template)) for a in args)],
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stderr
    shutil.copy2(src / "c0" / "00.png", src / "c0" / "12.png")  # one file added
    touched = src / "c1" / "01.png"  # one touched: same bytes, newer mtime
    os.utime(touched, ns=(touched.stat().st_atime_ns, touched.stat().st_mtime_ns + 10**9))
    result = drive(tmp_path, template, backend, [*args, "--update"], sig, content=True)
    # A rerun after the update published finds nothing to change and publishes nothing: every point
    # ends with the one history entry of the update itself.
    assert result["ref"]["content"]["manifest"]["history"] == [{"added": 1, "replaced": 0, "removed": 0}]
    check_every_point(result, backend, exact=False, sig=sig)


def test_an_overwrite_killed_at_every_durable_step_reruns_to_the_same_store(
    make_tree: MakeTree, tmp_path: Path, backend: str
) -> None:
    template = tmp_path / "template"
    make_tree(SPEC, "template/src")
    old = make_tree({f"d/{k}.png": ("rgb", 96, 64) for k in range(4)}, "old")
    args = [a.replace("OUT", backend) for a in BUILD]
    built = subprocess.run(
        [sys.executable, "-m", "dlpack", "build", str(old), str(template / backend), "--quiet", "--jobs", "1"],
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stderr
    check_every_point(drive(tmp_path, template, backend, [*args, "--overwrite"]), backend, exact=True)


@pytest.mark.parametrize("sig", ["KILL", "INT"])
def test_a_labelled_build_killed_at_every_durable_step_reruns_to_the_same_store(
    make_tree: MakeTree, tmp_path: Path, backend: str, sig: str
) -> None:
    """Boxes, box labels and the mask painted from polygons are journalled and resumed with the images."""
    template = tmp_path / "template"
    make_tree(SPEC, "template/src")
    images = [{"id": k + 1, "file_name": rel, "width": 96, "height": 64} for k, rel in enumerate(sorted(SPEC))]
    annotations = [
        {
            "id": k + 1,
            "image_id": k + 1,
            "category_id": 3 + k % 2,
            "bbox": [4.0 + k, 6.0, 30.0, 20.0],
            "area": 600.0,
            "iscrowd": 0,
            "segmentation": [[4.0 + k, 6.0, 34.0 + k, 6.0, 34.0 + k, 26.0, 4.0 + k, 26.0]],
        }
        for k in range(0, 12, 2)  # every other image has one box; the rest have none
    ]
    categories = [{"id": 3, "name": "scratch"}, {"id": 4, "name": "spot"}]
    coco = {"images": images, "annotations": annotations, "categories": categories}
    (template / "coco.json").write_text(json.dumps(coco))
    args = [a.replace("OUT", backend) for a in BUILD] + ["--labels", "coco:{work}/coco.json", "--size", "48x32"]
    result = drive(tmp_path, template, backend, args, sig)
    check_every_point(result, backend, exact=True, sig=sig)
    with dlpack.open(tmp_path / "work" / backend) as ds:  # the last rerun's store holds the labels
        assert ds.task == "detection" and ds.class_ids == (3, 4)
        assert np.allclose(ds[2]["boxes"], [[3.0, 3.0, 18.0, 13.0]])  # (6, 6, 36, 26) halved
        assert int(ds[2]["mask"][5, 5]) == 3 and int(ds[1]["mask"].max()) == 0


def test_a_dldataset_build_killed_at_every_durable_step_reruns_to_the_same_folder(
    make_tree: MakeTree, tmp_path: Path
) -> None:
    """``build --format dldataset`` packs into a hidden staging store, exports it to OUT, removes the
    store. Killed anywhere, the same command run again leaves OUT the complete DLDataset, byte for
    byte the uninterrupted build's, and nothing beside it: it resumes the staging store, or finds
    the export of its own plan in place and says so."""
    template = tmp_path / "template"
    make_tree(SPEC, "template/src")
    # Without --quiet: the rerun's summary says what it found.
    args = [a.replace("OUT", "out") for a in BUILD if a != "--quiet"] + ["--size", "48x32", "--format", "dldataset"]
    result = drive(tmp_path, template, "out", args)
    ref, points = result["ref"], result["points"]
    assert ref["rc"] == 0 and "dataset.json" in ref["files"] and len(ref["files"]) > 12, ref
    assert ref["siblings"] == ["out", "src"], ref
    assert [p["n"] for p in points] == list(range(1, ref["calls"] + 1))
    out = ref["out"]
    exported = 1 + next(i for i, step in enumerate(ref["steps"]) if step[0] == "rename" and step[2] == out)
    assert exported == ref["calls"], ref["steps"][exported - 1 :]  # the export into OUT is the last step
    for p in points:
        where = f"KILL after durable step {p['n']} of {ref['calls']}"
        assert p["killed"], f"{where}: the run was not killed there ({p['kill']})"
        assert p["rerun"].get("rc") == 0, f"{where}: the rerun failed: {p['rerun_log']}"
        assert p["siblings"] == ref["siblings"], f"{where}: leftovers {p['siblings']}"
        assert p["files"] == ref["files"], f"{where}: not byte-identical"
        if p["n"] >= exported:
            assert "exported already" in p["rerun_log"], f"{where}: {p['rerun_log']}"
        else:
            assert "exported already" not in p["rerun_log"], f"{where}: {p['rerun_log']}"
    assert any("resumed" in p["rerun_log"] for p in points)  # the staging store's blocks were kept


KILL_AT_EXPORT = r"""
import os, signal, sys
import dlpack.cli
out = sys.argv[1]
rename = os.rename
def renamed(src, dst, *a, **k):
    rename(src, dst, *a, **k)
    if os.fspath(dst) == out:  # the export is in place; the staging store is not removed yet
        os.kill(os.getpid(), signal.SIGKILL)
os.rename = renamed
sys.exit(dlpack.cli.main(sys.argv[2:]))
"""


def _dlpack(*args: str, kill_at_export: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(dlpack.__file__).parents[1]), *sys.path])}
    head = ["-m", "dlpack"] if kill_at_export is None else ["-c", KILL_AT_EXPORT, str(kill_at_export)]
    return subprocess.run([sys.executable, *head, *args], capture_output=True, text=True, env=env, timeout=300)


def test_a_dldataset_builds_staging_store_left_by_a_kill_is_removed_by_any_later_build_into_its_folder(
    make_tree: MakeTree, tmp_path: Path
) -> None:
    """Another plan into the same OUT is refused as "already exists" and, with --overwrite, replaces
    the export; either way the killed build's staging store (and its lock) is gone."""
    src = make_tree({f"c{k % 2}/{k}.png": ("rgb", 32, 24) for k in range(6)})
    for k, (other, rc) in enumerate(((["--size", "16x12"], 2), (["--size", "16x12", "--overwrite"], 0))):
        work = tmp_path / str(k)
        out, stage = work / "out", work / ".out.dlpack-stage.zarr"
        build = ["build", str(src), str(out), "--jobs", "1", "--format", "dldataset"]
        killed = _dlpack(*build, kill_at_export=out)
        assert killed.returncode == -9 and (out / "dataset.json").is_file() and stage.is_dir(), killed.stderr
        before = (out / "dataset.json").read_bytes()
        again = _dlpack(*build, *other)
        assert again.returncode == rc, again.stderr
        if rc == 2:
            assert "already exists" in again.stderr
            assert (out / "dataset.json").read_bytes() == before  # the export is kept as it was
        else:
            with dlpack.open(out) as ds:  # the new export, at the new size
                assert len(ds) == 6 and ds[0]["image"].shape[:2] == (12, 16)
        assert sorted(os.listdir(work)) == ["out"]


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_dldataset_build_refuses_and_keeps_a_folder_of_someone_elses_at_its_staging_name(
    make_tree: MakeTree, tmp_path: Path, overwrite: bool
) -> None:
    src = make_tree({f"c{k % 2}/{k}.png": ("rgb", 32, 24) for k in range(4)})
    out = tmp_path / "out"
    build = ["build", str(src), str(out), "--jobs", "1", "--format", "dldataset"]
    if overwrite:
        assert _dlpack(*build).returncode == 0
    before = (out / "dataset.json").read_bytes() if overwrite else None
    stage = tmp_path / ".out.dlpack-stage.zarr"
    stage.mkdir()
    (stage / "notes.txt").write_text("mine")
    done = _dlpack(*build, *(["--overwrite"] if overwrite else []))
    assert done.returncode == 2, done.stderr
    assert str(stage) in done.stderr and "not a dlpack store" in done.stderr
    assert (stage / "notes.txt").read_text() == "mine"
    assert (out / "dataset.json").read_bytes() == before if overwrite else not out.exists()
    assert sorted(os.listdir(tmp_path)) == [".out.dlpack-stage.zarr", *(["out"] if overwrite else []), "src"]
