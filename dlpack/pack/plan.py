"""Stage 3: the plan, everything decided before any pixel is written, and the digests a resume or update compares."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ..backends import ArraySpec, Backend, get_backend
from ..errors import InputFileError, OptionError, SourceError, StoreError
from ..manifest import ImageSpec
from ..options import SPLIT_PART_NAMES, BuildOptions, parse_split
from ..sources.base import SourceItem, SourceScan
from ..sources.decode import TargetSpec
from ..sources.probe import ImageHeader
from ..transforms.functional import UpscaleError
from .inputs import Probe, Selection


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
            return cls(
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


def _majority(values: Sequence[int], default: int) -> int:
    if not values:
        return default
    counts = Counter(values).most_common()
    best = counts[0][1]
    # Ties go to the richer representation (colour, 16-bit), which loses nothing.
    return max(v for v, n in counts if n == best)


def order_digest(items: Sequence[SourceItem]) -> str:
    text = json.dumps([it.rel for it in items], separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _json_default(value: Any) -> Any:
    """JSON for NumPy values in annotations (arrays by content digest)."""
    if isinstance(value, np.ndarray):
        data = np.ascontiguousarray(value)
        return {"dtype": data.dtype.str, "shape": list(data.shape), "sha256": hashlib.sha256(data.data).hexdigest()}
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON-serialisable")


def source_digest(scan: SourceScan, probes: Sequence[Probe]) -> str:
    h = hashlib.sha256()
    head = {"classes": list(scan.classes), "labels": scan.labels, "refused": sorted(e.path for e in scan.errors)}
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


def _check_block_bytes(backend: type[Backend], spec: ImageSpec, count: int, opts: BuildOptions) -> None:
    """Refuse a plan whose write block (one shard's images, held in memory at once) is too large."""
    images = image_array(spec, opts.compression)
    if images.ragged:
        return  # variable sizes are written in runs of a few images, each within max_pixels
    item = images.item_nbytes
    block = backend.shard_rows(images, count, opts.shard_bytes) * item
    if block > max(MAX_BLOCK_BYTES, item):
        raise OptionError(
            f"one write block would take {block / 2**30:.1f} GiB ({block // item} images of {item} bytes); "
            f"lower shard_bytes (--shard-bytes, now {opts.shard_bytes}) to at most {MAX_BLOCK_BYTES}"
        )


def plan_stage(
    scan: SourceScan, probes: Sequence[Probe], sel: Selection, opts: BuildOptions, backend: str
) -> tuple[BuildPlan, Selection]:
    """3. Choose channels, dtype, geometry, layout and shard size from the items still in.

    Items the target would have to enlarge (without ``allow_upscale``) leave the selection as input
    errors. The same inputs always give the same plan.
    """
    headers: list[ImageHeader] = []
    for k in sel.keep:
        header = probes[k].header
        if header is None:
            raise ValueError(f"item {scan.items[k].rel!r} is selected but has no probed header")
        headers.append(header)
    channels = opts.channels if opts.channels != "keep" else _majority([h.channels for h in headers], 3)
    depth = _majority([h.bit_depth for h in headers], 8)
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
    for k, h in zip(sel.keep, headers, strict=True):
        w, hh = h.oriented_size
        try:
            g = target.geometry(hh, w)
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
    kept = [scan.items[k] for k in sel.keep]
    _check_block_bytes(get_backend(backend), spec, len(kept), opts)
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
    )
    return plan, sel


def image_array(image: ImageSpec, compression: str) -> ArraySpec:
    """The array holding the pixels: ``images`` [N, H, W, C], or ragged flat ``image`` for variable sizes."""
    if image.shape is not None:
        return ArraySpec("images", image.dtype, image.shape, key="image", compression=compression)
    return ArraySpec("image", image.dtype, (), ragged=True, compression=compression)
