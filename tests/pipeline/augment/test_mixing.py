"""MixUp / CutMix against timm's Mixup: the same lambdas give timm's soft targets and pixels; boxes
and their lambda correction are timm's; Beta draws are Beta; hostile arguments."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from timm.data import mixup as timm_mixup

from stoker.pipeline.augment.mixing import Mixing, beta, build_mixing


def _images(n: int, h: int = 24, w: int = 30, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, 3, h, w), generator=g, dtype=torch.uint8)


def _targets(n: int, k: int = 7) -> torch.Tensor:
    return (torch.arange(n) * 3) % k


@pytest.mark.parametrize("mode", ["batch", "pair", "elem"])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_soft_targets_sum_to_one_and_are_timms(mode, smoothing):
    mix = Mixing(mixup_alpha=0.8, cutmix_alpha=1.0, mode=mode, label_smoothing=smoothing, num_classes=7)
    x, t, ids = _images(10), _targets(10), np.arange(40, 50)
    out, soft = mix(x, t, ids, seed=1, epoch=0)
    assert soft.dtype == torch.float32 and soft.shape == (10, 7)
    assert torch.allclose(soft.sum(1), torch.ones(10), atol=1e-6)
    lam = mix.sample(ids, seed=1, epoch=0, height=24, width=30).lam
    ref = timm_mixup.mixup_target(t, 7, torch.as_tensor(lam).view(-1, 1), smoothing)
    assert torch.equal(soft, ref)
    assert (lam < 1).any() and out.dtype == torch.uint8


def test_label_smoothing_alone_is_timms():
    mix = Mixing(mixup_alpha=1.0, prob=0.0, label_smoothing=0.2, num_classes=5)
    x, t = _images(4), _targets(4, 5)
    out, soft = mix(x, t, np.arange(4), seed=0, epoch=0)
    assert torch.equal(out, x)
    assert torch.equal(soft, timm_mixup.mixup_target(t, 5, 1.0, 0.2))
    assert soft.max() == pytest.approx(1 - 0.2 + 0.2 / 5) and soft.min() == pytest.approx(0.2 / 5)


def _fake_randint(u_rows):
    """np.random.randint for timm's box functions, fed from our uniforms (in timm's call order)."""
    calls = iter(u_rows)

    def randint(low, high=None, size=None):
        return int(low + np.floor(next(calls) * (high - low)))

    return randint


@pytest.mark.parametrize("minmax", [None, (0.2, 0.8)])
def test_cutmix_boxes_and_lambda_correction_are_timms(monkeypatch, minmax):
    mix = Mixing(mixup_alpha=0.0, cutmix_alpha=1.0, cutmix_minmax=minmax, mode="elem", num_classes=3)
    h, w = 24, 30
    rng = np.random.default_rng(0)
    for _ in range(200):
        u = rng.random((1, 4))
        lam = np.array([rng.random()], np.float32)
        boxes, area = mix._boxes(u, lam, h, w)
        monkeypatch.setattr(np.random, "randint", _fake_randint(u[0] if minmax else u[0, :2]))
        (yl, yh, xl, xh), lam_t = timm_mixup.cutmix_bbox_and_lam((3, h, w), lam[0], ratio_minmax=minmax)
        assert tuple(boxes[0]) == (yl, yh, xl, xh)
        assert 1.0 - area[0] / (h * w) == pytest.approx(lam_t)
    p = mix.sample(np.arange(64), seed=0, epoch=0, height=h, width=w)
    yl, yh, xl, xh = p.boxes.T
    assert p.cutmix.any()
    assert np.allclose(p.lam[p.cutmix], 1 - (yh - yl)[p.cutmix] * (xh - xl)[p.cutmix] / (h * w))


def test_pixels_are_timms_for_the_same_lambdas(monkeypatch):
    # timm's Mixup._mix_elem on float images with our per-row draws and boxes: the same pixels
    mix = Mixing(mixup_alpha=0.4, cutmix_alpha=1.0, mode="elem", num_classes=3)
    x, ids = _images(12), np.arange(12)
    out, _ = mix(x, torch.zeros(12, dtype=torch.long), ids, seed=5, epoch=0)
    p = mix.sample(ids, seed=5, epoch=0, height=24, width=30)
    timm = timm_mixup.Mixup(mixup_alpha=0.4, cutmix_alpha=1.0, mode="elem", num_classes=3)
    monkeypatch.setattr(timm, "_params_per_elem", lambda n: (p.lam.copy(), p.cutmix.copy()))
    boxes = iter(p.boxes[p.cutmix])  # timm asks for a box for the CutMix rows only
    monkeypatch.setattr(timm_mixup, "cutmix_bbox_and_lam", lambda shape, lam, **kw: (tuple(next(boxes)), lam))
    ref = x.float()
    lam = timm._mix_elem(ref)
    assert torch.equal(out, ref.round().to(torch.uint8))
    assert torch.equal(lam.view(-1), torch.as_tensor(p.lam))


def test_batch_mode_mixes_all_rows_alike_and_elem_mode_per_row():
    ids = np.arange(100, 132)
    b = Mixing(mixup_alpha=1.0, mode="batch").sample(ids, seed=2, epoch=0, height=8, width=8)
    assert len(set(b.lam.tolist())) == 1
    e = Mixing(mixup_alpha=1.0, mode="elem").sample(ids, seed=2, epoch=0, height=8, width=8)
    assert len(set(e.lam.tolist())) > 20
    pr = Mixing(mixup_alpha=1.0, cutmix_alpha=1.0, mode="pair").sample(ids, seed=2, epoch=0, height=8, width=8)
    assert np.array_equal(pr.lam, pr.lam[::-1]) and np.array_equal(pr.boxes, pr.boxes[::-1])
    sw = Mixing(mixup_alpha=1.0, cutmix_alpha=1.0, switch_prob=0.3, mode="elem")
    cut = sw.sample(np.arange(20_000), seed=0, epoch=0, height=16, width=16).cutmix
    assert abs(cut.mean() - 0.3) < 0.02


def test_deterministic_and_seeded():
    mix = Mixing(mixup_alpha=0.8, cutmix_alpha=1.0, mode="elem", num_classes=7)
    x, t, ids = _images(8), _targets(8), np.arange(8)
    a, sa = mix(x, t, ids, seed=0, epoch=0)
    b, sb = mix(x, t, ids, seed=0, epoch=0)
    assert torch.equal(a, b) and torch.equal(sa, sb)
    assert not torch.equal(a, mix(x, t, ids, seed=1, epoch=0)[0])
    assert not torch.equal(a, mix(x, t, ids, seed=0, epoch=1)[0])
    # a row's draw depends on its own id only (the partner is still the reversed batch)
    lam = mix.sample(ids, seed=0, epoch=0, height=24, width=30).lam
    assert np.array_equal(lam[2:6], mix.sample(ids[2:6], seed=0, epoch=0, height=24, width=30).lam)


@pytest.mark.parametrize("alpha", [0.2, 1.0, 2.5])
def test_beta_draws_have_betas_moments(alpha):
    u = np.random.default_rng(int(alpha * 10)).random((40_000, 74))
    s = beta(u, alpha)
    assert 0 <= s.min() and s.max() <= 1
    assert abs(s.mean() - 0.5) < 0.01
    assert abs(s.var() - 1 / (4 * (2 * alpha + 1))) < 0.004


def test_channels_last_empty_and_build_mixing():
    mix = build_mixing(mixup=0.8, cutmix=1.0, label_smoothing=0.1, num_classes=7, mode="elem")
    assert isinstance(mix, Mixing) and mix.cutmix_alpha == 1.0 and mix.label_smoothing == 0.1
    assert build_mixing() is None
    assert build_mixing(cutmix_minmax=(0.3, 0.7)).cutmix_alpha == 1.0  # timm forces alpha 1 with minmax
    x, t = _images(6), _targets(6)
    cl = x.contiguous(memory_format=torch.channels_last)
    out, soft = mix(cl, t, np.arange(6), seed=0, epoch=0)
    assert out.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(out, mix(x, t, np.arange(6), seed=0, epoch=0)[0])
    empty, soft = mix(x[:0], t[:0], np.arange(0), seed=0, epoch=0)
    assert empty.shape == (0, 3, 24, 30) and soft.shape == (0, 7)


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda: Mixing(mixup_alpha=0.0), "needs mixup_alpha > 0"),
        (lambda: Mixing(prob=1.5), "prob=1.5"),
        (lambda: Mixing(switch_prob=-0.1), "switch_prob=-0.1"),
        (lambda: Mixing(label_smoothing=2), "label_smoothing=2"),
        (lambda: Mixing(mode="half"), "mode='half'"),
        (lambda: Mixing(cutmix_minmax=(0.8, 0.2)), "cutmix_minmax"),
        (lambda: Mixing(num_classes=0), "num_classes=0"),
    ],
)
def test_bad_arguments_raise_eagerly(make, match):
    with pytest.raises(ValueError, match=match):
        make()


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda m, x: m(x[:3], _targets(3), np.arange(3), seed=0, epoch=0), "even batch size"),
        (lambda m, x: m(x, torch.rand(4), np.arange(4), seed=0, epoch=0), "integer class indices"),
        (lambda m, x: m(x, torch.zeros(4, 7), np.arange(4), seed=0, epoch=0), "integer class indices"),
        (lambda m, x: m(x, torch.tensor([0, 1, 2, 7]), np.arange(4), seed=0, epoch=0), r"\[0, 7\)"),
        (lambda m, x: m(x.float(), _targets(4), np.arange(4), seed=0, epoch=0), "uint8"),
        (lambda m, x: m(x, _targets(4), np.arange(4), seed=0, epoch=0, masks=x[:, 0]), "masks"),
    ],
)
def test_hostile_batches(call, match):
    with pytest.raises(ValueError, match=match):
        call(Mixing(mixup_alpha=1.0, num_classes=7), _images(4))


def test_build_mixing_takes_timms_mixup_args_as_they_are():
    # timm train.py: mixup_args = dict(mixup_alpha=..., cutmix_alpha=..., ...); Mixup(**mixup_args)
    mixup_args = dict(
        mixup_alpha=0.8,
        cutmix_alpha=1.0,
        cutmix_minmax=None,
        prob=0.5,
        switch_prob=0.25,
        mode="pair",
        label_smoothing=0.1,
        num_classes=7,
        correct_lam=False,
    )
    m = build_mixing(**mixup_args)
    assert (m.mixup_alpha, m.cutmix_alpha, m.prob, m.switch_prob, m.mode, m.num_classes) == (
        0.8,
        1.0,
        0.5,
        0.25,
        "pair",
        7,
    )
    assert m.correct_lam is False
    assert build_mixing(mixup_alpha=0.0, cutmix_alpha=0.0) is None
    with pytest.raises(ValueError, match="mixup=0.2 and mixup_alpha=0.8 name one setting"):
        build_mixing(0.2, mixup_alpha=0.8)
