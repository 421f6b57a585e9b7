"""Every option class of dlpack, frozen and validated, with the one set of validators they use.

:class:`BuildOptions` (``dlpack build``), :class:`AugmentOptions` (``dlpack augment``),
:class:`LoaderOptions` (``dlpack.Loader``), :class:`BenchOptions` (``dlpack bench``),
:class:`TuneOptions` (``dlpack tune``), :class:`ExportOptions` (``dlpack export``) and
:class:`PreviewOptions` (``dlpack preview``). Each field's metadata is its CLI flag
(:func:`dlpack.cli.add_option_arguments`), so a field's name, default and help live in one place; the
library functions take an ``options=`` object and keywords (:func:`with_keywords`). The checks
(:func:`check_int`, :func:`check_choice`, :func:`check_workers`, :func:`check_jobs`,
:func:`check_number`) raise :class:`~dlpack.errors.OptionError` naming the field.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import numbers
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from ._dask import check_scheduler
from .errors import OptionError
from .transforms.engines import ENGINES

__all__ = [
    "BuildOptions",
    "AugmentOptions",
    "LoaderOptions",
    "BenchOptions",
    "TuneOptions",
    "ExportOptions",
    "PreviewOptions",
    "check_int",
    "check_choice",
    "check_number",
    "check_workers",
    "check_jobs",
    "check_scheduler",
    "parse_size",
    "parse_split",
    "parse_labels",
    "available_cores",
    "IMAGE_SUFFIXES",
    "SPLIT_PART_NAMES",
    "LABEL_KINDS",
]

#: File name suffixes a folder source treats as images (lower case).
IMAGE_SUFFIXES: frozenset[str] = frozenset(
    {".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".webp", ".pgm", ".ppm", ".pbm", ".pnm"}
)

_O = TypeVar("_O")


def with_keywords(
    options: _O | None, cls: type[_O], kwargs: Mapping[str, Any], call: str, also: Iterable[str] = ()
) -> _O:
    """``options`` (or the defaults of ``cls``) with ``kwargs`` replacing fields.

    An unknown keyword is an :class:`OptionError` naming it and the close matches among the
    fields and the call's other keywords ``also`` (a typo is then one look away, not a dataclass
    TypeError about ``__init__``).
    """
    base = options if options is not None else cls()
    if not kwargs:
        return base
    names = [f.name for f in dataclasses.fields(cls) if f.init]  # type: ignore[arg-type]
    for key in kwargs:
        if key not in names:
            close = difflib.get_close_matches(key, [*names, *also], n=3)
            hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
            raise OptionError(f"{call}() got an unknown keyword {key!r}{hint} (its keywords are {cls.__name__} fields)")
    return dataclasses.replace(base, **kwargs)  # type: ignore[type-var]


def check_rate(value: object, name: str = "original_rate") -> float:
    """``value`` as a probability in 0..1, or an OptionError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise OptionError(
            f"{name} must be a number in 0..1 (the share of epochs that serve the original), got {value!r}"
        )
    rate = float(value)
    if not 0.0 <= rate <= 1.0:  # also refuses NaN
        raise OptionError(f"{name} must be in 0..1, got {value!r}")
    return rate


def check_int(name: str, value: object, minimum: int, *, wanted: str | None = None) -> int:
    """``value`` as an ``int`` if it is an integer (NumPy's too, never a bool) >= ``minimum``; else an
    :class:`OptionError` "``name`` must be ``wanted`` (an integer >= ``minimum``), got ``value``"."""
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < minimum:
        raise OptionError(f"{name} must be {wanted or f'an integer >= {minimum}'}, got {value!r}")
    return int(value)  # a NumPy integer would break JSON (loader states, reports)


def check_choice(name: str, value: object, choices: Sequence[object], *, wanted: str | None = None) -> None:
    """Refuse a ``value`` not in ``choices``: "``name`` must be one of A, B; got ``value``" (or
    "must be ``wanted``, got ...")."""
    if value not in choices:
        if wanted is not None:
            raise OptionError(f"{name} must be {wanted}, got {value!r}")
        raise OptionError(f"{name} must be one of {', '.join(map(str, choices))}; got {value!r}")


def check_number(name: str, value: object, *, wanted: str, low: float = 0.0, open_low: bool = True) -> float:
    """``value`` as a finite ``float`` above ``low`` (or at least it, with ``open_low=False``); else
    an :class:`OptionError` "``name`` must be ``wanted``, got ``value``"."""
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or (value <= low if open_low else value < low):  # type: ignore[operator]
        raise OptionError(f"{name} must be {wanted}, got {value!r}")
    return float(value)  # type: ignore[arg-type]


def check_workers(value: object) -> int | Literal["auto"]:
    """Loader threads: ``"auto"`` or an integer >= 0 (a CLI's text of one too)."""
    if value == "auto":
        return "auto"
    if isinstance(value, str):
        try:
            value = int(value)
        except ValueError:
            raise OptionError(f"workers must be 'auto' or an integer >= 0, got {value!r}") from None
    return check_int("workers", value, 0)


def check_jobs(value: object) -> int:
    """Worker processes: a positive count, or -1 for every core (joblib's convention)."""
    if not isinstance(value, int) or isinstance(value, bool) or value == 0 or value < -1:
        raise OptionError(f"jobs must be a positive number of processes or -1 for all cores, got {value!r}")
    return value


def _format_names() -> tuple[str, ...]:
    from .backends import format_names  # the registry is the one list of formats

    # dldataset is no store: the build packs a hidden store and exports it (dlpack.pack).
    return (*format_names(), "dldataset")


ResizeMode = Literal["stretch", "fit", "none"]
_NEEDS_CONFIG = "augment (--augment K) needs augment_config (--augment-config FILE): the operations to apply"
Compression = Literal["none", "lz4", "zstd"]


def available_cores() -> int:
    """The cores this process may use: its CPU affinity and container CPU quota, else the machine's count."""
    try:
        from joblib import cpu_count
    except ImportError:
        sched = getattr(os, "sched_getaffinity", None)
        return max(1, len(sched(0)) if sched is not None else os.cpu_count() or 1)
    return max(1, int(cpu_count()))


