"""timm's RandAugment and AutoAugment on uint8 batches, and timm's policy strings.

:class:`TimmRandAugment` and :class:`TimmAutoAugment` (as timm/data/auto_augment.py) use timm's op
sets, level-to-argument functions (:func:`timm_kernel`), per-op probability and magnitude noise.
:func:`parse_aa` reads timm's strings (``rand-m9-mstd0.5-inc1``, ``original``, ``v0r``, ...; and
``ta_wide`` for torchvision's TrivialAugmentWide). The pixels come from :mod:`.ops` (torchvision's
tensor kernels): nearest interpolation where timm's PIL ops pick bilinear or bicubic at random, and
torchvision's tensor enhance ops where timm uses PIL's ImageEnhance (<= a few grey levels apart).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import numpy as np

from stoker.errors import ArgumentError

from .base import BatchTransform, _choice, _int, _prob
from .params import Fill, normals
from .policies import _AA_IMAGENET, _ENHANCE, _GEOM, _PLAIN, TrivialAugmentWide, _Layered

TIMM_FILL = (124, 116, 104)  # what timm's create_transform passes as img_mean: round(255 * ImageNet mean)
_LEVEL_DENOM = 10.0
_TIMM_RAND = ("AutoContrast", "Equalize", "Invert", "Rotate", "Posterize", "Solarize", "SolarizeAdd", "Color")
_TIMM_RAND += ("Contrast", "Brightness", "Sharpness", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel")
_TIMM_INC = {"Posterize", "Solarize", "Color", "Contrast", "Brightness", "Sharpness"}
_TIMM_RAND_INC = tuple(f"{n}Increasing" if n in _TIMM_INC else n for n in _TIMM_RAND)
# timm's 'tweights' (_RAND_WEIGHTED_0), and the 'w0' weights of timm < 0.9 (positional on the op set)
_TIMM_WEIGHTED = {"Rotate": 3, "ShearX": 2, "ShearY": 2, "TranslateXRel": 1, "TranslateYRel": 1}
_TIMM_WEIGHTED.update({"ColorIncreasing": 0.25, "SharpnessIncreasing": 0.25, "AutoContrast": 0.25})
_TIMM_WEIGHTED.update({"SolarizeIncreasing": 0.05, "SolarizeAdd": 0.05, "ContrastIncreasing": 0.05})
_TIMM_WEIGHTED.update({"BrightnessIncreasing": 0.05, "Equalize": 0.05, "PosterizeIncreasing": 0.05, "Invert": 0.05})
_TIMM_W0 = (0.025, 0.005, 0.0, 0.3, 0.0, 0.005, 0.005, 0.025, 0.005, 0.005, 0.025, 0.2, 0.2, 0.1, 0.1)
_TIMM_V0 = (
    (("Equalize", 0.8, 1), ("ShearY", 0.8, 4)),
    (("Color", 0.4, 9), ("Equalize", 0.6, 3)),
    (("Color", 0.4, 1), ("Rotate", 0.6, 8)),
    (("Solarize", 0.8, 3), ("Equalize", 0.4, 7)),
    (("Solarize", 0.4, 2), ("Solarize", 0.6, 2)),
    (("Color", 0.2, 0), ("Equalize", 0.8, 8)),
    (("Equalize", 0.4, 8), ("SolarizeAdd", 0.8, 3)),
    (("ShearX", 0.2, 9), ("Rotate", 0.6, 8)),
    (("Color", 0.6, 1), ("Equalize", 1.0, 2)),
    (("Invert", 0.4, 9), ("Rotate", 0.6, 0)),
    (("Equalize", 1.0, 9), ("ShearY", 0.6, 3)),
    (("Color", 0.4, 7), ("Equalize", 0.6, 0)),
    (("Posterize", 0.4, 6), ("AutoContrast", 0.4, 7)),
    (("Solarize", 0.6, 8), ("Color", 0.6, 9)),
    (("Solarize", 0.2, 4), ("Rotate", 0.8, 9)),
    (("Rotate", 1.0, 7), ("TranslateYRel", 0.8, 9)),
    (("ShearX", 0.0, 0), ("Solarize", 0.8, 4)),
    (("ShearY", 0.8, 0), ("Color", 0.6, 4)),
    (("Color", 1.0, 0), ("Rotate", 0.6, 2)),
    (("Equalize", 0.8, 4), ("Equalize", 0.0, 8)),
    (("Equalize", 1.0, 4), ("AutoContrast", 0.6, 2)),
    (("ShearY", 0.4, 7), ("SolarizeAdd", 0.6, 7)),
    (("Posterize", 0.8, 2), ("Solarize", 0.6, 10)),
    (("Solarize", 0.6, 8), ("Equalize", 0.6, 1)),
    (("Color", 0.8, 6), ("Rotate", 0.4, 5)),
)
_POSTERIZE_AS = {"original": "PosterizeOriginal", "originalr": "PosterizeIncreasing", "v0": "Posterize"}
_POSTERIZE_AS["v0r"] = "PosterizeIncreasing"
TIMM_AA_POLICIES = tuple(_POSTERIZE_AS)


def timm_policy(name: str) -> tuple:
    """timm's AutoAugment policy ``name`` (original, originalr, v0, v0r) as ((op, prob, level), ...) rows."""
    table = _AA_IMAGENET if name.startswith("original") else _TIMM_V0
    post = _POSTERIZE_AS[name]
    return tuple(tuple((post if op == "Posterize" else op, p, m) for op, p, m in row) for row in table)


