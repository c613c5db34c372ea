"""A seeded permutation of ``[0, n)`` evaluated where it is asked for, never materialized.

An epoch's global order is ``π(0), π(1), ..., π(n - 1)`` for a bijection ``π`` of ``(seed,
epoch)``. A rank reads ``π`` at its own positions only, so its cost is its share: a rank of W
over a billion samples evaluates a billion / W values, and a resume at position p starts there
(``O(1)``, no prefix to replay).

``π`` is a Feistel network with cycle walking (Black and Rogaway, "Ciphers with arbitrary finite
domains", 2002). The ``b = bit_length(n - 1)`` bits of a value are split into a high half of
``b // 2`` bits and a low half of the rest; each of :data:`ROUNDS` rounds XORs one half with a
keyed hash of the other (alternately), which is invertible whatever the hash, so the rounds are
a bijection of ``[0, 2^b)``. A value that lands at or past ``n`` is mapped again until it does
not: the result is a bijection of ``[0, n)`` (each cycle of the ``2^b`` bijection that meets
``[0, n)`` is walked inside it), and since ``2^b < 2n`` a value takes fewer than two rounds of
walking on average. The hash is splitmix64's finalizer; the round keys come from
``SeedSequence((seed, epoch))``.
"""

from __future__ import annotations

import numpy as np

from stoker.errors import ArgumentError

#: half-rounds (each half is rewritten ROUNDS / 2 times)
ROUNDS = 8
_M1, _M2, _GOLDEN = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB), np.uint64(0x9E3779B97F4A7C15)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)


def _mix(x: np.ndarray, key: np.uint64) -> np.ndarray:
    """splitmix64's finalizer of ``x ^ key`` (uint64 arithmetic wraps, as it should)."""
    z = (x ^ key) * _GOLDEN
    z ^= z >> _S30
    z *= _M1
    z ^= z >> _S27
    z *= _M2
    return z ^ (z >> _S31)


class Permutation:
    """``π``: a bijection of ``[0, n)`` that depends only on ``(seed, epoch)``.

    >>> p = Permutation(10, seed=0, epoch=0)
    >>> sorted(p(np.arange(10)).tolist()) == list(range(10))
    True
    >>> int(p.inverse(p(np.array([7])))[0])
    7
    """

    def __init__(self, n: int, *, seed: int, epoch: int):
        entropy = [int(seed), int(epoch), 0xFE15]
        self._domain(n, np.random.SeedSequence(entropy).generate_state(ROUNDS, np.uint64))

    def _domain(self, n: int, keys: np.ndarray) -> None:
        if n < 1:
            raise ArgumentError(f"a permutation needs n >= 1, got {n}")
        self.n = int(n)
        bits = max(2, (self.n - 1).bit_length())
        self._hi_bits, self._lo_bits = bits // 2, bits - bits // 2
        self._lo_mask = np.uint64((1 << self._lo_bits) - 1)
        self._hi_mask = np.uint64((1 << self._hi_bits) - 1)
        self._keys = keys

    @classmethod
    def with_keys(cls, n: int, keys: np.ndarray) -> Permutation:
        """The bijection of ``[0, n)`` of these round keys (a row of :func:`stream_keys`): what
        :func:`permute_many` computes for the elements of that row, with scalar keys (faster for
        many elements of few bijections)."""
        made = cls.__new__(cls)
        made._domain(n, keys)
        return made

    def _rounds(self, x: np.ndarray, keys) -> np.ndarray:
        lo_bits = np.uint64(self._lo_bits)
        hi, lo = x >> lo_bits, x & self._lo_mask
        for r, key in keys:
            if r % 2 == 0:
                hi = hi ^ (_mix(lo, key) & self._hi_mask)
            else:
                lo = lo ^ (_mix(hi, key) & self._lo_mask)
        return (hi << lo_bits) | lo

    def _walk(self, i, keys) -> np.ndarray:
        x = np.asarray(i, np.int64)
        if x.size and (x.min() < 0 or x.max() >= self.n):
            raise ArgumentError(f"positions must be in [0, {self.n})")
        y = self._rounds(x.astype(np.uint64), keys)
        out = y >= self.n
        while out.any():  # cycle walking: fewer than two passes per value on average
            y[out] = self._rounds(y[out], keys)
            out = y >= self.n
        return y.astype(np.int64)

    def __call__(self, i) -> np.ndarray:
        """``π(i)`` for every position in ``i`` (any shape), as int64."""
        return self._walk(i, list(enumerate(self._keys)))

    def inverse(self, j) -> np.ndarray:
        """``π⁻¹(j)``: the rounds backwards (each XOR undoes itself), walked the same way."""
        return self._walk(j, list(enumerate(self._keys))[::-1])


def stream_keys(seed: int, streams: np.ndarray) -> np.ndarray:
    """Round keys ``[len(streams), ROUNDS]`` of many independent bijections of one seed, one per
    ``streams`` value (uint64; a mix's slot and cycle packed): each key is the splitmix64
    finalizer of the stream keyed by a per-round key from ``SeedSequence((seed, tag))``."""
    base = np.random.SeedSequence([int(seed), 0x313C]).generate_state(ROUNDS, np.uint64)
    s = np.asarray(streams, np.uint64)[:, None]
    return _mix(_mix(s, base[None, :]), base[None, ::-1])


def permute_many(i, n, keys: np.ndarray, which=None) -> np.ndarray:
    """``π_e(i_e)`` for many bijections at once: element ``e`` in ``[0, n_e)`` by the Feistel
    network and cycle walking of :class:`Permutation` (the same rounds) with its own round keys
    ``keys[which[e]]`` (rows of :func:`stream_keys`; ``which`` default: row ``e``). Vectorized
    across bijections: a batch drawn from hundreds of slots costs one pass, not one per slot."""
    x = np.asarray(i, np.int64)
    n = np.broadcast_to(np.asarray(n, np.int64), x.shape)
    which = np.arange(len(x)) if which is None else np.asarray(which, np.int64)
    if x.size and (x.min() < 0 or np.any(x >= n)):
        raise ArgumentError("positions must be in [0, n) of their permutation")
    bits = np.maximum(2, np.frexp(np.maximum(n - 1, 0).astype(np.float64))[1])  # bit_length(n - 1), n < 2^53
    one = np.uint64(1)
    lo_bits = (bits - bits // 2).astype(np.uint64)
    lo_mask, hi_mask = (one << lo_bits) - one, (one << (bits // 2).astype(np.uint64)) - one
    n, y = n.astype(np.uint64), x.astype(np.uint64)
    todo = np.arange(len(y))
    while len(todo):  # cycle walking: fewer than two passes per value on average
        v, lb, k = y[todo], lo_bits[todo], which[todo]
        hi, lo = v >> lb, v & lo_mask[todo]
        for r in range(ROUNDS):
            if r % 2 == 0:
                hi = hi ^ (_mix(lo, keys[k, r]) & hi_mask[todo])
            else:
                lo = lo ^ (_mix(hi, keys[k, r]) & lo_mask[todo])
        y[todo] = (hi << lb) | lo
        todo = todo[y[todo] >= n[todo]]
    return y.astype(np.int64)


__all__ = ["Permutation", "ROUNDS", "permute_many", "stream_keys"]
