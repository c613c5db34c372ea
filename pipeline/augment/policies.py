"""torchvision's augmentation policies on uint8 batches: :class:`RandAugment`,
:class:`TrivialAugmentWide` and :class:`AutoAugment` (ImageNet policy).

They use torchvision.transforms.v2's op sets, magnitude bins, signs and probabilities, every sample
with its own draws (see :mod:`.base`); the pixels come from :func:`~.ops.apply_ops`. The op tables
and :class:`_Layered`, the layer-by-layer policy base, are shared with :mod:`.timm_policies`.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from stoker.errors import ArgumentError

from .base import BatchTransform, _choice, _int
from .ops import apply_ops
from .params import Fill

_TV_RA_OPS = ("Identity", "ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness", "Color")
_TV_RA_OPS += ("Contrast", "Sharpness", "Posterize", "Solarize", "AutoContrast", "Equalize")
TV_AA_OPS = _TV_RA_OPS[1:] + ("Invert",)
_ENHANCE = {"Brightness": "brightness", "Color": "saturation", "Contrast": "contrast", "Sharpness": "sharpness"}
_GEOM = {"ShearX": "shear_x", "ShearY": "shear_y", "TranslateX": "translate_x", "TranslateY": "translate_y"}
_GEOM["Rotate"] = "rotate"
_PLAIN = {"AutoContrast": "autocontrast", "Equalize": "equalize", "Invert": "invert"}

# AutoAugment's ImageNet policy (arXiv:1805.09501): torchvision's IMAGENET and timm's "original"
# (timm names its Posterize "PosterizeOriginal"; the magnitudes of AutoContrast/Equalize/Invert are unused).
_AA_IMAGENET = (
    (("Posterize", 0.4, 8), ("Rotate", 0.6, 9)),
    (("Solarize", 0.6, 5), ("AutoContrast", 0.6, 5)),
    (("Equalize", 0.8, 8), ("Equalize", 0.6, 3)),
    (("Posterize", 0.6, 7), ("Posterize", 0.6, 6)),
    (("Equalize", 0.4, 7), ("Solarize", 0.2, 4)),
    (("Equalize", 0.4, 4), ("Rotate", 0.8, 8)),
    (("Solarize", 0.6, 3), ("Equalize", 0.6, 7)),
    (("Posterize", 0.8, 5), ("Equalize", 1.0, 2)),
    (("Rotate", 0.2, 3), ("Solarize", 0.6, 8)),
    (("Equalize", 0.6, 8), ("Posterize", 0.4, 6)),
    (("Rotate", 0.8, 8), ("Color", 0.4, 0)),
    (("Rotate", 0.4, 9), ("Equalize", 0.6, 2)),
    (("Equalize", 0.0, 7), ("Equalize", 0.8, 8)),
    (("Invert", 0.6, 4), ("Equalize", 1.0, 8)),
    (("Color", 0.6, 4), ("Contrast", 1.0, 8)),
    (("Rotate", 0.8, 8), ("Color", 1.0, 2)),
    (("Color", 0.8, 8), ("Solarize", 0.8, 7)),
    (("Sharpness", 0.4, 7), ("Invert", 0.6, 8)),
    (("ShearX", 0.6, 5), ("Equalize", 1.0, 9)),
    (("Color", 0.4, 0), ("Equalize", 0.6, 3)),
    (("Equalize", 0.4, 7), ("Solarize", 0.2, 4)),
    (("Solarize", 0.6, 5), ("AutoContrast", 0.6, 5)),
    (("Invert", 0.6, 4), ("Equalize", 1.0, 8)),
    (("Color", 0.6, 4), ("Contrast", 1.0, 8)),
    (("Equalize", 0.8, 8), ("Equalize", 0.6, 3)),
)


def tv_magnitudes(name: str, num_bins: int, height: int, width: int, *, wide: bool = False) -> np.ndarray | None:
    """torchvision's magnitude bins of op ``name`` (``_AUGMENTATION_SPACE``), computed as it computes
    them (float32 linspace), or ``None`` for ops without a magnitude. ``wide``: TrivialAugmentWide's."""
    lin = {"ShearX": 0.99 if wide else 0.3, "ShearY": 0.99 if wide else 0.3, "Rotate": 135.0 if wide else 30.0}
    lin.update(dict.fromkeys(_ENHANCE, 0.99 if wide else 0.9))
    lin["TranslateX"] = 32.0 if wide else 150.0 / 331.0 * width
    lin["TranslateY"] = 32.0 if wide else 150.0 / 331.0 * height
    if name in lin:
        return torch.linspace(0.0, lin[name], num_bins).double().numpy()
    if name == "Posterize":
        return (8 - (torch.arange(num_bins) / ((num_bins - 1) / (6 if wide else 4)))).round().int().double().numpy()
    if name == "Solarize":
        return torch.linspace(1.0, 0.0, num_bins).double().numpy()
    return None


