"""``dlpack bench``: figures, JSON schema, table, cold cache, folder baseline, step simulation, errors, plot."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

import dlpack
from dlpack.bench import BenchCell, BenchOptions, BenchReport, check_outputs, run_bench
from dlpack.bench.machine import machine_info, mount_of
from dlpack.bench.pagecache import evict, files_under, prime, resident_fraction
from dlpack.cli import main
from dlpack.errors import MissingExtraError, OptionError

Capsys = pytest.CaptureFixture[str]

#: Stored resolution (W, H) of the fixture stores; the source images are larger, so stores are downscaled.
SIZE = (32, 24)
COUNT = 40

#: Every key of a cell in the JSON document, and the types its value may have (None: null allowed).
CELL_TYPES: dict[str, tuple[Any, ...]] = {
    "target": (str,),
    "path": (str,),
    "kind": (str,),
    "order": (str,),
    "cache": (str,),
    "repeats": (int,),
    "images": (int,),
    "seconds": (float,),
    "images_per_s": (float,),
    "images_per_s_min": (float,),
    "images_per_s_max": (float,),
    "spread": (float,),
    "decoded_mb_per_s": (float,),
    "disk_mb_per_s": (float,),
    "latency_ms_p50": (float,),
    "latency_ms_p99": (float,),
    "peak_rss_mb": (float, None),
    "resident_at_start": (float, None),
    "evicted": (bool, None),
    "eviction_verified": (bool, None),
    "step_ms": (float, None),
    "busy_fraction": (float, None),
    "wait_fraction": (float, None),
    "step_images_per_s": (float, None),
    "wait_ms_p50": (float, None),
    "wait_ms_p99": (float, None),
    "vs_sequential": (float, None),
    "vs_folder": (float, None),
    "runs": (list,),
    "step_runs": (list,),
}
RUN_TYPES: dict[str, tuple[Any, ...]] = {
    "images": (int,),
    "batches": (int,),
    "seconds": (float,),
    "decoded_bytes": (int,),
    "disk_bytes": (float,),
    "latency_ms_p50": (float,),
    "latency_ms_p99": (float,),
    "resident_at_start": (float, None),
    "evicted": (bool, None),
    "step_ms": (float, None),
    "busy_seconds": (float, None),
    "wait_seconds": (float,),
    "images_per_s": (float,),
    "busy_fraction": (float, None),
    "wait_fraction": (float,),
}


def _check_types(d: dict[str, Any], types: dict[str, tuple[Any, ...]], where: str) -> None:
    assert set(d) == set(types), f"{where}: keys differ: {set(d) ^ set(types)}"
    for key, allowed in types.items():
        v = d[key]
        ok = any(
            (t is None and v is None)
            or (t is bool and type(v) is bool)
            or (t is int and type(v) is int)
            or (t is float and type(v) is float)
            or (t in (str, list) and isinstance(v, t))
            for t in allowed
        )
        assert ok, f"{where}: {key}={v!r} is not one of {allowed}"


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A folder of 40 PNGs (64x48, two classes) and the Zarr and HDF5 stores built from it at 32x24."""
    root = tmp_path_factory.mktemp("bench")
    src = root / "src"
    rng = np.random.default_rng(0)
    for i in range(COUNT):
        d = src / ("a" if i % 2 else "b")
        d.mkdir(parents=True, exist_ok=True)
        ok, buf = cv2.imencode(".png", rng.integers(0, 256, (48, 64, 3), dtype=np.uint8))
        assert ok
        (d / f"{i:03d}.png").write_bytes(buf.tobytes())
    out = {"src": src}
    for name in ("s.zarr", "s.h5"):
        dlpack.build(src, root / name, size=SIZE, jobs=1, quiet=True)
        out[name] = root / name
    return out


@pytest.fixture(scope="module")
def report(data: dict[str, Path]) -> BenchReport:
    """One small run over all three targets, both caches, both orders, two repeats."""
    return run_bench([data["src"], data["s.zarr"], data["s.h5"]], samples=16, repeat=2, batch_size=8, quiet=True)


# ---------------------------------------------------------------- options


