"""``build --update``: a new generation of a store, writing only the blocks that change."""

from __future__ import annotations

import datetime
import os
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from .._names import shown as shown_name
from .._parallel import LocalPool
from ..backends import ArraySpec, Backend, StoreWriter, owned_store, remove_store
from ..errors import DlpackError, InputFileError, OptionError, SourceError, StoreError, StoreNotFoundError
from ..manifest import Manifest
from ..options import BuildOptions, parse_labels
from ..sources.base import Source, SourceFiles, SourceItem, SourceScan, files_of
from ..sources.folder import FolderSource
from ..storage.lock import journal_path, partial_path
from ..storage.publish import publish, unmarked
from ..storage.runner import Call, Pool, run_blocks
from .arrays import manifest_stage
from .changes import (
    Changes,
    carry_arrays,
    check_folder_rules,
    check_update_options,
    class_aliases,
    codes_outside,
    dropped_variants_note,
    gone_error,
    label_changes,
    new_label_paths,
    replaced_error,
    source_changes,
    source_with_rules,
    split_counts,
    unfilled_error,
    update_reason,
    user_arrays,
    variant_arrays,
)
from .inputs import Probe, Selection, bad_inputs, probe_stage, scan_stage, split_names, split_per_file
from .plan import BuildPlan, image_array, label_plan, order_digest, source_digest
from .result import BuildResult, label_summary
from .workers import Sample, decode_block, fixed_block, jobs_of, label_digest, mask_block, validate_stage
from .write import Partial, commit_store, discard_partial, mask_array


def _open_updatable(out: Path, backend: type[Backend]) -> Any:
    """A reader of the store at ``out``, refused unless it is a dlpack ``backend`` store that
    ``--update`` can continue (fixed-size images, a recorded plan, the source digests)."""
    if not (out.exists() or out.is_symlink()):
        raise StoreNotFoundError(f"{out} does not exist; build it first (without --update)")
    own = owned_store(out)
    if own is not None and own is not backend:
        raise OptionError(
            f"{out} is a dlpack {own.name} store; --update keeps its format: drop --format {backend.name}"
        )
    if own is not backend:
        raise StoreError(
            f"{out} is not a dlpack {backend.name} store ({unmarked(out)}); --update only updates dlpack's own stores"
        )
    reader = backend.open_reader(out)
    reader.check_labels = False  # a store whose labels are damaged is repaired by the update
    try:
        m = reader.manifest
        missing = [n for n in ("source_stat", "source_sha256") if n not in m.arrays]
        why = (
            "it holds variable-size images" if m.image.layout != "fixed"
            else "it records no build plan" if not m.plan
            else f"it has no {' or '.join(missing)} (written before updates existed)" if missing
            else None
        )  # fmt: skip
        if why is not None:
            raise StoreError(f"{out} cannot be updated: {why}; rebuild it with --overwrite")
    except BaseException:
        reader.close()
        raise
    return reader


@dataclass(frozen=True)
class UpdateOptions:
    """What the update stages take of the build's options (the :class:`BuildOptions` fields of the same names)."""

    compact: bool
    on_error: str
    fill_values: Mapping[str, float | None]
    drop_array: tuple[str, ...]
    max_pixels: int
    n_jobs: int
    quiet: bool

    @classmethod
    def of(cls, opts: BuildOptions) -> UpdateOptions:
        """The update's fields of ``opts``."""
        return cls(
            opts.compact, opts.on_error, opts.fill_values, opts.drop_array, opts.max_pixels, opts.n_jobs, opts.quiet
        )


@dataclass(frozen=True)
class Placement:
    """Where each sample of the new generation comes from: ``origin`` an old index (``"old"``) or a
    scan position to decode (``"new"``); ``olds`` the old index it had (None for appended samples);
    ``rows`` the old row of the arrays carried with it (None for replaced and appended samples);
    ``items`` its source item; ``added`` the scan positions appended."""

    added: list[int]
    origin: list[tuple[str, int]]
    olds: list[int | None]
    rows: list[int | None]
    items: list[SourceItem]