def parse_size(text: str | tuple[int, int]) -> tuple[int, int]:
    """Parse ``'WxH'`` (or a ``(W, H)`` tuple) into ``(width, height)``."""
    if isinstance(text, tuple):
        w, h = text
    else:
        m = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", str(text))
        if not m:
            raise OptionError(f"size must be WIDTHxHEIGHT, e.g. 512x512, got {text!r}")
        w, h = int(m.group(1)), int(m.group(2))
    if int(w) <= 0 or int(h) <= 0:
        raise OptionError(f"size must be WIDTHxHEIGHT with both > 0, got '{w}x{h}'")
    return int(w), int(h)


#: The split names of ``split``, by its number of parts.
SPLIT_PART_NAMES: dict[int, tuple[str, ...]] = {2: ("train", "val"), 3: ("train", "val", "test")}


def parse_split(value: object) -> tuple[int, ...]:
    """Parse ``'80,10,10'`` (or a tuple) into whole percentages: 2 or 3 parts, each > 0, summing to 100."""
    parts = value.split(",") if isinstance(value, str) else value
    try:
        pcts = tuple(int(str(p).strip()) for p in parts) if isinstance(parts, (list, tuple)) else ()
    except (TypeError, ValueError):
        pcts = ()
    if len(pcts) not in SPLIT_PART_NAMES or any(p <= 0 for p in pcts) or sum(pcts) != 100:
        raise OptionError(
            f"split takes 2 or 3 whole percentages > 0 summing to 100, TRAIN,VAL[,TEST] (e.g. 80,10,10 or 90,10); "
            f"got {value!r}"
        )
    return pcts


#: ``--labels`` kinds: True for those that take a path (``KIND:PATH``), False for those that take none.
LABEL_KINDS: dict[str, bool] = {
    "auto": False,
    "folders": False,
    "none": False,
    "coco": True,
    "masks": True,
    "anomaly": False,
    "csv": True,
    "dldataset": True,
}
_LABEL_PATHS = {"coco": "FILE.json", "masks": "DIR", "csv": "FILE.csv", "dldataset": "FILE.json"}


def parse_labels(spec: object) -> tuple[str, str | None]:
    """Split a ``--labels`` value ``KIND[:PATH]`` into ``(kind, path)``; ``path`` is None for kinds without one.

    Only the first ``:`` separates: the path may hold more (``coco:a:b.json``).
    """
    usage = "auto, folders, none, anomaly, coco:FILE.json, masks:DIR, csv:FILE.csv or dldataset:FILE.json"
    if not isinstance(spec, str):
        raise OptionError(f"labels must be a string, one of {usage}; got {spec!r}")
    kind, colon, path = spec.partition(":")
    if kind not in LABEL_KINDS:
        raise OptionError(f"labels: unknown kind {kind!r} in {spec!r}; use one of {usage}")
    if LABEL_KINDS[kind]:
        if not path.strip():
            raise OptionError(f"labels {kind} needs a path: --labels {kind}:{_LABEL_PATHS[kind]}; got {spec!r}")
        return kind, path
    if colon:
        extra = "; give the ground-truth folder with --anomaly-masks DIR" if kind == "anomaly" else ""
        raise OptionError(f"labels {kind} takes no path, got {spec!r}{extra}")
    return kind, None


def _name_list(name: str, value: object, values: bool) -> tuple[str, ...]:
    """A comma list (or a tuple of them: a flag given several times) of array names, each
    ``NAME=VALUE`` when ``values`` (VALUE a number or empty)."""
    items = [value] if isinstance(value, str) else list(value)  # type: ignore[call-overload]
    parts = [p.strip() for item in items for p in (item.split(",") if isinstance(item, str) else [item])]
    out: list[str] = []
    seen: set[str] = set()
    for part in parts:
        if not isinstance(part, str):
            raise OptionError(f"{name} must be a comma list of strings, got {value!r}")
        if not part:
            continue
        key, eq, text = part.partition("=")
        key, text = key.strip(), text.strip()
        if not re.fullmatch(r"[a-z][a-z0-9_]{0,63}", key) or (values and not eq) or (not values and eq):
            form = "NAME=VALUE" if values else "NAME"
            raise OptionError(f"{name} takes a comma list of {form} with array names (a-z, 0-9, _); got {part!r}")
        if values and text:
            try:
                number = float(text)
            except ValueError:
                raise OptionError(
                    f"{name}: the value of {key!r} must be a number (or empty for no rows), got {text!r}"
                ) from None
            if number != number or number in (float("inf"), float("-inf")):
                raise OptionError(f"{name}: the value of {key!r} must be a finite number, got {text!r}")
        if key in seen:
            raise OptionError(f"{name} names array {key!r} twice")
        seen.add(key)
        out.append(f"{key}={text}" if values else key)
    return tuple(out)