def timm_kernel(name: str, level: np.ndarray, negate: np.ndarray, *, width: int, height: int, translate_pct=0.45):
    """timm's ``LEVEL_TO_ARG[name]`` + op for an array of levels: the :mod:`.ops` kernel and its
    arguments (``negate``: timm's ``_randomly_negate`` came out negative)."""
    base = name.removesuffix("Increasing").removesuffix("Original").removesuffix("Rel")
    sgn = np.where(negate, -1.0, 1.0)
    lv = level / _LEVEL_DENOM
    if name in _PLAIN:
        return _PLAIN[name], np.zeros_like(level)
    if name == "Rotate":
        return "rotate", sgn * (lv * 30.0)
    if base in ("ShearX", "ShearY"):
        return _GEOM[base], sgn * (lv * 0.3)
    if name in ("TranslateXRel", "TranslateYRel"):
        # PIL's (1, 0, px, ...) samples x + px (content moves by -px); its nearest pixel rounds half up
        size = width if name == "TranslateXRel" else height
        return _GEOM[base], -np.floor((sgn * (lv * translate_pct)) * size + 0.5)
    if name.startswith("Posterize"):
        bits = np.floor(lv * 4)
        return "posterize", {"Posterize": bits, "PosterizeIncreasing": 4 - bits, "PosterizeOriginal": bits + 4}[name]
    if name.startswith("Solarize") and name != "SolarizeAdd":
        thresh = np.minimum(256, np.floor(lv * 256))
        return "solarize", 256 - thresh if name.endswith("Increasing") else thresh
    if name == "SolarizeAdd":
        return "solarize_add", np.minimum(128, np.floor(lv * 110))
    if base in _ENHANCE:
        inc = np.maximum(0.1, 1.0 + sgn * (lv * 0.9))
        return _ENHANCE[base], inc if name.endswith("Increasing") else lv * 1.8 + 0.1
    raise ArgumentError(f"timm op {name!r} is not supported (no batch kernel for it)")


