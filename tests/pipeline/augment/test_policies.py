"""The policies: torchvision's and timm's semantics (op sets, bins, levels, probabilities, the timm
strings), per-sample parameters from (seed, epoch, id) alone, masks, hostile arguments."""

from __future__ import annotations

import numpy as np
import pytest
import timm.data.auto_augment as timm_aa
import torch
from PIL import Image
from torchvision.transforms import v2
from torchvision.transforms.v2 import InterpolationMode

from stoker.pipeline.augment import chain, erasing, jitter, ops
from stoker.pipeline.augment import policies as P
from stoker.pipeline.augment import timm_policies as T

NEAREST = InterpolationMode.NEAREST


def _images(n: int, c: int = 3, h: int = 30, w: int = 36, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    yy, xx = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    base = ((xx * 5 + yy * 3).view(1, 1, h, w) + torch.arange(c).view(1, c, 1, 1) * 70) % 220
    return (base + torch.randint(0, 36, (n, c, h, w), generator=g)).to(torch.uint8)


def _same_as_torchvision_per_sample(policy, space, x, ids):
    """Replay our plan with torchvision's own per-image op dispatch; returns the fraction of pixels
    within 1 grey level (<= 1: the blends; the rest: geometric .5 ties, compounded by later ops)."""
    _, _, h, w = x.shape
    ours = policy(x, ids, seed=3, epoch=1)
    ref = []
    for i, im in enumerate(x):
        for names, mags in policy.plan(ids, seed=3, epoch=1, height=h, width=w):
            if names[i]:
                im = space._apply_image_or_video_transform(
                    im, str(names[i]), float(mags[i]), interpolation=NEAREST, fill={"others": None}
                )
        ref.append(im)
    return ((ours.int() - torch.stack(ref).int()).abs() <= 1).float().mean().item()


@pytest.mark.parametrize(
    "ours,theirs",
    [(P.RandAugment(num_ops=3), v2.RandAugment()), (P.TrivialAugmentWide(), v2.TrivialAugmentWide())]
    + [(P.AutoAugment(), v2.AutoAugment())],
)
def test_torchvision_policies_replay_torchvisions_ops(ours, theirs):
    x = _images(48)
    assert _same_as_torchvision_per_sample(ours, theirs, x, np.arange(1000, 1048)) >= 0.995


@pytest.mark.parametrize("bins,h,w", [(31, 224, 224), (31, 30, 36), (10, 37, 50), (5, 8, 8)])
def test_magnitude_bins_are_torchvisions(bins, h, w):
    for cls, wide in ((v2.RandAugment, False), (v2.TrivialAugmentWide, True), (v2.AutoAugment, False)):
        for name, (fn, signed) in cls._AUGMENTATION_SPACE.items():
            ref = fn(bins, h, w)
            got = P.tv_magnitudes(name, bins, h, w, wide=wide)
            assert (got is None) == (ref is None), name
            if ref is not None:
                assert np.array_equal(got, ref.double().numpy()), (cls.__name__, name)
            assert P._tv_signed(name) == signed, name


def test_torchvision_policy_tables():
    assert P._TV_RA_OPS == tuple(v2.RandAugment._AUGMENTATION_SPACE)
    assert P._TV_RA_OPS == tuple(v2.TrivialAugmentWide._AUGMENTATION_SPACE)
    assert set(P.TV_AA_OPS) == set(v2.AutoAugment._AUGMENTATION_SPACE)
    theirs = v2.AutoAugment()._policies
    assert [tuple((op, p) for op, p, _ in row) for row in P._AA_IMAGENET] == [
        tuple((op, p) for op, p, _ in row) for row in theirs
    ]
    for row, ref in zip(P._AA_IMAGENET, theirs, strict=True):  # magnitudes where torchvision has one
        assert all(m == r for (_, _, m), (_, _, r) in zip(row, ref, strict=True) if r is not None)


def test_randaugment_draws_ops_uniformly_with_signs_per_sample():
    ra = P.RandAugment(num_ops=2, magnitude=7)
    (n1, m1), (n2, m2) = ra.plan(np.arange(28_000), seed=0, epoch=0, height=32, width=32)
    freq = np.unique(np.concatenate([n1, n2]), return_counts=True)[1] / (2 * 28_000)
    assert len(freq) == 14 and np.abs(freq - 1 / 14).max() < 0.01
    rot = n1 == "Rotate"
    assert set(np.round(np.abs(m1[rot]), 5)) == {round(7 * 30 / 30, 5)}  # bin 7 of linspace(0, 30, 31)
    assert 0.45 < (m1[rot] < 0).mean() < 0.55
    assert (m1[n1 == "Posterize"] == 8 - round(7 / 7.5)).all() and (m1[n1 == "Posterize"] >= 0).all()


def test_trivialaugment_and_autoaugment_sample_as_torchvision():
    ((names, mags),) = P.TrivialAugmentWide().plan(np.arange(30_000), seed=1, epoch=0, height=32, width=32)
    shear = np.abs(mags[names == "ShearX"])
    assert len(np.unique(shear)) == 31 and shear.max() == np.float32(0.99)
    first, second = P.AutoAugment().plan(np.arange(30_000), seed=1, epoch=0, height=32, width=32)
    for slot, (names, _) in enumerate((first, second)):  # each op: its probability, summed over the 25 rows
        for op in ("Invert", "Equalize", "Rotate"):
            want = sum(p for row in P._AA_IMAGENET for name, p, _ in row[slot : slot + 1] if name == op) / 25
            assert abs((names == op).mean() - want) < 0.01, (slot, op)


def test_timm_levels_are_timms(monkeypatch):
    hp = dict(translate_pct=0.45)
    for sign, negate in ((1, False), (-1, True)):
        monkeypatch.setattr(timm_aa, "_randomly_negate", lambda v, s=sign: s * v)
        for name in T._TIMM_RAND + T._TIMM_RAND_INC + ("PosterizeOriginal",):
            for level in (0.0, 2.5, 7.0, 10.0, 14.0):
                kernel, arg = T.timm_kernel(name, np.array([level]), np.array([negate]), width=50, height=40)
                fn = timm_aa.LEVEL_TO_ARG[name]
                want = fn(level, hp)[0] if fn else 0.0
                if name.startswith("Translate"):  # timm's PIL (1, 0, px): content moves by -px, nearest rounds up
                    want = -np.floor(want * (50 if "X" in name else 40) + 0.5)
                got = arg[0]
                if name.startswith("Posterize"):  # PIL: < 0 bits keeps nothing, as 0 bits does
                    want, got = min(max(want, 0), 8), min(max(got, 0), 8)
                assert got == pytest.approx(want, abs=1e-12), (name, level, negate)
                assert kernel in ops.KERNELS


@pytest.mark.parametrize("name", sorted(set(T._TIMM_RAND + T._TIMM_RAND_INC)))
def test_timm_ops_match_timms_pil_ops_with_nearest(monkeypatch, name):
    # Our kernels vs timm's own PIL ops (resample=NEAREST, timm's fill): <= 1 grey level for the pixel
    # ops; translations exact; shear and rotate agree but where a source coordinate is a .5 tie
    # (torchvision rounds those half to even, PIL up: whole rows for some shears), measured >= 97%.
    x = _images(1, h=40, w=52)
    pil = Image.fromarray(x[0].permute(1, 2, 0).numpy())
    for level, negate in ((4.0, False), (9.0, True), (2.5, True)):
        monkeypatch.setattr(timm_aa, "_randomly_negate", (lambda v: -v) if negate else (lambda v: v))
        fn = timm_aa.LEVEL_TO_ARG[name]
        args = fn(level, dict(translate_pct=0.45)) if fn else ()
        ref = np.asarray(timm_aa.NAME_TO_OP[name](pil, *args, fillcolor=T.TIMM_FILL, resample=Image.NEAREST))
        kernel, arg = T.timm_kernel(name, np.array([level]), np.array([negate]), width=52, height=40)
        out = ops.apply_ops(x, [kernel], arg, fill=T.TIMM_FILL)[0][0].permute(1, 2, 0).numpy()
        d = np.abs(out.astype(int) - ref.astype(int)).max(-1)
        if kernel in ("shear_x", "shear_y", "rotate"):
            assert (d == 0).mean() >= 0.95, (name, level, negate, (d == 0).mean())
        else:
            assert d.max() <= (0 if kernel in ops.GEOMETRIC else 1), (name, level, negate, d.max())


@pytest.mark.parametrize(
    "aa", ["rand-m9-mstd0.5-inc1", "rand-m7-n3", "rand-m9-n3-mstd0.5", "rand-mstd1-tweights", "rand-m10-mstd101-p0.7"]
)
def test_timm_rand_strings_parse_to_timms_settings(aa):
    theirs = timm_aa.rand_augment_transform(aa, {})
    ours = T.parse_aa(aa)
    assert isinstance(ours, T.TimmRandAugment)
    assert ours.transforms == tuple(op.name for op in theirs.ops)
    assert ours.num_layers == theirs.num_layers
    assert {ours.magnitude} == {op.magnitude for op in theirs.ops}
    assert {ours.prob} == {op.prob for op in theirs.ops}
    assert {ours.magnitude_std} == {op.magnitude_std for op in theirs.ops}
    assert ours.fill == T.TIMM_FILL
    if theirs.choice_weights is None:
        assert ours.choice_weights is None
    else:
        assert np.allclose(ours.choice_weights, theirs.choice_weights)


def test_timm_settings_of_the_issue_strings():
    ra = T.parse_aa("rand-m9-mstd0.5-inc1")
    assert (ra.magnitude, ra.magnitude_std, ra.increasing, ra.num_layers, ra.prob) == (9, 0.5, True, 2, 0.5)
    assert "SolarizeIncreasing" in ra.transforms and "Solarize" not in ra.transforms
    assert (T.parse_aa("rand-m7-n3").magnitude, T.parse_aa("rand-m7-n3").num_layers) == (7, 3)
    legacy = T.parse_aa("rand-mstd1-w0")  # timm < 0.9's weight set 0 (timm 1.0 rejects 'w')
    assert legacy.magnitude == 10 and legacy.choice_weights[T._TIMM_RAND.index("Rotate")] == pytest.approx(0.3)
    assert T.parse_aa("rand-m5-mmax15").upper == 15
    assert isinstance(T.parse_aa("ta_wide"), P.TrivialAugmentWide)
    assert isinstance(T.parse_aa("trivialaugment"), P.TrivialAugmentWide)


@pytest.mark.parametrize("aa", ["original", "originalr", "v0", "v0r", "original-mstd0.5"])
def test_timm_autoaugment_policies_are_timms(aa):
    theirs = timm_aa.auto_augment_transform(aa, {})
    ours = T.parse_aa(aa)
    assert isinstance(ours, T.TimmAutoAugment)
    assert [[(op.name, op.prob, op.magnitude) for op in sub] for sub in theirs.policy] == [
        list(row) for row in ours.table
    ]
    assert {ours.magnitude_std} == {op.magnitude_std for sub in theirs.policy for op in sub}


@pytest.mark.parametrize(
    "aa,bad",
    [
        ("rand-mX", "'mX'"),
        ("bogus-m9", "'bogus'"),
        ("augmix-m5", "augmix"),
        ("rand-m9-q3", "'q3'"),
        ("rand-m9.5", "'m9.5'"),
        ("rand-m9-m8", "'m'"),
        ("rand-m11", "magnitude=11"),
        ("rand-p1.5", "prob=1.5"),
        ("rand-m9-t3a", "t3a"),
        ("ta_wide-m9", "ta_wide"),
        ("v0-m9", "'m9'"),
        ("", "aa=''"),
    ],
)
def test_bad_strings_raise_a_one_line_value_error_naming_the_bad_part(aa, bad):
    with pytest.raises(ValueError) as e:
        T.parse_aa(aa)
    assert bad in str(e.value) and "\n" not in str(e.value)


def test_timm_randaugment_probability_noise_and_no_repeats_with_weights():
    ids = np.arange(20_000)
    plan = T.TimmRandAugment(magnitude=5, magnitude_std=1.0, prob=0.5).plan(ids, seed=0, epoch=0, height=8, width=8)
    names, level, negate = plan[0]
    assert abs((names != "").mean() - 0.5) < 0.02 and abs(negate.mean() - 0.5) < 0.02
    assert abs(level.mean() - 5) < 0.05 and abs(level.std() - 1) < 0.05  # gaussian noise on the level
    assert not np.array_equal(level, plan[1][1])  # drawn per op application
    uni = T.TimmRandAugment(magnitude=8, magnitude_std=101).plan(ids, seed=0, epoch=0, height=8, width=8)[0][1]
    assert uni.min() < 0.1 and uni.max() > 7.9 and abs(uni.mean() - 4) < 0.1  # mstd > 100: uniform in [0, m]
    clip = T.TimmRandAugment(magnitude=10, magnitude_std=3).plan(ids, seed=0, epoch=0, height=8, width=8)[0][1]
    assert clip.max() == 10 and clip.min() >= 0
    w = T.parse_aa("rand-n3-tweights-p1")
    layers = w.plan(ids, seed=0, epoch=0, height=8, width=8)
    picked = np.stack([n for n, _, _ in layers], 1)
    assert all(len(set(row)) == 3 for row in picked[:500])  # without replacement, as numpy's choice
    want = np.asarray(list(T._TIMM_WEIGHTED.values())) / sum(T._TIMM_WEIGHTED.values())
    first = np.asarray([(layers[0][0] == k).mean() for k in T._TIMM_WEIGHTED])
    assert np.abs(first - want).max() < 0.01


def _labelled(n: int, h: int = 30, w: int = 36):
    g = torch.Generator().manual_seed(2)
    masks = torch.randint(1, 6, (n, h, w), generator=g, dtype=torch.uint8)
    return (masks * 50).unsqueeze(1).expand(n, 3, h, w).contiguous(), masks


@pytest.mark.parametrize("aa", ["rand-m9-n3-inc1-p1", "ta_wide", "original", "v0"])
def test_masks_follow_the_geometry_of_each_sample(aa):
    # colour regions are their own masks; photometric ops may recolour, so compare after geometry only
    geometric = T.parse_aa(aa, fill=0)
    images, masks = _labelled(24)
    ids = np.arange(24)
    out, moved = geometric(images, ids, seed=0, epoch=0, masks=masks)
    _, _, h, w = images.shape
    plan = geometric.plan(ids, seed=0, epoch=0, height=h, width=w)
    kernels = [geometric._kernels(layer, h, w) for layer in plan]
    moved_any = False
    for i in range(24):
        im, m = images[i : i + 1], masks[i : i + 1]
        for ks, args in kernels:
            if ks[i] in ops.GEOMETRIC:
                im, m = ops.apply_ops(im, [ks[i]], [args[i]], masks=m)
        expect = torch.where(im[0, 0] == 0, torch.full_like(m[0], 255), im[0, 0] // 50)
        assert torch.equal(moved[i], expect) and torch.equal(moved[i], m[0])
        moved_any |= not torch.equal(moved[i], masks[i])
    assert moved_any


def test_photometric_transforms_leave_masks_and_erasing_refuses_them():
    images, masks = _labelled(6)
    out, same = jitter.ColorJitter(0.5, 0.5, 0.5, 0.2)(images, np.arange(6), seed=0, epoch=0, masks=masks)
    assert torch.equal(same, masks) and not torch.equal(out, images)
    with pytest.raises(ValueError, match="masks"):
        erasing.RandomErasing(1.0)(images, np.arange(6), seed=0, epoch=0, masks=masks)


ALL = [
    P.RandAugment(),
    P.TrivialAugmentWide(),
    P.AutoAugment(),
    T.parse_aa("rand-m9-mstd0.5-inc1"),
    T.parse_aa("v0r"),
    jitter.ColorJitter(0.4, 0.4, 0.4, 0.1),
    erasing.RandomErasing(0.7, mode="rand", max_count=3),
    erasing.RandomErasing(0.7, mode="const"),
]


@pytest.mark.parametrize("t", ALL, ids=lambda t: type(t).__name__)
def test_deterministic_independent_of_the_batch_and_seeded(t):
    x = _images(20, seed=4)
    ids = np.arange(500, 520)
    a = t(x, ids, seed=7, epoch=2)
    assert torch.equal(a, t(x, ids, seed=7, epoch=2))
    halves = torch.cat([t(x[:7], ids[:7], seed=7, epoch=2), t(x[7:], ids[7:], seed=7, epoch=2)])
    assert torch.equal(a, halves)
    shuffled = np.random.default_rng(0).permutation(20)
    assert torch.equal(t(x[shuffled], ids[shuffled], seed=7, epoch=2), a[shuffled])
    assert not torch.equal(a, t(x, ids, seed=8, epoch=2))
    assert not torch.equal(a, t(x, ids, seed=7, epoch=3))


@pytest.mark.parametrize("t", ALL[:6], ids=lambda t: type(t).__name__)
def test_each_sample_gets_its_own_parameters(t):
    same = _images(1, seed=9).expand(16, -1, -1, -1).contiguous()
    out = t(same, np.arange(16), seed=0, epoch=0)
    assert len({tuple(o.flatten()[::7].tolist()) for o in out}) >= 8


def test_erasing_pixel_mode_is_deterministic_for_a_batch_and_boxes_follow_timm():
    x = _images(8, seed=1)
    pix = erasing.RandomErasing(1.0, mode="pixel", max_count=2)
    a = pix(x, np.arange(8), seed=0, epoch=0)
    assert torch.equal(a, pix(x, np.arange(8), seed=0, epoch=0)) and not torch.equal(a, x)
    er = erasing.RandomErasing(0.5, max_count=4, min_area=0.05, max_area=0.3)
    boxes, _ = er.plan(np.arange(20_000), seed=0, epoch=0, height=60, width=80)
    h, w = boxes[..., 2], boxes[..., 3]
    live = h > 0
    count = live.sum(1)
    assert abs((count > 0).mean() - 0.5) < 0.02 and count.max() == 4
    assert ((boxes[..., 0] + h <= 60) & (boxes[..., 1] + w <= 80))[live].all() and (h < 60).all() and (w < 80).all()
    area = (h * w)[live] / (60 * 80) * np.repeat(count, 4).reshape(-1, 4)[live]
    assert area.min() > 0.04 and area.max() < 0.32  # [min_area, max_area] / count, up to rounding
    mean_colour = torch.tensor([round(255 * m) for m in erasing.IMAGENET_MEAN], dtype=torch.uint8).view(3, 1)
    const = erasing.RandomErasing(1.0)(x, np.arange(8), seed=0, epoch=0)
    changed = (const != x).any(1)
    assert (const.permute(1, 0, 2, 3)[:, changed] == mean_colour).all()


@pytest.mark.parametrize("mode", ["const", "rand"])
def test_erasing_fills_the_same_pixels_by_slices_and_by_one_batched_where(mode):
    x, ids = _images(24, seed=5), np.arange(24)
    er = erasing.RandomErasing(0.8, mode=mode, max_count=3, min_area=0.05, max_area=0.5)
    er.fill = "slices"
    by_slices = er(x, ids, seed=3, epoch=1)
    er.fill = "where"
    by_where = er(x, ids, seed=3, epoch=1)
    assert torch.equal(by_slices, by_where) and not torch.equal(by_slices, x)
    assert torch.equal(x, _images(24, seed=5))  # the input is left as it was


def test_colorjitter_replays_torchvisions_ops_in_each_samples_order():
    cj = jitter.ColorJitter(0.5, (0.6, 1.4), 0.5, 0.2)
    x, ids = _images(16), np.arange(16)
    factors, order = cj.plan(ids, seed=0, epoch=0)
    assert len({tuple(o) for o in order}) > 4  # random order per sample
    out = cj(x, ids, seed=0, epoch=0)
    fns = (v2.functional.adjust_brightness, v2.functional.adjust_contrast)
    fns += (v2.functional.adjust_saturation, v2.functional.adjust_hue)
    for i in range(16):
        im = x[i]
        for k in order[i]:
            im = fns[k](im, float(factors[i, k]))
        assert (out[i].int() - im.int()).abs().max() <= 2  # <= 1 per blend, compounded over 4 ops


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda: P.RandAugment(magnitude=31), "magnitude=31"),
        (lambda: P.RandAugment(num_ops=-1), "num_ops=-1"),
        (lambda: P.RandAugment(num_magnitude_bins=1), "num_magnitude_bins=1"),
        (lambda: P.AutoAugment("cifar10"), "cifar10"),
        (lambda: T.TimmRandAugment(prob=1.5), "prob=1.5"),
        (lambda: T.TimmRandAugment(magnitude=-1), "magnitude=-1"),
        (lambda: T.TimmRandAugment(transforms=["GaussianBlur"]), "GaussianBlur"),
        (lambda: T.TimmRandAugment(num_layers=3, choice_weights=[1] + [0] * 14), "choice_weights"),
        (lambda: erasing.RandomErasing(1.5), "probability=1.5"),
        (lambda: erasing.RandomErasing(mode="noise"), "mode='noise'"),
        (lambda: erasing.RandomErasing(min_area=0.5, max_area=0.2), "area"),
        (lambda: jitter.ColorJitter(brightness=-1), "brightness=-1"),
        (lambda: jitter.ColorJitter(hue=0.7), "hue=0.7"),
        (lambda: chain.BatchAugment([P.RandAugment(), P.RandAugment()]), "share the random stream"),
        (lambda: chain.build_augment(reprob=2.0), "reprob=2.0"),
        (lambda: chain.build_augment(color_jitter=(0.1, 0.2)), "color_jitter"),
    ],
)
def test_bad_arguments_raise_eagerly(make, match):
    with pytest.raises(ValueError, match=match) as e:
        make()
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("c", [1, 3])
def test_batches_of_zero_and_one_grey_and_channels_last(c):
    aug = chain.build_augment(
        "rand-m9-mstd0.5-inc1", reprob=0.5, remode="rand", color_jitter=0.4, force_color_jitter=True
    )
    assert [type(t).__name__ for t in aug.transforms] == ["TimmRandAugment", "ColorJitter", "RandomErasing"]
    empty = torch.zeros((0, c, 16, 16), dtype=torch.uint8)
    assert aug(empty, np.zeros(0, np.int64), seed=0, epoch=0).shape == (0, c, 16, 16)
    one = _images(1, c=c)
    assert aug(one, [5], seed=0, epoch=0).shape == one.shape
    x = _images(6, c=c)
    cl = x.contiguous(memory_format=torch.channels_last)
    out = aug(cl, np.arange(6), seed=1, epoch=0)
    assert torch.equal(out, aug(x, np.arange(6), seed=1, epoch=0))
    if c == 3:
        assert out.is_contiguous(memory_format=torch.channels_last) and not out.is_contiguous()


