"""The photometric batch kernels on uint8 ``[N, C, H, W]`` images, one parameter per sample.

Brightness, saturation, contrast, sharpness, hue, posterize, solarize, solarize_add, autocontrast,
equalize and invert: each is torchvision's tensor kernel of the same name (solarize_add: timm's
SolarizeAdd) on a whole batch. They leave masks alone (:func:`~.ops.apply_ops` passes them through).
"""

from __future__ import annotations

import numpy as np
import torch

from .params import PerSample, _col, _per_sample, check_batch

_EQUALIZE_CHUNK = 64  # images per histogram pass: bounds the int64 index tensor to ~100 MB at 224 px


def _to_u8(x: torch.Tensor) -> torch.Tensor:
    return x.clamp_(0, 255).to(torch.uint8)  # truncates, as torchvision's float -> uint8 casts do


def _blend(x: torch.Tensor, other: torch.Tensor, ratio: np.ndarray) -> torch.Tensor:
    """``x * r + other * (1 - r)`` per sample into float32 ``x`` (consumed), then to uint8. Separate
    mul and add: torchvision's ``add_(alpha=)`` fuses them on CPU, so the two are <= 1 grey level apart."""
    x.mul_(_col(ratio, x))
    x += other * _col(1.0 - ratio, x)
    return _to_u8(x)


def _grey(x: torch.Tensor) -> torch.Tensor:
    """torchvision's floored luma of a float32 copy of uint8 images, ``[n, 1, H, W]``."""
    if x.shape[1] == 1:
        return x.clone()
    r, g, b = x.unbind(1)
    return (r * 0.2989).add_(g * 0.587).add_(b * 0.114).floor_().unsqueeze(1)


def brightness(images: torch.Tensor, factor: PerSample) -> torch.Tensor:
    """``F.adjust_brightness`` per sample (factor >= 0)."""
    f = _per_sample(images, factor, "brightness factor", lo=0.0)
    return _to_u8(images.float() * _col(f, images))


def saturation(images: torch.Tensor, factor: PerSample) -> torch.Tensor:
    """``F.adjust_saturation`` per sample (AutoAugment's "Color"); grey images are left as they are."""
    f = _per_sample(images, factor, "saturation factor", lo=0.0)
    if images.shape[1] == 1:
        return images.clone()
    x = images.float()
    return _blend(x, _grey(x), f)


def contrast(images: torch.Tensor, factor: PerSample) -> torch.Tensor:
    """``F.adjust_contrast`` per sample: blend with the mean of the floored grey image."""
    f = _per_sample(images, factor, "contrast factor", lo=0.0)
    x = images.float()
    grey = _grey(x)
    # grey values are integers: their float64 sum is exact in any order, so the batch can't change it
    mean = grey.sum(dim=(1, 2, 3), keepdim=True, dtype=torch.float64) / grey[0].numel()
    return _blend(x, mean.float(), f)


def sharpness(images: torch.Tensor, factor: PerSample) -> torch.Tensor:
    """``F.adjust_sharpness`` per sample: blend the interior with the 3x3 (1 1 1 / 1 5 1 / 1 1 1)/13
    blur; the one-pixel border is kept."""
    n, _, h, w = images.shape
    f = _per_sample(images, factor, "sharpness factor", lo=0.0)
    if n == 0 or h <= 2 or w <= 2:
        return images.clone()
    x = images.to(torch.int16)
    s = 4 * x[..., 1:-1, 1:-1]
    for dy in range(3):
        for dx in range(3):
            s += x[..., dy : h - 2 + dy, dx : w - 2 + dx]
    # round(s / 13) exactly: s / 13 is never a .5 tie, so torchvision's float32 round agrees
    blurred = s.mul_(2).add_(13).div_(26, rounding_mode="floor").float()
    out = images.float()
    view = out[..., 1:-1, 1:-1]
    view += blurred.sub_(view).mul_(_col(1.0 - f, images))
    return _to_u8(out)


def _rgb_to_hsv(image: torch.Tensor) -> torch.Tensor:
    r, g, _ = image.unbind(dim=-3)
    minc, maxc = torch.aminmax(image, dim=-3)
    eqc = maxc == minc
    ones = torch.ones_like(maxc)
    s = (maxc - minc) / torch.where(eqc, ones, maxc)
    rc, gc, bc = ((maxc.unsqueeze(-3) - image) / torch.where(eqc, ones, maxc - minc).unsqueeze(-3)).unbind(-3)
    neq_r, eq_g = maxc != r, maxc == g
    hg = (rc + 2.0 - bc) * (eq_g & neq_r)
    hr = (bc - gc) * ~neq_r
    hb = (gc + 4.0 - rc) * (neq_r & ~eq_g)
    hue_ = torch.fmod((hr + hg + hb) * (1.0 / 6.0) + 1.0, 1.0)
    return torch.stack((hue_, s, maxc), dim=-3)


