"""What a training run is asked to do: :class:`TrainConfig` and its choices (no torch import).

``stoker train``'s argument parser and every validator read the choices from here, so the
command line stays instant (``stoker --help`` never imports torch) and the values are
written once. The names of the files a run writes into its directory are here too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stoker.errors import ArgumentError, arg
from stoker.pipeline.order import SHUFFLES  # the Loader's sample orders, named once (numpy, no torch)

from .mix import check_mix_settings

#: ``--arch auto``: the network of each task (the inception block, as a per-pixel net to segment)
DEFAULT_ARCH = {
    "classify": "inception",
    "regress": "inception",
    "multilabel": "inception",
    "segment": "inception",
    "detect": "fcos_tiny",  # model/detection.py
}
#: ``--amp``: ``auto`` resolves per device (:func:`stoker.model.train.runtime.resolve_amp`).
AMP_CHOICES = ("auto", "bf16", "fp16", "off")
#: ``--optimizer``.
OPTIMIZERS = ("sgd", "adamw")
#: ``--task``: ``auto`` follows the split's targets (:mod:`stoker.model.train.tasks`); ``regress``
#: on a class split is the seed report's case study (:mod:`stoker.model.case_study`).
TASKS = ("auto", "classify", "regress", "segment", "multilabel", "detect")
#: ``--channels``: RGB, or grayscale (the network's first layer built for one channel)
CHANNELS = (1, 3)
#: ``--remode``: random erasing's fill; ``--mixup-mode``: how MixUp/CutMix draw lambda (timm's)
REMODES = ("const", "rand", "pixel")
MIXUP_MODES = ("batch", "pair", "elem")
#: ``--logger``: where the metrics go besides ``metrics.jsonl`` (:mod:`stoker.model.train.logs`)
LOGGERS = ("csv", "tensorboard")

# The run directory.
LAST = "last.pt"
BEST = "best.pt"
METRICS = "metrics.jsonl"
CONFIG = "config.json"
PLOT = "curves.png"
CONSOLE = "console.log"
METRICS_CSV = "metrics.csv"
#: TensorBoard's event files (``SummaryWriter(RUN)`` names them so)
EVENTS_GLOB = "events.out.tfevents.*"
#: what a run writes into its directory (``--overwrite`` removes them and the event files, nothing else)
RUN_FILES = (CONFIG, METRICS, LAST, BEST, PLOT, CONSOLE, METRICS_CSV)


def check_choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    """Raise ValueError naming ``name=value`` and the choices unless ``value`` is one of them."""
    if value not in choices:
        raise ArgumentError(f"{name}={value!r} is not one of {', '.join(choices)}")


@dataclass
class TrainConfig:
    """Everything a training run needs; saved resolved as ``RUN/config.json``.

    ``batch_size`` is per process (the global batch is ``batch_size * world_size``).
    ``lr=None`` picks 0.1 x global_batch/256 for SGD, 1e-3 for AdamW;
    ``weight_decay=None`` picks 5e-5 for SGD, 0.05 for AdamW (never on norms and biases).
    ``threads`` goes to the Loader; ``torch_threads`` sets ``torch.set_num_threads`` (CPU
    training: leave cores to the loader). ``ckpt_every=0`` checkpoints at epoch ends only.
    ``resume``: ``"last"`` (RUN/last.pt), ``"auto"`` (RUN/last.pt when RUN holds a run, else a new run:
    a job script resubmitted as it is) or a checkpoint path; without it a RUN that holds a run
    is refused unless ``overwrite`` (its run files are removed first). ``num_classes=None`` reads the
    class list from the train manifest. ``task="auto"`` trains what the split's targets are.
    ``model`` is your own network instead of ``arch``: ``"FILE.py:FUNCTION"`` or
    ``"package.module:FUNCTION"`` (:mod:`stoker.model.user`). ``standardize_targets``: a regression
    learns ``(y - mean) / std`` per column (the train split's statistics) and the network answers in
    the targets' units through a last :class:`~stoker.model.normalize.TargetUnits` layer.
    ``channels=None`` is 3 (RGB); 1 trains on grayscale, the network's first layer built for it.
    ``mean``/``std`` (0..1 scale) default to ImageNet's (their average for one channel).
    ``crop`` is a side or ``(height, width)``; ``scale``, ``ratio``, ``crop_pct``,
    ``val_resize``, ``train_fit`` (``rrc`` or detection's ``scale-jitter``, its factor range ``jitter``)
    and ``val_fit`` (``auto``, ``center``, ``letterbox``) are the Loader's crop recipe
    (:class:`~stoker.pipeline.augment.CropSpec`). ``progressive`` (``"START:END[:EPOCHS]"``) ramps the
    train crop over the epochs as FFCV does (:class:`~stoker.pipeline.augment.ProgressiveCrop`);
    ``val_crop`` is the val crop when it differs from ``crop`` (train low, evaluate high: FixRes).
    ``pixel_cache`` (a folder) and ``pixel_cache_budget`` (bytes) are the Loader's decoded-pixel tier.
    ``aa``, ``reprob``/``remode``/``recount``,
    ``color_jitter``, ``mixup``/``cutmix`` and the ``mixup_*`` knobs are timm's training recipe,
    applied per sample on the device (:mod:`stoker.pipeline.augment`); with mixing, the label
    smoothing is the mixing's (timm's ``Mixup(label_smoothing=...)``).
    ``logger``: sinks of the metrics rows besides ``metrics.jsonl`` (:data:`LOGGERS`: ``"csv"``,
    ``"tensorboard"``). ``max_steps`` stops a smoke run after that step (the schedule stays the whole
    run's). ``init_from``: a checkpoint (or state_dict file) whose fitting tensors a new run starts from.
    With ``resume``, a finished run given more ``epochs`` is extended on a new learning-rate schedule.
    """

    data: str
    out: str
    arch: str = "auto"
    model: str | None = None
    epochs: int = 5
    batch_size: int = 64
    lr: float | None = None
    optimizer: str = "sgd"
    momentum: float = 0.9
    weight_decay: float | None = None
    warmup_epochs: float = 1.0
    label_smoothing: float = 0.0
    task: str = "auto"
    standardize_targets: bool = True
    crop: Any = 224
    channels: int | None = None
    mean: tuple | None = None
    std: tuple | None = None
    scale: tuple = (0.08, 1.0)
    ratio: tuple = (3 / 4, 4 / 3)
    crop_pct: float | None = None
    val_resize: float | None = None
    # which train crop and val transform (detection: scale jitter, letterbox)
    train_fit: str = "rrc"
    jitter: tuple = (0.1, 2.0)
    val_fit: str = "auto"
    # the resolution schedule: "START:END[:EPOCHS]" (FFCV's progressive resizing), the val crop
    progressive: str | None = None
    val_crop: Any = None
    # aspect-ratio buckets: "auto" or [(height, width), ...]; the run records the shapes chosen
    buckets: Any = None
    bucket_sync: bool = False
    # the decoded-pixel tier: its folder and byte budget (stoker.pipeline.pixels)
    pixel_cache: str | None = None
    pixel_cache_budget: int | None = None
    # per-sample augmentation on the device (timm's flag names; stoker.pipeline.augment)
    aa: str | None = None
    reprob: float = 0.0
    remode: str = "const"
    recount: int = 1
    color_jitter: float | None = None
    mixup: float = 0.0
    cutmix: float = 0.0
    cutmix_minmax: tuple | None = None
    mixup_prob: float = 1.0
    mixup_switch_prob: float = 0.5
    mixup_mode: str = "batch"
    amp: str = "auto"
    channels_last: bool = False
    compile: bool = False
    device: str = "auto"
    seed: int = 0
    deterministic: bool = False
    backend: str = "auto"
    decoder: str = "auto"
    decode: str = "auto"
    threads: int | None = None
    torch_threads: int | None = None
    log_every: int = 20
    ckpt_every: int = 0
    # metrics sinks besides metrics.jsonl (LOGGERS); a smoke run's step budget
    logger: tuple = ()
    max_steps: int | None = None
    resume: str | None = None
    # weights only (fine-tuning): the tensors of this checkpoint that fit the network
    init_from: str | None = None
    overwrite: bool = False
    plot: bool = False
    progress: bool = True
    num_classes: int | None = None
    # data in object storage (DATA is a URL): see stoker.pipeline.Loader
    storage_options: dict | None = None
    cache_dir: str | None = None
    cache_limit: int | None = None
    shuffle: str = "global"
    block_shards: int = 4
    # a mix of datasets ("web:0.7,curated:0.3") and the balance inside each (model/train/mix.py)
    mix: str | None = None
    balance: str | None = None
    epoch_length: int | None = None

    def validate(self) -> None:
        """Raise ValueError naming the first bad value."""
        for name in ("epochs", "batch_size", "log_every"):
            if int(getattr(self, name)) < 1:
                raise ArgumentError(f"{name}={getattr(self, name)} must be >= 1")
        crop = self.crop if isinstance(self.crop, (list, tuple)) else [self.crop]
        if not crop or not all(isinstance(c, int) and c >= 1 for c in crop) or len(crop) > 2:
            raise ArgumentError(f"crop={self.crop!r} must be a positive side or (height, width)")
        for name in ("val_crop",):
            side = getattr(self, name)
            sides = side if isinstance(side, (list, tuple)) else [side]
            if side is not None and (not all(isinstance(c, int) and c >= 1 for c in sides) or len(sides) > 2):
                raise ArgumentError(f"{name}={side!r} must be a positive side or (height, width)")
        if self.progressive is not None:
            self.crop_schedule()  # parsed: a bad one is one line
            if self.arch == "report":
                raise ArgumentError(
                    f"{arg('progressive')} changes the input size; {arg('arch', 'report')}'s Linear layer takes "
                    "one size"
                )
        if self.buckets is not None:
            self.bucket_shapes()  # parsed: a bad one is one line
            if self.progressive is not None or self.arch == "report":
                other = (
                    f"{arg('progressive')} changes the crop each epoch"
                    if self.progressive is not None
                    else f"{arg('arch', 'report')} takes one input size"
                )
                raise ArgumentError(f"{arg('buckets', self.buckets)} gives each batch its own shape; {other}")
        self._validate_fits()
        if self.pixel_cache_budget is not None and not self.pixel_cache:
            raise ArgumentError("pixel_cache_budget needs pixel_cache (the folder the pixels go to)")
        if self.channels is not None:
            check_choice("channels", self.channels, CHANNELS)
        check_choice("remode", self.remode, REMODES)
        check_choice("mixup_mode", self.mixup_mode, MIXUP_MODES)
        for name in ("reprob", "mixup_prob", "mixup_switch_prob"):
            if not 0.0 <= float(getattr(self, name)) <= 1.0:
                raise ArgumentError(f"{name}={getattr(self, name)} must be in [0, 1]")
        for name in ("mixup", "cutmix"):
            if float(getattr(self, name)) < 0:
                raise ArgumentError(f"{name}={getattr(self, name)} must be >= 0 (an alpha; 0: off)")
        for name in ("mean", "std"):
            v = getattr(self, name)
            if v is not None and len(v) != (self.channels or 3):
                raise ArgumentError(f"{name}={tuple(v)} needs {self.channels or 3} value(s), one per channel")
        if self.ckpt_every < 0:
            raise ArgumentError(f"ckpt_every={self.ckpt_every} must be >= 0 (0: at epoch ends only)")
        check_choice("optimizer", self.optimizer, OPTIMIZERS)
        check_choice("shuffle", self.shuffle, SHUFFLES)
        check_choice("task", self.task, TASKS)
        check_choice("amp", self.amp, AMP_CHOICES)
        if self.lr is not None and not self.lr > 0:
            raise ArgumentError(f"lr={self.lr} must be > 0")
        if self.weight_decay is not None and self.weight_decay < 0:
            raise ArgumentError(f"weight_decay={self.weight_decay} must be >= 0")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ArgumentError(f"label_smoothing={self.label_smoothing} must be in [0, 1)")
        if self.warmup_epochs < 0:
            raise ArgumentError(f"warmup_epochs={self.warmup_epochs} must be >= 0")
        if self.torch_threads is not None and self.torch_threads < 1:
            raise ArgumentError(f"torch_threads={self.torch_threads} must be >= 1")
        if self.model is not None and self.arch not in ("auto", None):
            raise ArgumentError(f"give {arg('arch', self.arch)} or {arg('model', self.model)}, not both")
        if self.model is not None and ":" not in str(self.model):
            raise ArgumentError(f"model={self.model!r} must look like 'file.py:FUNCTION' or 'package.module:FUNCTION'")
        if self.num_classes is not None and self.num_classes < 1:
            raise ArgumentError(f"num_classes={self.num_classes} must be >= 1")
        self._validate_run_options()
        check_mix_settings(self)

    def _validate_fits(self) -> None:
        """The train crop and val transform names and the scale jitter's range (before any data is read)."""
        from stoker.pipeline.fits import TRAIN_FITS, VAL_FITS  # torch-free: the config checks import no torch

        check_choice("train_fit", self.train_fit, TRAIN_FITS)
        check_choice("val_fit", self.val_fit, VAL_FITS)
        try:
            lo, hi = (float(v) for v in self.jitter)
        except (TypeError, ValueError):
            raise ArgumentError(f"{arg('jitter', self.jitter)} must be a (low, high) pair of numbers") from None
        if not 0 < lo <= hi:
            raise ArgumentError(
                f"{arg('jitter', self.jitter)} must satisfy 0 < low <= high (a factor on the fitted size)"
            )

    def _validate_run_options(self) -> None:
        """The loggers, the step budget and where the weights start from."""
        for name in self.logger or ():
            check_choice("logger", name, LOGGERS)
        if self.max_steps is not None and self.max_steps < 1:
            raise ArgumentError(f"max_steps={self.max_steps} must be >= 1")
        if self.init_from and self.resume:
            raise ArgumentError(
                f"{arg('init_from')} starts a new run from a checkpoint's weights, {arg('resume')} continues "
                "a run: give one"
            )

    def bucket_shapes(self) -> str | list[tuple[int, int]] | None:
        """``buckets`` as the Loader takes it: ``"auto"``, a list of ``(height, width)`` (from a list
        or the flag's ``HxW,HxW``), or ``None``."""
        value = self.buckets
        if value is None or value == "auto":
            return value
        try:
            if isinstance(value, str):
                return [tuple(int(v) for v in part.lower().split("x")) for part in value.split(",")]
            return [(int(h), int(w)) for h, w in value]
        except (TypeError, ValueError):
            raise ArgumentError(f"{arg('buckets', value)} must be auto or HxW,HxW,... (e.g. 192x256,224x224)") from None

    def crop_schedule(self):
        """The train crop of each epoch (:class:`~stoker.pipeline.augment.ProgressiveCrop`) of
        ``progressive``, or ``None``: the train crop is ``crop`` throughout."""
        if self.progressive is None:
            return None
        from stoker.pipeline.augment.schedule import ProgressiveCrop

        return ProgressiveCrop.parse(self.progressive, self.epochs)

    def peak_lr(self, global_batch: int) -> float:
        """``lr``, or the default for the optimizer: SGD 0.1 x ``global_batch``/256, AdamW 1e-3."""
        if self.lr is not None:
            return self.lr
        return 0.1 * global_batch / 256 if self.optimizer == "sgd" else 1e-3

    def resolved_weight_decay(self) -> float:
        """``weight_decay``, or the default for the optimizer: SGD 5e-5, AdamW 0.05."""
        if self.weight_decay is not None:
            return self.weight_decay
        return 5e-5 if self.optimizer == "sgd" else 0.05

    @classmethod
    def from_any(cls, config: TrainConfig | Mapping[str, Any]) -> TrainConfig:
        """A TrainConfig from itself or a dict of its fields (unknown keys ignored)."""
        if isinstance(config, cls):
            return dataclasses.replace(config)
        if not isinstance(config, Mapping):
            raise TypeError(f"config must be a TrainConfig or a dict, not {type(config).__name__}")
        d = dict(config)
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})
