"""The kill-point driver: a command killed right after each of its durable steps, then run again.

The durable steps are every ``os.replace``, ``os.rename``, ``renameat2`` and ``os.fsync`` call. A
driver process imports dlpack once, then per kill point forks a child that counts those calls and
kills itself right after the N-th, forks a plain child that reruns the same command, and records
the result. Every point of the command is covered, one per run, numbered in call order.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import dlpack

DRIVER = r"""
import hashlib, importlib, json, os, shutil, signal, sys
import cv2, h5py, numpy, zarr  # noqa: F401 - imported once, before any fork
import dlpack, dlpack.cli
b = importlib.import_module("dlpack.storage.publish")

cfg = json.loads(sys.argv[1])
template, work, out, args = cfg["template"], cfg["work"], cfg["out"], cfg["args"]
exec(cfg.get("preload") or "")  # what the command needs set up first (a test's config reader)


SIG = signal.SIGINT if cfg["signal"] == "INT" else signal.SIGKILL


def counting(n):
    calls = [0]
    steps = []
    def wrap(fn):
        def durable_step(*a, **k):
            result = fn(*a, **k)
            calls[0] += 1
            steps.append([fn.__name__, *map(str, a[:2])])
            if calls[0] == n:
                os.kill(os.getpid(), SIG)
            return result
        return durable_step
    os.replace, os.rename, os.fsync = wrap(os.replace), wrap(os.rename), wrap(os.fsync)
    b._renameat2 = wrap(b._renameat2)
    return calls, steps


def in_child(fn, log):
    # fn's JSON result through a pipe; its own output into the file ``log``.
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        try:
            result = fn()
        except BaseException as exc:
            result = {"error": repr(exc)}
        os.write(w, json.dumps(result).encode())
        os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 1 << 16):
        data += chunk
    os.close(r)
    _, status = os.waitpid(pid, 0)
    killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    return {"killed": killed, **(json.loads(data) if data else {})}


def run(n):
    calls, steps = counting(n) if n is not None else (None, None)
    rc = dlpack.cli.main(args)
    return {"rc": rc, "calls": calls[0] if calls else None, "steps": steps}


def files(root):
    if os.path.isfile(root):
        return {"": hashlib.sha256(open(root, "rb").read()).hexdigest()}
    found = {}
    for folder, _, names in os.walk(root):
        for name in names:
            p = os.path.join(folder, name)
            found[os.path.relpath(p, root)] = hashlib.sha256(open(p, "rb").read()).hexdigest()
    return found


def content():
    # What a reader sees: every array's bytes and the manifest, update times left out.
    with dlpack.open(out) as ds:
        r = ds.reader
        m = json.loads(r.manifest.to_json())
        arrays = {name: hashlib.sha256(numpy.ascontiguousarray(r.read_all(name)).tobytes()).hexdigest() if not spec.ragged
                  else [hashlib.sha256(r.read(name, i).tobytes()).hexdigest() for i in range(len(ds))]
                  for name, spec in r.arrays.items()}
    for entry in m.get("history", []):
        entry.pop("time", None)
    return {"arrays": arrays, "manifest": m}


def fresh():
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(template, work, symlinks=True)


def outcome():
    return {
        "files": files(out) if os.path.exists(out) else None,
        # Equal files are equal content: a reader is asked only where files may differ.
        "content": in_child(content, os.path.join(cfg["logs"], "content.log")) if cfg["content"] else None,
        "siblings": sorted(os.listdir(os.path.dirname(out))),
    }


fresh()
ref = in_child(lambda: run(0), os.path.join(cfg["logs"], "ref.log"))
results = {"ref": {**ref, **outcome(), "out": out, "args": args}, "points": []}
for n in range(1, (ref.get("calls") or 0) + 1):
    fresh()
    kill = in_child(lambda: run(n), os.path.join(cfg["logs"], f"kill-{n}.log"))
    again = in_child(lambda: run(None), os.path.join(cfg["logs"], f"rerun-{n}.log"))
    kill_log = open(os.path.join(cfg["logs"], f"kill-{n}.log"), errors="replace").read()[-2000:]
    point = {"n": n, "killed": kill["killed"], "kill": kill, "kill_log": kill_log, "rerun": again, **outcome()}
    point["rerun_log"] = open(os.path.join(cfg["logs"], f"rerun-{n}.log"), errors="replace").read()[-2000:]
    results["points"].append(point)
print(json.dumps(results))
"""


def drive(
    tmp_path: Path,
    template: Path,
    out_name: str,
    args: list[str],
    sig: str = "KILL",
    content: bool = False,
    preload: str = "",
) -> dict[str, Any]:
    """Run the driver: the reference run, then every kill point and its rerun (see the module docstring).

    ``preload``: Python the driver runs once, before the reference run (a test's config reader, say)."""
    work, logs = tmp_path / "work", tmp_path / "logs"
    logs.mkdir()
    out = work / out_name
    cfg = {
        "template": str(template),
        "work": str(work),
        "out": str(out),
        "logs": str(logs),
        "signal": sig,
        "content": content,
        "preload": preload,
        "args": [a.replace("{work}", str(work)) for a in args],
    }
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(dlpack.__file__).parents[1]), *sys.path])}
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, json.dumps(cfg)], capture_output=True, text=True, env=env, timeout=600
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result: dict[str, Any] = json.loads(done.stdout)
    return result
