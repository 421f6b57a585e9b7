"""How the source differs from the store an update replaces, and what ``build --update`` keeps, refuses and carries over."""

from __future__ import annotations

import hashlib
import os
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from .. import schema
from .._names import shown as shown_name
from ..backends import ArraySpec, StoreWriter
from ..errors import BadInputsError, InputFileError, OptionError, SourceError
from ..manifest import Manifest
from ..options import BuildOptions
from ..sources.anomaly import AnomalyFolderSource
from ..sources.base import Source, SourceFiles, SourceScan
from ..sources.folder import FOLLOW_ADVICE, SPLIT_NAMES, FolderSource, label_path, label_paths_error
from ..sources.masks import MaskFolderSource
from .inputs import Probe, split_names
from .plan import BuildPlan

#: What ``build --update`` does with each build option (a test holds every field of BuildOptions to
#: one entry): "plan" options must match the store's plan when given; "kept" ones keep the store's
#: value when left at their default and are refused when given with another value; "applied" ones
#: are used by this run (``allow_upscale`` and ``max_pixels`` become the store's).
UPDATE_OPTIONS: dict[str, str] = {
    "format": "kept",
    "size": "plan",
    "max_side": "plan",
    "resize": "plan",
    "channels": "plan",
    "compression": "kept",
    "shard_bytes": "kept",
    "labels": "kept",
    "class_folder": "kept",
    "anomaly_masks": "kept",
    "instance_masks": "kept",
    "follow_symlinks": "kept",
    "exclude": "kept",
    "split": "kept",
    "split_seed": "kept",
    "verbose": "applied",
    "allow_upscale": "applied",
    "max_pixels": "applied",
    "jobs": "applied",
    "force_jobs": "applied",
    "on_error": "applied",
    "quiet": "applied",
    # An update of a store in an object store is refused before it starts (pack.inputs.check_remote_options).
    "storage_options": "applied",
    "no_resume": "applied",
    "update": "applied",
    "compact": "applied",
    "fill": "applied",
    "drop_array": "applied",
    "overwrite": "refused",
    # An update runs on this machine's pool: BuildOptions refuses a scheduler with update.
    "scheduler": "refused",
    # An update never computes variants: an update that changes samples drops them, saying so.
    "augment": "refused",
    "augment_config": "refused",
    "augment_seed": "refused",
    "augment_engine": "refused",
}


def _shown_value(value: Any) -> str:
    if isinstance(value, tuple) and len(value) == 2:
        return f"{value[0]}x{value[1]}"
    return "not given" if value is None else str(value)


def check_update_options(plan: BuildPlan, opts: BuildOptions, out: Path) -> BuildPlan:
    """The plan an update of ``out`` writes under: the store's, with the options an update applies.

    Geometry, channels, compression and shard size are the store's: an option that names another
    value is refused, naming the store's (an update cannot re-encode what it shares or keeps).
    """
    t = plan.target
    defaults = BuildOptions()
    given = {
        "size": (opts.size, t.size),
        "max_side": (opts.max_side, t.max_side),
        "resize": (opts.resize, t.mode),
        "channels": (None if opts.channels == "keep" else opts.channels, t.channels),
        "compression": (None if opts.compression == defaults.compression else opts.compression, plan.compression),
        "shard_bytes": (None if opts.shard_bytes == defaults.shard_bytes else opts.shard_bytes, plan.shard_bytes),
    }
    differ = [
        f"{name} (the store's: {_shown_value(theirs)}, given: {_shown_value(mine)})"
        for name, (mine, theirs) in given.items()
        if mine is not None and mine != theirs
    ]
    if opts.follow_symlinks and not plan.follow_symlinks:
        differ.append("follow_symlinks (the store was built without --follow-symlinks)")
    if opts.exclude and sorted(set(opts.exclude)) != sorted(set(plan.exclude)):
        theirs = ", ".join(repr(p) for p in plan.exclude) or "none"
        differ.append(f"exclude (the store's: {theirs}; given: {', '.join(repr(p) for p in opts.exclude)})")
    if opts.split is not None and opts.split != plan.split:
        theirs = ",".join(map(str, plan.split)) if plan.split else "none (its splits are its source's, or none)"
        differ.append(f"split (the store's: {theirs}; given: {','.join(map(str, opts.split))})")
    if opts.split_seed is not None and (not plan.split or opts.split_seed != plan.split_seed):
        theirs = str(plan.split_seed) if plan.split else "none (built without --split)"
        differ.append(f"split_seed (the store's: {theirs}; given: {opts.split_seed})")
    if differ:
        raise OptionError(
            f"--update keeps the plan {out} was built with; it differs in {'; '.join(differ)}: "
            "drop those options, or rebuild with --overwrite"
        )
    target = replace(
        t,
        allow_upscale=t.allow_upscale or opts.allow_upscale,
        max_pixels=t.max_pixels if opts.max_pixels == defaults.max_pixels else opts.max_pixels,
    )
    return replace(plan, target=target)