@dataclass(frozen=True)
class UpdatePlan:
    """The new generation of an updated store: its plan, its samples (``at``, their items relabelled
    by ``alias``), its classes and splits with their per-sample codes, and the variants carried."""

    plan: BuildPlan
    at: Placement
    items: list[SourceItem]
    classes: tuple[str, ...]
    class_ids: tuple[int, ...]
    class_id: dict[str, int]
    alias: dict[str, str]
    splits: tuple[str, ...]
    labels: np.ndarray
    split_codes: np.ndarray | None
    variants: list[ArraySpec]
    keep_variants: bool


def update_stage(source: Source, out: Path, backend: type[Backend], opts: BuildOptions, t0: float) -> BuildResult:
    """Update the store at ``out`` from ``source`` (``build --update``); call while holding the build lock.

    The rule (docs/format.md, "Updates"): every sample keeps its index, class and split; files new
    in the source are appended after the last sample, in source order, and new classes get the next
    ids; a file whose size or mtime changed is decoded again in place when its SHA-256 changed too.
    Files gone from the source are refused unless ``compact``, which drops them and renumbers the
    samples after them. Every array added with ``add_array`` is carried over (appended and replaced
    samples get its ``fill``, or the update refuses), and files in a Zarr store folder that are not
    dlpack's are carried over unchanged. Only blocks that change are written: Zarr shares every
    other shard file with the current store (hard links); HDF5 cannot share, so its file is
    rewritten, unchanged rows copied without decoding. The new generation is published as a
    build's is; an update that changes nothing publishes nothing.

    The stages: open the store -> scan -> probe -> changes -> validate -> place -> plan -> write ->
    manifest -> commit -> publish. ``opts`` is whole here only for :func:`check_update_options`,
    which holds every option to what the store was built with.
    """
    uo = UpdateOptions.of(opts)
    reader = _open_updatable(out, backend)
    try:
        m = reader.manifest
        plan0 = check_update_options(BuildPlan.from_dict(m.plan), opts, out)
        source = source_with_rules(source, plan0)
        root = Path(source.root)  # an update reads a local folder (a bucket source is refused)
        scan, plan0 = _scan_update(source, m, plan0, out)
        user = user_arrays(m, uo.fill_values, uo.drop_array, out)
        files = files_of(source)
        probes = probe_stage(files, scan.items, max_pixels=uo.max_pixels, n_jobs=uo.n_jobs, quiet=uo.quiet)
        ch = _change_stage(reader, m, plan0, source, scan, probes, out, compact=uo.compact)
        added, errors = _validate_update(
            root, files, plan0, scan, probes, ch, on_error=uo.on_error, n_jobs=uo.n_jobs, quiet=uo.quiet
        )
        at = _place_samples(scan, ch, added, out)
        unfilled = [s for s in user if s.name not in uo.fill_values]
        if unfilled and (added or ch.replaced):
            raise unfilled_error(unfilled, len(added), len(ch.replaced), out)
        split0 = reader.meta("split") if m.splits else None
        labels0 = reader.meta("labels")
        if _up_to_date(m, ch, at, errors, labels0, split0, uo.drop_array):
            return _up_to_date_result(reader, out, m, scan, split0, t0)
        up = _plan_update(backend, m, plan0, scan, probes, ch, at, labels0, split0, out)
        partial = _new_partial(backend, out, up.plan)
        try:
            pool = LocalPool(uo.n_jobs)
            decoded, shared, written = _write_update(
                partial.writer, reader, out, plan0, up, scan, probes, files, user, uo.fill_values, pool, uo.quiet
            )
            arrays, manifest = _update_manifest(reader, m, up, ch, scan, decoded, errors)
        except BaseException as exc:
            discard_partial(partial, out, exc)
            raise
        carried = _commit_update(backend, partial, out, arrays, manifest, m)
    finally:
        reader.close()
    publish(partial_path(out), out, True)
    return _update_result(
        backend, out, m, ch, up, scan, probes, manifest, decoded, (shared, written), carried, uo.drop_array, t0
    )


