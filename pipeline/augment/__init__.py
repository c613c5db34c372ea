"""Augmentation as pure functions of ``(seed, epoch, sample position)``.

:mod:`.crops` computes the crop boxes and flips of a batch (RandomResizedCrop, the val center
crop) from the stored sizes alone, before anything is decoded, so every backend decodes exactly
the region it needs and a resumed run sees the same crops.
"""

from .crops import ATTEMPTS, RATIO, SCALE, VAL_CROP_FRACTION, center_crop, random_resized_crop, uniforms

__all__ = ["ATTEMPTS", "RATIO", "SCALE", "VAL_CROP_FRACTION", "center_crop", "random_resized_crop", "uniforms"]
