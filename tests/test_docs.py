"""Every code example in README.md and docs/*.md runs, as a reader would run it.

- A fenced ``python`` block is executed on its own, in a fresh folder holding ``raw/`` (a small
  sample source tree with class folders), ``sample/`` (the same images with their labels, as
  ``python -m dlpack.sample sample --labels`` writes them), ``examples/`` (the repository's example
  augmentation configs, as a reader in the repository's root has them) and the stores the docs read,
  ``train.zarr`` and ``train.h5`` (512x512, built from ``raw/``). A store the block builds itself is left out.
- In a shell block (no language, ``sh``, ``shell``, ``bash``, ``console``), every line that starts
  with ``dlpack `` (after an optional ``$ `` prompt) runs through ``dlpack.cli.main`` in order, in
  the same kind of folder, and must exit 0, or N when the line's comment says ``exit N``/``exits N``.
  Other lines (``make``, ``python ...``) are not run.
- A block that cannot run here is marked by an HTML comment on the line directly above its fence,
  ``<!-- not-run: REASON -->``; the reason is required. Its Python is still compiled.
- An example that imports a missing optional package (tensorstore, torch, matplotlib) is skipped.
- ``dlpack bench`` examples run with ``repeat=1`` and 16 samples per run (unless they set seconds),
  so they finish in seconds; every other option is as written.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

import dlpack
import dlpack.bench
import dlpack.cli
from dlpack.sample import make_sample

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL_LANGS = {"", "sh", "shell", "bash", "console"}
STORES = ("train.zarr", "train.h5")
QUICK_BENCH = {"repeat": 1, "samples": 16}
#: Optional packages an example may import; without them the example is skipped, not failed.
OPTIONAL = {"tensorstore", "torch", "matplotlib"}

_FENCE = re.compile(r"^```\s*([\w+-]*)\s*$")
_NOT_RUN = re.compile(r"^<!--\s*not-run\b:?\s*(.*?)\s*-->$")
_EXIT = re.compile(r"#.*\bexits? (\d+)\b")
_SHELL_BUILD = re.compile(r"^dlpack build\s+\S+\s+(\S+)")
_PY_BUILD = re.compile(r"""\bbuild\(\s*["'][^"']*["']\s*,\s*["']([^"']+)["']""")


@dataclass(frozen=True)
class Block:
    """One fenced code block of a document."""

    doc: str  # path relative to the repository
    line: int  # 1-based line of the opening fence
    lang: str
    text: str
    not_run: str | None  # the reason given in a not-run marker, "" when the marker has none

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"

    def commands(self) -> list[str]:
        """The ``dlpack ...`` command lines of a shell block (continuations joined, prompts removed)."""
        lines: list[str] = []
        pending = ""
        for raw in self.text.splitlines():
            line = pending + raw.strip()
            if line.endswith("\\"):
                pending = line[:-1] + " "
                continue
            pending = ""
            line = line.removeprefix("$ ")
            if line.startswith("dlpack "):
                lines.append(line)
        return lines

    def runnable(self) -> bool:
        return self.lang == "python" or (self.lang in SHELL_LANGS and bool(self.commands()))

    def built_stores(self) -> set[str]:
        """Store names this block builds itself (so the prepared folder must not hold them yet)."""
        if self.lang == "python":
            return {os.path.normpath(m) for m in _PY_BUILD.findall(self.text)}
        return {os.path.normpath(m.group(1)) for c in self.commands() if (m := _SHELL_BUILD.match(c))}


def parse(path: Path) -> list[Block]:
    """Every fenced block of a Markdown file, with the not-run marker directly above it."""
    doc = path.relative_to(ROOT).as_posix()
    lines = path.read_text(encoding="utf-8").splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start = i
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            i += 1
        if i == len(lines):
            raise AssertionError(f"{doc}:{start + 1}: code block never closed")
        above = _NOT_RUN.match(lines[start - 1].strip()) if start else None
        out.append(
            Block(
                doc, start + 1, m.group(1).lower(), "\n".join(lines[start + 1 : i]), above.group(1) if above else None
            )
        )
        i += 1
    return out


def _markers(path: Path) -> Iterator[tuple[int, str]]:
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if "not-run" in line and line.strip().startswith("<!--"):
            yield n, line


ALL_BLOCKS = [b for path in DOCS for b in parse(path)]
RUNNABLE = [b for b in ALL_BLOCKS if b.runnable()]


def test_docs_are_found_and_have_examples() -> None:
    assert {"README.md", "docs/format.md", "docs/loader.md", "docs/bench.md"} <= {b.doc for b in RUNNABLE}
    assert any(b.lang == "python" and b.not_run is None for b in RUNNABLE)
    assert any(b.lang in SHELL_LANGS and b.not_run is None for b in RUNNABLE)


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_not_run_marker_gives_a_reason_and_sits_on_a_block(path: Path) -> None:
    fences = {b.line for b in parse(path)}
    for n, line in _markers(path):
        m = _NOT_RUN.match(line.strip())
        assert m is not None, f"{path.name}:{n}: write the marker as <!-- not-run: REASON -->"
        assert m.group(1), f"{path.name}:{n}: a not-run marker needs a reason"
        assert n + 1 in fences, f"{path.name}:{n}: a not-run marker must sit directly above a code fence"


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``raw/`` (12 sample images, 4 classes, mixed formats, about 640 px), the stores built from it,
    ``sample/``: the same images with their labels (``python -m dlpack.sample sample --labels``), and
    ``examples/``: the repository's augmentation configs."""
    base = tmp_path_factory.mktemp("docs-base")
    make_sample(base / "raw", 12, size=640, seed=0)
    make_sample(base / "sample", 12, size=640, seed=0, labels=True)
    for name in STORES:
        dlpack.build(base / "raw", base / name, size=(512, 512), jobs=1, quiet=True)
    (base / "examples").mkdir()
    for config in sorted((ROOT / "examples").glob("augment_*")):
        shutil.copyfile(config, base / "examples" / config.name)
    return base


def _workspace(prepared: Path, dest: Path, block: Block) -> Path:
    """A fresh copy of the prepared folder (hard links: examples only read it), less what the block builds."""
    built = block.built_stores()
    for entry in prepared.iterdir():
        if entry.name in built:
            continue
        if entry.is_dir():
            shutil.copytree(entry, dest / entry.name, copy_function=os.link)
        else:
            os.link(entry, dest / entry.name)
    return dest


@pytest.fixture
def quick_bench(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every ``run_bench`` call (library or CLI) a quick one: one repeat of 16 samples."""
    real = dlpack.bench.run_bench

    def quick(targets: Any, options: Any = None, **kwargs: Any) -> Any:
        timed = kwargs.get("seconds") is not None or (options is not None and options.seconds is not None)
        over = {k: v for k, v in QUICK_BENCH.items() if not (k == "samples" and timed)}
        if options is not None:
            options = replace(options, **over)
            return real(targets, options, **kwargs)
        return real(targets, **{**kwargs, **over})

    for owner in (dlpack, dlpack.bench, dlpack.cli):
        monkeypatch.setattr(owner, "run_bench", quick, raising=owner is not dlpack.cli)


@pytest.mark.parametrize("block", [b for b in RUNNABLE if b.lang == "python"], ids=lambda b: b.id)
def test_python_blocks_compile(block: Block) -> None:
    compile(block.text, block.id, "exec")


def _measures(block: Block) -> bool:
    """An example that benchmarks or tunes runs for seconds: `make test-fast` leaves it out."""
    if block.lang == "python":
        return "dlpack.run_bench(" in block.text or "dlpack.tune(" in block.text
    return any(c.startswith(("dlpack bench ", "dlpack tune ")) for c in block.commands())


@pytest.mark.parametrize(
    "block",
    [pytest.param(b, marks=pytest.mark.slow) if _measures(b) else b for b in RUNNABLE if b.not_run is None],
    ids=lambda b: b.id,
)
def test_example_runs(
    block: Block, prepared: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, quick_bench: None
) -> None:
    ws = _workspace(prepared, tmp_path, block)
    monkeypatch.chdir(ws)
    if block.lang == "python":
        try:
            exec(compile(block.text, block.id, "exec"), {"__name__": "__doc_example__"})
        except ModuleNotFoundError as exc:
            if exc.name not in OPTIONAL:
                raise
            pytest.skip(f"needs the optional package {exc.name}")
        return
    for line in block.commands():
        m = _EXIT.search(line)
        expected = int(m.group(1)) if m else 0
        argv = shlex.split(line, comments=True)
        assert dlpack.cli.main(argv[1:]) == expected, f"{block.id}: {line!r} should exit {expected}"
