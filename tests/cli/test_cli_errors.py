"""What the ``dlpack`` command says when something goes wrong: an unexpected error is exit 3 with a hint
(its traceback only with ``--debug``), a store of someone else's is named as such, and names with
control characters are escaped on the terminal but exact in ``--json`` and in the library's errors."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import dlpack
from dlpack.cli import main
from dlpack.errors import BadInputsError

MakeTree = Callable[..., Path]
Capsys = pytest.CaptureFixture[str]
build_module = importlib.import_module("dlpack.pack")


# ---------------------------------------------------------------- unexpected errors: exit 3


@pytest.mark.parametrize("exc", [RuntimeError("boom"), KeyError("gone"), ZeroDivisionError("x")])
def test_unexpected_exceptions_exit_3_with_a_hint(
    make_tree: MakeTree, tmp_path: Path, capsys: Capsys, monkeypatch: pytest.MonkeyPatch, exc: Exception
) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise exc

    monkeypatch.setattr(build_module, "scan_stage", broken)
    src = make_tree({"a/0.png": "rgb"})
    assert main(["build", str(src), str(tmp_path / "o.zarr"), "--quiet", "--jobs", "1"]) == 3
    err = capsys.readouterr().err
    assert "internal error" in err and type(exc).__name__ in err and "report" in err and "--debug" in err
    assert "Traceback" not in err


def test_unexpected_exceptions_in_info_exit_3(tmp_path: Path, capsys: Capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("reader blew up")

    monkeypatch.setattr(importlib.import_module("dlpack.read.dataset"), "open", broken)
    assert main(["info", str(tmp_path / "x.zarr")]) == 3
    assert "reader blew up" in capsys.readouterr().err


def test_debug_shows_the_traceback_of_an_unexpected_exception(
    make_tree: MakeTree, tmp_path: Path, capsys: Capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("boom")

    monkeypatch.setattr(build_module, "scan_stage", broken)
    src = make_tree({"a/0.png": "rgb"})
    assert main(["--debug", "build", str(src), str(tmp_path / "o.zarr"), "--quiet", "--jobs", "1"]) == 3
    err = capsys.readouterr().err
    assert "Traceback" in err and "RuntimeError: boom" in err and "dlpack: internal error: RuntimeError" in err


# ---------------------------------------------------------------- not dlpack's, and hostile names


def test_a_plain_zarr_group_is_not_called_an_incomplete_dlpack_store(tmp_path: Path, capsys: Capsys) -> None:
    import zarr

    group = tmp_path / "theirs.zarr"
    zarr.open_group(str(group), mode="w", zarr_format=3).create_array("x", shape=(3,), dtype="u1")
    with pytest.raises(dlpack.errors.DlpackError, match="not a dlpack store") as info:
        dlpack.open(group)
    assert "overwrite" not in str(info.value) and "incomplete" not in str(info.value)
    assert main(["info", str(group)]) == 2
    err = capsys.readouterr().err
    assert "not a dlpack store" in err and "overwrite" not in err


RED = "\x1b[31m"


def test_control_characters_in_names_are_escaped_by_build(make_tree: MakeTree, tmp_path: Path, capsys: Capsys) -> None:
    src = make_tree({"a/0.png": "rgb", f"a/{RED}evil\u202e.png": b""})
    out = tmp_path / "o.zarr"
    assert main(["build", str(src), str(out), "--on-error", "skip", "--jobs", "1"]) == 1
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\u202e" not in err
    assert "\\x1b[31mevil\\u202e.png" in err
    capsys.readouterr()
    assert main(["info", str(out)]) == 0
    text = capsys.readouterr().out
    assert "\x1b" not in text and "\\x1b[31mevil" in text


def test_control_characters_in_error_messages_are_escaped(make_tree: MakeTree, tmp_path: Path, capsys: Capsys) -> None:
    src = make_tree({"a/0.png": "rgb", f"a/{RED}bad.png": b""})
    assert main(["build", str(src), str(tmp_path / "o.zarr"), "--jobs", "1"]) == 2
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\\x1b[31mbad.png" in err
    assert "\n" in err.strip()  # multi-line messages keep their line breaks


def test_json_output_keeps_names_exact(make_tree: MakeTree, tmp_path: Path, capsys: Capsys) -> None:
    import json

    src = make_tree({"a/0.png": "rgb", f"a/{RED}bad.png": b""})
    out = tmp_path / "o.zarr"
    assert main(["build", str(src), str(out), "--on-error", "skip", "--jobs", "1", "--json", "--quiet"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert [e["path"] for e in doc["skipped"]] == [f"a/{RED}bad.png"]


def test_bad_inputs_error_is_still_raised_by_the_library(make_tree: MakeTree, tmp_path: Path) -> None:
    src = make_tree({"a/0.png": "rgb", f"a/{RED}bad.png": b""})
    with pytest.raises(BadInputsError) as info:
        dlpack.build(src, tmp_path / "o.zarr", quiet=True, jobs=1)
    assert info.value.errors[0].path == f"a/{RED}bad.png"  # the library keeps the exact name