def source_with_rules(source: Source, plan: BuildPlan) -> Source:
    """``source`` scanning with the store's symlink rule and exclude patterns: a store built following
    symlinks keeps following them, and one built with ``--exclude`` keeps leaving those paths out.

    Label folders and images are listed, not refused, by the scan: a store built before they were
    refused may hold some, and keeps them; the update refuses only new ones (:func:`new_label_paths`).
    """
    if isinstance(source, MaskFolderSource):
        follow = source.follow_symlinks or plan.follow_symlinks
        return MaskFolderSource(source.root, source.masks_dir, follow, plan.exclude, source.storage_options)
    if isinstance(source, AnomalyFolderSource):
        follow = source.follow_symlinks or plan.follow_symlinks
        return AnomalyFolderSource(source.root, source.masks_dir, follow, plan.exclude, source.storage_options)
    if not isinstance(source, FolderSource):
        return source
    follow = source.follow_symlinks or plan.follow_symlinks
    return FolderSource(
        source.root, source.labels, follow, plan.exclude, check_labels=False, class_folder=source.class_folder
    )


def label_changes(ch: Changes, scan: SourceScan, digest0: np.ndarray | None, digest: Any) -> Changes:
    """``ch`` with every kept sample whose labels changed (annotations or label files: their
    :func:`~dlpack.pack.workers.label_digest`, by ``digest(item)``) replaced, although its image did not."""
    if digest0 is None:
        return ch
    extra = {i for i in ch.kept if i not in ch.replaced and digest(scan.items[ch.match[i]]) != bytes(digest0[i]).hex()}
    if not extra:
        return ch
    restat = {i: v for i, v in ch.restat.items() if i not in extra}
    return replace(ch, replaced=ch.replaced | extra, restat=restat)


def new_label_paths(scan: SourceScan, added: Sequence[int], root: Path) -> None:
    """Refuse files an update would append from label folders or label images (``masks/``, ``*_mask.*``)."""
    found = sorted({p for k in added if (p := label_path(scan.items[k].rel)) is not None})
    if found:
        raise label_paths_error(os.fspath(root), found, update=True)


def check_folder_rules(m: Manifest, scan: SourceScan, out: Path, root: Path) -> None:
    """Refuse a source whose labels or split rule now mean something else than when ``out`` was built.

    Kept samples keep their stored class and split, so a rule that changed would silently mix two
    meanings of the same folder names.
    """
    where = os.fspath(root)
    if m.labels != scan.labels:
        raise SourceError(
            f"{out} is labelled {m.labels!r} (class folders) but {where!r} now gives {scan.labels!r} labels "
            "(the labels rule: every image in a class folder, or none); an update keeps every sample's class: "
            "restore the folder layout, or rebuild with --overwrite"
        )
    splits = split_names(scan.items)
    if bool(m.splits) == bool(splits):
        return
    if m.splits:
        tops = sorted({it.rel.split("/")[0] + ("/" if "/" in it.rel else "") for it in scan.items})
        tops = [t for t in tops if t.rstrip("/").lower() not in SPLIT_NAMES] or tops
        shown = ", ".join(shown_name(t) for t in tops[:5]) + (" ..." if len(tops) > 5 else "")
        raise SourceError(
            f"{out} was built with split folders ({', '.join(m.splits)}), but {where!r} now also has {shown} "
            "outside them, so the split rule (every image under a train, val, validation or test folder) no "
            "longer holds and every class and split would change; move those images into a split folder or out "
            "of SRC, or rebuild with --overwrite"
        )
    raise SourceError(
        f"{out} was built without split folders, but every image in {where!r} now sits under one "
        f"({', '.join(splits)}), so the split rule would turn those folders from classes into splits; "
        "rebuild with --overwrite"
    )


