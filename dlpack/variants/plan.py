"""What a variant build computes, decided before anything is written: the config, the arrays, the record.

A :class:`VariantPlan` is frozen and travels to the worker processes; the manifest record
(:func:`manifest_record`) and the journal header (:func:`journal_header`) say which variants a
store holds, so a resumed run continues only the very same change.
"""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from .. import schema
from ..errors import OptionError
from ..manifest import ArraySpec, Manifest, sha256_hex
from ..options import check_choice, check_int, check_jobs
from ..transforms.engines import ENGINES

__all__ = [
    "ENGINES",
    "RECORD_FORMAT",
    "AugmentConfigLike",
    "VariantPlan",
    "check_arguments",
    "input_arrays",
    "resolve_config",
    "store_identity",
    "variant_specs",
    "manifest_record",
    "journal_header",
    "same_variants",
]

#: ``format`` of the manifest's ``augment`` record.
RECORD_FORMAT = 1
#: The ragged label arrays a variant carries when the store has them (moved with its boxes).
LABEL_BASES = ("boxes", "box_labels", "box_crowd")


@runtime_checkable
class AugmentConfigLike(Protocol):
    """What ``augment`` needs of a config (``dlpack.transforms.config.AugmentConfig`` is one).

    ``augmenter(targets, rng) -> (targets, record)`` makes one variant; ``manifest_record()`` is
    the manifest's ``config`` entry (``kind``, ``format``, ``text`` verbatim, ``name``);
    ``operations()`` the normalised operation list (the pipeline's ``to_dict()``).
    """

    @property
    def augmenter(self) -> Any:
        """The callable ``(targets, rng) -> (targets, record)`` that makes one variant."""
        ...

    def manifest_record(self) -> dict[str, Any]:
        """The manifest's ``config`` entry: ``kind``, ``format``, ``text`` verbatim, ``name``."""
        ...

    def operations(self) -> Any:
        """The normalised operation list (a pipeline's ``to_dict()``)."""
        ...


def check_arguments(k: Any, seed: Any, jobs: Any, engine: Any) -> None:
    """Refuse a K, seed, job count or engine ``augment`` cannot use, naming the flag (K at least 1:
    :class:`~dlpack.options.AugmentOptions` takes its 0 as "not given")."""
    check_int("augment (--augment K)", k, 1, wanted="an integer >= 1 (variants per image)")
    check_int("augment_seed (--augment-seed)", seed, 0)
    check_jobs(jobs)
    check_choice("augment_engine (--augment-engine)", engine, ENGINES, wanted=f"one of {', '.join(ENGINES)}")


def resolve_config(config: Any, engine: str, task: str | None) -> AugmentConfigLike:
    """``config`` as a loaded config: a path is read with ``dlpack.transforms.config.load_config``
    (JSON or YAML; errors name the file and field), an object must already be one."""
    if isinstance(config, (str, os.PathLike)):
        path = Path(config)
        if not path.is_file():
            raise OptionError(f"augmentation config {os.fspath(config)!r} is not a file (--augment-config FILE)")
        # Imported on first use: reading a config loads the operation registry (and OpenCV).
        loader = importlib.import_module("dlpack.transforms.config").load_config
        config = loader(path, engine=engine, task=task)
    if not isinstance(config, AugmentConfigLike) or not callable(config.augmenter):
        raise OptionError(
            "config must be the path of an augmentation config file, or a loaded config (an augmenter, "
            f"manifest_record() and operations()); got {type(config).__name__}"
        )
    used = str(getattr(config.augmenter, "engine", "dlpack"))
    if used != engine:
        raise OptionError(f"the config's augmenter runs on the {used} engine, but augment_engine={engine!r}")
    return config


@dataclass(frozen=True)
class VariantPlan:
    """Everything a worker needs to compute blocks of variants (pickled into worker processes).

    ``store`` is read through a reader pinned to the manifest digest ``pin``, so a worker reads the
    very store the run planned, or refuses.
    """

    store: str
    pin: str | None
    k: int
    seed: int
    augmenter: Any
    shape: tuple[int, int, int]
    dtype: str
    mask_dtype: str | None
    boxes: bool
    box_labels: bool
    box_crowd: bool
    fill_mask: int
    count: int
    block_len: int

    def blocks(self) -> list[tuple[int, int]]:
        """Every work unit ``(v, start)``: one shard block of one variant."""
        return [(v, s) for v in range(1, self.k + 1) for s in range(0, self.count, self.block_len)]

    def unit(self, v: int, start: int) -> int:
        """The journal's ``start`` of block ``(v, start)``: its first row among the K x N variant rows."""
        return (v - 1) * self.count + start

    def of_unit(self, unit: int) -> tuple[int, int]:
        """``(v, start)`` of a journal ``start`` (see :meth:`unit`)."""
        return unit // self.count + 1, unit % self.count

    def rows(self, start: int) -> int:
        """Rows of the block at ``start`` (the last block of a variant may be short)."""
        return min(self.block_len, self.count - start)


