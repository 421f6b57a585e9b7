"""CLI flags generated from the option dataclasses, and ``--json`` for every command that outputs data."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import subprocess
import sys
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import pytest

import dlpack
from dlpack import BenchOptions, BuildOptions
from dlpack.cli import add_option_arguments, main, make_parser, option_flag, options_from_args

Capsys = pytest.CaptureFixture[str]

# Each options class, its sub-command and the positionals that command needs.
COMMANDS: list[tuple[type, str, list[str]]] = [
    (BuildOptions, "build", ["SRC", "OUT"]),
    (BenchOptions, "bench", ["TARGET"]),
]
FIELDS = [(cls, cmd, pos, f) for cls, cmd, pos in COMMANDS for f in dataclasses.fields(cls)]
FIELD_IDS = [f"{cls.__name__}.{f.name}" for cls, _, _, f in FIELDS]


def _help(cmd: str, capsys: Capsys) -> str:
    capsys.readouterr()
    assert main([cmd, "--help"]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize(("cls", "cmd", "pos", "f"), FIELDS, ids=FIELD_IDS)
def test_every_option_field_has_a_documented_flag_or_says_it_has_none(
    cls: type, cmd: str, pos: list[str], f: dataclasses.Field[Any], capsys: Capsys
) -> None:
    flag = option_flag(f)
    if flag is None:
        assert f.metadata["cli"] is False
        return
    assert f.metadata.get("help"), f"{cls.__name__}.{f.name} has no help"
    assert re.search(rf"(^|[\s\[]){re.escape(flag)}([\s\]]|$)", _help(cmd, capsys), re.M), flag


@pytest.mark.parametrize(("cls", "cmd", "pos"), COMMANDS)
def test_an_empty_command_line_gives_the_dataclass_defaults(cls: type, cmd: str, pos: list[str]) -> None:
    ns = make_parser().parse_args([cmd, *pos])
    assert options_from_args(cls, ns) == cls()


def _token(tp: Any, default: Any, f: dataclasses.Field[Any]) -> tuple[list[str], Any]:
    """A command-line value different from the default, and the value the parser should make of it."""
    choices = f.metadata.get("choices")
    if f.metadata.get("repeat"):
        return ["some-text"], ["some-text"]  # a repeatable flag collects its texts in a list
    if callable(choices):
        value = next(v for v in choices() if v != default)
        return [str(value)], value
    if tp is bool:
        return [], True
    if typing.get_origin(tp) is Literal:
        value = next(v for v in typing.get_args(tp) if v != default and v is not None)
        return [str(value)], value
    if tp is int:
        return [str((default or 0) + 7)], (default or 0) + 7
    if tp is float:
        return ["2.5"], 2.5
    return ["some-text"], "some-text"  # passed through for the dataclass to parse


@pytest.mark.parametrize(("cls", "cmd", "pos", "f"), [x for x in FIELDS if option_flag(x[3])], ids=FIELD_IDS)
def test_each_flag_reaches_its_field_with_the_fields_type(
    cls: type, cmd: str, pos: list[str], f: dataclasses.Field[Any]
) -> None:
    hints = typing.get_type_hints(cls)
    tp = hints[f.name]
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        tp = next(a for a in typing.get_args(tp) if a is not type(None))
    tokens, expected = _token(tp, f.default, f)
    ns = make_parser().parse_args([cmd, *pos, str(option_flag(f)), *tokens])
    assert getattr(ns, f.name) == expected and type(getattr(ns, f.name)) is type(expected)
    # Only the given flag is in the namespace: every other field keeps the dataclass default.
    assert [g.name for g in dataclasses.fields(cls) if hasattr(ns, g.name)] == [f.name]


def test_a_repeatable_flag_collects_every_use() -> None:
    ns = make_parser().parse_args(["build", "S", "O", "--exclude", "masks", "--exclude", "*_mask.*"])
    assert options_from_args(BuildOptions, ns).exclude == ("masks", "*_mask.*")


def test_a_literal_flag_gives_the_literal_value() -> None:
    ns = make_parser().parse_args(["build", "S", "O", "--channels", "1", "--size", "20x10"])
    opts = options_from_args(BuildOptions, ns)
    assert (opts.channels, opts.size) == (1, (20, 10))


def test_size_and_max_side_exclude_each_other(src: Path, tmp_path: Path, capsys: Capsys) -> None:
    assert main(["build", str(src), str(tmp_path / "o.zarr"), "--size", "8x8", "--max-side", "8"]) == 2
    err = capsys.readouterr().err
    assert "dlpack: error: give either size (WxH) or max_side, not both" in err
    assert not (tmp_path / "o.zarr").exists()


def test_a_non_integer_is_a_usage_error_naming_the_flag(capsys: Capsys) -> None:
    assert main(["build", "S", "O", "--jobs", "many"]) == 2
    assert "argument --jobs: must be an integer, got 'many'" in capsys.readouterr().err


def test_help_shows_the_dataclass_default(capsys: Capsys) -> None:
    text = " ".join(_help("build", capsys).split())
    assert f"(default: {BuildOptions().max_pixels})" in text
    assert f"(default: {BuildOptions().compression})" in text


@dataclasses.dataclass(frozen=True)
class _Undocumented:
    documented: int = dataclasses.field(default=1, metadata={"help": "has help"})
    hidden: int = dataclasses.field(default=2, metadata={"cli": False})
    forgotten: int = 3


@dataclasses.dataclass(frozen=True)
class _OnByDefault:
    on: bool = dataclasses.field(default=True, metadata={"help": "cannot be turned off by store_true"})


def test_a_field_without_help_is_refused_at_parser_construction() -> None:
    with pytest.raises(TypeError, match=r"_Undocumented\.forgotten needs field metadata 'help'"):
        add_option_arguments(argparse.ArgumentParser(), _Undocumented)
    p = argparse.ArgumentParser()
    add_option_arguments(p, _Undocumented, skip={"forgotten"})
    assert options_from_args(_Undocumented, p.parse_args(["--documented", "5"])) == _Undocumented(documented=5)
    with pytest.raises(SystemExit):
        p.parse_args(["--hidden", "5"])


def test_a_bool_defaulting_to_true_is_refused() -> None:
    with pytest.raises(TypeError, match="must default to False"):
        add_option_arguments(argparse.ArgumentParser(), _OnByDefault)


@pytest.mark.slow
def test_commands_other_than_bench_do_not_load_the_benchmark() -> None:
    root = str(Path(dlpack.__file__).resolve().parents[1])
    code = (
        "import sys; from dlpack.cli import make_parser; p = make_parser(); p.parse_args(['info', 'x']); "
        "p.parse_args(['build', 'a', 'b']); print('dlpack.bench' in sys.modules)"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert (proc.returncode, proc.stdout.strip()) == (0, "False"), proc.stderr


# ---------------------------------------------------------------- --json


@pytest.fixture
def src(make_tree: Callable[..., Path]) -> Path:
    return make_tree({"cat/0.png": "rgb", "cat/1.jpg": "rgb", "dog/2.png": "rgb"})


@pytest.fixture
def store(src: Path, tmp_path: Path) -> Path:
    out = tmp_path / "s.zarr"
    assert main(["build", str(src), str(out), "--size", "20x15", "--quiet", "--jobs", "1"]) == 0
    return out


def _json_run(argv: list[str], capsys: Capsys, code: int = 0) -> Any:
    capsys.readouterr()
    assert main(argv) == code
    return json.loads(capsys.readouterr().out)  # stdout holds the document and nothing else


def test_build_json(src: Path, tmp_path: Path, capsys: Capsys) -> None:
    out = tmp_path / "o.h5"
    doc = _json_run(["build", str(src), str(out), "--jobs", "1", "--json"], capsys)
    assert (doc["path"], doc["count"], doc["skipped"]) == (str(out), 3, [])
    assert doc["output_bytes"] > 0 and doc["images_per_s"] > 0


def test_build_json_lists_skipped_inputs_and_exits_1(
    make_tree: Callable[..., Path], tmp_path: Path, capsys: Capsys
) -> None:
    bad = make_tree({"a/0.png": "rgb", "a/empty.png": b""}, "bad")
    argv = ["build", str(bad), str(tmp_path / "o.zarr"), "--on-error", "skip", "--jobs", "1", "--json"]
    doc = _json_run(argv, capsys, code=1)
    assert doc["count"] == 1 and [e["path"] for e in doc["skipped"]] == ["a/empty.png"]
    assert "empty file" in doc["skipped"][0]["reason"]


def test_info_json(store: Path, capsys: Capsys) -> None:
    doc = _json_run(["info", str(store), "--json"], capsys)
    assert (doc["count"], doc["classes"], doc["resolution"]) == (3, ["cat", "dog"], [20, 15])


def test_verify_json(store: Path, capsys: Capsys) -> None:
    doc = _json_run(["verify", str(store), "--json"], capsys)
    assert doc == {"store": str(store), "count": 3, "ok": True, "mismatched": [], "damaged": []}


def test_bench_json(store: Path, capsys: Capsys) -> None:
    argv = ["bench", str(store), "--samples", "4", "--repeat", "1", "--cache", "warm", "--order", "sequential",
            "--batch-size", "2", "--quiet", "--json"]  # fmt: skip
    doc = _json_run(argv, capsys)
    assert [(c["target"], c["order"], c["cache"]) for c in doc["cells"]] == [("s.zarr", "sequential", "warm")]
    assert doc["options"]["batch_size"] == 2


@pytest.mark.parametrize("cmd", ["build", "info", "verify"])
def test_json_file_writes_the_same_document_and_keeps_the_text_output(
    cmd: str, src: Path, store: Path, tmp_path: Path, capsys: Capsys
) -> None:
    file = tmp_path / "doc.json"
    target = [str(src), str(tmp_path / "b.zarr"), "--jobs", "1"] if cmd == "build" else [str(store)]
    capsys.readouterr()
    assert main([cmd, *target, "--json-file", str(file)]) == 0
    text = capsys.readouterr().out
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)  # the human-readable output, as without the flag
    doc = json.loads(file.read_text(encoding="utf-8"))
    assert doc["count"] == 3
    if cmd == "info":
        assert doc == _json_run(["info", str(store), "--json"], capsys)


def test_json_file_in_a_missing_folder_fails_before_the_work(src: Path, tmp_path: Path, capsys: Capsys) -> None:
    out = tmp_path / "o.zarr"
    assert main(["build", str(src), str(out), "--json-file", str(tmp_path / "no" / "d.json")]) == 2
    assert "does not exist" in capsys.readouterr().err and not out.exists()


def test_bench_hints_at_json_file_when_given_a_json_file_name(store: Path, tmp_path: Path, capsys: Capsys) -> None:
    assert main(["bench", "--json", str(tmp_path / "b.json"), str(store)]) == 2
    assert "--json-file FILE" in capsys.readouterr().err


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = make_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _typo(flag: str) -> str:
    """``flag`` with two neighbouring letters of its name swapped (``--size`` -> ``--szie``)."""
    name = flag[2:]
    k = next(i for i in range(1, len(name) - 1) if name[i] != name[i + 1] and "-" not in name[i : i + 2])
    return "--" + name[:k] + name[k + 1] + name[k] + name[k + 2 :]


@pytest.mark.parametrize("command", sorted(_subcommands()))
def test_a_flag_typo_gets_the_commands_usage_and_the_flag_it_resembles(command: str, capsys: Capsys) -> None:
    parser = _subcommands()[command]
    parser.format_usage()  # adds a command's generated flags
    argv = [command]
    for action in parser._actions:  # what the command requires, so that the typo is the only problem
        if not action.option_strings:
            argv.append("X")
        elif action.required:
            argv += [action.option_strings[0], str(action.choices[0]) if action.choices else "1"]
    flags = [f for a in parser._actions for f in a.option_strings if f.startswith("--") and f != "--help"]
    flag = max(flags, key=lambda f: (f not in ("--debug", "--json", "--json-file"), len(f)))  # its own, if any
    capsys.readouterr()
    assert main([*argv, _typo(flag), "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: dlpack {command} "), err
    assert f"dlpack {command}: error: unrecognized arguments: {_typo(flag)} 1; did you mean {flag}?" in err
    assert "Traceback" not in err


def test_size_typo_suggests_size_and_a_stray_argument_is_named(capsys: Capsys) -> None:
    assert main(["build", "SRC", "OUT", "--szie", "300x300"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: dlpack build ") and "did you mean --size?" in err
    assert main(["info", "S", "T"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: dlpack info ") and "unrecognized arguments: T" in err and "did you mean" not in err
