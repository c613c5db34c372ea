"""Object detection (``stoker train --task detect``): a torchvision detector built without
downloaded weights, trained on the Loader's box batches, scored by COCO mAP.

:class:`DetectionNet` wraps a torchvision detector so that it takes what the Loader hands out: the
images normalized by :class:`~.normalize.Normalize` in front of it and the box batch
(:class:`~stoker.pipeline.shards.boxes.BoxBatch`); in training ``net(images, boxes)`` is the summed
loss, in evaluation ``net(images)`` the detections (:class:`Detections`, 0-based labels, boxes in
the batch image's pixels). Its own transform neither normalizes again nor resizes (the Loader's
crop is the input size).

Architectures (``--arch``): ``fcos_tiny`` (the default: an FCOS head on a small 3-level FPN
backbone, trains on a CPU in seconds), or any torchvision detection model name
(``fasterrcnn_mobilenet_v3_large_fpn``, ``retinanet_resnet50_fpn``, ``fcos_resnet50_fpn``, ...),
built with ``weights=None, weights_backbone=None``; or your own torchvision detector,
``--model FILE.py:FUNCTION`` (:func:`user_detector`). Validation
(:class:`stoker.model.train.tasks.DetectMetrics`): torchmetrics' ``MeanAveragePrecision``
(pycocotools; the ``stoker[detect]`` extra): ``map`` (COCO mAP@[.5:.95], picks ``best.pt``) and
``map50``.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch
from torch import nn

from stoker.errors import ArgumentError

#: stoker's own detector (the default of ``--task detect``)
TINY = "fcos_tiny"


class Detections(list):
    """A detector's outputs: ``dict(boxes [k, 4] xyxy, scores [k], labels [k])`` an image, labels
    0-based (the split's class indices)."""

    def float(self) -> Detections:
        """Itself: what the evaluation asks of every network's outputs (logits are cast)."""
        return self

    def scaled(self, factors: Any) -> Detections:
        """The boxes multiplied per image by ``factors[k]`` (``(sx, sy)``): into another image's pixels."""
        out = Detections()
        for d, (sx, sy) in zip(self, factors, strict=True):
            scale = torch.tensor([sx, sy, sx, sy], dtype=d["boxes"].dtype, device=d["boxes"].device)
            out.append({**d, "boxes": d["boxes"] * scale})
        return out


class DetectionNet(nn.Module):
    """A torchvision detector taking normalized image batches and box batches (see the module).

    Args:
        detector: a torchvision detection model (its transform set not to normalize or resize).
        in_channels: the images' channels (a 1-channel batch is repeated for a 3-channel detector).
    """

    def __init__(self, detector: nn.Module, *, in_channels: int = 3, channels: int = 3):
        super().__init__()
        self.detector = detector
        self.repeat = channels if in_channels == 1 and channels != 1 else 1

    def forward(self, images: torch.Tensor, boxes: Any = None):
        if self.repeat > 1:
            images = images.expand(-1, self.repeat, -1, -1)
        if self.training and boxes is not None:
            targets = [{"boxes": t["boxes"], "labels": t["labels"] + 1} for t in boxes.to_list(crowd=False)]
            losses = self.detector(list(images), targets)
            return sum(losses.values())
        if self.training:
            raise ArgumentError("a detector in training mode needs its boxes: net(images, boxes)")
        out = self.detector(list(images))
        return Detections({"boxes": o["boxes"], "scores": o["scores"], "labels": o["labels"] - 1} for o in out)


def _conv(cin: int, cout: int, stride: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class TinyFPN(nn.Module):
    """A small backbone with an FPN: features at strides 8, 16 and 32, ``out_channels`` each."""

    def __init__(self, in_channels: int = 3, width: int = 24, out_channels: int = 64):
        super().__init__()
        w = width
        self.stem = nn.Sequential(_conv(in_channels, w, 2), _conv(w, w, 1), _conv(w, 2 * w, 2))
        self.c3, self.c4, self.c5 = _conv(2 * w, 2 * w, 2), _conv(2 * w, 4 * w, 2), _conv(4 * w, 4 * w, 2)
        self.lateral = nn.ModuleList(nn.Conv2d(c, out_channels, 1) for c in (2 * w, 4 * w, 4 * w))
        self.smooth = nn.ModuleList(nn.Conv2d(out_channels, out_channels, 3, padding=1) for _ in range(3))
        self.out_channels = out_channels

    def forward(self, x: torch.Tensor) -> OrderedDict:
        c3 = self.c3(self.stem(x))
        c4 = self.c4(c3)
        c5 = self.c5(c4)
        p5 = self.lateral[2](c5)
        p4 = self.lateral[1](c4) + nn.functional.interpolate(p5, size=c4.shape[-2:], mode="nearest")
        p3 = self.lateral[0](c3) + nn.functional.interpolate(p4, size=c3.shape[-2:], mode="nearest")
        return OrderedDict((str(k), s(p)) for k, (s, p) in enumerate(zip(self.smooth, (p3, p4, p5), strict=True)))


def _transform_kw(image_size: int) -> dict:
    """The detector's own transform: no second normalization (Normalize is in front), no resize."""
    return {"min_size": image_size, "max_size": 4 * image_size, "image_mean": [0.0] * 3, "image_std": [1.0] * 3}


def build_detector(arch: str, num_classes: int, *, image_size: int | None = None, in_channels: int = 3) -> nn.Module:
    """A randomly initialised detector of ``num_classes`` classes (no weight downloads), as a
    :class:`DetectionNet`. Its classes are shifted by one inside (torchvision's 0 is background).

    Raises:
        ArgumentError: an ``arch`` that is no torchvision detection model.
    """
    import torchvision
    from torchvision.models import detection

    size = int(image_size or 320)
    if arch == TINY:
        from torchvision.models.detection.anchor_utils import AnchorGenerator
        from torchvision.models.detection.fcos import FCOSHead

        backbone = TinyFPN(in_channels)
        anchors = AnchorGenerator(sizes=((8,), (16,), (32,)), aspect_ratios=((1.0,),) * 3)
        head = FCOSHead(backbone.out_channels, 1, num_classes + 1, num_convs=2)
        kw = _transform_kw(size)
        kw["image_mean"], kw["image_std"] = [0.0] * in_channels, [1.0] * in_channels
        net = detection.FCOS(backbone, num_classes + 1, anchor_generator=anchors, head=head, **kw)
        return DetectionNet(net, in_channels=in_channels, channels=in_channels)
    names = sorted(torchvision.models.list_models(module=detection))
    if arch not in names:
        raise ArgumentError(f"unknown detection arch {arch!r}: choose from {', '.join([TINY, *names])}")
    net = torchvision.models.get_model(
        arch, weights=None, weights_backbone=None, num_classes=num_classes + 1, **_transform_kw(size)
    )
    return DetectionNet(net, in_channels=in_channels)


def user_detector(spec: str, num_classes: int, *, image_size: int, in_channels: int = 3) -> DetectionNet:
    """``--model FILE.py:FUNCTION`` for ``--task detect``: the factory builds a torchvision detection
    model (``FCOS``, ``RetinaNet``, ``FasterRCNN``, ... : a list of images and target dicts in, its
    losses or its detections out), called with ``num_classes`` = the split's classes + 1 (torchvision's
    class 0 is the background). Its transform is set as ``--arch``'s (no second normalization, no
    resize) and it is wrapped in a :class:`DetectionNet`, then run once on a zero batch.

    Raises:
        UsageError: the factory returns another kind of network, or the detector fails on a batch.
    """
    from torchvision.models.detection.transform import GeneralizedRCNNTransform

    from stoker.errors import UsageError, arg, one_line

    from .user import build_user_model

    net = build_user_model(spec, num_classes + 1, in_channels=in_channels)
    transform = getattr(net, "transform", None)
    if not isinstance(transform, GeneralizedRCNNTransform):
        raise UsageError(
            f"{arg('model')} {spec!r}: --task detect needs a torchvision detection model (FCOS, RetinaNet, "
            f"FasterRCNN, ... taking images and target dicts), not a {type(net).__name__}; or use --arch"
        )
    kw = _transform_kw(image_size)
    transform.min_size, transform.max_size = (kw["min_size"],), kw["max_size"]
    transform.image_mean, transform.image_std = kw["image_mean"], kw["image_std"]
    wrapped = DetectionNet(net, in_channels=in_channels)
    x = torch.zeros((2, in_channels, image_size, image_size))
    wrapped.eval()
    try:
        with torch.no_grad():
            wrapped(x)
    except Exception as e:  # boundary: the user's network, raised as one UsageError line
        raise UsageError(
            f"{arg('model')} {spec!r}: the detector fails on a {list(x.shape)} batch ({type(e).__name__}: "
            f"{one_line(e)}); it gets {in_channels} channel(s) at {image_size} px ({arg('crop')})"
        ) from None
    return wrapped.train()


def detection_loss(out: torch.Tensor, boxes: Any) -> torch.Tensor:
    """The task's loss: the detector computed it in its forward (``net(images, boxes)``)."""
    return out


detection_loss.forward_targets = True  # TrainStep passes the targets into the forward


def synthetic_boxes(n: int, hw: tuple[int, int], classes: int, generator: torch.Generator):
    """``n`` samples of 1 to 3 random boxes in an image of ``hw``: a step timed without data."""
    from stoker.pipeline.shards.boxes import BoxBatch

    h, w = hw
    rows = []
    for _ in range(n):
        k = int(torch.randint(1, 4, (1,), generator=generator))
        xy = torch.rand((k, 2), generator=generator) * torch.tensor([w * 0.6, h * 0.6])
        wh = (torch.rand((k, 2), generator=generator) * 0.3 + 0.1) * torch.tensor([w, h])
        cls = torch.randint(0, max(classes, 1), (k, 1), generator=generator).float()
        rows.append(torch.cat([xy, xy + wh, cls, torch.zeros(k, 1)], 1).numpy())
    return BoxBatch.from_rows(rows)


__all__ = ["TINY", "DetectionNet", "Detections", "TinyFPN", "build_detector", "detection_loss", "user_detector"]
