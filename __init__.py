"""stoker: keep the GPU fed.

Pack image folders into WebDataset shards (:func:`pack`), load them as uint8 batches on the
device with an exact, resumable, distributed order (:class:`Loader`), and normalize on the GPU
(:class:`Normalize`, :func:`with_normalize`).

>>> import stoker
>>> stoker.pack("photos/", "shards/", val_fraction=0.1)          # doctest: +SKIP
>>> stoker.pack("photos/", "small/", images=stoker.Images(short_side=128))  # doctest: +SKIP
>>> loader = stoker.Loader("shards/train", batch_size=256, device="cuda")  # doctest: +SKIP

The names here are what a user reaches for; each is imported on first use, so ``import
stoker`` (and ``stoker --help``) stays instant. The rooms behind them:

- :mod:`stoker.pipeline`: the shard format, sample order, augmentation, decode backends, the Loader;
- :mod:`stoker.model`: normalization, networks, training (:mod:`stoker.model.train`), checkpoints;
- :mod:`stoker.tools`: the ``stoker`` commands, one folder each, each a Python function;
- :mod:`stoker.errors`: every error, all derived from :class:`StokerError`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._lazy import lazy_exports
from .errors import (
    CheckFailedError,
    CheckpointError,
    InputsRejectedError,
    LoaderError,
    ManifestError,
    MissingExtraError,
    NoBatchError,
    StokerError,
    StorageError,
    TargetError,
    UsageError,
    WorkerDiedError,
)
from .version import __version__

_LAZY = {
    "Loader": "pipeline.loader",
    "Source": "pipeline.options",
    "Normalize": "model.normalize",
    "with_normalize": "model.normalize",
    "pack": "tools.pack.api",
    "merge_parts": "tools.pack.api",
    "Images": "tools.pack.options",
    "Masks": "tools.pack.options",
    "Ray": "tools.pack.options",
    "Reading": "tools.pack.options",
    "Shards": "tools.pack.options",
    "verify": "tools.verify.command",
    "index": "tools.verify.indexing",
}

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)


if TYPE_CHECKING:
    from .model.normalize import Normalize, with_normalize
    from .pipeline.loader import Loader
    from .pipeline.options import Source
    from .tools.pack.api import merge_parts, pack
    from .tools.pack.options import Images, Masks, Ray, Reading, Shards
    from .tools.verify.command import verify
    from .tools.verify.indexing import index

__all__ = [
    "CheckFailedError",
    "CheckpointError",
    "Images",
    "InputsRejectedError",
    "Loader",
    "LoaderError",
    "ManifestError",
    "Masks",
    "MissingExtraError",
    "NoBatchError",
    "Normalize",
    "Ray",
    "Reading",
    "Shards",
    "Source",
    "StokerError",
    "StorageError",
    "TargetError",
    "UsageError",
    "WorkerDiedError",
    "__version__",
    "index",
    "merge_parts",
    "pack",
    "verify",
    "with_normalize",
]