def test_options_normalise_comma_lists_and_size() -> None:
    o = BenchOptions(orders="sequential, random,block", caches="cold", size="64x48")  # type: ignore[arg-type]
    assert (o.orders, o.caches, o.size) == (("sequential", "random", "block"), ("cold",), (64, 48))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"orders": "sideways"}, "order (--order) must be a comma-separated list of sequential, random, block"),
        ({"caches": "warm,tepid"}, "cache (--cache) must be"),
        ({"caches": "warm,warm"}, "lists a value twice"),
        ({"samples": 10, "seconds": 1.0}, "either samples"),
        ({"samples": 0}, "samples must be an integer >= 1"),
        ({"seconds": 0}, "seconds must be a number > 0"),
        ({"repeat": 0}, "repeat must be an integer >= 1"),
        ({"batch_size": 0}, "batch_size must be an integer >= 1"),
        ({"step_ms": -1}, "step_ms must be a number of milliseconds >= 0"),
        ({"size": "0x512"}, "size must be WIDTHxHEIGHT with both > 0"),
    ],
)
def test_bad_options_say_what_is_wrong(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(OptionError, match=message.replace("(", r"\(").replace(")", r"\)")):
        BenchOptions(**kwargs)


# ---------------------------------------------------------------- the report


def test_json_has_every_figure_with_its_type(report: BenchReport) -> None:
    doc = json.loads(report.to_json())
    assert set(doc) == {
        "schema", "dlpack_version", "started", "seconds", "options", "machine", "load_average",
        "peak_rss_scope", "targets", "cells", "ratios", "notes",
    }  # fmt: skip
    assert doc["schema"] == "dlpack-bench/1"
    assert doc["options"]["orders"] == ["sequential", "random"] and doc["options"]["samples"] == 16
    m = doc["machine"]
    for key in ("cpu", "cores", "memory_gb", "os", "python", "libraries", "disks"):
        assert key in m
    assert isinstance(m["cores"], int) and m["libraries"]["numpy"] == np.__version__
    assert len(m["disks"]) == 3 and all("free_gb" in d for d in m["disks"])
    assert [t["kind"] for t in doc["targets"]] == ["folder", "zarr", "hdf5"]
    assert all(t["image_shape"] == [SIZE[1], SIZE[0], 3] and t["count"] == COUNT for t in doc["targets"])
    assert len(doc["cells"]) == 3 * 2 * 2
    for c in doc["cells"]:
        where = f"{c['target']} {c['cache']} {c['order']}"
        _check_types(c, CELL_TYPES, where)
        assert len(c["runs"]) == 2 and c["step_runs"] == []
        for r in c["runs"]:
            _check_types(r, RUN_TYPES, where)
            assert r["images"] >= 16 and r["images"] % 8 == 0 and r["seconds"] > 0
        assert c["images_per_s_min"] <= c["images_per_s"] <= c["images_per_s_max"]
        assert (c["vs_sequential"] is None) == (c["order"] == "sequential")
        assert (c["vs_folder"] is None) == (c["kind"] == "folder")
        assert (c["evicted"] is None) == (c["cache"] == "warm")
    random = [r for r in doc["ratios"] if r["name"] == "random/sequential"]
    folder = [r for r in doc["ratios"] if r["name"] == "store/folder"]
    assert len(random) == 3 * 2 and len(folder) == 2 * 2 * 2


def test_ratios_are_the_quotients_of_the_cells(report: BenchReport) -> None:
    z_rand = report.cell("s.zarr", "random", "warm")
    z_seq = report.cell("s.zarr", "sequential", "warm")
    f_rand = report.cell("src", "random", "warm")
    assert z_rand is not None and z_seq is not None and f_rand is not None
    assert z_rand.vs_sequential == pytest.approx(z_rand.images_per_s / z_seq.images_per_s)
    assert z_rand.vs_folder == pytest.approx(z_rand.images_per_s / f_rand.images_per_s)


def test_disk_and_decoded_bytes_follow_the_target(report: BenchReport, data: dict[str, Path]) -> None:
    image = SIZE[0] * SIZE[1] * 3
    files = sorted(p for p in data["src"].rglob("*.png"))
    mean_png = sum(p.stat().st_size for p in files) / len(files)
    for c in report.cells:
        for r in c.runs:
            assert r.decoded_bytes == r.images * image  # folders are decoded to the store's resolution
            per_image = r.disk_bytes / r.images
            if c.kind == "folder":
                assert 0.5 * mean_png < per_image < 2 * mean_png  # the PNG files' sizes
            else:
                store = next(t for t in report.targets if t["name"] == c.target)
                assert per_image == pytest.approx(store["disk_bytes_per_image"])


def test_table_is_aligned_and_has_a_row_per_cell(report: BenchReport) -> None:
    text = report.table()
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("target"))
    rows = lines[header : header + 2 + len(report.cells)]
    assert set(rows[1]) <= {"-", " "}
    assert len({len(r) for r in rows}) == 1, "every line of the table has the same width"
    for col in ("images/s", "spread", "disk MB/s", "vs folder"):
        assert col in rows[0]
    body = rows[2:]
    for c in report.cells:
        cache = c.cache if c.cache == "warm" or c.eviction_verified else "cold*"
        assert sum(r.split()[:3] == [c.target, c.order, cache] for r in body) == 1
    assert "machine:" in text


