"""Exit codes and streams a script can trust: each code the README lists, as the shell sees it
through ``python -m dlpack``, with stdout empty or one JSON document and stderr a ``dlpack: ...``
message without a traceback; and the CLI's boundary in-process (``--json`` failures, a closed
stdout, Ctrl-C, library warnings)."""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from _procs import INTERNAL_ERROR_MAIN

import dlpack
from dlpack.cli import main

Capsys = pytest.CaptureFixture[str]
MakeTree = Callable[..., Path]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(dlpack.__file__).parents[1]), *sys.path])}
TREE = {f"{'ab'[k % 2]}/{k}.png": ("rgb", 6, 5) for k in range(4)}


@pytest.fixture
def store(make_tree: MakeTree, tmp_path: Path) -> Path:
    out = tmp_path / "s.zarr"
    dlpack.build(make_tree(TREE), out, quiet=True, jobs=1)
    return out


def run(argv: list[str], code: str | None = None, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """``python -m dlpack ARGV`` (or ``python -c CODE ARGV``), as a script would run it."""
    head = ["-m", "dlpack"] if code is None else ["-c", code]
    return subprocess.run(
        [sys.executable, *head, *argv], capture_output=True, text=True, timeout=120, env=ENV, **kwargs
    )


def one_document(stdout: str) -> dict[str, Any]:
    """The one JSON document ``stdout`` holds (json.loads refuses anything after it)."""
    doc = json.loads(stdout)
    assert isinstance(doc, dict)
    return doc


def dlpack_message(stderr: str, lines: int | None = 1) -> str:
    """``stderr``, checked to be a ``dlpack: ...`` message (of ``lines`` lines), never a traceback."""
    assert "Traceback" not in stderr and stderr.startswith("dlpack: "), stderr
    if lines is not None:
        assert len(stderr.rstrip("\n").splitlines()) == lines, stderr
    return stderr


# ---------------------------------------------------------------- one real process per exit code


@pytest.mark.slow
def test_exit_0_prints_one_document_and_nothing_on_stderr(store: Path) -> None:
    proc = run(["info", str(store), "--json"])
    assert (proc.returncode, proc.stderr) == (0, "")
    assert one_document(proc.stdout)["count"] == 4


@pytest.mark.slow
def test_exit_1_is_a_build_that_skipped_inputs(make_tree: MakeTree, tmp_path: Path) -> None:
    src = make_tree({"a/0.png": "rgb", "a/empty.png": b""}, "bad")
    proc = run(["build", str(src), str(tmp_path / "o.zarr"), "--on-error", "skip", "--jobs", "1", "--json"])
    assert proc.returncode == 1, proc.stderr
    assert [e["path"] for e in one_document(proc.stdout)["skipped"]] == ["a/empty.png"]
    assert "dlpack: skipped 1 unreadable input(s):" in dlpack_message(proc.stderr, lines=None)


@pytest.mark.slow
def test_exit_2_is_a_usage_error_with_a_json_error_document(tmp_path: Path) -> None:
    missing = tmp_path / "missing.zarr"
    proc = run(["--debug", "info", str(missing), "--json"])  # --debug too: it never changes the code
    assert proc.returncode == 2
    assert one_document(proc.stdout) == {
        "error": {"type": "StoreNotFoundError", "message": f"no store at {str(missing)!r}", "exit_code": 2}
    }
    assert proc.stderr.rstrip("\n").splitlines()[-1] == f"dlpack: error: no store at {str(missing)!r}"
    plain = run(["info", str(missing)])
    assert (plain.returncode, plain.stdout) == (2, "")
    dlpack_message(plain.stderr)


@pytest.mark.slow
def test_exit_3_is_an_internal_error_with_a_json_error_document(make_tree: MakeTree, tmp_path: Path) -> None:
    code = INTERNAL_ERROR_MAIN
    proc = run(["build", str(make_tree(TREE)), str(tmp_path / "o.zarr"), "--jobs", "1", "--json"], code)
    assert proc.returncode == 3, proc.stderr
    assert one_document(proc.stdout)["error"] == {"type": "KeyError", "message": "KeyError: 'plan'", "exit_code": 3}
    err = dlpack_message(proc.stderr, lines=2)
    assert err.startswith("dlpack: internal error: KeyError") and "please report it" in err


@pytest.mark.slow
def test_exit_4_is_verify_finding_damage(store: Path) -> None:
    (store / "manifest.json").write_text("{ not json", encoding="utf-8")
    proc = run(["verify", str(store), "--json"])
    assert proc.returncode == 4, proc.stderr
    doc = one_document(proc.stdout)
    assert doc["ok"] is False and doc["store"] == str(store)
    assert str(store) in dlpack_message(proc.stderr, lines=None)


@pytest.mark.slow
def test_exit_141_or_0_when_stdout_is_closed_early(store: Path) -> None:
    """``dlpack bench ... | head -1``: a reader that went away ends the command quietly."""
    read, write = os.pipe()
    os.close(read)  # the reader has gone before the table is printed
    argv = ["bench", str(store), "--samples", "4", "--repeat", "1", "--cache", "warm", "--order", "sequential",
            "--batch-size", "2", "--quiet"]  # fmt: skip
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "dlpack", *argv],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            env=ENV,
        )
    finally:
        os.close(write)
    # The reader is gone before the first write, so the write fails: 141 (0 is for a reader that
    # had read all it wanted before going away, as `head -1` may).
    assert proc.returncode == 141, proc.stderr
    assert proc.stderr == ""


