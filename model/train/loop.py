"""The training loop: uint8 batches from the Loader → Normalize → net under AMP → (DDP) SGD/AdamW.

:func:`train` runs a whole training from a :class:`~stoker.model.train.config.TrainConfig`
and returns a summary (images/s, data-wait fraction, final val top-1/top-5). The same code
runs in one process or under ``torchrun`` (DDP: nccl on GPU, gloo on CPU; rank 0 alone logs
and writes). What a run is built from (runtime, loaders, model, resume, checkpoints) is
:class:`~stoker.model.train.run.Run`; this module is the epochs that drive it.

Performance notes: the loss is accumulated on the device and read every ``log_every``
steps (``.item()`` is a host↔device sync; once per step would stall the GPU queue).
Data-wait is the host time blocked in ``next(loader)``; with the window's end pinned by
that sync, ``wait / window`` is the fraction of the run spent waiting for data.
"""

from __future__ import annotations

import math
import signal
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from ..checkpoint import StopSignals, weights_digest
from .config import BEST, LAST, METRICS, TrainConfig
from .evaluation import evaluate
from .logs import shows_progress_bar, step_line
from .plotting import plot_metrics
from .run import Run
from .runtime import all_reduce_sum, broadcast_buffers


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


class _Loop:
    """The epochs of one :class:`~.run.Run` (from its resume point), then the summary."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.windows: list[tuple[int, float, float]] = []  # (images, seconds, wait seconds) per log window
        self.last_loss = float("nan")
        self.val: dict | None = None
        self.stopped: int | None = None  # the signal that stopped the run
        self.at_max_steps = False  # a smoke run (--max-steps) reached its budget
        # no bar drawn (a log file, Slurm, --no-progress): each log window ends with a plain line
        self.step_lines = not shows_progress_bar(run.cfg.progress)

    def train(self) -> dict[str, Any]:
        """Train the remaining epochs (or until SIGTERM/SIGINT) and return the summary."""
        from tqdm import tqdm

        run, cfg = self.run, self.run.cfg
        t_start = time.perf_counter()
        if run.complete:  # resumed from its last step: say so, and report what the run reached
            run.log(
                f"{run.out} is complete ({run.step}/{run.total_steps} steps): nothing to resume; to train it "
                f"longer, extend it with --resume --epochs {cfg.epochs + 1} (or more)"
            )
            self._from_metrics()
            return self._summary(time.perf_counter() - t_start)
        if cfg.max_steps is not None and run.step >= cfg.max_steps:
            run.log(f"--max-steps {cfg.max_steps}: the run is at step {run.step} already; nothing to train")
            self._from_metrics()
            return self._summary(time.perf_counter() - t_start)
        if cfg.max_steps is not None and cfg.max_steps < run.total_steps:
            run.log(
                f"--max-steps {cfg.max_steps}: stopping after step {cfg.max_steps} of {run.total_steps}; the "
                "learning-rate schedule is the whole run's, so --resume continues it"
            )
        bar = tqdm(
            total=min(run.total_steps, cfg.max_steps or run.total_steps),
            initial=run.step,
            unit="step",
            dynamic_ncols=True,
            # progress bars only on a terminal: in a log file they are kilobytes of carriage returns
            disable=None if run.dist.main and cfg.progress else True,
            file=sys.stderr,
        )
        with StopSignals() as signals:
            for epoch in range(run.start_epoch, cfg.epochs):
                bar.set_description(f"epoch {epoch + 1}/{cfg.epochs}")
                if not self._train_epoch(epoch, signals, bar):
                    if self.at_max_steps:  # a smoke run tries the val pass too, and keeps its best
                        self._validate(epoch)
                        self._keep_best(epoch, epoch_complete=False)
                    break  # stopped mid-epoch: last.pt holds where
                self._end_epoch(epoch)
                if self.stopped or self.at_max_steps:
                    break
        bar.close()
        if run.dist.main and cfg.plot and (run.out / METRICS).exists():
            plot_metrics(run.out)
        if self.stopped:
            run.log(
                f"stopped by {signal.Signals(self.stopped).name} at step {run.step}; checkpoint "
                f"{run.out / LAST}; continue with --resume"
            )
        return self._summary(time.perf_counter() - t_start)

    def _train_epoch(self, epoch: int, signals: StopSignals, bar: Any) -> bool:
        """One epoch's steps (from the resume point when there is one); False when stopped mid-epoch."""
        run, cfg = self.run, self.run.cfg
        run.train_loader.set_epoch(epoch)
        if run.loader_state is not None:
            run.train_loader.load_state_dict(run.loader_state)
            run.loader_state = None
        else:
            run.epoch_step = 0
        run.train_model.train()
        window = _Window(run.device)
        it = iter(run.train_loader)
        for images, labels in window.timed(it):
            window.add(run.train_step(images, labels), int(images.shape[0]))
            run.step += 1
            run.epoch_step += 1
            bar.update(1)
            end_of_epoch = run.epoch_step >= run.steps_per_epoch
            self.at_max_steps = cfg.max_steps is not None and run.step >= cfg.max_steps
            if run.step % cfg.log_every == 0 or end_of_epoch or self.at_max_steps:
                self._close_window(epoch, window, signals, bar)
            if not run.dist.enabled and signals.received is not None:
                self.stopped = signals.received  # one process: stop at once, no vote needed
            if end_of_epoch:
                continue
            ending = self.stopped or self.at_max_steps
            if ending or (cfg.ckpt_every and run.step % cfg.ckpt_every == 0):
                run.checkpoint(epoch=epoch, epoch_complete=False)
            if ending:
                # Close the abandoned iteration now, while the loader's pipeline is alive
                # (left to the garbage collector it may run after DALI shut down at exit).
                close = getattr(it, "close", None)
                if close is not None:
                    close()
                return False
        return True

    def _close_window(self, epoch: int, window: _Window, signals: StopSignals, bar: Any) -> None:
        """Read the window's loss (the one host<->device sync of the window, and the DDP stop vote); log it."""
        run = self.run
        counts = torch.tensor([window.steps, signals.received is not None], dtype=torch.float64, device=run.device)
        totals = all_reduce_sum(torch.cat([window.loss.double()[None], counts]), run.dist)
        loss_sum, n_sum, stop_votes = totals.tolist()
        seconds = time.perf_counter() - window.t0
        self.last_loss = loss_sum / n_sum
        images = window.images * run.dist.world_size
        ips = images / seconds
        self.windows.append((images, seconds, window.wait))
        run.write_metrics(
            {
                "kind": "train",
                "epoch": epoch,
                "step": run.step,
                "loss": self.last_loss,
                "images_per_s": ips,
                "data_wait": window.wait / seconds,
                "lr": run.scheduler.get_last_lr()[0],
                "time": time.time(),
            }
        )
        bar.set_postfix(
            {"img/s": f"{ips:.0f}", "loss": f"{self.last_loss:.3f}", "wait": f"{100 * window.wait / seconds:.0f}%"},
            refresh=False,
        )
        if self.step_lines:
            self._say_step(epoch, window.steps, seconds, ips, window.wait / seconds)
        if not math.isfinite(self.last_loss):
            raise FloatingPointError(f"loss became {self.last_loss} at step {run.step}: try a lower --lr or --amp off")
        window.reset()
        if stop_votes > 0:
            self.stopped = signals.received or signal.SIGTERM

    def _say_step(self, epoch: int, steps: int, seconds: float, ips: float, wait: float) -> None:
        """The plain line of a log window: where the run is, how fast, and the time it still needs."""
        run = self.run
        last = min(run.total_steps, run.cfg.max_steps or run.total_steps)  # a smoke run ends at its budget
        self.run.log(
            step_line(
                epoch=epoch,
                epochs=run.cfg.epochs,
                step=run.step,
                total=last,
                loss=self.last_loss,
                images_per_s=ips,
                data_wait=wait,
                lr=run.scheduler.get_last_lr()[0],
                eta_s=(last - run.step) * seconds / max(1, steps),
            )
        )

    def _end_epoch(self, epoch: int) -> None:
        """Every rank gets rank 0's BN statistics, then validate and checkpoint (last.pt, best.pt)."""
        run = self.run
        self._validate(epoch)
        run.checkpoint(epoch=epoch, epoch_complete=True)
        self._keep_best(epoch, epoch_complete=True)

    def _keep_best(self, epoch: int, *, epoch_complete: bool) -> None:
        """``best.pt`` when the val pass just run beat the best figure so far (a smoke run's too)."""
        run = self.run
        score = None if self.val is None else self.val.get(run.task.metric)
        if score is not None and math.isfinite(score) and score > run.best_score:
            run.best_score = score
            run.checkpoint(epoch=epoch, epoch_complete=epoch_complete, path=run.out / BEST)

    def _validate(self, epoch: int) -> None:
        """Every rank gets rank 0's BN statistics; the val figures (when there is a val split),
        written and said."""
        run = self.run
        broadcast_buffers(run.raw, run.dist)
        if run.val_loader is not None:
            run.val_loader.set_epoch(epoch)
            self.val = evaluate(
                run.eval_model, run.val_loader, device=run.device, amp=run.amp, task=run.task, dist=run.dist
            )
            run.write_metrics({"kind": "val", "epoch": epoch, "step": run.step, **self.val, "time": time.time()})
            balanced = run.cfg.balance == "classes"
            run.log(f"epoch {epoch + 1}/{run.cfg.epochs}: val {format_val(self.val, balanced=balanced)}")

    def _from_metrics(self) -> None:
        """The last train loss and val figures a finished run wrote (``RUN/metrics.jsonl``)."""
        import json

        path = self.run.out / METRICS
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
        train = [r for r in rows if r.get("kind") == "train"]
        val = [r for r in rows if r.get("kind") == "val"]
        if train:
            self.last_loss = train[-1]["loss"]
        if val:
            self.val = {k: v for k, v in val[-1].items() if k not in ("kind", "epoch", "step", "time")}

    def _summary(self, seconds: float) -> dict[str, Any]:
        run = self.run
        timed = self.windows[1:] if len(self.windows) > 1 else self.windows  # the first holds warm-up/compile
        t_images, t_seconds, t_wait = (sum(x) for x in zip(*timed, strict=True)) if timed else (0, 0.0, 0.0)
        val = self.val or {}
        return {
            "run_dir": str(run.out),
            "checkpoint": str(run.out / LAST),
            "arch": run.arch,
            "device": str(run.device),
            "amp": run.amp.name,
            "world_size": run.dist.world_size,
            "epochs": run.cfg.epochs,
            "steps": run.step,
            "total_steps": run.total_steps,
            "seconds": seconds,
            "images_per_s": t_images / t_seconds if t_seconds else None,
            "data_wait": t_wait / t_seconds if t_seconds else None,
            "train_loss": self.last_loss,
            "task": run.task.name,
            "val": dict(val) if val else None,
            "val_top1": val.get("top1"),
            "val_top5": val.get("top5"),
            "val_loss": val.get("loss"),
            "val_samples": val.get("n"),
            "interrupted": signal.Signals(self.stopped).name if self.stopped else None,
            "complete": run.step >= run.total_steps,
            "max_steps": run.cfg.max_steps if self.at_max_steps and run.step < run.total_steps else None,
            "balance": run.cfg.balance,
            "best": str(run.out / BEST) if (run.out / BEST).exists() else None,
            "weights_sha256": weights_digest(run.raw),
        }