def _tv_signed(name: str) -> bool:
    return name in _GEOM or name in _ENHANCE


def tv_kernels(names: np.ndarray, m: np.ndarray) -> tuple[list[str | None], np.ndarray]:
    """torchvision's ``_apply_image_or_video_transform``: op name + magnitude -> kernel + argument."""
    kernels: list[str | None] = [None] * len(names)
    args = np.zeros(len(names))
    for i, (name, v) in enumerate(zip(names, m, strict=True)):
        if name in _GEOM:
            kernels[i], args[i] = _GEOM[name], (math.trunc(v) if name.startswith("Translate") else v)
        elif name in _ENHANCE:
            kernels[i], args[i] = _ENHANCE[name], 1.0 + v
        elif name == "Posterize":
            kernels[i], args[i] = "posterize", math.trunc(v)
        elif name == "Solarize":
            kernels[i], args[i] = "solarize", 255 * v
        elif name in _PLAIN:
            kernels[i] = _PLAIN[name]
    return kernels, args


class _Layered(BatchTransform):
    """A policy whose :meth:`plan` returns, per layer, each sample's op name ("" = none) and argument."""

    def __init__(self, fill: Fill, ignore_index: int, stream: str):
        ops_fill = fill if fill is None or isinstance(fill, (int, float)) else tuple(fill)
        self.fill, self.ignore_index, self.stream = ops_fill, _int("ignore_index", ignore_index, 0, 255), stream

    def _kernels(self, layer: tuple, height: int, width: int):
        return tv_kernels(*layer)

    def apply(self, images, ids, *, seed, epoch, masks):
        _, _, h, w = images.shape
        for layer in self.plan(ids, seed=seed, epoch=epoch, height=h, width=w):
            kernels, kargs = self._kernels(layer, h, w)
            images, masks = apply_ops(
                images, kernels, kargs, fill=self.fill, masks=masks, ignore_index=self.ignore_index
            )
        return images, masks

    def plan(self, ids, *, seed: int, epoch: int, height: int, width: int) -> list[tuple[np.ndarray, ...]]:
        """Per layer: each sample's op name ("" = none) and signed magnitude (timm: level, negate)."""
        raise NotImplementedError  # pragma: no cover


