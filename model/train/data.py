"""A run's data: its splits, its Loaders with the crop recipe and the augmentation, and what the
run says about them at its start (a handful of steps an epoch, a val figure resting on a handful
of samples, float targets standardized or far from unit scale).

:class:`~.run.Run` calls these once in its setup; they take the config and what the run resolved
(task, ranks, device) and return what it keeps.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stoker.errors import ArgumentError, NoBatchError, arg

from ..normalize import default_stats
from .config import TrainConfig
from .mix import mix_options, mix_split_dirs, open_val, train_source
from .runtime import Dist
from .tasks import Task

#: fewer steps an epoch than this, or val samples, and the run says so at its start
FEW_STEPS = 10
FEW_VAL = 50
#: train labels read at most to prove a class missing from train (~15 s at 70k labels/s)
MAX_LABEL_SCAN = 1 << 20

Log = Callable[[str], None]


@dataclass
class RunData:
    """The run's Loaders (``val`` is ``None`` without a val split) and the train steps an epoch."""

    train: Any
    val: Any | None
    steps_per_epoch: int


def split_dirs(cfg: TrainConfig) -> tuple[str, str]:
    """``(DATA/train, DATA/val)``; a local DATA without ``train/`` is a FileNotFoundError."""
    from stoker.pipeline.storage import is_url

    if cfg.mix:  # several datasets: each one's train/ and val/ (model/train/mix.py)
        return mix_split_dirs(cfg)
    if is_url(cfg.data):  # object storage: the manifests say what is there
        base = cfg.data.rstrip("/")
        return f"{base}/train", f"{base}/val"
    data = Path(cfg.data)
    if not (data / "train").is_dir():
        raise FileNotFoundError(f"{data}: no train/ directory (expected DATA/train and optionally DATA/val)")
    return str(data / "train"), str(data / "val")


def has_split(split: str, storage_options: dict | None) -> bool:
    """Is there a split at ``split`` (a folder, or a URL with a manifest)?"""
    from stoker.pipeline.storage import is_url

    if not is_url(split):
        return Path(split).is_dir()
    from stoker.errors import ManifestError
    from stoker.pipeline.cache import read_manifest

    try:
        read_manifest(split, storage_options)
    except ManifestError:
        return False
    return True


def _crop_spec(cfg: TrainConfig, side: Any) -> Any:
    """The crop recipe, whole (a ``CropSpec``): ``--crop`` ... ``--val-resize``, ``--train-fit``,
    ``--jitter``, ``--val-fit``."""
    from stoker.pipeline.augment import CropSpec

    side = tuple(side) if isinstance(side, (list, tuple)) else side
    return CropSpec.of(
        side,
        scale=tuple(cfg.scale),
        ratio=tuple(cfg.ratio),
        crop_pct=cfg.crop_pct,
        val_resize=cfg.val_resize,
        train_fit=cfg.train_fit,
        jitter=tuple(cfg.jitter),
        val_fit=cfg.val_fit,
    )


def _loader_kwargs(cfg: TrainConfig, dist: Dist, device: Any) -> dict[str, Any]:
    """What the train and val Loaders share: batch, channels, device, seed, this rank, the backend,
    the order and the decoded-pixel tier (a folder per split inside)."""
    from stoker.pipeline.options import backend_for

    kw: dict[str, Any] = dict(
        batch_size=cfg.batch_size,
        channels=cfg.channels or 3,
        device=str(device),
        seed=cfg.seed,
        rank=dist.rank,
        world_size=dist.world_size,
        backend=backend_for(cfg.backend, decode=cfg.decode, decoder=cfg.decoder),
        threads=cfg.threads,
        channels_last=cfg.channels_last,
    )
    if cfg.shuffle != "global":
        kw.update(shuffle=cfg.shuffle, block_shards=cfg.block_shards)
    if cfg.pixel_cache:
        from stoker.pipeline.pixels import PixelCache

        kw.update(pixel_cache=PixelCache(cfg.pixel_cache, budget=cfg.pixel_cache_budget))
    return kw


def buckets(cfg: TrainConfig) -> dict[str, Any]:
    """The Loader's ``buckets=`` and ``bucket_sync=`` of ``--buckets`` (none without it)."""
    shapes = cfg.bucket_shapes()
    return {} if shapes is None else {"buckets": shapes, "bucket_sync": cfg.bucket_sync}


