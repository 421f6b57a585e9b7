"""Where a store's bytes go while it is written: the lock on an output path (:mod:`.lock`), the
journal a killed build resumes from (:mod:`.journal`), the stage-beside-and-rename-in publish
(:mod:`.publish`), array transactions on an existing store (:mod:`.transaction`) and the
spill columns of large builds (:mod:`.spill`); and the one block runner that build, ``--update``
and augment fan their blocks out through (:mod:`.runner`).

The build (``dlpack.pack``), the augmentation cache (``dlpack.variants``), ``add_array`` and the
exports all stand on this one copy.
"""

# The openers of stores in an object store (the writer of .site, the reader of .remote) are
# installed into the backends' registry (dlpack.backends.base.register_remote) when this package is
# first imported: the backends sit below the storage layer and import none of it.
from . import remote as _remote  # noqa: E402, F401
from . import site as _site  # noqa: E402, F401
