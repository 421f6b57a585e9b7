"""The version of dlpack, in one place: ``dlpack.__version__`` and every record that names the writer
(manifests, exports, bench reports, augmentation records) read it from here, and the package
modules import it without importing the package's ``__init__``."""

from __future__ import annotations

__version__ = "0.1.0"
