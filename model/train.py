"""The training loop: uint8 batches from the Loader → Normalize → net under AMP → (DDP) SGD/AdamW.

:func:`train` runs a whole training from a :class:`TrainConfig` and returns a summary
(images/s, data-wait fraction, final val top-1/top-5). The same code runs in one process
or under ``torchrun`` (DDP: nccl on GPU, gloo on CPU; rank 0 alone logs and writes).

Performance notes: the loss is accumulated on the device and read every ``log_every``
steps (``.item()`` is a host↔device sync; once per step would stall the GPU queue).
Data-wait is the host time blocked in ``next(loader)``; with the window's end pinned by
that sync, ``wait / window`` is the fraction of the run spent waiting for data.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Union

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from stoker.pipeline.fsutil import atomic_write

from .checkpoint import (CheckpointError, StopSignals, load_checkpoint, load_model_state, rng_state,
                         save_checkpoint, set_rng_state)
from .checkpoint import digest as checkpoint_digest
from .nets import build_model, count_parameters
from .normalize import with_normalize

AMP_CHOICES = ("auto", "bf16", "fp16", "off")
OPTIMIZERS = ("sgd", "adamw")
TASKS = ("classify", "regress")
LAST = "last.pt"
BEST = "best.pt"
METRICS = "metrics.jsonl"
CONFIG = "config.json"
PLOT = "curves.png"


# --------------------------------------------------------------------------- devices, AMP

@dataclass(frozen=True)
class AmpSpec:
    """A resolved ``--amp``: ``name`` is bf16|fp16|off; ``dtype`` feeds ``torch.autocast``."""

    name: str
    dtype: torch.dtype
    enabled: bool


def resolve_device(device: str = "auto") -> torch.device:
    """``"auto"`` → ``cuda`` (this process's ``LOCAL_RANK`` under torchrun) if available, else ``cpu``."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise ValueError(f"device={device!r} is not a device (try auto, cpu, cuda, cuda:1)") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device={device!r}: torch sees no CUDA device here")
        if dev.index is None:
            dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", torch.cuda.current_device())))
    return dev


def resolve_amp(amp: str, device: torch.device) -> AmpSpec:
    """``auto``: bf16 where the GPU supports it, fp16 (+ GradScaler) otherwise; off on CPU.

    bf16 and fp16 may also be asked for on the CPU (autocast supports both there).
    """
    if amp not in AMP_CHOICES:
        raise ValueError(f"amp={amp!r} is not one of {', '.join(AMP_CHOICES)}")
    if amp == "auto":
        if device.type == "cuda":
            amp = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
        else:
            amp = "off"
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "off": torch.float32}[amp]
    return AmpSpec(amp, dtype, amp != "off")


# --------------------------------------------------------------------------- config