#: ``python -c PAUSED K ARGS``: the build's main thread pauses for good once its journal records K
#: blocks. ``--jobs 1`` journals on its writer thread while the main thread decodes the next block, so
#: the main thread (the one Ctrl-C reaches) pauses after that decode, once the writer has journalled K.
PAUSED = r"""
import importlib, runpy, sys, threading
b = importlib.import_module("dlpack.storage.journal")
w = importlib.import_module("dlpack.pack.write")
k = int(sys.argv[1])
del sys.argv[1:2]
reached = threading.Event()
append = b.Journal.append_block
def paused(self, *args, **kwargs):
    append(self, *args, **kwargs)
    if self.blocks >= k:
        reached.set()
        if threading.current_thread() is threading.main_thread():
            threading.Event().wait()
b.Journal.append_block = paused
decode = w.decode_fixed_block
decoded = [0]
def decode_then_pause(*args, **kwargs):
    out = decode(*args, **kwargs)
    decoded[0] += 1
    if decoded[0] > k:
        reached.wait()
        threading.Event().wait()
    return out
w.decode_fixed_block = decode_then_pause
runpy.run_module("dlpack", run_name="__main__", alter_sys=True)
"""


@pytest.mark.slow
def test_exit_130_is_ctrl_c_and_says_the_build_resumes(make_tree: MakeTree, tmp_path: Path) -> None:
    # 54 noise images of 40x30x3 (3600 bytes) in 64 KiB shards: 18 images a block, 3 blocks.
    src = make_tree({f"c{k % 2}/{k:02d}.png": "rgb" for k in range(54)})
    out = tmp_path / "o.zarr"
    args = ["build", str(src), str(out), "--jobs", "1", "--shard-bytes", "65536"]
    journal = out.parent / f".{out.name}.dlpack-journal"
    proc = subprocess.Popen(
        [sys.executable, "-c", PAUSED, "1", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    try:
        deadline = time.monotonic() + 120
        while journal.read_text(encoding="utf-8").count('"start"') < 1 if journal.exists() else True:
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "the build did not reach its first block"
            time.sleep(0.01)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait()
    assert proc.returncode == 130, stderr
    assert stdout == ""
    # Progress bars may precede it on stderr; the message is the last line, and no warning follows.
    assert stderr.rstrip("\n").splitlines()[-1] == "dlpack: interrupted; run the same command again to resume"
    assert "Traceback" not in stderr and "Warning" not in stderr
    again = run([*args, "--quiet", "--json"])
    assert again.returncode == 0, again.stderr
    assert one_document(again.stdout)["resume"] == "resumed: 1 of 3 blocks already written"


# ---------------------------------------------------------------- the boundary, in-process


@pytest.mark.parametrize("cmd", ["build", "info", "bench"])
def test_json_failures_print_one_error_document(cmd: str, tmp_path: Path, capsys: Capsys) -> None:
    missing = str(tmp_path / "missing")
    argv = {
        "build": ["build", missing, str(tmp_path / "o.zarr")],
        "info": ["info", missing],
        "bench": ["bench", missing],
    }
    code = main([*argv[cmd], "--json"])
    captured = capsys.readouterr()
    error = one_document(captured.out)["error"]
    assert code == 2 and error["exit_code"] == 2 and error["type"].endswith("Error")
    assert missing in error["message"] and error["message"] in captured.err


def test_a_json_usage_error_prints_one_error_document(capsys: Capsys) -> None:
    assert main(["info", "--json"]) == 2
    captured = capsys.readouterr()
    error = one_document(captured.out)["error"]
    assert (error["type"], error["exit_code"]) == ("UsageError", 2) and "store" in error["message"]
    assert "usage: dlpack info" in captured.err


def test_verify_json_prints_its_own_document_only(tmp_path: Path, capsys: Capsys) -> None:
    assert main(["verify", str(tmp_path / "missing.zarr"), "--json"]) == 2
    doc = one_document(capsys.readouterr().out)
    assert "error" not in doc and doc["ok"] is False


class _ClosedPipe:
    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self) -> None:
        raise BrokenPipeError(32, "Broken pipe")


def test_a_closed_stdout_ends_quietly_with_141(store: Path, capsys: Capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdout", _ClosedPipe())
    assert main(["info", str(store)]) == 141
    assert capsys.readouterr().err == ""


def test_a_broken_pipe_elsewhere_is_still_an_error(capsys: Capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only stdout's reader going away ends quietly; a worker's broken pipe is reported."""

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(importlib.import_module("dlpack.read.dataset"), "open", broken)
    assert main(["info", "x.zarr"]) == 2
    assert "Broken pipe" in dlpack_message(capsys.readouterr().err)


@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_ctrl_c_without_anything_to_resume_says_interrupted(
    json_flag: list[str], store: Path, capsys: Capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Library warnings of the cut-short work (joblib's "tasks ... cancelled") stay off the terminal."""

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        warnings.warn(
            "2 tasks which were still being processed by the workers have been cancelled. You could benefit "
            "from adjusting the input task iterator to limit unnecessary computation time.",
            UserWarning,
            stacklevel=1,
        )
        raise KeyboardInterrupt

    monkeypatch.setattr(importlib.import_module("dlpack.read.dataset"), "open", interrupted)
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        assert main(["info", str(store), *json_flag]) == 130
    assert shown == []
    captured = capsys.readouterr()
    assert captured.err == "dlpack: interrupted\n"
    if json_flag:
        assert one_document(captured.out)["error"] == {
            "type": "KeyboardInterrupt",
            "message": "interrupted",
            "exit_code": 130,
        }
    else:
        assert captured.out == ""


def test_ctrl_c_while_a_finished_build_prints_its_summary_says_the_store_is_complete(
    make_tree: MakeTree, tmp_path: Path, capsys: Capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not "interrupted" (exit 130), after which the same command refuses the store as existing."""
    from dlpack.building import BuildResult

    def interrupted(*args: Any, **kwargs: Any) -> str:
        raise KeyboardInterrupt

    monkeypatch.setattr(BuildResult, "summary", interrupted)
    out = tmp_path / "s.zarr"
    assert main(["build", str(make_tree(TREE)), str(out), "--jobs", "1"]) == 0
    assert capsys.readouterr().err == f"dlpack: interrupted, but {out} was already published and is complete\n"
    with dlpack.open(out) as ds:
        assert len(ds) == len(TREE) and ds.verify() == []


def test_ctrl_c_before_a_build_kept_a_partial_does_not_promise_a_resume(
    make_tree: MakeTree, tmp_path: Path, capsys: Capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(importlib.import_module("dlpack.pack"), "scan_stage", interrupted)
    assert main(["build", str(make_tree(TREE)), str(tmp_path / "o.zarr"), "--quiet", "--jobs", "1"]) == 130
    assert capsys.readouterr().err == "dlpack: interrupted\n"


@pytest.mark.parametrize("argv", [["--help"], ["verify", "--help"]])
def test_help_lists_the_damage_exit_code(argv: list[str], capsys: Capsys) -> None:
    assert main(argv) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "4 verify found damage" in out or "4 the store is damaged" in out
