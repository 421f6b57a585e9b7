"""Stage 3: the plan, everything decided before any pixel is written, and the digests a resume or update compares."""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, overload

import numpy as np

from ..backends import ArraySpec, Backend, get_backend
from ..errors import DlpackError, InputFileError, OptionError, SourceError, StoreError
from ..manifest import ImageSpec
from ..options import SPLIT_PART_NAMES, BuildOptions, parse_labels, parse_split
from ..sources._where import files_at
from ..sources.base import SourceItem, SourceScan
from ..sources.decode import TargetSpec
from ..sources.probe import HEADER_BYTES, probe_header
from ..storage.location import Location, is_url
from ..transforms.functional import UpscaleError
from .inputs import Probe, Selection, bad_inputs

#: Tasks whose label arrays the build writes beside the images (classification is the ``labels`` array alone).
LABEL_TASKS = ("detection", "segmentation", "anomaly")


@dataclass(frozen=True)
class LabelPlan:
    """Which label arrays a build writes and how (docs/format.md, "Arrays a build writes").

    ``boxes`` writes ``boxes`` and ``box_labels``, ``crowd`` ``box_crowd``; ``mask_dtype`` (``|u1``
    or ``<u2``, None: no mask) and ``mask_ignore`` (the pad value) shape the ``mask`` array;
    ``defects`` are the anomaly defect folder names (the ``defect`` array indexes them).
    ``class_ids`` and ``label_root`` come from the scan, for :func:`~dlpack.sources.prepare_labels`;
    they are not part of :meth:`to_dict` (the source digest covers them), so a plan read back from
    a store has them empty until an update sets them from its own scan.
    """

    task: str
    boxes: bool = False
    crowd: bool = False
    mask_dtype: str | None = None
    mask_ignore: int | None = None
    instance_masks: bool = False
    defects: tuple[str, ...] = ()
    class_ids: tuple[int, ...] = ()
    label_root: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The label plan as the manifest's plan records it."""
        return {
            "task": self.task,
            "boxes": self.boxes,
            "crowd": self.crowd,
            "mask": None if self.mask_dtype is None else {"dtype": self.mask_dtype, "ignore": self.mask_ignore},
            "defects": list(self.defects),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], instance_masks: bool) -> LabelPlan:
        """The label plan a manifest records (:meth:`to_dict`), checked; a malformed one is a ``TypeError``."""
        mask = d.get("mask")
        if mask is not None and (not isinstance(mask, Mapping) or mask.get("dtype") not in ("|u1", "<u2")):
            raise TypeError(f"labels.mask must be null or {{dtype: |u1 or <u2, ignore}}, got {mask!r}")
        defects = d.get("defects", [])
        if not isinstance(defects, list) or not all(isinstance(x, str) for x in defects):
            raise TypeError(f"labels.defects must be a list of names, got {defects!r}")
        task = d["task"]
        if task not in LABEL_TASKS:
            raise TypeError(f"labels.task must be one of {', '.join(LABEL_TASKS)}, got {task!r}")
        return cls(
            task=task,
            boxes=bool(d.get("boxes", False)),
            crowd=bool(d.get("crowd", False)),
            mask_dtype=None if mask is None else str(mask["dtype"]),
            mask_ignore=None if mask is None else int(mask["ignore"]),
            instance_masks=instance_masks,
            defects=tuple(defects),
        )