def test_build_augment_follows_timms_create_transform():
    assert [type(t).__name__ for t in chain.build_augment("original", color_jitter=0.4).transforms] == [
        "TimmAutoAugment"
    ]  # timm: no colour jitter next to an AutoAugment policy unless forced
    cj = chain.build_augment(None, color_jitter=0.3).transforms[0]
    assert cj.ranges[:3] == ((0.7, 1.3),) * 3 and cj.ranges[3] is None
    assert chain.build_augment().transforms == ()
    x = _images(2)
    assert torch.equal(chain.build_augment()(x, [0, 1], seed=0, epoch=0), x)


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda t, x: t(x.float(), np.arange(4), seed=0, epoch=0), "uint8"),
        (lambda t, x: t(x[:, :2], np.arange(4), seed=0, epoch=0), "C = 1 or 3"),
        (lambda t, x: t(x, np.arange(3), seed=0, epoch=0), "ids must be 4"),
        (lambda t, x: t(x, np.arange(4.0), seed=0, epoch=0), "integer"),
        (lambda t, x: t(x, np.arange(4), seed=0.5, epoch=0), "seed"),
        (lambda t, x: t(x, np.arange(4), seed=0, epoch="1"), "epoch"),
    ],
)
def test_hostile_batches(call, match):
    with pytest.raises(ValueError, match=match):
        call(P.RandAugment(), _images(4))