@dataclass(frozen=True)
class BuildOptions:
    """Everything ``dlpack build`` can be told; its flags are generated from these fields.

    ``size`` is ``(width, height)``. ``resize=None`` means ``stretch`` when ``size`` is given
    and ``none`` otherwise. ``jobs=-1`` uses every core (joblib's convention).
    """

    # Each field's metadata is its `dlpack build` flag (see dlpack.cli.add_option_arguments): "help",
    # optional "metavar"/"flag"/"choices", or "cli": False. The default shown is the field's.
    format: str | None = field(
        default=None,
        metadata={
            "help": "store format; without it, from OUT's suffix (.zarr or none: zarr; .h5, .hdf5: hdf5; "
            "any other suffix is refused); dldataset writes a HALCON DLDataset folder (packed through a hidden "
            "store beside OUT, then exported)",
            "choices": _format_names,
        },
    )
    size: tuple[int, int] | None = field(
        default=None, metadata={"help": "target resolution, e.g. 512x512 (not with --max-side)", "metavar": "WxH"}
    )
    max_side: int | None = field(
        default=None, metadata={"help": "shrink so the longest side is at most N (not with --size)", "metavar": "N"}
    )
    resize: ResizeMode | None = field(
        default=None,
        metadata={"help": "stretch (the default with --size), fit (keep the aspect ratio, pad), none (original sizes)"},
    )
    allow_upscale: bool = field(default=False, metadata={"help": "allow enlarging images smaller than --size"})
    channels: Literal["keep", 1, 3] = field(default="keep", metadata={"help": "keep (the majority's), 1 gray, 3 RGB"})
    labels: str = field(
        default="auto",
        metadata={
            "help": "where labels come from: auto (class sub-folders when every image is in one), folders, none, "
            "coco:FILE.json, masks:DIR (label images, pixel = class id), anomaly (good/ok folders vs defect "
            "folders), csv:FILE.csv (path,label[,split]), dldataset:FILE.json (a HALCON DLDataset)",
            "metavar": "KIND[:PATH]",
        },
    )
    class_folder: Literal["top", "last"] = field(
        default="top",
        metadata={
            "help": "with class folders: top (the first folder below SRC or its split folder is the class) or last "
            "(the folder that directly holds the image, HALCON's last_folder)"
        },
    )
    anomaly_masks: str | None = field(
        default=None,
        metadata={
            "help": "with --labels anomaly: the folder of ground-truth images (nonzero = defect), matched to the "
            "images by relative path without extension (also NAME_mask.png)",
            "metavar": "DIR",
        },
    )
    instance_masks: bool = field(
        default=False,
        metadata={"help": "with --labels coco: the mask holds instance ids (k = k-th box) instead of category ids"},
    )
    jobs: int = field(
        default=-1,
        metadata={
            "help": "worker processes, -1 for every core; at most the core count unless --force-jobs",
            "metavar": "N",
        },
    )
    # More processes than cores only adds memory and switching; a typo like --jobs 200 should not fork 200.
    force_jobs: bool = field(default=False, metadata={"help": "use --jobs N even above the core count"})
    # "none" by measurement (docs/benchmarks.md, "Compression"): on real photos lz4 and zstd store
    # a half to a third of the bytes, but reads from the page cache, which training epochs mostly
    # are, run at a tenth to two thirds of none's speed; the summary names the others.
    compression: Compression = field(
        default="none",
        metadata={
            "help": "codec of the stored images: none (fastest reads), lz4 (about half the bytes), "
            "zstd (fewest bytes, slowest reads)"
        },
    )
    on_error: Literal["fail", "skip"] = field(
        default="fail", metadata={"help": "on unreadable inputs: fail, or skip them and list them in the manifest"}
    )
    overwrite: bool = field(
        default=False, metadata={"help": "replace OUT if it is a dlpack store (nothing else is ever replaced)"}
    )
    no_resume: bool = field(
        default=False,
        metadata={"help": "start over instead of continuing a killed build of OUT from its finished blocks"},
    )
    update: bool = field(
        default=False,
        metadata={
            "help": "update the store OUT from SRC: append new files, replace changed ones (deleted ones are "
            "refused unless --compact); only the shards that change are written"
        },
    )
    compact: bool = field(
        default=False,
        metadata={"help": "with --update: drop removed samples for good (renumbers the samples after them)"},
    )
    quiet: bool = field(default=False, metadata={"help": "no progress bar or summary"})
    # Checked by dlpack.storage.location.parse_storage_options when OUT is parsed (before any work).
    storage_options: tuple[str, ...] | Mapping[str, object] = field(
        default=(),
        metadata={
            "help": "for an s3:// OUT: KEY=VALUE of the object-store client (endpoint_url, region, access_key_id, "
            "secret_access_key, profile, anonymous, conditional_writes, ...); overrides the AWS environment "
            "and files; repeatable",
            "metavar": "KEY=VALUE",
            "flag": "--storage-option",
            "repeat": True,
        },
    )
    # Where the blocks run; not recorded in the store: a rerun on another pool resumes, and the bytes are the same.
    scheduler: str | None = field(
        default=None,
        metadata={
            "help": "run the build's tasks on a Dask cluster: local (a LocalCluster of --jobs single-threaded worker "
            "processes, for this run) or tcp://HOST:PORT (a running scheduler; its workers must see a local SRC "
            "and OUT at the same paths); needs the dask extra",
            "metavar": "ADDR",
        },
    )
    # Decompression-bomb guard: 2**28 pixels is a 16384x16384 image, far above training sizes.
    max_pixels: int = field(
        default=2**28, metadata={"help": "refuse images with more pixels (decompression-bomb guard)", "metavar": "N"}
    )
    # "Tens of MB per shard" keeps a dataset at a few hundred files (docs/format.md).
    shard_bytes: int = field(default=32 * 2**20, metadata={"help": "target bytes per Zarr shard file", "metavar": "N"})
    follow_symlinks: bool = field(default=False, metadata={"help": "pack symlinked files that stay inside SRC"})
    exclude: tuple[str, ...] = field(
        default=(),
        metadata={
            "help": "leave out the paths under SRC matching GLOB (fnmatch, against the path relative to SRC with / "
            "separators; a folder that matches leaves out everything under it); repeatable",
            "metavar": "GLOB",
            "repeat": True,
        },
    )
    split: tuple[int, ...] | None = field(
        default=None,
        metadata={
            "help": "split a source without split folders by class: percentages TRAIN,VAL[,TEST] summing to 100, "
            "e.g. 80,10,10 (splits train, val, test) or 90,10 (train, val)",
            "metavar": "PCTS",
        },
    )
    split_seed: int | None = field(
        default=None, metadata={"help": "with --split: the seed of the split (default 0)", "metavar": "S"}
    )
    verbose: bool = field(default=False, metadata={"help": "also list the non-image files and excluded paths"})
    # An update never invents a value for an array it did not build: a user's own array needs one of these two.
    fill: tuple[str, ...] = field(
        default=(),
        metadata={
            "help": "with --update: comma list of NAME=VALUE, the value appended and replaced samples get in "
            "array NAME (added with add_array); for a ragged array only NAME= (no rows); repeatable",
            "metavar": "LIST",
            "repeat": True,
        },
    )
    drop_array: tuple[str, ...] = field(
        default=(),
        metadata={
            "help": "with --update: comma list of arrays (added with add_array) to drop; repeatable",
            "metavar": "LIST",
            "repeat": True,
        },
    )
    # Augmentation variants (docs/format.md, "Augmentation variants"); `dlpack augment` takes the same flags.
    augment: int = field(
        default=0,
        metadata={
            "help": "K augmentation variants of every stored image, with --augment-config (dlpack build adds them "
            "once the store is published; a stopped run is resumed by dlpack augment)",
            "metavar": "K",
        },
    )
    augment_config: str | os.PathLike[str] | None = field(
        default=None,
        metadata={
            "help": "with --augment: the augmentation config, JSON or YAML: an albumentations to_dict document or "
            "an object of HALCON augment_dl_samples parameters",
            "metavar": "FILE",
        },
    )
    augment_seed: int = field(default=0, metadata={"help": "with --augment: the seed of the variants", "metavar": "S"})
    augment_engine: Literal["dlpack", "albumentations"] = field(
        default="dlpack",
        metadata={
            "help": "with --augment: dlpack (its own operations) or albumentations (the whole pipeline run by an "
            "installed albumentations)"
        },
    )

    def __post_init__(self) -> None:
        exclude = (self.exclude,) if isinstance(self.exclude, str) else tuple(self.exclude)
        if not all(isinstance(p, str) and p.strip() for p in exclude):
            raise OptionError(f"exclude takes non-empty glob patterns, got {self.exclude!r}")
        # Paths are relative to SRC: "./masks" means "masks".
        object.__setattr__(self, "exclude", tuple(p[2:] if p.startswith("./") and len(p) > 2 else p for p in exclude))
        if self.split is not None:
            object.__setattr__(self, "split", parse_split(self.split))
        if self.split_seed is not None:
            check_int("split_seed", self.split_seed, 0)
            if self.split is None and not self.update:
                raise OptionError("split_seed only applies to split: pass split=80,10,10 (--split) too")
        if self.format is not None:
            check_choice("format", self.format, _format_names())
        if self.size is not None:
            object.__setattr__(self, "size", parse_size(self.size))
        if self.max_side is not None:
            check_int("max_side", self.max_side, 1, wanted="a positive integer")
        if self.size is not None and self.max_side is not None:
            raise OptionError("give either size (WxH) or max_side, not both")
        if self.resize is not None:
            check_choice("resize", self.resize, ("stretch", "fit", "none"))
        # An update takes its geometry from the store and refuses any given value that differs, with
        # advice it can follow ("drop those options"); advice to pass a size could not be followed.
        if not self.update:
            self._check_geometry()
        channels: object = self.channels
        if isinstance(channels, str) and channels.isdigit():
            channels = int(channels)
            object.__setattr__(self, "channels", channels)
        check_choice("channels", channels, ("keep", 1, 3))
        kind, _ = parse_labels(self.labels)
        check_choice("class_folder", self.class_folder, ("top", "last"))
        if self.class_folder != "top" and kind not in ("auto", "folders"):
            raise OptionError(
                f"class_folder applies to class folders (labels auto or folders), not labels={self.labels!r}"
            )
        if self.anomaly_masks is not None:
            if not isinstance(self.anomaly_masks, str) or not self.anomaly_masks.strip():
                raise OptionError(f"anomaly_masks must be a folder path, got {self.anomaly_masks!r}")
            if kind != "anomaly":
                raise OptionError(f"anomaly_masks only applies to labels=anomaly, not labels={self.labels!r}")
        if self.instance_masks and kind != "coco":
            raise OptionError(f"instance_masks only applies to labels=coco:FILE, not labels={self.labels!r}")
        check_jobs(self.jobs)
        check_scheduler(self.scheduler)
        check_choice("compression", self.compression, ("none", "lz4", "zstd"))
        check_choice("on_error", self.on_error, ("fail", "skip"))
        if self.compact and not self.update:
            raise OptionError("compact only applies to update: pass both")
        object.__setattr__(self, "fill", _name_list("fill", self.fill, values=True))
        object.__setattr__(self, "drop_array", _name_list("drop_array", self.drop_array, values=False))
        for name, given in (("fill", self.fill), ("drop_array", self.drop_array)):
            if given and not self.update:
                raise OptionError(f"{name} only applies to update: pass both")
        both = sorted(set(self.fill_values) & set(self.drop_array))
        if both:
            raise OptionError(
                f"array(s) {', '.join(both)} cannot be both filled and dropped; pass one of fill, drop_array"
            )
        if self.update and self.overwrite:
            raise OptionError("update keeps the store and overwrite replaces it: pass one of them")
        if self.update and self.scheduler is not None:
            raise OptionError(
                "update runs on this machine's worker processes, not on a Dask cluster: pass --jobs N "
                "instead of --scheduler, or rebuild the store with --overwrite on the cluster"
            )
        if self.max_pixels <= 0:
            raise OptionError(f"max_pixels must be > 0, got {self.max_pixels}")
        if self.size is not None and self.size[0] * self.size[1] > self.max_pixels:
            w, h = self.size
            raise OptionError(
                f"size {w}x{h} is {w * h} pixels per image, more than max_pixels={self.max_pixels} (--max-pixels); "
                "choose a smaller size, or raise max_pixels if the machine has the memory"
            )
        self._check_augment()
        if self.shard_bytes < 2**16:
            raise OptionError(f"shard_bytes must be at least 65536, got {self.shard_bytes}")
        # A shard is written from one block held in memory.
        if self.shard_bytes > 2**31:
            raise OptionError(f"shard_bytes must be at most 2147483648 (2 GiB), got {self.shard_bytes}")

    def _check_geometry(self) -> None:
        if self.resize in ("stretch", "fit") and self.size is None and self.max_side is None:
            raise OptionError(f"resize={self.resize} needs a target: pass size=WxH or max_side=N")
        if self.resize == "stretch" and self.max_side is not None:
            raise OptionError("resize=stretch needs size=WxH; max_side keeps the aspect ratio")
        if self.resize == "none" and self.size is not None:
            raise OptionError("resize=none keeps original sizes; drop size or choose stretch/fit")

    def _check_augment(self) -> None:
        k, seed = self.augment, self.augment_seed
        check_int("augment (--augment K)", k, 0, wanted="an integer >= 0 (variants per image)")
        check_int("augment_seed (--augment-seed)", seed, 0)
        check_choice("augment_engine", self.augment_engine, ENGINES)
        if isinstance(self.augment_config, os.PathLike):  # a Path names the file as well as its str
            object.__setattr__(self, "augment_config", os.fspath(self.augment_config))
        if self.augment_config is not None and (not isinstance(self.augment_config, str) or not self.augment_config):
            raise OptionError(f"augment_config (--augment-config) must be a file path, got {self.augment_config!r}")
        given = [
            name
            for name, value, default in (
                ("augment", k, 0),
                ("augment_config", self.augment_config, None),
                ("augment_seed", seed, 0),
                ("augment_engine", self.augment_engine, "dlpack"),
            )
            if value != default
        ]
        if given and self.update:  # first: completing the augment options would not make them apply
            raise OptionError(
                f"{', '.join(given)} with update: update the store first (without them), then run dlpack augment "
                "OUT --augment K --augment-config FILE --replace to compute its variants again"
            )
        if k and self.augment_config is None:
            raise OptionError(_NEEDS_CONFIG)
        if not k:
            if given:  # augment itself is 0 here
                raise OptionError(
                    f"{', '.join(given)} only appl{'ies' if len(given) == 1 else 'y'} with augment=K (--augment K)"
                )
            return
        if self.format == "dldataset":
            raise OptionError(
                "augment writes variants into a store; a DLDataset folder holds none: build a store with --augment, "
                "then export it (dlpack export STORE --to dldataset OUT)"
            )

    @property
    def label_kind(self) -> str:
        """The kind of ``labels`` (``"coco"`` for ``coco:FILE``, ...)."""
        return parse_labels(self.labels)[0]

    @property
    def label_path(self) -> str | None:
        """The path of ``labels`` (``FILE`` for ``coco:FILE``), or None for kinds without one."""
        return parse_labels(self.labels)[1]

    @property
    def fill_values(self) -> dict[str, float | None]:
        """``fill`` by array name: the number, or None for "no rows" (ragged arrays)."""
        out: dict[str, float | None] = {}
        for entry in self.fill:
            name, _, value = entry.partition("=")
            out[name] = float(value) if value else None
        return out

    @property
    def resize_mode(self) -> ResizeMode:
        """The effective resize mode once defaults are applied."""
        if self.resize is not None:
            return self.resize
        return "stretch" if self.size is not None else "none"

    @property
    def n_jobs(self) -> int:
        """The number of worker processes to use: ``jobs``, at most the core count unless ``force_jobs``."""
        cores = available_cores()
        if self.jobs == -1:
            return cores
        return self.jobs if self.force_jobs else min(self.jobs, cores)


