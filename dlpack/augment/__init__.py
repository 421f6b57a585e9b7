"""Augmentation variants of a store: the loader's view schedule (:mod:`dlpack.augment.schedule`)
and the batch source that serves them (:mod:`dlpack.augment.views`)."""
