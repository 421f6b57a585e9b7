"""A build from a bucket prefix (``s3://bucket/raw/``), against the loopback server: the same store as
a build of the same tree from a local folder (images, labels, class names, per-sample records but the
source version), by the same folder rules (hidden names, excludes, refused label folders); a bad or
vanished object is named as a bad local file is; read-ahead on and off write the same store; the
probe costs two ranged GETs an image; what a bucket source cannot do is refused with an OptionError."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _s3
import numpy as np
import pytest

import dlpack
from dlpack.cli import main
from dlpack.errors import BadInputsError, OptionError, SourceError
from dlpack.pack.inputs import probe_stage
from dlpack.sources.base import SourceScan
from dlpack.sources.folder import FolderSource
from dlpack.sources.remote import BucketFolderSource, ObjectFiles, version_of
from dlpack.storage.location import Location
from dlpack.storage.objects import ObjectStorage

MakeTree = Callable[..., Path]
SHARD = 65536  # the smallest shard the options allow
KW: dict[str, Any] = {"size": (16, 16), "shard_bytes": SHARD, "jobs": 1, "quiet": True}

TREE = {
    **{f"cat/{k}.png": "rgb" for k in range(4)},
    **{f"dog/lot_1/{k}.jpg": "rgb" for k in range(3)},
    "dog/.thumbs/x.png": "rgb",  # hidden folder
    "cat/.hidden.png": "rgb",  # hidden file
    "cat/skip_me.png": "rgb",  # excluded
    "notes.txt": b"not an image",
}
EXCLUDE = ("*/skip_*",)


@pytest.fixture(autouse=True)
def _needs_s3() -> None:
    _s3.skip_without_s3()


@pytest.fixture
def tree(make_tree: MakeTree, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)  # a URL taken for a path would make an "s3:" folder here
    return make_tree(TREE)


def _raw(s3: Any, folder: Path) -> str:
    url = s3.url("raw")
    _s3.upload(folder, url)
    return url


def _local_copy(url: str, dest: Path) -> Path:
    """Every object of the store at ``url`` as a local folder (to open it with zarr-python)."""
    st = ObjectStorage(Location.parse(url))
    for info in st.list():
        path = dest / info.key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(st.get(info.key))
    return dest


def _same_store(a: Path, b: Path) -> None:
    """Equal arrays but ``source_stat`` (a file's mtime, an object's ETag version), equal labels and records."""
    import zarr

    ga, gb = zarr.open_group(str(a), mode="r"), zarr.open_group(str(b), mode="r")
    assert sorted(ga.array_keys()) == sorted(gb.array_keys())
    for name in ga.array_keys():
        if name != "source_stat":
            assert np.array_equal(ga[name][:], gb[name][:]), name
    sa, sb = ga["source_stat"][:], gb["source_stat"][:]
    assert np.array_equal(sa[:, 0], sb[:, 0])  # the sizes
    ma, mb = (json.loads((p / "manifest.json").read_text()) for p in (a, b))
    for key in ("classes", "labels", "count", "skipped", "stats", "splits", "conversions"):
        assert ma[key] == mb[key], key


def test_a_build_from_a_bucket_equals_a_build_of_the_same_folder(tree: Path, tmp_path: Path, s3: Any) -> None:
    url = _raw(s3, tree)
    local = dlpack.build(tree, tmp_path / "local.zarr", exclude=EXCLUDE, **KW)
    from_bucket = dlpack.build(url + "/", tmp_path / "b.zarr", exclude=EXCLUDE, **KW)
    into_bucket = dlpack.build(url, s3.url("out.zarr"), exclude=EXCLUDE, **KW)
    assert local.count == from_bucket.count == into_bucket.count == 7
    assert local.classes == from_bucket.classes == ("cat", "dog")
    assert local.excluded == from_bucket.excluded == ("cat/skip_me.png",)
    assert local.ignored == from_bucket.ignored == ("notes.txt",)
    _same_store(tmp_path / "local.zarr", tmp_path / "b.zarr")
    _same_store(tmp_path / "local.zarr", _local_copy(s3.url("out.zarr"), tmp_path / "copy.zarr"))
    # The recorded version is the ETag's, in every process and run.
    import zarr

    st = ObjectStorage(Location.parse(url))
    etag = st.head("cat/0.png")
    assert etag is not None
    stat = zarr.open_group(str(tmp_path / "b.zarr"), mode="r")["source_stat"][0]
    assert tuple(stat) == (etag.size, version_of(etag.etag))
    assert not any(p.name.startswith("s3") for p in tmp_path.iterdir())


def test_labels_none_and_folders_and_class_folder_last_work_on_a_url(tree: Path, tmp_path: Path, s3: Any) -> None:
    url = _raw(s3, tree)
    for i, kw in enumerate(({"labels": "none"}, {"labels": "folders"}, {"class_folder": "last"})):
        a = dlpack.build(tree, tmp_path / f"l{i}.zarr", exclude=EXCLUDE, **kw, **KW)
        b = dlpack.build(url, tmp_path / f"b{i}.zarr", exclude=EXCLUDE, **kw, **KW)
        assert a.classes == b.classes, kw
        _same_store(tmp_path / f"l{i}.zarr", tmp_path / f"b{i}.zarr")


def test_a_label_folder_is_refused_as_in_a_folder(make_tree: MakeTree, tmp_path: Path, s3: Any) -> None:
    tree = make_tree({"cat/0.png": "rgb", "cat/masks/0.png": "gray", "dog/1_mask.png": "gray"})
    url = _raw(s3, tree)
    with pytest.raises(SourceError) as local:
        dlpack.build(tree, tmp_path / "l.zarr", **KW)
    with pytest.raises(SourceError) as remote:
        dlpack.build(url, tmp_path / "b.zarr", **KW)
    assert str(remote.value) == str(local.value).replace(repr(str(tree)), repr(url))
    assert "--exclude 'masks'" not in str(remote.value) and "--exclude 'cat/masks'" in str(remote.value)


def test_a_bad_object_is_named_as_a_bad_file_and_skipped_the_same(make_tree: MakeTree, tmp_path: Path, s3: Any) -> None:
    tree = make_tree({**{f"c/{k}.png": "rgb" for k in range(3)}, "c/bad.png": b"\x89PNG\r\n\x1a\n broken"})
    url = _raw(s3, tree)
    with pytest.raises(BadInputsError) as local:
        dlpack.build(tree, tmp_path / "l.zarr", **KW)
    with pytest.raises(BadInputsError) as remote:
        dlpack.build(url, tmp_path / "b.zarr", **KW)
    assert remote.value.errors == local.value.errors
    assert [e.path for e in remote.value.errors] == ["c/bad.png"]
    assert f" in {url}:" in str(remote.value)
    a = dlpack.build(tree, tmp_path / "l.zarr", on_error="skip", **KW)
    b = dlpack.build(url, tmp_path / "b.zarr", on_error="skip", **KW)
    assert a.skipped == b.skipped and len(b.skipped) == 1
    _same_store(tmp_path / "l.zarr", tmp_path / "b.zarr")


class _Vanishing:
    """A real source whose scan is followed by the deletion of one of its files (a file removed
    after the listing): the folder's file unlinked, or the bucket's object deleted."""

    def __init__(self, inner: Any, rel: str, remove: Callable[[str], None]) -> None:
        self.inner, self.rel, self.remove = inner, rel, remove

    @property
    def root(self) -> Any:
        return self.inner.root

    @property
    def files(self) -> Any:
        return getattr(self.inner, "files", None)

    def scan(self) -> SourceScan:
        scan = self.inner.scan()
        self.remove(self.rel)
        return scan


def test_an_object_deleted_after_the_listing_is_named_as_a_vanished_file(
    make_tree: MakeTree, tmp_path: Path, s3: Any
) -> None:
    tree = make_tree({f"c/{k}.png": "rgb" for k in range(4)})
    url = _raw(s3, tree)
    loc = Location.parse(url)
    storage = ObjectStorage(loc)
    local = _Vanishing(FolderSource(tree), "c/2.png", lambda rel: (tree / rel).unlink())
    remote = _Vanishing(BucketFolderSource(loc), "c/2.png", lambda rel: storage.delete([rel]))
    with pytest.raises(BadInputsError) as lerr:
        dlpack.build(local, tmp_path / "l.zarr", **KW)
    with pytest.raises(BadInputsError) as rerr:
        dlpack.build(remote, tmp_path / "b.zarr", **KW)
    assert [e.path for e in rerr.value.errors] == [e.path for e in lerr.value.errors] == ["c/2.png"]
    for err in (lerr, rerr):
        assert err.value.errors[0].reason.startswith("cannot read: No such file or directory")
    # Skipped the same (each file deleted again: the failed runs left their sources as they were).
    (tree / "c/2.png").write_bytes(b"")
    storage.put("c/2.png", b"")
    a = dlpack.build(local, tmp_path / "l.zarr", on_error="skip", **KW)
    b = dlpack.build(remote, tmp_path / "b.zarr", on_error="skip", **KW)
    assert [s.path for s in a.skipped] == [s.path for s in b.skipped] == ["c/2.png"]
    _same_store(tmp_path / "l.zarr", tmp_path / "b.zarr")


def test_read_ahead_on_and_off_write_the_same_store(tree: Path, tmp_path: Path, s3: Any, snapshot: Any) -> None:
    loc = Location.parse(_raw(s3, tree))
    off = BucketFolderSource(loc, exclude=EXCLUDE, ahead=0)
    on = BucketFolderSource(loc, exclude=EXCLUDE, ahead=3)
    assert off.files.ahead == 0 and on.files.ahead == 3
    dlpack.build(off, tmp_path / "off.zarr", **KW)
    dlpack.build(on, tmp_path / "on.zarr", **{**KW, "jobs": 2})
    assert snapshot(tmp_path / "off.zarr") == snapshot(tmp_path / "on.zarr")


def test_the_probe_sends_two_ranged_gets_an_image_and_the_listing_no_head(tree: Path, tmp_path: Path, s3: Any) -> None:
    loc = Location.parse(_raw(s3, tree))
    scan = BucketFolderSource(loc, exclude=EXCLUDE).scan()
    files = ObjectFiles(loc)
    probes = probe_stage(files, scan.items, max_pixels=1 << 30, n_jobs=1, quiet=True)
    assert len(probes) == 7 and not probes.errors
    assert files.storage.requests == {"GET": 14}
    # An image read whole: one GET, with its size and version.
    data, stat = files.read("cat/0.png")
    assert (tree / "cat/0.png").read_bytes() == data and stat.size == len(data)
    assert files.storage.requests == {"GET": 15}
    assert files.stat("cat/0.png") == stat and files.storage.requests["HEAD"] == 1
    with pytest.raises(OSError, match="No such file") as missing:
        files.read("cat/nope.png")
    assert missing.value.errno == 2


def test_the_cli_builds_from_a_bucket_with_storage_options(
    tree: Path, tmp_path: Path, s3: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = _raw(s3, tree)
    monkeypatch.delenv("AWS_ENDPOINT_URL")  # given as an option: the source's and OUT's
    option = ["--storage-option", f"endpoint_url={s3.endpoint}"]
    args = ["--size", "16x16", "--jobs", "1", "--quiet", "--exclude", EXCLUDE[0]]
    assert main(["build", url + "/", "out.zarr", *args, *option]) == 0
    assert main(["build", url, s3.url("out.zarr"), *args, *option]) == 0
    assert len(dlpack.open("out.zarr")) == 7
    assert main(["build", url, "other.zarr", *args]) != 0  # no endpoint: not this server


@pytest.mark.parametrize(
    ("out", "extra", "what"),
    [
        ("s.zarr", ["--update"], "--update of a store from a source in a bucket"),
        ("d", ["--format", "dldataset"], "--format dldataset from a source in a bucket"),
        ("s.zarr", ["--follow-symlinks"], "has no symbolic links"),
        ("{raw}", [], "OUT is SRC"),
        ("{raw}/out.zarr", [], "OUT is inside SRC"),
        ("{bucket}", [], "OUT contains SRC"),
    ],
)
def test_what_a_bucket_source_cannot_do_is_an_option_error(
    tree: Path, s3: Any, capsys: pytest.CaptureFixture[str], out: str, extra: list[str], what: str
) -> None:
    url = _raw(s3, tree)
    target = out.replace("{raw}", url).replace("{bucket}", s3.url())
    before = sorted(o.key for o in ObjectStorage(Location.parse(s3.url())).list())
    assert main(["build", url, target, "--size", "16x16", "--quiet", *extra]) == 2
    err = capsys.readouterr().err
    assert what in err and "Traceback" not in err, err
    assert sorted(o.key for o in ObjectStorage(Location.parse(s3.url())).list()) == before


def test_update_from_a_source_object_in_a_bucket_is_refused_as_from_its_url(tree: Path, s3: Any) -> None:
    url = _raw(s3, tree)
    dlpack.build(tree, "s.zarr", **KW, exclude=EXCLUDE)
    for src in (url, BucketFolderSource(Location.parse(url), exclude=EXCLUDE)):
        with pytest.raises(OptionError, match="--update of a store from a source in a bucket") as info:
            dlpack.build(src, "s.zarr", **KW, exclude=EXCLUDE, update=True)
        assert url in str(info.value)
    assert len(dlpack.open("s.zarr")) == 7