# ---------------------------------------------------------------- augment


@dataclass(frozen=True)
class AugmentOptions:
    """What ``dlpack.augment`` (``dlpack augment STORE``) is told; its flags are generated from these fields.

    ``k`` variants per image (``--augment K``; 0, the default, is "not given": :func:`dlpack.augment`
    refuses it) of the augmentation ``config``: the path of a JSON/YAML config or a loaded one
    (:class:`~dlpack.variants.plan.AugmentConfigLike`). The other fields mean what ``dlpack build``'s
    ``--augment-*`` flags, ``--jobs``, ``--quiet`` and ``--no-resume`` mean.
    """

    k: int = field(
        default=0,
        metadata={
            "help": "K augmentation variants of every stored image, with --augment-config",
            "metavar": "K",
            "flag": "--augment",
        },
    )
    config: Any = field(
        default=None,
        metadata={
            "help": "the augmentation config, JSON or YAML: an albumentations to_dict document or an object of "
            "HALCON augment_dl_samples parameters",
            "metavar": "FILE",
            "flag": "--augment-config",
        },
    )
    seed: int = field(
        default=0, metadata={"help": "the seed of the variants", "metavar": "S", "flag": "--augment-seed"}
    )
    engine: Literal["dlpack", "albumentations"] = field(
        default="dlpack",
        metadata={
            "help": "dlpack (its own operations) or albumentations (the whole pipeline run by an installed "
            "albumentations)",
            "flag": "--augment-engine",
        },
    )
    jobs: int = field(
        default=-1,
        metadata={"help": "worker processes, -1 for every core; at most the core count", "metavar": "N"},
    )
    replace: bool = field(default=False, metadata={"help": "replace the variants the store has"})
    quiet: bool = field(default=False, metadata={"help": "no progress bar or summary"})
    no_resume: bool = field(
        default=False, metadata={"help": "start over instead of continuing a stopped run's finished blocks"}
    )
    scheduler: str | None = field(
        default=None,
        metadata={
            "help": "compute the variants on a Dask cluster: local (a LocalCluster of --jobs workers) or "
            "tcp://HOST:PORT (a running scheduler whose workers see STORE at the same path); needs the dask extra",
            "metavar": "ADDR",
        },
    )

    def __post_init__(self) -> None:
        check_int("augment (--augment K)", self.k, 0, wanted="an integer >= 0 (variants per image)")
        check_int("augment_seed (--augment-seed)", self.seed, 0)
        check_jobs(self.jobs)
        check_scheduler(self.scheduler)
        check_choice("augment_engine (--augment-engine)", self.engine, ENGINES, wanted=f"one of {', '.join(ENGINES)}")
        if self.k and self.config is None:
            raise OptionError(_NEEDS_CONFIG)


