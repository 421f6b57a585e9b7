"""A recording stand-in for HALCON's Python binding (``import halcon``), for tests without HALCON.

It records the dict and image calls dlpack makes and refuses what the real binding refuses:
tuple values that are not builtin ``int``/``float``/``str`` (NumPy scalars, ``bool``, None) and
images whose dtype HALCON has no image type for (float64 among them), or whose shape is not 2-D
or 3-D. The model calls of ``examples/train_halcon.py`` are recorded too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: NumPy dtypes the binding turns into HALCON image types (byte, int1, int2, uint2, int4, real).
IMAGE_DTYPES = {np.dtype(t) for t in ("uint8", "int8", "int16", "uint16", "int32", "float32")}


class HalconError(Exception):
    """What the stand-in raises where the real binding would raise."""


@dataclass
class Image:
    """An iconic image: a copy of the array it was made from."""

    array: np.ndarray


@dataclass
class Dict:
    """A HALCON dict: tuples and objects under separate keys, as HALCON keeps them."""

    tuples: dict[str, list[int | float | str]] = field(default_factory=dict)
    objects: dict[str, Image] = field(default_factory=dict)


@dataclass
class Model:
    path: str
    params: dict[str, Any] = field(default_factory=dict)
    batches: list[list[Dict]] = field(default_factory=list)


calls: list[tuple[str, Any]] = []
models: list[Model] = []


def reset() -> None:
    calls.clear()
    models.clear()


def _tuple(value: Any) -> list[int | float | str]:
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    for v in items:
        if type(v) not in (int, float, str):  # bool is an int subclass: refused by type, not isinstance
            raise HalconError(f"tuple element {v!r} of type {type(v).__name__} is not int, float or str")
    return items


def create_dict() -> Dict:
    calls.append(("create_dict", None))
    return Dict()


def set_dict_tuple(d: Dict, key: str, value: Any) -> None:
    if not isinstance(d, Dict) or type(key) is not str:
        raise HalconError(f"set_dict_tuple needs a dict and a str key, got {d!r}, {key!r}")
    d.tuples[key] = _tuple(value)
    calls.append(("set_dict_tuple", key))


def set_dict_object(obj: Image, d: Dict, key: str) -> None:
    if not isinstance(obj, Image) or not isinstance(d, Dict) or type(key) is not str:
        raise HalconError(f"set_dict_object needs an image, a dict and a str key, got {obj!r}, {d!r}, {key!r}")
    d.objects[key] = obj
    calls.append(("set_dict_object", key))


def himage_from_numpy_array(arr: Any) -> Image:
    if not isinstance(arr, np.ndarray) or arr.ndim not in (2, 3):
        raise HalconError(f"numpy array shape not supported: {getattr(arr, 'shape', arr)!r}")
    if arr.dtype not in IMAGE_DTYPES:
        raise HalconError(f"No matching halcon type string for: {arr.dtype}")
    calls.append(("himage_from_numpy_array", (arr.shape, arr.dtype.str)))
    return Image(arr.copy())


def read_dl_model(path: str) -> Model:
    model = Model(str(path))
    models.append(model)
    calls.append(("read_dl_model", str(path)))
    return model


def set_dl_model_param(model: Model, name: str, value: Any) -> None:
    model.params[name] = _tuple(value)
    calls.append(("set_dl_model_param", name))


def get_dl_model_param(model: Model, name: str) -> Any:
    return model.params.get(name, [])


def train_dl_model_batch(model: Model, batch: list[Dict]) -> Dict:
    if not batch or not all(isinstance(d, Dict) for d in batch):
        raise HalconError("train_dl_model_batch needs a tuple of DLSample dicts")
    model.batches.append(list(batch))
    calls.append(("train_dl_model_batch", len(batch)))
    result = Dict()
    result.tuples["total_loss"] = [1.0 / len(model.batches)]
    return result


def write_dl_model(model: Model, path: str) -> None:
    calls.append(("write_dl_model", str(path)))