class RandAugment(_Layered):
    """torchvision's ``RandAugment``: ``num_ops`` ops drawn uniformly (with repeats) from its 14, at bin
    ``magnitude`` of ``num_magnitude_bins``, signed ops negated with probability 1/2.

    Columns: ``2 * num_ops``: (op, sign) per layer.
    """

    def __init__(
        self,
        num_ops: int = 2,
        magnitude: int = 9,
        num_magnitude_bins: int = 31,
        *,
        fill: Fill = None,
        ignore_index: int = 255,
        stream: str = "RandAugment",
    ):
        super().__init__(fill, ignore_index, stream)
        self.num_ops = _int("num_ops", num_ops, 0)
        self.num_magnitude_bins = _int("num_magnitude_bins", num_magnitude_bins, 2)
        self.magnitude = _int("magnitude", magnitude, 0, self.num_magnitude_bins - 1)

    def plan(self, ids, *, seed, epoch, height, width):
        u = self._uniforms(ids, 2 * self.num_ops, seed, epoch)
        ops = np.asarray(_TV_RA_OPS)
        bins = [tv_magnitudes(o, self.num_magnitude_bins, height, width) for o in _TV_RA_OPS]
        table = np.asarray([[0.0] if b is None else [b[self.magnitude]] for b in bins])[:, 0]
        signed = np.asarray([_tv_signed(o) for o in _TV_RA_OPS])
        out = []
        for layer in range(self.num_ops):
            op = _choice(u[:, 2 * layer], len(ops))
            m = np.where(signed[op] & (u[:, 2 * layer + 1] <= 0.5), -table[op], table[op])
            out.append((ops[op], m))
        return out


class TrivialAugmentWide(_Layered):
    """torchvision's ``TrivialAugmentWide``: one op of its 14, a uniformly drawn bin of its wide ranges.

    Columns: 3: (op, bin, sign).
    """

    def __init__(
        self, num_magnitude_bins: int = 31, *, fill: Fill = None, ignore_index: int = 255, stream="TrivialAugmentWide"
    ):
        super().__init__(fill, ignore_index, stream)
        self.num_magnitude_bins = _int("num_magnitude_bins", num_magnitude_bins, 2)

    def plan(self, ids, *, seed, epoch, height, width):
        u = self._uniforms(ids, 3, seed, epoch)
        k = self.num_magnitude_bins
        ops = np.asarray(_TV_RA_OPS)
        bins = [tv_magnitudes(o, k, height, width, wide=True) for o in _TV_RA_OPS]
        table = np.asarray([np.zeros(k) if b is None else b for b in bins])
        signed = np.asarray([_tv_signed(o) for o in _TV_RA_OPS])
        op, b = _choice(u[:, 0], len(ops)), _choice(u[:, 1], k)
        m = table[op, b]
        return [(ops[op], np.where(signed[op] & (u[:, 2] <= 0.5), -m, m))]


class AutoAugment(_Layered):
    """torchvision's ``AutoAugment`` with its ImageNet policy: one of 25 sub-policies per sample,
    each of its two ops applied with its probability at its bin of 10.

    Columns: 5: (sub-policy, then (apply, sign) per op).
    """

    def __init__(
        self, policy: str = "imagenet", *, fill: Fill = None, ignore_index: int = 255, stream: str = "AutoAugment"
    ):
        super().__init__(fill, ignore_index, stream)
        name = getattr(policy, "value", policy)  # torchvision's AutoAugmentPolicy.IMAGENET works too
        if name != "imagenet":
            raise ArgumentError(f"AutoAugment policy={policy!r}: only 'imagenet' is implemented")
        self.policy = name

    def plan(self, ids, *, seed, epoch, height, width):
        u = self._uniforms(ids, 5, seed, epoch)
        sub = _choice(u[:, 0], len(_AA_IMAGENET))
        out = []
        for slot in range(2):
            rows = [_AA_IMAGENET[s][slot] for s in sub]
            names = np.asarray([r[0] for r in rows])
            on = u[:, 1 + 2 * slot] <= np.asarray([r[1] for r in rows])
            m = np.asarray([_tv_bin(r[0], r[2], height, width) for r in rows])
            neg = np.asarray([_tv_signed(r[0]) for r in rows]) & (u[:, 2 + 2 * slot] <= 0.5)
            out.append((np.where(on, names, ""), np.where(neg, -m, m)))
        return out


def _tv_bin(name: str, idx: int, height: int, width: int) -> float:
    bins = tv_magnitudes(name, 10, height, width)
    return 0.0 if bins is None else float(bins[idx])


__all__ = ["TV_AA_OPS", "AutoAugment", "RandAugment", "TrivialAugmentWide", "tv_kernels", "tv_magnitudes"]
