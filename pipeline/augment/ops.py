"""Batched augmentation kernels on uint8 ``[N, C, H, W]`` images, one parameter per sample: the
dispatcher :func:`apply_ops`, and the one namespace of every kernel and what they share.

Each kernel is the torchvision.transforms.v2.functional tensor kernel of the same name run on a
whole batch at once: sample ``i`` gets parameter ``p[i]`` and (to the rounding bounds that
tests/pipeline/augment/test_ops.py states) the pixels torchvision gives it alone. Parameters are
numbers, sequences, numpy arrays or tensors of length ``N`` (a number: the same for all). The
kernels live in :mod:`.geometric` (shear, translate, rotate: they move masks) and
:mod:`.photometric` (the rest), their shared checks in :mod:`.params`; all are importable from here.

The arithmetic is elementwise float32 or integer, with no order-dependent float reduction, no
convolution and no fused multiply-add, so a sample's result does not depend on the rest of its
batch; for the same reason CPU and CUDA should give the same pixels (IEEE elementwise ops; not
yet checked on a GPU). :func:`apply_ops` is the dispatcher the policies use: each sample names
one kernel (or none) and one argument.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from stoker.errors import ArgumentError

from .geometric import (
    affine,
    geometric_matrices,
    inverse_affine,
    rotate,
    shear_x,
    shear_y,
    translate_x,
    translate_y,
)
from .params import GEOMETRIC, KERNELS, Fill, Moved, PerSample, _param, check_batch, normals, stream_seed
from .photometric import (
    autocontrast,
    brightness,
    contrast,
    equalize,
    hue,
    invert,
    posterize,
    saturation,
    sharpness,
    solarize,
    solarize_add,
)

# On CPU, apply_ops runs a kernel over 8 samples at a time: its float32 temporaries then stay in
# cache (2-3x faster at 224 px than one pass over 256); results are the same, samples being independent.
_CPU_CHUNK = 8

_PHOTOMETRIC = {
    "brightness": brightness,
    "saturation": saturation,
    "contrast": contrast,
    "sharpness": sharpness,
    "hue": hue,
    "posterize": posterize,
    "solarize": solarize,
    "solarize_add": solarize_add,
    "autocontrast": lambda x, _: autocontrast(x),
    "equalize": lambda x, _: equalize(x),
    "invert": lambda x, _: invert(x),
}


def apply_ops(
    images: torch.Tensor,
    kernel: Sequence[str | None],
    arg: PerSample | None,
    *,
    fill: Fill = None,
    masks: torch.Tensor | None = None,
    ignore_index: int = 255,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Apply to each sample its own kernel and argument; all geometric samples go through one
    :func:`affine`, the others one call per kernel on the samples that name it.

    Args:
        images: uint8 ``[N, C, H, W]`` (any memory format; the result is contiguous).
        kernel: ``N`` names of :data:`KERNELS`, ``None`` to leave a sample as it is.
        arg: ``N`` arguments (ignored by autocontrast, equalize, invert).
        fill: the geometric kernels' fill (see :func:`affine`).
        masks: optional uint8 ``[N, H, W]``: moved by the geometric kernels, left by the others.
        ignore_index: the masks' fill.

    Returns:
        ``(images, masks)``, ``masks`` ``None`` when none were given; the inputs are not modified.

    Example:
        >>> out, _ = apply_ops(images, ["rotate", None, "contrast"], [15.0, 0.0, 1.4])
    """
    check_batch(images, masks=masks)
    n, _, h, w = images.shape
    if len(kernel) != n:
        raise ArgumentError(f"apply_ops needs one kernel per sample ({n}), got {len(kernel)}")
    unknown = set(kernel) - set(KERNELS) - {None}
    if unknown:
        raise ArgumentError(f"unknown kernel {sorted(unknown)[0]!r}; expected one of {', '.join(KERNELS)}")
    args = _param(0.0 if arg is None else arg, n, "arg")
    names = np.asarray([k or "" for k in kernel])
    # every sample takes one kernel, applied to its input rows: the output needs a copy of the
    # input only where some sample takes none
    src = images.contiguous()
    out = torch.empty_like(src) if all(names) else src.clone()
    src_masks, masks = (None, None) if masks is None else (masks.contiguous(), masks.contiguous().clone())
    step = _CPU_CHUNK if images.device.type == "cpu" else max(n, 1)
    geo = np.isin(names, GEOMETRIC)
    for name in (["geometric"] if geo.any() else []) + sorted(set(names[~geo]) - {""}):
        rows = np.flatnonzero(geo if name == "geometric" else names == name)
        for start in range(0, len(rows), step):
            sel = rows[start : start + step]
            if sel[-1] - sel[0] + 1 == len(sel):  # a run of rows: views, no gather and scatter
                idx = slice(int(sel[0]), int(sel[-1]) + 1)
                take, put = (lambda t, i=idx: t[i]), (lambda t, v, i=idx: t[i].copy_(v))
            else:
                idx = torch.as_tensor(sel).to(images.device)
                take, put = (lambda t, i=idx: t.index_select(0, i)), (lambda t, v, i=idx: t.index_copy_(0, i, v))
            if name != "geometric":
                put(out, _PHOTOMETRIC[name](take(src), args[sel]))
                continue
            mats = geometric_matrices(list(names[sel]), args[sel], h, w)
            moved = affine(
                take(src), mats, fill=fill, masks=None if masks is None else take(src_masks), ignore_index=ignore_index
            )
            if masks is not None:
                moved, sub_masks = moved
                put(masks, sub_masks)
            put(out, moved)
    return out, masks


__all__ = [
    "GEOMETRIC",
    "KERNELS",
    "Fill",
    "Moved",
    "PerSample",
    "affine",
    "apply_ops",
    "autocontrast",
    "brightness",
    "check_batch",
    "contrast",
    "equalize",
    "geometric_matrices",
    "hue",
    "inverse_affine",
    "invert",
    "normals",
    "posterize",
    "rotate",
    "saturation",
    "sharpness",
    "shear_x",
    "shear_y",
    "solarize",
    "solarize_add",
    "stream_seed",
    "translate_x",
    "translate_y",
]