def test_cold_runs_report_eviction(report: BenchReport, data: dict[str, Path]) -> None:
    cold = [c for c in report.cells if c.cache == "cold"]
    assert cold
    for c in cold:
        assert isinstance(c.evicted, bool) and isinstance(c.eviction_verified, bool)
        assert all(isinstance(r.evicted, bool) for r in c.runs)
    measurable = resident_fraction(files_under(data["s.zarr"])) is not None
    m = mount_of(data["s.zarr"])
    if measurable and hasattr(os, "posix_fadvise") and not (m and m["fstype"] in ("tmpfs", "ramfs")):
        assert all(c.eviction_verified for c in cold), [(c.target, c.resident_at_start) for c in cold]
    else:
        assert any("verified" in n or "NOT cold" in n or "stayed cached" in n for n in report.notes)
    for c in report.cells:
        if c.cache == "warm" and c.resident_at_start is not None:
            assert c.resident_at_start > 0.9  # primed before the warm runs


def test_evict_drops_a_file_just_read_from_the_page_cache(tmp_path: Path) -> None:
    path = tmp_path / "blob.bin"
    path.write_bytes(os.urandom(4 * 2**20))
    prime([path])
    before = resident_fraction([path])
    if before is None:
        pytest.skip("mincore is not available on this platform: residency cannot be measured")
    m = mount_of(path)
    if m and m["fstype"] in ("tmpfs", "ramfs"):
        pytest.skip(f"{tmp_path} is on {m['fstype']}: its files live in memory and cannot be evicted")
    if not hasattr(os, "posix_fadvise"):
        pytest.skip("no posix_fadvise on this platform")
    assert before > 0.5
    assert evict([path]) is True
    after = resident_fraction([path])
    assert after is not None and after < 0.5


def test_machine_info_has_the_facts_a_reader_needs(tmp_path: Path) -> None:
    m = machine_info([tmp_path])
    assert isinstance(m["cpu"], str) and m["cpu"]
    assert m["cores"] >= 1 and m["python"].count(".") == 2
    assert m["disks"][0]["path"] == str(tmp_path)
    json.dumps(m)


# ---------------------------------------------------------------- folder targets


def test_a_folder_alone_needs_a_size(data: dict[str, Path]) -> None:
    with pytest.raises(OptionError, match="--size WxH"):
        run_bench([data["src"]], samples=8, repeat=1, caches="warm", quiet=True)


def test_a_folder_alone_is_resized_to_size(data: dict[str, Path]) -> None:
    rep = run_bench([data["src"]], size=(20, 10), samples=8, repeat=1, caches="warm", orders="random", quiet=True)
    (c,) = rep.cells
    assert (c.kind, rep.targets[0]["image_shape"]) == ("folder", [10, 20, 3])
    assert c.runs[0].decoded_bytes == c.runs[0].images * 20 * 10 * 3
    assert c.vs_folder is None and c.vs_sequential is None


# ---------------------------------------------------------------- step simulation


def _step_cell(target: Path, step_ms: float, **kwargs: Any) -> BenchCell:
    rep = run_bench(
        [target],
        samples=32,
        batch_size=4,
        repeat=1,
        caches="warm",
        orders="sequential",
        step_ms=step_ms,
        quiet=True,
        **kwargs,
    )
    (c,) = rep.cells
    assert len(c.step_runs) == 1 and len(c.runs) == 1
    return c


def test_a_slow_step_is_timed_apart_from_the_wait(data: dict[str, Path]) -> None:
    c = _step_cell(data["s.h5"], 50.0)
    assert c.step_ms == 50.0 and c.busy_fraction is not None and c.wait_fraction is not None
    (run,) = c.step_runs
    assert run.busy_seconds is not None
    # 8 batches of a 50 ms step: a sleep never returns early, so the step takes at least 0.4 s ...
    assert run.busy_seconds >= 8 * 0.050
    # ... and sets the pace: no run can beat one batch of 4 per 50 ms, however fast the reads.
    assert run.seconds >= run.busy_seconds
    assert c.step_images_per_s is not None and c.step_images_per_s <= 4 / 0.050 * (1 + 1e-9)
    # Busy (time in the step) and wait (time blocked on the loader) are disjoint parts of the run.
    assert run.wait_seconds > 0
    assert run.busy_seconds + run.wait_seconds <= run.seconds * (1 + 1e-9)
    assert c.busy_fraction == pytest.approx(run.busy_seconds / run.seconds)
    assert c.wait_fraction == pytest.approx(run.wait_seconds / run.seconds)