def _scan_update(source: Source, m: Manifest, plan0: BuildPlan, out: Path) -> tuple[SourceScan, BuildPlan]:
    """The scan of an update's source, each appended file split as the store's plan says, and the
    store's label plan made ready for it (:func:`update_label_plan`)."""
    root = Path(source.root)
    try:
        scan = scan_stage(source)
    except SourceError as exc:
        if m.labels == "folders" and "--labels none" in str(exc):
            raise SourceError(
                f"{exc}. Under --update the store's labels are kept ({out} is labelled by class folders), "
                "so --labels none would be refused: move them into class folders"
            ) from exc
        raise
    if plan0.split:
        # Kept samples keep their split; an appended one gets its split by its own draw under the seed.
        scan = split_per_file(scan, plan0.split, plan0.split_seed, os.fspath(root))
    check_folder_rules(m, scan, out, root)
    return scan, update_label_plan(plan0, scan, os.fspath(root), out)


def _change_stage(
    reader: Any,
    m: Manifest,
    plan0: BuildPlan,
    source: Source,
    scan: SourceScan,
    probes: Sequence[Probe],
    out: Path,
    *,
    compact: bool,
) -> Changes:
    """How the source differs from the store (files and, where recorded, their labels); files gone
    from the source are refused unless ``compact``."""
    root, files = Path(source.root), files_of(source)
    rels0 = [reader.source(i) for i in range(m.count)]
    ch = source_changes(files, scan, probes, rels0, reader.meta("source_stat"), reader.meta("source_sha256"))
    lp0 = plan0.labels
    if lp0 is not None and "label_sha256" in m.arrays:
        ch = label_changes(
            ch,
            scan,
            reader.meta("label_sha256"),
            lambda it: label_digest(files, lp0.label_root, it.annotations),
        )
    if isinstance(source, FolderSource):
        new_label_paths(scan, ch.added, root)
    if ch.removed and not compact:
        raise gone_error(ch, rels0, scan, root)
    return ch


def _validate_update(
    root: Path,
    files: SourceFiles,
    plan0: BuildPlan,
    scan: SourceScan,
    probes: Sequence[Probe],
    ch: Changes,
    *,
    on_error: str,
    n_jobs: int,
    quiet: bool,
) -> tuple[list[int], list[InputFileError]]:
    """Decode the inputs to decode (replaced files in place, then added ones) without writing: the
    added files that are good, and every input error. Bad ones follow ``on_error``, except replaced
    files, which cannot be dropped without renumbering."""
    todo = [ch.match[i] for i in sorted(ch.replaced)] + list(ch.added)
    bad = {k: InputFileError(scan.items[k].rel, probes[k].error or "") for k in todo if probes[k].error}
    pairs = jobs_of(scan.items, probes, [k for k in todo if k not in bad])
    found = validate_stage(files, plan0, pairs, n_jobs=n_jobs, quiet=quiet)
    now = {it.rel: k for k, it in enumerate(scan.items)}
    bad.update({now[e.path]: e for e in found})
    bad = {k: InputFileError(e.path, update_reason(e.reason, plan0)) for k, e in bad.items()}
    replaced_bad = [bad[ch.match[i]] for i in sorted(ch.replaced) if ch.match[i] in bad]
    errors = [*scan.errors, *bad.values()]
    if replaced_bad:
        raise replaced_error(replaced_bad, len(errors) - len(replaced_bad), root, on_error == "skip")
    if errors and on_error == "fail":
        # The scan's reasons as the store records them, the advice in them one an update can follow.
        advised = [InputFileError(e.path, update_reason(e.reason, plan0)) for e in scan.errors]
        raise bad_inputs([*advised, *bad.values()], root)
    return [k for k in ch.added if k not in bad], errors