@dataclass(frozen=True)
class BuildPlan:
    """Everything decided before any pixel is written; recorded in the manifest as ``plan``.

    A later resume or update of the store compares its own plan (or :meth:`fingerprint`) with the
    recorded one to know that it continues the same build.

    Attributes
    ----------
    target : TargetSpec
        Geometry (resize mode, size, max side, upscaling), channels, dtype and pixel limit.
    image : ImageSpec
        The stored layout: fixed ``height x width`` or variable, channels, dtype.
    backend, compression : str
        Store format and codec.
    shard_bytes : int
        The shard size asked for.
    shard_rows : int
        Images per shard (fixed layout), or inner chunks per shard of the flat pixel array (variable);
        recorded as ``shard_images``, the format's name for it.
    count : int
        Number of samples.
    order : str
        SHA-256 (hex) of the stored samples' relative paths in sample order, as a compact JSON list.
    source : str
        SHA-256 (hex) of what the source listed: every item's path, label, split, annotations and
        file size, the class names and the inputs the scan refused.
    follow_symlinks : bool
        Whether a folder source followed symlinks: part of what the source lists, so an update
        scans with the same rule (recorded only when true).
    exclude : tuple of str
        The exclude patterns of a folder source, which an update scans with too (recorded only when given).
    split, split_seed : tuple of int, int
        The percentages and seed of a split the build made (``--split``; recorded only when given):
        an update gives appended samples their split by the same seed.
    labels : LabelPlan or None
        The label arrays written beside the images (None: only ``labels``, ``split``); recorded
        as ``labels``, and ``instance_masks`` at the top (where the exporters read it).
    label_source, class_folder, anomaly_masks : str
        The ``--labels KIND:PATH`` the source was read with (its path made absolute; recorded for
        the label kinds beyond folders), ``--class-folder`` (recorded when ``last``) and the
        ``--anomaly-masks`` folder (absolute): an update of a folder path reads the same source.
    """

    target: TargetSpec
    image: ImageSpec
    backend: str
    compression: str
    shard_bytes: int
    shard_rows: int
    count: int
    order: str
    source: str
    follow_symlinks: bool = False
    exclude: tuple[str, ...] = ()
    split: tuple[int, ...] = ()
    split_seed: int = 0
    labels: LabelPlan | None = None
    label_source: str = ""
    class_folder: str = "top"
    anomaly_masks: str = ""

    @property
    def split_names(self) -> tuple[str, ...]:
        """The sorted names of the split the build made; () when it made none."""
        return tuple(sorted(SPLIT_PART_NAMES[len(self.split)])) if self.split else ()

    def __post_init__(self) -> None:
        if (self.target.channels, self.target.dtype) != (self.image.channels, self.image.dtype):
            raise ValueError(
                f"plan target is {self.target.channels} channels {self.target.dtype} but the stored image "
                f"is {self.image.channels} channels {self.image.dtype}"
            )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict; :meth:`from_dict` inverts it."""
        return {
            "target": self.target.to_dict(),
            "image": asdict(self.image),
            "backend": self.backend,
            "compression": self.compression,
            "shard_bytes": self.shard_bytes,
            "shard_images": self.shard_rows,
            "count": self.count,
            "order": self.order,
            "source": self.source,
        } | (
            ({"follow_symlinks": True} if self.follow_symlinks else {})
            | ({"exclude": list(self.exclude)} if self.exclude else {})
            | ({"split": {"percent": list(self.split), "seed": self.split_seed}} if self.split else {})
            | ({"labels": self.labels.to_dict()} if self.labels is not None else {})
            | ({"instance_masks": True} if self.labels is not None and self.labels.instance_masks else {})
            | ({"label_source": self.label_source} if self.label_source else {})
            | ({"class_folder": self.class_folder} if self.class_folder != "top" else {})
            | ({"anomaly_masks": self.anomaly_masks} if self.anomaly_masks else {})
        )

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> BuildPlan:
        """Rebuild a plan from :meth:`to_dict` output (e.g. ``Manifest.plan``).

        Raises
        ------
        StoreError
            ``d`` is not a complete plan.
        """
        try:
            fields = {k: d[k] for k in ("backend", "compression", "shard_bytes", "count")}
            follow = d.get("follow_symlinks", False)
            if not isinstance(follow, bool):
                raise TypeError(f"follow_symlinks must be true or false, got {follow!r}")
            exclude = d.get("exclude", [])
            if not isinstance(exclude, list) or not all(isinstance(p, str) for p in exclude):
                raise TypeError(f"exclude must be a list of patterns, got {exclude!r}")
            split = d.get("split", {"percent": [], "seed": 0})
            pcts, seed = split["percent"], split["seed"]
            if pcts:
                pcts = list(parse_split(pcts))
            if not isinstance(seed, int) or isinstance(seed, bool):
                raise TypeError(f"the split seed must be an integer, got {seed!r}")
            labels = d.get("labels")
            if labels is not None and not isinstance(labels, Mapping):
                raise TypeError(f"labels must be a mapping, got {labels!r}")
            extra = {k: d.get(k, default) for k, default in (("label_source", ""), ("anomaly_masks", ""))}
            if not all(isinstance(v, str) for v in extra.values()) or d.get("class_folder", "top") not in (
                "top",
                "last",
            ):
                raise TypeError("label_source, class_folder and anomaly_masks must be strings")
            return cls(
                labels=None if labels is None else LabelPlan.from_dict(labels, bool(d.get("instance_masks", False))),
                class_folder=d.get("class_folder", "top"),
                **extra,
                follow_symlinks=follow,
                exclude=tuple(exclude),
                split=tuple(pcts),
                split_seed=seed,
                target=TargetSpec.from_dict(dict(d["target"])),
                image=ImageSpec(**d["image"]),
                shard_rows=d["shard_images"],
                order=d["order"],
                source=d["source"],
                **fields,
            )
        except (KeyError, TypeError, ValueError, OptionError) as exc:
            raise StoreError(f"the recorded build plan is malformed: {exc!r}") from exc

    def fingerprint(self) -> str:
        """SHA-256 (hex) of the plan's canonical JSON: equal plans, equal fingerprints, across runs and machines."""
        text = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _majority(values: Counter[int], default: int) -> int:
    if not values:
        return default
    counts = values.most_common()
    best = counts[0][1]
    # Ties go to the richer representation (colour, 16-bit), which loses nothing.
    return max(v for v, n in counts if n == best)


