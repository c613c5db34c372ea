"""The read side: shard format, sample order, and the fast :class:`Loader`."""

from .loader import Loader
from .manifest import FORMAT_VERSION, MANIFEST_NAME, Manifest, ManifestError, ShardInfo

__all__ = ["FORMAT_VERSION", "MANIFEST_NAME", "Loader", "Manifest", "ManifestError", "ShardInfo"]
