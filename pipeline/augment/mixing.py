"""MixUp and CutMix with label smoothing on uint8 batches, as timm's ``timm.data.Mixup`` does.

The partner of row ``i`` is row ``N - 1 - i`` (the batch reversed, as timm). Lambda, the CutMix
switch and the box come from the counter hash of ``(seed, epoch, id)`` (stream ``Mixing``), so a
batch mixes the same way on every backend and after a resume: ``mode="batch"`` draws once from the
batch's first id, ``"pair"`` once per pair from its first row's id, ``"elem"`` once per row. Beta
samples are Marsaglia-Tsang gammas driven by those uniforms (vectorized, no per-row generator).

Images stay uint8: a MixUp blend is rounded to the nearest grey level, as timm's FastCollateMixup
does; soft targets are float32 ``[N, num_classes]`` and equal timm's ``mixup_target`` for the same
lambdas (CutMix's lambda corrected to the box area actually pasted).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from stoker.errors import ArgumentError

from .crops import uniforms
from .params import check_batch, normals, stream_seed

_TRIES = 12  # Marsaglia-Tsang accepts > 95% of tries for alpha >= 1: 12 all fail with p < 1e-15
_GAMMA_COLS = 3 * _TRIES + 1
_COLS = 2 + 4 * _GAMMA_COLS + 4  # apply, switch; two betas of two gammas; four for the box
MODES = ("batch", "pair", "elem")


def gamma(u: np.ndarray, alpha: float) -> np.ndarray:
    """Gamma(alpha, 1) samples, one per row of ``u`` ``[n, 3 * 12 + 1]`` uniforms (Marsaglia-Tsang;
    alpha < 1 by the ``U ** (1 / alpha)`` boost)."""
    a = alpha + 1.0 if alpha < 1.0 else alpha
    d = a - 1.0 / 3.0
    c = 1.0 / math.sqrt(9.0 * d)
    z = normals(u[:, :_TRIES], u[:, _TRIES : 2 * _TRIES])
    v = (1.0 + c * z) ** 3
    with np.errstate(invalid="ignore", divide="ignore"):
        ok = (v > 0) & (np.log1p(-u[:, 2 * _TRIES : 3 * _TRIES]) < 0.5 * z * z + d - d * v + d * np.log(v))
    first = ok.argmax(axis=1)
    g = np.where(ok.any(axis=1), d * v[np.arange(len(u)), first], d)  # all rejected: the mean (p < 1e-15)
    if alpha < 1.0:
        g = g * (1.0 - u[:, -1]) ** (1.0 / alpha)
    return g


def beta(u: np.ndarray, alpha: float) -> np.ndarray:
    """Beta(alpha, alpha) samples, one per row of ``u`` ``[n, 2 * 37]``."""
    g1, g2 = gamma(u[:, :_GAMMA_COLS], alpha), gamma(u[:, _GAMMA_COLS:], alpha)
    return g1 / np.maximum(g1 + g2, np.finfo(np.float64).tiny)


@dataclass(frozen=True)
class MixParams:
    """Per row: ``lam`` float32 (1: not mixed; CutMix: corrected to the box), ``cutmix`` bool and
    ``boxes`` int64 ``(y_lo, y_hi, x_lo, x_hi)`` (CutMix rows)."""

    lam: np.ndarray
    cutmix: np.ndarray
    boxes: np.ndarray


class Mixing:
    """timm's ``Mixup``: ``mix(images, targets, ids, seed=, epoch=) -> (images, soft_targets)``.

    Args:
        mixup_alpha: MixUp's Beta(alpha, alpha); active if > 0.
        cutmix_alpha: CutMix's Beta; active if > 0 (forced to 1 with ``cutmix_minmax``, as timm).
        cutmix_minmax: ``(lo, hi)`` box side fractions: a random rectangular box instead of lambda's.
        prob: probability of mixing a batch (``batch``), pair or row.
        switch_prob: probability of CutMix rather than MixUp when both are active.
        mode: ``batch``, ``pair`` or ``elem`` (see the module docstring).
        correct_lam: CutMix lambda from the box as clipped by the borders.
        label_smoothing: timm's: off value ``s / num_classes``, on value ``1 - s + s / num_classes``.
        num_classes: width of the soft targets.
    """

    def __init__(
        self,
        *,
        mixup_alpha: float = 1.0,
        cutmix_alpha: float = 0.0,
        cutmix_minmax: Sequence[float] | None = None,
        prob: float = 1.0,
        switch_prob: float = 0.5,
        mode: str = "batch",
        correct_lam: bool = True,
        label_smoothing: float = 0.1,
        num_classes: int = 1000,
        stream: str = "Mixing",
    ):
        for name, v, lo, hi in (
            ("mixup_alpha", mixup_alpha, 0.0, math.inf),
            ("cutmix_alpha", cutmix_alpha, 0.0, math.inf),
            ("prob", prob, 0.0, 1.0),
            ("switch_prob", switch_prob, 0.0, 1.0),
            ("label_smoothing", label_smoothing, 0.0, 1.0),
        ):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
                raise ArgumentError(f"Mixing {name}={v!r} must be a number in [{lo}, {hi}]")
        if cutmix_minmax is not None:
            if len(cutmix_minmax) != 2 or not 0.0 < cutmix_minmax[0] < cutmix_minmax[1] <= 1.0:
                raise ArgumentError(f"Mixing cutmix_minmax={cutmix_minmax!r} must be (lo, hi) with 0 < lo < hi <= 1")
            cutmix_alpha = 1.0
        if not (mixup_alpha > 0 or cutmix_alpha > 0):
            raise ArgumentError("Mixing needs mixup_alpha > 0, cutmix_alpha > 0 or cutmix_minmax")
        if mode not in MODES:
            raise ArgumentError(f"Mixing mode={mode!r}: expected one of {', '.join(MODES)}")
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
            raise ArgumentError(f"Mixing num_classes={num_classes!r} must be a positive integer")
        self.mixup_alpha, self.cutmix_alpha = float(mixup_alpha), float(cutmix_alpha)
        self.cutmix_minmax = None if cutmix_minmax is None else (float(cutmix_minmax[0]), float(cutmix_minmax[1]))
        self.prob, self.switch_prob, self.mode = float(prob), float(switch_prob), mode
        self.correct_lam, self.label_smoothing = bool(correct_lam), float(label_smoothing)
        self.num_classes, self.stream = num_classes, stream

    def sample(self, ids, *, seed: int, epoch: int, height: int, width: int) -> MixParams:
        """Each row's lambda, CutMix switch and box (see :class:`MixParams`)."""
        ids = np.asarray(ids, np.int64)
        n = len(ids)
        keys = {"batch": ids[:1], "pair": ids[: n // 2], "elem": ids}[self.mode]
        u = uniforms(keys, _COLS, seed=stream_seed(seed, self.stream), epoch=epoch)
        g = 2 * _GAMMA_COLS
        if self.mixup_alpha > 0 and self.cutmix_alpha > 0:
            cut = u[:, 1] < self.switch_prob
        else:
            cut = np.full(len(keys), self.cutmix_alpha > 0)
        lam_mix = beta(u[:, 2 : 2 + g], self.mixup_alpha) if self.mixup_alpha > 0 else np.ones(len(keys))
        lam_cut = beta(u[:, 2 + g : 2 + 2 * g], self.cutmix_alpha) if self.cutmix_alpha > 0 else np.ones(len(keys))
        on = u[:, 0] < self.prob
        # timm keeps lambda in float32 per element, in float64 for a whole batch
        lam = np.where(on, np.where(cut, lam_cut, lam_mix), 1.0)
        lam = lam if self.mode == "batch" else lam.astype(np.float32)
        cut &= on & (lam != 1.0)
        boxes, area = self._boxes(u[:, -4:], lam, height, width)
        if self.correct_lam or self.cutmix_minmax is not None:
            lam = np.where(cut, 1.0 - area / float(height * width), lam)
        lam, cut, boxes = lam.astype(np.float32), cut, np.where(cut[:, None], boxes, 0)
        if self.mode == "batch":
            lam, cut, boxes = np.repeat(lam, n), np.repeat(cut, n), np.repeat(boxes, n, axis=0)
        elif self.mode == "pair":  # row N-1-i is row i's partner and mixes with the same draw
            mid = [] if n % 2 == 0 else [0]
            lam = np.concatenate([lam, np.ones(len(mid), np.float32), lam[::-1]])
            cut = np.concatenate([cut, np.zeros(len(mid), bool), cut[::-1]])
            boxes = np.concatenate([boxes, np.zeros((len(mid), 4), np.int64), boxes[::-1]])
        return MixParams(lam, cut, boxes.astype(np.int64))

    def _boxes(self, u: np.ndarray, lam: np.ndarray, h: int, w: int) -> tuple[np.ndarray, np.ndarray]:
        """timm's ``rand_bbox`` (a box of area ``1 - lam``, centre anywhere, clipped) or
        ``rand_bbox_minmax``; returns ``[n, 4]`` ``(y_lo, y_hi, x_lo, x_hi)`` and the areas."""
        if self.cutmix_minmax is not None:
            lo_h, hi_h = int(h * self.cutmix_minmax[0]), int(h * self.cutmix_minmax[1])
            lo_w, hi_w = int(w * self.cutmix_minmax[0]), int(w * self.cutmix_minmax[1])
            if hi_h <= lo_h or hi_w <= lo_w:
                raise ArgumentError(f"cutmix_minmax={self.cutmix_minmax} leaves no box size for {h}x{w} images")
            ch = lo_h + (u[:, 0] * (hi_h - lo_h)).astype(np.int64)
            cw = lo_w + (u[:, 1] * (hi_w - lo_w)).astype(np.int64)
            yl = (u[:, 2] * (h - ch + 1)).astype(np.int64)
            xl = (u[:, 3] * (w - cw + 1)).astype(np.int64)
            yh, xh = yl + ch, xl + cw
        else:
            ratio = np.sqrt(1 - lam)  # float32 lam (elem, pair) keeps timm's float32 arithmetic here
            ch, cw = (h * ratio).astype(np.int64), (w * ratio).astype(np.int64)
            cy, cx = (u[:, 0] * h).astype(np.int64), (u[:, 1] * w).astype(np.int64)
            yl, yh = np.clip(cy - ch // 2, 0, h), np.clip(cy + (ch + 1) // 2, 0, h)
            xl, xh = np.clip(cx - cw // 2, 0, w), np.clip(cx + (cw + 1) // 2, 0, w)
        return np.stack([yl, yh, xl, xh], axis=1), (yh - yl) * (xh - xl)

    def __call__(
        self, images: torch.Tensor, targets, ids, *, seed: int, epoch: int, masks: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Mix a batch with its reverse.

        Args:
            images: uint8 ``[N, C, H, W]``, ``N`` even (timm's rule).
            targets: ``N`` integer class indices in ``[0, num_classes)``.
            ids: ``N`` integer global sample positions.
            seed: the run's seed.
            epoch: the epoch.
            masks: refused (ValueError): mixing has no meaning for segmentation masks here.

        Returns:
            ``(images, soft_targets)``: uint8 images in the input's memory format, float32
            ``[N, num_classes]`` targets on the images' device.

        Example:
            >>> mix = build_mixing(mixup=0.8, cutmix=1.0, label_smoothing=0.1, num_classes=1000)
            >>> images, soft = mix(images, labels, ids, seed=0, epoch=epoch)
        """
        if masks is not None:
            raise ArgumentError("MixUp/CutMix do not apply to masks: mix images and class targets only")
        ids = check_batch(images, ids)
        n, _, h, w = images.shape
        if n % 2:
            raise ArgumentError(f"MixUp/CutMix need an even batch size (timm's rule; use drop_last), got {n}")
        t = torch.as_tensor(targets)
        if t.shape != (n,) or (n and (t.dtype.is_floating_point or t.dtype == torch.bool or t.is_complex())):
            raise ArgumentError(f"targets must be {n} integer class indices, got {t.dtype} {tuple(t.shape)}")
        t = t.to(images.device, torch.int64)
        if n and (int(t.min()) < 0 or int(t.max()) >= self.num_classes):
            raise ArgumentError(
                f"targets must be class indices in [0, {self.num_classes}), got {int(t.min())}..{int(t.max())}"
            )
        p = self.sample(ids, seed=seed, epoch=epoch, height=h, width=w)
        out = torch.empty_like(images, memory_format=torch.contiguous_format)
        step = 8 if images.device.type == "cpu" else max(n, 1)  # CPU: cache-sized chunks, as ops.apply_ops
        for s in range(0, n, step):
            e = min(s + step, n)
            partner = images[n - e : n - s].flip(0)  # rows s..e-1 of the reversed batch
            out[s:e] = _mix_rows(images[s:e], partner, p.lam[s:e], p.cutmix[s:e], p.boxes[s:e])
        if images.is_contiguous(memory_format=torch.channels_last) and not images.is_contiguous():
            out = out.contiguous(memory_format=torch.channels_last)
        return out, self.targets(t, p.lam)

    def targets(self, targets: torch.Tensor, lam) -> torch.Tensor:
        """timm's ``mixup_target``: smoothed one-hot rows mixed with the reversed batch's by ``lam``."""
        off = self.label_smoothing / self.num_classes
        on = 1.0 - self.label_smoothing + off
        y = torch.full((len(targets), self.num_classes), off, device=targets.device)
        y.scatter_(1, targets.long().view(-1, 1), on)
        lam = torch.as_tensor(lam, dtype=torch.float32).to(targets.device).view(-1, 1)
        return y * lam + y.flip(0) * (1.0 - lam)


def _mix_rows(x: torch.Tensor, partner: torch.Tensor, lam: np.ndarray, cut: np.ndarray, boxes: np.ndarray):
    """MixUp rows: ``round(x * lam + partner * (1 - lam))`` (FastCollateMixup's rounding); CutMix rows:
    the partner inside the box. Rows with ``lam == 1`` come out as they are."""
    n, _, h, w = x.shape
    dev = x.device
    lam_t = torch.as_tensor(lam).to(dev).view(n, 1, 1, 1)
    mixed = (x.float() * lam_t).add_(partner.float() * (1.0 - lam_t)).round_().to(torch.uint8)
    b = torch.as_tensor(boxes).to(dev).view(n, 4, 1, 1)
    ys, xs = torch.arange(h, device=dev).view(1, h, 1), torch.arange(w, device=dev).view(1, 1, w)
    inside = (ys >= b[:, 0]) & (ys < b[:, 1]) & (xs >= b[:, 2]) & (xs < b[:, 3])
    cut_t = torch.as_tensor(cut).to(dev).view(n, 1, 1, 1)
    return torch.where(cut_t, torch.where(inside.unsqueeze(1), partner, x), mixed)


def build_mixing(
    mixup: float = 0.0,
    cutmix: float = 0.0,
    cutmix_minmax: Sequence[float] | None = None,
    prob: float = 1.0,
    switch_prob: float = 0.5,
    mode: str = "batch",
    label_smoothing: float = 0.1,
    num_classes: int = 1000,
    *,
    mixup_alpha: float | None = None,
    cutmix_alpha: float | None = None,
    correct_lam: bool = True,
) -> Mixing | None:
    """timm train.py's flags (``--mixup``, ``--cutmix``, ``--cutmix-minmax``, ``--mixup-prob``,
    ``--mixup-switch-prob``, ``--mixup-mode``, ``--smoothing``) as a :class:`Mixing`, or ``None`` when
    neither is active (as timm's ``mixup_active``). timm's ``Mixup`` argument names work too, so its
    ``mixup_args`` dict passes as it is: ``build_mixing(**mixup_args)`` (``mixup_alpha``,
    ``cutmix_alpha``, ``correct_lam``)."""
    for alias, name, given in (("mixup_alpha", "mixup", mixup), ("cutmix_alpha", "cutmix", cutmix)):
        value = {"mixup_alpha": mixup_alpha, "cutmix_alpha": cutmix_alpha}[alias]
        if value is not None and given and value != given:
            raise ArgumentError(f"{name}={given} and {alias}={value} name one setting: give one of them")
    mixup = mixup if mixup_alpha is None else mixup_alpha
    cutmix = cutmix if cutmix_alpha is None else cutmix_alpha
    if not (mixup > 0 or cutmix > 0 or cutmix_minmax is not None):
        return None
    return Mixing(
        mixup_alpha=mixup,
        cutmix_alpha=cutmix,
        cutmix_minmax=cutmix_minmax,
        prob=prob,
        switch_prob=switch_prob,
        mode=mode,
        correct_lam=correct_lam,
        label_smoothing=label_smoothing,
        num_classes=num_classes,
    )


__all__ = ["MODES", "MixParams", "Mixing", "beta", "build_mixing", "gamma"]
