"""How a crop is fitted, by name: torch-free, so ``--help`` and :class:`TrainConfig`'s checks
import no torch (:class:`~stoker.pipeline.augment.CropSpec` takes these names)."""

#: the val transforms: ``center`` (resize the shorter side, center crop), ``letterbox`` (the whole
#: image resized keeping its aspect ratio into the top-left of the output, the rest zero) or
#: ``auto`` (the split's kind says: a kind whose targets follow the crop keeps the whole image)
VAL_FITS = ("auto", "center", "letterbox")
#: the train crops: ``rrc`` (RandomResizedCrop) or ``scale-jitter`` (detection's large-scale
#: jitter: the whole image fitted to the output, scaled by a random factor in ``jitter``, then a
#: random crop of the output's size, or the output padded where the image is smaller)
TRAIN_FITS = ("rrc", "scale-jitter")
#: torchvision's detection references (``ScaleJitter(scale_range=(0.1, 2.0))``)
JITTER = (0.1, 2.0)

__all__ = ["JITTER", "TRAIN_FITS", "VAL_FITS"]