class _Timm(_Layered):
    def __init__(self, magnitude_std, magnitude_max, translate_pct, fill, ignore_index, stream):
        super().__init__(fill, ignore_index, stream)
        if not (isinstance(magnitude_std, (int, float)) and magnitude_std >= 0):
            raise ArgumentError(f"magnitude_std={magnitude_std!r} must be >= 0 (inf: uniform in [0, magnitude])")
        self.magnitude_std = math.inf if magnitude_std > 100 else float(magnitude_std)  # timm: > 100 means inf
        self.magnitude_max = None if magnitude_max is None else _int("magnitude_max", magnitude_max, 0)
        self.upper = float(self.magnitude_max or _LEVEL_DENOM)  # timm: `magnitude_max or 10`
        self.translate_pct = float(translate_pct)

    def _level(self, m: np.ndarray, u1: np.ndarray, u2: np.ndarray) -> np.ndarray:
        if self.magnitude_std == math.inf:
            m = u1 * m
        elif self.magnitude_std > 0:
            m = m + self.magnitude_std * normals(u1, u2)
        return np.clip(m, 0.0, self.upper)

    def _kernels(self, layer, height, width):
        names, level, negate = layer
        kernels: list[str | None] = [None] * len(names)
        kargs = np.zeros(len(names))
        for name in set(names) - {""}:
            sel = names == name
            k, a = timm_kernel(
                name, level[sel], negate[sel], width=width, height=height, translate_pct=self.translate_pct
            )
            kargs[sel] = a
            for i in np.flatnonzero(sel):
                kernels[i] = k
        return kernels, kargs


def _check_timm_ops(names: Sequence[str]) -> None:
    probe = np.zeros(1)
    for n in names:
        timm_kernel(n, probe, probe.astype(bool), width=1, height=1)  # raises for unsupported names


class TimmRandAugment(_Timm):
    """timm's ``RandAugment`` (``rand_augment_transform``): ``num_layers`` ops drawn uniformly with
    repeats (or, with ``choice_weights``, weighted without repeats) from ``transforms`` (timm's
    ``_RAND_TRANSFORMS``, or ``_RAND_INCREASING_TRANSFORMS`` with ``increasing``), each applied with
    probability ``prob`` at level ``magnitude`` (+ gaussian noise ``magnitude_std``; inf: uniform in
    ``[0, magnitude]``), clipped to ``[0, magnitude_max or 10]``.

    Columns: ``5 * num_layers``: (op, apply, sign, two for the noise) per layer.
    """

    def __init__(
        self,
        *,
        magnitude: float = 10,
        num_layers: int = 2,
        prob: float = 0.5,
        magnitude_std: float = 0.0,
        magnitude_max: int | None = None,
        increasing: bool = False,
        transforms: Sequence[str] | None = None,
        choice_weights: Sequence[float] | None = None,
        translate_pct: float = 0.45,
        fill: Fill = TIMM_FILL,
        ignore_index: int = 255,
        stream: str = "TimmRandAugment",
    ):
        super().__init__(magnitude_std, magnitude_max, translate_pct, fill, ignore_index, stream)
        if not isinstance(magnitude, (int, float)) or not 0 <= magnitude <= self.upper:
            raise ArgumentError(
                f"magnitude={magnitude!r} must be in [0, {self.upper:g}] (timm's mmax raises the bound)"
            )
        self.magnitude, self.num_layers, self.prob = float(magnitude), _int("num_layers", num_layers, 0), prob
        _prob("prob", prob)
        self.increasing = bool(increasing)
        self.transforms = tuple(transforms or (_TIMM_RAND_INC if increasing else _TIMM_RAND))
        _check_timm_ops(self.transforms)
        self.choice_weights = None
        if choice_weights is not None:
            w = np.asarray(choice_weights, np.float64)
            if w.shape != (len(self.transforms),) or (w < 0).any() or (w > 0).sum() < self.num_layers:
                raise ArgumentError(
                    f"choice_weights={list(choice_weights)} needs {len(self.transforms)} weights >= 0, "
                    f"at least num_layers={self.num_layers} of them > 0"
                )
            self.choice_weights = w / w.sum()

    def plan(self, ids, *, seed, epoch, height, width):
        u = self._uniforms(ids, 5 * self.num_layers, seed, epoch)
        ops = np.asarray(self.transforms)
        left = None if self.choice_weights is None else np.tile(self.choice_weights, (len(ids), 1))
        out = []
        for layer in range(self.num_layers):
            uc, ua, us, u1, u2 = (u[:, 5 * layer + k] for k in range(5))
            if left is None:
                op = _choice(uc, len(ops))
            else:  # numpy's choice(replace=False, p=...): draw, drop the drawn, renormalize
                cdf = np.cumsum(left, axis=1)
                op = np.minimum((cdf <= (uc * cdf[:, -1])[:, None]).sum(1), len(ops) - 1)
                left[np.arange(len(ids)), op] = 0.0
            on = (self.prob >= 1.0) | (ua <= self.prob)
            level = self._level(np.full(len(ids), self.magnitude), u1, u2)
            out.append((np.where(on, ops[op], ""), level, us > 0.5))
        return out


