"""Ctrl-C ends a build every time: SIGINT to the build's whole process group (what a terminal and
``timeout`` send) at a random moment, from its start-up to its end, on both pool paths.

Each interruption: exit 130 (0 when the build had finished), "dlpack: interrupted" with the resume
hint whenever a partial store was kept, no traceback, and no process of its group left once it has
exited. The next interruption is the same command again, so it resumes what the last one kept; every
few, a rerun is left to finish and its store verified. ``DLPACK_INTERRUPTS`` sets the count per path.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import dlpack
from dlpack.storage.lock import journal_path, partial_path

# Many real Ctrl-Cs at random moments, each a fresh build process. `make test-fast` leaves them out.
pytestmark = pytest.mark.slow

MakeTree = Callable[..., Path]

INTERRUPTS = int(os.environ.get("DLPACK_INTERRUPTS", "20"))
#: Seconds an interrupted build may take to exit: a hang guard, not a speed check.
HANG = 60


def _group(pgid: int) -> list[str]:
    """The processes (pid and command) of process group ``pgid`` still there.

    Left out: zombies, and processes past releasing their memory (an empty command line), whose
    exit is under way: the pool's resource trackers, say, which exit when the build's end closes
    the pipe they read, just as the stderr pipe this test reads to its end.
    """
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] not in "ZX" and cmd:
            found.append(f"{entry} {cmd}")
    return found


def _workers_at_exit(proc: subprocess.Popen[str], timeout: float) -> list[str] | None:
    """The pool workers of ``proc``'s group still there the moment ``proc`` exits (None: it did not
    exit within ``timeout``). ``proc`` is left unreaped meanwhile, as a caller reading its output to
    the end leaves it: an exited process then still answers a check that its pid exists."""
    deadline = time.monotonic() + timeout
    while proc.returncode is None and time.monotonic() < deadline:
        if os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
            return [p for p in _group(proc.pid) if "loky.backend.popen_loky_posix" in p]
        time.sleep(0.01)
    return [] if proc.returncode is not None else None


def _run(command: list[str], env: dict[str, str], delay: float | None) -> tuple[int, str, list[str]]:
    """Run ``command`` in a new session (its own process group); SIGINT the group after ``delay``.

    Returns its exit code, its stderr, and the processes of its group left once it exited: the
    pool workers still there the moment it exited, else those left once its stderr was closed.
    Its stderr is read as it comes (a full pipe would stop it); one that does not exit within
    :data:`HANG` is sent SIGABRT first, so that its threads' stacks (``PYTHONFAULTHANDLER``) end the
    failure's message.
    """
    proc = subprocess.Popen(
        command,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**env, "PYTHONFAULTHANDLER": "1"},
        start_new_session=True,
    )
    chunks: list[str] = []
    assert proc.stderr is not None
    reader = threading.Thread(target=lambda: chunks.append(proc.stderr.read()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    if delay is not None:
        try:
            proc.wait(delay)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGINT)
    workers = _workers_at_exit(proc, HANG)
    if workers is None:
        left = _group(proc.pid)
        os.kill(proc.pid, signal.SIGABRT)  # its stacks to stderr
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        reader.join(10)
        pytest.fail(f"the build did not exit within {HANG} s of its interrupt; its group: {left}; "
                    f"its stderr ends: {''.join(chunks)[-6000:]}")  # fmt: skip
    reader.join(HANG)
    proc.wait()
    return proc.returncode, "".join(chunks), workers or _group(proc.pid)


#: The installed package's folder: a traceback with no frame in it came from the interpreter's start.
PACKAGE = {str(Path(dlpack.__file__).parent) + os.sep, str(Path(dlpack.__file__).resolve().parent) + os.sep}


def _in_interpreter_start(err: str) -> bool:
    """Whether ``err`` is the interpreter's own report of an interrupt during its start-up (the
    ``site`` imports), which no Python program can catch: a KeyboardInterrupt with no frame of dlpack."""
    in_dlpack = any(folder in err for folder in PACKAGE)
    return "KeyboardInterrupt" in err and "Traceback" in err and not in_dlpack and "dlpack:" not in err


def _interrupt_builds(command: list[str], out: Path, jobs: int, count: int, seed: int) -> None:
    """Time one whole build of ``command``, then interrupt it ``count`` times at random moments."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(dlpack.__file__).parents[1]), *sys.path])}
    t0 = time.monotonic()
    rc, err, _ = _run(command, env, None)
    whole = time.monotonic() - t0  # the build's duration, start-up and exit included
    assert rc == 0, err
    shutil.rmtree(out)
    rng = random.Random(seed)
    interrupted = finished = 0
    for n in range(1, count + 1):
        delay = rng.uniform(0, whole)
        kept_before = os.path.lexists(partial_path(out))
        rc, err, left = _run(command, env, delay)
        where = f"interruption {n} at {delay:.2f} s of {whole:.2f} s (--jobs {jobs})"
        assert left == [], f"{where}: processes of its group outlived it: {left}"
        if _in_interpreter_start(err):
            # While the interpreter itself starts (its `site` imports, before any of dlpack runs):
            # Python's own KeyboardInterrupt, as for any Python program; nothing was written.
            assert not os.path.lexists(partial_path(out)) or kept_before, f"{where}: {err}"
            interrupted += 1
        elif "Traceback" in err or "Exception ignored" in err:
            pytest.fail(f"{where}: {err}")
        elif rc == 0:  # it finished before the interrupt
            finished += 1
        elif rc == -signal.SIGINT and not err:
            # Before the interpreter took Ctrl-C over (its first milliseconds): ended by the
            # signal's default action, as a shell reports it 130, with nothing written.
            interrupted += 1
        else:
            interrupted += 1
            assert rc == 130, f"{where}: exit {rc}: {err}"
            assert "dlpack: interrupted" in err, f"{where}: {err}"
            kept = journal_path(out).is_file() and os.path.lexists(partial_path(out))
            # Never a promise of a resume without a partial store to resume (one stopped while it
            # loads may say plain "interrupted" although an earlier run's partial is there).
            assert kept or "run the same command again to resume" not in err, f"{where}: {err}"
        if rc == 0 or n % 5 == 0 or n == count:
            # The same command resumes (or finds the store done) and the store verifies.
            if rc != 0 and out.exists() and not os.path.lexists(partial_path(out)):
                # Ctrl-C in its last moments, once the store was published (a rename of the whole
                # partial into place): the store is complete, and verified below.
                pass
            elif rc != 0:
                rc, err, left = _run(command, env, None)
                assert rc == 0 and left == [], f"{where}: the rerun: exit {rc}, left {left}: {err}"
            with dlpack.open(out) as ds:
                assert len(ds) == 150 and ds.verify() == [], where
            shutil.rmtree(out)
    assert interrupted >= count // 3, (interrupted, finished)  # resumed runs are shorter: some finish


