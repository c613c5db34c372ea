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
    """``π``: a bijection of ``[0, n)`` that depends only on ``(seed, epoch)`` (and ``stream``, a
    few integers naming one of many independent bijections of the same seed).

    >>> p = Permutation(10, seed=0, epoch=0)
    >>> sorted(p(np.arange(10)).tolist()) == list(range(10))
    True
    >>> int(p.inverse(p(np.array([7])))[0])
    7
    """

    def __init__(self, n: int, *, seed: int, epoch: int, stream: tuple[int, ...] = ()):
        if n < 1:
            raise ArgumentError(f"a permutation needs n >= 1, got {n}")
        self.n = int(n)
        bits = max(2, (self.n - 1).bit_length())
        self._hi_bits, self._lo_bits = bits // 2, bits - bits // 2
        self._lo_mask = np.uint64((1 << self._lo_bits) - 1)
        self._hi_mask = np.uint64((1 << self._hi_bits) - 1)
        # ``stream``: independent bijections of one (seed, epoch), e.g. a mix's slot and cycle
        entropy = [int(seed), int(epoch), 0xFE15, *(int(v) for v in stream)]
        self._keys = np.random.SeedSequence(entropy).generate_state(ROUNDS, np.uint64)

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


__all__ = ["Permutation", "ROUNDS"]
