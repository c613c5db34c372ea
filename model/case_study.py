"""The case study stoker was seeded from, kept apart from the library's networks.

A slow-training report used one inception block at full input resolution followed by
``MaxPool2d`` and ``flatten`` into a 301,056-input ``Linear`` (:class:`ReportNet`), and
regressed one value onto the integer label with MSE (``stoker train --task regress``).
They stay selectable (``--arch report``, ``--task regress``) so ``stoker diagnose`` and
``stoker bench-model`` can show what the report's setup costs next to
:class:`stoker.model.nets.InceptionNet`; do not train real models with them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from stoker.errors import ArgumentError

from .blocks import InceptionBlock


class ReportNet(nn.Module):
    """The report's ORIGINAL network, for comparisons (``stoker diagnose``): do not train with it.

    The inception block at full input resolution, ``MaxPool2d(8)`` (224 → 28), flatten to
    384*28*28 = 301,056 features, ``Linear(301056, num_outputs)``. At 224 with one output
    it has 496,769 parameters, 301,057 of them in the Linear.

    Args:
        num_outputs: Outputs of the Linear (the report regressed one value).
        image_size: Input side the Linear is sized for (a multiple of 8).
        in_channels: Input channels.
    """

    def __init__(self, num_outputs: int = 1, *, image_size: int = 224, in_channels: int = 3) -> None:
        super().__init__()
        if image_size < 8 or image_size % 8:
            raise ArgumentError(f"image_size={image_size} must be a positive multiple of 8")
        if num_outputs < 1:
            raise ArgumentError(f"num_outputs={num_outputs} must be >= 1")
        self.image_size = image_size
        self.block = InceptionBlock(in_channels)
        self.pool = nn.MaxPool2d(8)
        side = image_size // 8
        self.fc = nn.Linear(InceptionBlock.out_channels * side * side, num_outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-2:] != (self.image_size, self.image_size):
            raise ArgumentError(
                f"ReportNet(image_size={self.image_size}) needs {self.image_size}x{self.image_size} "
                f"input, got {tuple(x.shape[-2:])}"
            )
        return self.fc(torch.flatten(self.pool(self.block(x)), 1))


def regress_loss(out: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The report's loss: its one output regressed onto the label value (MSE, in fp32)."""
    return F.mse_loss(out.squeeze(1).float(), labels.float())


def regress_stats(out: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Evaluation of the regression: (predictions that round to the label, summed squared error)."""
    pred = out.squeeze(1)
    return (pred.round() == labels.float()).sum(), ((pred - labels.float()) ** 2).sum()