def make_loaders(
    cfg: TrainConfig,
    factory: Callable[..., Any],
    train_dir: str,
    val_dir: str,
    *,
    task: Task,
    dist: Dist,
    device: Any,
    log: Log,
) -> RunData:
    """The train Loader (the crop recipe whole, the augmentation, this rank's share) and the val
    Loader when there is a val split; a batch larger than a rank's share is one line naming the
    ``--batch-size`` to use. Says when the epoch or the val split is small (:func:`say_when_small`)."""
    from stoker.pipeline.storage import is_url

    schedule = cfg.crop_schedule()  # --progressive: the train crop of each epoch
    train_crops = _crop_spec(cfg, schedule(0) if schedule is not None else cfg.crop)
    val_crops = _crop_spec(cfg, cfg.val_crop if cfg.val_crop is not None else cfg.crop)
    kw = _loader_kwargs(cfg, dist, device)
    remote = is_url(train_dir)
    if remote:
        kw.update(storage_options=cfg.storage_options, cache_limit=cfg.cache_limit)

    def cache(split: str) -> dict:  # one cache folder per split: their shard names may coincide
        return {"cache_dir": str(Path(cfg.cache_dir) / split) if cfg.cache_dir else None} if remote else {}

    try:
        recipe = augmentation(cfg, task)
        mixed = mix_options(cfg, train_dir)  # --mix, --balance: the Loader's weights= and balance=
        train = factory(
            train_source(train_dir),
            train=True,
            drop_last=None,
            crop=train_crops,
            **kw,
            **recipe,
            **cache("train"),
            **mixed,
            **buckets(cfg),
        )
        if getattr(train, "mix", None) is not None:
            log(f"mix: {train.mix.describe()}")
        shapes = getattr(getattr(train, "order", None), "buckets", None)
        if shapes is not None:  # the shapes chosen, recorded in the run's config: val and eval take them
            cfg.buckets = [list(hw) for hw in shapes.shapes]
            log(f"buckets: {', '.join(f'{h}x{w}' for h, w in shapes.shapes)} (height x width), val at the same")
        if schedule is not None:  # applied at each epoch's start; a state saved mid-epoch keeps its crop
            train.set_crop(schedule)
            h, w = val_crops.size
            val = f"{h} px" if h == w else f"{h}x{w} px"
            log(f"progressive resizing: train crop {schedule.describe(cfg.epochs)}; val crop {val}")
    except NoBatchError as e:  # the Loader's own advice names drop_last, which train does not take
        raise ArgumentError(
            f"{train_dir}: --batch-size {cfg.batch_size} is larger than a rank's share of the "
            f"split ({e.share} samples over {dist.world_size} rank(s)); use --batch-size {e.share} or less"
        ) from None
    exists = lambda split: has_split(split, cfg.storage_options)  # noqa: E731
    val = open_val(
        factory, val_dir, exists, train=False, drop_last=False, crop=val_crops, **kw, **cache("val"), **buckets(cfg)
    )
    if val is None:
        log(
            f"no val split in {cfg.data} ({val_dir} is missing): training without validation, so no best.pt; "
            "pack with --val-fraction 0.1 (or a val/ folder) to get one"
        )
    train.set_epoch(0)
    data = RunData(train, val, len(train))
    if data.steps_per_epoch < 1:
        raise ArgumentError(
            f"{train_dir}: too few samples for one batch of {cfg.batch_size} x {dist.world_size} rank(s); "
            "lower --batch-size"
        )
    say_when_small(data, cfg.batch_size, dist.world_size, log, metric=task.metric)
    return data


#: how the val line names each task's metric (what the warning of a small val split names)
_METRIC_NAMES = {"top1": "top-1", "r2": "R²", "miou": "mIoU", "map": "mAP"}


