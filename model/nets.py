"""Networks by name: the inception-block net done right, the case study's, and torchvision's.

The slow-training report that motivates stoker used one inception block at full input
resolution followed by ``MaxPool2d`` and ``flatten`` into a 301,056-input ``Linear``
(:class:`stoker.model.case_study.ReportNet`, kept apart, for comparisons).
:class:`InceptionNet` keeps the block but puts a cheap strided stem in front and ends with
global average pooling and a small head: any input size, < 1 M parameters, 13x fewer
FLOPs at 224 (1.48 vs 19.5 GFLOP per image, forward).
"""

from __future__ import annotations

import torch
from torch import nn

from stoker.errors import ArgumentError, unknown_choice

from .blocks import ConvBNReLU, InceptionBlock
from .case_study import ReportNet

#: Names :func:`build_model` accepts besides torchvision's classification models.
STOKER_ARCHS = ("inception", "report")


class InceptionNet(nn.Module):
    """The report's inception block, done right: stem → block → global pool → Linear.

    Args:
        num_classes: Outputs of the head (1 for regression).
        in_channels: Input channels.
        stem: Put two stride-2 ``ConvBNReLU`` (3x3, 32 then 64 channels) before the block,
            so the block runs at 1/4 resolution (16x fewer FLOPs in the block). ``False``
            runs the block on the raw image, exactly as in the report.
        dropout: Dropout before the head (0 disables it).
    """

    def __init__(
        self, num_classes: int = 1000, *, in_channels: int = 3, stem: bool = True, dropout: float = 0.0
    ) -> None:
        super().__init__()
        if num_classes < 1:
            raise ArgumentError(f"num_classes={num_classes} must be >= 1")
        if not 0.0 <= dropout < 1.0:
            raise ArgumentError(f"dropout={dropout} must be in [0, 1)")
        self.stem = (
            nn.Sequential(ConvBNReLU(in_channels, 32, 3, stride=2), ConvBNReLU(32, 64, 3, stride=2))
            if stem
            else nn.Identity()
        )
        self.block = InceptionBlock(64 if stem else in_channels)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.fc = nn.Linear(InceptionBlock.out_channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.block(self.stem(x)))
        return self.fc(self.dropout(torch.flatten(x, 1)))


class InceptionSegNet(nn.Module):
    """The inception block as a small segmentation network: the strided stem (1/4 resolution),
    the block, a 1x1 classifier per pixel and a bilinear upsampling back to the input's size.
    ``--arch inception`` for ``--task segment``: fast on a CPU (the demo's), < 0.5 M parameters;
    torchvision's segmentation models (``lraspp_mobilenet_v3_large``, ``deeplabv3_resnet50``, ...)
    for real data.

    Args:
        num_classes: Classes per pixel.
        in_channels: Input channels.
    """

    def __init__(self, num_classes: int, *, in_channels: int = 3) -> None:
        super().__init__()
        if num_classes < 1:
            raise ArgumentError(f"num_classes={num_classes} must be >= 1")
        self.stem = nn.Sequential(ConvBNReLU(in_channels, 32, 3, stride=2), ConvBNReLU(32, 64, 3, stride=2))
        self.block = InceptionBlock(64)
        self.classifier = nn.Conv2d(InceptionBlock.out_channels, num_classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.classifier(self.block(self.stem(x)))
        return nn.functional.interpolate(logits, size=x.shape[-2:], mode="bilinear", align_corners=False)


def torchvision_archs(task: str = "classify") -> list[str]:
    """Names of torchvision's classification models (``resnet50``, ...), or with
    ``task="segment"`` its segmentation models (``lraspp_mobilenet_v3_large``, ``fcn_resnet50``,
    ``deeplabv3_resnet50``, ...)."""
    import torchvision

    module = torchvision.models.segmentation if task == "segment" else torchvision.models
    return sorted(torchvision.models.list_models(module=module))


class SegmentationOutput(nn.Module):
    """A torchvision segmentation model returning its ``"out"`` logits ``[N, C, H, W]`` (at the
    input's size) instead of a dict, so losses, AMP and DDP see a tensor like any network's."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)["out"]


def build_model(
    arch: str, num_classes: int, *, image_size: int | None = None, in_channels: int = 3, task: str = "classify"
) -> nn.Module:
    """A randomly initialised network by name (no weight downloads).

    Args:
        arch: ``"inception"`` (:class:`InceptionNet`; :class:`InceptionSegNet` to segment),
            ``"report"`` (the case study's :class:`~stoker.model.case_study.ReportNet`) or any
            torchvision classification model name (``"resnet18"``, ``"resnet50"``, ...); with
            ``task="segment"`` a torchvision segmentation model (``"lraspp_mobilenet_v3_large"``,
            ``"deeplabv3_resnet50"``, ...).
        num_classes: Outputs of the head (per pixel for segmentation).
        image_size: Input side; only ``"report"`` needs it (its Linear is sized by it, 224
            when None).
        in_channels: Input channels (1: grayscale; the first convolution is built for it).
        task: ``"segment"`` for per-pixel outputs; anything else is a per-image head.

    Raises:
        ValueError: Unknown ``arch`` (the message lists the choices) or bad sizes.
    """
    if task == "segment":
        return _segmentation_model(arch, num_classes, in_channels)
    if task == "detect":  # a torchvision detector taking box batches (model/detection.py)
        from .detection import build_detector

        return build_detector(arch, num_classes, image_size=image_size, in_channels=in_channels)
    if arch == "inception":
        return InceptionNet(num_classes, in_channels=in_channels)
    if arch == "report":
        return ReportNet(num_classes, image_size=image_size or 224, in_channels=in_channels)
    names = torchvision_archs()
    if arch not in names:
        raise ArgumentError(unknown_choice("arch", arch, STOKER_ARCHS + tuple(names)))
    import torchvision

    kwargs: dict = {"weights": None, "num_classes": num_classes}
    if arch in ("inception_v3", "googlenet"):
        kwargs.update(aux_logits=False, init_weights=True)  # aux heads off: plain logits out
    return _in_channels(torchvision.models.get_model(arch, **kwargs), in_channels)


def _segmentation_model(arch: str, num_classes: int, in_channels: int) -> nn.Module:
    import torchvision

    if arch == "inception":
        return InceptionSegNet(num_classes, in_channels=in_channels)
    names = torchvision_archs("segment")
    if arch not in names:
        raise ArgumentError(unknown_choice("segmentation arch", arch, ("inception", *names)))
    net = torchvision.models.get_model(arch, weights=None, weights_backbone=None, num_classes=num_classes)
    return SegmentationOutput(_in_channels(net, in_channels))


def _in_channels(net: nn.Module, in_channels: int) -> nn.Module:
    """``net`` with its first convolution taking ``in_channels`` (its other settings kept)."""
    if in_channels == 3:
        return net
    for parent in net.modules():
        for name, child in parent.named_children():
            if isinstance(child, nn.Conv2d) and child.in_channels == 3:
                conv = nn.Conv2d(
                    in_channels,
                    child.out_channels,
                    child.kernel_size,
                    stride=child.stride,
                    padding=child.padding,
                    dilation=child.dilation,
                    groups=1,
                    bias=child.bias is not None,
                )
                setattr(parent, name, conv)
                return net
    raise ArgumentError(f"{type(net).__name__} has no 3-channel convolution to build for {in_channels} channel(s)")


def count_parameters(model: nn.Module) -> int:
    """Number of parameters (trainable or not) of ``model``."""
    return sum(p.numel() for p in model.parameters())