# ---------------------------------------------------------------- loader

Order = Literal["random", "sequential", "block"]


def online_layer(value: Any) -> Any:
    """The :class:`~dlpack.transforms.online.OnlineAugment` that ``online=`` names (imported on first use)."""
    try:
        from .transforms.online import OnlineAugment
    except ImportError as exc:
        raise OptionError(f"online= needs dlpack.transforms.online, which cannot be imported: {exc}") from exc
    try:
        return OnlineAugment.from_value(value)
    except OptionError as exc:
        if "online" in str(exc):
            raise
        raise OptionError(f"online: {exc}") from exc
    except (TypeError, ValueError, KeyError) as exc:
        raise OptionError(f"online must be True, a dict of OnlineAugment fields or an OnlineAugment: {exc}") from exc


def online_dict(value: Any) -> dict[str, Any] | None:
    """``online=`` in the form states keep: None when off, else the layer's JSON-ready dict."""
    if value is None or value is False:
        return None
    out = online_layer(value).to_dict()
    if not isinstance(out, dict):
        raise OptionError(f"online: OnlineAugment.to_dict() gave {type(out).__name__}, not a dict")
    return dict(out)


#: ``order="block"``'s run length where neither ``block_size`` nor the source says one.
BLOCK_SIZE = 64


@dataclass(frozen=True)
class LoaderOptions:
    """How a :class:`~dlpack.read.loader.Loader` walks a store.

    ``order=None`` means ``"random"`` when ``shuffle`` else ``"sequential"``. ``prefetch`` is the
    number of batches read ahead (4 by default: a read-ahead 3-6 batches deep keeps a GPU fed;
    0 reads each batch when asked). ``workers`` threads share that read-ahead; ``"auto"`` (the
    default) lets the loader pick their number from the batch's bytes, the store's compression and
    the cores it may use (:func:`~dlpack.read.loader.auto_workers`; ``repr(loader)`` says what it picked and why).

    Augmentation (docs/loader.md, "Cached augmentation views"): ``augment="cached"`` serves each
    sample the stored view (original or variant) its schedule picks for the epoch;
    ``original_rate`` serves the original with that probability per epoch instead;
    ``views_per_batch=m`` puts m different views of each image into one batch (``batch_size``
    rows, ``batch_size / m`` images); ``online`` (True, a dict or a
    :class:`~dlpack.transforms.online.OnlineAugment`, kept as its dict) re-applies a cheap seeded
    layer (flips, quarter turns, brightness/contrast) on the reader threads. All off by default.

    ``report=True`` prints one line per pass to stderr (:meth:`Loader.stats` keeps them all):
    ``epoch 3: 41,212 img/s, waited 2.1 % of the time (p99 0.4 ms)``.

    ``read_ahead_epochs`` (on by default): when a pass has submitted the last reads of its epoch,
    the reader threads go on with the first batches of the next epoch, so the next pass does not
    start with a wait; a pass that starts elsewhere (``set_epoch`` to another epoch, a loaded
    state) drops them. Off, and with a ``transform`` (which may count or log what it sees), no
    read happens after a pass ends (what a cold-cache measurement that evicts the files after
    each pass needs).

    ``block_size`` (``order="block"``): samples per run; None (the default) means one shard on a
    streamed store (the source's ``block_hint``: each shard fetched is used whole, by one rank)
    and 64 elsewhere. ``fetch_ahead``: how many batches ahead of its reads the loader names the
    samples it will read to the source's ``prefetch`` (a streamed store starts fetching their
    shards; a local store does nothing); 0 names none. Neither changes which samples are read
    when, apart from ``block_size`` itself.
    """

    batch_size: int = 32
    shuffle: bool = True
    seed: int = 0
    drop_last: bool = False
    prefetch: int = 4
    workers: int | Literal["auto"] = "auto"
    rank: int = 0
    world_size: int = 1
    order: Order | None = None
    # Block order for cold storage: runs of consecutive samples are shuffled, then samples are
    # shuffled inside windows of runs; 64 x 16 keeps reads sequential-ish and mixing wide.
    block_size: int | None = None
    window: int = 16
    augment: Literal["cached"] | None = None
    original_rate: float | None = None
    views_per_batch: int = 1
    online: dict[str, Any] | None = None
    report: bool = False
    read_ahead_epochs: bool = True
    fetch_ahead: int = 64

    def __post_init__(self) -> None:
        for name, minimum in (("seed", 0), ("batch_size", 1), ("prefetch", 0), ("fetch_ahead", 0)):
            object.__setattr__(self, name, check_int(name, getattr(self, name), minimum))
        if self.workers != "auto" and isinstance(self.workers, str):
            raise OptionError(f"workers must be 'auto' or an integer >= 0, got {self.workers!r}")
        object.__setattr__(self, "workers", check_workers(self.workers))
        for name, minimum in (("world_size", 1), ("window", 1)):
            object.__setattr__(self, name, check_int(name, getattr(self, name), minimum))
        if self.block_size is not None:
            object.__setattr__(
                self, "block_size", check_int("block_size", self.block_size, 1, wanted="None or an integer >= 1")
            )
        in_range = f"in 0..{self.world_size - 1} for world_size {self.world_size}"
        rank = check_int("rank", self.rank, 0, wanted=in_range)
        if rank >= self.world_size:
            raise OptionError(f"rank must be {in_range}, got {self.rank!r}")
        object.__setattr__(self, "rank", rank)
        if self.order is not None:
            check_choice("order", self.order, ("random", "sequential", "block"), wanted="random, sequential or block")
        if not isinstance(self.read_ahead_epochs, bool):
            raise OptionError(f"read_ahead_epochs must be True or False, got {self.read_ahead_epochs!r}")
        self._check_augment()

    def _check_augment(self) -> None:
        if self.augment not in (None, "cached"):
            raise OptionError(
                f"augment must be None or 'cached' (serve the store's augmentation variants), got {self.augment!r}"
            )
        m = check_int("views_per_batch", self.views_per_batch, 1)
        object.__setattr__(self, "views_per_batch", m)
        if m > 1 and self.augment != "cached":
            raise OptionError(
                f"views_per_batch={m} serves {m} stored views of each image in a batch; pass augment='cached' "
                "(a store with variants), or views_per_batch=1"
            )
        if self.batch_size % m:
            raise OptionError(
                f"views_per_batch={m} must divide batch_size={self.batch_size}: a batch holds batch_size / "
                f"views_per_batch images, {m} rows each"
            )
        if self.original_rate is not None:
            object.__setattr__(self, "original_rate", check_rate(self.original_rate))
            if self.augment != "cached":
                raise OptionError(
                    "original_rate chooses between the original and the cached variants; pass augment='cached'"
                )
        object.__setattr__(self, "online", online_dict(self.online))

    def block_for(self, hint: int | None) -> int:
        """The run length of ``order="block"``: ``block_size`` when given, else the source's
        ``hint`` (a streamed store's shard rows), else :data:`BLOCK_SIZE`."""
        if self.block_size is not None:
            return self.block_size
        return hint if isinstance(hint, int) and not isinstance(hint, bool) and hint > 0 else BLOCK_SIZE

    @property
    def effective_order(self) -> Order:
        """``order`` when set, else what ``shuffle`` asks for."""
        if self.order is not None:
            return self.order
        return "random" if self.shuffle else "sequential"


