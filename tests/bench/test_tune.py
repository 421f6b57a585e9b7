"""``dlpack tune``: the grid, the choice, the report and the rebuild trials, fed fixed measurements
(no timing is asserted anywhere), plus one real short run that checks the result's structure."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

import dlpack
import dlpack.tuning as tune_module
from dlpack.cli import main
from dlpack.read.loader import Loader, LoaderOptions
from dlpack.tuning import Budget, Measurement, TuneCell, choose, grid, simulated_step, tune

Capsys = pytest.CaptureFixture[str]
Key = tuple[Any, int, str]


def _folders(root: Path, count: int = 6, size: int = 24) -> Path:
    rng = np.random.default_rng(0)
    for name in ("a", "b"):
        (root / name).mkdir(parents=True)
        for i in range(count):
            img = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
            assert cv2.imwrite(str(root / name / f"{i}.png"), img)
    return root


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 12-image store of 16x16x3 and its source folder (``raw/``) beside it."""
    base = tmp_path_factory.mktemp("tune")
    _folders(base / "raw")
    dlpack.build(base / "raw", base / "s.zarr", size=(16, 16), quiet=True, jobs=1)
    return base


class Fixed:
    """A measuring function that returns set busy shares by cell and records what it was asked."""

    def __init__(self, busy: dict[Key, float] | None = None, default: float = 0.5) -> None:
        self.busy, self.default = busy or {}, default
        self.calls: list[tuple[Key, float, Budget, str]] = []

    def __call__(self, loader: Loader, step_s: float, budget: Budget) -> Measurement:
        o = loader.options
        key: Key = (o.workers, o.prefetch, o.effective_order)
        self.calls.append((key, step_s, budget, type(loader.source).__name__))
        busy = self.busy.get(key, self.default)
        return Measurement(busy, 1000.0 * busy, 2.0, 10, 0.1)


def _cells(result: Any) -> set[Key]:
    return {(c.workers, c.prefetch, c.order) for c in result.cells}


@pytest.fixture
def ints_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """The grid without workers='auto' (fewer cells to spell out; the "auto" cells are tested on their own)."""
    monkeypatch.setattr(tune_module, "DEFAULT_WORKERS", (0, 1, 2))


# ---------------------------------------------------------------- the grid


def test_the_grid_has_one_cell_per_order_without_threads_and_every_prefetch_with_them() -> None:
    cells = grid((0, 1, 2), (2, 4, 8), ("random", "block"))
    assert len(cells) == len(set(cells)) == 2 * (1 + 2 * 3)
    assert [c for c in cells if c[0] == 0] == [(0, 0, "random"), (0, 0, "block")]
    assert {(w, p) for w, p, o in cells if o == "block"} == {(0, 0)} | {(w, p) for w in (1, 2) for p in (2, 4, 8)}


def test_the_default_grid_covers_every_cell_once_and_warms_up_first(tiny: Path, ints_only: None) -> None:
    fixed = Fixed()
    result = tune(tiny / "s.zarr", 5, 4, measure=fixed)
    expected = set(grid((0, 1, 2), (2, 4, 8), ("random", "block")))
    assert _cells(result) == expected and len(result.cells) == len(expected)
    # One untimed warm-up cell (the defaults), then the grid three times over, each cell once per round,
    # all under the 5 ms step and the budget.
    assert len(fixed.calls) == 3 * len(expected) + 1
    d = LoaderOptions()  # the warm-up runs the defaults where the grid has them, else its first cell
    default_cell = (d.workers, d.prefetch, d.effective_order)
    assert fixed.calls[0][0] == (
        default_cell if default_cell in expected else grid((0, 1, 2), (2, 4, 8), ("random", "block"))[0]
    )
    rounds = [[c[0] for c in fixed.calls[1 + k * len(expected) : 1 + (k + 1) * len(expected)]] for k in range(3)]
    assert rounds[0] == rounds[1] == rounds[2] and set(rounds[0]) == expected
    assert {(c[1], c[2]) for c in fixed.calls} == {(0.005, Budget())}


