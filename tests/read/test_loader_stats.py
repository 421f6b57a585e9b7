"""loader.stats(): one record per pass, counting what was handed out and where the caller waited."""

from __future__ import annotations

import time
from pathlib import Path

import cv2
import numpy as np
import pytest

import dlpack


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("stats")
    rng = np.random.default_rng(0)
    for k in range(20):
        (root / "src" / f"c{k % 2}").mkdir(parents=True, exist_ok=True)
        ok, buf = cv2.imencode(".png", rng.integers(0, 256, (16, 16, 3), dtype=np.uint8))
        assert ok
        (root / "src" / f"c{k % 2}" / f"{k:02d}.png").write_bytes(buf.tobytes())
    dlpack.build(root / "src", root / "s.zarr", size=(16, 16), jobs=1, quiet=True)
    return root / "s.zarr"


@pytest.mark.parametrize("workers", [0, 2])
def test_each_pass_records_its_batches_images_and_bytes(store: Path, workers: int) -> None:
    loader = dlpack.open(store).loader(batch_size=6, workers=workers, seed=1)
    for _ in range(2):
        for _batch in loader:
            pass
    stats = loader.stats()
    assert [s.epoch for s in stats] == [0, 1]
    for s in stats:
        assert (s.batches, s.images, s.bytes, s.complete) == (4, 20, 20 * 16 * 16 * 3, True)
        assert 0 <= s.wait_seconds <= s.seconds
        assert 0 <= s.wait_share <= 1 and s.busy_share == pytest.approx(1 - s.wait_share)
        assert s.wait_p50_ms <= s.wait_p99_ms


def test_a_stopped_pass_is_partial_and_the_caller_s_step_is_not_counted_as_waiting(store: Path) -> None:
    loader = dlpack.open(store).loader(batch_size=5, workers=2, prefetch=4, seed=1)
    for k, _batch in enumerate(loader):
        time.sleep(0.05)  # the step: read-ahead has every batch ready long before it is asked for
        if k == 2:
            break
    (s,) = loader.stats()
    assert (s.batches, s.images, s.complete) == (3, 15, False)
    assert s.seconds >= 0.1  # two whole steps and a third cut short inside the pass' timing
    assert s.wait_share < 0.5


def test_report_prints_one_line_per_pass(store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    loader = dlpack.open(store).loader(batch_size=10, report=True)
    for _batch in loader:
        pass
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("epoch 0: ") and "img/s, waited " in err[0]
    assert loader.stats()[0].line() == err[0]
    assert np.isfinite(loader.stats()[0].to_dict()["images_per_s"])
