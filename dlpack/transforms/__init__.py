"""Image transforms: pure functions in :mod:`dlpack.transforms.functional`."""
