"""The layers the networks share: ``ConvBNReLU`` and the case study's inception block.

Both :class:`stoker.model.nets.InceptionNet` and the case study's
:class:`~stoker.model.case_study.ReportNet` are built from them; this module imports neither.
"""

from __future__ import annotations

import torch
from torch import nn


class ConvBNReLU(nn.Sequential):
    """``Conv2d(bias=False)`` + ``BatchNorm2d`` + ``ReLU``, 'same' padding."""

    def __init__(self, in_ch: int, out_ch: int, kernel_size: int = 1, stride: int = 1) -> None:
        super().__init__(
            nn.Conv2d(in_ch, out_ch, kernel_size, stride=stride, padding=kernel_size // 2, bias=False),
            nn.BatchNorm2d(out_ch),
            nn.ReLU(inplace=True),
        )


class InceptionBlock(nn.Module):
    """The report's block: four branches concatenated to 384 channels, same H x W.

    1x1→3x3→3x3 (64/96/96), 1x1→3x3 (64/96), 1x1 (96), 3x3 avg-pool→1x1 (96).
    """

    out_channels = 384

    def __init__(self, in_ch: int) -> None:
        super().__init__()
        self.branch_3x3dbl = nn.Sequential(ConvBNReLU(in_ch, 64, 1), ConvBNReLU(64, 96, 3), ConvBNReLU(96, 96, 3))
        self.branch_3x3 = nn.Sequential(ConvBNReLU(in_ch, 64, 1), ConvBNReLU(64, 96, 3))
        self.branch_1x1 = ConvBNReLU(in_ch, 96, 1)
        self.branch_pool = nn.Sequential(nn.AvgPool2d(3, stride=1, padding=1), ConvBNReLU(in_ch, 96, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.branch_3x3dbl(x), self.branch_3x3(x), self.branch_1x1(x), self.branch_pool(x)], 1)