def _place_samples(scan: SourceScan, ch: Changes, added: list[int], out: Path) -> Placement:
    """Where each sample of the new generation comes from: kept samples in their order, replaced
    ones decoded in place, then the ``added`` scan positions; refused when none is left."""
    origin: list[tuple[str, int]] = [("new", ch.match[i]) if i in ch.replaced else ("old", i) for i in ch.kept]
    origin += [("new", k) for k in added]
    olds: list[int | None] = [*ch.kept, *([None] * len(added))]
    # A carried array's row stays with its sample only while its image does: a replaced image gets the fill.
    rows: list[int | None] = [None if i in ch.replaced else i for i in ch.kept] + [None] * len(added)
    items = [scan.items[ch.match[v]] if src == "old" else scan.items[v] for src, v in origin]
    if not items:
        raise SourceError(f"the update would leave {out} without samples")
    return Placement(added, origin, olds, rows, items)


def _up_to_date(
    m: Manifest,
    ch: Changes,
    at: Placement,
    errors: Sequence[InputFileError],
    labels0: np.ndarray,
    split0: np.ndarray | None,
    drop_array: tuple[str, ...],
) -> bool:
    """Whether the update changes nothing: no sample, skipped input or array changes, and the
    stored labels and splits are sound (a damaged store is repaired by an update)."""
    skipped = tuple(sorted(errors, key=lambda e: e.path))
    damaged = codes_outside(labels0, m.classes) or (split0 is not None and codes_outside(split0, m.splits))
    changed = at.added or ch.replaced or ch.removed or ch.restat or ch.renamed or drop_array or damaged
    return not changed and skipped == m.skipped


def _up_to_date_result(
    reader: Any, out: Path, m: Manifest, scan: SourceScan, split0: np.ndarray | None, t0: float
) -> BuildResult:
    """The result of an update that changes nothing (and publishes nothing)."""
    return BuildResult(
        path=out,
        count=m.count,
        skipped=m.skipped,
        seconds=time.perf_counter() - t0,
        input_bytes=0,
        output_bytes=reader.nbytes_on_disk(),
        conversions=dict(m.conversions),
        plan=BuildPlan.from_dict(m.plan),
        update="up to date: nothing to do",
        classes=m.classes,
        splits=split_counts(m.splits, split0),
        excluded=scan.excluded,
        ignored=scan.ignored,
    )


def _kept_code(codes: np.ndarray | None, i: int | None, names: Sequence[str]) -> int | None:
    """The stored code of old sample ``i`` when it names one of ``names`` (or -1, none), else None."""
    code = None if codes is None or i is None else int(codes[i])
    return code if code is not None and -1 <= code < len(names) else None


def _plan_update(
    backend: type[Backend],
    m: Manifest,
    plan0: BuildPlan,
    scan: SourceScan,
    probes: Sequence[Probe],
    ch: Changes,
    at: Placement,
    labels0: np.ndarray,
    split0: np.ndarray | None,
    out: Path,
) -> UpdatePlan:
    """The new generation's plan, classes, splits and per-sample codes.

    Kept and replaced samples keep their stored class and split; appended ones get the scan's, and
    so does a stored code outside the store's classes or splits (a damaged store is repaired).
    Variants are made from the samples' indices and pixels: kept only while no sample changes.
    """
    variants = variant_arrays(m)
    keep_variants = bool(variants) and not (at.added or ch.replaced or ch.removed)
    images = image_array(plan0.image, plan0.compression)
    count = len(at.items)
    plan = replace(
        plan0,
        count=count,
        shard_rows=backend.shard_rows(images, count, plan0.shard_bytes),
        order=order_digest(at.items),
        source=source_digest(scan, probes),
    )
    alias = class_aliases(m.classes, scan.classes)
    items = at.items
    if alias:
        items = [replace(it, label=alias[it.label]) if it.label in alias else it for it in items]
    new_classes = [c for c in scan.classes if c not in m.classes and c not in alias]
    classes = (*m.classes, *new_classes)
    class_ids = merged_class_ids(m, scan, new_classes, out)
    splits = (*m.splits, *(s for s in split_names(scan.items) if s not in m.splits))
    class_id = {c: i for i, c in enumerate(classes)}
    split_id = {s: i for i, s in enumerate(splits)}
    labels = np.array(
        [
            code if (code := _kept_code(labels0, i, m.classes)) is not None
            else class_id[it.label] if it.label is not None else -1
            for i, it in zip(at.olds, items, strict=True)
        ],
        dtype="<i4",
    )  # fmt: skip
    split_codes = (
        np.array(
            [
                code
                if (code := _kept_code(split0, i, m.splits)) is not None
                else split_id[it.split]
                if it.split
                else -1
                for i, it in zip(at.olds, items, strict=True)
            ],
            dtype="|i1",
        )  # fmt: skip
        if splits
        else None
    )
    return UpdatePlan(
        plan, at, items, classes, class_ids, class_id, alias, splits, labels, split_codes, variants, keep_variants
    )


