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

from stoker.errors import ArgumentError, UsageError, one_line

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
            raise ArgumentError(f"mean={tuple(mean)} and std={tuple(std)} must have the same, non-zero length")
        if not bool((std_t > 0).all()):
            raise ArgumentError(f"std={tuple(std)} must be > 0 everywhere")
        self.register_buffer("mean", (mean_t * 255).view(1, -1, 1, 1))
        self.register_buffer("std", (std_t * 255).view(1, -1, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.uint8:
            raise ArgumentError(
                f"Normalize takes uint8 batches (0..255, what stoker's Loader yields), got {x.dtype}: a float batch "
                "(ToTensor's 0..1, or already normalized) would be normalized twice; feed the uint8 batch, or call "
                "the network without Normalize (model.net)"
            )
        if x.dim() != 4 or x.shape[1] != self.mean.shape[1]:
            raise ArgumentError(
                f"Normalize expects an N x {self.mean.shape[1]} x H x W batch, got shape {tuple(x.shape)}"
            )
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


class NormalizedNet(nn.Sequential):
    """``Normalize`` then the network (what :func:`with_normalize` returns): an ``nn.Sequential``
    whose ``net`` is the wrapped network, and which answers for it what training libraries ask
    a model: timm's ``no_weight_decay()`` and ``group_matcher()`` (parameter names and patterns
    given the ``net.`` prefix of this module's parameters, so a ViT's ``pos_embed`` stays out of
    weight decay and ``--layer-decay`` finds its blocks), and any other attribute the network has
    (``pretrained_cfg``, ``num_classes``, ``get_classifier()``, ...)."""

    def forward(self, x, *extra):
        """The network of normalized ``x``; ``extra`` arguments go to the network (a detector's boxes)."""
        if not extra:
            return super().forward(x)
        return self.net(self.normalize(x), *extra)

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name.startswith("__") or name in _OWN:
                raise
            modules = self.__dict__.get("_modules") or {}
            if "net" not in modules:
                raise
            return getattr(modules["net"], name)  # the wrapped network's own attribute (or its AttributeError)

    def no_weight_decay(self) -> set[str]:
        """The wrapped network's ``no_weight_decay()`` names with this module's ``net.`` prefix."""
        inner = getattr(self.net, "no_weight_decay", None)
        return {f"net.{n}" for n in inner()} if callable(inner) else set()

    def group_matcher(self, coarse: bool = False) -> dict:
        """The wrapped network's ``group_matcher(coarse)``, each pattern matching ``net.``-prefixed names."""
        inner = getattr(self.net, "group_matcher", None)
        if not callable(inner):
            raise AttributeError(f"{type(self.net).__name__} has no group_matcher()")
        return {k: _prefixed(v) for k, v in inner(coarse=coarse).items()}


#: names NormalizedNet never forwards to the network (its own methods, found before __getattr__)
_OWN = frozenset({"net", "normalize", "units", "_modules", "_parameters", "_buffers"})


def _prefixed(matcher):
    r"""A timm group pattern (a regex, or a list of ``(regex, suffix)``) anchored on ``net.``: timm
    matches names with ``re.match``; ``^a|^b`` becomes ``^net\.(?:a|b)`` (groups kept)."""
    import re

    if isinstance(matcher, str):
        return r"^net\.(?:" + re.sub(r"(^|\|)\^", r"\1", matcher) + ")"
    if isinstance(matcher, (list, tuple)):
        return type(matcher)(_prefixed(m) if isinstance(m, str) else (_prefixed(m[0]), *m[1:]) for m in matcher)
    return matcher


def with_normalize(
    net: nn.Module, mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD
) -> NormalizedNet:
    """``net`` with :class:`Normalize` in front, so it takes the loader's uint8 batches.

    Returns ``NormalizedNet(normalize=Normalize(mean, std), net=net)`` (an ``nn.Sequential``);
    state_dict keys of ``net`` gain the prefix ``net.`` (:func:`load_bare_weights` loads a
    checkpoint into the bare network again). timm's ``no_weight_decay()``/``group_matcher()`` and
    the network's other attributes are answered through the wrapper (:class:`NormalizedNet`).

    Raises:
        ValueError: ``net`` already holds a :class:`Normalize` (wrapping it again would normalize
            twice).
    """
    if has_normalize(net):
        raise ArgumentError(
            f"{type(net).__name__} already normalizes its input (it holds a stoker Normalize): wrapping it "
            "again would normalize twice; use it as it is"
        )
    return NormalizedNet(OrderedDict(normalize=Normalize(mean, std), net=net))


def load_bare_weights(net: nn.Module, source) -> nn.Module:
    """Load a checkpoint of a wrapped network into the bare ``net`` (no Normalize in front): a
    ``stoker train`` checkpoint (its ``"net"``), a timm/Lightning/plain checkpoint of a
    :func:`with_normalize` model (``"state_dict"``/``"model"``, or the state_dict itself:
    ``net.``-prefixed keys, ``normalize.``/``units.`` dropped), as a path or a loaded dict.
    Returns ``net``. Raises what ``load_state_dict`` raises when the weights do not fit."""
    state = torch.load(source, map_location="cpu", weights_only=True) if not isinstance(source, dict) else source
    if isinstance(state.get("net"), dict):
        state = state["net"]
    else:
        for key in ("state_dict", "model"):
            if isinstance(state.get(key), dict):
                state = state[key]
                break
    if any(k.startswith("net.") for k in state):
        state = {k[4:]: v for k, v in state.items() if k.startswith("net.")}
    net.load_state_dict(state)
    return net


class TargetUnits(nn.Module):
    """``outputs * std + mean``: the last layer of a network that learns standardized float targets
    (``(y - mean) / std`` per column), so it answers in the targets' own units (years, degrees).

    The arithmetic runs in float32 whatever the autocast (a mean of 1e5 in bf16 would keep 3
    digits); ``mean`` and ``std`` are buffers, so they travel in the state_dict and a checkpoint
    predicts in natural units by itself.

    Args:
        mean: Per-column mean of the training targets.
        std: Per-column standard deviation (> 0; a constant column's is 1).
    """

    def __init__(self, mean: Sequence[float], std: Sequence[float]) -> None:
        super().__init__()
        mean_t = torch.as_tensor(mean, dtype=torch.float32).flatten()
        std_t = torch.as_tensor(std, dtype=torch.float32).flatten()
        if mean_t.numel() != std_t.numel() or mean_t.numel() == 0 or not bool((std_t > 0).all()):
            raise ArgumentError(f"mean={tuple(mean)} and std={tuple(std)} must have one length, std > 0")
        self.register_buffer("mean", mean_t)
        self.register_buffer("std", std_t)

    def forward(self, out: torch.Tensor) -> torch.Tensor:
        return out.float() * self.std + self.mean

    def extra_repr(self) -> str:
        return f"mean={[round(v, 4) for v in self.mean.tolist()]}, std={[round(v, 4) for v in self.std.tolist()]}"


def with_target_units(model: nn.Sequential, mean: Sequence[float], std: Sequence[float]) -> nn.Sequential:
    """``model`` (from :func:`with_normalize`) with :class:`TargetUnits` appended as ``units``:
    its standardized outputs come out in the targets' units. Returns ``model``."""
    model.add_module("units", TargetUnits(mean, std))
    return model


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


#: what torch says when a float network meets a uint8 batch: a conv's "Input type (unsigned char) and
#: bias type (float)", a Linear's "expected scalar type Byte but found Float" or "got Byte and Float",
#: a norm layer's "not implemented for 'Byte'"
_UINT8_SIGNS = ("unsigned char", "Byte")


def check_uint8_input(error: BaseException, images: object) -> None:
    """Raise the one stoker line for a network that failed on the Loader's uint8 batch because
    no :class:`Normalize` is in front of it (wrap it with :func:`with_normalize`); return when
    ``error`` is anything else (the caller re-raises it as it is).

    Raises:
        UsageError: ``images`` is uint8 and ``error`` is torch's dtype mismatch.
    """
    if getattr(images, "dtype", None) is not torch.uint8 or not isinstance(error, (RuntimeError, NotImplementedError)):
        return
    if not any(sign in str(error) for sign in _UINT8_SIGNS):
        return
    raise UsageError(
        f"the network got a uint8 batch, the Loader's, with no Normalize in front ({type(error).__name__}: "
        f"{one_line(error)}): wrap it with stoker.model.with_normalize(net), which turns uint8 into normalized "
        "floats on the device"
    ) from None
