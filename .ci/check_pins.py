"""Check that the installed distributions are exactly the versions a constraints file pins.

Usage: python .ci/check_pins.py .ci/constraints-min.txt
Without this, a pin for a package nothing requires would be silently ignored by pip.
"""

from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path


def main(path: str) -> int:
    wrong = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)\s*==\s*(\S+)", line)
        if m is None:
            wrong.append(f"{line!r}: not a NAME==VERSION pin")
            continue
        name, pinned = m.groups()
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            installed = "not installed"
        print(f"{name:<24} {installed}")
        if installed != pinned:
            wrong.append(f"{name}: pinned {pinned}, installed {installed}")
    for w in wrong:
        print(f"check_pins: {w}", file=sys.stderr)
    return 1 if wrong else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
