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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from stoker.errors import ArgumentError, CheckpointError, arg
from stoker.pipeline.fsutil import atomic_write
from stoker.pipeline.storage import redact_options
from stoker.version import __version__

from ..checkpoint import (
    load_checkpoint,
    load_matching,
    load_model_state,
    read_weights,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from ..inference import bare_state_dict
from ..nets import build_model, count_parameters
from ..normalize import default_stats, with_normalize, with_target_units
from .config import CONFIG, DEFAULT_ARCH, EVENTS_GLOB, LAST, RUN_FILES, TrainConfig
from .data import make_loaders, say_val_only_classes, split_dirs, standardize
from .logs import Console, MetricSinks, check_loggers
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

#: the longest warm-up, as a share of its schedule's steps (a longer one leaves too few to decay over)
MAX_WARMUP_SHARE = 0.25


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
        self.console = Console()  # rank 0's lines, copied into RUN/console.log
        self.sinks: MetricSinks | None = None  # rank 0's metrics rows (metrics.jsonl, --logger)

    # rank-0 outputs ------------------------------------------------------------
    def log(self, msg: str) -> None:
        """Print ``stoker train: msg`` on stderr (rank 0), above a progress bar; copied into
        ``RUN/console.log``."""
        if self.dist.main:
            self.console(msg)

    def write_metrics(self, row: dict[str, Any]) -> None:
        """Append ``row`` to ``RUN/metrics.jsonl`` and the ``--logger`` sinks (rank 0)."""
        if self.dist.main and self.sinks is not None:
            self.sinks.write(row)

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
        """Close the console copy and the metrics sinks; end DDP (when it was started)."""
        if self.sinks is not None:
            self.sinks.close()
        self.console.close()
        if self.dist is not None:
            shutdown_distributed(self.dist)

    # setup -----------------------------------------------------------------------
    def setup(self) -> None:
        """Build everything (a bad setting fails before any I/O it can), resume when asked, and
        write the resolved config (rank 0)."""
        cfg = self.cfg
        check_loggers(cfg.logger or ())
        auto = self._auto_resume()
        cfg = self.cfg
        self._check_run_dir()
        self._start_runtime()
        self.console.enabled = self.dist.main
        if auto:
            self.log(auto)
        train_dir, val_dir = split_dirs(cfg)
        classes, num_classes = self._task(train_dir)
        self.channels = cfg.channels or 3
        net = self._build_net()  # a bad --arch or --model fails before any I/O
        cfg = self._memory_format(net)
        data = make_loaders(
            cfg, self.factory, train_dir, val_dir, task=self.task, dist=self.dist, device=self.device, log=self.log
        )
        self.train_loader, self.val_loader, self.steps_per_epoch = data.train, data.val, data.steps_per_epoch
        if self.dist.main:
            say_val_only_classes(self.train_loader, self.val_loader, classes, self.log)
        self.task, self.target_units = standardize(self.task, self.train_loader, cfg.standardize_targets, log=self.log)
        self.total_steps = cfg.epochs * self.steps_per_epoch
        self._plan_schedule(start=0, say=not cfg.resume)  # a resumed run's is planned once it is read
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
            "category_ids": getattr(self, "category_ids", None),
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
            "schedule_start": self.schedule_start,
            "params": count_parameters(net),
            "has_val": self.val_loader is not None,
            "torch": str(torch.__version__),
            "stoker": __version__,
            # what was asked, before resolving: what `--resume` takes when no flag is repeated
            "requested": {k: v for k, v in dataclasses.asdict(cfg).items() if k != "storage_options"},
        }
        self.log(f"amp {self.amp.name} ({self.amp.why})")
        if cfg.init_from:
            self._init_weights(Path(cfg.init_from))
        if cfg.resume:
            self._resume()
        if self.dist.main:
            self.out.mkdir(parents=True, exist_ok=True)
            self.console.open(self.out)
            self.sinks = MetricSinks(self.out, cfg.logger or ())
            with atomic_write(self.out / CONFIG, "w") as f:
                json.dump(self.resolved, f, indent=1, default=str)
                f.write("\n")

    def _plan_schedule(self, *, start: int, say: bool = True) -> None:
        """The learning-rate schedule from step ``start`` to the run's last: a linear warm-up of
        ``--warmup-epochs``, at most :data:`MAX_WARMUP_SHARE` of it (said in one line: with
        ``--epochs 1`` the default warm-up would be the whole run), then cosine decay to 0."""
        span = self.total_steps - start
        asked = round(self.cfg.warmup_epochs * self.steps_per_epoch)
        cap = int(MAX_WARMUP_SHARE * span)
        self.warmup_steps, self.schedule_start = min(asked, cap), start
        if asked > cap and say:
            self.log(
                f"--warmup-epochs {self.cfg.warmup_epochs:g} is {asked} step(s) of the schedule's {span}: warm-up "
                f"capped at {cap} step(s) ({MAX_WARMUP_SHARE:.0%} of it), then cosine decay to 0"
            )

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
            if self.task.name == "detect":  # a torchvision detector, wrapped as --arch's are
                from ..detection import user_detector

                return user_detector(self.model_spec, self.num_outputs, image_size=min(crop), in_channels=self.channels)
            net = build_user_model(self.model_spec, self.num_outputs, in_channels=self.channels)
            check_outputs(
                net, cfg.model, num_outputs=self.num_outputs, in_channels=self.channels, size=crop, task=self.task.name
            )
            return net
        self.arch = cfg.arch if cfg.arch != "auto" else DEFAULT_ARCH[self.task.name]
        return build_model(
            self.arch, self.num_outputs, image_size=min(crop), in_channels=self.channels, task=self.task.name
        )

    def _memory_format(self, net: nn.Module) -> TrainConfig:
        """The config with ``channels_last`` off when the network's forward cannot take it (a
        ``.view`` flatten), said in one line; the config as it is otherwise."""
        cfg = self.cfg
        if not cfg.channels_last or self.task.name == "detect":  # a detector takes a list of images
            return cfg
        from ..user import channels_last_refusal

        crop = tuple(cfg.crop) if isinstance(cfg.crop, (list, tuple)) else (cfg.crop, cfg.crop)
        name = self.model_spec or self.arch
        size = crop * 2 if len(crop) == 1 else crop
        why = channels_last_refusal(net, in_channels=self.channels, size=size, name=name)
        if why:
            self.log(
                f"--channels-last is off: {why}; batches and model stay contiguous, which forgoes channels_last's "
                "speed-up of the convolutions (on a GPU); .reshape() or torch.flatten() in the forward keeps it"
            )
            self.cfg = dataclasses.replace(cfg, channels_last=False)
        return self.cfg

    def _auto_resume(self) -> str:
        """``resume="auto"`` (``--resume auto``, for job scripts resubmitted as they are): continue the
        run RUN holds (its ``last.pt``), else start one; the config says which from here on. A run
        stopped before its first checkpoint has nothing to continue and starts over. Returns the
        line that says so (``""`` for any other ``resume``)."""
        cfg = self.cfg
        if cfg.resume != "auto":
            return ""
        if (self.out / LAST).exists():
            self.cfg = dataclasses.replace(cfg, resume="last")
            return f"--resume auto: {self.out} holds a run: continuing it from {self.out / LAST}"
        held = [name for name in RUN_FILES if (self.out / name).exists()]
        self.cfg = dataclasses.replace(cfg, resume=None, overwrite=bool(held))
        if held:
            return (
                f"--resume auto: {self.out} holds a run stopped before its first checkpoint ({', '.join(held)}): "
                "starting it over"
            )
        return f"--resume auto: {self.out} holds no run yet: starting it"

    def _check_run_dir(self) -> None:
        """A run directory that already holds a run is continued (``--resume``) or replaced
        (``--overwrite``, its run files removed), never silently written over."""
        cfg = self.cfg
        files = [self.out / name for name in RUN_FILES] + sorted(self.out.glob(EVENTS_GLOB))
        held = [f.name for f in files if f.exists()]
        if not held or cfg.resume:
            return
        if not cfg.overwrite:
            raise ArgumentError(
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
            # a detection pack's COCO category id of each class: predictions map back to the dataset's ids
            self.category_ids = manifest.pack.get("category_ids")
        except ManifestError:
            if cfg.num_classes is None:
                raise
            target, names = Target(), []  # a loader_factory's own data, its classes given: a class split
        try:
            self.task = resolve_task(cfg.task, target, names, num_classes=cfg.num_classes)
        except ValueError as e:
            raise ArgumentError(f"{train_dir}: {e}") from None
        self.num_outputs = self.task.num_outputs
        classes = None if cfg.num_classes is not None else names
        return classes, cfg.num_classes or len(names) or self.num_outputs

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
        self.scheduler = make_scheduler(
            self.optimizer, warmup_steps=self.warmup_steps, total_steps=self.total_steps - self.schedule_start
        )
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

    def _init_weights(self, path: Path) -> None:
        """``--init-from``: the network's tensors that fit (name and shape) from ``path``; the
        optimizer and schedule start afresh. One line says what was loaded and what was not."""
        if not path.is_file():
            raise ArgumentError(f"{arg('init_from', path)}: no such file")
        match = load_matching(self.raw, read_weights(path))
        if len(match.loaded) < len(match.absent) + len(match.reshaped):  # a stray bias is no start
            raise ArgumentError(
                f"{path}: most of its tensors do not fit this network ({self.arch}): {match.describe()}; was it "
                f"trained with another {arg('arch')}?"
            )
        self.resolved["init_from"] = {"path": str(path), **match.as_dict()}
        self.log(f"weights from {path}: {match.describe()}")

    def _resume(self) -> None:
        """Continue the run of ``--resume`` (``RUN/last.pt``) or ``--resume-from CKPT`` where it
        stopped; a finished run given more ``--epochs`` is extended (:meth:`_extend`)."""
        cfg = self.cfg
        path = self.out / LAST if cfg.resume == "last" else Path(cfg.resume)
        if not path.exists():
            fix = (
                f"start the run without {arg('resume')} ({arg('overwrite')} replaces what {self.out} holds)"
                if cfg.resume == "last"
                else "give the path of a checkpoint (RUN/last.pt, RUN/best.pt)"
            )
            raise ArgumentError(f"{path}: no such checkpoint, so nothing to resume: {fix}")
        state = load_checkpoint(path, arch=self.arch, num_outputs=self.num_outputs)
        old = state["config"]
        self._check_global_batch(path, old)
        extend = self._extends(path, state)
        start = int(old.get("schedule_start") or 0)
        if not extend:  # the run's schedule (an extended run's starts where it was extended)
            self._plan_schedule(start=start)
            if start:
                self._rebuild_scheduler()
        load_model_state(self.raw, state["model"], source=str(path))
        self.optimizer.load_state_dict(state["optimizer"])
        if extend:
            self._extend(path, old)
        else:
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
        self.resolved.update(warmup_steps=self.warmup_steps, schedule_start=self.schedule_start)
        self.resolved["resumed_from"] = {"path": str(path), "step": self.step, "world_size": old.get("world_size")}
        #: the checkpoint is the run's last step: nothing is left to train
        self.complete = self.step >= self.total_steps
        if self.complete or (cfg.max_steps is not None and self.step >= cfg.max_steps):
            return  # nothing resumes: the loop says so in one line, not "resumed" and then "nothing"
        self.log(
            f"resumed from {path} at step {self.step} (epoch {self.start_epoch + 1}, "
            f"step {self.epoch_step} of {self.steps_per_epoch})"
        )

    def _check_global_batch(self, path: Path, old: dict) -> None:
        """The run's global batch is kept (so its steps and schedule are): one line with the
        ``--batch-size`` to use otherwise."""
        cfg = self.cfg
        old_batch, old_world = old.get("batch_size"), old.get("world_size")
        if old_world == self.dist.world_size and old_batch != cfg.batch_size:
            raise ArgumentError(
                f"{path}: resuming needs the run's batch size ({old_batch} x {old_world} process(es), now "
                f"{cfg.batch_size} x {self.dist.world_size}): use {arg('batch_size', old_batch)}"
            )
        if old_world != self.dist.world_size and old_batch * old_world != cfg.batch_size * self.dist.world_size:
            # another number of processes keeps the global batch, so the steps and the schedule stay
            global_batch, world = old_batch * old_world, self.dist.world_size
            fix = (
                f"use {arg('batch_size', global_batch // world)}"
                if global_batch % world == 0
                else f"{global_batch} does not split over {world} processes"
            )
            raise ArgumentError(
                f"{path}: resuming on {world} process(es) keeps the run's global batch of {global_batch} "
                f"({old_batch} x {old_world}): {fix}"
            )

    def _extends(self, path: Path, state: dict) -> bool:
        """Does this resume extend a finished run (more ``--epochs``)? Another number of steps on a
        run that is not finished, or fewer than it trained, is one line with the fix."""
        old, step = state["config"], int(state["step"])
        old_total, old_epochs = old.get("total_steps"), old.get("epochs")
        if old_total == self.total_steps:
            return False
        if old.get("steps_per_epoch") != self.steps_per_epoch:
            raise CheckpointError(
                f"{path}: the checkpoint's run has {old.get('steps_per_epoch')} steps an epoch, this one "
                f"{self.steps_per_epoch} (other data?): the epochs would not match"
            )
        finished = state["epoch_complete"] and step >= old_total
        if not finished:
            raise ArgumentError(
                f"{path}: the run stopped at step {step} of its {old_total} ({arg('epochs', old_epochs)}): finish "
                f"it with {arg('epochs', old_epochs)}, then resume it with more epochs to extend it"
            )
        if self.total_steps <= step:
            raise ArgumentError(
                f"{path}: the run finished its {old_epochs} epoch(s); {arg('epochs', self.cfg.epochs)} is not "
                f"more: give {arg('epochs', old_epochs + 1)} or more to extend it"
            )
        return True

    def _extend(self, path: Path, old: dict) -> None:
        """A finished run given more epochs: its weights and optimizer state go on, on a new
        learning-rate schedule over the added steps (warm-up, then cosine decay to 0)."""
        step = int(old.get("total_steps"))
        self._plan_schedule(start=step)
        for group in self.optimizer.param_groups:  # the new schedule peaks at this run's --lr
            group["lr"] = group["initial_lr"] = self.resolved["lr"]
        self._rebuild_scheduler()
        self.resolved["extended_from"] = {"path": str(path), "step": step, "epochs": old.get("epochs")}
        added = old.get("epochs") + 1
        epochs = f"epoch {added}" if added == self.cfg.epochs else f"epochs {added}-{self.cfg.epochs}"
        self.log(
            f"extending {path.parent}: it finished {old.get('epochs')} epoch(s) ({step} steps); {epochs} "
            "train from its weights on a new schedule "
            f"({self.warmup_steps} warm-up step(s), then cosine decay to 0 at step {self.total_steps})"
        )

    def _rebuild_scheduler(self) -> None:
        """A fresh scheduler of the planned schedule, stepped by the train step."""
        self.scheduler = make_scheduler(
            self.optimizer, warmup_steps=self.warmup_steps, total_steps=self.total_steps - self.schedule_start
        )
        self.train_step.scheduler = self.scheduler
