"""One training step, and what it is made of: the loss, the optimizer, the learning-rate schedule.

:class:`TrainStep` is the only training step in stoker: ``stoker train``'s loop,
:func:`stoker.model.throughput.measure_model` (``stoker bench-model``) and ``stoker
diagnose`` all run it, so what they time is what training does.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from ..normalize import check_uint8_input
from .runtime import AmpSpec
from .tasks import Task

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class TrainStep:
    """Forward under autocast, loss, ``zero_grad``, (scaled) backward, optimizer step, schedule step.

    No host↔device sync inside a step: the returned loss is detached and stays on the device.

    Args:
        model: The module (or any callable) mapping a batch to outputs; DDP and compiled
            wrappers are fine.
        optimizer: Steps the model's parameters.
        loss_fn: ``loss_fn(outputs, labels)``, computed under autocast like the forward.
        amp: The resolved autocast (:func:`stoker.model.train.runtime.resolve_amp`).
        scaler: A GradScaler (fp16); ``None`` or a disabled one is a plain backward and step.
        scheduler: Stepped after each optimizer step (per-step schedules), when given.
    """

    def __init__(
        self,
        model: Callable[[torch.Tensor], torch.Tensor],
        optimizer: torch.optim.Optimizer,
        loss_fn: LossFn,
        *,
        amp: AmpSpec,
        scaler: torch.amp.GradScaler | None = None,
        scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.loss_fn = loss_fn
        self.amp = amp
        self.scaler = scaler
        self.scheduler = scheduler

    def __call__(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        with self.amp.autocast():
            # a detector's losses need the boxes in its forward (the loss says so)
            try:
                targeted = getattr(self.loss_fn, "forward_targets", False)
                out = self.model(images, labels) if targeted else self.model(images)
            except (RuntimeError, NotImplementedError) as e:  # a network without Normalize: one line
                check_uint8_input(e, images)
                raise
            loss = self.loss_fn(out, labels)
        self.optimizer.zero_grad(set_to_none=True)
        if self.scaler is None:
            loss.backward()
            self.optimizer.step()
        else:
            self.scaler.scale(loss).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()
        if self.scheduler is not None:
            self.scheduler.step()
        return loss.detach()


def loss_fn(task: str | Task, *, label_smoothing: float = 0.0) -> LossFn:
    """The loss of ``task`` (:meth:`.tasks.Task.loss`); the names ``"classify"`` (cross-entropy)
    and ``"regress"`` (the case study's MSE on a class split's label value) stand for those tasks."""
    if isinstance(task, str):
        task = Task("classify", 0, "top1") if task == "classify" else Task("regress", 1, "top1", case_study=True)
    return task.loss(label_smoothing=label_smoothing)


def make_optimizer(
    model: nn.Module, name: str, *, lr: float, momentum: float, weight_decay: float, fused: bool = False
) -> torch.optim.Optimizer:
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


def lr_factor(step: int, *, warmup_steps: int, total_steps: int) -> float:
    """Linear warm-up from 1/warmup to 1, then cosine decay to 0 at ``total_steps``."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    span = max(1, total_steps - warmup_steps)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, (step - warmup_steps) / span)))


def make_scheduler(
    optimizer: torch.optim.Optimizer, *, warmup_steps: int, total_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """The per-step :func:`lr_factor` schedule on ``optimizer``."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s, warmup_steps=warmup_steps, total_steps=total_steps)
    )