# ---------------------------------------------------------------- bench

#: ``dlpack bench --order`` and ``--cache`` values.
ORDERS: tuple[Order, ...] = ("sequential", "random", "block")
CACHES: tuple[str, ...] = ("warm", "cold")


def _comma_choices(name: str, flag: str, value: str | Sequence[str], allowed: tuple[str, ...]) -> tuple[str, ...]:
    """A comma list or sequence of ``allowed`` values, each at most once, as a tuple."""
    items = value.split(",") if isinstance(value, str) else list(value)
    items = [str(v).strip() for v in items if str(v).strip()]
    bad = [v for v in items if v not in allowed]
    if bad or not items:
        raise OptionError(f"{name} ({flag}) must be a comma-separated list of {', '.join(allowed)}; got {value!r}")
    if len(set(items)) != len(items):
        raise OptionError(f"{name} ({flag}) lists a value twice: {value!r}")
    return tuple(items)


@dataclass(frozen=True)
class BenchOptions:
    """What ``dlpack bench`` measures; each field is one CLI flag (its help is in the field's metadata).

    ``orders`` and ``caches`` accept tuples or comma-separated strings (``"sequential,random"``).
    ``samples`` (images per run) and ``seconds`` (per run) are exclusive; with neither, a run
    reads one epoch, at most 10 s, and a warm run keeps reading for at least 1 s. Cold runs read at
    most one epoch (after that the data is cached). ``repeat`` runs per cell give the median and
    the spread. ``step_ms`` adds, per run, a second run that sleeps that long per batch, as a
    training step would, and reports how much of the time the step was busy. ``size`` (W, H) is
    the resolution folder targets are resized to (default: the first store target's).
    ``batch_size``, ``workers`` and ``prefetch`` are the loader's, with its defaults.
    """

    orders: tuple[str, ...] = field(
        default=("sequential", "random"),
        metadata={"help": "comma list of sequential, random, block", "metavar": "LIST", "flag": "--order"},
    )
    caches: tuple[str, ...] = field(
        default=("warm", "cold"),
        metadata={
            "help": "comma list of warm, cold (cold evicts the target first)",
            "metavar": "LIST",
            "flag": "--cache",
        },
    )
    batch_size: int = field(default=LoaderOptions.batch_size, metadata={"help": "images per batch", "metavar": "B"})
    workers: str | int = field(  # "auto" or a count; the CLI passes the text, parsed below
        default=LoaderOptions.workers, metadata={"help": "loader threads, or auto", "metavar": "W"}
    )
    prefetch: int = field(default=LoaderOptions.prefetch, metadata={"help": "batches read ahead", "metavar": "P"})
    samples: int | None = field(
        default=None,
        metadata={"help": "images per run (default: one epoch, 1-10 s; not with --seconds)", "metavar": "N"},
    )
    seconds: float | None = field(
        default=None, metadata={"help": "seconds per run (not with --samples)", "metavar": "T"}
    )
    repeat: int = field(default=3, metadata={"help": "runs per cell; the median is reported", "metavar": "R"})
    step_ms: float | None = field(
        default=None, metadata={"help": "simulate a training step of MS per batch", "metavar": "MS"}
    )
    size: tuple[int, int] | None = field(
        default=None,
        metadata={"help": "resolution for folder targets (default: the first store's)", "metavar": "WxH"},
    )
    seed: int = field(default=0, metadata={"help": "seed of the random and block orders", "metavar": "S"})
    quiet: bool = field(default=False, metadata={"help": "no progress bar"})

    def __post_init__(self) -> None:
        object.__setattr__(self, "orders", _comma_choices("order", "--order", self.orders, ORDERS))
        object.__setattr__(self, "caches", _comma_choices("cache", "--cache", self.caches, CACHES))
        check_int("batch_size", self.batch_size, 1)
        object.__setattr__(self, "workers", check_workers(self.workers))
        check_int("prefetch", self.prefetch, 0)
        check_int("repeat", self.repeat, 1)
        check_int("seed", self.seed, 0)
        if self.samples is not None and self.seconds is not None:
            raise OptionError("give either samples (--samples N) or seconds (--seconds T) per run, not both")
        if self.samples is not None:
            check_int("samples", self.samples, 1)
        if self.seconds is not None:
            check_number("seconds", self.seconds, wanted="a number > 0")
        if self.step_ms is not None:
            check_number("step_ms", self.step_ms, wanted="a number of milliseconds >= 0", open_low=False)
        if self.size is not None:
            object.__setattr__(self, "size", parse_size(self.size))

    def loader_options(self, order: str) -> LoaderOptions:
        """The loader settings of one cell: these options, read in ``order``."""
        loader_order = next((o for o in ORDERS if o == order), None)
        if loader_order is None:
            raise OptionError(f"order must be one of {', '.join(ORDERS)}, got {order!r}")
        return LoaderOptions(
            batch_size=self.batch_size,
            shuffle=loader_order != "sequential",
            seed=self.seed,
            prefetch=self.prefetch,
            workers="auto" if self.workers == "auto" else int(self.workers),
            order=loader_order,
        )