class TimmAutoAugment(_Timm):
    """timm's ``AutoAugment`` (``auto_augment_transform``) with policy ``original``, ``originalr``,
    ``v0`` or ``v0r``: one sub-policy per sample, each op applied with its probability at its level.

    Columns: 9: (sub-policy, then (apply, sign, two for the noise) per op).
    """

    def __init__(
        self,
        policy: str = "v0",
        *,
        magnitude_std: float = 0.0,
        translate_pct: float = 0.45,
        fill: Fill = TIMM_FILL,
        ignore_index: int = 255,
        stream: str = "TimmAutoAugment",
    ):
        super().__init__(magnitude_std, None, translate_pct, fill, ignore_index, stream)
        if policy not in _POSTERIZE_AS:
            raise ArgumentError(f"timm AutoAugment policy={policy!r}: expected one of {', '.join(_POSTERIZE_AS)}")
        self.policy, self.table = policy, timm_policy(policy)

    def plan(self, ids, *, seed, epoch, height, width):
        u = self._uniforms(ids, 9, seed, epoch)
        sub = _choice(u[:, 0], len(self.table))
        out = []
        for slot in range(2):
            rows = [self.table[s][slot] for s in sub]
            ua, us, u1, u2 = (u[:, 1 + 4 * slot + k] for k in range(4))
            p = np.asarray([r[1] for r in rows])
            on = (p >= 1.0) | (ua <= p)
            level = self._level(np.asarray([float(r[2]) for r in rows]), u1, u2)
            out.append((np.where(on, np.asarray([r[0] for r in rows]), ""), level, us > 0.5))
        return out


# ---- timm's strings ----------------------------------------------------------------------------
_TA_NAMES = ("ta_wide", "trivialaugment", "trivialaugmentwide")
_RAND_KEYS = {"m": int, "n": int, "p": float, "mstd": float, "mmax": int, "inc": int, "w": int}


def _sections(aa: str, keys: dict) -> dict:
    """``m9``, ``mstd0.5``, ... -> ``{"m": 9, "mstd": 0.5}``; one-line ValueError naming a bad one."""
    out = {}
    for c in aa.split("-")[1:]:
        if c.startswith("t") and "t" in keys:
            out["t"] = c[1:]
            continue
        match = re.fullmatch(r"([a-z]+)(\d.*)", c)
        if not match:
            raise ArgumentError(f"aa={aa!r}: section {c!r} is not a key followed by a number (e.g. m9, mstd0.5)")
        key, val = match.groups()
        if key not in keys:
            raise ArgumentError(f"aa={aa!r}: unknown section {c!r} (known: {', '.join(sorted(keys))})")
        if key in out:
            raise ArgumentError(f"aa={aa!r}: section {key!r} given twice")
        try:
            out[key] = keys[key](val)
        except ValueError:
            raise ArgumentError(f"aa={aa!r}: section {c!r}: {val!r} is not a valid {keys[key].__name__}") from None
    return out