def _build_args(src: Path, out: Path, jobs: int) -> list[str]:
    return ["build", str(src), str(out), "--size", "96x64", "--shard-bytes", "65536", "--jobs", str(jobs)]


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process groups from /proc")
@pytest.mark.parametrize("jobs", [1, 2])
def test_ctrl_c_ends_a_build_every_time(make_tree: MakeTree, tmp_path: Path, jobs: int) -> None:
    src = make_tree({f"c{k % 3}/{k:03d}.png": ("rgb", 160, 120) for k in range(150)})
    out = tmp_path / "out.zarr"
    command = [sys.executable, "-m", "dlpack", *_build_args(src, out, jobs)]
    _interrupt_builds(command, out, jobs, INTERRUPTS, seed=23 + jobs)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process groups from /proc")
def test_ctrl_c_ends_the_installed_dlpack_command_too(make_tree: MakeTree, tmp_path: Path) -> None:
    """The installed ``dlpack`` script, written here as pip writes it from the project's entry
    point, gets the same handling as ``python -m dlpack``, from its first import on."""
    import tomllib

    pyproject = Path(dlpack.__file__).parents[1] / "pyproject.toml"
    if not pyproject.is_file():
        pytest.skip("needs the project's pyproject.toml (a source checkout)")
    entry = tomllib.loads(pyproject.read_text())["project"]["scripts"]["dlpack"]
    module, _, func = entry.partition(":")
    script = tmp_path / "bin" / "dlpack"
    script.parent.mkdir()
    script.write_text(f"import sys\nfrom {module} import {func}\nif __name__ == '__main__':\n    sys.exit({func}())\n")
    src = make_tree({f"c{k % 3}/{k:03d}.png": ("rgb", 160, 120) for k in range(150)})
    out = tmp_path / "out.zarr"
    command = [sys.executable, str(script), *_build_args(src, out, 2)]
    _interrupt_builds(command, out, 2, max(5, INTERRUPTS // 2), seed=7)