# ---------------------------------------------------------------- tune

#: The read-ahead and orders of ``dlpack tune``'s grid by default (its reader threads: ``dlpack.tuning.DEFAULT_WORKERS``).
TUNE_PREFETCH: tuple[int, ...] = (2, 4, 8)
TUNE_ORDERS: tuple[str, ...] = ("random", "block")
#: Tie-breaks of the tuning rule: the better shuffle first (its keys are the orders tune takes).
TUNE_ORDER_RANK = {"random": 0, "block": 1, "sequential": 2}


@dataclass(frozen=True)
class TuneOptions:
    """What ``dlpack.tune`` (``dlpack tune STORE``) is told; its flags are generated from these fields.

    ``step_ms`` (required) is the training step per batch. The grid is ``workers`` x ``prefetch``
    x ``orders`` (a tuple or a comma list; ``workers=None``: 0, 1, 2 and ``"auto"``), each cell for at most ``max_batches`` batches and about
    ``max_seconds`` seconds, ``repeat`` times. ``batch_size`` defaults to the loader's; ``split``
    tunes one split's loader; ``source`` (the folder the store was built from) adds trial builds of
    ``sample`` of its images.
    """

    step_ms: float | None = field(
        default=None,
        metadata={"help": "the training step's length per batch, in ms", "metavar": "MS", "required": True},
    )
    batch_size: int | None = field(
        default=None, metadata={"help": "batch size (default: the loader's, 32)", "metavar": "B"}
    )
    split: str | None = field(
        default=None, metadata={"help": "tune the loader of this split of the store (e.g. train)"}
    )
    workers: tuple[int | str, ...] | None = field(default=None, metadata={"cli": False})
    prefetch: tuple[int, ...] = field(default=TUNE_PREFETCH, metadata={"cli": False})
    orders: tuple[str, ...] = field(
        default=TUNE_ORDERS,
        metadata={
            "help": "orders to try, comma list of random, block, sequential (sequential does not shuffle)",
            "metavar": "LIST",
            "flag": "--order",
        },
    )
    max_batches: int = field(default=100, metadata={"help": "batches per run of a cell at most", "metavar": "N"})
    max_seconds: float = field(default=0.1, metadata={"help": "seconds per run of a cell, about", "metavar": "S"})
    repeat: int = field(
        default=3, metadata={"help": "runs of the grid, interleaved; each cell's median counts", "metavar": "N"}
    )
    source: str | os.PathLike[str] | None = field(
        default=None,
        metadata={
            "help": "the folder the store was built from: also trial-build a sample of it at smaller sizes and "
            "with each codec, and say what a rebuild would gain",
            "metavar": "DIR",
        },
    )
    sample: int = field(default=128, metadata={"help": "with --source: images per trial build", "metavar": "N"})

    def __post_init__(self) -> None:
        if self.step_ms is not None:
            check_step_ms(self.step_ms)
        check_int("max_batches", self.max_batches, 1)
        check_number("max_seconds", self.max_seconds, wanted="a positive number of seconds")
        check_int("repeat", self.repeat, 1)
        orders = self.orders
        if isinstance(orders, str):
            orders = tuple(o.strip() for o in orders.split(",") if o.strip())
        workers = () if self.workers is None else self.workers
        for name, axis in (("workers", workers), ("prefetch", self.prefetch), ("orders", orders)):
            if name == "workers" and self.workers is None:
                continue
            if isinstance(axis, (str, bytes)) or not len(axis):
                raise OptionError(f"{name} must be a non-empty list, got {axis!r}")
            if len(set(axis)) != len(axis):
                raise OptionError(f"{name} repeats a value: {list(axis)!r}")
        for o in orders:
            check_choice("orders", o, tuple(TUNE_ORDER_RANK), wanted="random, block or sequential")
        for p in self.prefetch:
            check_int("prefetch values", p, 1, wanted="integers >= 1 (workers=0 reads none ahead)")
        for w in workers:
            LoaderOptions(workers=w)  # type: ignore[arg-type]  # an OptionError names a bad value
        if self.workers is not None:
            object.__setattr__(self, "workers", tuple(self.workers))
        object.__setattr__(self, "prefetch", tuple(self.prefetch))
        object.__setattr__(self, "orders", tuple(orders))
        if self.batch_size is not None:
            LoaderOptions(batch_size=self.batch_size)  # an OptionError names a bad batch size
        if self.source is not None:
            check_int("sample", self.sample, 1)


