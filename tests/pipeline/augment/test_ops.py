"""The batch kernels against torchvision.transforms.v2's per-image ops, sample by sample, each
sample of a batch with its own parameter; masks follow the geometry; hostile inputs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torchvision.transforms.v2 import InterpolationMode
from torchvision.transforms.v2 import functional as F

from stoker.pipeline.augment import ops

NEAREST = InterpolationMode.NEAREST


def _images(n: int, c: int = 3, h: int = 29, w: int = 38, seed: int = 0) -> torch.Tensor:
    """Half noise, half smooth gradients (autocontrast/equalize/blends see both kinds of content)."""
    g = torch.Generator().manual_seed(seed)
    noise = torch.randint(0, 256, (n, c, h, w), generator=g, dtype=torch.uint8)
    yy, xx = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    k = torch.arange(n).view(n, 1, 1, 1)
    ch = torch.arange(c).view(1, c, 1, 1)
    smooth = ((xx * (3 + k) + yy * 2 + ch * 60 + k * 17) % 200 + 20).to(torch.uint8)
    return torch.where((k % 2 == 0), noise, smooth)


# torchvision op (as its AutoAugment family applies it) -> our kernel and argument, and the bound:
# "exact" (0 grey levels), an int bound in grey levels, or "ties": geometric, where a pixel may differ
# only when its source coordinate is within float32 rounding of a .5 tie (assert >= 99.9% identical).
def _tv(name: str, m: float):
    geo = dict(interpolation=NEAREST, scale=1.0, angle=0.0)
    return {
        "ShearX": lambda im, fill: F.affine(
            im, translate=[0, 0], shear=[math.degrees(math.atan(m)), 0.0], center=[0, 0], fill=fill, **geo
        ),
        "ShearY": lambda im, fill: F.affine(
            im, translate=[0, 0], shear=[0.0, math.degrees(math.atan(m))], center=[0, 0], fill=fill, **geo
        ),
        "TranslateX": lambda im, fill: F.affine(im, translate=[int(m), 0], shear=[0.0, 0.0], fill=fill, **geo),
        "TranslateY": lambda im, fill: F.affine(im, translate=[0, int(m)], shear=[0.0, 0.0], fill=fill, **geo),
        "Rotate": lambda im, fill: F.rotate(im, m, interpolation=NEAREST, fill=fill),
        "Brightness": lambda im, _: F.adjust_brightness(im, 1.0 + m),
        "Color": lambda im, _: F.adjust_saturation(im, 1.0 + m),
        "Contrast": lambda im, _: F.adjust_contrast(im, 1.0 + m),
        "Sharpness": lambda im, _: F.adjust_sharpness(im, 1.0 + m),
        "Hue": lambda im, _: F.adjust_hue(im, m),
        "Posterize": lambda im, _: F.posterize(im, int(m)),
        "Solarize": lambda im, _: F.solarize(im, 255 * m),
        "AutoContrast": lambda im, _: F.autocontrast(im),
        "Equalize": lambda im, _: F.equalize(im),
        "Invert": lambda im, _: F.invert(im),
    }[name]


CASES = {  # name: (kernel, tv magnitude -> our argument, magnitudes incl. both signs, bound)
    "ShearX": ("shear_x", lambda m: m, [0.3, -0.3, 0.17, -0.99], "ties"),
    "ShearY": ("shear_y", lambda m: m, [0.3, -0.3, 0.99, -0.05], "ties"),
    "TranslateX": ("translate_x", lambda m: math.trunc(m), [10.3, -10.3, 3.0, -17.0], "ties"),
    "TranslateY": ("translate_y", lambda m: math.trunc(m), [12.9, -12.9, 5.0, -1.0], "ties"),
    "Rotate": ("rotate", lambda m: m, [30.0, -30.0, 13.5, -135.0, 0.0], "ties"),
    "Brightness": ("brightness", lambda m: 1 + m, [0.9, -0.9, 0.33, -0.47], "exact"),
    "Color": ("saturation", lambda m: 1 + m, [0.9, -0.9, 0.33, -0.47], 1),
    "Contrast": ("contrast", lambda m: 1 + m, [0.9, -0.9, 0.33, -0.47], 1),
    "Sharpness": ("sharpness", lambda m: 1 + m, [0.9, -0.9, 0.33, -0.47], 1),
    "Hue": ("hue", lambda m: m, [0.5, -0.5, 0.1, -0.27], 1),
    "Posterize": ("posterize", lambda m: int(m), [8, 6, 4, 1, 0], "exact"),
    "Solarize": ("solarize", lambda m: 255 * m, [1.0, 0.5, 0.1, 0.0, 0.7667], "exact"),
    "AutoContrast": ("autocontrast", lambda m: 0, [0.0, 0.0], "exact"),
    "Equalize": ("equalize", lambda m: 0, [0.0, 0.0], "exact"),
    "Invert": ("invert", lambda m: 0, [0.0, 0.0], "exact"),
}


def _compare(ours: torch.Tensor, ref: torch.Tensor, bound) -> None:
    d = (ours.int() - ref.int()).abs()
    if bound == "ties":
        assert (d == 0).float().mean() >= 0.999, f"only {(d == 0).float().mean():.4f} of the pixels agree"
    else:
        assert d.max() <= (0 if bound == "exact" else bound), f"max difference {int(d.max())}"


@pytest.mark.parametrize("fill", [None, (10, 200, 30)])
@pytest.mark.parametrize("name", sorted(CASES))
def test_each_sample_gets_torchvisions_pixels_for_its_own_parameter(name, fill):
    kernel, conv, mags, bound = CASES[name]
    x = _images(2 * len(mags), seed=len(name))
    per = [m for m in mags for _ in range(2)]  # a noisy and a smooth image per magnitude, one batch
    out, _ = ops.apply_ops(x, [kernel] * len(x), [conv(m) for m in per], fill=fill)
    fill_tv = None if fill is None else list(fill)
    ref = torch.stack([_tv(name, m)(im, fill_tv) for im, m in zip(x, per, strict=True)])
    _compare(out, ref, bound)


@pytest.mark.parametrize("name", ["Brightness", "Color", "Contrast", "Sharpness", "Hue", "AutoContrast", "Equalize"])
def test_grey_images_match_torchvision(name):
    kernel, conv, mags, bound = CASES[name]
    x = _images(len(mags), c=1, seed=3)
    out, _ = ops.apply_ops(x, [kernel] * len(x), [conv(m) for m in mags])
    ref = torch.stack([_tv(name, m)(im, None) for im, m in zip(x, mags, strict=True)])
    _compare(out, ref, bound)


def test_a_wrong_sign_or_magnitude_would_fail_the_comparison():
    # the geometric bound must be able to fail: torchvision's other sign agrees on few pixels
    x = _images(4)
    out = ops.shear_x(x, 0.3)
    wrong = torch.stack([_tv("ShearX", -0.3)(im, None) for im in x])
    assert (out == wrong).float().mean() < 0.9
    out = ops.translate_x(x, 7)
    wrong = torch.stack([_tv("TranslateX", -7)(im, None) for im in x])
    assert (out == wrong).float().mean() < 0.9


def test_a_sample_does_not_depend_on_its_batch():
    x = _images(12)
    kernels = ["shear_x", "rotate", "translate_y", "contrast", "saturation", "sharpness"] * 2
    args = [0.2, 17.0, -4.0, 1.6, 0.3, 1.8, -0.1, -25.0, 9.0, 0.4, 1.7, 0.2]
    whole, _ = ops.apply_ops(x, kernels, args)
    halves = [ops.apply_ops(x[s], kernels[s], args[s])[0] for s in (slice(0, 5), slice(5, 12))]
    assert torch.equal(whole, torch.cat(halves))
    assert torch.equal(ops.apply_ops(x[7:8], kernels[7:8], args[7:8])[0], whole[7:8])


def test_none_leaves_a_sample_and_inputs_are_not_modified():
    x = _images(4)
    before = x.clone()
    out, _ = ops.apply_ops(x, [None, "invert", None, "rotate"], [0, 0, 0, 40.0])
    assert torch.equal(x, before)
    assert torch.equal(out[0], x[0]) and torch.equal(out[2], x[2])
    assert torch.equal(out[1], 255 - x[1]) and not torch.equal(out[3], x[3])


def _labelled(n: int, h: int = 31, w: int = 40):
    """Images whose colour is their mask: label k in 1..6 is grey 40 * k (fill 0 is no label)."""
    g = torch.Generator().manual_seed(5)
    masks = torch.randint(1, 7, (n, h, w), generator=g, dtype=torch.uint8)
    return (masks * 40).unsqueeze(1).expand(n, 3, h, w).contiguous(), masks


@pytest.mark.parametrize("kernel,arg", [("rotate", 23.0), ("rotate", -71.0), ("shear_x", 0.3), ("shear_y", -0.4)])
@pytest.mark.parametrize("kernel2,arg2", [("translate_x", 7.0), ("translate_y", -9.6)])
def test_masks_move_with_the_images(kernel, arg, kernel2, arg2):
    images, masks = _labelled(4)
    out, moved = ops.apply_ops(images, [kernel, kernel2, kernel, kernel2], [arg, arg2, -arg, -arg2], masks=masks)
    expect = torch.where(out[:, 0] == 0, torch.full_like(moved, 255), out[:, 0] // 40)
    assert torch.equal(moved, expect)
    assert (moved == 255).any() and (moved != masks).any()  # something moved and something came from outside


def test_mask_fill_is_ignore_index_and_photometric_ops_leave_masks():
    images, masks = _labelled(3)
    _, moved = ops.rotate(images, [45.0, 45.0, 0.0], masks=masks, ignore_index=7)
    assert set(moved[0].unique().tolist()) <= {1, 2, 3, 4, 5, 6, 7} and (moved[0] == 7).any()
    assert torch.equal(moved[2], masks[2])
    out, same = ops.apply_ops(images, ["contrast", "equalize", "solarize"], [0.5, 0, 100], masks=masks)
    assert torch.equal(same, masks) and not torch.equal(out, images)


def test_channels_last_and_odd_sizes_give_the_same_pixels():
    x = _images(6, h=17, w=23)
    cl = x.contiguous(memory_format=torch.channels_last)
    for k, a in [("rotate", 33.0), ("sharpness", 0.2), ("hue", 0.3), ("equalize", 0)]:
        assert torch.equal(ops.apply_ops(cl, [k] * 6, [a] * 6)[0], ops.apply_ops(x, [k] * 6, [a] * 6)[0])


def test_empty_and_single_batches_and_tiny_images():
    empty = torch.zeros((0, 3, 8, 8), dtype=torch.uint8)
    assert ops.apply_ops(empty, [], [])[0].shape == (0, 3, 8, 8)
    assert ops.rotate(empty, []).shape == (0, 3, 8, 8)
    one = _images(1)
    assert torch.equal(ops.apply_ops(one, ["invert"], [0])[0], 255 - one)
    tiny = _images(2, h=2, w=2)
    assert torch.equal(ops.sharpness(tiny, 2.0), tiny)  # torchvision: no interior, unchanged
    flat = torch.full((1, 3, 5, 5), 77, dtype=torch.uint8)
    assert torch.equal(ops.equalize(flat), flat) and torch.equal(ops.autocontrast(flat), flat)


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda x: ops.brightness(x.float(), 1.0), "uint8"),
        (lambda x: ops.apply_ops(x[0], ["invert"], [0]), r"\[N, C, H, W\]"),
        (lambda x: ops.apply_ops(torch.cat([x, x[:, :1]], 1), ["invert"] * 2, 0), "C = 1 or 3"),
        (lambda x: ops.brightness(x, -0.5), "brightness factor=-0.5"),
        (lambda x: ops.hue(x, 0.7), "hue factor=0.7"),
        (lambda x: ops.solarize(x, 300), "solarize threshold=300 is outside"),
        (lambda x: ops.contrast(x, [1.0, 2.0, 3.0]), "one per sample"),
        (lambda x: ops.rotate(x, 10, fill=(1, 2)), "fill="),
        (lambda x: ops.rotate(x, 10, fill=300), "fill="),
        (lambda x: ops.apply_ops(x, ["blur", None], [0, 0]), "unknown kernel 'blur'"),
        (lambda x: ops.apply_ops(x, ["invert"], [0]), "one kernel per sample"),
        (lambda x: ops.rotate(x, 5, masks=torch.zeros((2, 4, 4), dtype=torch.uint8)), "masks must be"),
        (lambda x: ops.rotate(x, 5, masks=torch.zeros((2, 29, 38), dtype=torch.int64)), "masks must be a uint8"),
    ],
)
def test_hostile_inputs_raise_one_clear_value_error(call, match):
    with pytest.raises(ValueError, match=match) as e:
        call(_images(2))
    assert "\n" not in str(e.value)


def test_stream_seeds_differ_and_normals_are_standard():
    assert ops.stream_seed(0, "a") != ops.stream_seed(0, "b") != 0
    assert ops.stream_seed(5, "a") == ops.stream_seed(5, "a")
    u = np.random.default_rng(0).random((2, 100_000))
    z = ops.normals(u[0], u[1])
    assert abs(z.mean()) < 0.02 and abs(z.std() - 1) < 0.02
