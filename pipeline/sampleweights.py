"""Per-sample weights, drawn exactly (``Loader(split, balance="weights")``).

``stoker pack --weight-column COL`` stores each sample's weight in its ``json`` member. A
balanced split's quota of the epoch is cut over its samples by largest remainder of those
weights (:func:`exact_counts`: sample ``i`` is read exactly ``c_i`` times an epoch, every
epoch), and the samples of one count ``k`` form one slot of the mix's plan whose quota is
``k`` times its size: ``k`` whole cycles an epoch, so each of its samples exactly ``k`` times
(:class:`~.order.mix.MixPlan`; a sample whose count is 0 is not read). The weights are read once
per manifest into ``stoker.weights.<digest>.npy`` beside the table (memory-mapped after).
"""

from __future__ import annotations

import json

import numpy as np

from stoker.errors import ArgumentError

from .balance_tables import ClassSlots, cached_table
from .shards.samples import SampleIndex, open_split

WEIGHTS_NAME = "stoker.weights"
#: samples read at a time while reading the weights
_CHUNK = 65536


def sample_weights(index: SampleIndex) -> np.ndarray:
    """Each loadable sample's weight (float64, in loadable order), from its ``json`` member."""
    return cached_table(index, WEIGHTS_NAME, lambda: _read(index))


def _read(loader_index: SampleIndex) -> np.ndarray:
    index = open_split(loader_index.split_dir, with_json=True)  # the json members, located once
    try:
        return _weights_of(index)
    finally:
        index.close()


def _weights_of(index: SampleIndex) -> np.ndarray:
    out = np.empty(index.num_valid, np.float64)
    for lo in range(0, index.num_valid, _CHUNK):
        for k, g in enumerate(index.valid_at(np.arange(lo, min(lo + _CHUNK, index.num_valid))).tolist()):
            w = json.loads(index.meta(g) or b"{}").get("weight")
            if isinstance(w, bool) or not isinstance(w, (int, float)) or not 0 <= w < float("inf"):
                raise ArgumentError(
                    f"balance='weights' draws by the weights `stoker pack --weight-column` stores; sample "
                    f"{index.key(g)} of {index.split_dir} has {'none' if w is None else repr(w)}"
                )
            out[lo + k] = w
    return out


def exact_counts(total: int, weights: np.ndarray) -> np.ndarray:
    """``total`` cut over ``weights`` by largest remainder (vectorized: each the floor of its share,
    the rest one each to the largest remainders, ties to the earlier); the counts sum to
    ``total``. The same float operations on every rank, so every rank cuts the same counts."""
    w = np.asarray(weights, np.float64)
    whole = w.sum()
    if total and not whole > 0:
        raise ArgumentError("balance='weights': every sample's weight is 0")
    exact = total * w / whole if whole > 0 else np.zeros_like(w)
    counts = np.floor(exact).astype(np.int64)
    rest = total - int(counts.sum())
    rem = exact - counts
    if rest > 0:
        counts[np.argsort(-rem, kind="stable")[:rest]] += 1
    elif rest < 0:  # float rounding put a floor one over: taken back from the smallest remainders
        counts[np.argsort(np.where(counts > 0, rem, np.inf), kind="stable")[:-rest]] -= 1
    return counts


def weight_slots(index: SampleIndex, quota: int) -> tuple[ClassSlots, np.ndarray, np.ndarray]:
    """``(slots, sizes, quotas)`` of a weighted split: its samples grouped by their count of the
    epoch (one group per count ``k``, in increasing ``k``), each group's size and quota (``k``
    times its size)."""
    counts = exact_counts(quota, sample_weights(index))
    order = np.argsort(counts, kind="stable")
    order = order[counts[order] > 0]
    ks, sizes = np.unique(counts[order], return_counts=True)
    starts = np.concatenate([[0], np.cumsum(sizes)])
    return ClassSlots(starts, order), sizes, ks * sizes


__all__ = ["WEIGHTS_NAME", "exact_counts", "sample_weights", "weight_slots"]
