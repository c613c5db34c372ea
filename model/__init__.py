"""The model side: uint8 → float on the device, networks, throughput, checkpoints.

>>> from stoker.model import with_normalize, build_model
>>> net = with_normalize(build_model("inception", num_classes=10))  # takes uint8 NCHW batches

Training is :mod:`stoker.model.train` (``from stoker.model.train import TrainConfig, train``);
the seed report's network and regression task are :mod:`stoker.model.case_study`. Names
are imported on first use, so ``stoker.model.train.config`` loads without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stoker._lazy import lazy_exports

_EXPORTS = {
    "IMAGENET_MEAN": "normalize",
    "IMAGENET_STD": "normalize",
    "Normalize": "normalize",
    "with_normalize": "normalize",
    "NormalizedNet": "normalize",
    "TargetUnits": "normalize",
    "load_bare_weights": "normalize",
    "build_user_model": "user",
    "InceptionNet": "nets",
    "build_model": "nets",
    "count_parameters": "nets",
    "measure_model": "throughput",
    "CheckpointError": "checkpoint",
    "save_checkpoint": "checkpoint",
    "load_checkpoint": "checkpoint",
    "Predictor": "inference",
    "bare_state_dict": "inference",
}

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "Normalize",
    "with_normalize",
    "NormalizedNet",
    "TargetUnits",
    "load_bare_weights",
    "build_user_model",
    "InceptionNet",
    "build_model",
    "count_parameters",
    "measure_model",
    "CheckpointError",
    "save_checkpoint",
    "load_checkpoint",
    "Predictor",
    "bare_state_dict",
]

if TYPE_CHECKING:
    from stoker.errors import CheckpointError

    from .checkpoint import load_checkpoint, save_checkpoint
    from .nets import InceptionNet, build_model, count_parameters
    from .normalize import (
        IMAGENET_MEAN,
        IMAGENET_STD,
        Normalize,
        NormalizedNet,
        TargetUnits,
        load_bare_weights,
        with_normalize,
    )
    from .throughput import measure_model
    from .user import build_user_model


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