def _hsv_to_rgb(img: torch.Tensor) -> torch.Tensor:
    h, s, v = img.unbind(dim=-3)
    h6 = h * 6
    i = torch.floor(h6)
    f = h6 - i
    i = i.to(torch.int32).remainder_(6)
    q = ((1.0 - s * f) * v).clamp_(0.0, 1.0)
    t = ((s * f + (1.0 - s)) * v).clamp_(0.0, 1.0)
    p = ((1.0 - s) * v).clamp_(0.0, 1.0)
    vpqt = torch.stack((v, p, q, t), dim=-3)
    select = torch.tensor([[0, 2, 1, 1, 3, 0], [3, 0, 0, 2, 1, 1], [1, 1, 3, 0, 0, 2]], device=img.device)
    return vpqt.gather(-3, select[:, i].moveaxis(0, -3))


def hue(images: torch.Tensor, factor: PerSample) -> torch.Tensor:
    """``F.adjust_hue`` per sample (factor in ``[-0.5, 0.5]``); grey images are left as they are."""
    f = _per_sample(images, factor, "hue factor", lo=-0.5, hi=0.5)
    if images.shape[1] == 1 or images.numel() == 0:
        return images.clone()
    hsv = _rgb_to_hsv(images.float() * (1.0 / 255.0))
    h, s, v = hsv.unbind(1)
    h = torch.remainder(h + _col(f, images).view(-1, 1, 1), 1.0)
    rgb = _hsv_to_rgb(torch.stack((h, s, v), dim=1))
    return (rgb * (255.0 + 1.0 - 1e-3)).to(torch.uint8)


def posterize(images: torch.Tensor, bits: PerSample) -> torch.Tensor:
    """``F.posterize`` per sample: keep the ``bits`` (integer, clipped to [0, 8]) high bits."""
    b = np.clip(np.floor(_per_sample(images, bits, "posterize bits")), 0, 8).astype(np.int64)
    mask = ((1 << b) - 1) << (8 - b)
    return images & _col(mask, images, torch.uint8)


def solarize(images: torch.Tensor, threshold: PerSample) -> torch.Tensor:
    """``F.solarize`` per sample: invert the pixels ``>= threshold`` (256 inverts none)."""
    t = _per_sample(images, threshold, "solarize threshold", lo=0.0, hi=256.0)
    # x >= t  <=>  x >= ceil(t) for integer x: an int16 compare instead of a float32 one
    return torch.where(images >= _col(np.ceil(t), images, torch.int16), images.bitwise_not(), images)


def solarize_add(images: torch.Tensor, add: PerSample, threshold: float = 128.0) -> torch.Tensor:
    """timm's SolarizeAdd per sample: pixels ``< threshold`` get ``+add`` (saturating at 255)."""
    a = _per_sample(images, add, "solarize_add amount", lo=0.0, hi=255.0)
    added = (images.to(torch.int16) + _col(a, images, torch.int16)).clamp_(max=255).to(torch.uint8)
    return torch.where(images < threshold, added, images)


def autocontrast(images: torch.Tensor) -> torch.Tensor:
    """``F.autocontrast``: stretch each channel of each image to ``[0, 255]``."""
    check_batch(images)
    x = images.float()
    lo, hi = x.amin(dim=(-2, -1), keepdim=True), x.amax(dim=(-2, -1), keepdim=True)
    flat = hi == lo
    inv_scale = torch.where(flat, torch.ones_like(hi), (hi - lo) * (1.0 / 255.0))
    lo = torch.where(flat, torch.zeros_like(lo), lo)
    return ((x - lo) / inv_scale).clamp_(0, 255).to(torch.uint8)


def _equalize(images: torch.Tensor) -> torch.Tensor:
    flat = images.flatten(start_dim=-2).to(torch.long)
    hist = flat.new_zeros(images.shape[:-2] + (256,), dtype=torch.int32)
    hist.scatter_add_(-1, flat, hist.new_ones(1).expand_as(flat))
    cum = hist.cumsum(-1)
    last = cum.argmax(-1, keepdim=True)
    step = torch.div(flat.shape[-1] - hist.gather(-1, last), 255, rounding_mode="floor")
    lut = torch.div(cum[..., :-1] + step // 2, step.clamp(min=1), rounding_mode="floor").clamp_(0, 255)
    lut = torch.cat([lut.new_zeros(lut.shape[:-1] + (1,)), lut], dim=-1).to(torch.uint8)
    out = lut.gather(-1, flat).view_as(images)
    return torch.where(step.unsqueeze(-1) != 0, out, images)  # PIL: a one-colour image stays


def equalize(images: torch.Tensor) -> torch.Tensor:
    """``F.equalize`` (PIL's histogram equalization, per channel of each image)."""
    check_batch(images)
    if images.numel() == 0:
        return images.clone()
    return torch.cat([_equalize(c) for c in images.split(_EQUALIZE_CHUNK)])


def invert(images: torch.Tensor) -> torch.Tensor:
    """``F.invert``: ``255 - x``."""
    check_batch(images)
    return images.bitwise_not()


__all__ = [
    "autocontrast",
    "brightness",
    "contrast",
    "equalize",
    "hue",
    "invert",
    "posterize",
    "saturation",
    "sharpness",
    "solarize",
    "solarize_add",
]
