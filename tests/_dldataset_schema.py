"""The keys and value types of a HALCON DLDataset, per task, as HALCON's dataset procedures use
them; ``problems(doc, task)`` lists every way a parsed ``dataset.json`` breaks them.

Types: ``int`` is a JSON integer (never a bool), ``real`` a JSON number written with a fraction or
exponent (``3.0``, which ``json`` parses as a float), ``str`` a string; ``[int]`` etc. a list of them.
"""

from __future__ import annotations

from typing import Any

INT, REAL, STR = "int", "real", "str"
INTS, REALS, STRS = "[int]", "[real]", "[str]"

#: Top-level keys every DLDataset has, and those of one task.
TOP_REQUIRED = {"image_dir": STR, "class_names": STRS, "class_ids": INTS, "samples": "[sample]"}
TOP_BY_TASK: dict[str, tuple[dict[str, str], dict[str, str]]] = {  # (required, optional)
    "classification": ({}, {}),
    "detection": ({}, {}),
    "segmentation": ({"segmentation_dir": STR}, {}),
    "anomaly": ({}, {"anomaly_dir": STR}),
    "none": ({}, {}),
}
#: Per-sample keys: every sample's, then each task's (required, optional).
SAMPLE_REQUIRED = {"image_id": INT, "image_file_name": STR}
SAMPLE_OPTIONAL = {"split": STR}
SAMPLE_BY_TASK: dict[str, tuple[dict[str, str], dict[str, str]]] = {
    "classification": ({"image_label_id": INT}, {}),
    "detection": (
        {"bbox_label_id": INTS, "bbox_row1": REALS, "bbox_col1": REALS, "bbox_row2": REALS, "bbox_col2": REALS},
        {},
    ),
    "segmentation": ({"segmentation_file_name": STR}, {}),
    "anomaly": ({"anomaly_label": STR}, {"anomaly_file_name": STR}),
    "none": ({}, {}),
}
SPLITS = ("train", "validation", "test")
ANOMALY_LABELS = ("ok", "nok")


def _is(value: Any, kind: str) -> bool:
    if kind.startswith("["):
        return isinstance(value, list) and all(_is(v, kind[1:-1]) for v in value)
    if kind == INT:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == REAL:
        return isinstance(value, float)
    if kind == STR:
        return isinstance(value, str)
    return isinstance(value, dict)


def _keys(where: str, d: dict[str, Any], required: dict[str, str], optional: dict[str, str]) -> list[str]:
    out = [f"{where}: missing {k!r}" for k in required if k not in d]
    allowed = {**required, **optional}
    out += [f"{where}: key {k!r} is not allowed" for k in d if k not in allowed]
    out += [
        f"{where}: {k!r} must be {allowed[k]}, got {d[k]!r}" for k in d if k in allowed and not _is(d[k], allowed[k])
    ]
    return out


def problems(doc: Any, task: str) -> list[str]:
    """Every key missing, not allowed, or of the wrong type in the DLDataset ``doc`` for ``task``."""
    if not isinstance(doc, dict):
        return ["not an object"]
    req, opt = TOP_BY_TASK[task]
    out = _keys("dataset", doc, {**TOP_REQUIRED, **req}, opt)
    if len(doc.get("class_names", [])) != len(doc.get("class_ids", [])):
        out.append("class_names and class_ids differ in length")
    ids = set()
    sreq, sopt = SAMPLE_BY_TASK[task]
    for n, s in enumerate(doc.get("samples", [])):
        where = f"sample {n}"
        if not isinstance(s, dict):
            out.append(f"{where}: not an object")
            continue
        out += _keys(where, s, {**SAMPLE_REQUIRED, **sreq}, {**SAMPLE_OPTIONAL, **sopt})
        if s.get("image_id") in ids:
            out.append(f"{where}: image_id {s['image_id']} is not unique")
        ids.add(s.get("image_id"))
        if "split" in s and s["split"] not in SPLITS:
            out.append(f"{where}: split {s['split']!r} is not one of {SPLITS}")
        if "anomaly_label" in s and s["anomaly_label"] not in ANOMALY_LABELS:
            out.append(f"{where}: anomaly_label {s['anomaly_label']!r} is not ok or nok")
        for key in ("image_file_name", "segmentation_file_name", "anomaly_file_name"):
            name = s.get(key)
            if isinstance(name, str) and ("\\" in name or name.startswith("/") or ".." in name.split("/")):
                out.append(f"{where}: {key} {name!r} is not a relative path with '/'")
        if task == "detection":
            lengths = {len(s.get(k, [])) for k in sreq}
            if len(lengths) > 1:
                out.append(f"{where}: the box tuples differ in length")
            for r1, c1, r2, c2 in zip(
                *(s.get(k, []) for k in ("bbox_row1", "bbox_col1", "bbox_row2", "bbox_col2")), strict=False
            ):
                if r1 >= r2 or c1 >= c2:
                    out.append(f"{where}: box ({r1}, {c1}, {r2}, {c2}) has row1 >= row2 or col1 >= col2")
        if task == "classification" and s.get("image_label_id") not in doc.get("class_ids", []):
            out.append(f"{where}: image_label_id {s.get('image_label_id')} is not a class id")
        for label in s.get("bbox_label_id", []) if task == "detection" else []:
            if label not in doc.get("class_ids", []):
                out.append(f"{where}: bbox_label_id {label} is not a class id")
    if task == "anomaly" and (doc.get("class_names"), doc.get("class_ids")) != (["ok", "nok"], [0, 1]):
        out.append("anomaly: class_names must be ['ok', 'nok'] with class_ids [0, 1]")
    return out
