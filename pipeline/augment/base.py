"""The base of every batch transform (:class:`BatchTransform`) and the argument checks they share.

Randomness: a transform draws, per sample, ``uniforms(ids, n, seed=stream_seed(seed, stream), epoch)``
columns, ``n`` fixed by its configuration, its column ranges assigned per purpose (documented on
each ``plan``). The stream name (the class name unless given) salts the seed, so two transforms
never share random numbers; a sample's parameters depend on ``(seed, epoch, id)`` alone.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from stoker.errors import ArgumentError

from .crops import uniforms
from .params import check_batch, stream_seed


class BatchTransform:
    """Base of the batch transforms: ``t(images, ids, seed=, epoch=, masks=None)``.

    ``images`` uint8 ``[N, 1 or 3, H, W]`` on any device and memory format (kept), ``ids`` the ``N``
    global sample positions. Returns the images, or ``(images, masks)`` when masks are given.
    """

    stream: str = ""

    def __call__(
        self, images: torch.Tensor, ids, *, seed: int, epoch: int, masks: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Augment a batch, each sample with the parameters its ``(seed, epoch, id)`` gives.

        Args:
            images: uint8 ``[N, 1 or 3, H, W]``, any device and memory format (kept); not modified.
            ids: ``N`` integer global sample positions (numpy, tensor or sequence).
            seed: the run's seed.
            epoch: the epoch.
            masks: optional uint8 ``[N, H, W]``, moved with the geometric ops (fill ``ignore_index``).

        Returns:
            The augmented images, or ``(images, masks)`` when masks are given.

        Example:
            >>> aug = build_augment("rand-m9-mstd0.5-inc1", reprob=0.25)
            >>> images = aug(images, batch_ids, seed=0, epoch=3)
        """
        ids = check_batch(images, ids, masks)
        for name, v in (("seed", seed), ("epoch", epoch)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise ArgumentError(f"{name} must be an int, got {v!r}")
        if len(ids) == 0:
            out, moved = images.clone(), None if masks is None else masks.clone()
        else:
            out, moved = self.apply(images, ids, seed=int(seed), epoch=int(epoch), masks=masks)
        if images.is_contiguous(memory_format=torch.channels_last) and not images.is_contiguous():
            out = out.contiguous(memory_format=torch.channels_last)
        return out if masks is None else (out, moved)

    def apply(self, images, ids, *, seed, epoch, masks):  # pragma: no cover - abstract
        raise NotImplementedError

    def _uniforms(self, ids: np.ndarray, n: int, seed: int, epoch: int) -> np.ndarray:
        return uniforms(ids, n, seed=stream_seed(seed, self.stream), epoch=epoch)


def _choice(u: np.ndarray, k: int) -> np.ndarray:
    return np.minimum((u * k).astype(np.int64), k - 1)


def _int(name: str, v, lo: int, hi: float = math.inf) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not lo <= v <= hi:
        raise ArgumentError(f"{name}={v!r} must be an integer in [{lo}, {hi}]")
    return int(v)


def _prob(name: str, v) -> float:
    if not isinstance(v, (int, float)) or not 0.0 <= v <= 1.0:
        raise ArgumentError(f"{name}={v!r} must be a probability in [0, 1]")
    return float(v)


__all__ = ["BatchTransform"]
