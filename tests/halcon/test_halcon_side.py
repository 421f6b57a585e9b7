"""The HALCON side as far as a machine without HALCON can tell: the training example checks its
inputs and fails without HALCON, ``to_hdict.py`` says what it needs, dlpack reads back its own
DLDataset export with variants, and a built DLDataset's marker names no vanished path."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import cv2
import numpy as np
import pytest

import dlpack
from dlpack.cli import main
from dlpack.sample import make_sample

ROOT = Path(__file__).resolve().parents[2]
Capsys = pytest.CaptureFixture[str]


@pytest.fixture(autouse=True)
def no_halcon(monkeypatch: pytest.MonkeyPatch) -> None:
    """``import halcon`` fails, as on every machine without a HALCON installation."""
    monkeypatch.setitem(sys.modules, "halcon", None)


@pytest.fixture
def store(tmp_path: Path) -> Path:
    make_sample(tmp_path / "raw", 8, size=32, seed=0)
    dlpack.build(tmp_path / "raw", tmp_path / "s.zarr", size=(16, 16), quiet=True, jobs=1)
    return tmp_path / "s.zarr"


def _train_main() -> Callable[[list[str]], int]:
    spec = importlib.util.spec_from_file_location("train_halcon", ROOT / "examples" / "train_halcon.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    run: Callable[[list[str]], int] = module.main
    return run


def test_the_training_example_checks_the_store_and_model_before_halcon_and_fails_without_it(
    store: Path, tmp_path: Path, capsys: Capsys
) -> None:
    run = _train_main()
    model = tmp_path / "m.hdl"
    assert run([str(tmp_path / "nothing.zarr"), "--model", str(model)]) == 2
    err = capsys.readouterr().err
    assert "nothing.zarr" in err and "HALCON is not available" not in err
    assert run([str(store), "--model", str(model)]) == 2
    err = capsys.readouterr().err
    assert "m.hdl does not exist" in err and "HALCON is not available" not in err
    model.write_bytes(b"")
    assert run([str(store), "--model", str(model), "--split", "nosuch"]) == 2
    err = capsys.readouterr().err
    assert "has no splits" in err and "HALCON is not available" not in err
    assert run([str(store), "--model", str(model)]) == 2  # everything else is right: HALCON is what is missing
    captured = capsys.readouterr()
    assert "HALCON is not available, nothing was trained" in captured.err and "Traceback" not in captured.err
    assert captured.out == ""


@pytest.mark.slow
def test_to_hdict_without_halcon_says_what_it_needs_in_one_line(store: Path, tmp_path: Path) -> None:
    out = tmp_path / "dl"
    assert main(["export", str(store), "--to", "dldataset", str(out)]) == 0
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, "-S", str(out / "to_hdict.py")],  # -S: no site-packages, so no HALCON binding
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "mvtec-halcon" in lines[0] and "licence" in lines[0] and "import halcon fails" in lines[0]
    assert not (out / "dataset.hdict").exists()


def test_an_export_with_variants_reads_back_through_the_dldataset_source(
    store: Path, tmp_path: Path, capsys: Capsys
) -> None:
    config = tmp_path / "flip.json"
    config.write_text(json.dumps({"augmentation_percentage": 100, "mirror": "c"}), encoding="utf-8")
    dlpack.augment(store, 2, config, jobs=1, quiet=True)
    out = tmp_path / "dl"
    assert main(["export", str(store), "--to", "dldataset", str(out), "--include-variants"]) == 0
    doc = json.loads((out / "dataset.json").read_text(encoding="utf-8"))
    back = tmp_path / "rt.zarr"
    code = main(["build", str(out / "images"), str(back), "--labels", f"dldataset:{out / 'dataset.json'}"])
    assert code == 0, capsys.readouterr().err
    with dlpack.open(store) as ds, dlpack.open(back) as rt:
        assert len(rt) == len(doc["samples"]) == 3 * len(ds)
        by_name = {rt[j]["source"]: j for j in range(len(rt))}
        for s in doc["samples"]:
            i = s.get("dlpack_variant_of", s["image_id"])
            want = ds.variant(i, s["dlpack_variant"]) if "dlpack_variant" in s else ds[i]
            got = rt[by_name[s["image_file_name"]]]
            np.testing.assert_array_equal(got["image"], want["image"])
            assert rt.classes[got["label"]] == ds.classes[want["label"]]


@pytest.mark.parametrize("value", [-1, "1", 1.5, True])
def test_a_variant_key_that_is_not_a_non_negative_integer_is_refused(
    store: Path, tmp_path: Path, capsys: Capsys, value: object
) -> None:
    out = tmp_path / "dl"
    assert main(["export", str(store), "--to", "dldataset", str(out)]) == 0
    doc = json.loads((out / "dataset.json").read_text(encoding="utf-8"))
    doc["samples"][0]["dlpack_variant_of"] = value
    (out / "dataset.json").write_text(json.dumps(doc), encoding="utf-8")
    assert main(["build", str(out), str(tmp_path / "rt.zarr")]) == 2
    err = capsys.readouterr().err
    assert "dlpack_variant_of must be a non-negative integer" in err and "image_id 0" in err


def test_a_built_dldataset_marker_names_the_source_not_the_removed_staging_store(tmp_path: Path) -> None:
    src = tmp_path / "raw"
    for k, cls in enumerate(("good", "bad")):
        (src / cls).mkdir(parents=True)
        assert cv2.imwrite(str(src / cls / f"{k}.png"), np.full((8, 8, 3), 50 * k, np.uint8))
    out = tmp_path / "halcon"
    assert main(["build", str(src), str(out), "--format", "dldataset"]) == 0
    marker = json.loads((out / ".dlpack-export.json").read_text(encoding="utf-8"))
    assert marker["built_from"] == str(src) and "store" not in marker
    paths = [v for v in marker.values() if isinstance(v, str) and os.path.isabs(v)]
    assert paths and all(os.path.exists(p) for p in paths)
    assert sorted(os.listdir(tmp_path)) == ["halcon", "raw"]
