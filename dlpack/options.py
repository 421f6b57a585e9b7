"""Frozen, validated option dataclasses shared by the library and the CLI."""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from .errors import OptionError

__all__ = [
    "BuildOptions",
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


def _format_names() -> tuple[str, ...]:
    from .backends import format_names  # the registry is the one list of formats

    # dldataset is no store: the build packs a hidden store and exports it (dlpack.pack).
    return (*format_names(), "dldataset")


ResizeMode = Literal["stretch", "fit", "none"]
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


def _choice(name: str, value: object, allowed: tuple[object, ...]) -> None:
    if value not in allowed:
        raise OptionError(f"{name} must be one of {', '.join(map(str, allowed))}; got {value!r}")


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
    # "none" by measurement: see docs/benchmarks.md (compression halves random reads and
    # barely shrinks 8-bit photos with plain LZ4).
    compression: Compression = field(default="none", metadata={"help": "compression of the stored images"})
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
            if not isinstance(self.split_seed, int) or isinstance(self.split_seed, bool) or self.split_seed < 0:
                raise OptionError(f"split_seed must be an integer >= 0, got {self.split_seed!r}")
            if self.split is None and not self.update:
                raise OptionError("split_seed only applies to split: pass split=80,10,10 (--split) too")
        if self.format is not None:
            _choice("format", self.format, _format_names())
        if self.size is not None:
            object.__setattr__(self, "size", parse_size(self.size))
        if self.max_side is not None and (
            not isinstance(self.max_side, int) or isinstance(self.max_side, bool) or self.max_side <= 0
        ):
            raise OptionError(f"max_side must be a positive integer, got {self.max_side!r}")
        if self.size is not None and self.max_side is not None:
            raise OptionError("give either size (WxH) or max_side, not both")
        if self.resize is not None:
            _choice("resize", self.resize, ("stretch", "fit", "none"))
        # An update takes its geometry from the store and refuses any given value that differs, with
        # advice it can follow ("drop those options"); advice to pass a size could not be followed.
        if not self.update:
            self._check_geometry()
        channels: object = self.channels
        if isinstance(channels, str) and channels.isdigit():
            channels = int(channels)
            object.__setattr__(self, "channels", channels)
        _choice("channels", channels, ("keep", 1, 3))
        kind, _ = parse_labels(self.labels)
        _choice("class_folder", self.class_folder, ("top", "last"))
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
        if not isinstance(self.jobs, int) or isinstance(self.jobs, bool) or self.jobs == 0 or self.jobs < -1:
            raise OptionError(f"jobs must be a positive number of processes or -1 for all cores, got {self.jobs!r}")
        _choice("compression", self.compression, ("none", "lz4", "zstd"))
        _choice("on_error", self.on_error, ("fail", "skip"))
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
        if not isinstance(k, int) or isinstance(k, bool) or k < 0:
            raise OptionError(f"augment (--augment K) must be an integer >= 0 (variants per image), got {k!r}")
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            raise OptionError(f"augment_seed (--augment-seed) must be an integer >= 0, got {seed!r}")
        _choice("augment_engine", self.augment_engine, ("dlpack", "albumentations"))
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
            raise OptionError(
                "augment (--augment K) needs augment_config (--augment-config FILE): the operations to apply"
            )
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