def _new_partial(backend: type[Backend], out: Path, plan: BuildPlan) -> Partial:
    """The partial store an update writes, any earlier one (and its journal) removed first; not yet
    opened, so that a failure opening it is discarded as any other (an update is not resumable)."""
    tmp = partial_path(out)
    remove_store(journal_path(out))
    remove_store(tmp)
    return Partial(backend.open_writer(tmp, "w-", plan.shard_bytes), None, {}, "")


def _write_update(
    writer: StoreWriter,
    reader: Any,
    out: Path,
    plan0: BuildPlan,
    up: UpdatePlan,
    scan: SourceScan,
    probes: Sequence[Probe],
    files: SourceFiles,
    user: Sequence[ArraySpec],
    fills: Mapping[str, float | None],
    pool: Pool,
    quiet: bool,
) -> tuple[dict[int, Sample], int, int]:
    """Write the new generation's images (and masks) through :func:`_update_blocks`, then the carried
    arrays (``add_array``'s, with ``fills`` for appended and replaced samples; the variants while kept)."""
    plan = up.plan
    writer.open()
    images = image_array(plan0.image, plan0.compression)
    writer.create_array(images, plan.count)
    masks = mask_array(plan)
    if masks is not None:
        writer.create_array(masks, plan.count, rows=writer.shard_rows(images.name))
    decoded, shared, written = _update_blocks(
        writer, reader, out, plan0, plan, up.at.origin, scan, probes, files, pool, quiet
    )
    carry_arrays(writer, reader, out, user, up.at.rows, fills)
    if up.keep_variants:
        carry_arrays(writer, reader, out, up.variants, up.at.rows, {})
    return decoded, shared, written


def _update_manifest(
    reader: Any,
    m: Manifest,
    up: UpdatePlan,
    ch: Changes,
    scan: SourceScan,
    decoded: Mapping[int, Sample],
    errors: Sequence[InputFileError],
) -> tuple[dict[str, tuple[ArraySpec, Any]], Manifest]:
    """The per-sample arrays and the manifest of the new generation: kept samples' records as the
    store holds them, decoded ones' as decoded; the history gains this update."""
    plan = up.plan
    osz, tr, crc = reader.meta("original_size"), reader.meta("transform"), reader.meta("checksum")
    stat0, sha0 = reader.meta("source_stat"), reader.meta("source_sha256")
    stored = StoredLabels(reader, plan)
    samples = [
        stored.of(
            Sample(
                (int(osz[v][0]), int(osz[v][1])),
                (plan.image.height or 0, plan.image.width or 0, plan.image.channels),
                (float(tr[v][0]), float(tr[v][1]), float(tr[v][2]), float(tr[v][3])),
                int(crc[v]),
                (),
                None,
                ch.restat.get(v, (int(stat0[v][0]), int(stat0[v][1]))),
                bytes(sha0[v]).hex(),
            ),
            v,
        )
        if src == "old"
        else remap_box_labels(decoded[v], scan.classes, up.class_id, up.alias)
        for src, v in up.at.origin
    ]
    view = SourceScan(
        tuple(up.items), up.classes, (), scan.labels, class_ids=up.class_ids, task=scan.task, notes=scan.notes
    )
    arrays, manifest = manifest_stage(plan, view, Selection(tuple(range(plan.count)), tuple(errors)), samples)
    arrays["labels"] = (arrays["labels"][0], up.labels)
    arrays.pop("split", None)
    if up.split_codes is not None:
        arrays["split"] = (ArraySpec("split", "|i1", (), key="split"), up.split_codes)
    conversions = Counter(m.conversions)
    conversions.update(c for s in decoded.values() for c in s.conversions)
    entry = {
        "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "added": len(up.at.added),
        "replaced": len(ch.replaced),
        "removed": len(ch.removed),
    }
    manifest = replace(
        manifest,
        splits=up.splits,
        conversions=dict(sorted(conversions.items())),
        history=(*m.history, entry),
        augment=m.augment if up.keep_variants else None,
    )
    return arrays, manifest


