"""``dlpack.halcon``: everything HALCON in one place, each module in the layer it serves.

- :mod:`.source`: a HALCON DLDataset (``dataset.json``) as a build source (the sources layer);
- :mod:`.view`: a DLDataset opened read-only by ``dlpack.open``, without packing (the read side);
- :mod:`.export`, :mod:`.hdict`: a store written out as a DLDataset and its ``to_hdict.py`` (exports);
- :mod:`.feeder`: DLSample batches for a training loop, read ahead by the loader (an adapter).

The package itself imports none of them, so the sources layer can import :mod:`.source` without
pulling in the read side; the feeder's names are loaded from here on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .feeder import (
        DEFAULT_IMAGE_RANGE,
        TASKS,
        SampleBatches,
        import_halcon,
        sample_batches,
        scale_image,
        store_class_ids,
        store_task,
        to_dlsample,
        to_halcon_dict,
        unbatch,
    )

__all__ = [
    "DEFAULT_IMAGE_RANGE",
    "TASKS",
    "SampleBatches",
    "import_halcon",
    "sample_batches",
    "scale_image",
    "store_class_ids",
    "store_task",
    "to_dlsample",
    "to_halcon_dict",
    "unbatch",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module(".feeder", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
