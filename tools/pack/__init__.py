"""``stoker pack``: an image folder, ``train/``+``val/`` tree, CSV, mask tree or parquet table into shards.

=================  ======================================================================
``api``            :func:`pack` and :func:`merge_parts`, the library functions
``options``        the groups of :func:`pack`'s settings: :class:`Reading`, :class:`Images`,
                   :class:`Shards`, :class:`Masks`, :class:`Ray`
``command``        the flags and ``main`` (its docstring is ``stoker pack --help``)
``sources``        the pack sources, readers in a registry: scan SRC, read an item's bytes
``sanitize``       one input's bytes → stored bytes (decode, upright, RGB, resize, encode)
``masks``          one mask → its stored PNG (the image's geometry, the mask rules)
``engine``         a (split, part): sanitize in a pool, write shards, restore damaged ones
``journal``        crash-safe progress, settings identity, the merge into manifests (with the
                   targets' statistics)
``remote``         a URL OUT: stage locally, upload as shards finish, manifests last
``ray_engine``     ``--engine ray``: the image work as Ray tasks, output byte-identical
``result``         :class:`PackResult`, what a pack reports
=================  ======================================================================
"""

from .api import merge_parts, pack
from .options import DEFAULT_SHARD_SIZE, Images, Masks, Ray, Reading, Shards
from .result import PackResult

__all__ = [
    "DEFAULT_SHARD_SIZE",
    "Images",
    "Masks",
    "PackResult",
    "Ray",
    "Reading",
    "Shards",
    "merge_parts",
    "pack",
]
