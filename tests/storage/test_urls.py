"""A URL is never a local path: every command and call that reads or writes a store, a source or an
output refuses ``scheme://...`` (exit 2, naming it), and nothing named ``s3:`` is ever made. (A build
into ``s3://`` is tested in tests/storage/test_object_build.py; reading a store, ``dlpack.open``,
``info`` and ``verify``, in tests/read/test_object_reader.py.)"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import dlpack
from dlpack.cli import main
from dlpack.errors import OptionError

MakeTree = Callable[..., Path]
URL = "s3://bucket/prefix/x.zarr"


@pytest.fixture
def here(make_tree: MakeTree, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder of images and a store built from it, in the current folder (where a URL taken for a
    path would make its ``s3:`` folder)."""
    src = make_tree({f"c{k % 2}/{k}.png": "rgb" for k in range(6)})
    dlpack.build(src, tmp_path / "s.zarr", size=(16, 16), jobs=1, quiet=True)
    (tmp_path / "c.json").write_text(json.dumps({"mirror": "c"}), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    return src


@pytest.mark.parametrize(
    ("args", "what"),
    [
        (["build", "gs://bucket/raw/", "o.zarr", "--size", "16x16"], "the source"),
        (["build", "{src}", "s.zarr", "--update", "--size", "16x16", "--labels", "auto"], None),
        (["export", "s.zarr", "--to", "folders", "gs://bucket/out"], "the output"),
        (["augment", URL, "--augment", "2", "--augment-config", "c.json"], "the store"),
        (["preview", URL, "p.png"], "the store"),
        (["preview", "s.zarr", "https://example.org/p.png"], "the output"),
        (["tune", URL, "--step-ms", "5"], "the store"),
    ],
)
def test_a_url_is_refused_by_every_command_and_makes_no_folder(
    here: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], what: str | None
) -> None:
    argv = [a.replace("{src}", str(here)) for a in args]
    before = sorted(p.name for p in tmp_path.iterdir())
    rc = main(argv)
    err = capsys.readouterr().err
    if what is None:  # the control: the same command on local paths runs
        assert rc == 0, err
        return
    url = next(a for a in argv if "://" in a)
    assert rc == 2, err
    assert f"{what} {url!r} is a URL" in err and "local path" in err, err
    assert "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing made, no "s3:" folder


def test_a_url_is_refused_by_the_library(here: Path, tmp_path: Path) -> None:
    calls: list[Callable[[], object]] = [
        lambda: dlpack.add_array(URL, "w", np.zeros(6, np.float32)),
        lambda: dlpack.augment(URL, 2, "c.json"),
        lambda: dlpack.tune(URL, 5.0),
    ]
    for call in calls:
        with pytest.raises(OptionError, match=r"'s3://bucket/prefix/x.zarr' is a URL"):
            call()
    # A source URL is read from an s3:// bucket only (tests/sources/test_bucket_source.py); any other scheme is refused.
    with pytest.raises(OptionError, match=r"the source 'gs://bucket/raw' is a URL"):
        dlpack.build("gs://bucket/raw", "o.zarr", size=(16, 16), quiet=True)
    assert not (tmp_path / "s3:").exists() and not (tmp_path / "gs:").exists()
    assert len(dlpack.open("s.zarr")) == 6  # a local path still opens