def test_workers_auto_joins_the_grid_with_every_prefetch(tiny: Path) -> None:
    fixed = Fixed()
    result = tune(tiny / "s.zarr", 5, 4, measure=fixed, orders=["random"])
    assert {c.workers for c in result.cells} == {0, 1, 2, "auto"}
    assert {(c.workers, c.prefetch) for c in result.cells if c.workers == "auto"} == {("auto", p) for p in (2, 4, 8)}
    assert {k[0] for k, *_ in fixed.calls} == {0, 1, 2, "auto"}  # the loaders were made with workers="auto"


# ---------------------------------------------------------------- the choice


def _cell(workers: Any, prefetch: int, order: str, busy: float) -> TuneCell:
    return TuneCell(workers, prefetch, order, busy, 1.0, 1.0, 1, 1.0)


def test_the_highest_busy_share_wins_when_nothing_is_within_a_point() -> None:
    cells = [_cell(0, 0, "random", 0.90), _cell(1, 2, "random", 0.95), _cell(2, 8, "random", 0.985)]
    assert choose(cells) == cells[2]


def test_ties_go_to_random_order_then_fewer_threads_then_less_prefetch() -> None:
    a = _cell(2, 2, "random", 0.990)
    b = _cell(1, 8, "random", 0.983)  # within 1 point of the best: one thread fewer wins
    c = _cell(1, 4, "random", 0.981)  # and of the one-thread cells, less prefetch
    d = _cell(0, 0, "block", 0.9895)  # tied too, with no thread, but block order shuffles less well
    e = _cell(0, 0, "random", 0.975)  # 1.5 points behind: not tied
    assert choose([a, b, c, d, e]) == c
    assert choose([a, b, d]) == b
    assert choose([d, _cell(1, 2, "block", 0.99), _cell(1, 2, "sequential", 0.999)]) == d  # block before sequential
    assert choose([_cell(0, 0, "block", 0.999), a]) == a  # 0.9 points ahead: tied, so random wins
    assert choose([_cell(0, 0, "block", 0.999), b]).order == "block"  # 1.6 points ahead: block wins
    assert choose([a, _cell("auto", 2, "random", 0.995)]) == a  # "auto" counts as the most threads
    assert choose([a, _cell("auto", 2, "random", 0.999), _cell(2, 2, "block", 0.9)]) == a
    assert choose([_cell(2, 2, "random", 0.985), _cell("auto", 2, "random", 1.0)]).workers == "auto"  # 1.5 ahead


def test_tune_recommends_by_the_rule_and_reports_the_defaults(tiny: Path) -> None:
    busy = {("auto", 4, "random"): 0.93, (1, 4, "random"): 0.988, (1, 2, "block"): 0.991, (2, 8, "block"): 0.995}
    result = tune(tiny / "s.zarr", 20, 4, measure=Fixed(busy, default=0.6))
    assert (result.recommended.workers, result.recommended.prefetch, result.recommended.order) == (1, 4, "random")
    assert result.predicted_busy == 0.988
    assert result.default is not None and result.default.busy_share == 0.93
    assert result.options() == dlpack.LoaderOptions(batch_size=4, workers=1, prefetch=4, order="random")
    assert result.snippet() == 'loader = ds.loader(batch_size=4, workers=1, prefetch=4, order="random")'


def test_the_snippet_runs_as_written(tiny: Path, ints_only: None) -> None:
    result = tune(tiny / "s.zarr", 5, 3, measure=Fixed({(1, 8, "random"): 0.99}))
    scope: dict[str, Any] = {"ds": dlpack.open(tiny / "s.zarr")}
    exec(result.snippet(), scope)
    loader = scope["loader"]
    assert loader.options == result.options() and sum(len(b["index"]) for b in loader) == 12


# ---------------------------------------------------------------- the report


def test_the_table_has_one_row_per_cell_and_marks_the_choice(tiny: Path) -> None:
    result = tune(tiny / "s.zarr", 5, 4, measure=Fixed({(1, 2, "random"): 0.97}))
    lines = result.table().splitlines()
    assert lines[0].split() == ["workers", "prefetch", "order", "busy", "%", "img/s", "wait", "p99", "ms", "batches"]
    rows = lines[1:]
    assert len(rows) == len(result.cells)
    chosen = [r for r in rows if r.rstrip().endswith("*")]
    assert len(chosen) == 1 and chosen[0].split()[:4] == ["1", "2", "random", "97.0"]
    assert sum(r.rstrip().endswith("d") for r in rows) == 1  # the defaults ("auto", 4, random)
    text = result.summary()
    assert "recommended: 97.0 % busy predicted; the defaults: 50.0 %" in text
    assert result.snippet() in text and "the rule: the highest busy share" in text
    assert f"{len(result.cells)} cells, each run 3 time(s) interleaved (the median counts) for at most 100 " in text


