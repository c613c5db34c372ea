"""uint8 → float normalization on the device: the one place the mean/std live.

The loader hands over uint8 NCHW batches (4x fewer bytes than float32 across the bus);
:class:`Normalize` turns them into normalized floats as the model's first layer, on
whatever device the model runs on.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import torch
from torch import nn

#: ImageNet channel statistics in the 0..1 scale (torchvision's convention).
IMAGENET_MEAN: tuple[float, float, float] = (0.485, 0.456, 0.406)
IMAGENET_STD: tuple[float, float, float] = (0.229, 0.224, 0.225)


class Normalize(nn.Module):
    """``(x - 255*mean) / (255*std)`` for a uint8 (0..255) NCHW batch.

    ``mean`` and ``std`` are given in the 0..1 scale (as for
    ``torchvision.transforms.Normalize``) and stored pre-multiplied by 255 as buffers,
    so they follow the module across ``.to(device)`` and into the state_dict. The
    arithmetic runs in float32; the result is float32, or the autocast dtype when
    autocast is active on the input's device (the first conv would cast it anyway).
    The input's memory format (e.g. channels_last) is kept.

    The input must be uint8: a float batch (``ToTensor()``'s 0..1, or one already normalized)
    is refused in one line instead of coming out around -2 without a word (normalized twice).

    Args:
        mean: Per-channel mean, 0..1 scale.
        std: Per-channel standard deviation, 0..1 scale; every entry must be > 0.
    """

    def __init__(self, mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD) -> None:
        super().__init__()
        mean_t = torch.as_tensor(mean, dtype=torch.float32).flatten()
        std_t = torch.as_tensor(std, dtype=torch.float32).flatten()
        if mean_t.numel() != std_t.numel() or mean_t.numel() == 0:
            raise ValueError(f"mean={tuple(mean)} and std={tuple(std)} must have the same, non-zero length")
        if not bool((std_t > 0).all()):
            raise ValueError(f"std={tuple(std)} must be > 0 everywhere")
        self.register_buffer("mean", (mean_t * 255).view(1, -1, 1, 1))
        self.register_buffer("std", (std_t * 255).view(1, -1, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.uint8:
            raise ValueError(
                f"Normalize takes uint8 batches (0..255, what stoker's Loader yields), got {x.dtype}: a float batch "
                "(ToTensor's 0..1, or already normalized) would be normalized twice; feed the uint8 batch, or call "
                "the network without Normalize (model.net)"
            )
        if x.dim() != 4 or x.shape[1] != self.mean.shape[1]:
            raise ValueError(f"Normalize expects an N x {self.mean.shape[1]} x H x W batch, got shape {tuple(x.shape)}")
        # .float() and the broadcast arithmetic keep x's memory format (channels_last stays).
        y = (x.float() - self.mean) / self.std
        dev = x.device.type
        if torch.is_autocast_enabled(dev):
            y = y.to(torch.get_autocast_dtype(dev))
        return y

    def extra_repr(self) -> str:
        m = [round(v / 255, 4) for v in self.mean.flatten().tolist()]
        s = [round(v / 255, 4) for v in self.std.flatten().tolist()]
        return f"mean={m}, std={s}"


def with_normalize(
    net: nn.Module, mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD
) -> nn.Sequential:
    """``net`` with :class:`Normalize` in front, so it takes the loader's uint8 batches.

    Returns ``nn.Sequential(normalize=Normalize(mean, std), net=net)``; state_dict keys of
    ``net`` gain the prefix ``net.``.

    Raises:
        ValueError: ``net`` already holds a :class:`Normalize` (wrapping it again would normalize
            twice).
    """
    if has_normalize(net):
        raise ValueError(
            f"{type(net).__name__} already normalizes its input (it holds a stoker Normalize): wrapping it "
            "again would normalize twice; use it as it is"
        )
    return nn.Sequential(OrderedDict(normalize=Normalize(mean, std), net=net))


#: one channel: the average of ImageNet's channel statistics (what timm uses for grayscale input)
GRAY_MEAN: tuple[float] = (sum(IMAGENET_MEAN) / 3,)
GRAY_STD: tuple[float] = (sum(IMAGENET_STD) / 3,)


def default_stats(
    channels: int, mean: Sequence[float] | None = None, std: Sequence[float] | None = None
) -> tuple[tuple, tuple]:
    """``(mean, std)`` in the 0..1 scale for ``channels`` inputs: the given ones, else ImageNet's
    (their average for one channel)."""
    base_mean, base_std = (IMAGENET_MEAN, IMAGENET_STD) if channels == 3 else (GRAY_MEAN, GRAY_STD)
    return tuple(mean if mean is not None else base_mean), tuple(std if std is not None else base_std)


def has_normalize(model: nn.Module) -> bool:
    """True when ``model`` already contains a :class:`Normalize` (takes uint8 input)."""
    return any(isinstance(m, Normalize) for m in model.modules())