def _commit_update(
    backend: type[Backend],
    partial: Partial,
    out: Path,
    arrays: dict[str, tuple[ArraySpec, Any]],
    manifest: Manifest,
    m: Manifest,
) -> list[str]:
    """Commit the new generation and carry over the entries of the store that are not dlpack's;
    returns those entries. A failure removes the partial store."""
    commit_store(partial, out, arrays, manifest)
    tmp = partial_path(out)
    try:
        return backend.carry_foreign(out, tmp, m)
    except BaseException:
        remove_store(tmp)
        raise


def _update_result(
    backend: type[Backend],
    out: Path,
    m: Manifest,
    ch: Changes,
    up: UpdatePlan,
    scan: SourceScan,
    probes: Sequence[Probe],
    manifest: Manifest,
    decoded: Mapping[int, Sample],
    blocks: tuple[int, int],
    carried: Sequence[str],
    drop_array: tuple[str, ...],
    t0: float,
) -> BuildResult:
    """The result of a published update, with its note: what changed, the blocks written, the
    arrays dropped, the variants kept or dropped, and the entries carried that are not dlpack's."""
    shared, written = blocks
    n_blocks = shared + written
    note = (
        f"updated: {len(up.at.added)} added, {len(ch.replaced)} replaced, {len(ch.removed)} removed; "
        f"{written} of {n_blocks} blocks written"
    )
    if drop_array:
        note += f"; dropped array(s) {', '.join(drop_array)}"
    if m.augment is not None or up.variants:
        note += (
            f"; kept its {m.variants} augmentation variants per image"
            if up.keep_variants
            else "; " + dropped_variants_note(m, out)
        )
    if carried:
        what = "1 entry that is" if len(carried) == 1 else f"{len(carried)} entries that are"
        note += f"; kept {what} not dlpack's ({', '.join(shown_name(c) for c in carried[:5])})"
    plan = up.plan
    return BuildResult(
        path=out,
        count=plan.count,
        skipped=manifest.skipped,
        seconds=time.perf_counter() - t0,
        input_bytes=sum(probes[k].nbytes for k in decoded),
        output_bytes=backend.open_reader(out).nbytes_on_disk(),
        conversions=dict(manifest.conversions),
        plan=plan,
        update=note,
        classes=manifest.classes,
        splits=split_counts(up.splits, up.split_codes),
        excluded=scan.excluded,
        ignored=scan.ignored,
        **label_summary(plan, scan, list(decoded.values())),
    )


def recorded_label_options(out: Path, opts: BuildOptions) -> BuildOptions:
    """``opts`` with the label source the store at ``out`` was built with (``--labels``,
    ``--class-folder``, ``--anomaly-masks`` as its plan records them), where left at their defaults:
    an update of a folder path reads the same source. One given with another value is refused."""
    own = owned_store(out)
    if own is None:
        return opts
    try:
        with own.open_reader(out) as reader:
            plan = reader.manifest.plan or {}
    except StoreError:
        return opts  # the update itself says what is wrong with the store
    recorded = {
        "labels": plan.get("label_source") or None,
        "class_folder": plan.get("class_folder") or "top",
        "anomaly_masks": plan.get("anomaly_masks") or None,
    }
    defaults = BuildOptions()
    changes: dict[str, Any] = {}
    for name, value in recorded.items():
        given = getattr(opts, name)
        if given == getattr(defaults, name):
            if value is not None and value != given:
                changes[name] = value
            continue
        if name == "labels" and value is not None:
            kind, path = parse_labels(given)
            given = kind + (":" + os.path.abspath(path) if path is not None else "")
        elif name == "anomaly_masks" and isinstance(given, str):
            given = os.path.abspath(given)
        if given != (value if value is not None else getattr(defaults, name)):
            raise OptionError(
                f"--update keeps the labels {out} was built with ({name}: the store's {value or 'default'}, "
                f"given {getattr(opts, name)}); drop {name}, or rebuild with --overwrite"
            )
    if "labels" in changes and plan.get("instance_masks"):
        changes["instance_masks"] = True
    return replace(opts, **changes) if changes else opts