def test_to_dict_holds_options_busy_every_cell_and_the_machine(tiny: Path) -> None:
    result = tune(tiny / "s.zarr", 5, 4, measure=Fixed({(0, 0, "block"): 0.999}), max_batches=7, max_seconds=0.5)
    doc = json.loads(json.dumps(result.to_dict()))
    assert doc["recommended"] == {"batch_size": 4, "workers": 0, "prefetch": 0, "order": "block"}  # 49.9 points ahead
    assert doc["predicted_busy"] == 0.999 and doc["default_busy"] == 0.5 and doc["step_ms"] == 5.0
    assert doc["budget"] == {"batches": 7, "seconds": 0.5}
    assert len(doc["cells"]) == len(result.cells) == 20  # workers 0 (2 orders), 1, 2 and "auto" x 3 prefetch x 2
    assert set(doc["cells"][0]) >= {"workers", "prefetch", "order", "busy_share", "images_per_s", "wait_p99_ms"}
    assert doc["machine"]["cores"] >= 1 and doc["count"] == 12 and doc["image"] == "16x16x3"
    assert doc["trials"] == [] and doc["rebuild"] is None


def test_repeats_are_interleaved_and_their_median_counts(tiny: Path, ints_only: None) -> None:
    seq = iter([0.5] + [0.1, 0.9, 0.5] * 2)  # warm-up, then three runs of two cells

    def measure(loader: Loader, step_s: float, budget: Budget) -> Measurement:
        return Measurement(next(seq), 1.0, 1.0, 1, 1.0)

    result = tune(tiny / "s.zarr", 5, 4, workers=[0, 1], prefetch=[2], orders=["random"], repeat=3, measure=measure)
    # Runs per cell in grid order: cell (0,0) gets 0.1, 0.5, 0.9; cell (1,2) gets 0.9, 0.1, 0.5.
    assert [c.busy_share for c in result.cells] == [0.5, 0.5]
    assert result.recommended.workers == 0  # tied: fewer threads


def test_an_options_object_is_the_same_as_its_keywords(tiny: Path) -> None:
    grid_keywords = {"workers": (0, 1), "prefetch": (2,), "orders": ("random",), "repeat": 1}
    by_keywords = tune(tiny / "s.zarr", 5, 4, measure=Fixed({(1, 2, "random"): 0.9}), **grid_keywords)
    opts = dlpack.TuneOptions(step_ms=5, batch_size=4, **grid_keywords)  # type: ignore[arg-type]
    by_options = tune(tiny / "s.zarr", options=opts, measure=Fixed({(1, 2, "random"): 0.9}))
    assert _cells(by_options) == _cells(by_keywords) and by_options.recommended == by_keywords.recommended
    with pytest.raises(dlpack.OptionError, match="unknown keyword 'max_batch'; did you mean 'max_batches'"):
        tune(tiny / "s.zarr", 5, max_batch=3, measure=Fixed())


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"step_ms": 0}, "step_ms must be a positive number"),
        ({"step_ms": float("nan")}, "step_ms must be a positive number"),
        ({"step_ms": "5"}, "step_ms must be a positive number"),
        ({"batch_size": 0}, "batch_size must be an integer >= 1"),
        ({"orders": ["random", "shuffled"]}, "orders must be random, block or sequential, got 'shuffled'"),
        ({"orders": []}, "orders must be a non-empty list"),
        ({"prefetch": [0]}, "prefetch values must be integers >= 1"),
        ({"workers": [1, 1]}, "workers repeats a value"),
        ({"workers": [-1]}, "workers must be"),
        ({"max_batches": 0}, "max_batches must be an integer >= 1"),
        ({"max_seconds": -1.0}, "max_seconds must be a positive number"),
        ({"repeat": 0}, "repeat must be an integer >= 1"),
    ],
)
def test_bad_options_are_option_errors_naming_the_option(tiny: Path, kwargs: dict[str, Any], match: str) -> None:
    args = {"step_ms": 5.0, **kwargs}
    with pytest.raises(dlpack.OptionError, match=match):
        tune(tiny / "s.zarr", args.pop("step_ms"), **args, measure=Fixed())


