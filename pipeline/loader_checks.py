"""What a :class:`~.loader.Loader` refuses or says before its first batch, in one place.

Every bad argument is a ``ValueError`` whose message names the value and the fix; a setting that
would train on nothing (a rank with no batch) is refused on every rank alike; a pack that stored
the images smaller than the Loader needs them is said once.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

from stoker.errors import ArgumentError, NoBatchError

from . import order
from .backends.registry import DECODES
from .dataloader_compat import habit_message
from .deps import has_cuda

if TYPE_CHECKING:
    from .loader import Loader

SHUFFLES = order.SHUFFLES
CPU_RESIZES = ("pillow", "dali")


def check_arguments(
    *,
    path: Any,
    remote: bool,
    batch_size: Any,
    channels: Any,
    decode: Any,
    cpu_resize: Any,
    threads: Any,
    prefetch: Any,
    shuffle: Any,
    block_shards: Any,
    cache_limit: Any,
    storage_options: Any,
    cache_dir: Any,
    hw_decoder_load: Any,
) -> None:
    """The Loader's scalar arguments, each a one-line ``ValueError`` when wrong."""
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ArgumentError(f"batch_size={batch_size!r} must be a positive integer")
    if channels not in (1, 3):
        raise ArgumentError(f"channels={channels!r} must be 3 (RGB) or 1 (grayscale)")
    if decode not in DECODES:
        raise ArgumentError(f"decode={decode!r} must be one of {DECODES}")
    if cpu_resize not in CPU_RESIZES:
        raise ArgumentError(f"cpu_resize={cpu_resize!r} must be one of {CPU_RESIZES}")
    if threads is not None and (not isinstance(threads, int) or threads < 0):
        raise ArgumentError(f"threads={threads!r} must be a non-negative integer")
    if not isinstance(prefetch, int) or prefetch < 1:
        raise ArgumentError(f"prefetch={prefetch!r} must be a positive integer")
    if isinstance(shuffle, bool):  # a DataLoader habit: the order is ours, not a flag
        raise ArgumentError(habit_message({"shuffle": shuffle}))
    if shuffle not in SHUFFLES:
        raise ArgumentError(f"shuffle={shuffle!r} must be one of {SHUFFLES}")
    if not isinstance(block_shards, int) or block_shards < 1:
        raise ArgumentError(f"block_shards={block_shards!r} must be a positive integer")
    if cache_limit is not None and (not isinstance(cache_limit, int) or cache_limit < 1):
        raise ArgumentError(f"cache_limit={cache_limit!r} must be a positive number of bytes")
    if not remote:
        given = [
            k
            for k, v in (("storage_options", storage_options), ("cache_dir", cache_dir), ("cache_limit", cache_limit))
            if v is not None
        ]
        if given:
            raise ArgumentError(f"{given[0]}= is for a URL (s3://, gs://, https://, file://); {path} is a local path")
    if not 0.0 <= float(hw_decoder_load) <= 1.0:
        raise ArgumentError(f"hw_decoder_load={hw_decoder_load!r} must be in [0, 1]")


def torch_device(device: Any):
    """``device`` as a ``torch.device``: the CPU or a CUDA device torch sees."""
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ArgumentError(f"device={device!r} is not a torch device") from None
    if dev.type not in ("cpu", "cuda"):
        raise ArgumentError(f"device={device!r}: only 'cpu' and 'cuda' are supported")
    if dev.type == "cuda" and not has_cuda():
        raise ArgumentError(f"device={device!r} but torch sees no CUDA device (use device='cpu')")
    return dev


def check_every_rank_has_a_batch(loader: Loader) -> None:
    """A rank with no batch would train or evaluate on nothing without a word (and leave
    DDP's collectives unmatched): refuse such settings on every rank alike."""
    last = loader.world_size - 1  # the rank with the smallest share
    share = loader._share(last)
    if order.num_batches(share, loader.batch_size, drop_last=loader.drop_last) > 0:
        return
    if share == 0:
        raise ArgumentError(
            f"world_size={loader.world_size} is larger than the {loader.num_samples} "
            f"loadable samples of {loader.path}: rank {last} would get none "
            f"(use fewer processes or a larger split)"
        )
    raise NoBatchError(
        share,
        f"batch_size={loader.batch_size} with drop_last=True leaves rank {last} no batch: "
        f"its share is {share} samples ({loader.num_samples} over world_size="
        f"{loader.world_size}); use batch_size<={share} or drop_last=False",
    )


def check_cache_limit(loader: Loader) -> None:
    """``cache_limit`` must hold what the loader pins at once: the whole split in global
    mode, the largest current + next window pair of this rank's first epoch in block mode."""
    limit, sizes = loader.cache.cache_limit, [s.bytes for s in loader.index.manifest.shards]
    if limit is None:
        return
    if loader.shuffle == "global":
        if sum(sizes) > limit:
            raise ArgumentError(
                f"cache_limit={limit:,} is smaller than {loader.path} ({sum(sizes):,} bytes), "
                "which shuffle='global' keeps cached whole: use shuffle='block' or a larger "
                "cache_limit"
            )
        return
    chunks = loader._chunks(loader._batches(0, loader._epoch_stop(), loader.indices(0)), 0)
    need = max(
        (
            sum(sizes[s] for s in set(a) | set(b))
            for (_, a), (_, b) in zip(chunks, chunks[1:] + [([], [])], strict=True)
        ),
        default=0,
    )
    if need > limit:
        raise ArgumentError(
            f"cache_limit={limit:,} is smaller than two windows of block_shards="
            f"{loader.block_shards} ({need:,} bytes of {loader.path}): raise cache_limit "
            "or lower block_shards"
        )


def check_stored_size(loader: Loader) -> None:
    """Say once when the pack stored the images smaller than this Loader needs them: every
    crop (train) or val image would be upsampled, which is almost always a mistake."""
    short = int(loader.index.manifest.pack.get("short_side") or 0)
    if not short:
        return
    crops = loader.crops
    if loader.train:
        need = min(crops.size)
    else:
        need = crops.val_resize or min(crops.size) / crops.crop_pct
    if need <= short:
        return
    what = "every crop is upsampled" if loader.train else "every val image is resized up"
    warnings.warn(
        f"stoker Loader {loader.path}: crop={loader.crop} needs a shorter side of {need:.0f}px, but the split was "
        f"packed with --short-side {short} (no stored image is larger): {what}; repack with --short-side "
        f"{int(-(-need // 1))} or more (0 keeps the original sizes)",
        UserWarning,
        stacklevel=4,
    )


__all__ = [
    "CPU_RESIZES",
    "DECODES",
    "SHUFFLES",
    "check_arguments",
    "check_cache_limit",
    "check_every_rank_has_a_batch",
    "check_stored_size",
    "torch_device",
]