def input_arrays(m: Manifest, where: Path) -> dict[str, ArraySpec]:
    """The arrays a variant is computed from (``images``, and ``mask``, ``boxes``, ``box_labels``,
    ``box_crowd`` where the store has them), each checked to be what the format writes."""
    if m.image.layout != "fixed" or m.image.shape is None:
        raise OptionError(
            f"{where} holds variable-size images; augmentation variants need one stored size: "
            "rebuild it with --size WxH (or --resize fit)"
        )
    h, w, _ = m.image.shape
    found = {schema.IMAGES: m.arrays[schema.IMAGES]} if schema.IMAGES in m.arrays else {}
    if not found:
        raise OptionError(f"{where} has no images array to augment")
    want = {
        schema.MASK: (False, (h, w), ("|u1", "<u2")),
        "boxes": (True, (4,), ("<f4",)),
        "box_labels": (True, (), ("<i4",)),
        "box_crowd": (True, (), ("|u1",)),
    }
    for name, (ragged, shape, dtypes) in want.items():
        spec = m.arrays.get(name)
        if spec is None:
            continue
        if spec.ragged != ragged or spec.shape != shape or spec.dtype not in dtypes:
            layout = "ragged rows of" if ragged else "fixed"
            raise OptionError(
                f"array {name!r} of {where} is {'ragged' if spec.ragged else 'fixed'} {list(spec.shape)} {spec.dtype}; "
                f"augmentation variants carry a {name} that is {layout} {list(shape)} {' or '.join(dtypes)}"
            )
        found[name] = spec
    if ("box_labels" in found or "box_crowd" in found) and "boxes" not in found:
        raise OptionError(f"{where} has box labels but no boxes array; variants move labels with their boxes")
    return found


def variant_specs(m: Manifest, inputs: Mapping[str, ArraySpec], k: int) -> list[tuple[int, ArraySpec]]:
    """The arrays of variants 1..K, ``(v, spec)`` in the order they are written (docs/format.md,
    "Augmentation variants"): all without a sample key."""
    images = inputs[schema.IMAGES]
    out: list[tuple[int, ArraySpec]] = []
    for v in range(1, k + 1):
        out.append(
            (
                v,
                ArraySpec(
                    schema.variant_array(schema.IMAGES, v), images.dtype, images.shape, False, None, images.compression
                ),
            )
        )
        mask = inputs.get(schema.MASK)
        if mask is not None:
            out.append(
                (
                    v,
                    ArraySpec(
                        schema.variant_array(schema.MASK, v), mask.dtype, mask.shape, False, None, mask.compression
                    ),
                )
            )
        out.append((v, ArraySpec(schema.variant_array(schema.CHECKSUM, v), "<u4")))
        out.append((v, ArraySpec(schema.variant_array(schema.AUGMENT, v), "|u1", (), True)))
        for base in LABEL_BASES:
            spec = inputs.get(base)
            if spec is not None:
                out.append((v, ArraySpec(schema.variant_array(base, v), spec.dtype, spec.shape, True)))
    return out


def _versions(engine: str) -> dict[str, str]:
    """The library versions a variant's bytes depend on (the same versions give the same bytes)."""
    import cv2
    import numpy as np

    from .._version import __version__

    found = {"dlpack": __version__, "numpy": np.__version__, "opencv": str(cv2.__version__)}
    if engine == "albumentations":
        from importlib.metadata import PackageNotFoundError, version

        try:
            found["albumentations"] = version("albumentations")
        except PackageNotFoundError:
            found["albumentations"] = "unknown"
    return found


def _canonical(value: Any, what: str) -> Any:
    """``value`` as JSON gives it back (tuples as lists), or an OptionError naming ``what``."""

    def plain(x: Any) -> Any:
        item = getattr(x, "item", None)
        if callable(item):
            return item()
        tolist = getattr(x, "tolist", None)
        if callable(tolist):
            return tolist()
        raise TypeError(f"{type(x).__name__} is not JSON")

    try:
        return json.loads(json.dumps(value, default=plain, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise OptionError(f"the augmentation config's {what} is not JSON data: {exc}") from exc


def manifest_record(config: AugmentConfigLike, k: int, seed: int, engine: str, fill_mask: int) -> dict[str, Any]:
    """The manifest's ``augment`` field for K variants of ``config`` (docs/format.md)."""
    return {
        "format": RECORD_FORMAT,
        "k": k,
        "seed": seed,
        "engine": engine,
        "config": _canonical(config.manifest_record(), "record"),
        "operations": _canonical(config.operations(), "operations"),
        "fill_mask": int(fill_mask),
        "versions": _versions(engine),
    }


#: The fields of a record that decide the variants' bytes (with the store's pixels and labels).
_SAME = ("k", "seed", "engine", "operations", "fill_mask")


def same_variants(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> bool:
    """Whether two records (manifest ``augment`` or journal header) describe the same variants."""
    return a is not None and b is not None and all(a.get(f) == b.get(f) for f in _SAME)


def store_identity(m: Manifest) -> str:
    """The store's generation (or, for stores written before generations, its manifest's digest)."""
    return m.generation or sha256_hex(m.to_json())


def journal_header(m: Manifest, record: Mapping[str, Any], block_len: int) -> dict[str, Any]:
    """The journal's first line: the store it started from and the variants it writes; a rerun
    continues the journal only when its header's ``fingerprint`` is the one it computes."""
    core = {
        "store": store_identity(m),
        "backend": m.backend,
        "count": m.count,
        "block_len": block_len,
        **{f: record[f] for f in _SAME},
    }
    text = json.dumps(core, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return {"fingerprint": sha256_hex(text), **core}