@dataclass
class TrainConfig:
    """Everything a training run needs; saved resolved as ``RUN/config.json``.

    ``batch_size`` is per process (the global batch is ``batch_size * world_size``).
    ``lr=None`` picks 0.1 x global_batch/256 for SGD, 1e-3 for AdamW;
    ``weight_decay=None`` picks 5e-5 for SGD, 0.05 for AdamW (never on norms and biases).
    ``threads`` goes to the Loader; ``torch_threads`` sets ``torch.set_num_threads`` (CPU
    training: leave cores to the loader). ``ckpt_every=0`` checkpoints at epoch ends only. ``resume``: ``"auto"`` (RUN/last.pt)
    or a checkpoint path. ``num_classes=None`` reads the class list from the train manifest.
    """

    data: str
    out: str
    arch: str = "inception"
    epochs: int = 5
    batch_size: int = 64
    lr: Optional[float] = None
    optimizer: str = "sgd"
    momentum: float = 0.9
    weight_decay: Optional[float] = None
    warmup_epochs: float = 1.0
    label_smoothing: float = 0.0
    task: str = "classify"
    crop: int = 224
    amp: str = "auto"
    channels_last: bool = False
    compile: bool = False
    device: str = "auto"
    seed: int = 0
    deterministic: bool = False
    backend: str = "auto"
    threads: Optional[int] = None
    torch_threads: Optional[int] = None
    log_every: int = 20
    ckpt_every: int = 0
    resume: Optional[str] = None
    plot: bool = False
    progress: bool = True
    num_classes: Optional[int] = None

    def validate(self) -> None:
        """Raise ValueError naming the first bad value."""
        for name in ("epochs", "batch_size", "crop", "log_every"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
        if self.ckpt_every < 0:
            raise ValueError(f"ckpt_every={self.ckpt_every} must be >= 0 (0: at epoch ends only)")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer={self.optimizer!r} is not one of {', '.join(OPTIMIZERS)}")
        if self.task not in TASKS:
            raise ValueError(f"task={self.task!r} is not one of {', '.join(TASKS)}")
        if self.amp not in AMP_CHOICES:
            raise ValueError(f"amp={self.amp!r} is not one of {', '.join(AMP_CHOICES)}")
        if self.lr is not None and not self.lr > 0:
            raise ValueError(f"lr={self.lr} must be > 0")
        if self.weight_decay is not None and self.weight_decay < 0:
            raise ValueError(f"weight_decay={self.weight_decay} must be >= 0")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"label_smoothing={self.label_smoothing} must be in [0, 1)")
        if self.warmup_epochs < 0:
            raise ValueError(f"warmup_epochs={self.warmup_epochs} must be >= 0")
        if self.torch_threads is not None and self.torch_threads < 1:
            raise ValueError(f"torch_threads={self.torch_threads} must be >= 1")
        if self.num_classes is not None and self.num_classes < 1:
            raise ValueError(f"num_classes={self.num_classes} must be >= 1")

    @classmethod
    def from_any(cls, config: Union["TrainConfig", Mapping[str, Any], Any]) -> "TrainConfig":
        """A TrainConfig from itself, a dict, or an argparse Namespace (unknown keys ignored)."""
        if isinstance(config, cls):
            return dataclasses.replace(config)
        d = dict(config) if isinstance(config, Mapping) else vars(config)
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


# --------------------------------------------------------------------------- distributed

@dataclass
class _Dist:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    owned: bool = False  # we called init_process_group (so we destroy it)

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def main(self) -> bool:
        return self.rank == 0


