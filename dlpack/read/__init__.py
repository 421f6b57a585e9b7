"""The read side: a store opened (:mod:`.dataset`), its batches read ahead (:mod:`.loader`), and the
cached augmentation views the loader rotates through (:mod:`.views`, :mod:`.schedule`).

Nothing here imports the write side (``dlpack.pack``, ``dlpack.variants``): a training process
that only reads a store never loads the build pipeline.
"""