def order_digest(items: Iterable[SourceItem]) -> str:
    """SHA-256 of the paths as a compact JSON list, hashed path by path (the same bytes as
    ``json.dumps`` of the whole list, without holding that list and its text)."""
    h = hashlib.sha256(b"[")
    for k, it in enumerate(items):
        h.update((b"," if k else b"") + json.dumps(it.rel, ensure_ascii=False).encode("utf-8"))
    h.update(b"]")
    return h.hexdigest()


def _json_default(value: Any) -> Any:
    """JSON for NumPy values in annotations (arrays by content digest)."""
    if isinstance(value, np.ndarray):
        data = np.ascontiguousarray(value)
        return {"dtype": data.dtype.str, "shape": list(data.shape), "sha256": hashlib.sha256(data.data).hexdigest()}
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON-serialisable")


def source_digest(scan: SourceScan, probes: Sequence[Probe]) -> str:
    """SHA-256 of what the scan and the probes say of the source, so a plan names the source it was made from."""
    h = hashlib.sha256()
    head: dict[str, Any] = {
        "classes": list(scan.classes),
        "labels": scan.labels,
        "refused": sorted(e.path for e in scan.errors),
    }
    # Recorded only where they say more than a folder's scan, so older stores keep their digests.
    if scan.class_ids and tuple(scan.class_ids) != tuple(range(len(scan.classes))):
        head["class_ids"] = list(scan.class_ids)
    if scan.task not in ("classification", "none"):
        head["task"] = scan.task
    h.update(json.dumps(head, sort_keys=True, ensure_ascii=False).encode("utf-8"))
    for item, probe in zip(scan.items, probes, strict=True):
        record = [item.rel, item.label, item.split, probe.nbytes, item.annotations]
        try:
            line = json.dumps(record, sort_keys=True, ensure_ascii=False, default=_json_default)
        except (TypeError, ValueError) as exc:
            raise SourceError(f"the annotations of {item.rel!r} are not JSON-serialisable: {exc}") from exc
        h.update(b"\n" + line.encode("utf-8"))
    return h.hexdigest()


#: The most bytes one write block may take in memory (a block is at least one image, whatever its size).
MAX_BLOCK_BYTES = 2**31


def _check_block_bytes(
    backend: type[Backend], spec: ImageSpec, count: int, *, compression: str, shard_bytes: int
) -> None:
    """Refuse a plan whose write block (one shard's images, held in memory at once) is too large."""
    images = image_array(spec, compression)
    if images.ragged:
        return  # variable sizes are written in runs of a few images, each within max_pixels
    item = images.item_nbytes
    block = backend.shard_rows(images, count, shard_bytes) * item
    if block > max(MAX_BLOCK_BYTES, item):
        raise OptionError(
            f"one write block would take {block / 2**30:.1f} GiB ({block // item} images of {item} bytes); "
            f"lower shard_bytes (--shard-bytes, now {shard_bytes}) to at most {MAX_BLOCK_BYTES}"
        )