def rand_augment_transform(config_str: str, **kwargs) -> TimmRandAugment:
    """timm's ``rand_augment_transform`` string (``rand-m9-n3-mstd0.5-inc1``, ``rand-mstd1-tweights``,
    timm < 0.9's ``rand-m9-w0``) as a :class:`TimmRandAugment`; ``kwargs`` go to it (fill, ...)."""
    if config_str.split("-")[0] != "rand":
        raise ArgumentError(f"aa={config_str!r}: a RandAugment string starts with 'rand-'")
    sec = _sections(config_str, {**_RAND_KEYS, "t": str})
    inc = bool(sec.pop("inc", 0))
    args = dict(increasing=inc, magnitude=sec.get("m", 10), num_layers=sec.get("n", 2), prob=sec.get("p", 0.5))
    args.update(magnitude_std=sec.get("mstd", 0.0), magnitude_max=sec.get("mmax"))
    if "t" in sec and "w" in sec:
        raise ArgumentError(f"aa={config_str!r}: give either t<name> or w0, not both")
    if sec.get("t") == "weights":
        args.update(transforms=tuple(_TIMM_WEIGHTED), choice_weights=tuple(_TIMM_WEIGHTED.values()))
    elif "t" in sec:
        raise ArgumentError(f"aa={config_str!r}: transform set 't{sec['t']}' is not supported (only 'tweights')")
    if "w" in sec:
        if sec["w"] != 0:
            raise ArgumentError(f"aa={config_str!r}: only the weight set w0 exists")
        args.update(choice_weights=_TIMM_W0)
    try:
        return TimmRandAugment(**args, **kwargs)
    except ValueError as e:
        raise ArgumentError(f"aa={config_str!r}: {e}") from None


def auto_augment_transform(config_str: str, **kwargs) -> TimmAutoAugment:
    """timm's ``auto_augment_transform`` string (``original``, ``v0r-mstd0.5``, ...) as a :class:`TimmAutoAugment`."""
    policy = config_str.split("-")[0]
    if policy not in TIMM_AA_POLICIES:
        raise ArgumentError(f"aa={config_str!r}: unknown AutoAugment policy {policy!r} ({', '.join(TIMM_AA_POLICIES)})")
    return TimmAutoAugment(policy, magnitude_std=_sections(config_str, {"mstd": float}).get("mstd", 0.0), **kwargs)


def parse_aa(aa: str, *, fill: Fill = None, ignore_index: int = 255) -> BatchTransform:
    """The transform an augmentation string names.

    Args:
        aa: timm's (``rand-m9-mstd0.5-inc1``, ``rand-m7-n3``, ``original``, ``originalr``, ``v0``,
            ``v0r``, ``v0-mstd0.5``, ...) or ``ta_wide`` / ``trivialaugment`` (torchvision's
            TrivialAugmentWide). ``augmix`` and ``3a`` are refused.
        fill: geometric fill; ``None``: the policy's own (timm: :data:`TIMM_FILL`, torchvision: 0).
        ignore_index: the masks' fill.

    Raises:
        ValueError: one line naming the part of ``aa`` that does not parse or is out of range.
    """
    if not isinstance(aa, str) or not aa:
        raise ArgumentError(f"aa={aa!r} must be a non-empty string such as 'rand-m9-mstd0.5-inc1'")
    name = aa.split("-")[0]
    kw = {"ignore_index": ignore_index} if fill is None else {"fill": fill, "ignore_index": ignore_index}
    if name == "rand":
        return rand_augment_transform(aa, **kw)
    if name in TIMM_AA_POLICIES:
        return auto_augment_transform(aa, **kw)
    if name in _TA_NAMES:
        if aa != name:
            raise ArgumentError(f"aa={aa!r}: {name} takes no sections")
        return TrivialAugmentWide(**kw)
    if name in ("augmix", "3a"):
        raise ArgumentError(f"aa={aa!r}: timm's {name} is not supported on batches (use rand-..., original or ta_wide)")
    raise ArgumentError(f"aa={aa!r}: unknown policy {name!r} (rand-..., {', '.join(TIMM_AA_POLICIES + _TA_NAMES)})")


__all__ = [
    "TIMM_AA_POLICIES",
    "TIMM_FILL",
    "TimmAutoAugment",
    "TimmRandAugment",
    "auto_augment_transform",
    "parse_aa",
    "rand_augment_transform",
    "timm_kernel",
    "timm_policy",
]