@dataclass(frozen=True)
class Changes:
    """How the source differs from the store: old indices kept (in order), replaced and removed,
    new scan positions added, the new (size, mtime_ns) of kept files whose content did not change,
    and the scan position of each kept old index (its path, or the same path in another Unicode
    normalisation)."""

    kept: tuple[int, ...]
    replaced: frozenset[int]
    removed: tuple[int, ...]
    added: tuple[int, ...]
    restat: dict[int, tuple[int, int]]
    match: dict[int, int]
    #: Whether any kept sample is now listed under another spelling of its path.
    renamed: bool = False


def _nfc(text: str) -> str:
    return unicodedata.normalize("NFC", text)


def _match_paths(rels0: Sequence[str], scan: SourceScan) -> dict[int, int]:
    """Old index -> scan position of the same file: by path, then by the Unicode-normalised (NFC)
    path where exactly one old and one scanned path share it (a copy that normalised names)."""
    now = {it.rel: k for k, it in enumerate(scan.items)}
    match = {i: now[rel] for i, rel in enumerate(rels0) if rel in now}
    taken = set(match.values())
    old_left: dict[str, list[int]] = {}
    for i, rel in enumerate(rels0):
        if i not in match:
            old_left.setdefault(_nfc(rel), []).append(i)
    new_left: dict[str, list[int]] = {}
    for k, it in enumerate(scan.items):
        if k not in taken:
            new_left.setdefault(_nfc(it.rel), []).append(k)
    for key, olds in old_left.items():
        news = new_left.get(key, [])
        if len(olds) == 1 and len(news) == 1:
            match[olds[0]] = news[0]
    return match


def class_aliases(old: Sequence[str], new: Sequence[str]) -> dict[str, str]:
    """Class names of the scan that are a stored class in another Unicode normalisation -> that class."""
    by_nfc: dict[str, list[str]] = {}
    for c in old:
        by_nfc.setdefault(_nfc(c), []).append(c)
    return {c: by_nfc[_nfc(c)][0] for c in new if c not in old and len(by_nfc.get(_nfc(c), ())) == 1}


def source_changes(
    files: SourceFiles,
    scan: SourceScan,
    probes: Sequence[Probe],
    rels0: Sequence[str],
    stat0: np.ndarray,
    sha0: np.ndarray,
) -> Changes:
    """Compare the source with the store: size and mtime first, then the content hash."""
    match = _match_paths(rels0, scan)
    kept = tuple(i for i in range(len(rels0)) if i in match)
    replaced: set[int] = set()
    restat: dict[int, tuple[int, int]] = {}
    for i in kept:
        k = match[i]
        rel = scan.items[k].rel
        st = files.stat(rel)
        if st == tuple(int(v) for v in stat0[i]):
            continue
        if probes[k].error is None and hashlib.sha256(files.read(rel)[0]).hexdigest() == bytes(sha0[i]).hex():
            restat[i] = (st.size, st.version)  # touched or copied, same bytes: nothing to decode
        else:
            replaced.add(i)
    removed = tuple(i for i in range(len(rels0)) if i not in match)
    matched = set(match.values())
    added = tuple(k for k in range(len(scan.items)) if k not in matched)
    renamed = any(scan.items[k].rel != rels0[i] for i, k in match.items())
    return Changes(kept, frozenset(replaced), removed, added, restat, match, renamed)


def gone_error(ch: Changes, rels0: Sequence[str], scan: SourceScan, root: Path) -> OptionError:
    """Why samples of the store have no file in the source: gone, or still there but refused by the scan."""
    refused = {e.path: e.reason for e in scan.errors}
    there = [i for i in ch.removed if rels0[i] in refused]
    if there:
        shown = "; ".join(f"{shown_name(rels0[i])}: {refused[rels0[i]]}" for i in there[:5])
        more = f" and {len(there) - 5} more" if len(there) > 5 else ""
        return OptionError(
            f"{len(there)} packed file(s) are still in {os.fspath(root)!r} but the scan no longer packs them "
            f"({shown}{more}); fix that, or pass --compact to drop their samples (the samples after them are "
            "renumbered)"
        )
    gone = ", ".join(shown_name(rels0[i]) for i in ch.removed[:5]) + (" ..." if len(ch.removed) > 5 else "")
    return OptionError(
        f"{len(ch.removed)} packed file(s) are gone from {os.fspath(root)!r} ({gone}); pass --compact to "
        "drop them (the samples after them are renumbered), or put them back"
    )