def test_a_zero_step_is_never_busy(data: dict[str, Path]) -> None:
    c = _step_cell(data["src"], 0.0, size=SIZE)
    (run,) = c.step_runs
    # A 0 ms step runs nothing, so all the time not spent waiting for data is loop overhead.
    assert run.busy_seconds == 0.0 and c.busy_fraction == 0.0
    assert c.wait_fraction is not None and 0 < run.wait_seconds <= run.seconds


def test_no_step_no_step_figures(report: BenchReport) -> None:
    assert all(c.busy_fraction is None and c.step_ms is None and not c.step_runs for c in report.cells)
    assert "busy @" not in report.table()


# ---------------------------------------------------------------- command line


def test_cli_bench_prints_the_table_and_writes_json(data: dict[str, Path], tmp_path: Path, capsys: Capsys) -> None:
    out = tmp_path / "b.json"
    argv = ["bench", str(data["src"]), str(data["s.zarr"]), "--samples", "8", "--repeat", "1", "--cache", "warm",
            "--order", "random", "--batch-size", "4", "--json-file", str(out), "--quiet"]  # fmt: skip
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "images/s" in text and "s.zarr" in text and "src" in text
    doc = json.loads(out.read_text())
    assert doc["options"]["batch_size"] == 4 and doc["options"]["orders"] == ["random"]
    assert [c["target"] for c in doc["cells"]] == ["src", "s.zarr"]


