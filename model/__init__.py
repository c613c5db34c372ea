"""The model side: uint8 → float on the device, networks, the training loop, checkpoints.

>>> from stoker.model import with_normalize, build_model
>>> net = with_normalize(build_model("inception", num_classes=10))  # takes uint8 NCHW batches
>>> from stoker.model.train import TrainConfig, train
>>> summary = train(TrainConfig(data="data", out="runs/a", epochs=3, crop=64))  # doctest: +SKIP
"""

from .checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from .nets import InceptionBlock, InceptionNet, ReportNet, build_model, count_parameters
from .normalize import IMAGENET_MEAN, IMAGENET_STD, Normalize, with_normalize
from .throughput import measure_model
from .train import TrainConfig, evaluate, plot_metrics, resolve_amp, resolve_device
from .train import train as run_training  # not `train`: that name is the submodule stoker.model.train

__all__ = [
    "IMAGENET_MEAN", "IMAGENET_STD", "Normalize", "with_normalize",
    "InceptionBlock", "InceptionNet", "ReportNet", "build_model", "count_parameters",
    "TrainConfig", "run_training", "evaluate", "plot_metrics", "resolve_amp", "resolve_device",
    "measure_model",
    "CheckpointError", "save_checkpoint", "load_checkpoint",
]