def test_a_missing_store_is_a_store_not_found_error(tmp_path: Path) -> None:
    with pytest.raises(dlpack.StoreNotFoundError):
        tune(tmp_path / "none.zarr", 5, measure=Fixed())


def test_the_cli_reports_bad_input_with_exit_2(tiny: Path, tmp_path: Path, capsys: Capsys) -> None:
    assert main(["tune", str(tmp_path / "none.zarr"), "--step-ms", "5"]) == 2
    assert "dlpack: error:" in capsys.readouterr().err
    assert main(["tune", str(tiny / "s.zarr"), "--step-ms", "-1", "--json"]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert doc["error"]["type"] == "OptionError" and "step_ms" in doc["error"]["message"]
    assert main(["tune", str(tiny / "s.zarr")]) == 2  # --step-ms is required
    assert "--step-ms" in capsys.readouterr().err


# ---------------------------------------------------------------- rebuild trials


def test_trials_cover_the_sizes_and_codecs_and_remove_their_folder(
    tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ints_only: None
) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tune_module.tempfile, "tempdir", str(scratch))
    fixed = Fixed({(0, 0, "random"): 0.999})
    result = tune(tiny / "s.zarr", 5, 4, workers=[0, 1], source=tiny / "raw", sample=5, measure=fixed)
    assert [(t.size, t.codec, t.baseline) for t in result.trials] == [
        ((16, 16), "none", True),
        ((8, 8), "none", False),
        ((16, 16), "lz4", False),
        ((16, 16), "zstd", False),
    ]  # 4x4 is below the smallest size tried
    assert all(t.error is None and t.bytes_per_image and t.bytes_per_image > 0 for t in result.trials)
    assert result.trials[0].read_ratio == 1.0
    # Each trial is read as a 12-sample epoch of its 5 images with the chosen options: once untimed,
    # then 3 times interleaved over the trials, with no step and under the step.
    trial_calls = [c for c in fixed.calls if c[3] == "Cycled"]
    assert [c[1] for c in trial_calls] == [0.0] * 4 + [0.0, 0.005] * 4 * 3 and {c[0] for c in trial_calls} == {
        (0, 0, "random")
    }
    assert list(scratch.iterdir()) == []  # the temporary builds are gone
    text = result.summary()
    assert "rebuild trials from" in text and "5 images built at each setting" in text
    assert "(as the store is built)" in text and "a rebuild would gain nothing the step would notice" in text


def test_the_advice_names_the_flags_of_the_best_trial(tiny: Path, ints_only: None) -> None:
    class Trials(Fixed):
        def __call__(self, loader: Loader, step_s: float, budget: Budget) -> Measurement:
            m = super().__call__(loader, step_s, budget)
            if type(loader.source).__name__ != "Cycled":
                return m
            side = loader.source.image_layout()[0][0]  # type: ignore[index]
            return Measurement({16: 0.80, 8: 0.99}[side], 1e4 / side, 1.0, 10, 0.1)

    result = tune(tiny / "s.zarr", 5, 4, workers=[0], source=tiny / "raw", sample=4, measure=Trials())
    advice = result.rebuild_advice()
    assert advice is not None and "--size 8x8" in advice and "--compression" not in advice
    assert (
        "read 2.00x as fast and keep the step 99.0 % busy against 80.0 %" in advice
        and "a smaller size changes what the model sees" in advice
    )
    assert [round(t.read_ratio or 0, 2) for t in result.trials] == [1.0, 2.0, 1.0, 1.0]


def test_a_source_that_is_not_a_folder_is_a_source_error(tiny: Path, tmp_path: Path) -> None:
    with pytest.raises(dlpack.SourceError, match="does not exist"):
        tune(tiny / "s.zarr", 5, source=tmp_path / "nowhere", measure=Fixed(), workers=[0])


def test_cycled_reads_sample_i_mod_n(tiny: Path) -> None:
    ds = dlpack.open(tiny / "s.zarr")
    view = tune_module.Cycled(ds, 30)
    assert len(view) == 30 and isinstance(view, dlpack.BatchSource)
    batch = view.get_batch(np.array([0, 13, 29]))
    np.testing.assert_array_equal(batch["image"], ds.get_batch(np.array([0, 1, 5]))["image"])