def update_label_plan(plan0: BuildPlan, scan: SourceScan, root: str, out: Path) -> BuildPlan:
    """The store's label plan with the scan's class ids and label folder (for decoding), and any new
    defect folder names appended; a source whose labels need other arrays than the store's is refused."""
    lp0 = plan0.labels
    lp = label_plan(scan, scan.items, root)
    if lp0 is None and lp is None:
        return plan0
    if lp0 is None or lp is None:
        raise SourceError(
            f"{out} was built {'without' if lp0 is None else 'with'} label arrays, but the source now "
            f"{'gives' if lp0 is None else 'gives no'} {scan.task} labels; rebuild with --overwrite"
        )
    if (lp.task, lp.boxes, lp.instance_masks) != (lp0.task, lp0.boxes, lp0.instance_masks) or (
        lp.mask_dtype is None
    ) != (lp0.mask_dtype is None):
        raise SourceError(
            f"{out} holds {lp0.task} labels {lp0.to_dict()}, but the source now gives {lp.to_dict()}; "
            "rebuild with --overwrite"
        )
    if lp.crowd and not lp0.crowd:
        raise SourceError(f"the source now gives iscrowd, which {out} was built without; rebuild with --overwrite")
    if lp.mask_dtype == "<u2" and lp0.mask_dtype == "|u1":
        raise SourceError(
            f"the source's masks now need 16 bits, but {out} stores 8-bit masks; rebuild with --overwrite"
        )
    defects = (*lp0.defects, *(d for d in lp.defects if d not in lp0.defects))
    return replace(plan0, labels=replace(lp0, defects=defects, class_ids=lp.class_ids, label_root=lp.label_root))


def merged_class_ids(m: Manifest, scan: SourceScan, new_classes: Sequence[str], out: Path) -> tuple[int, ...]:
    """The store's class ids, extended with the ids of the classes an update appends."""
    if not m.class_ids and not (scan.class_ids and tuple(scan.class_ids) != tuple(range(len(scan.classes)))):
        return ()
    ids = dict(zip(scan.classes, scan.class_ids or range(len(scan.classes)), strict=True))
    merged = (*m.resolved_class_ids, *(int(ids[c]) for c in new_classes))
    if len(set(merged)) != len(merged):
        raise SourceError(
            f"the classes the update appends to {out} ({', '.join(new_classes)}) take ids it already uses "
            f"({list(m.resolved_class_ids)}); rebuild with --overwrite"
        )
    return merged


class StoredLabels:
    """The label outputs of the store an update replaces, read once (each array whole)."""

    def __init__(self, reader: Any, plan: BuildPlan) -> None:
        lp = plan.labels
        self.on = lp is not None
        if lp is None:
            return
        self.orientation = reader.meta("orientation")
        self.digest = reader.meta("label_sha256")
        self.ragged: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for name in ("boxes", "box_labels") * lp.boxes + ("box_crowd",) * lp.crowd:
            self.ragged[name] = (reader.meta(name + "_data"), reader.meta(name + "_offsets"))

    def rows(self, name: str, i: int) -> np.ndarray:
        """The rows of ragged array ``name`` that old sample ``i`` holds."""
        data, off = self.ragged[name]
        return np.asarray(data[int(off[i]) : int(off[i + 1])])

    def of(self, sample: Sample, i: int) -> Sample:
        """``sample`` (old sample ``i``) with its label outputs as the store holds them."""
        if not self.on:
            return sample
        boxes = self.rows("boxes", i).reshape(-1, 4).tolist() if "boxes" in self.ragged else None
        return replace(
            sample,
            orientation=int(self.orientation[i]),
            boxes=None if boxes is None else tuple((float(a), float(b), float(c), float(d)) for a, b, c, d in boxes),
            box_labels=tuple(int(v) for v in self.rows("box_labels", i)) if "box_labels" in self.ragged else (),
            box_crowd=tuple(int(v) for v in self.rows("box_crowd", i)) if "box_crowd" in self.ragged else None,
            label_sha256=bytes(self.digest[i]).hex(),
        )