def _init_distributed(device: torch.device) -> _Dist:
    import torch.distributed as dist

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return _Dist()
    rank = int(os.environ["RANK"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    owned = False
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
        owned = True
    return _Dist(rank, world, local, owned)


def _all_reduce_sum(t: torch.Tensor, d: _Dist) -> torch.Tensor:
    if d.enabled:
        import torch.distributed as dist

        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def _broadcast_buffers(model: nn.Module, d: _Dist) -> None:
    """Give every rank rank 0's BatchNorm statistics (each rank updated its own since DDP's last sync)."""
    if d.enabled:
        import torch.distributed as dist

        for b in model.buffers():
            dist.broadcast(b, 0)


# --------------------------------------------------------------------------- pieces

def lr_factor(step: int, *, warmup_steps: int, total_steps: int) -> float:
    """Linear warm-up from 1/warmup to 1, then cosine decay to 0 at ``total_steps``."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    span = max(1, total_steps - warmup_steps)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, (step - warmup_steps) / span)))


def make_optimizer(model: nn.Module, name: str, *, lr: float, momentum: float, weight_decay: float,
                   fused: bool = False) -> torch.optim.Optimizer:
    """SGD (Nesterov momentum) or AdamW; no weight decay on norms and biases (1-D tensors).

    ``fused=True`` (used on CUDA) also lets an fp16 GradScaler skip its per-step
    ``found_inf.item()`` host sync: the fused kernels check for infs on the device.
    """
    decay = [p for p in model.parameters() if p.requires_grad and p.ndim > 1]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.ndim <= 1]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    kw = {"fused": True} if fused else {}
    if name == "sgd":
        return torch.optim.SGD(groups, lr=lr, momentum=momentum, nesterov=momentum > 0, **kw)
    return torch.optim.AdamW(groups, lr=lr, **kw)


def weights_digest(model: nn.Module) -> str:
    """sha256 over the state_dict tensors (names, dtypes, shapes, bytes): equal digests = equal weights."""
    return checkpoint_digest(model.state_dict())


def _loss_fn(task: str, label_smoothing: float) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    if task == "classify":
        return lambda out, y: F.cross_entropy(out, y, label_smoothing=label_smoothing)
    # The report's loop: one output regressed onto the label value.
    return lambda out, y: F.mse_loss(out.squeeze(1).float(), y.float())


@torch.no_grad()
def evaluate(model: nn.Module, loader: Any, *, device: torch.device, amp: AmpSpec, task: str,
             dist: Optional[_Dist] = None) -> dict[str, Any]:
    """Top-1/top-5 (classify) or MSE + rounded accuracy (regress) over the whole loader.

    Counts stay on the device (no per-batch sync) and are summed across ranks, so each
    sample counts exactly once when the loader splits val samples without padding.
    ``model`` must not be the DDP wrapper (ranks may see different batch counts).
    """
    d = dist or _Dist()
    was_training = model.training
    model.eval()
    stats = torch.zeros(4, dtype=torch.float64, device=device)  # top1, top5, count, loss sum
    for images, labels in loader:
        labels = labels.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=amp.dtype, enabled=amp.enabled):
            out = model(images)
        out = out.float()
        if task == "classify":
            k = min(5, out.shape[1])
            top = out.topk(k, dim=1).indices
            hit = top == labels[:, None]
            stats[0] += hit[:, 0].sum()
            stats[1] += hit.any(dim=1).sum()
            stats[3] += F.cross_entropy(out, labels, reduction="sum")
        else:
            pred = out.squeeze(1)
            stats[0] += (pred.round() == labels.float()).sum()
            stats[3] += ((pred - labels.float()) ** 2).sum()
        stats[2] += labels.numel()
    _all_reduce_sum(stats, d)
    top1, top5, n, loss = stats.tolist()  # the one sync of the evaluation
    model.train(was_training)
    n = int(n)
    res = {"n": n, "top1": top1 / n if n else float("nan"), "loss": loss / n if n else float("nan")}
    res["top5"] = top5 / n if n and task == "classify" else None
    return res


def plot_metrics(run_dir: Union[str, Path], out: Optional[Union[str, Path]] = None) -> Path:
    """PNG of the curves in ``RUN/metrics.jsonl``: loss, images/s + data wait, val top-1/top-5."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    rows = [json.loads(line) for line in (run_dir / METRICS).read_text().splitlines() if line.strip()]
    tr = [r for r in rows if r.get("kind") == "train"]
    va = [r for r in rows if r.get("kind") == "val"]
    fig, ax = plt.subplots(1, 3, figsize=(15, 4))
    ax[0].plot([r["step"] for r in tr], [r["loss"] for r in tr], label="train loss")
    if va:
        ax[0].plot([r["step"] for r in va], [r["loss"] for r in va], "o-", label="val loss")
    ax[0].set_xlabel("step")
    ax[0].set_title("loss")
    ax[0].legend()
    ax[1].plot([r["step"] for r in tr], [r["images_per_s"] for r in tr], color="C0")
    ax[1].set_xlabel("step")
    ax[1].set_ylabel("images/s", color="C0")
    ax[1].set_title("throughput")
    tw = ax[1].twinx()
    tw.plot([r["step"] for r in tr], [100 * r["data_wait"] for r in tr], color="C3")
    tw.set_ylabel("data wait %", color="C3")
    tw.set_ylim(0, 100)
    if va and va[0].get("top1") is not None:
        ax[2].plot([r["epoch"] + 1 for r in va], [100 * r["top1"] for r in va], "o-", label="top-1")
        if va[0].get("top5") is not None:
            ax[2].plot([r["epoch"] + 1 for r in va], [100 * r["top5"] for r in va], "o-", label="top-5")
        ax[2].legend()
    ax[2].set_xlabel("epoch")
    ax[2].set_title("val accuracy %")
    fig.tight_layout()
    out = Path(out) if out else run_dir / PLOT
    with atomic_write(out, "wb") as f:
        fig.savefig(f, format="png", dpi=100)
    plt.close(fig)
    return out


def _default_loader_factory(path: str, **kw: Any) -> Any:
    from stoker.pipeline import Loader

    return Loader(path, **kw)


# --------------------------------------------------------------------------- the run

class _Run:
    def __init__(self, cfg: TrainConfig, loader_factory: Callable[..., Any]) -> None:
        self.cfg = cfg
        self.factory = loader_factory
        self.out = Path(cfg.out)

    # rank-0 outputs ------------------------------------------------------------
    def log(self, msg: str) -> None:
        if self.dist.main:
            from tqdm import tqdm

            tqdm.write(f"stoker train: {msg}", file=sys.stderr)

    def write_metrics(self, row: dict[str, Any]) -> None:
        if self.dist.main:
            with open(self.out / METRICS, "a") as f:
                f.write(json.dumps(row) + "\n")

    def checkpoint(self, *, epoch: int, epoch_step: int, epoch_complete: bool, path: Optional[Path] = None,
                   extra: Optional[dict] = None) -> Path:
        path = path or self.out / LAST
        if self.dist.main:
            save_checkpoint(path, {
                "model": self.raw.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "scaler": self.scaler.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "loader": None if epoch_complete else self.train_loader.state_dict(),
                "rng": rng_state(),
                "config": self.resolved,
                "epoch": epoch,
                "epoch_step": epoch_step,
                "epoch_complete": epoch_complete,
                "step": self.step,
                "best_top1": self.best_top1,
                **(extra or {}),
            })
        return path

    # setup -----------------------------------------------------------------------
    def setup(self) -> None:
        cfg = self.cfg
        self.device = resolve_device(cfg.device)
        self.dist = _init_distributed(self.device)
        if self.dist.enabled and self.device.type == "cuda":
            self.device = torch.device("cuda", self.dist.local_rank)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self.amp = resolve_amp(cfg.amp, self.device)
        if cfg.torch_threads:
            torch.set_num_threads(cfg.torch_threads)
        if cfg.deterministic:
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS needs it for determinism
            torch.use_deterministic_algorithms(True)
            torch.backends.cudnn.benchmark = False
        else:
            torch.backends.cudnn.benchmark = True
        random.seed(cfg.seed)
        np.random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)  # same on every rank: identical initial weights

        data = Path(cfg.data)
        train_dir, val_dir = data / "train", data / "val"
        if not train_dir.is_dir():
            raise FileNotFoundError(f"{data}: no train/ directory (expected DATA/train and optionally DATA/val)")
        classes: Optional[list[str]] = None
        num_classes = cfg.num_classes
        if num_classes is None:
            from stoker.pipeline.manifest import Manifest

            classes = Manifest.load(train_dir).classes
            num_classes = len(classes)
        self.num_outputs = 1 if cfg.task == "regress" else num_classes
        if cfg.task == "classify" and num_classes < 2:
            raise ValueError(f"{train_dir}: {num_classes} class(es); classification needs at least 2")

        net = build_model(cfg.arch, self.num_outputs, image_size=cfg.crop)  # a bad --arch fails before any I/O

        lkw = dict(batch_size=cfg.batch_size, crop=cfg.crop, device=str(self.device), seed=cfg.seed,
                   rank=self.dist.rank, world_size=self.dist.world_size, backend=cfg.backend,
                   threads=cfg.threads, channels_last=cfg.channels_last)
        self.train_loader = self.factory(str(train_dir), train=True, drop_last=None, **lkw)
        self.val_loader = (self.factory(str(val_dir), train=False, drop_last=False, **lkw)
                           if val_dir.is_dir() else None)
        self.train_loader.set_epoch(0)
        self.steps_per_epoch = len(self.train_loader)
        if self.steps_per_epoch < 1:
            raise ValueError(f"{train_dir}: too few samples for one batch of {cfg.batch_size} "
                             f"x {self.dist.world_size} rank(s); lower --batch-size")
        self.total_steps = cfg.epochs * self.steps_per_epoch
        self.warmup_steps = min(round(cfg.warmup_epochs * self.steps_per_epoch), max(0, self.total_steps - 1))
        global_batch = cfg.batch_size * self.dist.world_size
        lr = cfg.lr if cfg.lr is not None else (0.1 * global_batch / 256 if cfg.optimizer == "sgd" else 1e-3)
        wd = cfg.weight_decay if cfg.weight_decay is not None else (5e-5 if cfg.optimizer == "sgd" else 0.05)

        mf = torch.channels_last if cfg.channels_last else torch.contiguous_format
        self.raw = with_normalize(net).to(self.device, memory_format=mf)
        self.optimizer = make_optimizer(self.raw, cfg.optimizer, lr=lr, momentum=cfg.momentum, weight_decay=wd,
                                        fused=self.device.type == "cuda")
        warm, total = self.warmup_steps, self.total_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: lr_factor(s, warmup_steps=warm, total_steps=total))
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.amp.name == "fp16")
        self.loss_fn = _loss_fn(cfg.task, cfg.label_smoothing)

        model: nn.Module = self.raw
        if self.dist.enabled:
            from torch.nn.parallel import DistributedDataParallel as DDP

            model = DDP(self.raw, device_ids=[self.device.index] if self.device.type == "cuda" else None)
        self.train_model = torch.compile(model) if cfg.compile else model
        self.eval_model = torch.compile(self.raw) if cfg.compile else self.raw

        self.resolved = {
            **dataclasses.asdict(cfg),
            "lr": lr, "weight_decay": wd, "amp": self.amp.name, "amp_requested": cfg.amp,
            "device": str(self.device), "world_size": self.dist.world_size, "global_batch": global_batch,
            "num_classes": num_classes, "num_outputs": self.num_outputs, "classes": classes,
            "steps_per_epoch": self.steps_per_epoch, "total_steps": self.total_steps,
            "warmup_steps": self.warmup_steps, "params": count_parameters(net),
            "has_val": self.val_loader is not None,
            "torch": str(torch.__version__), "stoker": _stoker_version(),
        }

        self.start_epoch, self.step, self.epoch_step = 0, 0, 0
        self.best_top1 = -1.0
        self.loader_state: Optional[dict] = None
        if cfg.resume:
            self._resume()
        if self.dist.main:
            self.out.mkdir(parents=True, exist_ok=True)
            with atomic_write(self.out / CONFIG, "w") as f:
                json.dump(self.resolved, f, indent=1, default=str)
                f.write("\n")

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
        from tqdm import tqdm

        cfg, dev, d = self.cfg, self.device, self.dist
        windows: list[tuple[int, float, float]] = []  # (images, seconds, wait seconds) per log window
        last_loss = float("nan")
        val: Optional[dict] = None
        stopped: Optional[int] = None
        t_start = time.perf_counter()
        bar = tqdm(total=self.total_steps, initial=self.step, unit="step", dynamic_ncols=True,
                   disable=not (d.main and cfg.progress), file=sys.stderr)
        with StopSignals() as signals:
            for epoch in range(self.start_epoch, cfg.epochs):
                bar.set_description(f"epoch {epoch + 1}/{cfg.epochs}")
                self.train_loader.set_epoch(epoch)
                if self.loader_state is not None:
                    self.train_loader.load_state_dict(self.loader_state)
                    self.loader_state = None
                else:
                    self.epoch_step = 0
                self.train_model.train()
                loss_acc = torch.zeros((), dtype=torch.float32, device=dev)
                n_acc, w_images, w_wait = 0, 0, 0.0
                w_t0 = time.perf_counter()
                it = iter(self.train_loader)
                while True:
                    t0 = time.perf_counter()
                    try:
                        images, labels = next(it)
                    except StopIteration:
                        break
                    w_wait += time.perf_counter() - t0
                    with torch.autocast(dev.type, dtype=self.amp.dtype, enabled=self.amp.enabled):
                        out = self.train_model(images)
                        loss = self.loss_fn(out, labels)
                    self.optimizer.zero_grad(set_to_none=True)
                    self.scaler.scale(loss).backward()
                    self.scaler.step(self.optimizer)
                    self.scaler.update()
                    self.scheduler.step()
                    loss_acc += loss.detach()  # stays on the device: no sync
                    n_acc += 1
                    w_images += int(images.shape[0])
                    self.step += 1
                    self.epoch_step += 1
                    bar.update(1)
                    end_of_epoch = self.epoch_step >= self.steps_per_epoch
                    if self.step % cfg.log_every == 0 or end_of_epoch:
                        # The one host<->device sync of the window (and the DDP stop vote).
                        red = torch.stack([loss_acc.double(), torch.tensor(float(n_acc), dtype=torch.float64, device=dev),
                                           torch.tensor(float(signals.received is not None), dtype=torch.float64, device=dev)])
                        loss_sum, n_sum, stop_votes = _all_reduce_sum(red, d).tolist()
                        now = time.perf_counter()
                        seconds = now - w_t0
                        last_loss = loss_sum / n_sum
                        ips = w_images * d.world_size / seconds
                        windows.append((w_images * d.world_size, seconds, w_wait))
                        row = {"kind": "train", "epoch": epoch, "step": self.step, "loss": last_loss,
                               "images_per_s": ips, "data_wait": w_wait / seconds,
                               "lr": self.scheduler.get_last_lr()[0], "time": time.time()}
                        self.write_metrics(row)
                        bar.set_postfix({"img/s": f"{ips:.0f}", "loss": f"{last_loss:.3f}",
                                         "wait": f"{100 * w_wait / seconds:.0f}%"}, refresh=False)
                        if not math.isfinite(last_loss):
                            raise FloatingPointError(f"loss became {last_loss} at step {self.step}: "
                                                     f"try a lower --lr or --amp off")
                        loss_acc.zero_()
                        n_acc, w_images, w_wait = 0, 0, 0.0
                        w_t0 = time.perf_counter()
                        if stop_votes > 0:
                            stopped = signals.received or signal.SIGTERM
                    if not d.enabled and signals.received is not None:
                        stopped = signals.received  # one process: stop at once, no vote needed
                    if (cfg.ckpt_every and self.step % cfg.ckpt_every == 0 and not end_of_epoch) or (stopped and not end_of_epoch):
                        self.checkpoint(epoch=epoch, epoch_step=self.epoch_step, epoch_complete=False)
                    if stopped and not end_of_epoch:
                        # Close the abandoned iteration now, while the loader's pipeline is alive
                        # (left to the garbage collector it may run after DALI shut down at exit).
                        close = getattr(it, "close", None)
                        if close is not None:
                            close()
                        break
                if stopped and self.epoch_step < self.steps_per_epoch:
                    break
                # epoch end: every rank gets rank 0's BN statistics, then validate and checkpoint.
                _broadcast_buffers(self.raw, d)
                if self.val_loader is not None:
                    self.val_loader.set_epoch(epoch)
                    val = evaluate(self.eval_model, self.val_loader, device=dev, amp=self.amp, task=cfg.task, dist=d)
                    self.write_metrics({"kind": "val", "epoch": epoch, "step": self.step, **val, "time": time.time()})
                    msg = f"epoch {epoch + 1}/{cfg.epochs}: val top-1 {100 * val['top1']:.1f}%"
                    if val["top5"] is not None:
                        msg += f", top-5 {100 * val['top5']:.1f}%"
                    self.log(msg + f", loss {val['loss']:.4f} ({val['n']} samples)")
                self.checkpoint(epoch=epoch, epoch_step=self.epoch_step, epoch_complete=True)
                if val is not None and val["top1"] > self.best_top1:
                    self.best_top1 = val["top1"]
                    self.checkpoint(epoch=epoch, epoch_step=self.epoch_step, epoch_complete=True,
                                    path=self.out / BEST)
                if stopped:
                    break
        bar.close()
        if d.main and cfg.plot and (self.out / METRICS).exists():
            plot_metrics(self.out)
        if stopped:
            self.log(f"stopped by {signal.Signals(stopped).name} at step {self.step}; checkpoint "
                     f"{self.out / LAST}; continue with --resume")
        timed = windows[1:] if len(windows) > 1 else windows  # the first window holds warm-up/compile
        t_images, t_seconds, t_wait = (sum(x) for x in zip(*timed)) if timed else (0, 0.0, 0.0)
        return {
            "run_dir": str(self.out),
            "checkpoint": str(self.out / LAST),
            "arch": cfg.arch, "device": str(dev), "amp": self.amp.name, "world_size": d.world_size,
            "epochs": cfg.epochs, "steps": self.step, "total_steps": self.total_steps,
            "seconds": time.perf_counter() - t_start,
            "images_per_s": t_images / t_seconds if t_seconds else None,
            "data_wait": t_wait / t_seconds if t_seconds else None,
            "train_loss": last_loss,
            "val_top1": val["top1"] if val else None,
            "val_top5": val["top5"] if val else None,
            "val_loss": val["loss"] if val else None,
            "val_samples": val["n"] if val else None,
            "interrupted": signal.Signals(stopped).name if stopped else None,
            "weights_sha256": weights_digest(self.raw),
        }


def _stoker_version() -> str:
    from stoker import __version__

    return __version__


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
        d = getattr(run, "dist", None)
        if d is not None and d.owned:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