def say_when_small(data: RunData, batch_size: int, world_size: int, log: Log, *, metric: str = "") -> None:
    """One line when an epoch is a handful of steps, or a val figure rests on a handful of
    samples: a run that cannot learn, or a figure that means little (the task's own ``metric``,
    named), is said at the start."""
    if data.steps_per_epoch < FEW_STEPS:
        n = _samples(data.train)
        share = n // world_size if n else batch_size * data.steps_per_epoch
        fits = max(1, share // FEW_STEPS)
        batch = 1 << (fits.bit_length() - 1)  # a power of two giving >= FEW_STEPS steps
        dropped = share - data.steps_per_epoch * batch_size
        log(
            f"an epoch is only {data.steps_per_epoch} step(s) ({share} samples per process at --batch-size "
            f"{batch_size}" + (f", {dropped} left out each epoch" if dropped > 0 else "") + "): too few "
            f"updates to learn from; use --batch-size {batch} (>= {FEW_STEPS} steps an epoch) or more data"
        )
    if data.val is not None:
        n = _samples(data.val)
        if n and n < FEW_VAL:
            name = _METRIC_NAMES.get(metric, "its figures")
            log(
                f"val figures rest on {n} samples: a few samples swing them ({name}); "
                "pack with a larger --val-fraction for figures to trust"
            )


def classes_only_in_val(train: Any, val: Any, classes: list[str] | None) -> list[str]:
    """The classes of a class split that val holds and train does not (a run cannot learn them:
    their val top-1 is 0). Read from the Loaders' indexes (``[]`` for a loader without one, or
    reading object storage); the train split is read until every val class is seen, at most
    :data:`MAX_LABEL_SCAN` labels."""
    import numpy as np

    indexes = [getattr(loader, "index", None) for loader in (train, val)]
    if not classes or any(i is None or getattr(i.target, "task", None) != "classify" for i in indexes):
        return []
    if any(getattr(loader, "cache", None) is not None for loader in (train, val)):
        return []  # object storage: the shards arrive as the epochs read them, not before
    tr, va = indexes
    missing = set()
    for start in range(0, va.num_valid, 65536):
        missing |= set(np.unique(va.labels(va.valid_at(np.arange(start, min(start + 65536, va.num_valid))))).tolist())
    # a packed split is shuffled: every class turns up within the first few chunks (~70k labels/s)
    for start in range(0, min(tr.num_valid, MAX_LABEL_SCAN), 8192):
        if not missing:
            break
        missing -= set(np.unique(tr.labels(tr.valid_at(np.arange(start, min(start + 8192, tr.num_valid))))).tolist())
    if tr.num_valid > MAX_LABEL_SCAN and missing:
        return []  # not proven within the scan's bound: say nothing rather than guess
    return [classes[k] for k in sorted(missing) if k < len(classes)]


def say_val_only_classes(train: Any, val: Any, classes: list[str] | None, log: Log) -> None:
    """One line naming the classes only val holds (:func:`classes_only_in_val`), and the fix."""
    only = classes_only_in_val(train, val, classes) if val is not None else []
    if only:
        names = ", ".join(only[:5]) + (f" and {len(only) - 5} more" if len(only) > 5 else "")
        log(
            f"{len(only)} class(es) have val samples but no train sample, so the run cannot learn them (their val "
            f"top-1 stays 0): {names}; repack so that each class keeps train samples"
        )


def _samples(loader: Any) -> int:
    """The loadable samples of a loader's split (0 when it cannot say: a user's loader)."""
    try:
        return len(loader.dataset)
    except (AttributeError, TypeError):
        return 0


def augmentation(cfg: TrainConfig, task: Task) -> dict:
    """The train Loader's ``augment=`` and ``mixing=`` from the timm-named settings (none: {})."""
    out: dict[str, Any] = {}
    if cfg.aa or cfg.reprob or cfg.color_jitter:
        from stoker.pipeline.augment import build_augment

        mean, std = default_stats(cfg.channels or 3, cfg.mean, cfg.std)
        out["augment"] = build_augment(
            cfg.aa,
            reprob=cfg.reprob,
            remode=cfg.remode,
            recount=cfg.recount,
            color_jitter=cfg.color_jitter,
            ignore_index=task.ignore_index if task.ignore_index is not None else 255,
            mean=mean,
            std=std,
        )
    if cfg.mixup or cfg.cutmix or cfg.cutmix_minmax:
        from stoker.pipeline.augment import build_mixing

        if task.name != "classify":
            raise ArgumentError(f"{arg('mixup')}/{arg('cutmix')} mix class targets; this run's task is {task.name}")
        out["mixing"] = build_mixing(
            cfg.mixup,
            cfg.cutmix,
            cfg.cutmix_minmax,
            cfg.mixup_prob,
            cfg.mixup_switch_prob,
            cfg.mixup_mode,
            cfg.label_smoothing,
            task.num_outputs,
        )
    return out


def standardize(task: Task, train: Any, enabled: bool, *, log: Log) -> tuple[Task, dict | None]:
    """A regression learns standardized targets (the train split's mean and std per column, from
    its manifest or read once from its targets: ``train.target_stats``) unless ``enabled`` is off;
    then a line says when the targets are far from unit scale. Returns the task (its loss in the
    standardized units) and the ``TargetUnits`` layer's ``{"mean", "std"}`` (``None``: none)."""
    if task.name != "regress" or task.case_study:
        return task, None
    stats = getattr(train, "target_stats", None)
    if stats is None or not stats.mean:
        log("no statistics of the float targets: training on them as they are (not standardized)")
        return task, None
    span = ", ".join(f"mean {m:.4g}, std {d:.4g}" for m, d in zip(stats.mean[:4], stats.std[:4], strict=True))
    if enabled:
        log(f"targets standardized ({span}); val figures in the targets' units")
        return dataclasses.replace(task, scale=stats.scale), {"mean": list(stats.mean), "std": list(stats.scale)}
    if any(abs(m) > 3 * d or not 0.1 <= d <= 10 for m, d in zip(stats.mean, stats.scale, strict=True)):
        log(
            f"targets are far from unit scale ({span}) and --no-standardize-targets keeps them so: "
            "the network starts far from them and may not learn; drop the flag to standardize them"
        )
    return task, None


__all__ = [
    "FEW_STEPS",
    "FEW_VAL",
    "RunData",
    "augmentation",
    "classes_only_in_val",
    "has_split",
    "make_loaders",
    "say_val_only_classes",
    "split_dirs",
    "standardize",
]
