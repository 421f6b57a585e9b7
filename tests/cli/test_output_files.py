"""Files a command writes besides a store (``--json-file``, ``bench --plot``, ``preview OUT.png``)
never overwrite what the command reads, and are written whole."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import store_files

from dlpack.bench import check_outputs
from dlpack.cli import main
from dlpack.errors import OptionError

Capsys = pytest.CaptureFixture[str]


@pytest.fixture
def src(make_tree: Callable[..., Path]) -> Path:
    return make_tree({"cat/0.png": "rgb", "cat/1.jpg": "rgb", "dog/2.png": "rgb"})


@pytest.fixture
def store(src: Path, tmp_path: Path, backend: str) -> Path:
    out = tmp_path / ("s.zarr" if backend == "zarr" else "s.h5")
    assert main(["build", str(src), str(out), "--size", "16x12", "--quiet", "--jobs", "1"]) == 0
    return out


def _refused(argv: list[str], capsys: Capsys, *words: str) -> str:
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    for w in words:
        assert w in err, err
    return err


def _intact(store: Path, snapshot: dict[str, bytes], capsys: Capsys) -> None:
    assert _files(store) == snapshot
    assert main(["verify", str(store)]) == 0


def _files(path: Path) -> dict[str, bytes]:
    return store_files(path) if path.is_dir() else {path.name: path.read_bytes()}


@pytest.mark.parametrize("cmd", ["info", "verify"])
def test_json_file_naming_the_store_or_a_file_inside_it_is_refused(cmd: str, store: Path, capsys: Capsys) -> None:
    before = _files(store)
    inside = store / "manifest.json" if store.is_dir() else store
    _refused([cmd, str(store), "--json-file", str(store)], capsys, "is the store", str(store))
    if store.is_dir():
        _refused([cmd, str(store), "--json-file", str(inside)], capsys, "lies inside the store", "manifest.json")
    # Another spelling of the same path, a symbolic link to it, a hard link to a file of it.
    other = store.parent / "." / store.name
    _refused([cmd, str(store), "--json-file", str(other)], capsys, "is the store")
    link = store.parent / "link.json"
    link.symlink_to(inside)
    _refused([cmd, str(store), "--json-file", str(link)], capsys)
    hard = store.parent / "hard.json"
    os.link(inside, hard)
    _refused([cmd, str(store), "--json-file", str(hard)], capsys, "hard.json")
    _intact(store, before, capsys)


def test_json_file_inside_a_source_or_output_is_refused(src: Path, store: Path, tmp_path: Path, capsys: Capsys) -> None:
    before = dict(_files(src))
    out = tmp_path / "b.zarr"
    _refused(["build", str(src), str(out), "--json-file", str(src / "cat" / "r.json")], capsys, "inside SRC")
    assert not out.exists() and _files(src) == before
    exp = tmp_path / "exp"
    exp.mkdir()
    _refused(["export", str(store), "--to", "coco", str(exp), "--json-file", str(exp / "r.json")], capsys, "OUT")
    assert not list(exp.iterdir())
    _refused(["tune", str(store), "--step-ms", "1", "--source", str(src), "--json-file", str(src / "t.json")],
             capsys, "--source")  # fmt: skip
    assert _files(src) == before


def test_preview_refuses_its_json_file_on_its_own_png_and_inside_the_store(
    store: Path, tmp_path: Path, capsys: Capsys
) -> None:
    png = tmp_path / "p.png"
    _refused(["preview", str(store), str(png), "--json-file", str(png)], capsys, "the same file")
    assert not png.exists()
    before = _files(store)
    _refused(["preview", str(store), str(png), "--json-file", str(store)], capsys, "is the store")
    assert not png.exists()
    _intact(store, before, capsys)


def test_bench_refuses_a_report_or_plot_inside_a_benchmarked_folder(src: Path, tmp_path: Path, capsys: Capsys) -> None:
    before = _files(src)
    _refused(["bench", str(src), "--json-file", str(src / "b.json")], capsys, "bench target", str(src))
    _refused(["bench", str(src), "--plot", str(src / "dog" / "b.png")], capsys, "bench target")
    assert _files(src) == before
    with pytest.raises(OptionError, match="bench target"):
        check_outputs(json_path=src / "x.json", targets=[src])


def test_json_file_is_written_whole_and_a_link_at_it_keeps_its_target(store: Path, tmp_path: Path) -> None:
    real = tmp_path / "reports" / "info.json"
    real.parent.mkdir()
    real.write_text("old", encoding="utf-8")
    link = tmp_path / "info.json"
    link.symlink_to(real)
    assert main(["info", str(store), "--json-file", str(link)]) == 0
    assert link.is_symlink() and json.loads(real.read_text(encoding="utf-8"))["count"] == 3
    assert sorted(p.name for p in real.parent.iterdir()) == ["info.json"]  # no temporary file left
