"""A trained run's network for inference: the same resize, crop and normalization as validation.

>>> from stoker.model import Predictor
>>> predict = Predictor.from_checkpoint("runs/r50/best.pt", device="cuda")   # doctest: +SKIP
>>> logits = predict(["cat.jpg", "dog.png"])       # the val transform, then the network
>>> batch = predict.preprocess(["cat.jpg"])        # uint8 [1, 3, 224, 224], as the Loader's val batch

A checkpoint also carries the bare network's ``state_dict`` (key ``"net"``: no Normalize in front,
no wrapper), what ``torchvision.models.resnet50().load_state_dict(...)`` takes:
``torch.load("best.pt", weights_only=True)["net"]``.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from .checkpoint import load_checkpoint, load_model_state
from .nets import SegmentationOutput, build_model
from .normalize import Normalize, with_normalize, with_target_units


def bare_state_dict(model: nn.Module) -> dict:
    """The state_dict of the network inside ``with_normalize(...)`` (and inside the segmentation
    wrapper): the keys a stock model of its architecture loads."""
    net = (
        model.net
        if isinstance(model, nn.Sequential) and isinstance(getattr(model, "normalize", None), Normalize)
        else model
    )
    if isinstance(net, SegmentationOutput):
        net = net.net
    return net.state_dict()


class Predictor:
    """A run's network with its validation transform: ``predictor(images) -> outputs``.

    Args:
        model: the network with :class:`~.normalize.Normalize` in front (takes uint8 batches).
        config: the run's resolved config (``RUN/config.json``; a checkpoint's ``"config"``).
        device: where the network runs.
    """

    def __init__(self, model: nn.Module, config: dict, *, device: str | torch.device = "cpu"):
        from stoker.pipeline.augment import CropSpec

        self.device = torch.device(device)
        self.model = model.to(self.device).eval()
        self.config = dict(config)
        crop = config.get("crop", 224)
        self.crops = CropSpec.of(
            tuple(crop) if isinstance(crop, list) else crop,
            crop_pct=config.get("crop_pct"),
            val_resize=config.get("val_resize"),
            val_fit=config.get("val_fit", "auto"),
        )
        self.channels = int(config.get("channels") or 3)
        self.classes = config.get("classes")
        #: the val transform keeps the whole image (a detector's: the split's kind says)
        self.letterbox = self.crops.letterbox(_kind_fit(config.get("task", "classify")))

    @classmethod
    def from_checkpoint(
        cls, path: str | Path, *, device: str | torch.device = "cpu", net: nn.Module | None = None
    ) -> Predictor:
        """The network of the checkpoint at ``path`` (``RUN/best.pt`` or ``last.pt``), built as its
        run built it: ``--arch``, or a ``--model FILE.py:FUNCTION`` imported again (``net=``: your
        network, built as for training, when that file is not at hand). A regression trained on
        standardized targets predicts in the targets' own units."""
        state = load_checkpoint(path)
        cfg = state["config"]
        crop = cfg.get("crop", 224)
        side = crop if isinstance(crop, int) else min(crop)
        channels = int(cfg.get("channels") or 3)
        if net is None and cfg.get("model") and cfg.get("task") == "detect":
            from .detection import user_detector

            net = user_detector(cfg["model"], cfg["num_outputs"], image_size=side, in_channels=channels)
        if net is None and cfg.get("model"):
            from .user import build_user_model

            net = build_user_model(cfg["model"], cfg["num_outputs"], in_channels=channels)
        if net is None:
            net = build_model(
                cfg["arch"], cfg["num_outputs"], image_size=side, in_channels=channels, task=cfg.get("task", "classify")
            )
        model = with_normalize(net, cfg.get("mean") or (0.485, 0.456, 0.406), cfg.get("std") or (0.229, 0.224, 0.225))
        units = cfg.get("target_units")
        if units:
            with_target_units(model, units["mean"], units["std"])
        load_model_state(model, state["model"], source=str(path))
        return cls(model, cfg, device=device)

    def preprocess(self, images: Sequence[Any]) -> torch.Tensor:
        """The val transform of the Loader: each image (a path, bytes, or a PIL image) resized so
        its shorter side is ``min(crop) / crop_pct`` (or ``val_resize``), center-cropped to
        ``crop``, antialiased bilinear (a detector's: the whole image letterboxed); a uint8
        ``[N, C, H, W]`` batch on the device."""
        return self._preprocess(images)[0]

    def _preprocess(self, images: Sequence[Any]) -> tuple[torch.Tensor, np.ndarray]:
        """The batch and each image's ``(width, height)``."""
        from PIL import Image

        from stoker.pipeline.augment import center_crop, letterbox_places, whole_image
        from stoker.pipeline.backends.letterbox import fit_images
        from stoker.pipeline.backends.resize import MODES, decode_region, resize_into

        h, w = self.crops.size
        out = np.empty((len(images), self.channels, h, w), np.uint8)
        sizes = np.zeros((len(images), 2), np.int64)
        for k, image in enumerate(images):
            if isinstance(image, (str, Path)):
                image = Path(image).read_bytes()
            data = bytes(image) if isinstance(image, (bytes, bytearray)) else None
            size = sizes[k] = Image.open(io.BytesIO(data)).size if data is not None else image.size
            if self.letterbox:
                box = whole_image(np.array([size]))[0]
            else:
                box = center_crop(np.array([size]), self.crops.size, self.crops.crop_pct, resize=self.crops.val_resize)
                box = box[0]
            if data is not None:  # decoded as the Loader's pil backend decodes (DCT scaling included)
                image, box = decode_region(data, box, (h, w), self.channels)
            else:
                image = image.convert(MODES[self.channels])
            resize_into(out, k, image, (h, w), False, box=tuple(box))
        batch = torch.from_numpy(out)
        if self.letterbox:  # as the Loader's val letterbox: the whole image fitted back to its aspect
            batch = fit_images(batch, letterbox_places(sizes, (h, w)))
        return batch.to(self.device), sizes

    @torch.no_grad()
    def __call__(self, images: Sequence[Any]) -> Any:
        """The network's outputs for ``images`` (logits, values, or per-pixel logits; a detector's
        boxes in each original image's pixels)."""
        from stoker.pipeline.augment import letterbox_places

        batch, sizes = self._preprocess(images)
        out = self.model(batch)
        scaled = getattr(out, "scaled", None)  # outputs in the batch's pixels: back to each image's
        if scaled is not None and self.letterbox:
            places = letterbox_places(sizes, self.crops.size)
            out = scaled((sizes / places[:, 2:]).tolist())
        return out


def _kind_fit(task: str) -> str:
    """The val transform of the target kind a ``task`` trains on (``center`` or ``letterbox``)."""
    from stoker.pipeline.shards.kinds import kinds

    return next((k.val_fit for k in kinds() if k.task == task), "center")


__all__ = ["Predictor", "bare_state_dict"]
