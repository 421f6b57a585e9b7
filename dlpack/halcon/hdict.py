"""DLDataset JSON -> HALCON dict: the logic of the ``to_hdict.py`` script an export writes.

The lines between the two ``script`` markers below are copied verbatim into ``OUT/to_hdict.py``
(with a ``main`` that imports HALCON), so the script a user runs and the direct ``.hdict`` write
of an export in a process where ``import halcon`` works are one code. Standard library only.
"""

# --- script begins ---
from __future__ import annotations

import os
from typing import Any

#: Per-sample keys whose values are tuples of reals (JSON may hold 3 for 3.0 after hand edits).
REAL_TUPLES = frozenset(
    {
        "bbox_row1",
        "bbox_col1",
        "bbox_row2",
        "bbox_col2",
        "bbox_row",
        "bbox_col",
        "bbox_phi",
        "bbox_length1",
        "bbox_length2",
    }
)
#: Keys whose values are tuples of integers (label ids).
INT_TUPLES = frozenset({"class_ids", "bbox_label_id"})
#: Keys whose values are tuples of strings.
STR_TUPLES = frozenset({"class_names"})
#: Top-level folders, resolved against the JSON file's folder unless asked not to.
DIR_KEYS = ("image_dir", "segmentation_dir", "anomaly_dir")


def _scalar(key: str, value: Any) -> int | float | str:
    """A builtin int, float or str, as HALCON's binding takes them (a bool is refused there)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"{key}: {value!r} is not an int, a real or a string")
    return value


def _tuple(key: str, value: Any, kind: type) -> tuple[Any, ...]:
    if not isinstance(value, list):
        raise ValueError(f"{key}: expected a list, got {value!r}")
    out = []
    for v in value:
        if isinstance(v, bool) or not isinstance(v, (int, float, str)):
            raise ValueError(f"{key}: {v!r} is not an int, a real or a string")
        if kind is not float and not isinstance(v, kind):
            raise ValueError(f"{key}: {v!r} is not {'an integer' if kind is int else 'a string'}")
        out.append(kind(v))
    return tuple(out)


def halcon_value(key: str, value: Any) -> Any:
    """The value ``set_dict_tuple`` gets for ``key``: label tuples as tuples of their type, other
    lists as tuples, scalars as builtin int/float/str."""
    if key in REAL_TUPLES:
        return _tuple(key, value, float)
    if key in INT_TUPLES:
        return _tuple(key, value, int)
    if key in STR_TUPLES:
        return _tuple(key, value, str)
    if isinstance(value, list):
        return tuple(_scalar(key, v) for v in value)
    return _scalar(key, value)


def halcon_values(doc: dict[str, Any], base: str | None = None) -> dict[str, Any]:
    """The DLDataset ``doc`` (parsed JSON) as HALCON wants it: a dict of builtin values and tuples,
    ``samples`` a tuple of such dicts. With ``base``, relative folders (``image_dir``, ...) are
    joined to it (HALCON resolves relative paths against its working folder, not the file's)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("samples"), list):
        raise ValueError("not a DLDataset: expected an object with a list 'samples'")
    out: dict[str, Any] = {}
    for key, value in doc.items():
        if key == "samples":
            samples = []
            for s in value:
                if not isinstance(s, dict):
                    raise ValueError(f"samples: {s!r} is not an object")
                samples.append({k: halcon_value(k, v) for k, v in s.items()})
            out[key] = tuple(samples)
        elif key in DIR_KEYS and base is not None and isinstance(value, str) and not os.path.isabs(value):
            out[key] = (base.rstrip("/") + "/" + value).rstrip("/") if value else base
        else:
            out[key] = halcon_value(key, value)
    return out


def to_halcon(ha: Any, values: dict[str, Any]) -> Any:
    """A HALCON dict handle holding ``values`` (from :func:`halcon_values`); nested dicts become
    dict handles, so ``samples`` is a tuple of handles."""
    d = ha.create_dict()
    for key, value in values.items():
        if isinstance(value, tuple) and value and all(isinstance(v, dict) for v in value):
            value = tuple(to_halcon(ha, v) for v in value)
        ha.set_dict_tuple(d, key, value)
    return d


# --- script ends ---

SCRIPT_MAIN = """

def main(argv: list[str] | None = None) -> int:
    import argparse
    import json
    import sys
    from pathlib import Path

    here = Path(__file__).resolve().parent
    p = argparse.ArgumentParser(description="Write the DLDataset dataset.json as a HALCON dict (.hdict).")
    p.add_argument("json", nargs="?", default=str(here / "dataset.json"), help="the DLDataset JSON (default: %(default)s)")
    p.add_argument("-o", "--output", help="the .hdict to write (default: dataset.hdict beside the JSON)")
    p.add_argument(
        "--relative-dirs",
        action="store_true",
        help="keep image_dir (and the label folders) relative; HALCON then resolves them against its working folder",
    )
    a = p.parse_args(argv)
    src = Path(a.json).resolve()
    try:
        doc = json.loads(src.read_text(encoding="utf-8"))
        values = halcon_values(doc, None if a.relative_dirs else src.parent.as_posix())
    except (OSError, ValueError) as exc:
        print(f"to_hdict.py: cannot read {src} as a DLDataset: {exc}", file=sys.stderr)
        return 2
    try:
        import halcon as ha
    except Exception as exc:  # the binding raises more than ImportError when no HALCON library loads
        print(
            "to_hdict.py needs HALCON's Python binding (pip install mvtec-halcon) and a HALCON installation with "
            f"a licence; import halcon fails here ({type(exc).__name__}: {exc})",
            file=sys.stderr,
        )
        return 2
    out = Path(a.output) if a.output else src.with_suffix(".hdict")
    ha.write_dict(to_halcon(ha, values), str(out), [], [])
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
"""

SCRIPT_HEAD = '''"""Write this DLDataset (dataset.json) as a HALCON dict, dataset.hdict, for read_dict.

Written by dlpack export. Run it with a Python that has HALCON's binding (import halcon) and a
HALCON installation: python to_hdict.py [dataset.json] [-o dataset.hdict] [--relative-dirs]
"""

'''


def script_text() -> str:
    """The text of ``to_hdict.py``: the lines between this module's script markers, and a main."""
    from pathlib import Path

    text = Path(__file__).read_text(encoding="utf-8")
    body = text.split("# --- script begins ---\n", 1)[1].split("# --- script ends ---\n", 1)[0]
    return SCRIPT_HEAD + body + SCRIPT_MAIN
