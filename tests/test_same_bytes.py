"""Restructuring the code never changes a store: the code of the commit before the restructuring
(one block runner, one spill column, one publish, the read side apart from the write side) and
today's code build, update, augment, extend and export the same sources into the same bytes.

The older code is taken from this checkout's git history (``git archive``) and run in its own
process beside today's; the test skips where there is no history (an sdist, a shallow clone).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
from io import BytesIO
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
#: The last commit before the restructuring of issue 24 (main at 1a0f4a4).
BASE = "1a0f4a49c0082bc22a87e170a2dcb154d746c058"
#: An ``--update`` records when it ran; the only bytes two equal updates may differ in.
_TIME = re.compile(rb'("time": ?\\?")[0-9T:+\-]{25}(\\?")')
#: HDF5 files that ``--update`` and ``add_array`` rewrote (compared object by object: see _hdf5_content).
UPDATED_HDF5 = {"plain.h5"}
#: ... and so does the digest of its manifest (the manifest itself is compared, its time aside).
_DIGEST = re.compile(rb'("manifest_sha256": ?\\?")[0-9a-f]{64}(\\?")')


def _base_code(dest: Path) -> Path | None:
    """The package as it was at BASE, unpacked into ``dest``; None without git or that history."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        return None
    got = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", BASE, "dlpack"], capture_output=True, timeout=120
    )
    if got.returncode != 0:
        return None
    with tarfile.open(fileobj=BytesIO(got.stdout)) as tar:
        tar.extractall(dest, filter="data")
    return dest


def _run(code: Path, cwd: Path, *args: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(code)}
    done = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{args} with the code in {code}:\n{done.stdout}\n{done.stderr}"


def _outputs(code: Path, work: Path, raw: Path, more: Path, labelled: Path) -> Path:
    """Every kind of output, written by the package found at ``code``, into ``work``."""
    work.mkdir()
    dl = ("-m", "dlpack")
    config = str(REPO / "examples" / "augment_halcon.json")
    _run(code, work, *dl, "build", str(raw), "plain.zarr", "--size", "24x24", "--jobs", "1", "--quiet")
    _run(code, work, *dl, "build", str(raw), "plain.h5", "--size", "24x24", "--jobs", "2", "--quiet")
    _run(code, work, *dl, "build", str(raw), "ragged.zarr", "--max-side", "32", "--quiet")
    for store in ("plain.zarr", "plain.h5"):
        _run(code, work, *dl, "build", str(more), store, "--size", "24x24", "--update", "--quiet")
    coco = f"coco:{labelled / 'annotations.json'}"
    _run(
        code, work, *dl, "build", str(labelled / "images"), "boxes.zarr", "--labels", coco, "--size", "32x32", "--quiet"
    )
    _run(code, work, *dl, "build", str(labelled / "images"), "boxes.h5", "--labels", coco, "--size", "32x32", "--quiet")
    for store in ("boxes.zarr", "boxes.h5"):
        _run(code, work, *dl, "augment", store, "--augment", "2", "--augment-config", config, "--quiet")
    add = (
        "import sys, numpy as np, dlpack; n = len(dlpack.open(sys.argv[1])); "
        "dlpack.add_array(sys.argv[1], 'weight', np.linspace(0, 1, n, dtype=np.float32))"
    )
    for store in ("plain.zarr", "plain.h5"):
        _run(code, work, "-c", add, store)
    _run(code, work, *dl, "export", "boxes.zarr", "--to", "coco", "coco-out")
    _run(code, work, *dl, "export", "boxes.zarr", "--to", "dldataset", "halcon-out")
    return work


#: The manifest's pixel statistics: since issue 27 computed from exact integer moments, not from
#: float sums over histograms, so their last digits may differ (docs/format.md, ``stats``).
_STATS = re.compile(rb'(\\?"(?:mean|std)\\?": ?\[)([^\]]*)(\])')


def _stats_digits(m: re.Match[bytes]) -> bytes:
    values = b", ".join(b"%.12g" % float(v) for v in m.group(2).split(b",") if v.strip())
    return m.group(1) + values + m.group(3)


def _normal(data: bytes) -> bytes:
    return _STATS.sub(_stats_digits, _DIGEST.sub(rb"\1<digest>\2", _TIME.sub(rb"\1<time>\2", data)))


def _hdf5_content(path: Path) -> bytes:
    """Every object of an HDF5 file (name, type, shape, values, attributes), times aside.

    An updated HDF5 file also keeps, in freed heap space, the manifest digests of its earlier
    generations, which hold the time of the update; what a reader can see is compared instead.
    """
    import h5py

    parts: list[bytes] = []
    with h5py.File(path, "r") as f:

        def attrs(obj: h5py.HLObject) -> None:
            for key in sorted(obj.attrs):
                value = obj.attrs[key]
                text = value.encode() if isinstance(value, str) else repr(value).encode()
                parts.append(key.encode() + b"=" + (b"<digest>" if key.endswith("manifest_sha256") else text))

        attrs(f)

        def visit(name: str, obj: h5py.HLObject) -> None:
            parts.append(name.encode())
            if isinstance(obj, h5py.Dataset):
                value = obj[()]
                parts.append(
                    f"{obj.dtype} {obj.shape}".encode() + (value if isinstance(value, bytes) else value.tobytes())
                )
            attrs(obj)

        f.visititems(visit)
    return _normal(b"\n".join(parts))


def _files(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): _hdf5_content(p) if p.name in UPDATED_HDF5 else _normal(p.read_bytes())
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_todays_code_writes_the_bytes_the_code_before_the_restructuring_wrote(tmp_path: Path) -> None:
    base = _base_code(tmp_path / "base")
    if base is None:
        pytest.skip("no git history here to take the earlier code from")
    sample = [sys.executable, "-m", "dlpack.sample"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    raw, labelled = tmp_path / "raw", tmp_path / "labelled"
    subprocess.run([*sample, str(raw), "--count", "30", "--size", "40", "--seed", "3"], check=True, env=env)
    subprocess.run([*sample, str(labelled), "--count", "12", "--size", "48", "--labels"], check=True, env=env)
    more = tmp_path / "more"
    shutil.copytree(raw, more)
    subprocess.run([*sample, str(more / "extra"), "--count", "6", "--size", "40", "--seed", "4"], check=True, env=env)

    # Both write in the same folder, one after the other: outputs may record their own paths.
    before = _files(_outputs(base, tmp_path / "work", raw, more, labelled))
    shutil.rmtree(tmp_path / "work")
    after = _files(_outputs(REPO, tmp_path / "work", raw, more, labelled))
    assert len(before) > 20 and any(name.endswith(".h5") for name in before)
    assert sorted(before) == sorted(after)
    differ = [name for name in before if before[name] != after[name]]
    assert not differ, f"files whose bytes changed: {differ}"
