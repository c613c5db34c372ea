"""The shard format, read and written in one place.

A split is a directory of WebDataset tar shards (``train-000000.tar`` ...), each with DALI's
``.idx`` beside it, and a ``stoker.json`` manifest that lists the shards with their sample
counts, sizes and sha256. ``stoker pack`` writes it through :class:`ShardWriter`,
``stoker index`` adds ``.idx`` and manifest to foreign tars, and the Loader reads it through
:mod:`.samples` (numpy; imported on use).

- :mod:`.writer`: :class:`ShardWriter`, one tar and its ``.idx`` in a single atomic pass.
- :mod:`.idx`: the ``.idx`` reader and writer, labels, and the tar scan behind ``stoker index``.
- :mod:`.manifest`: ``stoker.json``.
- :mod:`.samples`: random access to a split's samples by position, out of mmap'd tars.
"""

from stoker.errors import IdxFormatError, ManifestError

from .idx import IDX_VERSION, IMAGE_EXTS, MAX_CLASSES, Component, Sample, read_idx, write_idx
from .manifest import FORMAT_VERSION, MANIFEST_NAME, Manifest, ShardInfo, check_shards, idx_path
from .writer import ShardWriter, shard_name

__all__ = [
    "FORMAT_VERSION",
    "IDX_VERSION",
    "IMAGE_EXTS",
    "MANIFEST_NAME",
    "MAX_CLASSES",
    "Component",
    "IdxFormatError",
    "Manifest",
    "ManifestError",
    "Sample",
    "ShardInfo",
    "ShardWriter",
    "check_shards",
    "idx_path",
    "read_idx",
    "shard_name",
    "write_idx",
]
