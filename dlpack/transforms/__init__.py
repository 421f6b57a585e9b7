"""Image transforms: pure functions (:mod:`.functional`, :mod:`.geometric`), augmentation operations
as serialisable classes with a name registry (:mod:`.base`), their configs (:mod:`.config`) and the
loader's online layer (:mod:`.online`).

The names below are loaded on first use, so importing one submodule (the build's workers import
:mod:`.functional`) does not import the others. Reading ``REGISTRY``, ``Pipeline`` or
``transform_from_dict`` from here first registers every operation dlpack reads.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .albumentations import AlbumentationsEngine, is_albumentations, pipeline_from_albumentations
    from .base import (
        REGISTRY,
        Augmenter,
        OneOf,
        Pipeline,
        Targets,
        Transform,
        register,
        transform_from_dict,
        variant_rng,
    )
    from .config import AugmentConfig, load_config, read_operations, register_operations
    from .halcon_ops import pipeline_from_halcon
    from .online import OnlineAugment

#: Public name -> the submodule that defines it.
_LAZY: dict[str, str] = {
    "Targets": "base",
    "Transform": "base",
    "Pipeline": "base",
    "OneOf": "base",
    "REGISTRY": "base",
    "register": "base",
    "transform_from_dict": "base",
    "variant_rng": "base",
    "Augmenter": "base",
    "AugmentConfig": "config",
    "load_config": "config",
    "read_operations": "config",
    "register_operations": "config",
    "pipeline_from_halcon": "halcon_ops",
    "OnlineAugment": "online",
    "pipeline_from_albumentations": "albumentations",
    "is_albumentations": "albumentations",
    "AlbumentationsEngine": "albumentations",
}
#: Names whose use needs every operation registered.
_NEEDS_REGISTRY = frozenset({"REGISTRY", "Pipeline", "transform_from_dict"})

__all__ = [
    "Targets",
    "Transform",
    "Pipeline",
    "OneOf",
    "REGISTRY",
    "register",
    "transform_from_dict",
    "variant_rng",
    "Augmenter",
    "AugmentConfig",
    "load_config",
    "read_operations",
    "register_operations",
    "pipeline_from_halcon",
    "OnlineAugment",
    "pipeline_from_albumentations",
    "is_albumentations",
    "AlbumentationsEngine",
]


def __getattr__(name: str) -> Any:
    """Import the submodule behind a public name on first access and cache the name here."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name in _NEEDS_REGISTRY:
        importlib.import_module(".config", __name__).register_operations()
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
