"""Augmentation as pure functions of ``(seed, epoch, sample position)``.

:mod:`.crops` computes the crop boxes and flips of a batch (RandomResizedCrop, the val center
crop) from the stored sizes alone, before anything is decoded, so every backend decodes exactly
the region it needs and a resumed run sees the same crops; a mask gets its image's box and flip
(:func:`~.crops.crop_mask`, nearest neighbour). :class:`~.crops.CropSpec` is a Loader's crop
recipe (size, scale, ratio, the val resize).
"""

from .crops import (
    ATTEMPTS,
    MAX_CROP,
    RATIO,
    SCALE,
    VAL_CROP_FRACTION,
    CropSpec,
    center_crop,
    crop_mask,
    random_resized_crop,
    uniforms,
)

__all__ = [
    "ATTEMPTS",
    "MAX_CROP",
    "RATIO",
    "SCALE",
    "VAL_CROP_FRACTION",
    "CropSpec",
    "center_crop",
    "crop_mask",
    "random_resized_crop",
    "uniforms",
]