def check_step_ms(value: object) -> float:
    """A training step's length: a positive number of milliseconds per batch."""
    return check_number("step_ms", value, wanted="a positive number of milliseconds per batch")


# ---------------------------------------------------------------- export and preview

#: ``dlpack export --to`` values.
EXPORT_FORMATS = ("dldataset", "coco", "folders")


@dataclass(frozen=True)
class ExportOptions:
    """``dlpack export``'s flags (:func:`dlpack.export` checks the values)."""

    to: str | None = field(
        default=None,
        metadata={
            "help": "dldataset: dataset.json (+ dataset.hdict where HALCON imports); coco: annotations.json; "
            "folders: the layout HALCON's read_dl_dataset_* procedure for the store's task reads",
            "choices": EXPORT_FORMATS,
            "required": True,
        },
    )
    overwrite: bool = field(default=False, metadata={"help": "replace a previous dlpack export at OUT"})
    include_variants: bool = field(
        default=False,
        metadata={"help": "dldataset: add the store's augmentation variants of its training samples as extra samples"},
    )


@dataclass(frozen=True)
class PreviewOptions:
    """What ``dlpack preview`` draws (:func:`dlpack.variants.preview.preview`); its flags come from these fields."""

    count: int = field(default=8, metadata={"help": "samples, one row each", "metavar": "N"})
    seed: int = field(default=0, metadata={"help": "which samples are drawn", "metavar": "S"})
    tile: int = field(default=160, metadata={"help": "side of each view's cell", "metavar": "PX"})
    max_variants: int = field(default=8, metadata={"help": "variants shown per row", "metavar": "M"})
    index: Sequence[int] | None = field(  # kept as a tuple
        default=None,
        metadata={"help": "show these samples (indices), instead of --count drawn", "metavar": "I", "nargs": "+"},
    )

    def __post_init__(self) -> None:
        check_int("preview count (--count)", self.count, 1)
        check_int("preview seed (--seed)", self.seed, 0)
        tile = f"an integer from {PREVIEW_TILE[0]} to {PREVIEW_TILE[1]}"
        if check_int("preview tile (--tile, pixels)", self.tile, PREVIEW_TILE[0], wanted=tile) > PREVIEW_TILE[1]:
            raise OptionError(f"preview tile (--tile, pixels) must be {tile}, got {self.tile!r}")
        check_int("preview max_variants (--max-variants)", self.max_variants, 0)
        if self.index is not None:
            given = self.index if isinstance(self.index, Sequence) else [self.index]
            index = tuple(check_int("preview index (--index)", i, 0) for i in given)
            if not index:
                raise OptionError("preview index (--index) names no sample; give one or more sample indices")
            object.__setattr__(self, "index", index)


#: The side of a preview's cells, in pixels: at least 32, at most 4096.
PREVIEW_TILE = (32, 4096)