@pytest.mark.parametrize("what", ["missing", "text file", "empty folder", "bad order"])
def test_cli_bad_targets_exit_2_with_a_clear_error(
    what: str, data: dict[str, Path], tmp_path: Path, capsys: Capsys
) -> None:
    opts = ["--samples", "4", "--repeat", "1", "--cache", "warm", "--quiet"]
    if what == "missing":
        target, expect = tmp_path / "nope.zarr", "does not exist"
    elif what == "text file":
        target = tmp_path / "notes.txt"
        target.write_text("not a store\n")
        expect = "neither a dlpack store"
    elif what == "empty folder":
        target = tmp_path / "empty"
        target.mkdir()
        expect = "no images found"
    else:
        target, expect = data["s.zarr"], "order (--order) must be"
        opts += ["--order", "sideways"]
    assert main(["bench", str(target), *opts]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dlpack: error:") and expect in err and "Traceback" not in err
    if what != "bad order":
        assert str(target) in err


def test_plot_is_written_when_matplotlib_is_installed(report: BenchReport, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "bench.png"
    report.plot(out)
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    img = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    assert img is not None and img.shape[1] > 600 and img.shape[0] > 400


def test_cli_plot_and_step_panel(data: dict[str, Path], tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "p.png"
    argv = ["bench", str(data["s.h5"]), "--samples", "8", "--repeat", "1", "--cache", "warm", "--step-ms", "1",
            "--batch-size", "4", "--plot", str(out), "--quiet"]  # fmt: skip
    assert main(argv) == 0
    assert out.read_bytes()[:4] == b"\x89PNG"


def test_missing_matplotlib_is_reported_before_the_run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    monkeypatch.setitem(sys.modules, "matplotlib.backends.backend_agg", None)
    with pytest.raises(MissingExtraError, match=r"pip install 'dlpack-datasets\[plot\]'"):
        check_outputs(plot_path=tmp_path / "x.png")


def test_output_folder_must_exist(tmp_path: Path) -> None:
    with pytest.raises(OptionError, match="does not exist"):
        check_outputs(json_path=tmp_path / "no" / "such" / "b.json")


@pytest.mark.slow
def test_with_a_step_the_table_ends_with_what_the_busy_column_means(data: dict[str, Path]) -> None:
    targets = [data["src"], data["s.zarr"], data["s.h5"]]
    rep = run_bench(targets, samples=32, batch_size=4, repeat=1, caches="warm", orders="random", step_ms=5, quiet=True)
    table = rep.table().splitlines()
    last = table[len(table) - 1 - table[::-1].index("") + 1 :]  # the paragraph after the last blank line
    line = " ".join(part.strip() for part in last)
    assert line == rep.wait_line()
    waits = [f"{1 - (c.busy_fraction or 0):.0%}".replace("%", " %") for c in rep.cells]
    folder, zarr, h5 = waits
    assert line == (
        f"training from the folder would wait {folder} of the time; from the store {zarr} (s.zarr), {h5} (s.h5) "
        "(a 5 ms step per batch, random order, warm cache)"
    )
    one = run_bench(
        targets[:2], samples=32, batch_size=4, repeat=1, caches="warm", orders="random", step_ms=5, quiet=True
    )
    assert re.fullmatch(
        r"training from the folder would wait \d+ % of the time; from the store \d+ % \(a 5 .*", one.wait_line() or ""
    )


def test_without_a_step_or_a_folder_there_is_no_wait_line(report: BenchReport, data: dict[str, Path]) -> None:
    assert report.wait_line() is None and "would wait" not in report.table()
    stores = run_bench(
        [data["s.zarr"]], samples=16, batch_size=4, repeat=1, caches="warm", orders="random", step_ms=5, quiet=True
    )
    assert stores.wait_line() is None


@pytest.mark.slow
def test_the_wait_line_quotes_the_order_shuffled_training_reads(data: dict[str, Path]) -> None:
    targets = [data["src"], data["s.zarr"]]
    both = run_bench(
        targets, samples=16, batch_size=4, repeat=1, caches="warm", orders="sequential,random", step_ms=2, quiet=True
    )
    folder, store = both.cell("src", "random", "warm"), both.cell("s.zarr", "random", "warm")
    assert folder is not None and store is not None
    line = both.wait_line() or ""
    assert ", random order, warm cache)" in line, line  # sequential was measured first, random is quoted
    assert f"would wait {1 - (folder.busy_fraction or 0):.0%}".replace("%", " %") in line
    assert f"from the store {1 - (store.busy_fraction or 0):.0%}".replace("%", " %") in line
    only_seq = run_bench(
        targets, samples=8, batch_size=4, repeat=1, caches="warm", orders="sequential", step_ms=2, quiet=True
    )
    assert "sequential order" in (only_seq.wait_line() or "")
    assert "shuffled training reads in random order, which this run did not measure" in (only_seq.wait_line() or "")


def test_disk_bytes_count_only_the_arrays_a_read_touches(data: dict[str, Path], tmp_path: Path) -> None:
    import _augment as aug

    from dlpack.bench.targets import resolve_target

    store = tmp_path / "aug.zarr"
    dlpack.build(data["src"], store, size=SIZE, jobs=1, quiet=True)
    before = resolve_target(store)
    dlpack.augment(store, 4, aug.config(), seed=1, jobs=1, quiet=True)
    after = resolve_target(store)
    with dlpack.open(store) as ds:
        images = ds.reader.array_nbytes_on_disk("images")
        assert any(name.startswith("images_v") for name in ds.manifest.arrays)
    # Four variant arrays of the images more than quadruple the store, but a plain read touches none of them.
    assert after.bytes_on_disk > 4 * images
    assert after.read_bytes == before.read_bytes
    assert images <= (after.read_bytes or 0) < 1.5 * images
    rep = run_bench([store], samples=16, batch_size=8, repeat=1, caches="warm", orders="random", quiet=True)
    run = rep.cells[0].runs[0]
    assert run.disk_bytes / run.images == pytest.approx((after.read_bytes or 0) / COUNT)
    assert rep.targets[0]["read_bytes_on_disk"] == after.read_bytes
    assert rep.targets[0]["bytes_on_disk"] == after.bytes_on_disk


@pytest.mark.slow
def test_cli_table_fits_100_columns_for_several_targets(data: dict[str, Path], tmp_path: Path, capsys: Capsys) -> None:
    long = tmp_path / "a-store-with-a-rather-long-descriptive-name-lz4-fit.zarr"
    dlpack.build(data["src"], long, size=SIZE, jobs=1, quiet=True)
    argv = ["bench", str(data["src"]), str(data["s.zarr"]), str(data["s.h5"]), str(long), "--samples", "8",
            "--repeat", "1", "--cache", "warm,cold", "--order", "sequential,random", "--batch-size", "4",
            "--step-ms", "12.5", "--quiet"]  # fmt: skip
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(len(line) for line in lines) <= 100, [line for line in lines if len(line) > 100]
    header = next(line for line in lines if line.startswith("target"))
    assert "busy @ 12.5 ms" in header and "images/s" in header
    body = lines[lines.index(header) + 2 : lines.index(header) + 2 + 16]
    assert len(body) == 16 and all(len(r) == len(header) for r in body)
    shortened = [r.split()[0] for r in body if r.startswith("a-store-")]
    assert len(shortened) == 4 and all("..." in n and n.endswith("fit.zarr") for n in shortened)  # both ends kept
    assert any("would wait" in line for line in lines)