def _label_image_depth(base: str, path: str, storage_options: Any) -> int:
    """The bit depth a label image's header gives (8 when it cannot be read: its sample fails later, naming it).

    ``base`` is the label folder, or a bucket prefix read with ``storage_options``."""
    try:
        if is_url(base):
            head = files_at(Location.parse(base, storage_options or None)).read_head(path, HEADER_BYTES)[0]
        else:
            with open(Path(base, path), "rb") as f:
                head = f.read(HEADER_BYTES)
    except (OSError, DlpackError):
        return 8
    header = probe_header(head)
    return header.bit_depth if header is not None else 8


def label_plan(
    scan: SourceScan, items: Sequence[SourceItem], root: str, storage_options: Any = None
) -> LabelPlan | None:
    """The label arrays the items' annotations call for (None for classification and unlabelled sources).

    The mask is ``|u1`` (ignore value 255) unless an id it stores can exceed 254 (a class id, an
    instance count with ``instance_masks``) or a label image is 16-bit (read from its header when
    the source has no class list): then ``<u2`` (ignore 65535).
    """
    if scan.task not in LABEL_TASKS:
        return None
    anns = [it.annotations or {} for it in items]
    boxes = scan.task == "detection" or any("boxes" in a for a in anns)
    crowd = any("iscrowd" in a for a in anns)
    instance = any(bool(a.get("instance_masks")) for a in anns)
    has_mask = scan.task == "segmentation" or any(
        a.get("mask") or a.get("anomaly_mask") or "segmentation" in a for a in anns
    )
    defects = tuple(sorted({str(a["defect"]) for a in anns if a.get("defect") is not None}))
    dtype: str | None = None
    if has_mask and scan.task == "segmentation" and 65535 in scan.class_ids:
        # Label images are stored as they are: pixels of this class would read as the 16-bit pad value.
        name = scan.classes[scan.class_ids.index(65535)] if len(scan.classes) == len(scan.class_ids) else "?"
        raise SourceError(
            f"class {name!r} has id 65535, the pad value of 16-bit masks: its pixels would read as padding; "
            "give it an id from 0 to 65534 in the class list and its label images"
        )
    if has_mask:
        wide = bool(scan.class_ids) and max(scan.class_ids) > 254
        if instance:
            wide = wide or max((len(a.get("boxes") or ()) for a in anns), default=0) > 254
        if not scan.class_ids and not wide:
            base = scan.label_root if scan.label_root is not None else root
            for a in anns:
                path = a.get("mask")
                if path and _label_image_depth(base, path, storage_options) == 16:
                    wide = True
                    break
        dtype = "<u2" if wide else "|u1"
    return LabelPlan(
        task=scan.task,
        boxes=boxes,
        crowd=crowd,
        mask_dtype=dtype,
        mask_ignore=None if dtype is None else (65535 if dtype == "<u2" else 255),
        instance_masks=instance,
        defects=defects,
        class_ids=tuple(scan.class_ids),
        label_root=scan.label_root,
    )


def _absolute(path: str) -> str:
    """A local path made absolute; a URL as given (``s3://`` is no folder of the working one)."""
    return path if is_url(path) else os.path.abspath(path)


def label_options(labels: str, class_folder: str, anomaly_masks: str | None) -> dict[str, str]:
    """The plan's record of the label source a folder path was read with (paths made absolute)."""
    kind, path = parse_labels(labels)
    out: dict[str, str] = {"class_folder": str(class_folder)}
    if kind not in ("auto", "folders", "none"):
        out["label_source"] = kind + (":" + _absolute(path) if path is not None else "")
    if anomaly_masks:
        out["anomaly_masks"] = _absolute(anomaly_masks)
    return out


