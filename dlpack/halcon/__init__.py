"""``dlpack.halcon``: everything HALCON in one place, each module in the layer it serves.

- :mod:`.source`: a HALCON DLDataset (``dataset.json``) as a build source (the sources layer);
- :mod:`.view`: a DLDataset opened read-only by ``dlpack.open``, without packing (the read side);
- :mod:`.export`, :mod:`.hdict`: a store written out as a DLDataset and its ``to_hdict.py`` (exports);
- :mod:`.feeder`: DLSample batches for a training loop, read ahead by the loader (an adapter).

The package itself imports none of them, so the sources layer can import :mod:`.source` without
pulling in the read side; the feeder's names are loaded from here on first use.
"""

from __future__ import annotations

from .feeder import *  # noqa: F403  (the feeder's public names, as its __all__ lists them)
from .feeder import __all__ as __all__
