"""The read side: shard format, sample order, and the fast :class:`Loader`."""

from stoker.errors import ManifestError

from .shards.manifest import FORMAT_VERSION, MANIFEST_NAME, Manifest, ShardInfo


def __getattr__(name: str):
    # Loader pulls in numpy and torch: imported on first use, so `stoker --help` and the
    # tools that only need the shard format start fast.
    if name == "Loader":
        from .loader import Loader

        return Loader
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["FORMAT_VERSION", "MANIFEST_NAME", "Loader", "Manifest", "ManifestError", "ShardInfo"]