def plan_stage(
    scan: SourceScan, probes: Sequence[Probe], sel: Selection, opts: BuildOptions, backend: str, root: str = ""
) -> tuple[BuildPlan, Selection]:
    """3. Choose channels, dtype, geometry, layout and shard size from the items still in.

    Items the target would have to enlarge (without ``allow_upscale``) leave the selection as input
    errors. The same inputs always give the same plan.
    """
    if not sel.keep and sel.errors:
        # Nothing is left to plan for: the inputs' own errors say why, not the shape of an empty store.
        raise bad_inputs(sel.errors, root, nothing_left=True)
    # Counted and then read again header by header: a list of every header would be one object per image.
    channel_counts: Counter[int] = Counter()
    depth_counts: Counter[int] = Counter()
    for k in sel.keep:
        header = probes[k].header
        if header is None:
            raise ValueError(f"item {scan.items[k].rel!r} is selected but has no probed header")
        channel_counts[header.channels] += 1
        depth_counts[header.bit_depth] += 1
    channels = opts.channels if opts.channels != "keep" else _majority(channel_counts, 3)
    depth = _majority(depth_counts, 8)
    target = TargetSpec(
        mode=opts.resize_mode,
        size=opts.size,
        max_side=opts.max_side,
        allow_upscale=opts.allow_upscale,
        channels=int(channels),
        dtype="|u1" if depth == 8 else "<u2",
        max_pixels=opts.max_pixels,
    )
    upscale: dict[int, InputFileError] = {}
    sizes: set[tuple[int, int]] = set()
    geometry: dict[tuple[int, int], Any] = {}  # one per distinct size: the same answer for the same size
    for k in sel.keep:
        h = probes[k].header
        assert h is not None
        w, hh = h.oriented_size
        try:
            g = geometry.get((hh, w)) or geometry.setdefault((hh, w), target.geometry(hh, w))
        except UpscaleError as exc:
            upscale[k] = InputFileError(scan.items[k].rel, str(exc))
            continue
        if g.out_h * g.out_w > target.max_pixels:
            # Refused here, before any buffer of that size exists: the options ask for it, not the file.
            raise OptionError(
                f"{scan.items[k].rel!r} would be stored as {g.out_w}x{g.out_h} = {g.out_h * g.out_w} pixels, "
                f"more than max_pixels={target.max_pixels} (--max-pixels); choose a smaller size or max_side, "
                "or raise max_pixels if the machine has the memory"
            )
        sizes.add((g.out_h, g.out_w))
    sel = sel.drop(upscale)
    if len(sizes) == 1:
        ((oh, ow),) = sizes
        spec = ImageSpec("fixed", target.channels, target.dtype, oh, ow)
    else:
        spec = ImageSpec("variable", target.channels, target.dtype)
    kept = _Kept(scan.items, sel.keep)
    _check_block_bytes(
        get_backend(backend), spec, len(kept), compression=opts.compression, shard_bytes=opts.shard_bytes
    )
    labels = label_plan(scan, kept, root, opts.storage_options)
    if labels is not None and labels.mask_dtype is not None and spec.shape is None:
        raise OptionError(
            f"the {scan.task} labels are stored as masks, which need one image size for the whole store, but the "
            f"images would be stored in {len(sizes)} sizes; pass --size WxH (size=...) with --resize stretch or fit"
        )
    plan = BuildPlan(
        target=target,
        image=spec,
        backend=backend,
        compression=opts.compression,
        shard_bytes=opts.shard_bytes,
        shard_rows=get_backend(backend).shard_rows(image_array(spec, opts.compression), len(kept), opts.shard_bytes),
        count=len(kept),
        order=order_digest(kept),
        source=source_digest(scan, probes),
        follow_symlinks=opts.follow_symlinks,
        exclude=opts.exclude,
        split=opts.split or (),
        split_seed=(opts.split_seed or 0) if opts.split else 0,
        labels=labels,
        **label_options(opts.labels, opts.class_folder, opts.anomaly_masks),
    )
    return plan, sel


class _Kept(Sequence[SourceItem]):
    """The items at positions ``keep``, made one at a time as they are read."""

    def __init__(self, items: Sequence[SourceItem], keep: Sequence[int]) -> None:
        self.items, self.keep = items, keep

    def __len__(self) -> int:
        return len(self.keep)

    @overload
    def __getitem__(self, k: int) -> SourceItem: ...

    @overload
    def __getitem__(self, k: slice) -> list[SourceItem]: ...

    def __getitem__(self, k: int | slice) -> SourceItem | list[SourceItem]:
        if isinstance(k, slice):
            return [self.items[j] for j in self.keep[k]]
        return self.items[self.keep[k]]

    def __iter__(self) -> Iterator[SourceItem]:
        for k in self.keep:
            yield self.items[k]


def image_array(image: ImageSpec, compression: str) -> ArraySpec:
    """The array holding the pixels: ``images`` [N, H, W, C], or ragged flat ``image`` for variable sizes."""
    if image.shape is not None:
        return ArraySpec("images", image.dtype, image.shape, key="image", compression=compression)
    return ArraySpec("image", image.dtype, (), ragged=True, compression=compression)
