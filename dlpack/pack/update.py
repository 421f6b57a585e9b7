"""``build --update``: a new generation of a store, writing only the blocks that change."""

from __future__ import annotations

import datetime
import os
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from .._names import shown as shown_name
from .._parallel import LocalPool
from ..backends import ArraySpec, Backend, StoreWriter, owned_store, remove_store
from ..errors import DlpackError, InputFileError, OptionError, SourceError, StoreError, StoreNotFoundError
from ..manifest import Manifest
from ..options import BuildOptions, parse_labels
from ..sources.base import Source, SourceScan
from ..sources.folder import FolderSource
from ..storage.lock import journal_path, partial_path
from ..storage.publish import publish, unmarked
from ..storage.runner import Call, Pool, run_blocks
from .arrays import manifest_stage
from .changes import (
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
    """
    reader = _open_updatable(out, backend)
    try:
        m = reader.manifest
        plan0 = check_update_options(BuildPlan.from_dict(m.plan), opts, out)
        source = source_with_rules(source, plan0)
        root = source.root
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
        plan0 = update_label_plan(plan0, scan, os.fspath(root), opts, out)
        user = user_arrays(m, opts, out)
        probes = probe_stage(root, scan.items, opts)
        n0 = m.count
        rels0 = [reader.source(i) for i in range(n0)]
        ch = source_changes(root, scan, probes, rels0, reader.meta("source_stat"), reader.meta("source_sha256"))
        lp0 = plan0.labels
        if lp0 is not None and "label_sha256" in m.arrays:
            ch = label_changes(
                ch,
                scan,
                reader.meta("label_sha256"),
                lambda it: label_digest(os.fspath(root), lp0.label_root, it.annotations),
            )
        if isinstance(source, FolderSource):
            new_label_paths(scan, ch.added, root)
        if ch.removed and not opts.compact:
            raise gone_error(ch, rels0, scan, root)
        # Inputs to decode: replaced files in place, then added ones; bad ones follow --on-error,
        # except replaced files, which cannot be dropped without renumbering.
        todo = [ch.match[i] for i in sorted(ch.replaced)] + list(ch.added)
        bad = {k: InputFileError(scan.items[k].rel, probes[k].error or "") for k in todo if probes[k].error}
        pairs = jobs_of(scan.items, probes, [k for k in todo if k not in bad])
        found = validate_stage(os.fspath(root), plan0, pairs, opts)
        now = {it.rel: k for k, it in enumerate(scan.items)}
        bad.update({now[e.path]: e for e in found})
        bad = {k: InputFileError(e.path, update_reason(e.reason, plan0)) for k, e in bad.items()}
        replaced_bad = [bad[ch.match[i]] for i in sorted(ch.replaced) if ch.match[i] in bad]
        errors = [*scan.errors, *bad.values()]
        if replaced_bad:
            raise replaced_error(replaced_bad, len(errors) - len(replaced_bad), root, opts.on_error == "skip")
        if errors and opts.on_error == "fail":
            # The scan's reasons as the store records them, the advice in them one an update can follow.
            advised = [InputFileError(e.path, update_reason(e.reason, plan0)) for e in scan.errors]
            raise bad_inputs([*advised, *bad.values()], root)
        added = [k for k in ch.added if k not in bad]
        # Where each sample of the new generation comes from: an old index, or a scan position to
        # decode; and the old index it had (None for appended samples).
        origin: list[tuple[str, int]] = [("new", ch.match[i]) if i in ch.replaced else ("old", i) for i in ch.kept]
        origin += [("new", k) for k in added]
        olds: list[int | None] = [*ch.kept, *([None] * len(added))]
        # A carried array's row stays with its sample only while its image does: a replaced image gets the fill.
        rows: list[int | None] = [None if i in ch.replaced else i for i in ch.kept] + [None] * len(added)
        items = [scan.items[ch.match[v]] if src == "old" else scan.items[v] for src, v in origin]
        if not items:
            raise SourceError(f"the update would leave {out} without samples")
        fills = opts.fill_values
        unfilled = [s for s in user if s.name not in fills]
        if unfilled and (added or ch.replaced):
            raise unfilled_error(unfilled, len(added), len(ch.replaced), out)
        skipped = tuple(sorted(errors, key=lambda e: e.path))
        split0 = reader.meta("split") if m.splits else None
        labels0 = reader.meta("labels")
        damaged = codes_outside(labels0, m.classes) or (split0 is not None and codes_outside(split0, m.splits))
        changed = added or ch.replaced or ch.removed or ch.restat or ch.renamed or opts.drop_array or damaged
        if not changed and skipped == m.skipped:
            return BuildResult(
                path=out,
                count=n0,
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
        # Variants are made from the samples' indices and pixels: kept only while no sample changes.
        variants = variant_arrays(m)
        keep_variants = bool(variants) and not (added or ch.replaced or ch.removed)
        images = image_array(plan0.image, plan0.compression)
        count = len(items)
        plan = replace(
            plan0,
            count=count,
            shard_rows=backend.shard_rows(images, count, plan0.shard_bytes),
            order=order_digest(items),
            source=source_digest(scan, probes),
        )
        alias = class_aliases(m.classes, scan.classes)
        if alias:
            items = [replace(it, label=alias[it.label]) if it.label in alias else it for it in items]
        new_classes = [c for c in scan.classes if c not in m.classes and c not in alias]
        classes = (*m.classes, *new_classes)
        class_ids = merged_class_ids(m, scan, new_classes, out)
        splits = (*m.splits, *(s for s in split_names(scan.items) if s not in m.splits))
        class_id = {c: i for i, c in enumerate(classes)}
        split_id = {s: i for i, s in enumerate(splits)}

        # Kept and replaced samples keep their stored class and split; appended ones get the scan's,
        # and so does a stored code outside the store's classes or splits (a damaged store is repaired).
        def kept(codes: np.ndarray | None, i: int | None, names: Sequence[str]) -> int | None:
            code = None if codes is None or i is None else int(codes[i])
            return code if code is not None and -1 <= code < len(names) else None

        labels = np.array(
            [
                code if (code := kept(labels0, i, m.classes)) is not None
                else class_id[it.label] if it.label is not None else -1
                for i, it in zip(olds, items, strict=True)
            ],
            dtype="<i4",
        )  # fmt: skip
        split_codes = (
            np.array(
                [
                    code if (code := kept(split0, i, m.splits)) is not None else split_id[it.split] if it.split else -1
                    for i, it in zip(olds, items, strict=True)
                ],
                dtype="|i1",
            )  # fmt: skip
            if splits
            else None
        )
        tmp = partial_path(out)
        remove_store(journal_path(out))
        remove_store(tmp)
        writer = backend.open_writer(tmp, "w-", plan.shard_bytes)
        partial = Partial(writer, None, {}, "")
        try:
            writer.open()
            writer.create_array(images, count)
            masks = mask_array(plan)
            if masks is not None:
                writer.create_array(masks, count, rows=writer.shard_rows(images.name))
            decoded, shared, written = _update_blocks(
                writer, reader, out, plan0, plan, origin, scan, probes, root, LocalPool(opts.n_jobs), opts.quiet
            )
            carry_arrays(writer, reader, out, user, rows, fills)
            if keep_variants:
                carry_arrays(writer, reader, out, variants, rows, {})
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
                else remap_box_labels(decoded[v], scan.classes, class_id, alias)
                for src, v in origin
            ]
            view = SourceScan(
                tuple(items), classes, (), scan.labels, class_ids=class_ids, task=scan.task, notes=scan.notes
            )
            arrays, manifest = manifest_stage(plan, view, Selection(tuple(range(count)), tuple(errors)), samples)
            arrays["labels"] = (arrays["labels"][0], labels)
            arrays.pop("split", None)
            if split_codes is not None:
                arrays["split"] = (ArraySpec("split", "|i1", (), key="split"), split_codes)
            conversions = Counter(m.conversions)
            conversions.update(c for s in decoded.values() for c in s.conversions)
            entry = {
                "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "added": len(added),
                "replaced": len(ch.replaced),
                "removed": len(ch.removed),
            }
            manifest = replace(
                manifest,
                splits=splits,
                conversions=dict(sorted(conversions.items())),
                history=(*m.history, entry),
                augment=m.augment if keep_variants else None,
            )
        except BaseException as exc:
            discard_partial(partial, out, exc)
            raise
        commit_store(partial, out, arrays, manifest)
        try:
            carried = backend.carry_foreign(out, tmp, m)
        except BaseException:
            remove_store(tmp)
            raise
    finally:
        reader.close()
    publish(tmp, out, True)
    n_blocks = shared + written
    note = (
        f"updated: {len(added)} added, {len(ch.replaced)} replaced, {len(ch.removed)} removed; "
        f"{written} of {n_blocks} blocks written"
    )
    if opts.drop_array:
        note += f"; dropped array(s) {', '.join(opts.drop_array)}"
    if m.augment is not None or variants:
        note += (
            f"; kept its {m.variants} augmentation variants per image"
            if keep_variants
            else "; " + dropped_variants_note(m, out)
        )
    if carried:
        what = "1 entry that is" if len(carried) == 1 else f"{len(carried)} entries that are"
        note += f"; kept {what} not dlpack's ({', '.join(shown_name(c) for c in carried[:5])})"
    return BuildResult(
        path=out,
        count=count,
        skipped=manifest.skipped,
        seconds=time.perf_counter() - t0,
        input_bytes=sum(probes[k].nbytes for k in decoded),
        output_bytes=backend.open_reader(out).nbytes_on_disk(),
        conversions=dict(manifest.conversions),
        plan=plan,
        update=note,
        classes=manifest.classes,
        splits=split_counts(splits, split_codes),
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


def update_label_plan(plan0: BuildPlan, scan: SourceScan, root: str, opts: BuildOptions, out: Path) -> BuildPlan:
    """The store's label plan with the scan's class ids and label folder (for decoding), and any new
    defect folder names appended; a source whose labels need other arrays than the store's is refused."""
    lp0 = plan0.labels
    lp = label_plan(scan, scan.items, root, opts)
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
    root: Path,
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
        return (decode_block, (os.fspath(root), plan, pairs, None, True, ticks), {})

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
