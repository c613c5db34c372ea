"""What a :class:`~.loader.Loader` refuses or says before its first batch, in one place.

Every bad argument is a ``ValueError`` whose message names the value and the fix; a setting that
would train on nothing (a rank with no batch) is refused on every rank alike; a pack that stored
the images smaller than the Loader needs them is said once. Each check takes the values it checks
(the order, the index, the crop recipe, ...), never the Loader: the loader imports this module.
"""

from __future__ import annotations

import warnings
from typing import Any

from stoker.errors import ArgumentError, NoBatchError

from . import order
from .augment import CropSpec
from .backends.registry import DECODES
from .deps import has_cuda
from .prefetch import group_by_window
from .shards.manifest import Manifest
from .shards.samples import SampleIndex

SHUFFLES = order.SHUFFLES


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


def rank_and_world(rank: Any, world_size: Any) -> tuple[int, int]:
    """``(rank, world_size)`` as given, else ``torch.distributed``'s when it is initialized, else
    ``(0, 1)``; an ``ArgumentError`` naming a bad one."""
    default_rank, default_world = 0, 1
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            default_rank, default_world = dist.get_rank(), dist.get_world_size()
    except ImportError:  # pragma: no cover
        pass
    rank = default_rank if rank is None else rank
    world_size = default_world if world_size is None else world_size
    if not isinstance(world_size, int) or world_size < 1:
        raise ArgumentError(f"world_size={world_size!r} must be a positive integer")
    if not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ArgumentError(f"rank={rank!r} must be in [0, world_size={world_size})")
    return rank, world_size


def train_for_split(train: bool | None, manifest: Manifest) -> bool:
    """``Loader(train=)``: as given, or (None) what the split is: ``stoker pack`` records
    ``pack.split`` (``val`` for ``OUT/val``), which takes the val transform (stored order, center
    crop, every sample once); a split its manifest does not name (foreign tars) is trained on."""
    if train is None:
        return manifest.pack.get("split", "train") == "train"
    return bool(train)


def check_every_rank_has_a_batch(sample_order: order.SampleOrder, *, num_samples: int, path: Any) -> None:
    """A rank with no batch would train or evaluate on nothing without a word (and leave
    DDP's collectives unmatched): refuse such settings on every rank alike (``sample_order``
    holds the world size, batch size and ``drop_last``; ``num_samples``: the split's loadable
    samples)."""
    world_size, batch_size = sample_order.world_size, sample_order.batch_size
    last = world_size - 1  # the rank with the smallest share
    share = sample_order.share(last)
    if order.num_batches(share, batch_size, drop_last=sample_order.drop_last) > 0:
        return
    if share == 0:
        raise ArgumentError(
            f"world_size={world_size} is larger than the {num_samples} "
            f"loadable samples of {path}: rank {last} would get none "
            f"(use fewer processes or a larger split)"
        )
    raise NoBatchError(
        share,
        f"batch_size={batch_size} with drop_last=True leaves rank {last} no batch: "
        f"its share is {share} samples ({num_samples} over world_size="
        f"{world_size}); use batch_size<={share} or drop_last=False",
    )


def check_cache_limit(
    limit: int | None, sample_order: order.SampleOrder, index: SampleIndex, *, seed: int, block_shards: int, path: Any
) -> None:
    """``cache_limit`` (``limit``) must hold what the loader pins at once: the whole split in global
    mode, the largest current + next window pair of this rank's first epoch in block mode."""
    sizes = [s.bytes for s in index.manifest.shards]
    if limit is None:
        return
    windows = sample_order.windows(seed, 0)
    if windows is None:
        if sum(sizes) > limit:
            raise ArgumentError(
                f"cache_limit={limit:,} is smaller than {path} ({sum(sizes):,} bytes), "
                "which shuffle='global' keeps cached whole: use shuffle='block' or a larger "
                "cache_limit"
            )
        return
    first = sample_order.batches(seed, 0, 0, 0, sample_order.stop(), index.valid_at)  # epoch 0
    chunks = group_by_window(list(first), windows, index)
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
            f"{block_shards} ({need:,} bytes of {path}): raise cache_limit "
            "or lower block_shards"
        )


def check_stored_size(crops: CropSpec, manifest: Manifest, *, train: bool, crop: Any, path: Any) -> None:
    """Say once when the pack stored the images smaller than the crop recipe ``crops`` needs them
    (``crop``: the size as the Loader was given it): every crop (train) or val image would be
    upsampled, which is almost always a mistake."""
    short = int(manifest.pack.get("short_side") or 0)
    if not short:
        return
    if train:
        need = min(crops.size)
    else:
        need = crops.val_resize or min(crops.size) / crops.crop_pct
    if need <= short:
        return
    what = "every crop is upsampled" if train else "every val image is resized up"
    warnings.warn(
        f"stoker Loader {path}: crop={crop} needs a shorter side of {need:.0f}px, but the split was "
        f"packed with --short-side {short} (no stored image is larger): {what}; repack with --short-side "
        f"{int(-(-need // 1))} or more (0 keeps the original sizes)",
        UserWarning,
        stacklevel=4,
    )


__all__ = [
    "DECODES",
    "SHUFFLES",
    "check_cache_limit",
    "check_every_rank_has_a_batch",
    "check_stored_size",
    "rank_and_world",
    "torch_device",
    "train_for_split",
]
