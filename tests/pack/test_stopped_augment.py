"""A build stopped once its store is published, while it computes the augmentation variants
(``build --augment K``): the same command finishes it, never asking for ``--overwrite``."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import _augment as aug
import pytest

import dlpack

# Builds killed at every durable step, each a subprocess. `make test-fast` leaves them out.
pytestmark = pytest.mark.slow

MakeTree = Callable[..., Path]

#: 9 noise PNGs stored at 96x64x3 (18 KiB) in 64 KiB shards: 3 images a block, 3 blocks.
SPEC = {f"c{k % 2}/{k:02d}.png": ("rgb", 96, 64) for k in range(9)}
PRELOAD = f"sys.path.insert(0, {str(Path(__file__).parents[1])!r}); import _augment; _augment.install_loader()"


def _args(out: str, config: str, k: int = 2) -> list[str]:
    return ["build", "{work}/src", out, "--size", "96x64", "--shard-bytes", "65536", "--jobs", "1", "--quiet",
            "--augment", str(k), "--augment-config", config]  # fmt: skip


def test_build_augment_killed_at_every_durable_step_is_finished_by_the_same_command(
    make_tree: MakeTree, tmp_path: Path, backend: str
) -> None:
    """SIGKILL right after each rename, replace and fsync of ``build --augment 2`` (the build's own
    steps, its publish, then every step of the variants), then the same command again: it ends with
    what an uninterrupted run writes, and no rerun advises --overwrite."""
    from _kills import drive

    template = tmp_path / "template"
    make_tree(SPEC, "template/src")
    aug.write_config(template / "c.json")
    args = [a for a in _args("{work}/" + backend, "{work}/c.json") if a != "--quiet"]  # the summary says what it did
    result = drive(tmp_path, template, backend, args, content=True, preload=PRELOAD)
    ref = result["ref"]
    assert ref["rc"] == 0 and ref["content"]["manifest"]["augment"]["k"] == 2, ref
    out = str(tmp_path / "work" / backend)
    publish = 1 + next(i for i, step in enumerate(ref["steps"]) if step[0] == "_renameat2" and step[2] == out)
    assert ref["calls"] - publish >= 5, ref["steps"]  # the variants have durable steps of their own
    for p in result["points"]:
        where = f"killed after durable step {p['n']} of {ref['calls']} ({ref['steps'][p['n'] - 1]})"
        assert p["killed"], f"{where}: not killed there ({p['kill']})"
        assert p["rerun"].get("rc") == 0, f"{where}: the rerun failed: {p['rerun_log']}"
        assert "--overwrite" not in p["rerun_log"], f"{where}: {p['rerun_log']}"
        assert p["siblings"] == ref["siblings"], f"{where}: leftovers {p['siblings']}"
        assert p["content"] == ref["content"], f"{where}: other content"
        if backend.endswith(".zarr"):
            assert p["files"] == ref["files"], f"{where}: not the same files"
    # A kill once the images were published: the rerun builds no image again.
    after = [p for p in result["points"] if p["n"] >= publish]
    for p in after:
        assert "published already" in p["rerun_log"] or "built already" in p["rerun_log"], p["rerun_log"]


def _dlpack(*args: str) -> subprocess.CompletedProcess[str]:
    """The CLI in a fresh process, reading the test's augmentation config."""
    code = "import sys, _augment, dlpack.cli; _augment.install_loader(); sys.exit(dlpack.cli.main(sys.argv[1:]))"
    path = os.pathsep.join([str(Path(__file__).parents[1]), str(Path(dlpack.__file__).parents[1])])
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": path},
        timeout=300,
    )  # fmt: skip


def test_the_same_build_with_augment_adds_finishes_or_refuses_by_what_the_store_holds(
    make_tree: MakeTree, tmp_path: Path, backend: str
) -> None:
    src = make_tree(SPEC)
    out = tmp_path / backend
    config = aug.write_config(tmp_path / "c.json")
    build = [a.replace("{work}/src", str(src)) for a in _args(str(out), str(config)) if a != "--quiet"]
    plain = build[: build.index("--augment")]
    assert _dlpack(*plain).returncode == 0
    # The images this build writes are there, without variants: only the variants are computed.
    first = _dlpack(*build)
    assert first.returncode == 0, first.stderr
    assert "(built already" in first.stdout and "18 variants" in first.stdout, first.stdout
    with dlpack.open(out) as ds:
        assert ds.variants == 2 and ds.verify() == []
    # The variants asked for are there: done, nothing computed.
    again = _dlpack(*build)
    assert again.returncode == 0 and "(complete already)" in again.stdout, again.stdout + again.stderr
    # Other variants, or another plan: the store is not this build's to finish.
    other = _dlpack(*["3" if a == "2" else a for a in build])  # --augment 3
    assert other.returncode == 2, other.stdout
    assert "already exists with other augmentation variants (2 per image); pass --overwrite" in other.stderr
    resized = _dlpack(*[a.replace("96x64", "80x64") for a in build])
    assert resized.returncode == 2 and f"{out} already exists; pass --overwrite" in resized.stderr
    with dlpack.open(out) as ds:
        assert ds.variants == 2 and ds[0]["image"].shape[:2] == (64, 96)
