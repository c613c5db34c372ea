"""Sample order: pure functions of ``(seed, epoch, rank, world, position)``, and the order object
a :class:`~stoker.pipeline.loader.Loader` holds (``shuffle=`` names it).

Training sees a fresh global permutation of all samples each epoch (not a shuffle
buffer), split across ranks so that the slices are disjoint and cover the epoch.
Validation keeps the stored order and gives every sample to exactly one rank.

The permutation is never built whole: it is a seeded bijection (:mod:`.permutation`) evaluated
at this rank's positions only, so a rank's cost is its share, and a resume anywhere is ``O(1)``.

Resuming on another number of ranks (elastic): ranks step in lockstep, so after ``p`` samples
per rank the ``W`` ranks of a split at ``offset`` have handed out exactly the epoch sequence's
``offset .. offset + W * p`` (the permutation's, in order). The rest of the epoch is the sequence
from there, split over the new ranks the way an epoch is (:func:`rank_indices` with ``offset``):
every sample not yet handed out once, none handed out twice; each rank gets the same count, the
last fewer than ``W'`` left out as an epoch leaves ``n % W`` out.

One module per order (:mod:`.global_order`, :mod:`.block`), on a base (:mod:`.base`: what an
order says, the batches of an epoch, the resume cursor and the checks of a state), with the
bijection behind the global order in :mod:`.permutation`.
"""

from __future__ import annotations

from .base import Cursor, EpochBatches, SampleOrder, non_negative, num_batches
from .block import (
    BlockOrder,
    block_plan,
    block_rank_range,
    block_samples_per_rank,
    block_shard_order,
)
from .global_order import PERMUTATION, GlobalOrder, epoch_permutation, rank_indices, samples_per_rank
from .permutation import Permutation

#: the orders by ``shuffle=`` name
ORDERS: dict[str, type[SampleOrder]] = {"global": GlobalOrder, "block": BlockOrder}
#: their names, what ``shuffle=`` and ``--shuffle`` take
SHUFFLES = tuple(ORDERS)


def make_order(shuffle: str, shard_counts, *, block_shards: int, **kw) -> SampleOrder:
    """The order ``shuffle`` names over ``shard_counts`` loadable samples per shard (``kw``:
    ``rank``, ``world_size``, ``train``, ``batch_size``, ``drop_last``)."""
    if shuffle == "block":
        return BlockOrder(shard_counts, block_shards=block_shards, **kw)
    return ORDERS[shuffle](shard_counts, **kw)


__all__ = [
    "ORDERS",
    "PERMUTATION",
    "SHUFFLES",
    "BlockOrder",
    "Cursor",
    "EpochBatches",
    "GlobalOrder",
    "Permutation",
    "SampleOrder",
    "block_plan",
    "block_rank_range",
    "block_samples_per_rank",
    "block_shard_order",
    "epoch_permutation",
    "make_order",
    "non_negative",
    "num_batches",
    "rank_indices",
    "samples_per_rank",
]