def format_val(val: dict, *, balanced: bool = False) -> str:
    """One line of validation figures: ``top-1 61.2%, top-5 98.1%``, ``MSE 0.012, MAE 0.08, R² 0.91``,
    ``mIoU 54.3%, pixel accuracy 88.0%``, ``mAP 41.0%`` or ``mAP 41.0%, mAP@50 63.2%``; then the loss
    (a detector's evaluation computes none) and the sample count, and for a mix each dataset's
    figures: `` [web: top-1 61.2%, ...; curated: ...]``. With ``balanced`` (a run under
    ``--balance classes``) the mean top-1 over the classes follows top-1: ``balanced top-1 58.0%``."""
    parts = []
    if val.get("top1") is not None:
        parts.append(f"top-1 {100 * val['top1']:.1f}%")
    if balanced and val.get("balanced_top1") is not None:
        parts.append(f"balanced top-1 {100 * val['balanced_top1']:.1f}%")
    if val.get("top5") is not None:
        parts.append(f"top-5 {100 * val['top5']:.1f}%")
    if "r2" in val:
        parts.append(f"MSE {val['mse']:.4g}, MAE {val['mae']:.4g}, R² {val['r2']:.3f}")
    if "miou" in val:
        parts.append(f"mIoU {100 * val['miou']:.1f}%, pixel accuracy {100 * val['pixel_acc']:.1f}%")
    if "map" in val:
        parts.append(f"mAP {100 * val['map']:.1f}%")
    if "map50" in val:
        parts.append(f"mAP@50 {100 * val['map50']:.1f}%")
    if val.get("loss") is not None:
        parts.append(f"loss {val['loss']:.4f}")
    line = ", ".join(parts) + f" ({val['n']} samples)"
    splits = val.get("splits")  # a mix: each dataset's figures after the overall ones
    if splits:
        line += " [" + "; ".join(f"{name}: {format_val(v, balanced=balanced)}" for name, v in splits.items()) + "]"
    return line


def train(
    config: TrainConfig | Mapping[str, Any] | Any, *, loader_factory: Callable[..., Any] | None = None
) -> dict[str, Any]:
    """Run a training and return its summary (every rank returns one; rank 0 wrote the files).

    Args:
        config: A :class:`TrainConfig`, or a dict of its fields.
        loader_factory: ``factory(path, *, batch_size, train, crop, device, seed, rank,
            world_size, backend, decoder, decode, threads, drop_last, channels_last, channels)``
            (``crop``: the recipe, whole, a :class:`~stoker.pipeline.augment.CropSpec` whose
            ``size`` is ``(height, width)``) returning an object with
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
    run = Run(cfg, loader_factory or _default_loader_factory)
    try:
        run.setup()
        return _Loop(run).train()
    finally:
        run.close()
