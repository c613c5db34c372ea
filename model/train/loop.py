"""The training loop: uint8 batches from the Loader → Normalize → net under AMP → (DDP) SGD/AdamW.

:func:`train` runs a whole training from a :class:`~stoker.model.train.config.TrainConfig`
and returns a summary (images/s, data-wait fraction, final val top-1/top-5). The same code
runs in one process or under ``torchrun`` (DDP: nccl on GPU, gloo on CPU; rank 0 alone logs
and writes).

Performance notes: the loss is accumulated on the device and read every ``log_every``
steps (``.item()`` is a host↔device sync; once per step would stall the GPU queue).
Data-wait is the host time blocked in ``next(loader)``; with the window's end pinned by
that sync, ``wait / window`` is the fraction of the run spent waiting for data.
"""

from __future__ import annotations

import dataclasses
import json
import math
import signal
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Optional, Union

import torch
from torch import nn

from stoker import __version__
from stoker.pipeline.fsutil import atomic_write

from ..checkpoint import (
    CheckpointError,
    StopSignals,
    load_checkpoint,
    load_model_state,
    rng_state,
    save_checkpoint,
    set_rng_state,
    weights_digest,
)
from ..nets import build_model, count_parameters
from ..normalize import with_normalize
from .config import BEST, CONFIG, LAST, METRICS, TrainConfig
from .evaluation import evaluate
from .plotting import plot_metrics
from .runtime import (
    Dist,
    all_reduce_sum,
    broadcast_buffers,
    init_distributed,
    make_scaler,
    resolve_amp,
    resolve_device,
    seed_everything,
    shutdown_distributed,
    wrap_ddp,
)
from .step import TrainStep, loss_fn, make_optimizer, make_scheduler


def _default_loader_factory(path: str, **kw: Any) -> Any:
    from stoker.pipeline import Loader

    return Loader(path, **kw)


class _Window:
    """One log window of an epoch: the loss summed on the device, steps, images, data-wait seconds."""

    def __init__(self, device: torch.device) -> None:
        self.loss = torch.zeros((), dtype=torch.float32, device=device)
        self.reset()

    def reset(self) -> None:
        self.loss.zero_()
        self.steps, self.images, self.wait = 0, 0, 0.0
        self.t0 = time.perf_counter()

    def add(self, loss: torch.Tensor, images: int) -> None:
        self.loss += loss  # stays on the device: no sync
        self.steps += 1
        self.images += images

    def timed(self, it: Iterator) -> Iterator:
        """``it``'s items, the time blocked in ``next(it)`` added to :attr:`wait`."""
        while True:
            t0 = time.perf_counter()
            try:
                item = next(it)
            except StopIteration:
                return
            self.wait += time.perf_counter() - t0
            yield item


class _Run:
    """One call of :func:`train`: :meth:`setup` builds everything, :meth:`run` trains."""

    def __init__(self, cfg: TrainConfig, loader_factory: Callable[..., Any]) -> None:
        self.cfg = cfg
        self.factory = loader_factory
        self.out = Path(cfg.out)
        self.dist: Optional[Dist] = None
        self.start_epoch, self.step, self.epoch_step = 0, 0, 0
        self.best_top1 = -1.0
        self.loader_state: Optional[dict] = None
        # what run() reports
        self.windows: list[tuple[int, float, float]] = []  # (images, seconds, wait seconds) per log window
        self.last_loss = float("nan")
        self.val: Optional[dict] = None
        self.stopped: Optional[int] = None  # the signal that stopped the run

    # rank-0 outputs ------------------------------------------------------------
    def log(self, msg: str) -> None:
        if self.dist.main:
            from tqdm import tqdm

            tqdm.write(f"stoker train: {msg}", file=sys.stderr)

    def write_metrics(self, row: dict[str, Any]) -> None:
        if self.dist.main:
            with open(self.out / METRICS, "a") as f:
                f.write(json.dumps(row) + "\n")

    def checkpoint(self, *, epoch: int, epoch_complete: bool, path: Optional[Path] = None) -> None:
        if self.dist.main:
            save_checkpoint(path or self.out / LAST, {
                "model": self.raw.state_dict(),
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
                "best_top1": self.best_top1,
            })

    def close(self) -> None:
        if self.dist is not None:
            shutdown_distributed(self.dist)

    # setup -----------------------------------------------------------------------
    def setup(self) -> None:
        cfg = self.cfg
        self._start_runtime()
        train_dir, val_dir = self._split_dirs()
        classes, num_classes = self._classes(train_dir)
        net = build_model(cfg.arch, self.num_outputs, image_size=cfg.crop)  # a bad --arch fails before any I/O
        self._make_loaders(train_dir, val_dir)
        self.total_steps = cfg.epochs * self.steps_per_epoch
        self.warmup_steps = min(round(cfg.warmup_epochs * self.steps_per_epoch), max(0, self.total_steps - 1))
        global_batch = cfg.batch_size * self.dist.world_size
        lr, wd = cfg.peak_lr(global_batch), cfg.resolved_weight_decay()
        self._make_model(net, lr=lr, weight_decay=wd)
        self.resolved = {
            **dataclasses.asdict(cfg),
            "lr": lr, "weight_decay": wd, "amp": self.amp.name, "amp_requested": cfg.amp,
            "device": str(self.device), "world_size": self.dist.world_size, "global_batch": global_batch,
            "num_classes": num_classes, "num_outputs": self.num_outputs, "classes": classes,
            "steps_per_epoch": self.steps_per_epoch, "total_steps": self.total_steps,
            "warmup_steps": self.warmup_steps, "params": count_parameters(net),
            "has_val": self.val_loader is not None,
            "torch": str(torch.__version__), "stoker": __version__,
        }
        if cfg.resume:
            self._resume()
        if self.dist.main:
            self.out.mkdir(parents=True, exist_ok=True)
            with atomic_write(self.out / CONFIG, "w") as f:
                json.dump(self.resolved, f, indent=1, default=str)
                f.write("\n")

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

    def _classes(self, train_dir: str) -> tuple[Optional[list[str]], int]:
        """The class names (from the train manifest, unless ``num_classes`` is given) and their count."""
        cfg = self.cfg
        classes: Optional[list[str]] = None
        num_classes = cfg.num_classes
        if num_classes is None:
            from stoker.pipeline.cache import read_manifest

            classes = read_manifest(train_dir, cfg.storage_options).classes
            num_classes = len(classes)
        self.num_outputs = 1 if cfg.task == "regress" else num_classes
        if cfg.task == "classify" and num_classes < 2:
            raise ValueError(f"{train_dir}: {num_classes} class(es); classification needs at least 2")
        return classes, num_classes

    def _has_split(self, split: str) -> bool:
        from stoker.pipeline.storage import is_url

        if not is_url(split):
            return Path(split).is_dir()
        from stoker.pipeline.cache import read_manifest
        from stoker.pipeline.shards.manifest import ManifestError

        try:
            read_manifest(split, self.cfg.storage_options)
        except ManifestError:
            return False
        return True

    def _make_loaders(self, train_dir: str, val_dir: str) -> None:
        from stoker.pipeline.storage import is_url

        cfg = self.cfg
        kw = dict(batch_size=cfg.batch_size, crop=cfg.crop, device=str(self.device), seed=cfg.seed,
                  rank=self.dist.rank, world_size=self.dist.world_size, backend=cfg.backend,
                  threads=cfg.threads, channels_last=cfg.channels_last)
        if cfg.shuffle != "global":
            kw.update(shuffle=cfg.shuffle, block_shards=cfg.block_shards)
        remote = is_url(train_dir)
        if remote:
            kw.update(storage_options=cfg.storage_options, cache_limit=cfg.cache_limit)

        def cache(split: str) -> dict:  # one cache folder per split: their shard names may coincide
            return {"cache_dir": str(Path(cfg.cache_dir) / split) if cfg.cache_dir else None} if remote else {}

        self.train_loader = self.factory(train_dir, train=True, drop_last=None, **kw, **cache("train"))
        self.val_loader = (self.factory(val_dir, train=False, drop_last=False, **kw, **cache("val"))
                           if self._has_split(val_dir) else None)
        self.train_loader.set_epoch(0)
        self.steps_per_epoch = len(self.train_loader)
        if self.steps_per_epoch < 1:
            raise ValueError(f"{train_dir}: too few samples for one batch of {cfg.batch_size} "
                             f"x {self.dist.world_size} rank(s); lower --batch-size")

    def _make_model(self, net: nn.Module, *, lr: float, weight_decay: float) -> None:
        cfg = self.cfg
        mf = torch.channels_last if cfg.channels_last else torch.contiguous_format
        self.raw = with_normalize(net).to(self.device, memory_format=mf)
        self.optimizer = make_optimizer(self.raw, cfg.optimizer, lr=lr, momentum=cfg.momentum,
                                        weight_decay=weight_decay, fused=self.device.type == "cuda")
        self.scheduler = make_scheduler(self.optimizer, warmup_steps=self.warmup_steps, total_steps=self.total_steps)
        self.scaler = make_scaler(self.amp)
        model = wrap_ddp(self.raw, self.dist, self.device)
        train_model = torch.compile(model) if cfg.compile else model
        self.eval_model = torch.compile(self.raw) if cfg.compile else self.raw
        self.train_model = train_model
        self.train_step = TrainStep(train_model, self.optimizer, loss_fn(cfg.task, label_smoothing=cfg.label_smoothing),
                                    amp=self.amp, scaler=self.scaler, scheduler=self.scheduler)

    def _resume(self) -> None:
        cfg = self.cfg
        path = self.out / LAST if cfg.resume in ("auto", "last") else Path(cfg.resume)
        state = load_checkpoint(path, arch=cfg.arch, num_outputs=self.num_outputs)
        old = state["config"]
        if (old.get("batch_size"), old.get("world_size")) != (cfg.batch_size, self.dist.world_size):
            raise CheckpointError(f"{path}: resuming needs the same batch size and world size (checkpoint: "
                                  f"{old.get('batch_size')} x {old.get('world_size')}, now: "
                                  f"{cfg.batch_size} x {self.dist.world_size})")
        if old.get("total_steps") != self.total_steps:
            raise CheckpointError(f"{path}: the checkpoint's run has {old.get('total_steps')} steps in all, this one "
                                  f"{self.total_steps} (change of --epochs or data?): the schedule would not match")
        load_model_state(self.raw, state["model"], source=str(path))
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        set_rng_state(state["rng"])
        self.step = int(state["step"])
        self.best_top1 = float(state.get("best_top1", -1.0))
        if state["epoch_complete"]:
            self.start_epoch, self.epoch_step = int(state["epoch"]) + 1, 0
        else:
            self.start_epoch, self.epoch_step = int(state["epoch"]), int(state["epoch_step"])
            self.loader_state = state["loader"]
        self.resolved["resumed_from"] = {"path": str(path), "step": self.step}
        self.log(f"resumed from {path} at step {self.step} (epoch {self.start_epoch + 1}, "
                 f"step {self.epoch_step} of {self.steps_per_epoch})")

    # the loop ------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Train the remaining epochs (or until SIGTERM/SIGINT) and return the summary."""
        from tqdm import tqdm

        cfg = self.cfg
        t_start = time.perf_counter()
        bar = tqdm(total=self.total_steps, initial=self.step, unit="step", dynamic_ncols=True,
                   disable=not (self.dist.main and cfg.progress), file=sys.stderr)
        with StopSignals() as signals:
            for epoch in range(self.start_epoch, cfg.epochs):
                bar.set_description(f"epoch {epoch + 1}/{cfg.epochs}")
                if not self._train_epoch(epoch, signals, bar):
                    break  # stopped mid-epoch: last.pt holds where
                self._end_epoch(epoch)
                if self.stopped:
                    break
        bar.close()
        if self.dist.main and cfg.plot and (self.out / METRICS).exists():
            plot_metrics(self.out)
        if self.stopped:
            self.log(f"stopped by {signal.Signals(self.stopped).name} at step {self.step}; checkpoint "
                     f"{self.out / LAST}; continue with --resume")
        return self._summary(time.perf_counter() - t_start)

    def _train_epoch(self, epoch: int, signals: StopSignals, bar: Any) -> bool:
        """One epoch's steps (from the resume point when there is one); False when stopped mid-epoch."""
        cfg = self.cfg
        self.train_loader.set_epoch(epoch)
        if self.loader_state is not None:
            self.train_loader.load_state_dict(self.loader_state)
            self.loader_state = None
        else:
            self.epoch_step = 0
        self.train_model.train()
        window = _Window(self.device)
        it = iter(self.train_loader)
        for images, labels in window.timed(it):
            window.add(self.train_step(images, labels), int(images.shape[0]))
            self.step += 1
            self.epoch_step += 1
            bar.update(1)
            end_of_epoch = self.epoch_step >= self.steps_per_epoch
            if self.step % cfg.log_every == 0 or end_of_epoch:
                self._close_window(epoch, window, signals, bar)
            if not self.dist.enabled and signals.received is not None:
                self.stopped = signals.received  # one process: stop at once, no vote needed
            if end_of_epoch:
                continue
            if self.stopped or (cfg.ckpt_every and self.step % cfg.ckpt_every == 0):
                self.checkpoint(epoch=epoch, epoch_complete=False)
            if self.stopped:
                # Close the abandoned iteration now, while the loader's pipeline is alive
                # (left to the garbage collector it may run after DALI shut down at exit).
                close = getattr(it, "close", None)
                if close is not None:
                    close()
                return False
        return True

    def _close_window(self, epoch: int, window: _Window, signals: StopSignals, bar: Any) -> None:
        """Read the window's loss (the one host<->device sync of the window, and the DDP stop vote); log it."""
        counts = torch.tensor([window.steps, signals.received is not None], dtype=torch.float64, device=self.device)
        totals = all_reduce_sum(torch.cat([window.loss.double()[None], counts]), self.dist)
        loss_sum, n_sum, stop_votes = totals.tolist()
        seconds = time.perf_counter() - window.t0
        self.last_loss = loss_sum / n_sum
        images = window.images * self.dist.world_size
        ips = images / seconds
        self.windows.append((images, seconds, window.wait))
        self.write_metrics({"kind": "train", "epoch": epoch, "step": self.step, "loss": self.last_loss,
                            "images_per_s": ips, "data_wait": window.wait / seconds,
                            "lr": self.scheduler.get_last_lr()[0], "time": time.time()})
        bar.set_postfix({"img/s": f"{ips:.0f}", "loss": f"{self.last_loss:.3f}",
                         "wait": f"{100 * window.wait / seconds:.0f}%"}, refresh=False)
        if not math.isfinite(self.last_loss):
            raise FloatingPointError(f"loss became {self.last_loss} at step {self.step}: "
                                     f"try a lower --lr or --amp off")
        window.reset()
        if stop_votes > 0:
            self.stopped = signals.received or signal.SIGTERM

    def _end_epoch(self, epoch: int) -> None:
        """Every rank gets rank 0's BN statistics, then validate and checkpoint (last.pt, best.pt)."""
        broadcast_buffers(self.raw, self.dist)
        if self.val_loader is not None:
            self.val_loader.set_epoch(epoch)
            self.val = evaluate(self.eval_model, self.val_loader, device=self.device, amp=self.amp,
                                task=self.cfg.task, dist=self.dist)
            self.write_metrics({"kind": "val", "epoch": epoch, "step": self.step, **self.val, "time": time.time()})
            msg = f"epoch {epoch + 1}/{self.cfg.epochs}: val top-1 {100 * self.val['top1']:.1f}%"
            if self.val["top5"] is not None:
                msg += f", top-5 {100 * self.val['top5']:.1f}%"
            self.log(msg + f", loss {self.val['loss']:.4f} ({self.val['n']} samples)")
        self.checkpoint(epoch=epoch, epoch_complete=True)
        if self.val is not None and self.val["top1"] > self.best_top1:
            self.best_top1 = self.val["top1"]
            self.checkpoint(epoch=epoch, epoch_complete=True, path=self.out / BEST)

    def _summary(self, seconds: float) -> dict[str, Any]:
        timed = self.windows[1:] if len(self.windows) > 1 else self.windows  # the first holds warm-up/compile
        t_images, t_seconds, t_wait = (sum(x) for x in zip(*timed, strict=True)) if timed else (0, 0.0, 0.0)
        val = self.val or {}
        return {
            "run_dir": str(self.out),
            "checkpoint": str(self.out / LAST),
            "arch": self.cfg.arch, "device": str(self.device), "amp": self.amp.name,
            "world_size": self.dist.world_size,
            "epochs": self.cfg.epochs, "steps": self.step, "total_steps": self.total_steps,
            "seconds": seconds,
            "images_per_s": t_images / t_seconds if t_seconds else None,
            "data_wait": t_wait / t_seconds if t_seconds else None,
            "train_loss": self.last_loss,
            "val_top1": val.get("top1"),
            "val_top5": val.get("top5"),
            "val_loss": val.get("loss"),
            "val_samples": val.get("n"),
            "interrupted": signal.Signals(self.stopped).name if self.stopped else None,
            "weights_sha256": weights_digest(self.raw),
        }