#: Arrays an update builds itself (``split`` too when the store has splits); every other array of a
#: store was added with ``add_array`` and is carried over, filled or dropped as the options say.
_UPDATE_BUILT = frozenset(
    {"images", "labels", "original_size", "transform", "checksum", "source_stat", "source_sha256", "source"}
)


#: The label arrays an update of a labelled store builds (the plan records ``labels``).
_LABEL_BUILT = frozenset({"boxes", "box_labels", "box_crowd", "mask", "defect", "orientation", "label_sha256"})


def user_arrays(
    m: Manifest, fills: Mapping[str, float | None], drop_array: Sequence[str], out: Path
) -> list[ArraySpec]:
    """The arrays the update carries over (every array it does not build, but those ``drop_array`` names),
    with every ``fill`` and ``drop_array`` name checked."""
    built = (
        _UPDATE_BUILT | ({"split"} if m.splits else set()) | (_LABEL_BUILT if (m.plan or {}).get("labels") else set())
    )
    user = {
        name: spec for name, spec in sorted(m.arrays.items()) if name not in built and schema.variant_of(name) is None
    }
    for name in (*fills, *drop_array):
        if schema.variant_of(name) is not None and name in m.arrays:
            raise OptionError(
                f"array {name!r} of {out} belongs to its augmentation variants, which an update keeps or drops "
                'whole (docs/format.md, "Updates"): it cannot be filled or dropped alone'
            )
        if name in built:
            raise OptionError(
                f"array {name!r} of {out} is built by dlpack; an update rebuilds it (it cannot be filled or dropped)"
            )
        if name not in user:
            have = ", ".join(user) or "none"
            raise OptionError(f"{out} has no array {name!r} added with add_array (it has: {have})")
    for name, value in fills.items():
        spec = user[name]
        if spec.ragged:
            if value is not None:
                raise OptionError(f"array {name!r} is ragged: its fill is no rows; pass fill {name}= (no value)")
            continue
        if value is None:
            raise OptionError(f"array {name!r} holds one value per sample: give its fill as {name}=NUMBER")
        cast = np.array(value).astype(spec.dtype)
        if float(cast.real if cast.dtype.kind == "c" else cast) != value:
            raise OptionError(f"fill value {value:g} does not fit array {name!r} of dtype {np.dtype(spec.dtype)}")
    return [spec for name, spec in user.items() if name not in drop_array]


def variant_arrays(m: Manifest) -> list[ArraySpec]:
    """The arrays of a store's augmentation variants (``images_v1`` ...), which an update carries only
    while every sample keeps its index and pixels."""
    return [spec for name, spec in sorted(m.arrays.items()) if schema.variant_of(name) is not None]


def dropped_variants_note(m: Manifest, out: Path) -> str:
    """What an update that changed samples says about the variants it dropped, with the command
    that computes them again."""
    rec = m.augment or {}
    config = rec.get("config") if isinstance(rec.get("config"), dict) else {}
    name = (config or {}).get("name") or "FILE"
    command = f"dlpack augment {out} --augment {m.variants} --augment-config {name}"
    if rec.get("seed"):
        command += f" --augment-seed {rec['seed']}"
    if rec.get("engine", "dlpack") != "dlpack":
        command += f" --augment-engine {rec['engine']}"
    return (
        f"dropped its {m.variants} augmentation variants per image (made from samples this update changed); "
        f"run {command} to compute them again"
    )


def unfilled_error(missing: Sequence[ArraySpec], appended: int, replaced: int, out: Path) -> OptionError:
    """The refusal of an update that has no value for user arrays ``missing`` on new or replaced samples."""
    names = ", ".join(s.name for s in missing)
    what = " and ".join(
        p for p in (f"{appended} appended" if appended else "", f"{replaced} replaced" if replaced else "") if p
    )
    example = ",".join(f"{s.name}=" if s.ragged else f"{s.name}=0" for s in missing)
    return OptionError(
        f"{out} has array(s) {names} (added with add_array), which this update cannot give a value for its "
        f"{what} sample(s); pass --fill {example} (fill=...) to give them that value (a ragged array: no rows), "
        f"or --drop-array {','.join(s.name for s in missing)} to drop them, then add_array the right values"
    )


