"""Augmentation as pure functions of ``(seed, epoch, sample position)``.

=================  ===========================================================================
``crops``          the crop boxes and flips of a batch (RandomResizedCrop, the val center crop)
                   from the stored sizes alone, before anything is decoded, so every backend
                   decodes exactly the region it needs; a mask gets its image's box and flip
                   (:func:`~.crops.crop_mask`); :class:`~.crops.CropSpec`, a Loader's recipe
``params``         what the ops share: kernel names, :func:`~.params.check_batch`, per-sample
                   parameters and fills, random streams (:func:`~.params.stream_seed`)
``geometric``      shear, translate, rotate: one gather per batch, masks moved along
``photometric``    brightness, contrast, hue, posterize, solarize, equalize, ...
``ops``            batch image ops on uint8 ``[N, C, H, W]`` on any device, one parameter per
                   sample (torchvision's kernels, all importable here); :func:`~.ops.apply_ops`,
                   each sample its own kernel
``base``           :class:`BatchTransform`, the base of every transform, and its random columns
``policies``       torchvision's RandAugment, TrivialAugmentWide, AutoAugment
``timm_policies``  timm's RandAugment and AutoAugment and their strings
                   (``rand-m9-mstd0.5-inc1``): :func:`parse_aa`
``jitter``         ColorJitter (torchvision)
``erasing``        RandomErasing (timm)
``chain``          :class:`BatchAugment`, and :func:`build_augment` (timm's ``create_transform``)
``mixing``         MixUp and CutMix with label smoothing, as timm's ``Mixup``: :func:`build_mixing`
``schedule``       :class:`ProgressiveCrop`, the train crop of each epoch (FFCV's progressive
                   resizing), for ``Loader.set_crop``
=================  ===========================================================================

Every sample draws its own parameters from :func:`~.crops.uniforms` (a counter hash of
``(seed, epoch, sample position)``), so a sample is augmented the same on every backend, at any
batch size and after a resume. Geometric ops move a mask with its image; photometric ops leave
masks alone; erasing and mixing refuse masks (they would invent a class where none is).
"""

from .base import BatchTransform
from .chain import BatchAugment, build_augment
from .crops import (
    ATTEMPTS,
    MAX_CROP,
    RATIO,
    SCALE,
    VAL_CROP_FRACTION,
    CropSpec,
    center_crop,
    crop_mask,
    full_places,
    letterbox_places,
    random_resized_crop,
    scale_jitter,
    uniforms,
    whole_image,
)
from .erasing import RandomErasing
from .jitter import ColorJitter
from .mixing import Mixing, build_mixing
from .policies import AutoAugment, RandAugment, TrivialAugmentWide
from .schedule import ProgressiveCrop
from .timm_policies import TimmAutoAugment, TimmRandAugment, parse_aa

__all__ = [
    "scale_jitter",
    "full_places",
    "letterbox_places",
    "whole_image",
    "ATTEMPTS",
    "MAX_CROP",
    "RATIO",
    "SCALE",
    "VAL_CROP_FRACTION",
    "AutoAugment",
    "BatchAugment",
    "BatchTransform",
    "ColorJitter",
    "CropSpec",
    "Mixing",
    "ProgressiveCrop",
    "RandAugment",
    "RandomErasing",
    "TimmAutoAugment",
    "TimmRandAugment",
    "TrivialAugmentWide",
    "build_augment",
    "build_mixing",
    "center_crop",
    "crop_mask",
    "parse_aa",
    "random_resized_crop",
    "uniforms",
]
