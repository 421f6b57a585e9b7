"""The build keeps its per-image records as columns: the stores it writes are those of the object path.

A folder scan gives an :class:`ItemTable`, the probes a :class:`ProbeTable`, the workers' samples
land in a :class:`SampleTable`, and the manifest's arrays are built from those columns. A source
that lists plain :class:`SourceItem` tuples goes through the object fallbacks; both builds must be
byte-identical, and the arrays must hold what the files say (paths, labels, splits, sizes, hashes).
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import interrupt_build

import dlpack
from dlpack.backends import backend_for_path
from dlpack.errors import InputFileError
from dlpack.pack.columns import SampleTable
from dlpack.pack.inputs import Probe, ProbeTable, Selection, probed, split_stage
from dlpack.pack.plan import order_digest
from dlpack.pack.workers import JobList, Sample
from dlpack.sources import FolderSource, SourceItem, SourceScan
from dlpack.sources._items import ItemTable
from dlpack.sources.probe import ImageHeader

MakeTree = Callable[..., Path]

#: Two splits, two classes, names beyond ASCII; 40x30 noise images, 18 to a 64 KiB block.
SPEC: dict[str, Any] = {
    f"{split}/{cls}/{k:02d}{'ä' if k % 5 == 0 else ''}.png": "rgb"
    for split in ("train", "val")
    for cls in ("cat", "dög")
    for k in range(14)
}
BAD = "train/cat/03.png"  # truncated below: the probe refuses it


class TupleSource:
    """The folder's items as a plain tuple of SourceItem objects: the build's object path."""

    def __init__(self, root: Path) -> None:
        self._root = Path(root)

    @property
    def root(self) -> Path:
        return self._root

    def scan(self) -> SourceScan:
        scan = FolderSource(self._root).scan()
        items = tuple(scan.items)
        assert type(items[0]) is SourceItem
        return SourceScan(items, scan.classes, scan.errors, scan.labels, scan.excluded, scan.ignored, task=scan.task)


def source_tree(make_tree: MakeTree) -> Path:
    root = make_tree(SPEC)
    data = (root / BAD).read_bytes()
    (root / BAD).write_bytes(data[: len(data) // 2])
    return root


def store_files(path: Path) -> dict[str, bytes]:
    if path.is_file():
        return {"": path.read_bytes()}
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def test_columnar_build_is_byte_identical_to_the_object_build_and_holds_the_files(
    make_tree: MakeTree, tmp_path: Path, backend: str
) -> None:
    src = source_tree(make_tree)
    scan = FolderSource(src).scan()
    assert isinstance(scan.items, ItemTable)
    columns, objects = tmp_path / "columns" / backend, tmp_path / "objects" / backend
    opts = {"shard_bytes": 2**16, "jobs": 1, "quiet": True, "on_error": "skip"}
    a = dlpack.build(src, columns, **opts)
    b = dlpack.build(TupleSource(src), objects, **opts)
    assert [e.path for e in a.skipped] == [BAD] and a.count == len(SPEC) - 1
    assert store_files(columns) == store_files(objects)
    assert a.input_bytes == b.input_bytes == sum((src / r).stat().st_size for r in SPEC if r != BAD)

    good = sorted(r for r in SPEC if r != BAD)
    ds = dlpack.open(columns)
    assert ds.classes == ("cat", "dög")
    for i, rel in enumerate(good):
        s = ds[i]
        split, cls = rel.split("/")[:2]
        assert s["source"] == rel
        assert ds.classes[int(s["label"])] == cls
        assert s["split"] == split
    with backend_for_path(columns).open_reader(columns) as r:
        sha = np.stack([r.read("source_sha256", i) for i in range(len(good))])
        stat = np.stack([r.read("source_stat", i) for i in range(len(good))])
        checksum = [int(r.read("checksum", i)) for i in range(len(good))]
        images = [r.read("images", i) for i in range(len(good))]
    assert [bytes(row).hex() for row in sha] == [hashlib.sha256((src / g).read_bytes()).hexdigest() for g in good]
    assert stat.tolist() == [[(src / g).stat().st_size, (src / g).stat().st_mtime_ns] for g in good]
    assert checksum == [zlib.crc32(np.ascontiguousarray(img).data) for img in images]


def test_resumed_columnar_build_ends_byte_identical(
    make_tree: MakeTree, tmp_path: Path, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = source_tree(make_tree)
    out = tmp_path / backend
    opts = {"shard_bytes": 2**16, "jobs": 1, "quiet": True, "on_error": "skip"}
    interrupt_build(monkeypatch, 2, lambda: dlpack.build(src, out, **opts))
    result = dlpack.build(src, out, **opts)
    assert result.resume.startswith("resumed: 2 of ")
    ref = tmp_path / "ref" / backend
    dlpack.build(TupleSource(src), ref, **opts)
    assert store_files(out) == store_files(ref)


def test_split_option_keeps_columns_and_gives_the_object_splits(make_tree: MakeTree, tmp_path: Path) -> None:
    src = make_tree({f"{c}/{k:02d}.png": "gray" for c in ("a", "b") for k in range(20)})
    scan = FolderSource(src).scan()
    split = split_stage(scan, (60, 20, 20), 7, os.fspath(src))
    assert isinstance(split.items, ItemTable)
    by_objects = split_stage(SourceScan(tuple(scan.items), scan.classes, labels=scan.labels), (60, 20, 20), 7, "x")
    assert list(split.items) == list(by_objects.items)
    assert {it.split for it in split.items} == {"train", "val", "test"}
    opts = {"jobs": 1, "quiet": True, "split": (60, 20, 20), "split_seed": 7}
    dlpack.build(src, tmp_path / "a.zarr", **opts)
    dlpack.build(TupleSource(src), tmp_path / "b.zarr", **opts)
    assert store_files(tmp_path / "a.zarr") == store_files(tmp_path / "b.zarr")


def test_item_table_reads_as_the_items_it_holds() -> None:
    items = (
        SourceItem("a/x.png", "a", split="train"),
        SourceItem("a/ÿ ü.png", "a", split=None),
        SourceItem("b/缺陷.png", "b", split="val"),
        SourceItem("y.png", None, split="train"),
    )
    table = ItemTable([it.rel for it in items], [0, 0, 1, -1], ("a", "b"), [0, -1, 1, 0], ("train", "val"))
    assert len(table) == 4 and table == items and items == table and list(table) == list(items)
    assert table[-1] == items[-1] and table[1:3] == items[1:3] and table.rel(2) == "b/缺陷.png"
    with pytest.raises(IndexError):
        table[4]
    assert table != items[:3] and table != "a/x.png"
    for keep in (range(4), [0, 1, 2, 3], [1, 3], [0, 2, 3], [2], [], range(1, 3)):
        data, offsets = table.source_bytes(keep)
        want = [items[k].rel.encode("utf-8") for k in keep]
        assert bytes(data) == b"".join(want)
        assert np.diff(offsets).tolist() == [len(w) for w in want] and offsets[0] == 0
    moved = table.with_splits(["test", None, "test", "val"])
    assert [it.split for it in moved] == ["test", None, "test", "val"] and [it.rel for it in moved] == [
        it.rel for it in items
    ]
    assert pickle.loads(pickle.dumps(table)) == items
    with pytest.raises(ValueError, match="labels"):
        ItemTable(["a"], [0, 1], ("a",), [-1], ())


def test_probe_table_keeps_headers_sizes_and_errors() -> None:
    probes = [
        Probe(ImageHeader("png", 40, 30, 3, False, 8, 1, 1), 1234, None),
        Probe(None, 0, "empty file (0 bytes)"),
        Probe(ImageHeader("tiff", 2**40, 7, 1, True, 16, 6, 3), 99, "too many pixels"),
        Probe(ImageHeader("other", 5, 6, 3, False, 8), 10, None),  # a format the table has no code for
        Probe(ImageHeader("jpeg", 5, 6, 3, False, 8, 1, 2**20), 11, None),  # a field too wide for its column
    ]
    table = ProbeTable.of(probes, len(probes))
    assert list(table) == probes and table[-1] == probes[-1] and table[1:3] == tuple(probes[1:3])
    assert dict(table.errors) == {1: "empty file (0 bytes)", 2: "too many pixels"}
    assert table.nbytes([0, 2, 4]) == 1234 + 99 + 11 and table.nbytes([]) == 0
    scan = SourceScan(tuple(SourceItem(f"{k}.png") for k in range(len(probes))))
    sel = probed(scan, table)
    assert list(sel.keep) == [0, 3, 4] and [(e.path, e.reason) for e in sel.errors] == [
        ("1.png", "empty file (0 bytes)"),
        ("2.png", "too many pixels"),
    ]
    clean = probed(SourceScan(scan.items[:1]), ProbeTable.of(probes[:1], 1))
    assert isinstance(clean.keep, range) and list(clean.keep) == [0]
    assert clean.drop({}) == clean and clean.drop({0: InputFileError("0.png", "x")}).keep == ()


def _sample(k: int, labelled: bool = False) -> Sample:
    s = Sample(
        (30 + k, 40), (16, 16, 3), (0.5, 0.25, 1.0, -2.0), 2**32 - 1 - k, ("gray to rgb",) if k % 2 else (),
        None, (1000 + k, 1_700_000_000_123_456_789 + k), hashlib.sha256(str(k).encode()).hexdigest(),
    )  # fmt: skip
    if not labelled:
        return s
    return Sample(
        s.original_size, s.shape, s.transform, s.checksum, s.conversions, None, s.stat, s.sha256, orientation=6,
        boxes=((1.0, 2.0, 3.0, 4.0),), box_labels=(3,), box_crowd=(0,), mask_crc=7, label_sha256="ab" * 32,
    )  # fmt: skip


def test_sample_table_columns_hold_the_samples() -> None:
    samples = [_sample(k, labelled=k == 2) for k in range(5)]
    table = SampleTable.of(samples)
    assert list(table) == samples and table[-1] == samples[-1] and table[1:3] == samples[1:3]
    assert SampleTable.of(table) is table and table.complete
    assert table.conversion_counts() == {"gray to rgb": 2}
    assert table.original_size.dtype.str == "<i4" and table.transform.dtype.str == "<f8"
    assert table.sha256.tobytes() == b"".join(bytes.fromhex(s.sha256) for s in samples)
    part = SampleTable(3)
    err = InputFileError("b.png", "cannot read")
    assert part.put_results(0, [samples[0], err, samples[1]]) == {1: err} and not part.complete
    assert part[0] == samples[0] and part[2] == samples[1]
    with pytest.raises(IndexError, match="not written"):
        part[1]
    # Blocks put out of order: complete once every span is in, whatever the order.
    late = SampleTable(5)
    late.put(3, samples[3:5])
    late.put(0, samples[0:2])
    assert not late.complete and late[4] == samples[4]
    with pytest.raises(IndexError, match="sample 2 was not written"):
        late[2]
    late.put(2, samples[2:3])
    assert late.complete and list(late) == samples


def test_order_digest_is_that_of_the_whole_json_list() -> None:
    items = [SourceItem(r) for r in ("a/ä.png", 'q"uote.png', "b\\c.png", "缺陷.png")]
    text = json.dumps([it.rel for it in items], separators=(",", ":"), ensure_ascii=False)
    assert order_digest(items) == hashlib.sha256(text.encode("utf-8")).hexdigest()
    assert order_digest([]) == hashlib.sha256(b"[]").hexdigest()


def test_job_list_makes_the_jobs_of_the_kept_items() -> None:
    items = ItemTable(["a.png", "b.png", "c.png"], [-1, -1, -1], (), [-1, -1, -1], ())
    headers = [ImageHeader("png", k + 1, 2, 3, False, 8) for k in range(3)]
    probes = ProbeTable.of([Probe(h, 1, None) for h in headers], 3)
    jobs = JobList(items, probes, [0, 2])
    assert len(jobs) == 2 and list(jobs) == [("a.png", headers[0], None), ("c.png", headers[2], None)]
    assert jobs[1] == ("c.png", headers[2], None) and jobs[0:1] == [("a.png", headers[0], None)]
    assert pickle.loads(pickle.dumps(jobs)) == list(jobs)
    sel = Selection(range(3), ())
    assert sel.drop({}).keep == range(3)


class ListedSource:
    def __init__(self, root: Path, rels: tuple[str, ...]) -> None:
        self._root, self.rels = Path(root), rels

    @property
    def root(self) -> Path:
        return self._root

    def scan(self) -> SourceScan:
        return SourceScan(tuple(SourceItem(r) for r in self.rels))


@pytest.mark.parametrize(
    ("rels", "twice"),
    [
        (("a.png", "b.png", "c.png"), None),
        (("b.png", "a.png", "c.png"), None),  # out of order, no path twice
        (("a.png", "b.png", "b.png"), "b.png"),
        (("b.png", "a.png", "b.png"), "b.png"),  # the second b comes after the order broke
        (("c.png", "a.png", "b.png", "a.png"), "a.png"),
    ],
)
def test_scan_stage_finds_a_path_listed_twice_in_any_order(
    tmp_path: Path, rels: tuple[str, ...], twice: str | None
) -> None:
    from dlpack.errors import SourceError
    from dlpack.pack.inputs import scan_stage

    source = ListedSource(tmp_path, rels)
    if twice is None:
        assert [it.rel for it in scan_stage(source).items] == list(rels)
    else:
        with pytest.raises(SourceError, match=f"lists '{twice}' twice"):
            scan_stage(source)