def test_cycled_is_read_as_its_store_is(tiny: Path) -> None:
    """A trial store's view keeps what the loader reads off a store: its codec (for the thread
    count) and that its rows are independent (grouped reads), so a trial measures the real path."""
    ds = dlpack.open(tiny / "s.zarr")
    view = tune_module.Cycled(ds, 30)
    assert view.manifest is ds.manifest and view.batch_rows_independent is True
    loader = dlpack.Loader(view, dlpack.LoaderOptions(batch_size=4, seed=1, workers=0))
    assert loader._grouped and len(loader.batches()) == 8
    for indices, batch in zip(loader.batches(), loader, strict=True):
        np.testing.assert_array_equal(batch["image"], ds.get_batch(indices % len(ds))["image"])


# ---------------------------------------------------------------- the real thing, briefly


def test_the_simulated_step_takes_about_its_time_and_zero_takes_none() -> None:
    import time

    t0 = time.perf_counter()
    simulated_step(0.0)
    simulated_step(0.004)
    assert time.perf_counter() - t0 >= 0.004  # at least its length; no upper bound on a shared machine


def test_a_real_short_run_gives_every_cell_finite_values_and_valid_options(tiny: Path) -> None:
    result = tune(tiny / "s.zarr", 1, 4, max_batches=4, max_seconds=0.05)
    assert _cells(result) == set(grid((0, 1, 2, "auto"), (2, 4, 8), ("random", "block")))
    for c in result.cells:
        assert 0.0 <= c.busy_share <= 1.0 and c.images_per_s > 0 and c.batches >= 1
        assert all(math.isfinite(v) for v in (c.busy_share, c.images_per_s, c.wait_p99_ms, c.seconds))
    assert isinstance(result.options(), dlpack.LoaderOptions)
    assert result.recommended in result.cells and result.predicted_busy == result.recommended.busy_share
    json.dumps(result.to_dict(), allow_nan=False)


def test_the_cli_prints_the_report_or_one_json_document(tiny: Path, tmp_path: Path, capsys: Capsys) -> None:
    args = ["tune", str(tiny / "s.zarr"), "--step-ms", "1", "--batch-size", "4", "--max-batches", "2"]
    args += ["--max-seconds", "0.02", "--order", "random"]
    assert main(args) == 0
    captured = capsys.readouterr()
    assert "recommended:" in captured.out and "loader = ds.loader(batch_size=4" in captured.out
    assert "dlpack tune:" in captured.err  # progress goes to stderr
    file = tmp_path / "tune.json"
    assert main([*args, "--json", "--json-file", str(file)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc == json.loads(file.read_text()) and {c["order"] for c in doc["cells"]} == {"random"}
    assert dlpack.LoaderOptions(**doc["recommended"]).batch_size == 4


def test_trials_resize_as_the_store_was_built(tiny: Path, tmp_path: Path, ints_only: None) -> None:
    # The 24 px sources are enlarged to 32x32: a trial that did not upscale would fail on every image.
    dlpack.build(tiny / "raw", tmp_path / "up.zarr", size=(32, 32), allow_upscale=True, quiet=True, jobs=1)
    result = tune(tmp_path / "up.zarr", 5, 4, workers=[0], source=tiny / "raw", sample=3, measure=Fixed())
    assert [(t.size, t.error) for t in result.trials[:3]] == [((32, 32), None), ((16, 16), None), ((8, 8), None)]


def test_a_loaded_machine_is_said_to_make_noisy_figures(tiny: Path, ints_only: None) -> None:
    import dataclasses

    result = tune(tiny / "s.zarr", 5, 4, workers=[0], measure=Fixed())
    quiet = dataclasses.replace(result, machine={**result.machine, "cores_usable": 2, "load_average": [1.5, 1, 1]})
    busy = dataclasses.replace(result, machine={**result.machine, "cores_usable": 2, "load_average": [12.8, 9, 5]})
    assert quiet.busy_machine() is None and "the machine was busy" not in quiet.summary()
    note = busy.busy_machine()
    assert note is not None and "load average 12.8 on 2 cores" in note and note in busy.summary()
    assert len(result.to_dict()["machine"]["load_average"]) == 3