def carry_arrays(
    writer: StoreWriter,
    reader: Any,
    out: Path,
    specs: Sequence[ArraySpec],
    olds: Sequence[int | None],
    fills: Mapping[str, float | None],
) -> None:
    """Write every carried array into the new generation: row ``j`` is old sample ``olds[j]``'s, or
    the array's fill where it is None. A Zarr block of unchanged rows at unchanged indices shares
    the current store's shard file, as the images do."""
    count, n0 = len(olds), len(reader)
    for spec0 in specs:
        spec = replace(spec0, sha256={})
        name = spec.name
        rows0 = None if spec.ragged else reader.shard_len(name)
        saved = writer.shard_bytes
        if rows0:
            writer.shard_bytes = max(1, rows0 * spec.item_nbytes)  # the stored layout, whatever add_array chose
        try:
            writer.create_array(spec, count)
        finally:
            writer.shard_bytes = saved
        if spec.ragged:
            empty = np.empty((0, *spec.shape), dtype=spec.dtype)
            writer.write_block(name, 0, [reader.read(name, i) if i is not None else empty for i in olds])
            continue
        step = writer.shard_rows(name)
        for s in range(0, count, step):
            e = min(s + step, count)
            same = min(s + step, n0) == e and all(olds[j] == j for j in range(s, e))
            if same and writer.share_block(name, s, out):
                continue
            block = np.empty((e - s, *spec.shape), dtype=spec.dtype)
            js = [j for j in range(s, e) if olds[j] is not None]
            if js:
                got = np.empty((len(js), *spec.shape), dtype=spec.dtype)
                reader.read_into(name, [olds[j] for j in js], got)
                block[[j - s for j in js]] = got
            if len(js) < e - s:
                block[[j - s for j in range(s, e) if olds[j] is None]] = fills[name]
            writer.write_block(name, s, block)


def update_reason(reason: str, plan: BuildPlan) -> str:
    """A scan's or decode's reason for refusing a file, with advice that works under ``--update``
    (which keeps the store's geometry and symlink rule)."""
    t, image = plan.target, plan.image
    if reason.endswith(FOLLOW_ADVICE):
        return (
            f"{reason[: -len(FOLLOW_ADVICE)]}; the store was built without --follow-symlinks, which an update "
            "keeps: put the file itself there, or rebuild with --overwrite --follow-symlinks"
        )
    if "would upscale it" in reason:
        head = reason.split(" (pass --allow-upscale")[0]
        return f"{head}; pass --allow-upscale with --update to enlarge it (the store's --resize {t.mode} is kept)"
    if "(its header said otherwise)" in reason:
        head = reason.split(" (its header said otherwise)")[0]
        return (
            f"{head}; an update keeps the store's {image.width}x{image.height} images: resize the file, or rebuild "
            f"with --overwrite (e.g. --size {image.width}x{image.height} --resize fit)"
        )
    return reason


def replaced_error(bad: Sequence[InputFileError], others: int, root: Path, skip: bool) -> BadInputsError:
    """The error for replaced files that no longer decode: they keep their index, so no --on-error skips them."""
    how = "are skipped (--on-error skip)" if skip else "can be skipped with --on-error skip"
    rest = f"; the {others} other bad file(s) {how}" if others else ""
    return BadInputsError(
        sorted(bad, key=lambda e: e.path),
        os.fspath(root),
        hint=(
            "a replaced file keeps its sample index, so it cannot be skipped: fix it, or delete it and pass "
            f"--compact to drop its sample (the samples after it are renumbered){rest}"
        ),
    )


def codes_outside(codes: np.ndarray, names: Sequence[str]) -> bool:
    """Whether a stored label or split array holds a code that names none of ``names`` (-1 is "none")."""
    return bool(len(codes)) and (int(codes.min()) < -1 or int(codes.max()) >= len(names))


def split_counts(splits: Sequence[str], codes: np.ndarray | None) -> dict[str, int]:
    """Samples per split name, as a BuildResult reports them: splits without samples left out."""
    if codes is None or not len(splits):
        return {}
    counts = np.bincount(codes[codes >= 0].astype(np.int64), minlength=len(splits))
    return {name: int(n) for name, n in zip(splits, counts, strict=False) if n}
