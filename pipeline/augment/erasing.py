"""timm's :class:`RandomErasing` on uint8 batches (before normalization), and the ImageNet mean and
std its colours are drawn in."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from stoker.errors import ArgumentError

from .base import BatchTransform, _choice, _int, _prob
from .crops import uniforms
from .params import normals, stream_seed

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class RandomErasing(BatchTransform):
    """timm's ``RandomErasing``, on uint8 images before normalization: with ``probability``, erase
    ``randint(min_count, max_count)`` boxes (10 tries each: area ``[min_area, max_area] / count``,
    log-uniform aspect, strictly inside the image).

    Fill, in timm's normalized space translated back with ``mean``/``std`` (0..1 units): ``const``
    is 0 there (the mean colour here), ``rand`` one normal colour per box, ``pixel`` normal per pixel.
    ``const`` and ``rand`` are pure functions of ``(seed, epoch, id)``. ``pixel`` noise comes from
    one torch.Generator per batch on the images' device, seeded from a hash of ``(seed, epoch, ids)``:
    deterministic on a given device (CPU and CUDA generators differ) and for a given batch.

    Columns: ``2 + 46 * max_count``: (apply, count), per box 40 tries (area, aspect, top, left)
    and 6 for its colour.
    """

    def __init__(
        self,
        probability: float = 0.5,
        *,
        min_area: float = 0.02,
        max_area: float = 1 / 3,
        min_aspect: float = 0.3,
        max_aspect: float | None = None,
        mode: str = "const",
        min_count: int = 1,
        max_count: int | None = None,
        mean: Sequence[float] = IMAGENET_MEAN,
        std: Sequence[float] = IMAGENET_STD,
        stream: str = "RandomErasing",
    ):
        self.probability = _prob("probability", probability)
        if not 0 < min_area <= max_area <= 1:
            raise ArgumentError(f"RandomErasing area ({min_area}, {max_area}) must satisfy 0 < min <= max <= 1")
        max_aspect = max_aspect or 1 / min_aspect if min_aspect > 0 else max_aspect
        if not (min_aspect > 0 and max_aspect and max_aspect >= min_aspect):
            raise ArgumentError(f"RandomErasing aspect ({min_aspect}, {max_aspect}) must satisfy 0 < min <= max")
        if mode not in ("const", "rand", "pixel"):
            raise ArgumentError(f"RandomErasing mode={mode!r}: expected 'const', 'rand' or 'pixel'")
        self.min_count = _int("min_count", min_count, 1)
        self.max_count = _int("max_count", max_count or min_count, self.min_count)
        self.area, self.log_aspect = (min_area, max_area), (math.log(min_aspect), math.log(max_aspect))
        self.mode, self.stream = mode, stream
        #: how const/rand boxes are filled: "auto" (slices on the CPU, one batched where on a
        #: GPU, where a launch per box costs more), "slices" or "where"; the pixels are the same
        self.fill = "auto"
        self.mean, self.std = np.asarray(mean, np.float64), np.asarray(std, np.float64)

    def plan(self, ids, *, seed: int, epoch: int, height: int, width: int) -> tuple[np.ndarray, np.ndarray]:
        """``boxes [N, max_count, 4]`` int64 ``(top, left, h, w)`` (h = 0: none) and ``z [N, max_count, 3]``
        the normal colours (``rand``)."""
        n, k = len(ids), self.max_count
        u = self._uniforms(ids, 2 + 46 * k, seed, epoch)
        on = u[:, 0] <= self.probability
        count = self.min_count + _choice(u[:, 1], k - self.min_count + 1)
        tries = u[:, 2 : 2 + 40 * k].reshape(n, k, 4, 10)
        area = (self.area[0] + tries[:, :, 0] * (self.area[1] - self.area[0])) * (height * width) / count[:, None, None]
        aspect = np.exp(self.log_aspect[0] + tries[:, :, 1] * (self.log_aspect[1] - self.log_aspect[0]))
        h, w = np.rint(np.sqrt(area * aspect)), np.rint(np.sqrt(area / aspect))
        ok = (w < width) & (h < height)
        first = ok.argmax(axis=2)[..., None]
        pick = lambda a: np.take_along_axis(a, first, axis=2)[..., 0]  # noqa: E731
        h, w = pick(h), pick(w)
        top = np.floor(pick(tries[:, :, 2]) * (height - h + 1))
        left = np.floor(pick(tries[:, :, 3]) * (width - w + 1))
        live = on[:, None] & ok.any(axis=2) & (np.arange(k)[None, :] < count[:, None])
        boxes = np.stack([top, left, np.where(live, h, 0), np.where(live, w, 0)], axis=-1).astype(np.int64)
        zc = u[:, 2 + 40 * k :].reshape(n, k, 2, 3)
        return boxes, normals(zc[:, :, 0], zc[:, :, 1])

    def apply(self, images, ids, *, seed, epoch, masks):
        if masks is not None:
            raise ArgumentError("RandomErasing does not apply to masks: erase images only (drop reprob for masks)")
        _, c, h, w = images.shape
        boxes, z = self.plan(ids, seed=seed, epoch=epoch, height=h, width=w)
        mean, std = (v if len(v) == c else np.full(c, v.mean()) for v in (self.mean, self.std))
        out = images.contiguous().clone()
        live = np.flatnonzero((boxes[..., 2] > 0).any(axis=1))  # only the rows that erase something
        if len(live) == 0:
            return out, masks
        slices = self.fill == "slices" or (self.fill == "auto" and images.device.type == "cpu")
        if self.mode != "pixel" and slices:
            return _fill_slices(out, boxes, self._colours(z, mean, std, c)), masks
        dev, n = images.device, len(live)
        idx = torch.as_tensor(live).to(dev)
        sub = out.index_select(0, idx)
        ys = torch.arange(h, device=dev).view(1, h, 1)
        xs = torch.arange(w, device=dev).view(1, 1, w)
        gen = _batch_generator(ids, seed, epoch, self.stream, dev) if self.mode == "pixel" else None
        for k in range(self.max_count):
            b = torch.as_tensor(boxes[live, k]).to(dev).view(n, 4, 1, 1)
            region = (ys >= b[:, 0]) & (ys < b[:, 0] + b[:, 2]) & (xs >= b[:, 1]) & (xs < b[:, 1] + b[:, 3])
            region = region.unsqueeze(1).expand(n, c, h, w)
            if gen is not None:
                noise = torch.randn(int(region.sum()), generator=gen, device=dev, dtype=torch.float64)
                mean_t, std_t = (torch.as_tensor(v, device=dev).view(1, c, 1, 1).expand_as(sub) for v in (mean, std))
                vals = (noise * std_t[region] + mean_t[region]) * 255.0
                sub.masked_scatter_(region, vals.round_().clamp_(0, 255).to(torch.uint8))
            else:
                colour = self._colours(z[live, k : k + 1], mean, std, c)[:, 0]
                sub = torch.where(region, torch.as_tensor(colour, dtype=torch.uint8).to(dev).view(n, c, 1, 1), sub)
        return out.index_copy_(0, idx, sub), masks

    def _colours(self, z: np.ndarray, mean: np.ndarray, std: np.ndarray, c: int) -> np.ndarray:
        """``[N, K, c]`` uint8-valued fill colours: the mean colour (``const``) or ``z``'s (``rand``)."""
        zk = z[..., :c] if self.mode == "rand" else np.zeros(z.shape[:-1] + (c,))
        return np.clip(np.rint((mean + std * zk) * 255.0), 0, 255)


def _fill_slices(out: torch.Tensor, boxes: np.ndarray, colours: np.ndarray) -> torch.Tensor:
    """Each live box filled with its colour in place, one slice at a time: on the CPU this
    touches only the boxes' pixels, where the batched ``where`` reads and writes the whole batch
    (measured 3x slower than torchvision's per-image erase at batch 256, 224^2)."""
    fill = torch.as_tensor(colours, dtype=torch.uint8)
    for i, k in zip(*np.nonzero(boxes[..., 2] > 0), strict=True):
        top, left, h, w = (int(v) for v in boxes[i, k])
        out[i, :, top : top + h, left : left + w] = fill[i, k].view(-1, 1, 1)
    return out


def _batch_generator(ids: np.ndarray, seed: int, epoch: int, stream: str, device) -> torch.Generator:
    key = uniforms(ids, 1, seed=stream_seed(seed, stream + ".pixels"), epoch=epoch)[:, 0]
    mixed = int(np.bitwise_xor.reduce((key * 2**53).astype(np.uint64) * np.uint64(2654435761)))
    gen = torch.Generator(device=device)
    gen.manual_seed(mixed & (2**63 - 1))
    return gen


__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "RandomErasing"]
