"""Augmentation config files: JSON or YAML, in albumentations' or HALCON's vocabulary.

An albumentations file is the ``to_dict`` document albumentations saves (``A.save``), recognised
by its ``__version__`` and ``transform`` keys; dlpack reads a core subset of its transforms itself,
or hands the whole document to albumentations (``engine="albumentations"``). Any other file is a
HALCON-style object of ``augment_dl_samples`` parameters (:mod:`.halcon_ops`). What a build
records is the file's text verbatim, its name and format, and the normalised operation list
(:meth:`AugmentConfig.manifest_record`, :meth:`AugmentConfig.operations`), so a store says exactly
what made its variants (docs/augment.md, "Config files").
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol

import numpy as np

from .._json import parse_json, read_text_file
from ..errors import ConfigError, MissingExtraError
from .base import Pipeline, Targets
from .engines import ENGINES

__all__ = ["AugmentConfig", "AugmentEngine", "load_config", "read_operations", "register_operations", "ENGINES"]

_FORMATS: dict[str, Literal["json", "yaml"]] = {".json": "json", ".yaml": "yaml", ".yml": "yaml"}


class AugmentEngine(Protocol):
    """Something that makes variants like a :class:`~dlpack.transforms.base.Pipeline` does."""

    engine: ClassVar[str]

    def __call__(self, t: Targets, rng: np.random.Generator) -> tuple[Targets, list[dict[str, Any]]]:
        """One variant of ``t`` and the record of what was applied, as :meth:`Pipeline.__call__`."""
        ...

    def to_dict(self) -> dict[str, Any]:
        """The operations as the manifest records them."""
        ...


@dataclass(frozen=True)
class AugmentConfig:
    """A read config: what makes the variants, and what the manifest records about the file.

    ``kind`` is the vocabulary (``"albumentations"`` or ``"halcon"``), ``format`` the file's
    (``"json"`` or ``"yaml"``), ``text`` the file's text exactly as read and ``name`` its file name.
    """

    augmenter: Pipeline | AugmentEngine
    kind: Literal["albumentations", "halcon"]
    format: Literal["json", "yaml"]
    text: str
    name: str

    @property
    def engine(self) -> str:
        """``"dlpack"``, or ``"albumentations"`` when albumentations runs the whole pipeline."""
        return str(self.augmenter.engine)

    def manifest_record(self) -> dict[str, str]:
        """The manifest's ``augment.config``: ``{"kind", "format", "text", "name"}``."""
        return {"kind": self.kind, "format": self.format, "text": self.text, "name": self.name}

    def operations(self) -> dict[str, Any]:
        """The normalised operation list (the manifest's ``augment.operations``)."""
        return self.augmenter.to_dict()


def register_operations() -> None:
    """Make every operation dlpack reads known to the registry (importing a module registers its
    operations), so reading a config or a manifest's operation list finds them all."""
    from . import halcon_ops, ops  # noqa: F401


def read_operations(d: Mapping[str, Any], where: str = "operations") -> Pipeline:
    """The pipeline of a manifest's ``augment.operations`` (:meth:`AugmentConfig.operations` output)."""
    register_operations()
    return Pipeline.from_dict(d, where)


def load_config(
    source: str | os.PathLike[str] | Mapping[str, Any], *, engine: str = "dlpack", task: str | None = None
) -> AugmentConfig:
    """Read an augmentation config: a ``.json``, ``.yaml`` or ``.yml`` file, or an object already read.

    ``engine="albumentations"`` delegates an albumentations document to albumentations itself
    (a HALCON-style config is refused: albumentations does not read it). ``task`` is the store's
    (:data:`dlpack.schema.TASKS`): HALCON's crop operations are refused for a store with labels
    that move unless the config sets ``"allow_crop_with_labels": true``. Every problem, an
    unreadable file, a syntax error (with its line), an unknown name, a bad value, is a
    :class:`~dlpack.errors.ConfigError` naming the file and the field.
    """
    if engine not in ENGINES:
        raise ConfigError(f"the augmentation engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    fmt: Literal["json", "yaml"] = "json"
    if isinstance(source, Mapping):
        doc: Any = source
        text, name, where = json.dumps(source, indent=2), "<object>", "the augmentation config"
    else:
        path = Path(source)
        name, where = path.name, str(path)
        suffix = path.suffix.lower()
        if suffix not in _FORMATS:
            raise ConfigError(f"{path}: an augmentation config is a .json, .yaml or .yml file")
        fmt = _FORMATS[suffix]
        text = _read_text(path)
        doc = _parse_yaml(text, path) if fmt == "yaml" else _parse_json(text, path)
    if not isinstance(doc, Mapping):
        raise ConfigError(f"{where}: an augmentation config is an object (a mapping), got {type(doc).__name__}")
    register_operations()
    if _is_albumentations(doc):
        from .albumentations import AlbumentationsEngine, pipeline_from_albumentations

        augmenter: Pipeline | AugmentEngine = (
            AlbumentationsEngine(doc, where) if engine == "albumentations" else pipeline_from_albumentations(doc, where)
        )
        return AugmentConfig(augmenter, "albumentations", fmt, text, name)
    if engine == "albumentations":
        raise ConfigError(
            f"{where}: --augment-engine albumentations runs an albumentations config (with '__version__' and "
            "'transform' keys); this is a HALCON-style one, which dlpack runs itself (engine dlpack)"
        )
    from .halcon_ops import pipeline_from_halcon

    return AugmentConfig(pipeline_from_halcon(doc, where, task=task), "halcon", fmt, text, name)


def _is_albumentations(doc: Mapping[str, Any]) -> bool:
    """An albumentations ``to_dict`` document has both keys (``is_albumentations`` says the same)."""
    return "__version__" in doc and "transform" in doc


def _read_text(path: Path) -> str:
    """The config's text, read as label files are (a regular file within the size limit, so a named
    pipe or a device is refused at once); kept exactly, for the manifest."""
    return read_text_file(path, str(path), ConfigError)


def _parse_json(text: str, path: Path) -> Any:
    return parse_json(text, str(path), ConfigError)


def _parse_yaml(text: str, path: Path) -> Any:
    try:
        import yaml
    except ImportError:
        raise MissingExtraError("yaml", "yaml", "a YAML augmentation config") from None
    try:
        return yaml.load(text, Loader=_strict_yaml_loader(yaml))  # noqa: S506 (a SafeLoader subclass)
    except _DuplicateKey as exc:
        raise ConfigError(f"{path}: {exc}; give each key once") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply to read") from None
    except ValueError as exc:  # PyYAML converts numbers with int(), which limits their digits
        raise ConfigError(f"{path}: holds a value Python cannot read: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{path}: {where}not valid YAML: {problem}") from None


class _DuplicateKey(ValueError):
    """A YAML mapping that names a key twice (PyYAML itself keeps the last one silently)."""


def _strict_yaml_loader(yaml: Any) -> Any:
    """PyYAML's safe loader, refusing a key given twice in one mapping, as the JSON reader does."""

    class StrictLoader(yaml.SafeLoader):  # type: ignore[misc]
        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            seen: set[Any] = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                if isinstance(key, (str, int, float, bool)) or key is None:
                    if key in seen:
                        mark = key_node.start_mark
                        raise _DuplicateKey(
                            f"line {mark.line + 1}, column {mark.column + 1}: the key {key!r} appears twice in one mapping"
                        )
                    seen.add(key)
            return super().construct_mapping(node, deep=deep)

    return StrictLoader
