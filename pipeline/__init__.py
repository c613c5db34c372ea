"""The read side: shard format, sample order, and the fast :class:`Loader`."""

from stoker._lazy import lazy_exports
from stoker.errors import ManifestError

from .shards.manifest import FORMAT_VERSION, MANIFEST_NAME, Manifest, ShardInfo

# Loader pulls in numpy and torch: imported on first use, so `stoker --help` and the tools that
# only need the shard format start fast.
__getattr__, __dir__ = lazy_exports(__name__, {"Loader": "loader", "Source": "options"})


__all__ = ["FORMAT_VERSION", "MANIFEST_NAME", "Loader", "Manifest", "ManifestError", "ShardInfo", "Source"]