def remap_box_labels(sample: Sample, scan_classes: Sequence[str], class_id: Any, alias: Any) -> Sample:
    """A decoded sample's box labels (indices into the scan's classes) as indices into the store's."""
    if not sample.box_labels:
        return sample
    labels = tuple(int(class_id[alias.get(scan_classes[k], scan_classes[k])]) for k in sample.box_labels)
    return replace(sample, box_labels=labels)


def _update_blocks(
    writer: StoreWriter,
    reader: Any,
    out: Path,
    plan0: BuildPlan,
    plan: BuildPlan,
    origin: Sequence[tuple[str, int]],
    scan: SourceScan,
    probes: Sequence[Probe],
    files: SourceFiles,
    pool: Pool,
    quiet: bool,
) -> tuple[dict[int, Sample], int, int]:
    """Write the image blocks of an update: a block whose samples are all the old store's, at the
    same indices, in a block of the same extent, is shared with it when the backend can; every
    other block is assembled from old pixels and newly decoded files. Returns the decoded samples
    (by scan position) and the counts of shared and written blocks."""
    has_mask = "mask" in writer.arrays
    step = writer.shard_rows("images")
    n0, step0 = plan0.count, plan0.shard_rows
    todo: list[int] = []
    shared = 0
    for s in range(0, len(origin), step):
        e = min(s + step, len(origin))
        same = step == step0 and min(s + step0, n0) == e and all(origin[j] == ("old", j) for j in range(s, e))
        if same and writer.share_block("images", s, out) and (not has_mask or writer.share_block("mask", s, out)):
            shared += 1
        else:
            todo.append(s)
    rel = [it.rel for it in scan.items]
    decoded: dict[int, Sample] = {}

    def work(s: int, ticks: Any) -> Call:
        pairs = [
            (rel[k], probes[k].header, scan.items[k].annotations) for src, k in origin[s : s + step] if src == "new"
        ]
        return (decode_block, (files, plan, pairs, None, True, ticks), {})

    def land(s: int, results: Sequence[Sample | InputFileError]) -> tuple[None, int]:
        block = fixed_block(plan, min(step, len(origin) - s))
        masks = mask_block(plan, len(block)) if has_mask else None
        olds = [(j, v) for j, (src, v) in enumerate(origin[s : s + step]) if src == "old"]
        if olds:
            got = np.empty((len(olds), *block.shape[1:]), dtype=block.dtype)
            reader.read_into("images", [v for _, v in olds], got)
            block[[j for j, _ in olds]] = got
            if masks is not None:
                got_m = np.empty((len(olds), *masks.shape[1:]), dtype=masks.dtype)
                reader.read_into("mask", [v for _, v in olds], got_m)
                masks[[j for j, _ in olds]] = got_m
        news = [j for j, (src, _) in enumerate(origin[s : s + step]) if src == "new"]
        for j, r in zip(news, results, strict=True):
            if not isinstance(r, Sample) or r.pixels is None:
                raise DlpackError(f"{r} failed to decode on the second pass")  # pragma: no cover - checked before
            block[j] = r.pixels
            if masks is not None and r.mask is not None:
                masks[j] = r.mask
            decoded[origin[s + j][1]] = replace(r, pixels=None, mask=None)
        writer.write_block("images", s, block)
        if masks is not None:
            writer.write_block("mask", s, masks)
        return None, len(block)

    total = sum(min(step, len(origin) - s) for s in todo)
    run_blocks(pool, todo, work, land, progress=(total, "updating", quiet, None))
    return decoded, shared, len(todo)
