"""Augmentation config files: JSON and YAML, HALCON-style and albumentations documents, and every bad one."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dlpack.errors import ConfigError, MissingExtraError
from dlpack.transforms.base import Pipeline, Targets, variant_rng
from dlpack.transforms.config import AugmentConfig, load_config, read_operations
from dlpack.transforms.halcon_ops import CROP_PARAMETERS

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"

HALCON_DOC = {
    "augmentation_percentage": 80,
    "mirror": "rc",
    "rotate": 90,
    "brightness_variation": 20,
    "contrast_variation": 0.2,
    "min_area": 4,
}
HALCON_YAML = """\
# the same config as HALCON_DOC
augmentation_percentage: 80
mirror: rc
rotate: 90
brightness_variation: 20
contrast_variation: 0.2
min_area: 4
"""


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_bytes(text.encode("utf-8"))
    return path


def _image() -> Targets:
    img = np.random.default_rng(0).integers(0, 256, (24, 24, 3), dtype=np.uint8)
    return Targets(img, boxes=np.array([[2, 3, 12, 20]], np.float32), box_labels=np.array([4], np.int32))


def test_json_and_yaml_load_the_same_pipeline(tmp_path: Path) -> None:
    pytest.importorskip("yaml")
    text = json.dumps(HALCON_DOC, indent=2)
    j = load_config(_write(tmp_path, "aug.json", text))
    y = load_config(_write(tmp_path, "aug.yaml", HALCON_YAML))
    yml = load_config(_write(tmp_path, "aug.yml", HALCON_YAML))
    assert j.operations() == y.operations() == yml.operations()
    assert (j.kind, j.format, j.name, j.text) == ("halcon", "json", "aug.json", text)
    assert (y.kind, y.format, y.name, y.text) == ("halcon", "yaml", "aug.yaml", HALCON_YAML)
    t = _image()
    for v in range(1, 6):
        a, ra = j.augmenter(t, variant_rng(1, 0, v))
        b, rb = y.augmenter(t, variant_rng(1, 0, v))
        assert ra == rb and np.array_equal(a.image, b.image)


def test_the_manifest_record_keeps_the_text_verbatim(tmp_path: Path) -> None:
    text = '{\r\n  "mirror": "c",  \r\n  "augmentation_percentage": 100\r\n}\r\n'
    cfg = load_config(_write(tmp_path, "My Aug.JSON", text))
    assert cfg.manifest_record() == {"kind": "halcon", "format": "json", "text": text, "name": "My Aug.JSON"}
    assert cfg.engine == "dlpack"
    ops = cfg.operations()
    assert ops["kind"] == "halcon" and ops["engine"] == "dlpack"
    assert json.loads(json.dumps(ops)) == ops


def test_the_operation_list_reads_back_into_the_same_pipeline(tmp_path: Path) -> None:
    doc = {
        **HALCON_DOC,
        "rotate_range": 20,
        "crop_pixel": 16,
        "brightness_variation_spot": 30,
        "saturation_variation": 0.3,
    }
    cfg = load_config(doc)
    assert isinstance(cfg.augmenter, Pipeline)
    back = read_operations(json.loads(json.dumps(cfg.operations())))
    assert back == cfg.augmenter and back.to_dict() == cfg.operations()
    t = _image()
    for v in range(1, 10):
        a, ra = cfg.augmenter(t, variant_rng(2, 5, v))
        b, rb = back(t, variant_rng(2, 5, v))
        assert ra == rb and np.array_equal(a.image, b.image) and np.array_equal(a.boxes, b.boxes)


def test_an_object_loads_like_a_file() -> None:
    cfg = load_config(HALCON_DOC)
    assert isinstance(cfg, AugmentConfig)
    assert cfg.format == "json" and json.loads(cfg.text) == HALCON_DOC


def test_the_halcon_example_loads() -> None:
    cfg = load_config(EXAMPLES / "augment_halcon.json", task="detection")
    assert cfg.kind == "halcon"
    names = [t["__class_fullname__"] for t in cfg.operations()["transforms"][0]["transforms"]]
    assert "mirror" in names and "rotate" in names


@pytest.mark.parametrize("name", ["augment_albumentations.json", "augment_albumentations.yaml"])
def test_the_albumentations_examples_load(name: str) -> None:
    pytest.importorskip("dlpack.transforms.albumentations")
    pytest.importorskip("yaml")
    cfg = load_config(EXAMPLES / name)
    assert cfg.kind == "albumentations" and cfg.engine == "dlpack"
    assert cfg.format == ("yaml" if name.endswith(".yaml") else "json")


def test_the_albumentations_examples_are_one_document() -> None:
    yaml = pytest.importorskip("yaml")
    doc = json.loads((EXAMPLES / "augment_albumentations.json").read_text(encoding="utf-8"))
    assert yaml.safe_load((EXAMPLES / "augment_albumentations.yaml").read_text(encoding="utf-8")) == doc
    assert set(doc) == {"__version__", "transform"}


# ------------------------------------------------------------------ albumentations documents


@pytest.fixture
def fake_albumentations(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any]]:
    """A stand-in for dlpack.transforms.albumentations that records how the loader called it."""
    calls: list[tuple[str, Any]] = []

    class Engine:
        engine = "albumentations"

        def __init__(self, doc: Any, where: str = "config") -> None:
            calls.append(("engine", doc))

        def __call__(self, t: Targets, rng: np.random.Generator) -> tuple[Targets, list[dict[str, Any]]]:
            return t, []

        def to_dict(self) -> dict[str, Any]:
            return {"engine": "albumentations"}

    def reader(doc: Any, where: str) -> Pipeline:
        calls.append(("reader", (doc, where)))
        return Pipeline((), kind="albumentations")

    module = types.ModuleType("dlpack.transforms.albumentations")
    module.AlbumentationsEngine = Engine  # type: ignore[attr-defined]
    module.pipeline_from_albumentations = reader  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "dlpack.transforms.albumentations", module)
    return calls


ALBU_DOC = {"__version__": "2.0.8", "transform": {"__class_fullname__": "Compose", "p": 1.0, "transforms": []}}


def test_an_albumentations_document_goes_to_the_albumentations_reader(
    tmp_path: Path, fake_albumentations: list[tuple[str, Any]]
) -> None:
    path = _write(tmp_path, "albu.json", json.dumps(ALBU_DOC))
    cfg = load_config(path)
    assert fake_albumentations == [("reader", (ALBU_DOC, str(path)))]
    assert (cfg.kind, cfg.engine, cfg.name) == ("albumentations", "dlpack", "albu.json")


def test_the_albumentations_engine_gets_the_whole_document(
    tmp_path: Path, fake_albumentations: list[tuple[str, Any]]
) -> None:
    cfg = load_config(_write(tmp_path, "albu.json", json.dumps(ALBU_DOC)), engine="albumentations")
    assert fake_albumentations == [("engine", ALBU_DOC)]
    assert cfg.engine == "albumentations" and cfg.operations() == {"engine": "albumentations"}


def test_the_albumentations_engine_refuses_a_halcon_config(tmp_path: Path) -> None:
    path = _write(tmp_path, "halcon.json", json.dumps(HALCON_DOC))
    with pytest.raises(ConfigError, match=r"halcon\.json.*HALCON-style"):
        load_config(path, engine="albumentations")


def test_an_unknown_engine_is_refused() -> None:
    with pytest.raises(ConfigError, match="engine must be one of dlpack, albumentations, got 'torch'"):
        load_config(HALCON_DOC, engine="torch")


# ------------------------------------------------------------------ crop operations and labels


@pytest.mark.parametrize("param", CROP_PARAMETERS)
@pytest.mark.parametrize("task", ["detection", "segmentation", "anomaly"])
def test_crop_operations_are_refused_for_labelled_stores_unless_opted_in(param: str, task: str) -> None:
    value = {"crop_percentage": 80, "crop_pixel": 16, "rotate_range": 10}[param]
    doc = {"mirror": "c", param: value}
    with pytest.raises(ConfigError, match=rf"{param} is for classification only.*{task}.*allow_crop_with_labels"):
        load_config(doc, task=task)
    cfg = load_config({**doc, "allow_crop_with_labels": True}, task=task)
    names = [t["__class_fullname__"] for t in cfg.operations()["transforms"][0]["transforms"]]
    assert names == ["mirror", param]


@pytest.mark.parametrize("task", ["classification", "none", None])
def test_crop_operations_are_fine_for_classification(task: str | None) -> None:
    load_config({"crop_percentage": 80, "crop_pixel": 16, "rotate_range": 10}, task=task)


def test_with_the_opt_in_boxes_follow_a_crop() -> None:
    cfg = load_config(
        {"augmentation_percentage": 100, "crop_pixel": 16, "allow_crop_with_labels": True}, task="detection"
    )
    t = _image()
    out, record = cfg.augmenter(t, variant_rng(0, 0, 1))
    x, y = record[0]["x"], record[0]["y"]
    assert out.boxes is not None and len(out.boxes) == 1  # a window of 16 at x, y <= 8 always holds part of it
    box = np.clip(np.array([2, 3, 12, 20], float) - [x, y, x, y], 0, 16) * 1.5  # 16 px zoomed to 24
    assert np.allclose(out.boxes[0], box)


# ------------------------------------------------------------------ bad configs


@pytest.mark.parametrize(
    ("doc", "field", "reason"),
    [
        ({"mirorr": "rc"}, "mirorr", "did you mean 'mirror'"),
        ({"rotation": 90}, "rotation", "did you mean 'rotate'"),
        ({"brightness": 10}, "brightness", "did you mean 'brightness_variation'"),
        ({"mirror": "x"}, "mirror", "'off', 'r', 'c' or 'rc'"),
        ({"mirror": 1}, "mirror", "'off', 'r', 'c' or 'rc'"),
        ({"rotate": 45}, "rotate", "0, 90 or 180"),
        ({"rotate": "90"}, "rotate", "must be a number"),
        ({"rotate_range": 200}, "rotate_range", r"0\.\.180"),
        ({"rotate_range": 12.5}, "rotate_range", "whole number"),
        ({"brightness_variation": 300}, "brightness_variation", r"0\.\.255"),
        ({"brightness_variation": True}, "brightness_variation", "must be a number"),
        ({"brightness_variation_spot": -1}, "brightness_variation_spot", r"0\.\.255"),
        ({"contrast_variation": 2}, "contrast_variation", r"0\.\.1,"),
        ({"saturation_variation": "high"}, "saturation_variation", "must be a number"),
        ({"crop_percentage": 0}, "crop_percentage", r"1\.\.100"),
        ({"crop_percentage": "on"}, "crop_percentage", "must be a number"),
        ({"crop_pixel": 0}, "crop_pixel", r"1\.\.inf"),
        ({"crop_pixel": 10.5}, "crop_pixel", "whole number"),
        ({"mirror": "c", "augmentation_percentage": 150}, "augmentation_percentage", r"0\.\.100"),
        ({"mirror": "c", "augmentation_percentage": None}, "augmentation_percentage", "must be a number"),
        ({"mirror": "c", "allow_crop_with_labels": "yes"}, "allow_crop_with_labels", "true or false"),
        ({"mirror": "c", "min_area": -1}, "min_area", r"0\.\.inf"),
        ({"mirror": "c", "min_visibility": 2}, "min_visibility", r"0\.0\.\.1\.0"),
        ({"mirror": "c", "class_ids_no_orientation": [1, "a"]}, "class_ids_no_orientation", "list of class ids"),
        ({"mirror": "off", "rotate": 0}, "no operation", "every variant would equal"),
        ({"mirror": "c", "augmentation_percentage": 0}, "augmentation_percentage", "every variant would equal"),
    ],
)
def test_a_bad_config_names_the_file_and_the_field(
    tmp_path: Path, doc: dict[str, Any], field: str, reason: str
) -> None:
    path = _write(tmp_path, "bad.json", json.dumps(doc))
    with pytest.raises(ConfigError, match=rf"bad\.json: .*{field}.*{reason}|bad\.json: .*{reason}.*{field}"):
        load_config(path)


def test_an_unknown_name_lists_what_a_halcon_config_reads() -> None:
    with pytest.raises(ConfigError) as info:
        load_config({"mirorr": "rc"})
    for name in ("mirror", "rotate_range", "crop_pixel", "augmentation_percentage", "allow_crop_with_labels"):
        assert name in str(info.value)


def test_half_an_albumentations_document_says_what_it_lacks() -> None:
    with pytest.raises(ConfigError, match="needs both a '__version__' and a 'transform' key"):
        load_config({"transform": {"__class_fullname__": "Compose", "transforms": []}})


@pytest.mark.parametrize(
    ("name", "text", "match"),
    [
        (
            "bad.json",
            '{\n  "mirror": "rc",\n  "rotate": 90,,\n}\n',
            r"bad\.json is not valid JSON: .* at line 3, column 16",
        ),
        ("bad.json", '{"mirror": "rc", "mirror": "c"}', r"bad\.json: the key 'mirror' appears twice"),
        ("bad.json", '["mirror"]', r"bad\.json: an augmentation config is an object"),
        ("bad.yaml", "mirror: rc\nrotate: [90\n", r"bad\.yaml: line 3, column 1: not valid YAML"),
        ("bad.yaml", "- mirror\n", r"bad\.yaml: an augmentation config is an object"),
        (
            "bad.yaml",
            "mirror: rc\nrotate: 90\nmirror: c\n",
            r"bad\.yaml: line 3, column 1: the key 'mirror' appears twice",
        ),
        ("bad.txt", "{}", r"bad\.txt: an augmentation config is a \.json, \.yaml or \.yml file"),
    ],
)
def test_an_unreadable_config_names_the_file_and_the_line(tmp_path: Path, name: str, text: str, match: str) -> None:
    if name.endswith(".yaml"):
        pytest.importorskip("yaml")
    with pytest.raises(ConfigError, match=match):
        load_config(_write(tmp_path, name, text))


def test_a_missing_or_undecodable_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"missing\.json does not exist"):
        load_config(tmp_path / "missing.json")
    (tmp_path / "folder.json").mkdir()
    with pytest.raises(ConfigError, match=r"folder\.json is a folder, not a file"):
        load_config(tmp_path / "folder.json")
    (tmp_path / "latin.json").write_bytes(b'{"mirror": "\xe9"}')
    with pytest.raises(ConfigError, match=r"latin\.json is not UTF-8 text"):
        load_config(tmp_path / "latin.json")


def test_yaml_without_pyyaml_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "yaml", None)  # `import yaml` now fails as if it were not installed
    with pytest.raises(MissingExtraError, match=r"dlpack-datasets\[yaml\]"):
        load_config(_write(tmp_path, "aug.yaml", HALCON_YAML))


@pytest.mark.slow
def test_reading_a_config_registers_every_operation_and_import_dlpack_stays_light() -> None:
    code = (
        "import sys, dlpack, dlpack.transforms as T\n"
        "assert 'dlpack.transforms.config' not in sys.modules and 'cv2' not in sys.modules\n"
        "names = set(T.REGISTRY)\n"
        "assert {'mirror', 'rotate', 'rotate_range', 'crop_pixel', 'OneOf'} <= names, names\n"
        "print('ok')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr
