"""Checking shards: ``stoker verify`` (:mod:`.command`: a pack's shards against their manifest)
and ``stoker index`` (:mod:`.indexing`: ``.idx`` files and a manifest for foreign tars); both
decode images the way the Loader does (:mod:`.imagecheck`)."""

from .command import VerifyResult, verify
from .indexing import IndexResult, index

__all__ = ["IndexResult", "VerifyResult", "index", "verify"]
