"""docs/reliability.md names the tests behind each guarantee: every one it names must exist."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_test_the_reliability_page_names_exists() -> None:
    doc = (ROOT / "docs" / "reliability.md").read_text(encoding="utf-8")
    defined = set()
    for path in [*ROOT.glob("tests/**/*.py"), ROOT / "dlpack" / "testing.py"]:
        defined.update(re.findall(r"def (test_\w+)", path.read_text(encoding="utf-8")))
    named = {n for n in re.findall(r"\b(test_\w+)", doc) if not n.endswith(".py")}
    files = set(re.findall(r"(tests/[\w/]+\.py)", doc))
    named -= {Path(f).stem for f in files}
    assert named, "the page names no test"
    assert sorted(n for n in named if n not in defined) == []
    assert sorted(f for f in files if not (ROOT / f).exists()) == []
