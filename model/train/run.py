"""One training run's parts and state: what :func:`~stoker.model.train.loop.train` drives.

:class:`Run` builds the runtime (device, AMP, DDP, seeds), the loaders, the model with its
optimizer, schedule and scaler, and the resolved config (``RUN/config.json``); resumes from a
checkpoint; and writes rank 0's outputs (log lines, ``metrics.jsonl``, checkpoints). The
epoch loop that uses it is :mod:`.loop`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from stoker import __version__
from stoker.errors import CheckpointError, NoBatchError
from stoker.pipeline.fsutil import atomic_write
from stoker.pipeline.storage import redact_options

from ..checkpoint import load_checkpoint, load_model_state, rng_state, save_checkpoint, set_rng_state
from ..inference import bare_state_dict
from ..nets import build_model, count_parameters
from ..normalize import default_stats, with_normalize, with_target_units
from .config import CONFIG, DEFAULT_ARCH, LAST, METRICS, RUN_FILES, TrainConfig
from .runtime import (
    Dist,
    init_distributed,
    make_scaler,
    resolve_amp,
    resolve_device,
    seed_everything,
    shutdown_distributed,
    wrap_ddp,
)
from .step import TrainStep, make_optimizer, make_scheduler
from .tasks import resolve_task

#: fewer steps an epoch than this, or val samples, and the run says so at its start
FEW_STEPS = 10
FEW_VAL = 50


def _samples(loader: Any) -> int:
    """The loadable samples of a loader's split (0 when it cannot say: a user's loader)."""
    try:
        return len(loader.dataset)
    except (AttributeError, TypeError):
        return 0


class Run:
    """One call of :func:`~stoker.model.train.loop.train`: :meth:`setup` builds everything
    (and resumes), :meth:`checkpoint` saves the state, :meth:`close` ends DDP.

    The counters (:attr:`step`, :attr:`epoch_step`, :attr:`best_score`: the best val figure of
    the task's metric, which picks ``best.pt``) are what a checkpoint holds besides the model,
    optimizer, scheduler, scaler and loader states; the loop advances them.
    """

    def __init__(self, cfg: TrainConfig, loader_factory: Callable[..., Any]) -> None:
        self.cfg = cfg
        self.factory = loader_factory
        self.out = Path(cfg.out)
        self.dist: Dist | None = None
        self.start_epoch, self.step, self.epoch_step = 0, 0, 0
        self.best_score = float("-inf")
        self.loader_state: dict | None = None  # the train loader's position to resume from, once
        self.complete = False  # resumed from the run's last step

    # rank-0 outputs ------------------------------------------------------------
    def log(self, msg: str) -> None:
        """Print ``stoker train: msg`` on stderr (rank 0), above a progress bar."""
        if self.dist.main:
            from tqdm import tqdm

            tqdm.write(f"stoker train: {msg}", file=sys.stderr)

    def write_metrics(self, row: dict[str, Any]) -> None:
        """Append ``row`` to ``RUN/metrics.jsonl`` (rank 0)."""
        if self.dist.main:
            with open(self.out / METRICS, "a") as f:
                f.write(json.dumps(row) + "\n")

    def checkpoint(self, *, epoch: int, epoch_complete: bool, path: Path | None = None) -> None:
        """Save the run's state (rank 0) to ``path`` (default ``RUN/last.pt``); mid-epoch with the
        train loader's position, so a resume continues at the next batch."""
        if self.dist.main:
            save_checkpoint(
                path or self.out / LAST,
                {
                    "model": self.raw.state_dict(),
                    # the bare network's (what a stock model of the arch loads); shares the storages
                    "net": bare_state_dict(self.raw),
                    "optimizer": self.optimizer.state_dict(),
                    "scaler": self.scaler.state_dict(),
                    "scheduler": self.scheduler.state_dict(),
                    "loader": None if epoch_complete else self.train_loader.state_dict(),
                    "rng": rng_state(),
                    "config": self.resolved,
                    "epoch": epoch,
                    "epoch_step": self.epoch_step,
                    "epoch_complete": epoch_complete,
                    "step": self.step,
                    "best_score": self.best_score,
                    "best_metric": self.task.metric,
                },
            )

    def close(self) -> None:
        """End DDP (when it was started)."""
        if self.dist is not None:
            shutdown_distributed(self.dist)

    # setup -----------------------------------------------------------------------
    def setup(self) -> None:
        """Build everything (a bad setting fails before any I/O it can), resume when asked, and
        write the resolved config (rank 0)."""
        cfg = self.cfg
        self._check_run_dir()
        self._start_runtime()
        train_dir, val_dir = self._split_dirs()
        classes, num_classes = self._task(train_dir)
        self.channels = cfg.channels or 3
        net = self._build_net()  # a bad --arch or --model fails before any I/O
        self._make_loaders(train_dir, val_dir)
        self._standardize()
        self.total_steps = cfg.epochs * self.steps_per_epoch
        self.warmup_steps = min(round(cfg.warmup_epochs * self.steps_per_epoch), max(0, self.total_steps - 1))
        global_batch = cfg.batch_size * self.dist.world_size
        lr, wd = cfg.peak_lr(global_batch), cfg.resolved_weight_decay()
        self._make_model(net, lr=lr, weight_decay=wd)
        self.resolved = {
            **dataclasses.asdict(cfg),
            "storage_options": redact_options(cfg.storage_options),  # written down: no credentials
            "lr": lr,
            "weight_decay": wd,
            "amp": self.amp.name,
            "amp_requested": cfg.amp,
            "device": str(self.device),
            "world_size": self.dist.world_size,
            "global_batch": global_batch,
            "num_classes": num_classes,
            "num_outputs": self.num_outputs,
            "classes": classes,
            "task": self.task.name,
            "task_requested": cfg.task,
            "arch": self.arch,
            "arch_requested": cfg.arch,
            "model": self.model_spec,
            # a regression on standardized targets: the TargetUnits layer's (mean, std) per column
            "target_units": self.target_units,
            "channels": self.channels,
            "mean": list(self.mean),
            "std": list(self.std),
            "best_metric": self.task.metric,
            "steps_per_epoch": self.steps_per_epoch,
            "total_steps": self.total_steps,
            "warmup_steps": self.warmup_steps,
            "params": count_parameters(net),
            "has_val": self.val_loader is not None,
            "torch": str(torch.__version__),
            "stoker": __version__,
        }
        self.log(f"amp {self.amp.name} ({self.amp.why})")
        if cfg.resume:
            self._resume()
        if self.dist.main:
            self.out.mkdir(parents=True, exist_ok=True)
            with atomic_write(self.out / CONFIG, "w") as f:
                json.dump(self.resolved, f, indent=1, default=str)
                f.write("\n")

    def _build_net(self) -> nn.Module:
        """The network: ``--model FILE.py:FUNCTION`` (checked on a batch of 2 against the task's
        outputs), else stoker's or torchvision's ``--arch`` (``auto``: the task's default)."""
        cfg = self.cfg
        crop = tuple(cfg.crop) if isinstance(cfg.crop, (list, tuple)) else (cfg.crop, cfg.crop)
        crop = crop * 2 if len(crop) == 1 else crop
        self.model_spec = None
        if cfg.model:
            from ..user import build_user_model, check_outputs, resolve_spec

            self.model_spec = self.arch = resolve_spec(cfg.model)
            net = build_user_model(self.model_spec, self.num_outputs, in_channels=self.channels)
            check_outputs(
                net, cfg.model, num_outputs=self.num_outputs, in_channels=self.channels, size=crop, task=self.task.name
            )
            return net
        self.arch = cfg.arch if cfg.arch != "auto" else DEFAULT_ARCH[self.task.name]
        return build_model(
            self.arch, self.num_outputs, image_size=min(crop), in_channels=self.channels, task=self.task.name
        )

    def _standardize(self) -> None:
        """A regression learns standardized targets (the train split's mean and std per column, from
        its manifest or read once from its targets) unless ``standardize_targets`` is off; then a
        line says when the targets are far from unit scale."""
        self.target_units = None
        if self.task.name != "regress" or self.task.case_study:
            return
        stats = getattr(self.train_loader, "target_stats", None)
        if stats is None or not stats.mean:
            self.log("no statistics of the float targets: training on them as they are (not standardized)")
            return
        span = ", ".join(f"mean {m:.4g}, std {d:.4g}" for m, d in zip(stats.mean[:4], stats.std[:4], strict=True))
        if self.cfg.standardize_targets:
            self.target_units = {"mean": list(stats.mean), "std": list(stats.scale)}
            self.task = dataclasses.replace(self.task, scale=stats.scale)
            self.log(f"targets standardized ({span}); val figures in the targets' units")
        elif any(abs(m) > 3 * d or not 0.1 <= d <= 10 for m, d in zip(stats.mean, stats.scale, strict=True)):
            self.log(
                f"targets are far from unit scale ({span}) and --no-standardize-targets keeps them so: "
                "the network starts far from them and may not learn; drop the flag to standardize them"
            )

    def _check_run_dir(self) -> None:
        """A run directory that already holds a run is continued (``--resume``) or replaced
        (``--overwrite``, its run files removed), never silently written over."""
        cfg = self.cfg
        files = [self.out / name for name in RUN_FILES]
        held = [f.name for f in files if f.exists()]
        if not held or cfg.resume:
            return
        if not cfg.overwrite:
            raise ValueError(
                f"{self.out} already holds a run ({', '.join(held)}): continue it with --resume, replace it "
                "with --overwrite, or give another --out"
            )
        for f in files:  # rank 0 alone writes the run directory; the others wait for it in setup
            if f.exists() and int(os.environ.get("RANK", "0")) == 0:
                f.unlink()

    def _start_runtime(self) -> None:
        cfg = self.cfg
        self.device = resolve_device(cfg.device)
        self.dist = init_distributed(self.device)
        if self.dist.enabled and self.device.type == "cuda":
            self.device = torch.device("cuda", self.dist.local_rank)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self.amp = resolve_amp(cfg.amp, self.device)
        if cfg.torch_threads:
            torch.set_num_threads(cfg.torch_threads)
        seed_everything(cfg.seed, deterministic=cfg.deterministic)

    def _split_dirs(self) -> tuple[str, str]:
        from stoker.pipeline.storage import is_url

        if is_url(self.cfg.data):  # object storage: the manifests say what is there
            base = self.cfg.data.rstrip("/")
            return f"{base}/train", f"{base}/val"
        data = Path(self.cfg.data)
        if not (data / "train").is_dir():
            raise FileNotFoundError(f"{data}: no train/ directory (expected DATA/train and optionally DATA/val)")
        return str(data / "train"), str(data / "val")

    def _task(self, train_dir: str) -> tuple[list[str] | None, int]:
        """Resolve the task from the train manifest's targets (:func:`.tasks.resolve_task`); the
        class names and their count (``num_classes`` overrides the manifest's)."""
        from stoker.errors import ManifestError
        from stoker.pipeline.cache import read_manifest
        from stoker.pipeline.shards.targets import Target

        cfg = self.cfg
        try:
            manifest = read_manifest(train_dir, cfg.storage_options)
            target, names = manifest.target, list(manifest.classes)
        except ManifestError:
            if cfg.num_classes is None:
                raise
            target, names = Target(), []  # a loader_factory's own data, its classes given: a class split
        try:
            self.task = resolve_task(cfg.task, target, names, num_classes=cfg.num_classes)
        except ValueError as e:
            raise ValueError(f"{train_dir}: {e}") from None
        self.num_outputs = self.task.num_outputs
        classes = None if cfg.num_classes is not None else names
        return classes, cfg.num_classes or len(names) or self.num_outputs

    def _has_split(self, split: str) -> bool:
        from stoker.pipeline.storage import is_url

        if not is_url(split):
            return Path(split).is_dir()
        from stoker.errors import ManifestError
        from stoker.pipeline.cache import read_manifest

        try:
            read_manifest(split, self.cfg.storage_options)
        except ManifestError:
            return False
        return True

    def _make_loaders(self, train_dir: str, val_dir: str) -> None:
        from stoker.pipeline.augment import CropSpec
        from stoker.pipeline.storage import is_url

        cfg = self.cfg
        crop = tuple(cfg.crop) if isinstance(cfg.crop, (list, tuple)) else cfg.crop
        self.crops = CropSpec.of(
            crop, scale=tuple(cfg.scale), ratio=tuple(cfg.ratio), crop_pct=cfg.crop_pct, val_resize=cfg.val_resize
        )
        kw = dict(
            batch_size=cfg.batch_size,
            crop=self.crops,  # the recipe, whole: --crop, --scale, --ratio, --crop-pct, --val-resize
            channels=self.channels,
            device=str(self.device),
            seed=cfg.seed,
            rank=self.dist.rank,
            world_size=self.dist.world_size,
            backend=cfg.backend,
            decoder=cfg.decoder,
            decode=cfg.decode,
            threads=cfg.threads,
            channels_last=cfg.channels_last,
        )
        if cfg.shuffle != "global":
            kw.update(shuffle=cfg.shuffle, block_shards=cfg.block_shards)
        remote = is_url(train_dir)
        if remote:
            kw.update(storage_options=cfg.storage_options, cache_limit=cfg.cache_limit)

        def cache(split: str) -> dict:  # one cache folder per split: their shard names may coincide
            return {"cache_dir": str(Path(cfg.cache_dir) / split) if cfg.cache_dir else None} if remote else {}

        try:
            recipe = self._augmentation()
            self.train_loader = self.factory(train_dir, train=True, drop_last=None, **kw, **recipe, **cache("train"))
        except NoBatchError as e:  # the Loader's own advice names drop_last, which train does not take
            raise ValueError(
                f"{train_dir}: --batch-size {cfg.batch_size} is larger than a rank's share of the "
                f"split ({e.share} samples over {self.dist.world_size} rank(s)); use --batch-size {e.share} or less"
            ) from None
        self.val_loader = (
            self.factory(val_dir, train=False, drop_last=False, **kw, **cache("val"))
            if self._has_split(val_dir)
            else None
        )
        if self.val_loader is None:
            self.log(
                f"no val split in {cfg.data} ({val_dir} is missing): training without validation, so no best.pt; "
                "pack with --val-fraction 0.1 (or a val/ folder) to get one"
            )
        self.train_loader.set_epoch(0)
        self.steps_per_epoch = len(self.train_loader)
        if self.steps_per_epoch < 1:
            raise ValueError(
                f"{train_dir}: too few samples for one batch of {cfg.batch_size} "
                f"x {self.dist.world_size} rank(s); lower --batch-size"
            )
        self._say_when_small()

    def _say_when_small(self) -> None:
        """One line when an epoch is a handful of steps, or a val figure rests on a handful of
        samples: a run that cannot learn, or a figure that means little, is said at the start."""
        cfg, world = self.cfg, self.dist.world_size
        if self.steps_per_epoch < FEW_STEPS:
            n = _samples(self.train_loader)
            share = n // world if n else cfg.batch_size * self.steps_per_epoch
            fits = max(1, share // FEW_STEPS)
            batch = 1 << (fits.bit_length() - 1)  # a power of two giving >= FEW_STEPS steps
            dropped = share - self.steps_per_epoch * cfg.batch_size
            self.log(
                f"an epoch is only {self.steps_per_epoch} step(s) ({share} samples per process at --batch-size "
                f"{cfg.batch_size}" + (f", {dropped} left out each epoch" if dropped > 0 else "") + "): too few "
                f"updates to learn from; use --batch-size {batch} (>= {FEW_STEPS} steps an epoch) or more data"
            )
        if self.val_loader is not None:
            n = _samples(self.val_loader)
            if n and n < FEW_VAL:
                self.log(
                    f"val figures rest on {n} samples: a few samples swing them (R², mIoU, top-1); "
                    "pack with a larger --val-fraction for figures to trust"
                )

    def _augmentation(self) -> dict:
        """The train Loader's ``augment=`` and ``mixing=`` from the timm-named settings (none: {})."""
        cfg = self.cfg
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
                ignore_index=self.task.ignore_index if self.task.ignore_index is not None else 255,
                mean=mean,
                std=std,
            )
        if cfg.mixup or cfg.cutmix or cfg.cutmix_minmax:
            from stoker.pipeline.augment import build_mixing

            if self.task.name != "classify":
                raise ValueError(f"--mixup/--cutmix mix class targets; this run's task is {self.task.name}")
            out["mixing"] = build_mixing(
                cfg.mixup,
                cfg.cutmix,
                cfg.cutmix_minmax,
                cfg.mixup_prob,
                cfg.mixup_switch_prob,
                cfg.mixup_mode,
                cfg.label_smoothing,
                self.num_outputs,
            )
        return out

    def _make_model(self, net: nn.Module, *, lr: float, weight_decay: float) -> None:
        cfg = self.cfg
        mf = torch.channels_last if cfg.channels_last else torch.contiguous_format
        self.mean, self.std = default_stats(self.channels, cfg.mean, cfg.std)
        model = with_normalize(net, self.mean, self.std)
        if self.target_units is not None:  # outputs in the targets' own units (float32)
            with_target_units(model, self.target_units["mean"], self.target_units["std"])
        self.raw = model.to(self.device, memory_format=mf)
        self.optimizer = make_optimizer(
            self.raw,
            cfg.optimizer,
            lr=lr,
            momentum=cfg.momentum,
            weight_decay=weight_decay,
            fused=self.device.type == "cuda",
        )
        self.scheduler = make_scheduler(self.optimizer, warmup_steps=self.warmup_steps, total_steps=self.total_steps)
        self.scaler = make_scaler(self.amp)
        model = wrap_ddp(self.raw, self.dist, self.device)
        train_model = torch.compile(model) if cfg.compile else model
        self.eval_model = torch.compile(self.raw) if cfg.compile else self.raw
        self.train_model = train_model
        self.train_step = TrainStep(
            train_model,
            self.optimizer,
            # with mixing the targets arrive soft, smoothed by the mixing (timm's SoftTargetCrossEntropy)
            self.task.loss(
                label_smoothing=0.0 if cfg.mixup or cfg.cutmix or cfg.cutmix_minmax else cfg.label_smoothing
            ),
            amp=self.amp,
            scaler=self.scaler,
            scheduler=self.scheduler,
        )

    def _resume(self) -> None:
        cfg = self.cfg
        path = self.out / LAST if cfg.resume in ("auto", "last") else Path(cfg.resume)
        state = load_checkpoint(path, arch=self.arch, num_outputs=self.num_outputs)
        old = state["config"]
        old_batch, old_world = old.get("batch_size"), old.get("world_size")
        if old_world == self.dist.world_size and old_batch != cfg.batch_size:
            raise CheckpointError(
                f"{path}: resuming needs the same batch size and world size (checkpoint: "
                f"{old_batch} x {old_world}, now: {cfg.batch_size} x {self.dist.world_size})"
            )
        if old_world != self.dist.world_size and old_batch * old_world != cfg.batch_size * self.dist.world_size:
            # another number of processes keeps the global batch, so the steps and the schedule stay
            global_batch, world = old_batch * old_world, self.dist.world_size
            fix = (
                f"use --batch-size {global_batch // world}"
                if global_batch % world == 0
                else f"{global_batch} does not split over {world} processes"
            )
            raise CheckpointError(
                f"{path}: resuming on {world} process(es) keeps the run's global batch of {global_batch} "
                f"({old_batch} x {old_world}): {fix}"
            )
        if old.get("total_steps") != self.total_steps:
            raise CheckpointError(
                f"{path}: the checkpoint's run has {old.get('total_steps')} steps in all, this one "
                f"{self.total_steps} (change of --epochs or data?): the schedule would not match"
            )
        load_model_state(self.raw, state["model"], source=str(path))
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        set_rng_state(state["rng"])
        self.step = int(state["step"])
        # checkpoints before the task metrics kept the best val top-1
        self.best_score = float(state.get("best_score", state.get("best_top1", float("-inf"))))
        if state["epoch_complete"]:
            self.start_epoch, self.epoch_step = int(state["epoch"]) + 1, 0
        else:
            self.start_epoch, self.epoch_step = int(state["epoch"]), int(state["epoch_step"])
            self.loader_state = state["loader"]
        self.resolved["resumed_from"] = {"path": str(path), "step": self.step, "world_size": old_world}
        #: the checkpoint is the run's last step: nothing is left to train
        self.complete = self.step >= self.total_steps
        self.log(
            f"resumed from {path} at step {self.step} (epoch {self.start_epoch + 1}, "
            f"step {self.epoch_step} of {self.steps_per_epoch})"
        )