def train(config: Union[TrainConfig, Mapping[str, Any], Any], *,
          loader_factory: Optional[Callable[..., Any]] = None) -> dict[str, Any]:
    """Run a training and return its summary (every rank returns one; rank 0 wrote the files).

    Args:
        config: A :class:`TrainConfig`, a dict or an argparse Namespace of its fields.
        loader_factory: ``factory(path, *, batch_size, train, crop, device, seed, rank,
            world_size, backend, threads, drop_last, channels_last)`` returning an object with
            the :class:`stoker.pipeline.Loader` interface (``set_epoch``, ``__iter__`` yielding
            ``(uint8 images [N,3,H,W] on the device, int64 labels)``, ``__len__``,
            ``state_dict``, ``load_state_dict``). Default: the Loader.

    Returns:
        ``images_per_s`` (after the first log window), ``data_wait`` (fraction of train time
        blocked on the loader), ``val_top1``, ``val_top5``, ``val_loss``, ``val_samples``,
        ``train_loss``, ``steps``, ``seconds``, ``interrupted`` (signal name or None),
        ``weights_sha256``, ``run_dir``, ``checkpoint``, ...

    Raises:
        ValueError: Bad settings; :class:`~stoker.model.checkpoint.CheckpointError` (a
            ValueError) for an unusable checkpoint; FileNotFoundError for missing data.
    """
    cfg = TrainConfig.from_any(config)
    cfg.validate()
    run = _Run(cfg, loader_factory or _default_loader_factory)
    try:
        run.setup()
        return run.run()
    finally:
        run.close()
